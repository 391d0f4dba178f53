// FlashAttention-2 backward on mma.sync (sm_80 and newer): the main kernel.
//
// One thread block owns kBlockN keys of one (batch, kv head), keeps K and V in shared memory and
// dK, dV in fp32 registers, and walks every (query head of its group share, query block) that
// sees those keys, recomputing per query block of kBlockM rows
//   S^T = K Q^T,  P^T = exp2((S^T - M) * scale_log2 - L),  dP^T = V dO^T,
//   dS^T = P^T * (dP^T - D),  dV += P^T dO,  dK += dS^T Q,  dQ += dS K (fp32 atomics).
// Warps own 16 keys each (rows of S^T), so P^T and dS^T leave the mma in exactly the layout the
// A operand of dV/dK needs (register path). With kSplit = 2 (large head dims) two warps share each
// 16 keys, split the queries of S^T and the columns of dK/dV, and exchange P^T/dS^T through shared
// memory. See tiles.h (BwdTile) for the sizes and why.
//
// One step (query block) of the loop, register path:
//   [wait Q/dO/M/L/D of this step; __syncthreads; issue next step's loads (2 stages)]
//   S^T -> P^T -> (16-bit P^T) dV += P^T dO -> dP^T -> dS^T -> store dS^T, dK += dS^T Q
//   [__syncthreads; issue next step's loads (1 stage)] dQ = dS K -> red.global.add.f32
// P^T is kept only as the 16-bit A operand once dV used it, and dS^T is formed from those
// rounded values: the fp32 P^T and dP^T are never live together (that is what lets d = 128
// run 64 x 128 tiles and d = 64 128 x 128 tiles without spills). The extra rounding is the
// one the reference in the input dtype makes too; dS^T itself is rounded for the mma anyway.
// Split path: P^T and dS^T (fp32 P) are stored to shared memory, one more __syncthreads,
// then dV/dK read their A operand with ldmatrix.
//
// Padding rows: the workspace gives rows >= seqlen_q (M, L) = (+inf, 0) and D = 0 and Q/dO are
// zero-filled there, so they produce P = 0 and dS = 0 without any row test. Keys >= seqlen_k
// (tail block) and the causal diagonal go through Mask::apply_transposed; other steps skip it.
//
// Fragment conventions (ptx/mma.h, g = lane / 4, t = lane % 4):
//   C tile of S^T/dP^T/dS^T (16 keys x 8 queries): [hr * 2 + e] = key g + 8 hr, query 2t + e.
//   dK/dV accumulators (16 keys x 8 cols):         [hr * 2 + e] = key g + 8 hr, col 2t + e.
//   dQ accumulators (16 queries x 8 cols):          [hr * 2 + e] = query g + 8 hr, col 2t + e.
// Shared tiles: K, V, Q, dO row-major [row][d] with rows padded to kSmemRowChunks 16-byte chunks
// (common/tile_io.h); P^T, dS^T row-major [key][query], rows padded to kPRowChunks chunks (odd:
// conflict-free ldmatrix and 32-bit fragment stores).
#pragma once

#include <cstdint>
#include <type_traits>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/bwd_math.h"
#include "../common/numeric.h"
#include "../common/tile_io.h"
#include "../problem/dropout.h"
#include "../problem/mask.h"
#include "../problem/score_mod.h"
#include "../problem/scheduler.h"
#include "../problem/seqlen.h"
#include "../ptx/atomic.h"
#include "../ptx/cp_async.h"
#include "../ptx/ldmatrix.h"
#include "../ptx/math.h"
#include "../bwd/params.h"
#include "../bwd/preprocess.h"

namespace flashattn_cu::sm80 {

using backward::BwdKernelParams;
using backward::kBwdRowPad;
using backward::load_row_stats_async;

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kStages_, int kDqWarpsM_,
          int kDqPasses_>
struct BwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kStages = kStages_;
  static constexpr int kKeyWarps = kBlockN / 16;         // warps along the keys, 16 keys each
  static constexpr int kSplit = kNWarps / kKeyWarps;     // warps sharing the same 16 keys
  static constexpr int kWarpQueries = kBlockM / kSplit;  // S^T columns of one warp
  static constexpr int kQTiles = kWarpQueries / 8;
  static constexpr int kWarpCols = kHeadDim / kSplit;    // dK/dV columns of one warp
  static constexpr int kColTiles = kWarpCols / 8;
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kSmemRowChunks = kChunks + 1;
  static constexpr int kPRowChunks = kBlockM / 8 + 1;
  // dQ GEMM: kDqWarpsM x kDqWarpsD warps, each kDqRows queries x kDqCols columns, the columns
  // in kDqPasses passes of kDqPassTiles 8-column tiles.
  static constexpr int kDqWarpsM = kDqWarpsM_;
  static constexpr int kDqWarpsD = kNWarps / kDqWarpsM;
  static constexpr int kDqRows = kBlockM / kDqWarpsM;
  static constexpr int kDqMTiles = kDqRows / 16;
  static constexpr int kDqCols = kHeadDim / kDqWarpsD;
  static constexpr int kDqPasses = kDqPasses_;
  static constexpr int kDqPassTiles = kDqCols / 8 / kDqPasses;
  // Shared memory, bytes.
  static constexpr int kKVBytes = kBlockN * kSmemRowChunks * 16;
  static constexpr int kQBytes = kBlockM * kSmemRowChunks * 16;
  static constexpr int kPBytes = kBlockN * kPRowChunks * 16;
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKVBytes;
  static constexpr int kOffQ = kOffV + kKVBytes;
  static constexpr int kOffDO = kOffQ + kStages * kQBytes;
  static constexpr int kOffDS = kOffDO + kStages * kQBytes;
  static constexpr int kOffP = kOffDS + kPBytes;  // split path only
  static constexpr int kOffMax = kOffP + (kSplit == 2 ? kPBytes : 0);  // M of each query
  static constexpr int kOffLog2Sum = kOffMax + kStages * kBlockM * 4;   // L of each query
  static constexpr int kOffD = kOffLog2Sum + kStages * kBlockM * 4;
  static constexpr int kSmemBytes = kOffD + kStages * kBlockM * 4;

  static_assert(kBlockN % 16 == 0 && kNWarps % kKeyWarps == 0, "warps own 16 keys each");
  static_assert(kSplit == 1 || kSplit == 2, "one or two warps per 16 keys");
  static_assert(kWarpQueries % 16 == 0 && kWarpCols % 16 == 0, "whole 16x16 mma steps");
  static_assert(kHeadDim % 32 == 0, "instances are multiples of 32");
  static_assert(kStages == 1 || kStages == 2, "Q/dO single or double buffered");
  static_assert(kNWarps % kDqWarpsM == 0 && kDqRows % 16 == 0 && kDqCols % 8 == 0 &&
                    kDqCols % kDqPasses == 0 && (kDqCols / kDqPasses) % 8 == 0,
                "dQ warp grid tiles the block_m x head_dim output");
  static_assert(kBwdRowPad % kBlockM == 0, "workspace rows are padded to whole query blocks");
};

template <typename Element, typename Traits, int kVariant>
__device__ __forceinline__ void bwd_block(const BwdKernelParams& kp, char* smem) {
  constexpr bool kDynamic = variant_dynamic(kVariant);  // problem/mask.h
  constexpr bool kDropout = variant_dropout(kVariant);
  using Ops = ElementOps<Element>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kQTiles = Traits::kQTiles, kColTiles = Traits::kColTiles;
  constexpr int kRowChunks = Traits::kSmemRowChunks, kPRowChunks = Traits::kPRowChunks;
  constexpr int kSplit = Traits::kSplit, kStages = Traits::kStages;
  // The compile-time softcap variants on the register path (the dropout variant's run-time
  // softcap and the split path recover t from P: problem/score_mod.h, softcap_grad).
  constexpr bool kStoredSoftcapGrad = variant_softcap(kVariant) && kSplit == 1;
  // Their share of exp2 on the FMA pipe (common/softmax.h, kSoftcapPolyEighths), at d > 64 only:
  // ptxas (sm_90a) puts the 128 x 128 d = 64 tile's spills up with it (softcap 48 -> 72 bytes,
  // ALiBi + softcap 92 -> 152) while d = 128's go down (44 -> 28, 52 -> 36).
  constexpr int kBwdPolyEighths = kStoredSoftcapGrad && kHeadDim > 64 ? kSoftcapPolyEighths : 0;
  const BwdParams& p = kp.p;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int key_warp = warp % Traits::kKeyWarps;  // owns keys key_warp * 16 .. + 15
  const int split = warp / Traits::kKeyWarps;     // its queries of S^T / columns of dK, dV
  const int warp_key0 = key_warp * 16;
  const int warp_query0 = split * Traits::kWarpQueries;
  const int warp_col0 = split * Traits::kWarpCols;

  const KeyTile tile = key_tile(ceil_div(p.seqlen_k, kBlockN), kp.kv_splits, p.num_heads_k);
  const SeqInfo seq = seq_info<kDynamic>(p, tile.batch);
  const int batch = tile.batch, head_k = tile.head_k, hsplit = tile.split;
  const int head_first = head_k * (p.num_heads / p.num_heads_k) + hsplit * kp.heads_per_split;
  const int n_start = tile.n_block * kBlockN;
  if (n_start >= seq.seqlen_k) return;  // varlen: a key block past this entry's length
  const int keys_valid = min(kBlockN, seq.seqlen_k - n_start);

  // Query blocks [m_begin, m_end) see some key of this block; those outside
  // [um_begin, um_end) need the mask (problem/mask.h).
  const int num_m = ceil_div(seq.seqlen_q, kBlockM);
  const QueryBlocks query_blocks =
      mask_of<kDynamic>(seq, p).template query_blocks<kBlockM, kBlockN>(n_start, keys_valid, num_m);
  // The static instance has no window: its blocks run to num_m, unmasked up to the end (said
  // here at compile time, as registers are full).
  const int m_begin = query_blocks.begin, m_end = kDynamic ? query_blocks.end : num_m;
  const int um_begin = query_blocks.unmasked_begin;
  const int um_end = kDynamic ? query_blocks.unmasked_end : num_m;
  const int m_count = m_end - m_begin;
  const int total = kp.heads_per_split * m_count;

  const uint32_t s_base = ptx::smem_u32(smem);
  const uint32_t sK = s_base + Traits::kOffK, sV = s_base + Traits::kOffV;
  const uint32_t sQ = s_base + Traits::kOffQ, sDO = s_base + Traits::kOffDO;
  const uint32_t sDS = s_base + Traits::kOffDS, sP = s_base + Traits::kOffP;

  const Element* q_bh = static_cast<const Element*>(p.q) +
                        seq.q_offset(p.q_batch_stride, p.q_row_stride);
  const Element* do_bh = static_cast<const Element*>(p.dout) +
                         seq.q_offset(p.do_batch_stride, p.do_row_stride);
  // Issues the cp.async loads of (query head `head`, query block m) into buffer `stage`.
  auto load_query_block = [&](int head, int m, int stage) {
    const int row0 = m * kBlockM;
    load_tile_async<Traits, kBlockM>(sQ + stage * Traits::kQBytes,
                                     q_bh + head * p.q_head_stride + row0 * p.q_row_stride,
                                     p.q_row_stride, seq.seqlen_q - row0, p.head_dim, tid);
    load_tile_async<Traits, kBlockM>(sDO + stage * Traits::kQBytes,
                                     do_bh + head * p.do_head_stride + row0 * p.do_row_stride,
                                     p.do_row_stride, seq.seqlen_q - row0, p.head_dim, tid);
    load_row_stats_async<Traits>(
        kp, backward::ws_row0<kDynamic>(kp, seq_info<kDynamic>(p, batch), head) + row0, s_base, stage,
        tid);
  };

  if (total > 0) {
    const Element* k = static_cast<const Element*>(p.k) +
                       seq.k_offset(p.k_batch_stride, p.k_row_stride) + head_k * p.k_head_stride +
                       n_start * p.k_row_stride;
    const Element* v = static_cast<const Element*>(p.v) +
                       seq.k_offset(p.v_batch_stride, p.v_row_stride) + head_k * p.v_head_stride +
                       n_start * p.v_row_stride;
    load_tile_async<Traits, kBlockN>(sK, k, p.k_row_stride, keys_valid, p.head_dim, tid);
    load_tile_async<Traits, kBlockN>(sV, v, p.v_row_stride, keys_valid, p.head_dim, tid);
    load_query_block(head_first, m_begin, 0);
    ptx::cp_async_commit();
  }

  // ldmatrix lane addresses (ptx/ldmatrix.h: lane l gives row l % 8 of matrix l / 8).
  // A = K or V rows of this warp, 16 keys x 16 d per step: matrices (keys 0-7 | 8-15) x (d 0-7 |
  // 8-15) in a0..a3 order -> key l % 16, d chunk l / 16.
  const uint32_t k_a_lane = sK + ((warp_key0 + lane % 16) * kRowChunks + lane / 16) * 16;
  const uint32_t v_a_lane = sV + ((warp_key0 + lane % 16) * kRowChunks + lane / 16) * 16;
  // B = Q^T or dO^T (k = d, n = query), non-transposed rows of Q: matrices b0, b1 of query tile
  // 0 then of query tile 1 -> query (l / 16) * 8 + l % 8, d chunk (l / 8) % 2.
  const int qb_row = warp_query0 + (lane / 16) * 8 + lane % 8;
  const uint32_t q_b_off = (qb_row * kRowChunks + (lane / 8) % 2) * 16;
  // B = dO or Q (k = query, n = d) for dV/dK, transposed: matrices (queries 0-7, d 0-7),
  // (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) = b0, b1 of column tile 0, b0, b1 of tile 1 ->
  // query l % 16, d chunk l / 16.
  const uint32_t q_bt_off = ((lane % 16) * kRowChunks + warp_col0 / 8 + lane / 16) * 16;

  float acc_dk[kColTiles][4], acc_dv[kColTiles][4];
#pragma unroll
  for (int i = 0; i < kColTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[i][e] = acc_dv[i][e] = 0.f;

  const bool compute_dq = !p.deterministic;
  const float scale_log2 = kp.score.scale_log2;
  int head = head_first, m = m_begin;

#pragma unroll 1
  for (int it = 0; it < total; ++it) {
    const int stage = kStages == 2 ? (it & 1) : 0;
    int next_head = head, next_m = m + 1;
    if (next_m == m_end) {
      next_m = m_begin;
      ++next_head;
    }
    const bool has_next = it + 1 < total;

    ptx::cp_async_wait<0>();
    __syncthreads();  // this step's tiles landed; every warp finished the previous step
    if constexpr (kStages == 2) {
      if (has_next) {
        load_query_block(next_head, next_m, stage ^ 1);
        ptx::cp_async_commit();
      }
    }
    const uint32_t sQs = sQ + stage * Traits::kQBytes, sDOs = sDO + stage * Traits::kQBytes;
    const char* s_max = smem + Traits::kOffMax + stage * kBlockM * 4;
    const char* s_log2sum = smem + Traits::kOffLog2Sum + stage * kBlockM * 4;
    const char* s_d = smem + Traits::kOffD + stage * kBlockM * 4;

    // 16 keys x kTiles query tiles of S^T = K Q^T (or dP^T = V dO^T), the warp's tiles
    // tile0.. (tile0 even): A = this warp's K (V) rows, B = Q (dO) rows of those queries.
    auto gemm_t_part = [&](auto& acc, uint32_t a_lane, uint32_t b_base, int tile0) {
      constexpr int kTiles = std::extent_v<std::remove_reference_t<decltype(acc)>>;
#pragma unroll
      for (int i = 0; i < kTiles; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        uint32_t a[4];
        ptx::ldmatrix_x4(a, a_lane + ks * 32);
#pragma unroll
        for (int np = 0; np < kTiles / 2; ++np) {
          uint32_t b[4];
          ptx::ldmatrix_x4(b, b_base + q_b_off +
                                  ((tile0 / 2 + np) * 16 * kRowChunks + ks * 2) * 16);
          Ops::mma(acc[2 * np], a, b[0], b[1]);
          Ops::mma(acc[2 * np + 1], a, b[2], b[3]);
        }
      }
    };
    // All kWarpQueries of the warp.
    auto gemm_t = [&](float (&acc)[kQTiles][4], uint32_t a_lane, uint32_t b_base) {
      gemm_t_part(acc, a_lane, b_base, 0);
    };
    // Stores an A fragment of P^T/dS^T at [key][query] (keys warp_key0.., queries of step kk):
    // a0 -> (g, 2t), a1 -> (g + 8, 2t), a2 -> (g, 8 + 2t), a3 -> (g + 8, 8 + 2t).
    auto store_a = [&](int off_bytes, int kk, const uint32_t (&a)[4]) {
      char* base = smem + off_bytes +
                   ((warp_key0 + g) * kPRowChunks * 16) + (warp_query0 + kk * 16 + 2 * t) * 2;
      *reinterpret_cast<uint32_t*>(base) = a[0];
      *reinterpret_cast<uint32_t*>(base + 8 * kPRowChunks * 16) = a[1];
      *reinterpret_cast<uint32_t*>(base + 16) = a[2];
      *reinterpret_cast<uint32_t*>(base + 8 * kPRowChunks * 16 + 16) = a[3];
    };
    // dV += P^T dO or dK += dS^T Q for one k-step: A in registers, B from the transposed rows
    // kk * 16 .. + 15 of dO / Q, columns warp_col0 ...
    auto mma_kv = [&](float (&acc)[kColTiles][4], const uint32_t (&a)[4], uint32_t b_base,
                      int kk) {
#pragma unroll
      for (int dp = 0; dp < kColTiles / 2; ++dp) {
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, b_base + q_bt_off + (kk * 16 * kRowChunks + dp * 2) * 16);
        Ops::mma(acc[2 * dp], a, b[0], b[1]);
        Ops::mma(acc[2 * dp + 1], a, b[2], b[3]);
      }
    };

    // Dropout (problem/dropout.h): the keep bits of this warp's elements, for dV's operand
    // (P^T o M) and the gradient reaching P^T (M o dP^T / (1 - p)); drawn before S^T exists, so
    // the Philox rounds share the registers with dK and dV only.
    [[maybe_unused]] uint32_t keep[keep_words(kQTiles * 4)];
    if constexpr (kDropout) {
      dropout_of(kp, batch, head)
          .template keep_bits_transposed<kQTiles>(keep, n_start + warp_key0,
                                                  m * kBlockM + warp_query0, lane);
    }
    float acc_s[kQTiles][4];
    gemm_t(acc_s, k_a_lane, sQs);
    // The softcap variants of the register path keep 1 - t^2 from the capped scores in the lane's
    // dS^T slots (common/bwd_math.h, StoredSoftcapGradT) instead of recovering t from P.
    [[maybe_unused]] const auto stored_grad = [&] {
      if constexpr (kStoredSoftcapGrad) {
        return StoredSoftcapGradT<Element, PlainGradSlots>{
            {smem + Traits::kOffDS + (warp_key0 + g) * kPRowChunks * 16 + (warp_query0 + 2 * t) * 2,
             kPRowChunks * 16}};
      } else {
        return UnitGrad{};  // not used
      }
    }();
    if constexpr (kStoredSoftcapGrad) {
      apply_score_mods_transposed<kVariant>(acc_s, kp, batch, head, n_start + warp_key0,
                                            m * kBlockM + warp_query0, lane,
                                            [&](const auto& capped) { stored_grad.store(capped); });
    } else {
      apply_score_mods_transposed<kVariant>(acc_s, kp, batch, head, n_start + warp_key0,
                                            m * kBlockM + warp_query0, lane);
    }
    if (m < um_begin || (kDynamic && m >= um_end)) {
      mask_of<kDynamic>(seq_info<kDynamic>(p, batch), p)
          .apply_transposed(acc_s, n_start + warp_key0, m * kBlockM + warp_query0, lane);
    }
    // P^T, in place; the softcap variants (two MUFU per score) take kBwdPolyEighths / 8 of the
    // exponentials on the FMA pipe, as the forward does (sm80/fwd_kernel.h).
    probs_from_scores<kBwdPolyEighths>(acc_s, s_max, s_log2sum, warp_query0, scale_log2, t);
    // The score modifier's factor on dS (problem/score_mod.h), from P^T and the row stats
    // (unused where kStoredSoftcapGrad).
    const auto grad = ds_grad_t<kVariant>(
        kp, batch, head, s_max + warp_query0 * 4, s_log2sum + warp_query0 * 4,
        n_start + warp_key0 + g, m * kBlockM + warp_query0, t);
    if constexpr (kSplit == 1) {
      // Half of the queries at a time: dP^T of the half, dS^T = P^T (dP^T - D) from the fp32
      // P^T (common/bwd_math.h ds_from_probs: one rounding of dS^T, as FlashAttention-2's;
      // warp_query0 = 0 on this path), then the half's P^T packed to 16 bits as the A operand
      // of dV += P^T dO and its dS^T as dK's. By halves the fp32 P^T (all queries) and the
      // half's dP^T take the registers that the 16-bit P^T and the whole dP^T took when dS^T
      // was formed from the packed P^T (ptxas, sm_80: d 64 / 128 spills of 56-136 bytes with
      // the whole dP^T).
      constexpr int kHalf = kQTiles / 2;
      static_assert(kHalf % 2 == 0, "whole 16-query k-steps per half");
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float acc_dph[kHalf][4];
        gemm_t_part(acc_dph, v_a_lane, sDOs, h * kHalf);
        if constexpr (kDropout) {
          apply_keep_bits_at<kHalf, kQTiles>(acc_dph, keep, h * kHalf, kp.dropout.rp);
        }
#pragma unroll
        for (int kk = 0; kk < kHalf / 2; ++kk) {
          if constexpr (kStoredSoftcapGrad) {
            ds_from_probs(acc_dph, kk, acc_s, h * kHalf, s_d, t, stored_grad);
          } else {
            ds_from_probs(acc_dph, kk, acc_s, h * kHalf, s_d, t, grad);
          }
        }
#pragma unroll
        for (int kk = 0; kk < kHalf / 2; ++kk) {
          const int kq = h * kHalf / 2 + kk;  // the k-step among the step's queries
          uint32_t a[4];
          pack_a_frag<Element>(acc_s, kq, a);
          if constexpr (kDropout) drop_a_frag(a, keep, kq);
          mma_kv(acc_dv, a, sDOs, kq);
        }
#pragma unroll
        for (int kk = 0; kk < kHalf / 2; ++kk) {
          const int kq = h * kHalf / 2 + kk;
          uint32_t a[4];
          pack_a_frag<Element>(acc_dph, kk, a);
          if (compute_dq) store_a(Traits::kOffDS, kq, a);
          mma_kv(acc_dk, a, sQs, kq);
        }
      }
      if (kStages == 1 || compute_dq) __syncthreads();  // dS^T complete; Q/dO free (1 stage)
    } else {
      float acc_dp[kQTiles][4];
      gemm_t(acc_dp, v_a_lane, sDOs);
      if constexpr (kDropout) apply_keep_bits(acc_dp, keep, kp.dropout.rp);
      // dS^T = P^T (dP^T - D), in place in acc_dp, from the fp32 P^T (ds_from_probs).
#pragma unroll
      for (int kk = 0; kk < kQTiles / 2; ++kk) {
        ds_from_probs(acc_dp, kk, acc_s, 0, s_d + warp_query0 * 4, t, grad);
      }
#pragma unroll
      for (int kk = 0; kk < Traits::kWarpQueries / 16; ++kk) {
        uint32_t a[4];
        pack_a_frag<Element>(acc_s, kk, a);
        if constexpr (kDropout) drop_a_frag(a, keep, kk);
        store_a(Traits::kOffP, kk, a);
        pack_a_frag<Element>(acc_dp, kk, a);
        store_a(Traits::kOffDS, kk, a);
      }
      __syncthreads();  // P^T and dS^T of all queries complete
      // A = P^T / dS^T rows of this warp's keys from [key][query]: matrices (keys 0-7 | 8-15) x
      // (queries 0-7 | 8-15) in a0..a3 order -> key l % 16, query chunk l / 16.
      const uint32_t pa_off = ((warp_key0 + lane % 16) * kPRowChunks + lane / 16) * 16;
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        uint32_t a[4];
        ptx::ldmatrix_x4(a, sP + pa_off + kk * 32);
        mma_kv(acc_dv, a, sDOs, kk);
      }
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        uint32_t a[4];
        ptx::ldmatrix_x4(a, sDS + pa_off + kk * 32);
        mma_kv(acc_dk, a, sQs, kk);
      }
      if constexpr (kStages == 1) __syncthreads();  // every warp is done with Q/dO
    }
    if constexpr (kStages == 1) {
      if (has_next) {
        load_query_block(next_head, next_m, 0);
        ptx::cp_async_commit();
      }
    }

    if (compute_dq) {
      // dQ (kBlockM x d) = dS K over this block's keys. Warp (dq_m, dq_d) owns queries
      // dq_m * kDqRows.. and columns dq_d * kDqCols.. .
      const int dq_m = warp % Traits::kDqWarpsM, dq_d = warp / Traits::kDqWarpsM;
      // A = dS (row = query, k = key) from dS^T stored [key][query], transposed: a0 = stored
      // (keys 0-7, queries 0-7), a1 = (keys 0-7, queries 8-15), a2 = (keys 8-15, queries 0-7),
      // a3 = (keys 8-15, queries 8-15) -> key (l / 16) * 8 + l % 8, query chunk (l / 8) % 2.
      const uint32_t ds_a = sDS + ((((lane / 16) * 8 + lane % 8) * kPRowChunks) +
                                   dq_m * Traits::kDqRows / 8 + (lane / 8) % 2) * 16;
      // B = K (k = key, n = d), transposed rows: key l % 16, d chunk l / 16 (x2: lanes 0-15).
      const uint32_t k_bt =
          sK + ((lane % 16) * kRowChunks + dq_d * Traits::kDqCols / 8 + lane / 16) * 16;
      float* dq_rows = kp.dq_accum +
                       (backward::ws_row0<kDynamic>(kp, seq_info<kDynamic>(p, batch), head) + m * kBlockM +
                        dq_m * Traits::kDqRows) * kHeadDim +
                       dq_d * Traits::kDqCols;
      constexpr int kPT = Traits::kDqPassTiles;
#pragma unroll
      for (int pass = 0; pass < Traits::kDqPasses; ++pass) {
        float acc[Traits::kDqMTiles][kPT][4];
#pragma unroll
        for (int i = 0; i < Traits::kDqMTiles; ++i)
#pragma unroll
          for (int j = 0; j < kPT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
          uint32_t a[Traits::kDqMTiles][4];
#pragma unroll
          for (int mt = 0; mt < Traits::kDqMTiles; ++mt) {
            ptx::ldmatrix_x4_trans(a[mt], ds_a + (kk * 16 * kPRowChunks + mt * 2) * 16);
          }
          const uint32_t b_row = k_bt + (kk * 16 * kRowChunks + pass * kPT) * 16;
#pragma unroll
          for (int j = 0; j < kPT / 2; ++j) {
            uint32_t b[4];
            ptx::ldmatrix_x4_trans(b, b_row + j * 32);
#pragma unroll
            for (int mt = 0; mt < Traits::kDqMTiles; ++mt) {
              Ops::mma(acc[mt][2 * j], a[mt], b[0], b[1]);
              Ops::mma(acc[mt][2 * j + 1], a[mt], b[2], b[3]);
            }
          }
          if constexpr (kPT % 2 == 1) {
            uint32_t b[2];
            ptx::ldmatrix_x2_trans(b, b_row + (kPT - 1) * 16);
#pragma unroll
            for (int mt = 0; mt < Traits::kDqMTiles; ++mt) {
              Ops::mma(acc[mt][kPT - 1], a[mt], b[0], b[1]);
            }
          }
        }
#pragma unroll
        for (int mt = 0; mt < Traits::kDqMTiles; ++mt)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr)
#pragma unroll
            for (int j = 0; j < kPT; ++j) {
              float* dst = dq_rows + (mt * 16 + g + hr * 8) * kHeadDim + (pass * kPT + j) * 8 + 2 * t;
#if FLASHATTN_CU_SM90_OR_NEWER
              ptx::red_add_v2_f32(dst, acc[mt][j][hr * 2], acc[mt][j][hr * 2 + 1]);
#else
              ptx::red_add_f32(dst, acc[mt][j][hr * 2]);
              ptx::red_add_f32(dst + 1, acc[mt][j][hr * 2 + 1]);
#endif
            }
      }
    }
    head = next_head;
    m = next_m;
  }

  // dK = softmax_scale * dS^T Q (the scale of S was left out of dS), dV as accumulated (times
  // dropout's 1 / (1 - p), left out of its operand).
  if constexpr (kDropout) {
#pragma unroll
    for (int i = 0; i < kColTiles; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dv[i][e] *= kp.dropout.rp;
  }
  const float scale = p.softmax_scale;
  if (kp.kv_splits == 1) {
    // Stage both tiles in Element precision over sK / sV, then 16-byte row stores.
    __syncthreads();  // every warp is done reading K and V
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = warp_key0 + g + hr * 8;
#pragma unroll
      for (int i = 0; i < kColTiles; ++i) {
        const int off = (row * kRowChunks + warp_col0 / 8 + i) * 16 + t * 4;
        *reinterpret_cast<uint32_t*>(smem + Traits::kOffK + off) =
            Ops::pack(acc_dk[i][hr * 2] * scale, acc_dk[i][hr * 2 + 1] * scale);
        *reinterpret_cast<uint32_t*>(smem + Traits::kOffV + off) =
            Ops::pack(acc_dv[i][hr * 2], acc_dv[i][hr * 2 + 1]);
      }
    }
    __syncthreads();
    Element* dk = static_cast<Element*>(p.dk) + seq.k_offset(p.dk_batch_stride, p.dk_row_stride) +
                  head_k * p.dk_head_stride + n_start * p.dk_row_stride;
    Element* dv = static_cast<Element*>(p.dv) + seq.k_offset(p.dv_batch_stride, p.dv_row_stride) +
                  head_k * p.dv_head_stride + n_start * p.dv_row_stride;
    constexpr int kTotal = kBlockN * Traits::kChunks;
#pragma unroll
    for (int i = 0; i < ceil_div(kTotal, Traits::kNThreads); ++i) {
      const int idx = tid + i * Traits::kNThreads;
      if (kTotal % Traits::kNThreads != 0 && idx >= kTotal) break;
      const int r = idx / Traits::kChunks, c = idx % Traits::kChunks;
      if (r < keys_valid && c * 8 < p.head_dim) {
        const int off = (r * kRowChunks + c) * 16;
        *reinterpret_cast<uint4*>(dk + r * p.dk_row_stride + c * 8) =
            *reinterpret_cast<const uint4*>(smem + Traits::kOffK + off);
        *reinterpret_cast<uint4*>(dv + r * p.dv_row_stride + c * 8) =
            *reinterpret_cast<const uint4*>(smem + Traits::kOffV + off);
      }
    }
  } else {
    // fp32 partial sums of this head split, [split][batch][head_k][key][d]; the postprocess
    // kernel adds the splits in order.
    const int64_t part_row0 =
        ((static_cast<int64_t>(hsplit) * p.batch + batch) * p.num_heads_k + head_k) *
            p.seqlen_k + n_start;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = warp_key0 + g + hr * 8;
      if (row < keys_valid) {
        const int64_t off = (part_row0 + row) * kHeadDim + warp_col0 + 2 * t;
#pragma unroll
        for (int i = 0; i < kColTiles; ++i) {
          *reinterpret_cast<float2*>(kp.dk_part + off + i * 8) =
              make_float2(acc_dk[i][hr * 2] * scale, acc_dk[i][hr * 2 + 1] * scale);
          *reinterpret_cast<float2*>(kp.dv_part + off + i * 8) =
              make_float2(acc_dv[i][hr * 2], acc_dv[i][hr * 2 + 1]);
        }
      }
    }
  }
}

template <typename Element, typename Traits, int kVariant>
__global__ void __launch_bounds__(Traits::kNThreads)
    bwd_kernel(const __grid_constant__ BwdKernelParams params) {
  extern __shared__ __align__(128) char smem[];
  bwd_block<Element, Traits, kVariant>(params, smem);
}

}  // namespace flashattn_cu::sm80
