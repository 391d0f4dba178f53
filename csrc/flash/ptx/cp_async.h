// cp.async: 16-byte global -> shared copies that bypass registers (sm_80+), grouped with
// commit_group and awaited with wait_group.
#pragma once

#include <cstdint>

#include "arch.h"

namespace flashattn_cu::ptx {

// Copies 16 bytes when `valid`, otherwise writes 16 zero bytes to shared memory and reads
// nothing (src-size 0), so tails of a tile are zero-filled without a branch.
FLASHATTN_CU_DEVICE void cp_async_16_zfill(uint32_t smem_addr, const void* gmem, bool valid) {
#if FLASHATTN_CU_SM80_OR_NEWER
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem),
               "r"(src_bytes));
#else
  unsupported_arch();
#endif
}

FLASHATTN_CU_DEVICE void cp_async_16(uint32_t smem_addr, const void* gmem) {
#if FLASHATTN_CU_SM80_OR_NEWER
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gmem));
#else
  unsupported_arch();
#endif
}

FLASHATTN_CU_DEVICE void cp_async_commit() {
#if FLASHATTN_CU_SM80_OR_NEWER
  asm volatile("cp.async.commit_group;\n" ::);
#else
  unsupported_arch();
#endif
}

// Waits until at most kPending committed groups of this thread are still in flight.
template <int kPending>
FLASHATTN_CU_DEVICE void cp_async_wait() {
#if FLASHATTN_CU_SM80_OR_NEWER
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#else
  unsupported_arch();
#endif
}

}  // namespace flashattn_cu::ptx
