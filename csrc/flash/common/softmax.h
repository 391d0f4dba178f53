// Online softmax state of one warp's rows, FlashAttention-2 style: running max m (raw score
// units) and running sum l per row, kept in registers while K/V tiles stream by.
// Each lane holds 2 rows per 16-row m-tile (g and g + 8). l is a per-lane partial sum over the
// lane's own columns and is reduced across the quad only in finalize(): the rescale factor is the
// same for the whole row, so partial sums rescale correctly.
//
// Exactness at any logit magnitude (a constant added to every logit of a row changes nothing):
// every exponent is formed as (s - m) * scale_log2, the difference of two raw scores first. The
// row's largest score gives exactly exp2(0) = 1, and a tile that leaves the max unchanged
// rescales by exactly exp2(0) = 1. The fused form s * scale_log2 - m * scale_log2 would carry the
// rounding error r of m * scale_log2 into every exponent (2^r instead of 1, compounding once per
// key block, and overflowing l once |m * scale_log2| passes ~2^31). The cost is one FADD per score.
#pragma once

#include <math.h>

#include "../ptx/math.h"
#include "numeric.h"

namespace flashattn_cu {

// 2^x for x < 128 (x <= 0 under a running max; the bounded reference's exponents reach 64) on
// the FMA pipe instead of the SFU (MUFU.EX2): 9 full-rate instructions for one quarter-rate MUFU
// slot. The softcap kernels spend two MUFU per score (tanh and exp2), which makes the SFU their
// limit (benchmarks/NOTES.md section 10); they take a fraction of their
// exponentials here. x = j + f, j = floor(x) from one round-down add of 1.5 * 2^23 (whose low
// mantissa bits are then j), 2^f by a degree-4 polynomial with p(0) = 1 (least-max relative
// error on [0, 1), fitted here by a linear program: 2.9e-6 = 2^-18.4 in fp32 Horner, of mean
// ~0), and j added into the exponent field. The degree-3 fit it replaced (8.6e-5 = 2^-13.5, of
// one sign at both ends of [0, 1)) moved an fp32 LSE by up to 3 / 8 of that, 3.2e-5 for a row
// of logits near 0 (every f near 1), past the rule's 1e-5 floor (benchmarks/NOTES.md 12.57);
// now ~1e-6. x = -inf (a masked score) clamps to -127, whose f = 0 gives p = 1 exactly and the
// result +0 exactly, as ex2.approx.ftz gives; x in (-127, -126) gives a denormal (< 2^-126)
// that the ftz arithmetic reads as 0.
__device__ __forceinline__ float exp2_fma(float x) {
  x = fmaxf(x, -127.f);
  const float shifted = __fadd_rd(x, 12582912.f);  // 1.5 * 2^23 + floor(x)
  const float f = x - (shifted - 12582912.f);      // [0, 1), exact
  const float p = fmaf(
      fmaf(fmaf(fmaf(0.013427376f, f, 0.052241072f), f, 0.24128109f), f, 0.69304466f), f, 1.f);
  return __uint_as_float(__float_as_uint(p) + (__float_as_uint(shifted) << 23));
}

// How a kernel variant forms its exponentials (OnlineSoftmax::update): the default is the
// plain kernels' (MUFU.EX2 for every score, the exponent (s - m) * scale_log2 as a difference
// first). kPolyEighths of every 8 score tiles (nt % 8 >= 8 - kPolyEighths) take exp2_fma
// instead; kFusedExponent forms the exponent as one FFMA s * scale_log2 - m * scale_log2, for
// scores bounded by 1 in magnitude (softcap without ALiBi: the rounding of m * scale_log2,
// |m * scale_log2| <= softcap log2(e), moves every exponent by at most 2^-18 of that, while the
// rescale factor stays the exact difference form).
// kWarpFusedLog2 = b > 0: the fused exponent wherever a warp's rows all have |m * scale_log2|
// < 2^b (a vote per tile; else the difference form): the largest score's p is then 2^r with
// |r| <= 2^(b - 25) (half an fp32 ulp of m * scale_log2), the same factor for a whole block of a
// row. The plain kernels take b = 10 (|r| <= 2^-15). The ALiBi kernels, whose bias puts m far
// from 0 (the causal form's slope * key: |m * scale_log2| ~ 21,000 at 16k keys and slope 0.9),
// take the largest b for which P's 16-bit rounding still gives the largest score exactly 1:
// fp16 2^13 (|r| ln 2 <= 2^-12.5 < 2^-12, half of fp16's spacing below 1), bf16 2^15 (|r| ln 2
// <= 2^-10.5 < 2^-9). The sum l then differs from the 16-bit P's by at most that factor:
// <= 2^-12.5 / 2^-10.5 relative in O, a third of an fp16 / bf16 ulp (benchmarks/NOTES.md 12.27
// item 6: b = inf flipped fp16 outputs' last bit). The rescale stays exact. Saves the FADD per
// score of the difference form.
// kSumTree: the tile's row sums as pairwise trees over the finished exponentials instead of one
// serial FADD chain per row fed by each MUFU in turn (the same terms, summed in another order:
// fp32 rounding differences only); a tuning knob for kernels whose exponentials sit on the
// critical path (sm90/fwd_consumer.h, FwdTraits kSumTree).
template <int kPolyEighths_ = 0, bool kFusedExponent_ = false, int kWarpFusedLog2_ = 0,
          bool kSumTree_ = false>
struct ExpPolicy {
  static constexpr int kPolyEighths = kPolyEighths_;
  static constexpr bool kFusedExponent = kFusedExponent_;
  static constexpr int kWarpFusedLog2 = kFusedExponent_ ? 0 : kWarpFusedLog2_;
  static constexpr bool kWarpFused = kWarpFusedLog2 > 0;
  static constexpr bool kSumTree = kSumTree_;
  static_assert(kPolyEighths >= 0 && kPolyEighths <= 8, "eighths of the score tiles");
  static_assert(kWarpFusedLog2 >= 0 && kWarpFusedLog2 <= 15, "the vote's bound, log2");
};
using DefaultExp = ExpPolicy<>;

// The share of the softcap kernels' exponentials on the FMA pipe (sm80 forward and backward),
// in eighths of the score tiles. The estimate of benchmarks/NOTES.md section 10 balances the SFU
// (8 cycles per warp instruction, two MUFU per score) against issue (exp2_fma: 8 instructions
// then, 9 since its degree-4 polynomial) at ~3 / 8 - 1 / 2 of the exponentials;
// -DFLASHATTN_CU_SOFTCAP_POLY_EIGHTHS=n (e.g. through NVCC_APPEND_FLAGS) rebuilds with another
// share for an A/B.
#ifndef FLASHATTN_CU_SOFTCAP_POLY_EIGHTHS
#define FLASHATTN_CU_SOFTCAP_POLY_EIGHTHS 3
#endif
constexpr int kSoftcapPolyEighths = FLASHATTN_CU_SOFTCAP_POLY_EIGHTHS;

// What the backward needs to recompute P = exp2((s - row_max) * scale_log2 - log2_sum) exactly:
// the row's max raw score and log2 of its sum of exp2((s - row_max) * scale_log2). A row that saw
// no key gets (+inf, 0), which makes every recomputed P exp2(-inf) = 0.
struct RowStats {
  float row_max;
  float log2_sum;
};

// exponentiate's default `after`: nothing (no code, so its callers' SASS is what it was before
// the parameter).
struct NoAfter {
  __device__ __forceinline__ void operator()() const {}
};

template <int kMTiles>
struct OnlineSoftmax {
  float m[kMTiles][2];
  float l[kMTiles][2];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        m[mt][hr] = -INFINITY;
        l[mt][hr] = 0.f;
      }
    }
  }

  // Takes a tile of raw scores, turns them into unnormalised probabilities
  // p = 2^((s - m_new) * scale_log2) in place, and rescales l and the output accumulator o by
  // 2^((m_old - m_new) * scale_log2). Requires scale_log2 > 0. A row whose scores so far are all
  // -inf (masked) uses 0 as its reference, so no inf - inf appears; its p are exp2(-inf) = 0.
  // In three steps, for kernels whose o is in flight on the tensor cores while the exponentials
  // run (sm90/fwd_consumer.h: new_max and exponentiate, then rescale_output once o has landed).
  // kLazyLog2 > 0: against a lazy reference (new_max), o's rescale skipped by a warp whose rows
  // all kept theirs (rescale_output_for); kKeep: the running max, o's rescale skipped by a warp
  // whose rows' maxima all stayed (new_max).
  template <typename Exp = DefaultExp, int kLazyLog2 = 0, bool kKeep = false, int kNTiles,
            int kDTiles>
  __device__ __forceinline__ void update(float (&s)[kMTiles][kNTiles][4],
                                         float (&o)[kMTiles][kDTiles][4], float scale_log2) {
    float ref[kMTiles][2], rescale[kMTiles][2];
    new_max<false, kLazyLog2, kKeep>(s, scale_log2, ref, rescale);
    rescale_output_for<kLazyLog2, kKeep>(o, rescale);
    exponentiate<Exp>(s, ref, rescale, scale_log2);
  }

  // Step 1: the running max m takes in tile s; per row, the reference the tile's exponents are
  // taken against and the factor the earlier output and l are rescaled by (exactly 1 when the max
  // did not change; 0 when the row had seen no key before).
  // kTree: the tile's max as a pairwise tree (depth log2(2 kNTiles)) instead of one serial
  // chain (depth kNTiles): the same maximum (max is exact in any order), a shorter latency for
  // kernels whose row max sits on the critical path between S landing and the exponentials
  // (sm90/fwd_consumer.h, FwdTraits kMaxTree), at the cost of more values live at once.
  // kLazyLog2 = b > 0: a lazy reference. m is then the reference the row's exponents are taken
  // against, not its running max: it moves (to the running max, with the rescale of l and o)
  // only where the tile's max passes it by more than 2^b in p, (s_max - m) scale_log2 > b; else
  // the row keeps it, with rescale exactly 1, and its p reach at most 2^b (b <= 15: a 16-bit P
  // and the fp32 sums hold them; l and o grow by the same factor, so o / l and the log-sum-exp
  // m scale_log2 + log2 l are the same numbers up to rounding). Once a row's first key blocks
  // have set it, later blocks rarely pass it by 2^b, so a warp whose rows all keep theirs skips
  // the rescale of o (rescale_output_for). A row's largest p is then 2^r, 0 <= r <= b, instead
  // of exactly 1: exactness (the header's) holds as before, every exponent still a difference of
  // two raw scores.
  // kKeep (with kLazyLog2 = 0): the running max, but a row whose max the tile did not raise takes
  // the factor 1 without its exponential (m_new > m is false; for a row with no key so far
  // -inf > -inf is false too), so that a warp whose rows all kept theirs can skip o's rescale
  // (rescale_output_for): the same reference, exponents and P as the running max's, every
  // skipped multiply one by exactly 1. Once a long row's first key blocks have seen its largest
  // scores, later ones rarely raise it (a random row's new max sits in block j with probability
  // 1 / j), so the skip comes more often the longer the row.
  template <bool kTree = false, int kLazyLog2 = 0, bool kKeep = false, int kNTiles>
  __device__ __forceinline__ void new_max(const float (&s)[kMTiles][kNTiles][4], float scale_log2,
                                          float (&ref)[kMTiles][2],
                                          float (&rescale)[kMTiles][2]) {
    static_assert(kLazyLog2 >= 0 && kLazyLog2 <= 15,
                  "p below 2^15: 16-bit P and fp32 sums hold it");
    static_assert(!kKeep || kLazyLog2 == 0, "kKeep is the running max's");
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        // Serial max / sum chains: measured on the H200 against 4 independent chains, equal
        // at d = 64 and 256 and 1-2% faster at d = 128 (fewer live registers; the sm80 kernel).
        float m_new = m[mt][hr];
        if constexpr (kTree) {
          float v[kNTiles];
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) v[nt] = fmaxf(s[mt][nt][hr * 2], s[mt][nt][hr * 2 + 1]);
#pragma unroll
          for (int stride = 1; stride < kNTiles; stride *= 2) {
#pragma unroll
            for (int i = 0; i + stride < kNTiles; i += 2 * stride) v[i] = fmaxf(v[i], v[i + stride]);
          }
          m_new = fmaxf(m_new, v[0]);
        } else {
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            m_new = fmaxf(m_new, fmaxf(s[mt][nt][hr * 2], s[mt][nt][hr * 2 + 1]));
          }
        }
        m_new = quad_max(m_new);
        // Always to the running max; lazily only where m_new = max(m, tile's max) passes m by
        // more than 2^b in p (false for a row with no key so far: -inf - -inf is NaN, which
        // keeps m = -inf and the reference 0).
        const bool move =
            kLazyLog2 > 0 ? (m_new - m[mt][hr]) * scale_log2 > static_cast<float>(kLazyLog2)
                          : !kKeep || m_new > m[mt][hr];
        const float m_ref = move ? m_new : m[mt][hr];
        ref[mt][hr] = m_ref == -INFINITY ? 0.f : m_ref;
        rescale[mt][hr] = move ? ptx::ex2_approx((m[mt][hr] - ref[mt][hr]) * scale_log2) : 1.f;
        m[mt][hr] = m_ref;
      }
    }
  }

  // Step 1 on raw scores whose score units come from a monotone map applied afterwards
  // (softcap's t = tanh(s * pre), problem/score_mod.h): the row max is taken over the raw s and
  // mapped once per row, cap(max s) = max cap(s), so the max reduction does not wait for the
  // map of every score (sm90/fwd_consumer.h runs the SFU's tanh stream beside it). The caller
  // maps the tile before exponentiate (and masks it again: the map of a masked -inf is not -inf);
  // cap(-inf) must be -inf, a row with no key so far then takes 0 as its reference as in
  // new_max. The same-input-same-output map gives the row's largest score the exponent of the
  // plain path; a map that is monotone only to within its rounding (MUFU.TANH) leaves other
  // exponents at most that rounding above 0.
  template <int kNTiles, typename Cap>
  __device__ __forceinline__ void new_max_capped(const float (&s)[kMTiles][kNTiles][4],
                                                 float scale_log2, float (&ref)[kMTiles][2],
                                                 float (&rescale)[kMTiles][2], const Cap& cap) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float tile_max = fmaxf(s[mt][0][hr * 2], s[mt][0][hr * 2 + 1]);
#pragma unroll
        for (int nt = 1; nt < kNTiles; ++nt) {
          tile_max = fmaxf(tile_max, fmaxf(s[mt][nt][hr * 2], s[mt][nt][hr * 2 + 1]));
        }
        const float m_new = fmaxf(m[mt][hr], cap(quad_max(tile_max)));
        ref[mt][hr] = m_new == -INFINITY ? 0.f : m_new;
        rescale[mt][hr] = ptx::ex2_approx((m[mt][hr] - ref[mt][hr]) * scale_log2);
        m[mt][hr] = m_new;
      }
    }
  }

  // Step 2: o *= rescale, row by row.
  template <int kDTiles>
  __device__ __forceinline__ static void rescale_output(float (&o)[kMTiles][kDTiles][4],
                                                        const float (&rescale)[kMTiles][2]) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][dt][e] *= rescale[mt][e / 2];
  }

  // Step 2 for new_max's kLazyLog2 / kKeep (the same arguments): behind a lazy reference
  // (kLazyLog2 > 0) or on the running max with kKeep, skipped by a warp whose rows all kept
  // theirs (every factor exactly 1, so the multiplies would change nothing; the whole warp must
  // call it: a vote); else rescale_output.
  template <int kLazyLog2, bool kKeep, int kDTiles>
  __device__ __forceinline__ static void rescale_output_for(float (&o)[kMTiles][kDTiles][4],
                                                            const float (&rescale)[kMTiles][2]) {
    if constexpr (kLazyLog2 > 0 || kKeep) {
      bool any = false;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        any = any || rescale[mt][0] != 1.f || rescale[mt][1] != 1.f;
      }
      if (!__any_sync(0xffffffffu, any)) return;
    }
    rescale_output(o, rescale);
  }

  // Step 3: s -> p in place against ref; l = l * rescale + the tile's row sums. `after` (a
  // functor, no arguments) runs once the exponentials are done, inlined at the end of each arm of
  // the kWarpFused vote (exponentiate_mapped), so that work independent of P's last values sits
  // in the exponentials' basic block, where ptxas may issue it among the MUFU.EX2 (sm90/
  // fwd_consumer.h FwdTraits kTailInExp: the wait for P V, O's rescale and P's pack).
  template <typename Exp = DefaultExp, int kNTiles, typename After = NoAfter>
  __device__ __forceinline__ void exponentiate(float (&s)[kMTiles][kNTiles][4],
                                               const float (&ref)[kMTiles][2],
                                               const float (&rescale)[kMTiles][2],
                                               float scale_log2, const After& after = After{}) {
    exponentiate_mapped<Exp>(s, ref, rescale, scale_log2, [](float x) { return x; }, after);
  }

  // exponentiate of map(s) instead of s: a monotone score map (softcap's tanh, with ref from
  // new_max_capped) applied element by element in the exponentials' own loop, so that each
  // score's map and exponential issue together (sm90/fwd_consumer.h FwdTraits kCapInterleave)
  // rather than as two passes over the tile. `after`: exponentiate's.
  template <typename Exp, int kNTiles, typename Map, typename After = NoAfter>
  __device__ __forceinline__ void exponentiate_mapped(float (&s)[kMTiles][kNTiles][4],
                                                      const float (&ref)[kMTiles][2],
                                                      const float (&rescale)[kMTiles][2],
                                                      float scale_log2, const Map& map,
                                                      const After& after = After{}) {
    if constexpr (Exp::kWarpFused) {
      constexpr float kBound = static_cast<float>(1 << Exp::kWarpFusedLog2);
      bool small = true;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) small = small && fabsf(ref[mt][hr] * scale_log2) < kBound;
      if (__all_sync(0xffffffffu, small)) {
        exponentiate_mapped<ExpPolicy<Exp::kPolyEighths, true, 0, Exp::kSumTree>>(
            s, ref, rescale, scale_log2, map, after);
      } else {
        exponentiate_mapped<ExpPolicy<Exp::kPolyEighths, false, 0, Exp::kSumTree>>(
            s, ref, rescale, scale_log2, map, after);
      }
    } else {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          float row_sum = 0.f;
          [[maybe_unused]] const float ref_log2 = -ref[mt][hr] * scale_log2;
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            const bool poly = nt % 8 >= 8 - Exp::kPolyEighths;
            float x[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float v = map(s[mt][nt][hr * 2 + e]);
              x[e] = Exp::kFusedExponent ? fmaf(v, scale_log2, ref_log2)
                                         : (v - ref[mt][hr]) * scale_log2;
            }
            float p[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) p[e] = poly ? exp2_fma(x[e]) : ptx::ex2_approx(x[e]);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              s[mt][nt][hr * 2 + e] = p[e];
              if constexpr (!Exp::kSumTree) row_sum += p[e];
            }
          }
          if constexpr (Exp::kSumTree) {
            float v[kNTiles];
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) v[nt] = s[mt][nt][hr * 2] + s[mt][nt][hr * 2 + 1];
#pragma unroll
            for (int stride = 1; stride < kNTiles; stride *= 2) {
#pragma unroll
              for (int i = 0; i + stride < kNTiles; i += 2 * stride) v[i] += v[i + stride];
            }
            row_sum = v[0];
          }
          l[mt][hr] = fmaf(l[mt][hr], rescale[mt][hr], row_sum);
        }
      }
      after();
    }
  }

  // The bounded reference (problem/score_mod.h, ScoreScale::bounded_ref): for scores known to
  // lie in [-1, 1] (softcap alone), m is fixed at the first key block a row meets as
  // max(that block's max, floor) and every later block is exponentiated against it with
  // exponentiate(s, m, ones): no max, no quad reduction, no rescale of l or of the output. The
  // exponents may then be positive (up to (1 - floor) * scale_log2 = 64); finalize's LSE m *
  // score_scale + ln(l) and the backward's RowStats hold with any reference.
  template <int kNTiles>
  __device__ __forceinline__ void fix_reference(const float (&s)[kMTiles][kNTiles][4],
                                                float floor) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float m_new = floor;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          m_new = fmaxf(m_new, fmaxf(s[mt][nt][hr * 2], s[mt][nt][hr * 2 + 1]));
        }
        m[mt][hr] = quad_max(m_new);
      }
    }
  }

  // exponentiate against the fixed reference (after fix_reference); l sums the fp32 P, for the
  // LSE and the RowStats (what the backward recomputes). The output needs a second sum: with the
  // running max the row's largest P is exactly 1, against a fixed reference no P is, so O / l
  // would scale a row whose weight sits on one key (an attention sink) by that P's bf16 rounding
  // (up to 2^-9: 1.6e-2 on v ~ 4 on the H200, where PyTorch's bf16 softmax is exact). The caller
  // sums the 16-bit P its P V product reads (sm80/fwd_kernel.h: one more MMA against a ones
  // column, exact and in fp32) and hands those sums to finalize as used_sums, so O is a convex
  // combination of V's rows in exactly the weights used. (l over the rounded P alone would move
  // the error into the LSE: dv off by 2^-9 in the same case, softcap 1.5 rows' LSE 2.6x the
  // bf16 reference's error.)
  // `after`: exponentiate's (the sm90a forward's kTwoP passes P's pack).
  template <typename Exp = DefaultExp, int kNTiles, typename After = NoAfter>
  __device__ __forceinline__ void exponentiate_fixed(float (&s)[kMTiles][kNTiles][4],
                                                     float scale_log2,
                                                     const After& after = After{}) {
    float ones[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) ones[mt][0] = ones[mt][1] = 1.f;
    exponentiate<Exp>(s, m, ones, scale_log2, after);
  }

  // Reduces l across the quad and gives, per row: 1/l (0 for a row that saw no key), the
  // natural-log LSE m * score_scale + ln(l) (problem/score_mod.h: score units) (+inf for a row that saw no key; finite otherwise,
  // since the max score contributes exactly 1 to l) and the RowStats for the backward.
  // used_sums (the bounded reference, exponentiate_fixed): per row, the whole row's sum of the
  // P the P V product read; 1 / l is then of those.
  __device__ __forceinline__ void finalize(float score_scale, float (&inv_l)[kMTiles][2],
                                           float (&lse)[kMTiles][2],
                                           RowStats (&stats)[kMTiles][2],
                                           const float (*used_sums)[2] = nullptr) const {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const float sum = quad_sum(l[mt][hr]);
        const bool empty = !(sum > 0.f);
        const float used = used_sums != nullptr ? used_sums[mt][hr] : sum;
        inv_l[mt][hr] = empty || !(used > 0.f) ? 0.f : 1.f / used;
        lse[mt][hr] = empty ? INFINITY : m[mt][hr] * score_scale + logf(sum);
        stats[mt][hr].row_max = empty ? INFINITY : m[mt][hr];
        stats[mt][hr].log2_sum = empty ? 0.f : log2f(sum);
      }
    }
  }
};

}  // namespace flashattn_cu
