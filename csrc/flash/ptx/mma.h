// mma.sync m16n8k16 with fp32 accumulation (sm_80+).
// Fragments per lane (g = lane / 4, t = lane % 4), halves packed two to a 32-bit register:
//   A 16x16 row-major: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B 16x8 "col":      b0 (k = 2t..2t+1, n = g), b1 (k = 2t+8.., n = g)
//   C/D 16x8 fp32:     c0 c1 (g, 2t..2t+1), c2 c3 (g+8, 2t..2t+1)
#pragma once

#include <cstdint>

#include "arch.h"

namespace flashattn_cu::ptx {

FLASHATTN_CU_DEVICE void mma_m16n8k16_f16_f32(float (&d)[4], const uint32_t (&a)[4],
                                               uint32_t b0, uint32_t b1) {
#if FLASHATTN_CU_SM80_OR_NEWER
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  unsupported_arch();
#endif
}

FLASHATTN_CU_DEVICE void mma_m16n8k16_bf16_f32(float (&d)[4], const uint32_t (&a)[4],
                                                uint32_t b0, uint32_t b1) {
#if FLASHATTN_CU_SM80_OR_NEWER
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  unsupported_arch();
#endif
}

}  // namespace flashattn_cu::ptx
