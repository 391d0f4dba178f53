// Thread-block clusters (sm_90): the CTA's rank in its cluster, the cluster-wide barrier (split
// into arrive and wait, so a thread can do other work between them), and distributed shared
// memory: a shared::cta address mapped to the same offset in another CTA of the cluster, and
// 16-byte loads through such an address.
//
// Use: every thread of every CTA of the cluster calls cluster_arrive_release() once per phase
// and cluster_wait_acquire() before its next arrive; shared-memory writes a thread made before
// its arrive are visible to the threads of the cluster that have returned from the wait of that
// phase. A CTA must not exit while another CTA may still read its shared memory.
#pragma once

#include <cstdint>

#include "arch.h"

namespace flashattn_cu::ptx {

// This CTA's rank in its cluster (0 .. cluster size - 1).
FLASHATTN_CU_DEVICE uint32_t cluster_ctarank() {
#if FLASHATTN_CU_SM90_OR_NEWER
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
#else
  unsupported_arch();
  return 0;
#endif
}

// Arrives at the cluster barrier, releasing this thread's earlier memory writes to the cluster.
FLASHATTN_CU_DEVICE void cluster_arrive_release() {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#else
  unsupported_arch();
#endif
}

// Waits for the current phase of the cluster barrier (every thread of the cluster arrived),
// acquiring what the arrivals released.
FLASHATTN_CU_DEVICE void cluster_wait_acquire() {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  unsupported_arch();
#endif
}

// Both halves in turn: every thread of the cluster past this point has seen the others' writes
// from before it.
FLASHATTN_CU_DEVICE void cluster_sync() {
  cluster_arrive_release();
  cluster_wait_acquire();
}

// The shared::cluster address of shared::cta address `addr` in the CTA of rank `rank`.
FLASHATTN_CU_DEVICE uint32_t map_shared_cluster(uint32_t addr, uint32_t rank) {
#if FLASHATTN_CU_SM90_OR_NEWER
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
#else
  unsupported_arch();
  return 0;
#endif
}

// Four floats from a shared::cluster address (16-byte aligned), e.g. another CTA's.
FLASHATTN_CU_DEVICE float4 ld_shared_cluster_v4(uint32_t addr) {
#if FLASHATTN_CU_SM90_OR_NEWER
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
#else
  unsupported_arch();
  return make_float4(0.f, 0.f, 0.f, 0.f);
#endif
}

}  // namespace flashattn_cu::ptx
