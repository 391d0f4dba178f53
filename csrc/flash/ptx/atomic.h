// Fire-and-forget reductions into global memory (red: an atomic without a return value, so the
// issuing warp never waits for L2), used to accumulate fp32 dQ across key blocks; and the flags
// by which one grid's blocks tell another's that their results are in memory.
#pragma once

#include "arch.h"

namespace flashattn_cu::ptx {

// *addr += v, relaxed, gpu scope (sm_80+ here; the instruction itself is older).
FLASHATTN_CU_DEVICE void red_add_f32(float* addr, float v) {
#if FLASHATTN_CU_SM80_OR_NEWER
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(addr), "f"(v) : "memory");
#else
  unsupported_arch();
#endif
}

// addr[0] += a, addr[1] += b as one 8-byte vector reduction (sm_90+); addr 8-byte aligned.
// Each element is its own atomic; the pair only shares the instruction and the L2 transaction.
FLASHATTN_CU_DEVICE void red_add_v2_f32(float* addr, float a, float b) {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b) : "memory");
#else
  unsupported_arch();
#endif
}

// A flag published by one thread and waited for by others (the backward's streamed dQ convert,
// bwd/preprocess.h): *addr = v with release semantics at gpu scope (every write this thread
// performed or observed before it is visible to a thread that acquires the value).
FLASHATTN_CU_DEVICE void st_release_gpu(int* addr, int v) {
#if FLASHATTN_CU_SM80_OR_NEWER
  asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(addr), "r"(v) : "memory");
#else
  unsupported_arch();
#endif
}

// *addr, a strong (relaxed, gpu scope) load for polling a flag: followed by fence_acq_rel_gpu
// it is an acquire pattern that pairs with st_release_gpu.
FLASHATTN_CU_DEVICE int ld_relaxed_gpu(const int* addr) {
#if FLASHATTN_CU_SM80_OR_NEWER
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(addr) : "memory");
  return v;
#else
  unsupported_arch();
  return 0;
#endif
}

// fence.acq_rel.gpu: after ld_relaxed_gpu saw a flag, this thread's later accesses are ordered
// after the writes its release published.
FLASHATTN_CU_DEVICE void fence_acq_rel_gpu() {
#if FLASHATTN_CU_SM80_OR_NEWER
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
#else
  unsupported_arch();
#endif
}

// Orders this thread's async-proxy accesses of global memory (bulk copies and reductions it saw
// complete: cp.async.bulk.wait_group) with its later generic-proxy ones, such as a release store
// that publishes them (sm_90+).
FLASHATTN_CU_DEVICE void fence_proxy_async_global() {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#else
  unsupported_arch();
#endif
}

// Suspends the thread for about `ns` nanoseconds (a polling loop's back-off; sm_70+).
FLASHATTN_CU_DEVICE void nanosleep(unsigned ns) {
#if FLASHATTN_CU_SM80_OR_NEWER
  asm volatile("nanosleep.u32 %0;\n" ::"r"(ns));
#else
  unsupported_arch();
#endif
}

}  // namespace flashattn_cu::ptx
