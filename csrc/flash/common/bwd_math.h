// Backward math shared by the sm80 (mma.sync) and sm90 (wgmma) kernels. Both hold S^T, dP^T and
// dS^T of a warp's 16 keys in the same C-fragment layout (ptx/mma.h, ptx/wgmma.h):
//   c[nt][hr * 2 + e] = key g + 8 hr, query 8 nt + 2t + e   (g = lane / 4, t = lane % 4)
// and feed P^T / dS^T back to the tensor cores as 16-bit A fragments of 16 queries each.
#pragma once

#include <cstdint>
#include <type_traits>

#include "../problem/score_mod.h"
#include "softmax.h"
#include "../ptx/math.h"
#include "numeric.h"

namespace flashattn_cu {

// The softcap's factor 1 - t^2 formed from t itself when the scores are capped and kept until
// dS in 16 bits in shared memory (the sm80 register-path backward: in the lane's own dS^T slots,
// which the same lane overwrites with dS^T afterwards, so no barrier is involved): per score one
// FFMA, half a pack, half a 32-bit store and load and an unpack, instead of softcap_grad's
// MUFU.LG2, the (M, L) loads, the bias and the clamp. The 16-bit rounding of the factor (2^-9
// relative in bf16) is below that of t recovered from a 16-bit P (softcap_grad), and dS is
// rounded to 16 bits for the tensor cores anyway. Layout: element (nt, hr, e) of a transposed
// tile (key g + 8 hr, query 8 nt + 2t + e) in the lane's 32-bit slot of (key g + 8 hr, queries
// 8 nt + 2t) of a 16-bit [key][query] tile, wherever Slots::word(nt, hr) puts it (the sm80 tile:
// PlainGradSlots; the sm90 kernels' sw128 dS^T tile: sm90/bwd_common.h Sw128GradSlots).
template <typename Element, typename Slots>
struct StoredSoftcapGradT {
  Slots slots;

  template <int kQTiles>
  __device__ __forceinline__ void store(const float (&t)[kQTiles][4]) const {
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
        *slots.word(nt, hr) =
            ElementOps<Element>::pack(fmaf(-t[nt][hr * 2], t[nt][hr * 2], 1.f),
                                      fmaf(-t[nt][hr * 2 + 1], t[nt][hr * 2 + 1], 1.f));
  }
  __device__ __forceinline__ float operator()(float, int nt, int hr, int e) const {
    const float2 f = ElementOps<Element>::unpack(*slots.word(nt, hr));
    return e == 0 ? f.x : f.y;
  }
};

// A plain tile of row_bytes per row (slot: the lane's (key g, query 2t) word).
struct PlainGradSlots {
  char* slot;
  int row_bytes;

  __device__ __forceinline__ uint32_t* word(int nt, int hr) const {
    return reinterpret_cast<uint32_t*>(slot + hr * 8 * row_bytes + nt * 16);
  }
};

// 16-bit A fragment of k-step kk (queries 16 kk ..) from C tiles 2kk, 2kk + 1:
// a0 = (key g, queries 2t..) = tile 2kk [0,1]; a1 = (key g + 8) = tile 2kk [2,3];
// a2 = (key g, queries 8 + 2t..) = tile 2kk + 1 [0,1]; a3 = tile 2kk + 1 [2,3].
template <typename Element, int kTiles>
__device__ __forceinline__ void pack_a_frag(const float (&c)[kTiles][4], int kk,
                                            uint32_t (&a)[4]) {
  using Ops = ElementOps<Element>;
  a[0] = Ops::pack(c[2 * kk][0], c[2 * kk][1]);
  a[1] = Ops::pack(c[2 * kk][2], c[2 * kk][3]);
  a[2] = Ops::pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = Ops::pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// P = exp2((S - M) * scale_log2 - L) for one score, with the row's (M, L) from the workspace
// (common/softmax.h, RowStats). S - M first, as in the forward: the row's largest score gives
// exactly exp2(-L) = 1/l at any logit magnitude. Masked scores (-inf) and padding rows
// (M = +inf) give 0.
__device__ __forceinline__ float prob_from_score(float s, float row_max, float row_log2sum,
                                                 float scale_log2) {
  return ptx::ex2_approx(fmaf(s - row_max, scale_log2, -row_log2sum));
}
// The same with the exponential on the FMA pipe (common/softmax.h, exp2_fma): for a share of the
// scores of kernels whose SFU is their limit (the softcap variants).
__device__ __forceinline__ float prob_from_score_fma(float s, float row_max, float row_log2sum,
                                                     float scale_log2) {
  return exp2_fma(fmaf(s - row_max, scale_log2, -row_log2sum));
}

// S^T -> P^T in place (prob_from_score). s_max / s_log2sum hold M / L of the step's queries
// (fp32, one per query), the warp's first query is query0; one float2 per 8-query tile.
// kPolyEighths of every 8 query tiles (nt % 8 >= 8 - kPolyEighths) use prob_from_score_fma.
template <int kPolyEighths = 0, int kQTiles>
__device__ __forceinline__ void probs_from_scores(float (&s)[kQTiles][4], const char* s_max,
                                                  const char* s_log2sum, int query0,
                                                  float scale_log2, int t) {
#pragma unroll
  for (int nt = 0; nt < kQTiles; ++nt) {
    const int off = (query0 + nt * 8 + 2 * t) * 4;
    const float2 mx = *reinterpret_cast<const float2*>(s_max + off);
    const float2 lg = *reinterpret_cast<const float2*>(s_log2sum + off);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      if (nt % 8 >= 8 - kPolyEighths) {
        s[nt][hr * 2] = prob_from_score_fma(s[nt][hr * 2], mx.x, lg.x, scale_log2);
        s[nt][hr * 2 + 1] = prob_from_score_fma(s[nt][hr * 2 + 1], mx.y, lg.y, scale_log2);
      } else {
        s[nt][hr * 2] = prob_from_score(s[nt][hr * 2], mx.x, lg.x, scale_log2);
        s[nt][hr * 2 + 1] = prob_from_score(s[nt][hr * 2 + 1], mx.y, lg.y, scale_log2);
      }
    }
  }
}

// P^T's 16-bit A fragment of k-step kk (hi, as pack_a_frag) and the 16-bit rounding of what hi
// leaves out (lo = P^T - hi): hi + lo holds P^T to about twice the 16-bit type's precision, for
// a consumer that receives P^T through shared memory (the sm90 split kernel's warpgroup 1, which
// forms dS^T from it: ds_from_split_probs) without the fp32 tile's bytes.
template <typename Element, int kTiles>
__device__ __forceinline__ void pack_a_frag_split(const float (&c)[kTiles][4], int kk,
                                                  uint32_t (&hi)[4], uint32_t (&lo)[4]) {
  using Ops = ElementOps<Element>;
  pack_a_frag<Element>(c, kk, hi);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float* e = &c[2 * kk + j / 2][(j % 2) * 2];
    const float2 h = Ops::unpack(hi[j]);
    lo[j] = Ops::pack(e[0] - h.x, e[1] - h.y);
  }
}

// dP^T -> dS^T = P^T (dP^T - D) in place for the C tiles 2kk, 2kk + 1 of dp, which are tiles
// tile0 + 2kk, tile0 + 2kk + 1 of the step's queries (dp a part of them: tile0 its first tile;
// the whole: 0), with P^T's pair of element (tile ns, row hr) from probs(ns, j), j = half * 2 +
// hr (the A fragment's register order). s_d points at D of the warp's first query. grad(p, ns,
// hr, e): the score modifier's factor on dS (problem/score_mod.h: UnitGrad, SoftcapGradT). The
// forms below give P^T at fp32 precision or near it, so dS^T is rounded to 16 bits once, as
// FlashAttention-2 and -3 round it. Formed from P^T rounded to 16 bits first (the kernels' form
// until 0.2), dS^T carries two roundings whose sum over the queries can be far larger than
// either's: dK's error on the climbing-logit test's input (tests/test_numerics.py
// test_row_max_that_climbs_along_the_keys) was 8x FlashAttention-2's at its worst element, bit
// for bit what an fp64 emulation of the two roundings gives (NOTES 12.87).
template <int kDpTiles, typename Probs, typename Grad>
__device__ __forceinline__ void ds_from(float (&dp)[kDpTiles][4], int kk, int tile0,
                                        const Probs& probs, const char* s_d, int t,
                                        const Grad& grad) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int nt = 2 * kk + half, ns = tile0 + nt;
    const float2 dsum = *reinterpret_cast<const float2*>(s_d + (ns * 8 + 2 * t) * 4);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const float2 p = probs(ns, half * 2 + hr);
      dp[nt][hr * 2] = p.x * (dp[nt][hr * 2] - dsum.x) * grad(p.x, ns, hr, 0);
      dp[nt][hr * 2 + 1] = p.y * (dp[nt][hr * 2 + 1] - dsum.y) * grad(p.y, ns, hr, 1);
    }
  }
}

// ds_from with the fp32 P^T (s, after probs_from_scores; all the step's tiles).
template <int kDpTiles, int kQTiles, typename Grad = UnitGrad>
__device__ __forceinline__ void ds_from_probs(float (&dp)[kDpTiles][4], int kk,
                                              const float (&s)[kQTiles][4], int tile0,
                                              const char* s_d, int t, const Grad& grad = Grad{}) {
  ds_from(dp, kk, tile0,
          [&](int ns, int j) { return make_float2(s[ns][(j % 2) * 2], s[ns][(j % 2) * 2 + 1]); },
          s_d, t, grad);
}

// ds_from (tile0 = 0) with P^T = hi + lo: hi pack_a_frag's 16-bit fragment of k-step kk, lo(j)
// what the 16 bits of hi[j] leave out as a float pair. kBitUnpack: hi unpacked by
// ElementOps::unpack_bits (the same values; the sm90 kernels' form).
template <typename Element, bool kBitUnpack, int kQTiles, typename Lo, typename Grad>
__device__ __forceinline__ void ds_from_hi_lo(float (&dp)[kQTiles][4], int kk,
                                              const uint32_t (&hi)[4], const Lo& lo,
                                              const char* s_d, int t, const Grad& grad) {
  using Ops = ElementOps<Element>;
  ds_from(dp, kk, 0,
          [&](int, int j) {
            const float2 h = kBitUnpack ? Ops::unpack_bits(hi[j]) : Ops::unpack(hi[j]);
            const float2 l = lo(j);
            return make_float2(h.x + l.x, h.y + l.y);
          },
          s_d, t, grad);
}

// ds_from_hi_lo with lo as pack_a_frag_split's 16-bit fragment.
template <typename Element, bool kBitUnpack = false, int kQTiles, typename Grad = UnitGrad>
__device__ __forceinline__ void ds_from_split_probs(float (&dp)[kQTiles][4], int kk,
                                                    const uint32_t (&hi)[4],
                                                    const uint32_t (&lo)[4], const char* s_d,
                                                    int t, const Grad& grad = Grad{}) {
  using Ops = ElementOps<Element>;
  ds_from_hi_lo<Element, kBitUnpack>(
      dp, kk, hi,
      [&](int j) { return kBitUnpack ? Ops::unpack_bits(lo[j]) : Ops::unpack(lo[j]); }, s_d, t,
      grad);
}

// What P^T's 16 bits leave out in e4m3 instead of 16 bits (half the bytes): lo = P^T - hi scaled
// by kE4m3LoScale (2^9 for bf16, whose |lo| <= 2^-8 p; 2^12 for fp16, |lo| <= 2^-11 p), so that
// lo of the elements that weigh in dS^T (p above ~2^-6) lands in e4m3's normal range, 3 bits of
// it kept: hi + lo then carries P^T to ~2^-12 relative there. Word w of the result holds the
// fragment's registers 2w, 2w + 1, each as two bytes (element e = 1 the upper byte).
template <typename Element>
constexpr float kE4m3LoScale = std::is_same_v<Element, __half> ? 4096.f : 512.f;

template <typename Element, int kTiles>
__device__ __forceinline__ uint2 pack_e4m3_residual(const float (&c)[kTiles][4], int kk,
                                                    const uint32_t (&hi)[4]) {
  using Ops = ElementOps<Element>;
  uint32_t w[2];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float* e = &c[2 * kk + j / 2][(j % 2) * 2];
    const float2 h = Ops::unpack(hi[j]);
    const uint32_t b = ptx::cvt_e4m3x2((e[1] - h.y) * kE4m3LoScale<Element>,
                                       (e[0] - h.x) * kE4m3LoScale<Element>);
    w[j / 2] = j % 2 == 0 ? b : w[j / 2] | (b << 16);
  }
  return make_uint2(w[0], w[1]);
}

// pack_e4m3_residual's inverse, as the float pairs ds_from_hi_lo takes.
template <typename Element>
__device__ __forceinline__ void unpack_e4m3_residual(uint2 r, float2 (&lo)[4]) {
  const uint32_t w[2] = {r.x, r.y};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t h2 = ptx::cvt_f16x2_from_e4m3x2(w[j / 2] >> (16 * (j % 2)));
    const float2 f = ElementOps<__half>::unpack(h2);
    lo[j] = make_float2(f.x * (1.f / kE4m3LoScale<Element>), f.y * (1.f / kE4m3LoScale<Element>));
  }
}

}  // namespace flashattn_cu
