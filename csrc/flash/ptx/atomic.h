// Fire-and-forget reductions into global memory (red: an atomic without a return value, so the
// issuing warp never waits for L2). Used to accumulate fp32 dQ across key blocks, and to count
// the finished contributions to a dQ block (release / acquire at gpu scope).
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

// *addr += v (int32), relaxed, gpu scope; after fence_acq_rel_gpu it publishes what the thread
// wrote or observed before the fence to a thread whose ld_acquire_gpu_s32 reads the sum (the PTX
// release pattern). A reduction without a return value: the warp never waits for L2.
FLASHATTN_CU_DEVICE void red_relaxed_gpu_add_s32(int* addr, int v) {
#if FLASHATTN_CU_SM80_OR_NEWER
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], %1;\n" ::"l"(addr), "r"(v) : "memory");
#else
  unsupported_arch();
#endif
}

// fence.acq_rel.gpu (MEMBAR.GPU: the warp waits until its earlier memory operations are
// performed at gpu scope; hundreds of cycles).
FLASHATTN_CU_DEVICE void fence_acq_rel_gpu() {
#if FLASHATTN_CU_SM80_OR_NEWER
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
#else
  unsupported_arch();
#endif
}

// *addr with acquire semantics at gpu scope (pairs with fence_acq_rel_gpu + red_relaxed_gpu_add_s32); read at L2.
FLASHATTN_CU_DEVICE int ld_acquire_gpu_s32(const int* addr) {
#if FLASHATTN_CU_SM80_OR_NEWER
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(addr) : "memory");
  return v;
#else
  unsupported_arch();
  return 0;
#endif
}

}  // namespace flashattn_cu::ptx
