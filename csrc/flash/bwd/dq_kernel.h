// Deterministic dQ for the backward of every path (mma.sync, so it runs on sm_80 and newer; the
// sm_90a path uses it as it is): instead of fp32 atomics from every key block, one thread
// block owns kBlockM query rows of one (batch, head) and walks its key blocks in ascending order,
// recomputing
//   S = Q K^T,  P = exp2((S - M) * scale_log2 - L),  dP = dO V^T,  dS = P (dP - D),  dQ += dS K
// with dQ in fp32 registers, and writes dQ * softmax_scale once. The summation order is fixed, so
// dq is bitwise reproducible. Cost: S and dP are computed a second time (the main kernel computes
// them for dK/dV), 7 instead of 5 GEMM passes over the score matrix.
//
// Forward-style layout: each warp owns 16 query rows, so P and dS come out of the mma in the layout
// of the A operand of dS K (fragment conventions as in ptx/mma.h, g = lane / 4, t = lane % 4:
// s[nt][hr * 2 + e] = query g + 8 hr, key nt * 8 + 2t + e; dq[dt][hr * 2 + e] = query g + 8 hr,
// column dt * 8 + 2t + e).
#pragma once

#include <cstdint>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/bwd_math.h"
#include "../common/numeric.h"
#include "../common/tile_io.h"
#include "../problem/dropout.h"
#include "../problem/mask.h"
#include "../problem/score_mod.h"
#include "../problem/scheduler.h"
#include "../problem/seqlen.h"
#include "../ptx/cp_async.h"
#include "../ptx/ldmatrix.h"
#include "../ptx/math.h"
#include "params.h"

namespace flashattn_cu::backward {

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_>
struct BwdDqTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kNWarps = kBlockM / 16;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kNTiles = kBlockN / 8;   // 8-key tiles of S / dP
  static constexpr int kDTiles = kHeadDim / 8;  // 8-column tiles of dQ
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kSmemRowChunks = kChunks + 1;
  static constexpr int kQBytes = kBlockM * kSmemRowChunks * 16;
  static constexpr int kKVBytes = kBlockN * kSmemRowChunks * 16;
  static constexpr int kOffQ = 0;
  static constexpr int kOffDO = kQBytes;
  static constexpr int kOffK = 2 * kQBytes;                 // kStages K tiles
  static constexpr int kOffV = kOffK + kStages * kKVBytes;  // kStages V tiles
  static constexpr int kSmemBytes = kOffV + kStages * kKVBytes;
  static_assert(kBlockM % 16 == 0 && kBlockN % 16 == 0 && kHeadDim % 32 == 0, "mma steps");
  static_assert(kStages == 1 || kStages == 2, "K/V single or double buffered");
  static_assert(kBwdRowPad % kBlockM == 0, "workspace rows are padded to whole query blocks");
};

template <typename Element, typename Traits, int kVariant>
__device__ __forceinline__ void bwd_dq_block(const BwdKernelParams& kp, char* smem) {
  constexpr bool kDynamic = variant_dynamic(kVariant);  // problem/mask.h
  // Softcap and ALiBi: at compile time, or at run time in the dropout variant (problem/mask.h).
  constexpr bool kAlibi = variant_may_alibi(kVariant);
  constexpr bool kSoftcap = variant_may_softcap(kVariant);
  using Ops = ElementOps<Element>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kNTiles = Traits::kNTiles, kDTiles = Traits::kDTiles;
  constexpr int kRowChunks = Traits::kSmemRowChunks, kStages = Traits::kStages;
  const BwdParams& p = kp.p;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  // A varlen call's tiles are the compact ones (problem/scheduler.h: query_tile_of).
  const QueryTile tile = kDynamic ? query_tile_of<kDynamic>(p, kBlockM, blockIdx.x)
                                  : query_tile(ceil_div(p.seqlen_q, kBlockM), p.num_heads);
  const SeqInfo seq = seq_info<kDynamic>(p, tile.batch);
  const int head = tile.head;
  const int head_k = head / (p.num_heads / p.num_heads_k);
  const int m_start = tile.m_block * kBlockM;
  if (m_start >= seq.seqlen_q) return;  // varlen: a query block past this entry's length
  const int rows_q = min(kBlockM, seq.seqlen_q - m_start);

  // Key blocks [n_begin, n_end) hold keys some row sees; [um_begin, um_end) are seen whole by
  // every row (problem/mask.h).
  const KeyBlocks key_blocks = mask_of<kDynamic>(seq, p).template key_blocks<kBlockM, kBlockN>(m_start);
  const int n_begin = key_blocks.begin, n_end = key_blocks.end;
  const int um_begin = key_blocks.unmasked_begin, um_end = key_blocks.unmasked_end;

  const Element* k = static_cast<const Element*>(p.k) +
                     seq.k_offset(p.k_batch_stride, p.k_row_stride) + head_k * p.k_head_stride;
  const Element* v = static_cast<const Element*>(p.v) +
                     seq.k_offset(p.v_batch_stride, p.v_row_stride) + head_k * p.v_head_stride;
  const uint32_t s_base = ptx::smem_u32(smem);
  const uint32_t sQ = s_base + Traits::kOffQ, sDO = s_base + Traits::kOffDO;
  const uint32_t sK = s_base + Traits::kOffK, sV = s_base + Traits::kOffV;
  auto load_k = [&](int n, int stage) {
    load_tile_async<Traits, kBlockN>(sK + stage * Traits::kKVBytes, k + n * kBlockN * p.k_row_stride,
                                     p.k_row_stride, seq.seqlen_k - n * kBlockN, p.head_dim, tid);
  };
  auto load_v = [&](int n, int stage) {
    load_tile_async<Traits, kBlockN>(sV + stage * Traits::kKVBytes, v + n * kBlockN * p.v_row_stride,
                                     p.v_row_stride, seq.seqlen_k - n * kBlockN, p.head_dim, tid);
  };

  // M, L and D of this lane's two rows (workspace rows are padded: always readable).
  const int64_t ws_row = ws_row0<kDynamic>(kp, seq, head) + m_start + warp * 16 + g;
  const float row_max[2] = {kp.row_max[ws_row], kp.row_max[ws_row + 8]};
  const float row_log2sum[2] = {kp.row_log2sum[ws_row], kp.row_log2sum[ws_row + 8]};
  const float dsum[2] = {kp.dpsum[ws_row], kp.dpsum[ws_row + 8]};

  if (n_end > n_begin) {
    load_tile_async<Traits, kBlockM>(
        sQ, static_cast<const Element*>(p.q) + seq.q_offset(p.q_batch_stride, p.q_row_stride) +
                head * p.q_head_stride + m_start * p.q_row_stride,
        p.q_row_stride, rows_q, p.head_dim, tid);
    load_tile_async<Traits, kBlockM>(
        sDO, static_cast<const Element*>(p.dout) +
                 seq.q_offset(p.do_batch_stride, p.do_row_stride) + head * p.do_head_stride +
                 m_start * p.do_row_stride,
        p.do_row_stride, rows_q, p.head_dim, tid);
    load_v(n_begin, 0);
    if constexpr (kStages == 1) ptx::cp_async_commit();  // group: Q, dO, V_0
    load_k(n_begin, 0);
    ptx::cp_async_commit();  // group: K_0 (1 stage); everything (2 stages)
  }

  // A = Q / dO rows of this warp: matrices (rows 0-7 | 8-15) x (d 0-7 | 8-15) in a0..a3 order ->
  // row l % 16, d chunk l / 16.
  const uint32_t a_off = ((warp * 16 + lane % 16) * kRowChunks + lane / 16) * 16;
  // B = K^T / V^T (k = d, n = key), non-transposed rows: b0, b1 of key tile 0 then of key tile 1
  // -> key (l / 16) * 8 + l % 8, d chunk (l / 8) % 2.
  const uint32_t b_off = ((((lane / 16) * 8 + lane % 8)) * kRowChunks + (lane / 8) % 2) * 16;
  // B = K (k = key, n = d) for dS K, transposed: key l % 16, d chunk l / 16.
  const uint32_t bt_off = ((lane % 16) * kRowChunks + lane / 16) * 16;

  float acc_dq[kDTiles][4];
#pragma unroll
  for (int i = 0; i < kDTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dq[i][e] = 0.f;
  const float scale_log2 = kp.score.scale_log2;

#pragma unroll 1
  for (int n = n_begin; n < n_end; ++n) {
    const int stage = kStages == 2 ? ((n - n_begin) & 1) : 0;
    const uint32_t sKs = sK + stage * Traits::kKVBytes, sVs = sV + stage * Traits::kKVBytes;
    float acc_s[1][kNTiles][4], acc_dp[kNTiles][4];
#pragma unroll
    for (int i = 0; i < kNTiles; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[0][i][e] = acc_dp[i][e] = 0.f;

    if constexpr (kStages == 2) {
      ptx::cp_async_wait<0>();
      __syncthreads();  // K_n, V_n landed; every warp finished step n - 1 (its buffers are free)
      if (n + 1 < n_end) {
        load_k(n + 1, stage ^ 1);
        load_v(n + 1, stage ^ 1);
        ptx::cp_async_commit();
      }
    } else {
      ptx::cp_async_wait<1>();  // V_n (and Q, dO) landed; K_n may still be in flight
      __syncthreads();
    }

    // dP = dO V^T.
#pragma unroll
    for (int ks = 0; ks < Traits::kHeadDim / 16; ++ks) {
      uint32_t a[4];
      ptx::ldmatrix_x4(a, sDO + a_off + ks * 32);
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t b[4];
        ptx::ldmatrix_x4(b, sVs + b_off + (np * 16 * kRowChunks + ks * 2) * 16);
        Ops::mma(acc_dp[2 * np], a, b[0], b[1]);
        Ops::mma(acc_dp[2 * np + 1], a, b[2], b[3]);
      }
    }
    if constexpr (kStages == 1) {
      ptx::cp_async_wait<0>();
      __syncthreads();  // K_n landed; every warp is done with V_n
      if (n + 1 < n_end) {
        load_v(n + 1, 0);
        ptx::cp_async_commit();
      }
    }
    // S = Q K^T.
#pragma unroll
    for (int ks = 0; ks < Traits::kHeadDim / 16; ++ks) {
      uint32_t a[4];
      ptx::ldmatrix_x4(a, sQ + a_off + ks * 32);
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t b[4];
        ptx::ldmatrix_x4(b, sKs + b_off + (np * 16 * kRowChunks + ks * 2) * 16);
        Ops::mma(acc_s[0][2 * np], a, b[0], b[1]);
        Ops::mma(acc_s[0][2 * np + 1], a, b[2], b[3]);
      }
    }
    apply_score_mods<kVariant>(acc_s, kp, tile.batch, head, m_start + warp * 16, n * kBlockN,
                               lane);
    if (n >= um_end || n < um_begin) {
      mask_of<kDynamic>(seq_info<kDynamic>(p, tile.batch), p)
          .apply(acc_s, m_start + warp * 16, n * kBlockN, lane);
    }
    // Dropout (problem/dropout.h): dP becomes the gradient reaching the undropped P,
    // M o dP / (1 - p).
    if constexpr (variant_dropout(kVariant)) {
      uint32_t keep[keep_words(kNTiles * 4)];
      dropout_of(kp, tile.batch, head)
          .template keep_bits<1, kNTiles>(keep, m_start + warp * 16, n * kBlockN, lane);
      apply_keep_bits(acc_dp, keep, kp.dropout.rp);
    }
    // P and dS = P (dP - D), in acc_dp; with softcap times 1 - t^2 (problem/score_mod.h), t
    // recovered from P less ALiBi's bias.
    [[maybe_unused]] const bool softcap = softcap_on<kVariant>(kp);
    [[maybe_unused]] Alibi alibi{};
    if constexpr (kSoftcap && kAlibi) {
      if (softcap && alibi_on<kVariant>(kp)) alibi = alibi_of<kVariant>(kp, tile.batch, head);
    }
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pr = prob_from_score(acc_s[0][nt][hr * 2 + e], row_max[hr],
                                           row_log2sum[hr], scale_log2);
          float ds = pr * (acc_dp[nt][hr * 2 + e] - dsum[hr]);
          if (kSoftcap && softcap) {
            const int row = m_start + warp * 16 + g + hr * 8;
            const int key = n * kBlockN + nt * 8 + 2 * t + e;
            const float bias = kAlibi ? alibi.bias(row, key) : 0.f;
            ds *= softcap_grad(pr, row_max[hr], row_log2sum[hr], kp.score.inv_scale_log2, bias);
          }
          acc_dp[nt][hr * 2 + e] = ds;
        }
    // dQ += dS K: A = dS from registers (k-step kk = keys kk*16..: a0 = tile 2kk [0,1] (row g),
    // a1 = tile 2kk [2,3] (row g+8), a2 = tile 2kk+1 [0,1], a3 = tile 2kk+1 [2,3]).
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[4];
      a[0] = Ops::pack(acc_dp[2 * kk][0], acc_dp[2 * kk][1]);
      a[1] = Ops::pack(acc_dp[2 * kk][2], acc_dp[2 * kk][3]);
      a[2] = Ops::pack(acc_dp[2 * kk + 1][0], acc_dp[2 * kk + 1][1]);
      a[3] = Ops::pack(acc_dp[2 * kk + 1][2], acc_dp[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, sKs + bt_off + (kk * 16 * kRowChunks + dp * 2) * 16);
        Ops::mma(acc_dq[2 * dp], a, b[0], b[1]);
        Ops::mma(acc_dq[2 * dp + 1], a, b[2], b[3]);
      }
    }
    if constexpr (kStages == 1) {
      __syncthreads();  // every warp is done with K_n
      if (n + 1 < n_end) {
        load_k(n + 1, 0);
        ptx::cp_async_commit();
      }
    }
  }

  // Stage dQ * scale through this warp's own rows of sQ (no other warp reads them), then write
  // 16-byte chunks.
  __syncwarp();
  const float scale = p.softmax_scale;
  char* s_out = smem + Traits::kOffQ;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int row = warp * 16 + g + hr * 8;
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      *reinterpret_cast<uint32_t*>(s_out + (row * kRowChunks + dt) * 16 + t * 4) =
          Ops::pack(acc_dq[dt][hr * 2] * scale, acc_dq[dt][hr * 2 + 1] * scale);
    }
  }
  __syncwarp();
  Element* dq = static_cast<Element*>(p.dq) + seq.q_offset(p.dq_batch_stride, p.dq_row_stride) +
                head * p.dq_head_stride + m_start * p.dq_row_stride;
  constexpr int kWarpChunks = 16 * Traits::kChunks;
#pragma unroll
  for (int i = 0; i < ceil_div(kWarpChunks, 32); ++i) {
    const int idx = lane + i * 32;
    if (kWarpChunks % 32 != 0 && idx >= kWarpChunks) break;
    const int r = warp * 16 + idx / Traits::kChunks, c = idx % Traits::kChunks;
    if (r < rows_q && c * 8 < p.head_dim) {
      *reinterpret_cast<uint4*>(dq + r * p.dq_row_stride + c * 8) =
          *reinterpret_cast<const uint4*>(s_out + (r * kRowChunks + c) * 16);
    }
  }
}

template <typename Element, typename Traits, int kVariant>
__global__ void __launch_bounds__(Traits::kNThreads)
    bwd_dq_kernel(const __grid_constant__ BwdKernelParams params) {
  extern __shared__ __align__(128) char smem[];
  bwd_dq_block<Element, Traits, kVariant>(params, smem);
}

}  // namespace flashattn_cu::backward
