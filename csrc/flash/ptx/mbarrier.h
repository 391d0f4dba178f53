// mbarrier (sm_90): barrier objects in shared memory that complete in phases, each phase when
// its expected arrivals have arrived and its expected transaction bytes have landed. TMA copies
// signal their bytes with complete_tx, so a consumer waits for a tile with one try_wait on the
// phase's parity. The barrier is a 64-bit word (8-byte aligned) addressed in the shared window.
//
// Use: one thread inits (arrival count), fence_mbarrier_init() before the TMA unit may see it,
// a barrier (e.g. __syncthreads) before others use it. Per phase: the producer calls
// mbarrier_arrive_expect_tx(bytes) and issues the copies; consumers mbarrier_wait_parity(bar,
// phase & 1). A consumer releasing a buffer arrives on that buffer's "empty" barrier.
#pragma once

#include <cstdint>

#include "arch.h"

namespace flashattn_cu::ptx {

FLASHATTN_CU_DEVICE void mbarrier_init(uint32_t bar, uint32_t arrivals) {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
#else
  unsupported_arch();
#endif
}

// Makes initialized barriers visible to the async proxy (the TMA unit) and the cluster.
FLASHATTN_CU_DEVICE void fence_mbarrier_init() {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  unsupported_arch();
#endif
}

// One arrival, and `bytes` more transaction bytes expected in the current phase.
FLASHATTN_CU_DEVICE void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#else
  unsupported_arch();
#endif
}

// `bytes` more transaction bytes expected, without an arrival.
FLASHATTN_CU_DEVICE void mbarrier_expect_tx(uint32_t bar, uint32_t bytes) {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
#else
  unsupported_arch();
#endif
}

FLASHATTN_CU_DEVICE void mbarrier_arrive(uint32_t bar) {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#else
  unsupported_arch();
#endif
}

// One arrival on a barrier of another CTA of the cluster (`bar`: a shared::cluster address, from
// ptx/cluster.h map_shared_cluster), releasing this thread's earlier accesses at cluster scope.
FLASHATTN_CU_DEVICE void mbarrier_arrive_cluster(uint32_t bar) {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(bar)
               : "memory");
#else
  unsupported_arch();
#endif
}

// Whether the phase with this parity has completed (a bounded, hardware-suspended wait).
FLASHATTN_CU_DEVICE bool mbarrier_try_wait_parity(uint32_t bar, uint32_t parity) {
#if FLASHATTN_CU_SM90_OR_NEWER
  uint32_t done = 0;
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "  selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
#else
  unsupported_arch();
  return true;
#endif
}

FLASHATTN_CU_DEVICE void mbarrier_wait_parity(uint32_t bar, uint32_t parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}

}  // namespace flashattn_cu::ptx
