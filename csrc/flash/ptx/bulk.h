// Bulk asynchronous copies (sm_90, the copy engine behind TMA, without a tensor map): a single
// thread hands a contiguous run of shared memory to the engine, which carries it out in the
// background. Completion is tracked per issuing thread in bulk groups.
#pragma once

#include <cstdint>

#include "arch.h"

namespace flashattn_cu::ptx {

// gmem[i] += smem[i] for `bytes` / 4 floats (fp32 add in L2). smem and gmem 16-byte aligned,
// bytes a multiple of 16. The shared memory must not be rewritten before bulk_wait_read().
FLASHATTN_CU_DEVICE void bulk_reduce_add_f32(float* gmem, uint32_t smem, uint32_t bytes) {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   gmem),
               "r"(smem), "r"(bytes)
               : "memory");
#else
  unsupported_arch();
#endif
}

// Closes the bulk group of this thread's bulk operations issued since the last commit.
FLASHATTN_CU_DEVICE void bulk_commit() {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#else
  unsupported_arch();
#endif
}

// Waits until at most kPending of this thread's bulk groups still read shared memory.
template <int kPending>
FLASHATTN_CU_DEVICE void bulk_wait_read() {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
#else
  unsupported_arch();
#endif
}

// Waits until at most kPending of this thread's bulk groups are still in flight (writes done).
template <int kPending>
FLASHATTN_CU_DEVICE void bulk_wait() {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
#else
  unsupported_arch();
#endif
}

}  // namespace flashattn_cu::ptx
