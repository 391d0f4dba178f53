// FlashAttention backward on Hopper warpgroup MMA (wgmma, sm_90a): the main kernel.
//
// Same work split and semantics as the sm80 main kernel (sm80/bwd_kernel.h): one thread block owns
// kBlockN keys of one (batch, kv head), keeps K and V in shared memory and dK, dV in fp32
// registers, and walks every (query head of its group share, query block of kBlockM rows) that
// sees those keys. The workspace, the preprocess (D, lse_log2), the deterministic dQ kernel and
// the postprocess are the sm80 ones.
//
// Two consumer warpgroups, each owning 64 of the 128 keys; per query block each computes
//   S^T  = K Q^T            wgmma SS, m64 (keys) x n kBlockM (queries) x k d
//   dP^T = V dO^T           wgmma SS, issued right behind S^T, overlapping the exponentials
//   P^T  = exp2(S^T scale_log2 - lse_log2)      (registers; the accumulator layout of S^T is the
//   dV  += P^T dO           wgmma RS              A-operand layout, so P^T never leaves them)
//   dS^T = P^T (dP^T - D);  dK += dS^T Q          wgmma RS; dS^T also to shared memory
//   (dS^T is formed from the 16-bit P^T, as on sm80, so fp32 P^T and dP^T are never both live)
//   dQ   = dS K  (both warpgroups, half of d each)  wgmma SS, MN-major A and B, red.global.add
// Shared tiles are sw128 (ptx/wgmma.h): K, V [key][d], Q, dO [query][d] (two stages), dS^T
// [key][query]. The same tile serves K-major reads (S^T: K, Q) and MN-major ones (dV/dK: dO, Q;
// dQ: dS^T, K), so nothing is stored twice.
//
// One step (query block):
//   wait for this step's Q/dO/lse/D; fence.proxy.async; __syncthreads; issue next step's loads
//   S^T, dP^T (2 groups) | wait S^T: mask, exp2 | dV (group) | wait dP^T: dS^T, store dS^T,
//   fence.proxy.async; __syncthreads | dK, dQ (2 groups) | wait all, red.global.add
// Padding rows (>= seqlen_q) have lse = +inf, D = 0 and zero Q/dO: P = 0, dS = 0 without a test.
#pragma once

#include <cstdint>
#include <type_traits>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/mask.h"
#include "../common/numeric.h"
#include "../ptx/atomic.h"
#include "../ptx/cp_async.h"
#include "../ptx/ldmatrix.h"
#include "../ptx/math.h"
#include "../ptx/wgmma.h"
#include "../sm80/bwd_params.h"

namespace flashattn_cu::sm90 {

using sm80::BwdKernelParams;

template <int kHeadDim_, int kBlockM_>
struct BwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = 128;
  static constexpr int kWarpGroups = 2;  // each owns 64 keys
  static constexpr int kNThreads = kWarpGroups * 128;
  static constexpr int kChunks = kHeadDim / 8;   // 16-byte chunks per row of K, V, Q, dO
  static constexpr int kQTiles = kBlockM / 8;    // 8-query tiles of S^T per warp
  static constexpr int kColTiles = kHeadDim / 8; // 8-column tiles of dK, dV per warp
  static constexpr int kDqCols = kHeadDim / kWarpGroups;  // dQ columns per warpgroup
  static constexpr int kDqMTiles = kBlockM / 64;           // m64 slabs of dQ
  // Shared memory (bytes, every tile 1024-byte aligned).
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKVBytes;
  static constexpr int kOffQ = kOffV + kKVBytes;
  static constexpr int kOffDO = kOffQ + 2 * kQBytes;
  static constexpr int kOffDS = kOffDO + 2 * kQBytes;
  static constexpr int kOffLse = kOffDS + kBlockN * kBlockM * 2;
  static constexpr int kOffD = kOffLse + 2 * kBlockM * 4;
  static constexpr int kSmemBytes = kOffD + 2 * kBlockM * 4 + 1024;  // + alignment slack

  static_assert(kHeadDim % 64 == 0, "d is whole 64-column atoms");
  static_assert(kBlockM % 64 == 0, "dQ is whole m64 slabs");
  static_assert(kNThreads >= kBlockM / 2, "lse/D rows are loaded by one chunk per thread");
  static_assert(sm80::kBwdRowPad % kBlockM == 0, "workspace rows are whole query blocks");
};

// Copies a kRows x head_dim tile into a sw128 tile with cp.async; rows >= rows_valid and columns
// >= head_dim are zero-filled.
template <int kRows, int kChunks, int kThreads, typename Element>
__device__ __forceinline__ void load_tile_sw128(uint32_t smem, const Element* gmem,
                                                int64_t row_stride, int rows_valid, int head_dim,
                                                int tid) {
  static_assert((kRows * kChunks) % kThreads == 0, "whole passes");
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    const int r = idx / kChunks, c = idx % kChunks;
    const bool valid = r < rows_valid && c * 8 < head_dim;
    const Element* src = gmem + r * row_stride + c * 8;
    ptx::cp_async_16_zfill(smem + ptx::sw128_offset<kRows>(r, c), valid ? src : gmem, valid);
  }
}

template <typename Element, typename Traits>
__device__ __forceinline__ void bwd_block(const BwdKernelParams& kp, char* smem_raw) {
  using Ops = ElementOps<Element>;
  constexpr bool kBf16 = std::is_same_v<Element, __nv_bfloat16>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim, kThreads = Traits::kNThreads;
  constexpr int kQTiles = Traits::kQTiles, kColTiles = Traits::kColTiles;
  const BwdParams& p = kp.p;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wg = warp / 4;  // warpgroup: keys wg * 64 ..
  const int g = lane / 4, t = lane % 4;
  const int warp_key0 = warp * 16;  // this warp's 16 keys (rows of S^T, dK, dV)

  // Block -> (batch, kv head, head split, key block), key block fastest (as sm80).
  const int num_n = ceil_div(p.seqlen_k, kBlockN);
  int rest = static_cast<int>(blockIdx.x);
  const int n_block = rest % num_n;
  rest /= num_n;
  const int hsplit = rest % kp.kv_splits;
  rest /= kp.kv_splits;
  const int head_k = rest % p.num_heads_k;
  const int batch = rest / p.num_heads_k;
  const int head_first = head_k * (p.num_heads / p.num_heads_k) + hsplit * kp.heads_per_split;
  const int n_start = n_block * kBlockN;
  const int keys_valid = min(kBlockN, p.seqlen_k - n_start);

  const int num_m = ceil_div(p.seqlen_q, kBlockM);
  int m_begin = 0;
  int m_masked_end = keys_valid < kBlockN ? num_m : 0;
  if (p.is_causal) {
    const int shift = p.seqlen_k - p.seqlen_q;
    const int first_row = n_start - shift;
    const int full_row = n_start + keys_valid - 1 - shift;
    m_begin = first_row <= 0 ? 0 : min(num_m, first_row / kBlockM);
    m_masked_end = max(m_masked_end, full_row <= 0 ? 0 : min(num_m, ceil_div(full_row, kBlockM)));
  }
  const int m_count = num_m - m_begin;
  const int total = kp.heads_per_split * m_count;

  const uint32_t s_base = (ptx::smem_u32(smem_raw) + 1023u) & ~1023u;
  char* smem = smem_raw + (s_base - ptx::smem_u32(smem_raw));
  const uint32_t sK = s_base + Traits::kOffK, sV = s_base + Traits::kOffV;
  const uint32_t sQ = s_base + Traits::kOffQ, sDO = s_base + Traits::kOffDO;
  const uint32_t sDS = s_base + Traits::kOffDS;

  const Element* q_bh = static_cast<const Element*>(p.q) + batch * p.q_batch_stride;
  const Element* do_bh = static_cast<const Element*>(p.dout) + batch * p.do_batch_stride;
  auto load_query_block = [&](int head, int m, int stage) {
    const int row0 = m * kBlockM;
    load_tile_sw128<kBlockM, Traits::kChunks, kThreads>(
        sQ + stage * Traits::kQBytes, q_bh + head * p.q_head_stride + row0 * p.q_row_stride,
        p.q_row_stride, p.seqlen_q - row0, p.head_dim, tid);
    load_tile_sw128<kBlockM, Traits::kChunks, kThreads>(
        sDO + stage * Traits::kQBytes, do_bh + head * p.do_head_stride + row0 * p.do_row_stride,
        p.do_row_stride, p.seqlen_q - row0, p.head_dim, tid);
    const int64_t ws_row0 = (static_cast<int64_t>(batch) * p.num_heads + head) * kp.rows + row0;
    if (tid < kBlockM / 4) {
      ptx::cp_async_16_zfill(s_base + Traits::kOffLse + (stage * kBlockM + tid * 4) * 4,
                             kp.lse_log2 + ws_row0 + tid * 4, true);
    } else if (tid < kBlockM / 2) {
      const int c = tid - kBlockM / 4;
      ptx::cp_async_16_zfill(s_base + Traits::kOffD + (stage * kBlockM + c * 4) * 4,
                             kp.dpsum + ws_row0 + c * 4, true);
    }
  };

  if (total > 0) {
    const Element* k = static_cast<const Element*>(p.k) + batch * p.k_batch_stride +
                       head_k * p.k_head_stride + n_start * p.k_row_stride;
    const Element* v = static_cast<const Element*>(p.v) + batch * p.v_batch_stride +
                       head_k * p.v_head_stride + n_start * p.v_row_stride;
    load_tile_sw128<kBlockN, Traits::kChunks, kThreads>(sK, k, p.k_row_stride, keys_valid,
                                                        p.head_dim, tid);
    load_tile_sw128<kBlockN, Traits::kChunks, kThreads>(sV, v, p.v_row_stride, keys_valid,
                                                        p.head_dim, tid);
    load_query_block(head_first, m_begin, 0);
    ptx::cp_async_commit();
  }

  float acc_dk[kColTiles][4], acc_dv[kColTiles][4];
#pragma unroll
  for (int i = 0; i < kColTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[i][e] = acc_dv[i][e] = 0.f;

  const bool compute_dq = !p.deterministic;
  const float scale_log2 = kp.scale_log2;
  int head = head_first, m = m_begin;

#pragma unroll 1
  for (int it = 0; it < total; ++it) {
    const int stage = it & 1;
    int next_head = head, next_m = m + 1;
    if (next_m == num_m) {
      next_m = m_begin;
      ++next_head;
    }

    ptx::cp_async_wait<0>();
    ptx::fence_proxy_async_shared();  // this thread's cp.async data is read by wgmma next
    __syncthreads();                  // all of it landed; every warpgroup finished the last step
    if (it + 1 < total) {
      load_query_block(next_head, next_m, stage ^ 1);
      ptx::cp_async_commit();
    }
    const uint32_t sQs = sQ + stage * Traits::kQBytes, sDOs = sDO + stage * Traits::kQBytes;
    const char* s_lse = smem + Traits::kOffLse + stage * kBlockM * 4;
    const char* s_d = smem + Traits::kOffD + stage * kBlockM * 4;

    // S^T and dP^T: A = this warpgroup's 64 rows of K / V, B = Q / dO (both K-major, k = d).
    float acc_s[kQTiles][4], acc_dp[kQTiles][4];
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      ptx::wgmma_ss<kBlockM, kBf16, 0, 0>(acc_s, ptx::sw128_desc_k_major<kBlockN>(sK, wg * 64, ks),
                                          ptx::sw128_desc_k_major<kBlockM>(sQs, 0, ks), ks > 0);
    }
    ptx::wgmma_commit();
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      ptx::wgmma_ss<kBlockM, kBf16, 0, 0>(acc_dp,
                                          ptx::sw128_desc_k_major<kBlockN>(sV, wg * 64, ks),
                                          ptx::sw128_desc_k_major<kBlockM>(sDOs, 0, ks), ks > 0);
    }
    ptx::wgmma_commit();
    ptx::wgmma_wait<1>();
    ptx::fence_operand(acc_s);

    if (m < m_masked_end) {
      mask_scores_transposed(acc_s, n_start + warp_key0, m * kBlockM, p.seqlen_q, p.seqlen_k,
                             p.is_causal, lane);
    }
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt) {
      const float2 lse = *reinterpret_cast<const float2*>(s_lse + (nt * 8 + 2 * t) * 4);
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        acc_s[nt][hr * 2] = ptx::ex2_approx(fmaf(acc_s[nt][hr * 2], scale_log2, -lse.x));
        acc_s[nt][hr * 2 + 1] = ptx::ex2_approx(fmaf(acc_s[nt][hr * 2 + 1], scale_log2, -lse.y));
      }
    }
    // 16-bit A fragments of k-step kk (queries 16 kk ..) from C tiles 2kk, 2kk + 1.
    auto pack_a = [](const float (&c)[kQTiles][4], int kk, uint32_t (&a)[4]) {
      a[0] = Ops::pack(c[2 * kk][0], c[2 * kk][1]);
      a[1] = Ops::pack(c[2 * kk][2], c[2 * kk][3]);
      a[2] = Ops::pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
      a[3] = Ops::pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
    };

    // dV += P^T dO: B = dO rows of k-step kk, MN-major (n = d).
    uint32_t p16[kBlockM / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) pack_a(acc_s, kk, p16[kk]);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      ptx::wgmma_rs<kHeadDim, kBf16, 1>(acc_dv, p16[kk],
                                        ptx::sw128_desc_mn_major<kBlockM>(sDOs, kk, 0), 1);
    }
    ptx::wgmma_commit();
    ptx::wgmma_wait<1>();  // dP^T done (dV may still run)
    ptx::fence_operand(acc_dp);

    // dS^T = P^T (dP^T - D), in place in acc_dp, from the 16-bit P^T (as sm80: the fp32 P^T dies
    // once packed, which keeps d = 128 within 255 registers). Element (tile nt, hr, e) of P^T is
    // half e of p16[nt / 2][(nt % 2) * 2 + hr].
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt) {
      const float2 dsum = *reinterpret_cast<const float2*>(s_d + (nt * 8 + 2 * t) * 4);
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const float2 pr = Ops::unpack(p16[nt / 2][(nt % 2) * 2 + hr]);
        acc_dp[nt][hr * 2] = pr.x * (acc_dp[nt][hr * 2] - dsum.x);
        acc_dp[nt][hr * 2 + 1] = pr.y * (acc_dp[nt][hr * 2 + 1] - dsum.y);
      }
    }
    uint32_t ds16[kBlockM / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) pack_a(acc_dp, kk, ds16[kk]);
    if (compute_dq) {
      // dS^T to shared memory [key][query] (sw128, kBlockN rows): a0 = (key g, queries 16kk +
      // 2t..), a1 = key g + 8, a2 = queries + 8, a3 = both.
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int row = warp_key0 + g + (j % 2) * 8;
          const int col = kk * 16 + (j / 2) * 8 + 2 * t;
          *reinterpret_cast<uint32_t*>(smem + Traits::kOffDS +
                                       ptx::sw128_offset<kBlockN>(row, col / 8) + (col % 8) * 2) =
              ds16[kk][j];
        }
      }
      // Published before dK is issued: the proxy fence waits for this thread's wgmmas in flight
      // (only dV here), so dK and dQ can then run back to back.
      ptx::fence_proxy_async_shared();
      __syncthreads();  // dS^T of both warpgroups stored
    }
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      ptx::wgmma_rs<kHeadDim, kBf16, 1>(acc_dk, ds16[kk],
                                        ptx::sw128_desc_mn_major<kBlockM>(sQs, kk, 0), 1);
    }
    ptx::wgmma_commit();

    if (compute_dq) {
      // dQ (kBlockM x d) = dS K: this warpgroup's kDqCols columns. A = dS from dS^T [key][query]
      // (MN-major, m = query), B = K [key][d] (MN-major, n = d).
      constexpr int kDqCols = Traits::kDqCols;
      float acc_dq[Traits::kDqMTiles][kDqCols / 8][4];
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
        for (int mt = 0; mt < Traits::kDqMTiles; ++mt) {
          ptx::wgmma_ss<kDqCols, kBf16, 1, 1>(
              acc_dq[mt], ptx::sw128_desc_mn_major<kBlockN>(sDS, kk, mt * 64),
              ptx::sw128_desc_mn_major<kBlockN>(sK, kk, wg * kDqCols), kk > 0);
        }
      }
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
#pragma unroll
      for (int mt = 0; mt < Traits::kDqMTiles; ++mt) ptx::fence_operand(acc_dq[mt]);
      // Row (query) mt * 64 + (warp % 4) * 16 + g + 8 hr, column wg * kDqCols + 8 nt + 2t + e.
      float* dq_rows = kp.dq_accum +
                       ((static_cast<int64_t>(batch) * p.num_heads + head) * kp.rows +
                        m * kBlockM + (warp % 4) * 16 + g) * kHeadDim +
                       wg * kDqCols + 2 * t;
#pragma unroll
      for (int mt = 0; mt < Traits::kDqMTiles; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
#pragma unroll
          for (int nt = 0; nt < kDqCols / 8; ++nt) {
            ptx::red_add_v2_f32(dq_rows + (mt * 64 + hr * 8) * kHeadDim + nt * 8,
                                acc_dq[mt][nt][hr * 2], acc_dq[mt][nt][hr * 2 + 1]);
          }
    } else {
      ptx::wgmma_wait<0>();
    }
    head = next_head;
    m = next_m;
  }
  ptx::fence_operand(acc_dk);
  ptx::fence_operand(acc_dv);

  // dK = softmax_scale * dS^T Q (the scale of S was left out of dS), dV as accumulated.
  const float scale = p.softmax_scale;
  if (kp.kv_splits == 1) {
    // Stage both tiles in Element precision over sK / sV (sw128 layout), then 16-byte stores.
    __syncthreads();  // every warpgroup is done reading K and V
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = warp_key0 + g + hr * 8;
#pragma unroll
      for (int i = 0; i < kColTiles; ++i) {
        const uint32_t off = ptx::sw128_offset<kBlockN>(row, i) + t * 4;
        *reinterpret_cast<uint32_t*>(smem + Traits::kOffK + off) =
            Ops::pack(acc_dk[i][hr * 2] * scale, acc_dk[i][hr * 2 + 1] * scale);
        *reinterpret_cast<uint32_t*>(smem + Traits::kOffV + off) =
            Ops::pack(acc_dv[i][hr * 2], acc_dv[i][hr * 2 + 1]);
      }
    }
    __syncthreads();
    Element* dk = static_cast<Element*>(p.dk) + batch * p.dk_batch_stride +
                  head_k * p.dk_head_stride + n_start * p.dk_row_stride;
    Element* dv = static_cast<Element*>(p.dv) + batch * p.dv_batch_stride +
                  head_k * p.dv_head_stride + n_start * p.dv_row_stride;
    constexpr int kTotal = kBlockN * Traits::kChunks;
#pragma unroll
    for (int i = 0; i < kTotal / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      const int r = idx / Traits::kChunks, c = idx % Traits::kChunks;
      if (r < keys_valid && c * 8 < p.head_dim) {
        const uint32_t off = ptx::sw128_offset<kBlockN>(r, c);
        *reinterpret_cast<uint4*>(dk + r * p.dk_row_stride + c * 8) =
            *reinterpret_cast<const uint4*>(smem + Traits::kOffK + off);
        *reinterpret_cast<uint4*>(dv + r * p.dv_row_stride + c * 8) =
            *reinterpret_cast<const uint4*>(smem + Traits::kOffV + off);
      }
    }
  } else {
    // fp32 partial sums of this head split, [split][batch][head_k][key][d] (as sm80).
    const int64_t part_row0 =
        ((static_cast<int64_t>(hsplit) * p.batch + batch) * p.num_heads_k + head_k) *
            p.seqlen_k + n_start;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = warp_key0 + g + hr * 8;
      if (row < keys_valid) {
        const int64_t off = (part_row0 + row) * kHeadDim + 2 * t;
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

template <typename Element, typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    bwd_kernel(const __grid_constant__ BwdKernelParams params) {
#if FLASHATTN_CU_SM90A
  extern __shared__ __align__(1024) char smem[];
  sm90::bwd_block<Element, Traits>(params, smem);  // qualified: no ADL into sm80
#else
  ptx::unsupported_arch();
#endif
}

}  // namespace flashattn_cu::sm90
