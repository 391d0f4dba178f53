// Plain shared-memory stores (and a load) by 32-bit shared-window address (the address form ldmatrix and
// cp.async take), for tiles a thread fills from registers instead of by cp.async.
#pragma once

#include <cstdint>

#include "arch.h"

namespace flashattn_cu::ptx {

// 16 bytes to shared memory at smem_addr (16-byte aligned).
FLASHATTN_CU_DEVICE void st_shared_v4(uint32_t smem_addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(v.x),
               "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// 16 bytes from shared memory at smem_addr (16-byte aligned). Volatile, with a memory clobber:
// it stays after the barrier wait that makes the bytes visible.
FLASHATTN_CU_DEVICE uint4 ld_shared_v4(uint32_t smem_addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem_addr)
               : "memory");
  return v;
}

// 4 bytes to shared memory at smem_addr (4-byte aligned).
FLASHATTN_CU_DEVICE void st_shared_b32(uint32_t smem_addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(smem_addr), "r"(v) : "memory");
}

}  // namespace flashattn_cu::ptx
