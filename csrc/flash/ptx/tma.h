// TMA (sm_90): the tensor memory accelerator copies whole boxes of a 1- to 5-d tensor between
// global and shared memory, described by a tensor map (CUtensorMap, encoded on the host: see
// tma_host.h) that the kernel receives as a __grid_constant__ parameter and passes here by its
// address. Loads complete on an mbarrier (ptx/mbarrier.h: the box's full byte count, also where
// it overhangs the tensor, whose missing elements are zero-filled); stores clip at the tensor's
// edge and complete as bulk groups (tma_store_commit / tma_store_wait). Coordinates are element
// indices, innermost dimension first. Issued by one thread.
//
// Shared memory read by a TMA store or written by ordinary stores before it must be published to
// the async proxy first (fence_proxy_async_shared, ptx/wgmma.h) by the writing threads.
#pragma once

#include <cstdint>

#include "arch.h"

namespace flashattn_cu::ptx {

// Brings the tensor map into the descriptor cache ahead of the first copy.
FLASHATTN_CU_DEVICE void tma_prefetch_map(const void* tmap) {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tmap) : "memory");
#else
  unsupported_arch();
#endif
}

// Global -> shared, completing `bar`'s transaction bytes. kRank 1..5 coordinates.
template <int kRank>
FLASHATTN_CU_DEVICE void tma_load(uint32_t dst, const void* tmap, uint32_t bar,
                                  const int32_t (&c)[kRank]) {
  static_assert(kRank >= 1 && kRank <= 5, "TMA tensors have 1 to 5 dimensions");
#if FLASHATTN_CU_SM90_OR_NEWER
  if constexpr (kRank == 1) {
    asm volatile(
        "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3}], [%2];\n" ::"r"(dst), "l"(tmap), "r"(bar), "r"(c[0])
        : "memory");
  } else if constexpr (kRank == 2) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst), "l"(tmap), "r"(bar), "r"(c[0]), "r"(c[1])
        : "memory");
  } else if constexpr (kRank == 3) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst), "l"(tmap), "r"(bar), "r"(c[0]),
        "r"(c[1]), "r"(c[2])
        : "memory");
  } else if constexpr (kRank == 4) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst), "l"(tmap), "r"(bar), "r"(c[0]),
        "r"(c[1]), "r"(c[2]), "r"(c[3])
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" ::"r"(dst), "l"(tmap), "r"(bar), "r"(c[0]),
        "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(c[4])
        : "memory");
  }
#else
  unsupported_arch();
#endif
}

// The same box delivered to every CTA of the cluster in `cta_mask` (same shared offset, each
// CTA's barrier at `bar`'s offset): K/V tiles shared by the CTAs of a cluster read once from L2.
// sm_90a (multicast is an arch-specific feature).
template <int kRank>
FLASHATTN_CU_DEVICE void tma_load_multicast(uint32_t dst, const void* tmap, uint32_t bar,
                                            const int32_t (&c)[kRank], uint16_t cta_mask) {
  static_assert(kRank >= 2 && kRank <= 5, "multicast loads of 2 to 5 dimensions");
#if FLASHATTN_CU_SM90A
  if constexpr (kRank == 2) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%4, %5}], [%2], %3;\n" ::"r"(dst), "l"(tmap), "r"(bar),
        "h"(cta_mask), "r"(c[0]), "r"(c[1])
        : "memory");
  } else if constexpr (kRank == 3) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%4, %5, %6}], [%2], %3;\n" ::"r"(dst), "l"(tmap),
        "r"(bar), "h"(cta_mask), "r"(c[0]), "r"(c[1]), "r"(c[2])
        : "memory");
  } else if constexpr (kRank == 4) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%4, %5, %6, %7}], [%2], %3;\n" ::"r"(dst), "l"(tmap),
        "r"(bar), "h"(cta_mask), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3])
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%4, %5, %6, %7, %8}], [%2], %3;\n" ::"r"(dst),
        "l"(tmap), "r"(bar), "h"(cta_mask), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]),
        "r"(c[4])
        : "memory");
  }
#else
  unsupported_arch();
#endif
}

// Shared -> global (clipped at the tensor's edge), in the current bulk group.
template <int kRank>
FLASHATTN_CU_DEVICE void tma_store(const void* tmap, uint32_t src, const int32_t (&c)[kRank]) {
  static_assert(kRank >= 1 && kRank <= 5, "TMA tensors have 1 to 5 dimensions");
#if FLASHATTN_CU_SM90_OR_NEWER
  if constexpr (kRank == 1) {
    asm volatile("cp.async.bulk.tensor.1d.global.shared::cta.bulk_group [%0, {%2}], [%1];\n" ::"l"(
                     tmap),
                 "r"(src), "r"(c[0])
                 : "memory");
  } else if constexpr (kRank == 2) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
            tmap),
        "r"(src), "r"(c[0]), "r"(c[1])
        : "memory");
  } else if constexpr (kRank == 3) {
    asm volatile(
        "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
            tmap),
        "r"(src), "r"(c[0]), "r"(c[1]), "r"(c[2])
        : "memory");
  } else if constexpr (kRank == 4) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::
            "l"(tmap),
        "r"(src), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3])
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n" ::
            "l"(tmap),
        "r"(src), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(c[4])
        : "memory");
  }
#else
  unsupported_arch();
#endif
}

// Closes the current bulk group of TMA stores.
FLASHATTN_CU_DEVICE void tma_store_commit() {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#else
  unsupported_arch();
#endif
}

// Waits until at most kPending bulk groups still read their shared memory (the buffer of the
// others may be reused; the global writes may still be in flight until the kernel ends).
template <int kPending>
FLASHATTN_CU_DEVICE void tma_store_wait() {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
#else
  unsupported_arch();
#endif
}

// Global -> shared, `bytes` contiguous bytes (both 16-byte aligned, bytes a multiple of 16),
// completing `bar`'s transaction bytes (a non-tensor bulk copy).
FLASHATTN_CU_DEVICE void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
#else
  unsupported_arch();
#endif
}

// dst[i] += src[i] over `bytes` bytes of fp32 (both 16-byte aligned, bytes a multiple of 16), from
// shared memory into global memory, in the current bulk group (tma_store_commit, tma_store_wait,
// bulk_wait_all): each element is its own atomic add at L2, as red.add's are.
FLASHATTN_CU_DEVICE void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   dst),
               "r"(src), "r"(bytes)
               : "memory");
#else
  unsupported_arch();
#endif
}

// Waits until at most kPending bulk groups are incomplete: their shared memory read and their
// global writes done (tma_store_wait only waits for the reads).
template <int kPending>
FLASHATTN_CU_DEVICE void bulk_wait_all() {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
#else
  unsupported_arch();
#endif
}

}  // namespace flashattn_cu::ptx
