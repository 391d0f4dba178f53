// Synchronization inside a CTA beyond __syncthreads: named barriers (their ids in one enum, so
// kernels never collide), elect.sync, and the register reallocation of warp-specialized kernels
// (setmaxnreg, sm_90a).
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

}  // namespace flashattn_cu::ptx
