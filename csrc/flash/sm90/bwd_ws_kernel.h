// FlashAttention backward on Hopper, warp-specialized (sm_90a): the main kernel of bwd_kernel.h
// with its loads and its dQ reductions moved off the consumers' path. Not in the library's
// dispatch: sm90/bwd_launch.h runs it only when asked (run_bwd_ordered's `warp_specialized`,
// benchmarks/tune/tune_bwd90.cu mode `ws`). Measured on the H200 (NOTES 12.39): 4-11% slower
// than bwd_kernel.h at d 64 and 128, with two or three Q buffers alike; kept for the harness.
//
// Same work split, arithmetic and accumulation order as bwd_kernel.h (one thread block per kBlockN
// keys of one (batch, kv head); two consumer warpgroups of 64 keys each; S^T, dP^T, dV, dK, dQ by
// wgmma in the same groups), so dK and dV come out bitwise the same. What differs is who waits:
//  * warpgroup 0, the producer (setmaxnreg down to 24): warp 0 loads each step's Q (TMA)
//    into a ring of kQStages buffers and dO with the M / L / D rows (bulk copies) into one of
//    kDoStages, each buffer with a full mbarrier (the copies' bytes) and an empty one (each
//    consumer warp arrives once the buffer's last reader has retired: dK for Q, dV for dO and
//    the rows); warp 1 is the dQ warp: it adds each consumer
//    warpgroup's staged dQ half into the fp32 accumulator by one bulk reduction, handed over
//    through named barriers (kBwdDqFull0 + c: staged; kBwdDqEmpty0 + c: read, the chunk free);
//  * warpgroups 1 and 2, the consumers (setmaxnreg up to 240): no thread of theirs issues a
//    load or a reduction or waits for one; the only barrier they share each step is the one
//    that publishes both halves of dS^T to the dQ GEMM (kBwdDsStored), and dS^T is
//    double-buffered so that the next step's stores need no second one.
// bwd_kernel.h instead has thread 0 issue both and every step end in a __syncthreads.
// dQ is staged in bwd/params.h dq_frag_ws_offset's order (each warpgroup's half contiguous, one
// bulk reduction each), which the postprocess reads back (BwdConvertJob::frag_ws).
#pragma once

#include <cstdint>
#include <type_traits>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/bwd_math.h"
#include "../common/numeric.h"
#include "../problem/dropout.h"
#include "../problem/mask.h"
#include "../problem/score_mod.h"
#include "../ptx/mbarrier.h"
#include "../ptx/sync.h"
#include "../ptx/tma.h"
#include "../ptx/wgmma.h"
#include "bwd_common.h"
#include "bwd_kernel.h"

namespace flashattn_cu::sm90 {

template <int kHeadDim_, int kBlockM_, bool kDkNext_ = true, int kQStages_ = 3,
          int kDoStages_ = 2>
struct BwdWsTraits : BwdBlockShape<kHeadDim_, kBlockM_> {
  using Shape = BwdBlockShape<kHeadDim_, kBlockM_>;
  using Shape::kBlockM, Shape::kBlockN, Shape::kDqBytes, Shape::kDqMTiles, Shape::kOffQ,
      Shape::kQBytes, Shape::kWarpGroups;
  // dK's wgmma runs on into the next step (bwd_kernel.h's order) instead of retiring within its
  // own: its A operand (dS^T, 16 registers at d 128) then stays live through the next S^T / dP^T.
  static constexpr bool kDkNext = kDkNext_;
  // Two rings: Q (its last reader dK, retired during the next step's S^T wait) and dO with the
  // M / L / D rows (their last reader dV, retired within the step). Three Q buffers and two dO
  // ones let the producer load step it + 1 once step it - 1 is done with them, as
  // bwd_kernel.h's three shared buffers do (with two Q buffers it waits for step it's S^T).
  static constexpr int kQStages = kQStages_;
  static constexpr int kDoStages = kDoStages_;
  static constexpr int kConsumerThreads = kWarpGroups * 128;
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  static constexpr int kNThreads = kConsumerThreads + 128;  // + the producer warpgroup
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;
  static constexpr int kOffDO = kOffQ + kQStages * kQBytes;
  static constexpr int kOffDS = kOffDO + kDoStages * kQBytes;  // two dS^T tiles
  static constexpr int kOffMax = kOffDS + 2 * kDsBytes;         // rows: in the dO ring
  static constexpr int kOffLog2Sum = kOffMax + kDoStages * kBlockM * 4;
  static constexpr int kOffD = kOffLog2Sum + kDoStages * kBlockM * 4;
  static constexpr int kOffDQ = kOffD + kDoStages * kBlockM * 4;
  static constexpr int kDqHalfBytes = kDqBytes / 2;  // one consumer warpgroup's columns
  // mbarriers (8 bytes each): Q full, Q empty, dO full, dO empty.
  static constexpr int kOffBar = kOffDQ + kDqBytes;
  static constexpr int kOffQFull = kOffBar;
  static constexpr int kOffQEmpty = kOffQFull + 8 * kQStages;
  static constexpr int kOffDoFull = kOffQEmpty + 8 * kQStages;
  static constexpr int kOffDoEmpty = kOffDoFull + 8 * kDoStages;
  static constexpr int kSmemBytes = kOffDoEmpty + 8 * kDoStages + 1024;  // + alignment slack

  static_assert(kQStages >= 2 && kDoStages >= 2, "dK runs on: at least two Q buffers");
  static_assert(kBlockM == backward::kDqFragRows && kDqMTiles == 1,
                "bwd/params.h dq_frag_ws_offset's blocks");
  static_assert(kOffDQ % 16 == 0, "the bulk source 16-byte aligned");
  static_assert(kDsBytes % 1024 == 0, "sw128 tiles 1024-byte aligned");
  static_assert(kSmemBytes <= 227 * 1024, "fits the sm_90 shared memory");
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= 65536, "register file");
};

// The producer's loads of step (head, m): Q into Q buffer `qs` (its full mbarrier), dO and the
// M / L / D rows into dO buffer `ds` (its own); the rows wait for the preprocess on the first
// step (bwd_common.h tma_query_loads).
template <typename Traits, typename Work>
__device__ __forceinline__ void ws_load_step(const BwdKernelParams& kp, const Work& w,
                                             const void* q_map, const void* do_map,
                                             uint32_t s_base, int head, int m, int qs, int ds,
                                             bool first) {
  tma_query_loads<Traits, false>(kp, w, q_map, do_map, s_base, head, m, qs,
                                 s_base + Traits::kOffQFull + 8 * qs, ds,
                                 s_base + Traits::kOffDoFull + 8 * ds, first);
}

// A ring position: the buffer of use number `it` and that use's parity.
template <int kStages>
struct BwdRing {
  int stage = 0, phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// The dQ warp's side of the hand-over (warp 1 of the producer warpgroup): for every step, each
// consumer warpgroup's staged half added into the step's accumulator block by one bulk reduction
// (lane 0), then the chunk handed back once read. The consumers' first wait finds the chunks
// free (the arrivals before the loop); the last step's chunks are not handed back (nothing
// waits for them).
template <typename Traits, typename Work>
__device__ __forceinline__ void dq_warp(const BwdKernelParams& kp, const Work& w, uint32_t s_base,
                                        int lane) {
  constexpr int kThreads = 128 + 32;  // a consumer warpgroup and this warp
  const BwdParams& p = kp.p;
  ptx::grid_dependency_wait();  // the accumulator cleared by the preprocess
  if (w.total > 0) {
    ptx::named_barrier_arrive(ptx::NamedBarrier::kBwdDqEmpty0, kThreads);
    ptx::named_barrier_arrive(ptx::NamedBarrier::kBwdDqEmpty1, kThreads);
  }
  const SeqInfo seq = seq_info<Work::kSeqlens>(p, w.batch);
  BwdStep step{w.head_first, w.m_begin};
#pragma unroll 1
  for (int it = 0; it < w.total; ++it) {
    float* block = dq_accum_block<Traits::kBlockM, Traits::kHeadDim, Work::kSeqlens>(
        kp, seq, step.head, step.m);
#pragma unroll
    for (int c = 0; c < Traits::kWarpGroups; ++c) {
      ptx::named_barrier_sync(
          static_cast<ptx::NamedBarrier>(static_cast<int>(ptx::NamedBarrier::kBwdDqFull0) + c),
          kThreads);
      if (lane == 0) {
        ptx::bulk_reduce_add_f32(block + c * (Traits::kDqHalfBytes / 4),
                                 s_base + Traits::kOffDQ + c * Traits::kDqHalfBytes,
                                 Traits::kDqHalfBytes);
        ptx::tma_store_commit();
        ptx::tma_store_wait<0>();  // the chunk read
      }
      __syncwarp();
      if (it + 1 < w.total) {
        ptx::named_barrier_arrive(
            static_cast<ptx::NamedBarrier>(static_cast<int>(ptx::NamedBarrier::kBwdDqEmpty0) + c),
            kThreads);
      }
    }
    step = next_step(w, step);
  }
  // The block's reductions done (global memory written) before it exits.
  if (lane == 0) ptx::bulk_wait_all<0>();
}

template <typename Element, typename Traits, int kVariant>
__device__ __forceinline__ void bwd_ws_block(const BwdKernelParams& kp, const void* q_map,
                                             const void* do_map, char* smem_raw) {
  constexpr bool kBf16 = std::is_same_v<Element, __nv_bfloat16>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kQTiles = Traits::kQTiles, kColTiles = Traits::kColTiles;
  const BwdParams& p = kp.p;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wg = warp / 4;  // 0: producer; 1, 2: consumers
  const auto w =
      bwd_work<kBlockM, kBlockN, kVariant, bwd_compact_tiles<Traits::kHeadDim, kVariant>()>(kp);
  // As bwd_kernel.h: the postprocess may be scheduled once every block has started; every
  // block waits for the preprocess before it exits.
  ptx::launch_dependents();
  if (w.keys_valid <= 0) {  // varlen: a key block past this entry's length
    ptx::grid_dependency_wait();
    return;
  }

  uint32_t s_base;
  char* smem = align_smem_1024(smem_raw, s_base);
  const uint32_t q_full = s_base + Traits::kOffQFull, q_empty = s_base + Traits::kOffQEmpty;
  const uint32_t do_full = s_base + Traits::kOffDoFull, do_empty = s_base + Traits::kOffDoEmpty;
  if (tid == 0) {
    // Empty: one arrival per consumer warp (lane 0, after the warp's wait for the readers).
#pragma unroll
    for (int s = 0; s < Traits::kQStages; ++s) {
      ptx::mbarrier_init(q_full + 8 * s, 1);
      ptx::mbarrier_init(q_empty + 8 * s, Traits::kConsumerWarps);
    }
#pragma unroll
    for (int s = 0; s < Traits::kDoStages; ++s) {
      ptx::mbarrier_init(do_full + 8 * s, 1);
      ptx::mbarrier_init(do_empty + 8 * s, Traits::kConsumerWarps);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();  // the last barrier of all warpgroups: the roles split here
  const bool compute_dq = !p.deterministic;

  if (wg == 0) {
    ptx::setmaxnreg_dec<Traits::kProducerRegs>();
    if (warp == 0) {
      if (lane == 0) {
        // Step it's buffers once the consumers released those of step it - k (each ring's
        // empty mbarrier: the parity of that earlier use).
        BwdStep step{w.head_first, w.m_begin};
        BwdRing<Traits::kQStages> qs;
        BwdRing<Traits::kDoStages> ds;
#pragma unroll 1
        for (int it = 0; it < w.total; ++it) {
          if (it >= Traits::kDoStages) {
            ptx::mbarrier_wait_parity(do_empty + 8 * ds.stage, ds.phase ^ 1);
          }
          if (it >= Traits::kQStages) {
            ptx::mbarrier_wait_parity(q_empty + 8 * qs.stage, qs.phase ^ 1);
          }
          ws_load_step<Traits>(kp, w, q_map, do_map, s_base, step.head, step.m, qs.stage,
                               ds.stage, it == 0);
          step = next_step(w, step);
          qs.advance();
          ds.advance();
        }
        if (w.total == 0) ptx::grid_dependency_wait();
      }
    } else if (warp == 1 && compute_dq) {
      dq_warp<Traits>(kp, w, s_base, lane);
    }
    return;
  }

  ptx::setmaxnreg_inc<Traits::kConsumerRegs>();
  const int ctid = tid - 128;            // 0 .. 255 over the consumers
  const int cw = ctid / 32, c = cw / 4;  // consumer warp; warpgroup: keys c * 64 ..
  const int warp_key0 = cw * 16;         // this warp's 16 keys (rows of S^T, dK, dV)
  const auto sync_consumers = [] {
    ptx::named_barrier_sync(ptx::NamedBarrier::kBwdConsumers, Traits::kConsumerThreads);
  };
  const uint32_t sK = s_base + Traits::kOffK, sV = s_base + Traits::kOffV;
  const uint32_t sQ = s_base + Traits::kOffQ, sDO = s_base + Traits::kOffDO;

  // K / V by cp.async over the consumers.
  if (w.total > 0) {
    load_kv<Traits, Element, Traits::kConsumerThreads>(kp, w, s_base, ctid);
    ptx::cp_async_commit();
  }

  float acc_dk[kColTiles][4], acc_dv[kColTiles][4];
#pragma unroll
  for (int i = 0; i < kColTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[i][e] = acc_dv[i][e] = 0.f;

  BwdStep step{w.head_first, w.m_begin};
  BwdRing<Traits::kQStages> qs;   // this step's Q buffer and its use number's parity
  BwdRing<Traits::kDoStages> ds;  // this step's dO / rows buffer
  int q_last = Traits::kQStages - 1;  // the last step's Q buffer
  // One arrival per consumer warp on a ring's empty mbarrier, once every lane of the warp has
  // waited for the buffer's last reader.
  const auto release = [lane](uint32_t bar) {
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(bar);
  };
#pragma unroll 1
  for (int it = 0; it < w.total; ++it) {
    const int head = step.head, m = step.m;
    if (it == 0) {
      // K / V of both warpgroups landed and published (the dQ GEMM reads all of K).
      ptx::cp_async_wait<0>();
      ptx::fence_proxy_async_shared();
      sync_consumers();
    }
    ptx::mbarrier_wait_parity(q_full + 8 * qs.stage, qs.phase);
    ptx::mbarrier_wait_parity(do_full + 8 * ds.stage, ds.phase);
    const uint32_t sQs = sQ + qs.stage * Traits::kQBytes;
    const uint32_t sDOs = sDO + ds.stage * Traits::kQBytes;
    const char* s_max = smem + Traits::kOffMax + ds.stage * kBlockM * 4;
    const char* s_log2sum = smem + Traits::kOffLog2Sum + ds.stage * kBlockM * 4;
    const char* s_d = smem + Traits::kOffD + ds.stage * kBlockM * 4;
    const int buf = it & 1;  // this step's dS^T tile
    char* s_ds = smem + Traits::kOffDS + buf * Traits::kDsBytes;
    const uint32_t sDS = s_base + Traits::kOffDS + buf * Traits::kDsBytes;

    float acc_s[kQTiles][4], acc_dp[kQTiles][4];
    issue_s_dp<kBf16, Traits>(acc_s, acc_dp, sK, sV, sQs, sDOs, c);
    ptx::wgmma_wait<1>();  // S^T, and the last step's dK
    ptx::fence_operand(acc_s);
    // The last step's Q buffer: its last reader (dK) retired in this warp's warpgroup.
    if (it > 0) release(q_empty + 8 * q_last);
    uint32_t p16[kBlockM / 16][4], ds16[kBlockM / 16][4];
    probs_and_grads<Element, Traits, kVariant>(kp, w, head, m, acc_s, acc_dp, s_max, s_log2sum,
                                               s_d, s_ds, p16, ds16, warp_key0, lane);
    const auto issue_dv = [&] { issue_rs_gemm<kBf16, Traits>(acc_dv, p16, sDOs); };
    const auto issue_dk = [&] { issue_rs_gemm<kBf16, Traits>(acc_dk, ds16, sQs); };
    if (compute_dq) {
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        store_a_frag_sw128<kBlockN, variant_softcap(kVariant)>(s_ds, warp_key0, kk * 16, ds16[kk],
                                                              lane);
      }
      ptx::wgmma_fence();
      issue_dv();
      ptx::wgmma_commit();
      ptx::fence_proxy_async_shared();
      ptx::named_barrier_sync(ptx::NamedBarrier::kBwdDsStored, Traits::kConsumerThreads);
      constexpr int kDqCols = Traits::kDqCols;
      float acc_dq[Traits::kDqMTiles][kDqCols / 8][4];
      issue_dq<kBf16, Traits>(acc_dq, sDS, sK, c * kDqCols);
      ptx::wgmma_commit();
      issue_dk();
      ptx::wgmma_commit();
      if constexpr (Traits::kDkNext) {
        ptx::wgmma_wait<1>();  // dV and dQ done; dK runs on into the next step
      } else {
        ptx::wgmma_wait<0>();
      }
#pragma unroll
      for (int mt = 0; mt < Traits::kDqMTiles; ++mt) ptx::fence_operand(acc_dq[mt]);
      release(do_empty + 8 * ds.stage);  // dO's and the rows' last reader (dV) retired
      // This warpgroup's chunk free (the dQ warp read the last step's), then staged in
      // dq_frag_ws_offset's order: pair (hr, nt) of warp cw, lane l at float
      // ((cw * 2 + hr) * kDqCols / 8 + nt) * 64 + 2 l.
      // (The barrier ids by a warp-uniform branch: held in registers across the step they
      // spilled at d 128.)
      if (c == 0) {
        ptx::named_barrier_sync(ptx::NamedBarrier::kBwdDqEmpty0, 128 + 32);
      } else {
        ptx::named_barrier_sync(ptx::NamedBarrier::kBwdDqEmpty1, 128 + 32);
      }
      char* s_dq = smem + Traits::kOffDQ + cw * (2 * (kDqCols / 8) * 256) + lane * 8;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
#pragma unroll
        for (int nt = 0; nt < kDqCols / 8; ++nt) {
          *reinterpret_cast<float2*>(s_dq + (hr * (kDqCols / 8) + nt) * 256) =
              make_float2(acc_dq[0][nt][hr * 2], acc_dq[0][nt][hr * 2 + 1]);
        }
      ptx::fence_proxy_async_shared();  // for the dQ warp's bulk reduction
      if (c == 0) {
        ptx::named_barrier_arrive(ptx::NamedBarrier::kBwdDqFull0, 128 + 32);
      } else {
        ptx::named_barrier_arrive(ptx::NamedBarrier::kBwdDqFull1, 128 + 32);
      }
    } else {
      ptx::wgmma_fence();
      issue_dv();
      issue_dk();
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
      release(do_empty + 8 * ds.stage);
    }
    step = next_step(w, step);
    q_last = qs.stage;
    qs.advance();
    ds.advance();
  }
  ptx::wgmma_wait<0>();  // the last step's dK
  finish_dkdv<variant_dropout(kVariant)>(kp, acc_dk, acc_dv);
  // dK = softmax_scale * dS^T Q, dV as accumulated; staged over K / V once both warpgroups are
  // done with them (sync_consumers).
  store_dkdv<Element, Traits, kColTiles, decltype(w), Traits::kConsumerThreads>(
      kp, w, smem, acc_dk, acc_dv, warp_key0, 0, ctid, sync_consumers);
}

template <typename Element, typename Traits, int kVariant>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    bwd_ws_kernel(const __grid_constant__ typename Traits::Params params) {
#if FLASHATTN_CU_SM90A
  extern __shared__ __align__(1024) char smem[];
  sm90::bwd_ws_block<Element, Traits, kVariant>(params.kp, &params.q_map, &params.do_map, smem);
#else
  ptx::unsupported_arch();
#endif
}

}  // namespace flashattn_cu::sm90
