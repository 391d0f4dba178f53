// Fire-and-forget reductions into global memory (red: an atomic without a return value, so the
// issuing warp never waits for L2). Used to accumulate fp32 dQ across key blocks.
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

}  // namespace flashattn_cu::ptx
