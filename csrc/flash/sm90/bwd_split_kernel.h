// FlashAttention backward on wgmma (sm_90a) for large head dims (d = 256): the split main kernel.
//
// At d = 256 a warpgroup cannot hold dK and dV of 64 keys (256 fp32 registers per thread), so the
// two warpgroups of a block share 64 keys and split the work by operand instead of by keys:
//   warpgroup 0: S^T  = K Q^T  (m64 keys x n kBlockM x k d)  -> P^T = exp2(..) -> P^T to smem
//   warpgroup 1: dP^T = V dO^T (the same shape, at the same time) -> dS^T = P^T (dP^T - D),
//                P^T read back from smem -> dS^T to smem
//   both, columns 128 wg ..:  dV += P^T dO,  dK += dS^T Q,  dQ = dS K   (wgmma SS, n = 128)
// so every GEMM is done once and each thread holds dK, dV (64 + 64) and dQ (64) fp32 registers;
// dQ goes to the accumulator by bulk reductions of its block, staged in shared memory.
// P^T and dS^T live in sw128 [key][query] tiles: K-major A operands for dV/dK, MN-major A for
// dQ. Semantics, workspace and padding conventions are those of bwd_kernel.h.
//
// One step (query block), barriers over the whole block:
//   bar | thread 128: the last step's dQ reductions | wait Q/dO/M/L/D (mbarrier)
//   | wg0: S^T, wg1: dP^T | thread 128: wait for the reductions' reads, issue the next step's
//   loads (TMA, bulk copies) into the other buffer | wait
//   | wg0: mask, exp2, store P^T; fence.proxy.async | bar | wg0: dV (in flight)
//   | wg1: read P^T, dS^T, store dS^T; fence.proxy.async | bar | wg1: dV; both: dQ, dK; wait dQ
//   | wait all | stage dQ over this step's Q / dO buffers (kBulkDq; without it: red.global.add
//   of dQ's fragments with dK in flight, the next loads issued at the step's start)
#pragma once

#include <cstdint>
#include <type_traits>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/bwd_math.h"
#include "../common/numeric.h"
#include "../problem/dropout.h"
#include "../problem/mask.h"
#include "../problem/score_mod.h"
#include "../ptx/atomic.h"
#include "../ptx/math.h"
#include "../ptx/sync.h"
#include "../ptx/wgmma.h"
#include "bwd_common.h"

namespace flashattn_cu::sm90 {

template <int kHeadDim_, int kBlockM_, int kStagger_ = 0, bool kBulkDq_ = true,
          int kIssuerWg_ = 1, int kPLowBits_ = 16>
struct BwdSplitTraits {
  static constexpr int kHeadDim = kHeadDim_;
  // What P^T's 16 bits leave out, passed from warpgroup 0 to warpgroup 1 beside P^T so that dS^T
  // is rounded once (common/bwd_math.h ds_from_probs): 16 (the library) a 16-bit tile, 8 e4m3
  // bytes in a plain [warp][k-step][lane] array (bwd_math.h pack_e4m3_residual: half the bytes,
  // ~2^-12 of P^T where it weighs), 0 nothing (dS^T from the 16-bit P^T: two roundings, the
  // library until f057217). A tuning knob (benchmarks/tune/tune_bwd90.cu mode `residual`).
  static constexpr int kPLowBits = kPLowBits_;
  static_assert(kPLowBits == 16 || kPLowBits == 8 || kPLowBits == 0, "16, 8 or 0 bits");
  // dQ into the accumulator by bulk reductions (cp.reduce.async.bulk) of the block staged in
  // shared memory, instead of every thread's red.global.add of its fragments, which stall on the
  // load / store unit's queue (the bulk reductions: 0.911-0.916x the backward's time on the H200,
  // NOTES 12.41; off: the red.adds, for tune_bwd90's A/B). The 64 x d fp32 block (64 KB) is
  // staged over the step's own Q and dO buffers, free once the step's GEMMs are done: each
  // warpgroup writes only the halves of them that it alone reads (its dK / dV columns), so no
  // barrier precedes the staging; the block is in bwd/params.h dq_frag_ws_offset's order (each
  // warp's pairs one 8 KB run), four 16 KB reductions issued by one thread (kIssuerWg's) at the
  // next step's start, whose loads into that buffer wait for them to have read it.
  static constexpr bool kBulkDq = kBulkDq_;
  // kBulkDq: the warpgroup whose first thread issues the reductions and, once they have read the
  // buffer, the next step's loads: 0 after its S^T's issue, 1 after its dP^T's (warpgroup 1
  // then waits for warpgroup 0's exponentials anyway): 1 took 0.944-0.963x the time of 0 on the
  // H200 (tune_bwd90 `issuer`, NOTES 12.41).
  static constexpr int kIssuerWg = kIssuerWg_;
  // When warpgroup 1 issues dP^T: 0 with warpgroup 0's S^T (both GEMMs share the tensor cores
  // and retire together, then warpgroup 0's exponentials run with the tensor cores idle); 1 once
  // S^T has retired (a named barrier), so that the exponentials run under dP^T; 2 once S^T has
  // been issued. A tuning knob (benchmarks/tune/tune_bwd90.cu mode `stagger`): 1 and 2 took
  // 1.02-1.05x the time with the red.adds, 1 1.02-1.03x with the bulk reductions (NOTES 12.41).
  static constexpr int kStagger = kStagger_;
  // Timing probes (benchmarks/tune/tune_bwd90.cu mode `dqprobe`, a derived traits type hides
  // this): 1 leaves out dQ's reductions, 2 dQ's GEMM as well (dq then wrong); 0 in the library.
  static constexpr int kProbeDq = 0;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = 64;
  static constexpr int kNThreads = 256;
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kQTiles = kBlockM / 8;
  static constexpr int kHalfCols = kHeadDim / 2;  // dK/dV/dQ columns per warpgroup
  using Params = BwdTmaParams;  // bwd_common.h: the kernel parameters and the q / dout maps
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kPBytes = kBlockN * kBlockM * 2;
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKVBytes;
  static constexpr int kOffQ = kOffV + kKVBytes;
  static constexpr int kOffDO = kOffQ + 2 * kQBytes;
  static constexpr int kOffP = kOffDO + 2 * kQBytes;
  static constexpr int kOffDS = kOffP + kPBytes;
  // What P^T's 16 bits leave out (kPLowBits; common/bwd_math.h pack_a_frag_split), from
  // warpgroup 0 to warpgroup 1 beside P^T, so that dS^T is formed from P^T at about twice the
  // 16-bit precision and rounded once (kPLowBytes: 8 KB at the library's 16 bits, 219 KB in all
  // at d 256; 4 KB at 8, none at 0).
  static constexpr int kOffPLow = kOffDS + kPBytes;
  static constexpr int kPLowBytes = kPBytes * kPLowBits / 16;
  static constexpr int kOffMax = kOffPLow + kPLowBytes;
  static constexpr int kOffLog2Sum = kOffMax + 2 * kBlockM * 4;
  static constexpr int kOffD = kOffLog2Sum + 2 * kBlockM * 4;
  static constexpr int kStages = 2;                          // Q / dO / M / L / D buffers
  static constexpr int kOffBar = kOffD + 2 * kBlockM * 4;  // the two buffers' mbarriers
  static constexpr int kSmemBytes = kOffBar + 16 + 1024;      // + alignment slack

  static_assert(kHalfCols % 64 == 0, "each warpgroup owns whole 64-column atoms");
  static_assert(kBlockM == 64, "dQ is one m64 slab");
  static_assert(backward::kBwdRowPad % kBlockM == 0, "workspace rows are whole query blocks");
};

template <typename Element, typename Traits, int kVariant>
__device__ __forceinline__ void bwd_split_block(const BwdKernelParams& kp, const void* q_map,
                                                const void* do_map, char* smem_raw) {
  constexpr bool kDynamic = variant_dynamic(kVariant);  // problem/mask.h: windows
  constexpr bool kSeqlens = variant_seqlens(kVariant);  // and sequence arrays
  constexpr bool kDropout = variant_dropout(kVariant);
  constexpr bool kBf16 = std::is_same_v<Element, __nv_bfloat16>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim, kHalf = Traits::kHalfCols;
  constexpr int kQTiles = Traits::kQTiles, kColTiles = kHalf / 8;
  const BwdParams& p = kp.p;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);  // uniform: descriptors stay in UR
  const int t = lane % 4;
  const int warp_key0 = (warp % 4) * 16;  // both warpgroups cover keys 0..63
  const int col0 = wg * kHalf;            // this warpgroup's dK/dV/dQ columns
  // kPLowBits 8: the byte offset of this lane's 8 bytes of k-step kk (the same lane of either
  // warpgroup holds the same fragment positions).
  [[maybe_unused]] const auto e4m3_low_offset = [&](int kk) {
    return Traits::kOffPLow + (((warp % 4) * (kBlockM / 16) + kk) * 32 + lane) * 8;
  };
  const auto w =
      bwd_work<kBlockM, kBlockN, kVariant, bwd_compact_tiles<Traits::kHeadDim, kVariant>()>(kp);
  // The postprocess may be scheduled once every block here has started (it waits for this
  // grid's end; sm90/bwd_kernel.h triggers after its wait for the preprocess instead, for its
  // streamed dQ convert, which this kernel does not feed).
  ptx::launch_dependents();
  if (w.keys_valid <= 0) {   // varlen: a key block past this entry's length
    ptx::grid_dependency_wait();
    return;
  }

  uint32_t s_base;
  char* smem = align_smem_1024(smem_raw, s_base);
  const uint32_t sK = s_base + Traits::kOffK, sV = s_base + Traits::kOffV;
  const uint32_t sQ = s_base + Traits::kOffQ, sDO = s_base + Traits::kOffDO;
  const uint32_t sP = s_base + Traits::kOffP, sDS = s_base + Traits::kOffDS;
  // K / V by cp.async, the first step's Q / dO / rows into buffer 0; the preprocess waited for.
  begin_block<Traits, Element>(kp, w, q_map, do_map, s_base, tid);

  float acc_dk[kColTiles][4], acc_dv[kColTiles][4];
#pragma unroll
  for (int i = 0; i < kColTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[i][e] = acc_dv[i][e] = 0.f;

  const bool compute_dq = !p.deterministic && Traits::kProbeDq != 2;
  const float scale_log2 = kp.score.scale_log2;
  BwdStep step{w.head_first, w.m_begin};
  // kBulkDq: the staged block's place in the accumulator, and its reductions (the issuer thread)
  // from the Q / dO buffers of stage `st`: warps 0-1, 2-3, 4-5, 6-7's runs (Traits::kBulkDq).
  constexpr bool kBulk = Traits::kBulkDq;
  const bool issuer = tid == Traits::kIssuerWg * 128;
  float* dq_block = nullptr;
  const auto reduce_staged_dq = [&](int st) {
    constexpr int kQuarter = Traits::kQBytes / 2;  // two warps' 8 KB runs
    const uint32_t q = sQ + st * Traits::kQBytes, d = sDO + st * Traits::kQBytes;
    if constexpr (Traits::kProbeDq == 0) {
      ptx::bulk_reduce_add_f32(dq_block, q, kQuarter);
      ptx::bulk_reduce_add_f32(dq_block + kQuarter / 4, d, kQuarter);
      ptx::bulk_reduce_add_f32(dq_block + 2 * (kQuarter / 4), q + kQuarter, kQuarter);
      ptx::bulk_reduce_add_f32(dq_block + 3 * (kQuarter / 4), d + kQuarter, kQuarter);
    }
    ptx::tma_store_commit();
  };

#pragma unroll 1
  for (int it = 0; it < w.total; ++it) {
    const int stage = it & 1;
    const int head = step.head, m = step.m;
    const BwdStep next = next_step(w, step);
    // The next step's loads take the other buffer; this step's buffer landed.
    // kBulkDq: the next step's loads go out after the GEMMs' issue below, once the last step's
    // reductions (issued here, from that buffer, after the barrier: every thread's dQ staged and
    // fenced) have read it.
    begin_step<Traits, !kBulk>(kp, w, q_map, do_map, s_base, it, next, stage ^ 1, tid);
    if (kBulk && issuer && it > 0 && compute_dq) reduce_staged_dq(stage ^ 1);
    ptx::mbarrier_wait_parity(s_base + Traits::kOffBar + 8 * stage, (it >> 1) & 1);
    const uint32_t sQs = sQ + stage * Traits::kQBytes, sDOs = sDO + stage * Traits::kQBytes;
    clear_query_tail<Traits, kSeqlens>(p, w.seqlen_q - m * kBlockM, sQs, sDOs, tid);
    const char* s_max = smem + Traits::kOffMax + stage * kBlockM * 4;
    const char* s_log2sum = smem + Traits::kOffLog2Sum + stage * kBlockM * 4;
    const char* s_d = smem + Traits::kOffD + stage * kBlockM * 4;

    // Dropout (problem/dropout.h): both warpgroups hold the same 64 keys x kBlockM queries, so
    // each computes the keep bits of its own fragments (while its GEMM runs): warpgroup 0 for
    // dV's operand (P^T o M, to sP; the undropped P^T goes to sDS for warpgroup 1), warpgroup 1
    // for the gradient reaching P^T (M o dP^T / (1 - p)).
    [[maybe_unused]] uint32_t keep[keep_words(kQTiles * 4)];
    // Warpgroup 0: S^T = K Q^T; warpgroup 1: dP^T = V dO^T (A: 64 keys, B: queries, k = d).
    float acc[kQTiles][4];
    {
      const uint32_t a_tile = ptx::pin_smem_addr(wg == 0 ? sK : sV);
      const uint32_t b_tile = ptx::pin_smem_addr(wg == 0 ? sQs : sDOs);
      if constexpr (Traits::kStagger != 0) {
        if (wg == 1) ptx::named_barrier_sync(ptx::NamedBarrier::kBwdSplitSDone, 256);
      }
      ptx::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        ptx::wgmma_ss<kBlockM, kBf16, 0, 0>(acc, ptx::sw128_desc_k_major<kBlockN>(a_tile, 0, ks),
                                            ptx::sw128_desc_k_major<kBlockM>(b_tile, 0, ks),
                                            ks > 0);
      }
      ptx::wgmma_commit();
      if constexpr (kBulk) {
        if (issuer && it + 1 < w.total) {
          if (it > 0 && compute_dq) ptx::tma_store_wait<0>();  // the reductions read the buffer
          tma_query_block<Traits>(kp, w, q_map, do_map, s_base, next.head, next.m, stage ^ 1,
                                  false);
        }
      }
      if constexpr (Traits::kStagger == 2) {
        if (wg == 0) ptx::named_barrier_arrive(ptx::NamedBarrier::kBwdSplitSDone, 256);
      }
      if constexpr (kDropout) {
        dropout_of(kp, w.batch, head)
            .template keep_bits_transposed<kQTiles>(keep, w.n_start + warp_key0, m * kBlockM,
                                                    lane);
      }
      ptx::wgmma_wait<0>();
      ptx::fence_operand(acc);
      if constexpr (Traits::kStagger == 1) {
        if (wg == 0) ptx::named_barrier_arrive(ptx::NamedBarrier::kBwdSplitSDone, 256);
      }
    }

    // The softcap variants' dS factor, 1 - t^2, from warpgroup 0's capped scores to warpgroup 1
    // through the dS^T tile (bwd_common.h StoredSoftcapGradSw128: each lane's own slots, which
    // the lane of warpgroup 1 at the same fragment position reads and then overwrites with its
    // dS^T; the tile is free from the step's start, its last readers retired at the last
    // step's end), instead of warpgroup 1 recovering t from P (a third MUFU a score, LG2).
    [[maybe_unused]] const StoredSoftcapGradSw128<Element, kBlockN> stored_grad{
        {smem + Traits::kOffDS, warp_key0, lane}};
    if (wg == 0) {
      apply_score_mods_transposed<kVariant>(acc, kp, w.batch, head, w.n_start + warp_key0,
                                            m * kBlockM, lane, capped_hook<kVariant>(stored_grad));
      if (m < w.um_begin || (kDynamic && m >= w.um_end)) {
        block_mask(p, w).apply_transposed(acc, w.n_start + warp_key0, m * kBlockM, lane);
      }
      probs_from_scores(acc, s_max, s_log2sum, 0, scale_log2, t);  // P^T, in place
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        uint32_t a[4];
        if constexpr (Traits::kPLowBits == 16) {
          uint32_t lo[4];
          pack_a_frag_split<Element>(acc, kk, a, lo);
          store_a_frag_sw128<kBlockN>(smem + Traits::kOffPLow, warp_key0, kk * 16, lo, lane);
        } else {
          pack_a_frag<Element>(acc, kk, a);
          if constexpr (Traits::kPLowBits == 8) {
            *reinterpret_cast<uint2*>(smem + e4m3_low_offset(kk)) =
                pack_e4m3_residual<Element>(acc, kk, a);
          }
        }
        if constexpr (kDropout) {
          store_a_frag_sw128<kBlockN>(smem + Traits::kOffDS, warp_key0, kk * 16, a, lane);
          drop_a_frag(a, keep, kk);
        }
        store_a_frag_sw128<kBlockN>(smem + Traits::kOffP, warp_key0, kk * 16, a, lane);
      }
      ptx::fence_proxy_async_shared();
    }
    __syncthreads();  // P^T published

    // dV += P^T dO (A = P^T [key][query], K-major; B = dO, MN-major, this warpgroup's columns).
    auto issue_dv = [&]() {
      const uint32_t a_tile = ptx::pin_smem_addr(sP);
      const uint32_t b_cols = ptx::pin_smem_addr(sDOs + ptx::sw128_mn_col_offset<kBlockM>(col0));
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        ptx::wgmma_ss<kHalf, kBf16, 0, 1>(acc_dv, ptx::sw128_desc_k_major<kBlockN>(a_tile, 0, kk),
                                          ptx::sw128_desc_mn_major<kBlockM>(b_cols, kk, 0), 1);
      }
      ptx::wgmma_commit();
    };
    if (wg == 0) {
      issue_dv();
    } else {
      // dS^T = P^T (dP^T - D) from the 16-bit P^T warpgroup 0 stored and what its 16 bits left
      // out (same fragment positions; with dropout the undropped P^T, in sDS, which dS^T then
      // overwrites element by element): one rounding of dS^T, as FlashAttention-2's.
      if constexpr (kDropout) apply_keep_bits(acc, keep, kp.dropout.rp);
      constexpr int kOffProbs = kDropout ? Traits::kOffDS : Traits::kOffP;
      const auto grad = step_ds_grad<kVariant>(stored_grad, kp, w.batch, head, s_max, s_log2sum,
                                                w.n_start + warp_key0 + lane / 4, m * kBlockM, t);
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        uint32_t pa[4];
        load_a_frag_sw128<kBlockN>(smem + kOffProbs, warp_key0, kk * 16, pa, lane);
        if constexpr (Traits::kPLowBits == 16) {
          uint32_t lo[4];
          load_a_frag_sw128<kBlockN>(smem + Traits::kOffPLow, warp_key0, kk * 16, lo, lane);
          ds_from_split_probs<Element, true>(acc, kk, pa, lo, s_d, t, grad);
        } else {
          float2 lo[4] = {};
          if constexpr (Traits::kPLowBits == 8) {
            unpack_e4m3_residual<Element>(
                *reinterpret_cast<const uint2*>(smem + e4m3_low_offset(kk)), lo);
          }
          ds_from_hi_lo<Element, true>(acc, kk, pa, [&](int j) { return lo[j]; }, s_d, t, grad);
        }
        uint32_t a[4];
        pack_a_frag<Element>(acc, kk, a);
        store_a_frag_sw128<kBlockN, variant_softcap(kVariant) || kDropout>(
            smem + Traits::kOffDS, warp_key0, kk * 16, a, lane);
      }
      ptx::fence_proxy_async_shared();
    }
    __syncthreads();  // dS^T published
    if (wg == 1) issue_dv();

    // dK += dS^T Q (A = dS^T, K-major; B = Q, MN-major).
    const auto issue_dk = [&] {
      const uint32_t a_tile = ptx::pin_smem_addr(sDS);
      const uint32_t b_cols = ptx::pin_smem_addr(sQs + ptx::sw128_mn_col_offset<kBlockM>(col0));
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        ptx::wgmma_ss<kHalf, kBf16, 0, 1>(acc_dk, ptx::sw128_desc_k_major<kBlockN>(a_tile, 0, kk),
                                          ptx::sw128_desc_mn_major<kBlockM>(b_cols, kk, 0), 1);
      }
      ptx::wgmma_commit();
    };
    ptx::wgmma_fence();
    if (compute_dq) {
      // dQ (kBlockM x this warpgroup's columns) = dS K: A = dS from dS^T (MN-major, m = query),
      // B = K [key][d] (MN-major, n = d).
      float acc_dq[kColTiles][4];
      const uint32_t a_tile = ptx::pin_smem_addr(sDS);
      const uint32_t b_cols = ptx::pin_smem_addr(sK + ptx::sw128_mn_col_offset<kBlockN>(col0));
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        ptx::wgmma_ss<kHalf, kBf16, 1, 1>(acc_dq, ptx::sw128_desc_mn_major<kBlockN>(a_tile, kk, 0),
                                          ptx::sw128_desc_mn_major<kBlockN>(b_cols, kk, 0),
                                          kk > 0);
      }
      ptx::wgmma_commit();
      issue_dk();
      if constexpr (kBulk) {
        ptx::wgmma_wait<0>();  // dV, dQ, dK: this warpgroup's reads of Q / dO done
        ptx::fence_operand(acc_dq);
        // Warp w's pairs (row (w % 4) * 16 + g + 8 hr, column col0 + 8 nt + 2t + e) as one 8 KB
        // run in dq_frag_ws_offset's order, placed in the Q buffer (w % 4 < 2) or the dO buffer
        // at (w / 4) * 16 KB + (w % 2) * 8 KB: warpgroup 0 in the halves (columns 0..127) that
        // only its dK / dV read, warpgroup 1 in the other halves.
        char* s_dq = smem + ((warp % 4) < 2 ? Traits::kOffQ : Traits::kOffDO) +
                     stage * Traits::kQBytes + wg * (Traits::kQBytes / 2) +
                     (warp % 2) * (Traits::kQBytes / 4) + lane * 8;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
#pragma unroll
          for (int nt = 0; nt < kColTiles; ++nt) {
            *reinterpret_cast<float2*>(s_dq + (hr * kColTiles + nt) * 256) =
                make_float2(acc_dq[nt][hr * 2], acc_dq[nt][hr * 2 + 1]);
          }
        ptx::fence_proxy_async_shared();  // for the reductions (after the next barrier)
        dq_block = dq_accum_block<kBlockM, kHeadDim, kSeqlens>(kp, seq_info<kSeqlens>(p, w.batch),
                                                               head, m);
        step = next;
        continue;
      }
      ptx::wgmma_wait<1>();  // dV and dQ done; dK runs under the red.adds
      ptx::fence_operand(acc_dq);
      // Row (query) (warp % 4) * 16 + g + 8 hr, column col0 + 8 nt + 2t + e.
      float* dq_rows = dq_accum_block<kBlockM, kHeadDim, kSeqlens>(
                           kp, seq_info<kSeqlens>(p, w.batch), head, m) +
                       ((warp % 4) * 16 + lane / 4) * kHeadDim + col0 + 2 * t;
#pragma unroll
      for (int hr = 0; hr < 2 && Traits::kProbeDq == 0; ++hr)
#pragma unroll
        for (int nt = 0; nt < kColTiles; ++nt) {
          ptx::red_add_v2_f32(dq_rows + hr * 8 * kHeadDim + nt * 8, acc_dq[nt][hr * 2],
                              acc_dq[nt][hr * 2 + 1]);
        }
    } else {
      issue_dk();
    }
    ptx::wgmma_wait<0>();  // the step's groups still in flight: dK (without dQ, dV too)
    step = next;
  }
  if constexpr (kBulk) {
    // The last step's staged block (w.total > 0 steps ran: a block that walks none has none).
    if (compute_dq && w.total > 0) {
      __syncthreads();  // every thread's pairs stored and fenced
      if (issuer) reduce_staged_dq((w.total - 1) & 1);
    }
  }
  finish_dkdv<kDropout>(kp, acc_dk, acc_dv);

  store_dkdv<Element, Traits, kColTiles>(kp, w, smem, acc_dk, acc_dv, warp_key0, col0, tid);
  // The reductions done (shared memory read, global memory written) before the block exits.
  if (kBulk && issuer) ptx::bulk_wait_all<0>();
}

template <typename Element, typename Traits, int kVariant>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    bwd_split_kernel(const __grid_constant__ typename Traits::Params params) {
#if FLASHATTN_CU_SM90A
  extern __shared__ __align__(1024) char smem[];
  // qualified: no ADL into sm80
  sm90::bwd_split_block<Element, Traits, kVariant>(params.kp, &params.q_map, &params.do_map,
                                                   smem);
#else
  ptx::unsupported_arch();
#endif
}

}  // namespace flashattn_cu::sm90
