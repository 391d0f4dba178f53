// ldmatrix: four 8x8 matrices of 16-bit elements from shared memory into registers (sm_75+,
// used here on sm_80+). Lane i gives the address of row (i % 8) of matrix (i / 8); each lane
// receives, for matrix j, the 32-bit register holding row (lane / 4), cols 2*(lane % 4)..+1.
// The .trans form delivers the transpose: row 2*(lane % 4)..+1, col (lane / 4).
#pragma once

#include <cstdint>

#include "arch.h"

namespace flashattn_cu::ptx {

FLASHATTN_CU_DEVICE void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
#if FLASHATTN_CU_SM80_OR_NEWER
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
#else
  unsupported_arch();
#endif
}

FLASHATTN_CU_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
#if FLASHATTN_CU_SM80_OR_NEWER
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
#else
  unsupported_arch();
#endif
}

// Two matrices, transposed; lanes 0-15 give the row addresses (matrix i / 8), lanes 16-31's are
// ignored. Used for a single 8-column B tile where a kernel's column count is an odd multiple of 8.
FLASHATTN_CU_DEVICE void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t smem_addr) {
#if FLASHATTN_CU_SM80_OR_NEWER
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr));
#else
  unsupported_arch();
#endif
}

// stmatrix (sm_90+): the store that mirrors ldmatrix_x4. Lane i gives the address of row (i % 8)
// of matrix (i / 8); register j of lane l is written to matrix j, row l / 4, cols 2 (l % 4)..+1 (the
// mma C / A fragment's layout): one instruction for the four 32-bit stores a fragment quadruple
// takes with st.shared, and one address a lane instead of four.
FLASHATTN_CU_DEVICE void stmatrix_x4(uint32_t smem_addr, const uint32_t (&r)[4]) {
#if FLASHATTN_CU_SM90A
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
               :
               : "r"(smem_addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
#else
  unsupported_arch();
#endif
}

FLASHATTN_CU_DEVICE uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

}  // namespace flashattn_cu::ptx
