// Synchronization inside a CTA beyond __syncthreads: named barriers (their ids in one enum, so
// kernels never collide), elect.sync, and the register reallocation of warp-specialized kernels
// (setmaxnreg, sm_90a); and between a kernel and the next one in the stream: programmatic
// dependent launch (griddepcontrol, sm_90).
#pragma once

#include <cstdint>

#include "arch.h"

namespace flashattn_cu::ptx {

// Named-barrier ids (bar.sync / bar.arrive take 0..15; 0 is the one __syncthreads uses). Every
// kernel that uses named barriers takes its ids from here.
enum class NamedBarrier : int {
  kSyncThreads = 0,    // reserved: __syncthreads
  kSelftest = 1,       // sm90/selftest.cu
  kWarpgroup0 = 2,     // per-consumer-warpgroup barriers of warp-specialized kernels: 2, 3, ...
  kWarpgroup1 = 3,
  kWarpgroup2 = 4,
  kPingPong0 = 5,      // consumer warpgroups taking turns on the tensor cores
  kPingPong1 = 6,
  kEpilogue = 7,
  // sm90/bwd_ws_kernel.h: both consumer warpgroups (K / V landed, dS^T of both stored, the dK /
  // dV epilogue), and each consumer warpgroup's dQ hand-over with the dQ warp.
  kBwdConsumers = 8,
  kBwdDsStored = 9,
  kBwdDqFull0 = 10,
  kBwdDqFull1 = 11,
  kBwdDqEmpty0 = 12,
  kBwdDqEmpty1 = 13,
  // sm90/bwd_split_kernel.h (kStagger): warpgroup 0's S^T issued or retired, so warpgroup 1 may
  // issue dP^T.
  kBwdSplitSDone = 14,
  // sm90/fwd_consumer.h: every consumer warpgroup, once a tile's first V buffer is fit to read
  // (the rows past a varlen entry's keys zeroed).
  kFwdConsumers = 15,
};

// Waits until `threads` threads (a multiple of 32, the warps counted whole) have arrived at
// barrier `id`, this one included.
FLASHATTN_CU_DEVICE void named_barrier_sync(NamedBarrier id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(static_cast<int>(id)), "r"(threads) : "memory");
}

// Arrives at barrier `id` without waiting (the producer side of a named-barrier handoff).
FLASHATTN_CU_DEVICE void named_barrier_arrive(NamedBarrier id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(static_cast<int>(id)), "r"(threads) : "memory");
}

// True in exactly one active lane of the (fully active) warp: the lane that issues a TMA copy or
// arms an mbarrier on the warp's behalf.
FLASHATTN_CU_DEVICE bool elect_one_sync() {
#if FLASHATTN_CU_SM90_OR_NEWER
  uint32_t elected = 0;
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  elect.sync _|p, 0xffffffff;\n"
      "  selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(elected));
  return elected != 0;
#else
  unsupported_arch();
  return false;
#endif
}

// Register budget of the warpgroup (24..256 per thread, multiple of 8), all of its warps
// executing it: producers give registers back (dec), consumers take them (inc).
template <int kRegs>
FLASHATTN_CU_DEVICE void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: 24..256, step 8");
#if FLASHATTN_CU_SM90A
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#else
  unsupported_arch();
#endif
}

template <int kRegs>
FLASHATTN_CU_DEVICE void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: 24..256, step 8");
#if FLASHATTN_CU_SM90A
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#else
  unsupported_arch();
#endif
}

// Programmatic dependent launch (a kernel launched with the programmatic stream serialization
// attribute, launch.h: its CTAs may start before the previous kernel in the stream has finished).
// grid_dependency_wait blocks until every prerequisite grid has completed and its memory writes
// are visible: a kernel so launched calls it before its first global-memory access. Without the
// attribute there is nothing to wait for and it returns at once; before sm_90 (no PDL) it is
// empty, which is as correct: the stream then orders the kernels whole.
FLASHATTN_CU_DEVICE void grid_dependency_wait() {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the dependent grid (launched with the attribute after this one) be scheduled once every
// CTA of this grid has executed it or exited: issued where the rest of a CTA's work is short,
// so the dependent's launch overlaps it. No effect on correctness (the dependent still waits in
// grid_dependency_wait for this grid's completion); empty before sm_90.
FLASHATTN_CU_DEVICE void launch_dependents() {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The global nanosecond timer (%globaltimer), comparable across SMs: for harness-only
// instrumentation (sm90/decode_kernel.h kStamps), never in a library kernel's path.
FLASHATTN_CU_DEVICE uint64_t global_timer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

}  // namespace flashattn_cu::ptx
