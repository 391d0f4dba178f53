// Score modifiers: softcap and ALiBi, on every score tile of every kernel, in flash_attn's order
// (the softcap on the scaled score, then ALiBi's bias, then the mask).
//
// Score units. The kernels form exponents as (s - M) * scale_log2 and never scale a tile, so a
// modifier works in the units of s:
//   no softcap:   s = q.k,                                    scale_log2 = softmax_scale log2(e)
//   softcap c:    s = tanh(q.k * softmax_scale / c) (in [-1, 1]), scale_log2 = c log2(e)
// and the logit is s * score_scale (score_scale = softmax_scale, or c): ALiBi's bias is divided
// by score_scale, the LSE is M * score_scale + ln(l), and the backward's scaling of dS by
// softmax_scale stays as it is, because d(logit)/d(q.k) = softmax_scale (1 - t^2) with softcap
// (t the capped score), softmax_scale without.
//
// Score tiles are mma C fragments (problem/mask.h): s[mt][nt][hr * 2 + e] is row (row0 + mt * 16
// + g + hr * 8), key (col0 + nt * 8 + 2t + e); transposed tiles s[nt][hr * 2 + e] are key (key0
// + g + hr * 8), query (query0 + nt * 8 + 2t + e); g = lane / 4, t = lane % 4.
#pragma once

#include <math.h>

#include "flashattn_cu/flashattn_cu.h"

#include "../ptx/math.h"
#include "mask.h"
#include "seqlen.h"

namespace flashattn_cu {

constexpr float kLog2e = 1.4426950408889634f;

// The constants of the score units above, built on the host from the public params; every
// kernel's parameters hold one (FwdKernelParams::score, BwdKernelParams::score).
struct ScoreScale {
  float scale_log2;      // exponents are (s - M) * scale_log2: score_scale * log2(e)
  float score_scale;     // logit = s * score_scale
  float softcap_pre;     // softmax_scale / softcap, 0 without softcap
  float inv_scale_log2;  // 1 / scale_log2 (softcap_grad)
  // The bounded reference of softcap's forward (common/softmax.h, OnlineSoftmax::fix_reference):
  // whether a softcap-only bf16 forward may take it, and its floor in score units.
  bool bounded_ref;
  float ref_floor;
};

// Softcap bounds every score to [-1, 1] (score units), so a forward can take each row's
// exponents against one reference fixed at its first key block, R = max(first block's max,
// ref_floor), and never rescale (common/softmax.h). The exponents (s - R) * scale_log2 then lie
// in [-2 scale_log2, (1 - ref_floor) scale_log2]: with ref_floor = 1 - kBoundedRefHeadroom /
// scale_log2 at most 2^64 (P, l and the fp32 output accumulators stay far from overflow), and a
// row's largest exponent is at least -2 scale_log2 + 64. That largest P must keep its P V
// products normal fp32 (the tensor cores flush subnormal products: measured on the H200, a row of
// logits all near -softcap at softcap 65 with |V| ~ 1e-3 came out 0), so it is held at 2^-88 or
// more (products normal for |V| >= 2^-38): scale_log2 <= kMaxBoundedScaleLog2 (softcap <= 52.7;
// Gemma 2's 50, Grok's 30; it was 65.8, P down to 2^-124, before the H200 test). P is then 16-bit
// with 2^64 .. 2^-126 in range: bf16 only (fp16's P would overflow / underflow). The sm80 forward
// takes it (softcap d = 128 on the H200: 0.88-0.90 of plain attention -> 0.94-0.97); the sm90
// forward keeps the running max (there it gained ~3%, within the run-to-run spread: its softmax
// already overlaps the other warpgroup's GEMMs; benchmarks/NOTES.md section 10).
constexpr float kBoundedRefHeadroom = 64.f;
constexpr float kBoundedLargestPLog2 = -88.f;  // a row's largest P at least 2^-88
constexpr float kMaxBoundedScaleLog2 = (kBoundedRefHeadroom - kBoundedLargestPLog2) / 2.f;

inline ScoreScale score_scale_of(const AttnParams& p) {
  ScoreScale r;
  r.score_scale = p.softcap > 0.f ? p.softcap : p.softmax_scale;
  r.scale_log2 = r.score_scale * kLog2e;
  r.softcap_pre = p.softcap > 0.f ? p.softmax_scale / p.softcap : 0.f;
  r.inv_scale_log2 = 1.f / r.scale_log2;
  r.bounded_ref = p.softcap > 0.f && p.dtype == DType::kBFloat16 &&
                  r.scale_log2 <= kMaxBoundedScaleLog2;
  r.ref_floor = 1.f - kBoundedRefHeadroom / r.scale_log2;
  return r;
}

// s <- tanh(s * softmax_scale / softcap), on any score tile (MUFU.TANH: its relative error
// 2^-11 moves a logit by at most softcap * 2^-11, flash_attn's kernels' error too).
template <int kN>
__device__ __forceinline__ void apply_softcap(float (&s)[kN][4], float pre) {
#pragma unroll
  for (int i = 0; i < kN; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[i][e] = ptx::tanh_approx(s[i][e] * pre);
}
template <int kM, int kN>
__device__ __forceinline__ void apply_softcap(float (&s)[kM][kN][4], float pre) {
#pragma unroll
  for (int i = 0; i < kM; ++i) apply_softcap(s[i], pre);
}

// ALiBi (flashattn_cu.h, AttnParams::alibi_slopes) in score units: slope / score_scale. Needs no
// term in the backward beyond recomputing P with it, except under softcap (softcap_grad).
struct Alibi {
  float slope;  // slope / score_scale
  int shift;    // seqlen_k - seqlen_q: row i's diagonal key is i + shift
  bool linear;  // causal without a left window: + slope * key

  __device__ __forceinline__ float bias(int row, int key) const {
    return linear ? slope * static_cast<float>(key)
                  : -slope * fabsf(static_cast<float>(row + shift - key));
  }

  // The bias of a whole tile from one conversion per tile: an element's diagonal distance
  // (row + shift - key) is base + off, base = float(this lane's first row + shift - first key)
  // (one I2F), off a compile-time integer of the element's fragment position, and its key is
  // float(first key) + koff alike. base + off is exact (integers below 2^24: the value the
  // per-element conversion gave), and the elements of one off share it: the compiler forms each
  // distinct base + off once (38 for a thread's 128 scores of a 128 x 128 forward tile, 2 x
  // (kQTiles + 1) for the 4 kQTiles of a transposed one; linear: one per key), so a score costs
  // one FFMA.
  template <int kMTiles, int kNTiles>
  __device__ __forceinline__ void apply(float (&s)[kMTiles][kNTiles][4], int row0, int col0,
                                        int lane) const {
    const int g = lane / 4, t = lane % 4;
    const int key_base = col0 + 2 * t;
    if (linear) {
      const float kb = static_cast<float>(key_base);
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float key = kb + static_cast<float>(nt * 8 + e);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr)
              s[mt][nt][hr * 2 + e] = fmaf(slope, key, s[mt][nt][hr * 2 + e]);
        }
    } else {
      const float base = static_cast<float>(row0 + g + shift - key_base);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              s[mt][nt][hr * 2 + e] = fmaf(
                  -slope, fabsf(base + static_cast<float>(mt * 16 + hr * 8 - nt * 8 - e)),
                  s[mt][nt][hr * 2 + e]);
    }
  }

  // Transposed tiles: s[nt][hr * 2 + e] is key (key0 + g + 8 hr), query (query0 + 8 nt + 2t + e).
  // Branch-free, two FFMA per score (transposed_terms): with the two forms as branches, as on row
  // tiles, the backward kernels held both forms' values and spilled more (sm_90a bwd d = 128:
  // 64 bytes against 0).
  template <int kQTiles>
  __device__ __forceinline__ void apply_transposed(float (&s)[kQTiles][4], int key0, int query0,
                                                   int lane) const;
};

// ALiBi's bias on a transposed tile, for the lane's keys key_g + 8 hr (key_g = key0 + g) and
// queries query0 + 8 nt + 2t + e: key_coef * (key + 8 hr) + dist_coef * |dist + 8 nt + e - 8 hr|,
// one of the two coefficients 0 (linear: slope and 0, else 0 and -slope; both 0 for no bias).
// dist + offset is exact (integers below 2^24) and shared by the scores of one offset.
struct AlibiTransposedTerms {
  float key_coef;
  float dist_coef;
  float key;   // float(key_g)
  float dist;  // float(query0 + 2t + shift - key_g)

  __device__ __forceinline__ float key_term(int hr) const {
    return key_coef * (key + static_cast<float>(hr * 8));
  }
  __device__ __forceinline__ float dist_abs(int nt, int hr, int e) const {
    return fabsf(dist + static_cast<float>(nt * 8 + e - hr * 8));
  }
  __device__ __forceinline__ float bias(int nt, int hr, int e) const {
    return fmaf(dist_coef, dist_abs(nt, hr, e), key_term(hr));
  }
};

__device__ __forceinline__ AlibiTransposedTerms transposed_terms(const Alibi& a, int key_g,
                                                                 int query0, int t) {
  AlibiTransposedTerms r;
  r.key_coef = a.linear ? a.slope : 0.f;
  r.dist_coef = a.linear ? 0.f : -a.slope;
  r.key = static_cast<float>(key_g);
  r.dist = static_cast<float>(query0 + 2 * t + a.shift - key_g);
  return r;
}

template <int kQTiles>
__device__ __forceinline__ void Alibi::apply_transposed(float (&s)[kQTiles][4], int key0,
                                                        int query0, int lane) const {
  const int g = lane / 4, t = lane % 4;
  const AlibiTransposedTerms b = transposed_terms(*this, key0 + g, query0, t);
#pragma unroll
  for (int nt = 0; nt < kQTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
        s[nt][hr * 2 + e] = fmaf(b.dist_coef, b.dist_abs(nt, hr, e),
                                 fmaf(b.key_coef, b.key + static_cast<float>(hr * 8),
                                      s[nt][hr * 2 + e]));
}

template <typename Params>
__device__ __forceinline__ Alibi alibi_of(const SeqInfo& seq, const Params& p, int head,
                                          float score_scale) {
  Alibi a;
  a.slope = p.alibi_slopes[seq.batch * p.alibi_slopes_batch_stride + head] / score_scale;
  a.shift = seq.seqlen_k - seq.seqlen_q;
  a.linear = p.is_causal && p.window_left < 0;
  return a;
}

// The ALiBi of entry `batch`, query head `head` for a kernel of variant kVariant (KP:
// FwdKernelParams or BwdKernelParams): the sequence info reads the sequence arrays in the
// variants that have them (all but kStaticAlibiVariant, whose calls are padded).
template <int kVariant, typename KP>
__device__ __forceinline__ Alibi alibi_of(const KP& kp, int batch, int head) {
  return alibi_of(seq_info<variant_seqlens(kVariant)>(kp.p, batch), kp.p, head,
                  kp.score.score_scale);
}

// Whether a kernel of variant kVariant applies softcap / ALiBi: known at compile time, except
// in the dropout and kvcache variants, which take both as run-time branches (problem/mask.h).
template <int kVariant, typename KP>
__device__ __forceinline__ bool softcap_on(const KP& kp) {
  if constexpr (variant_runtime_mods(kVariant)) {
    return kp.score.softcap_pre != 0.f;
  } else {
    return variant_softcap(kVariant);
  }
}
template <int kVariant, typename KP>
__device__ __forceinline__ bool alibi_on(const KP& kp) {
  if constexpr (variant_runtime_mods(kVariant)) {
    return kp.p.alibi_slopes != nullptr;
  } else {
    return variant_alibi(kVariant);
  }
}

// The score modifiers of one (batch, head) for a kernel of variant kVariant (problem/mask.h),
// on row tiles (rows row0 .. (queries), keys col0 ..), in flash_attn's order: softcap, then
// ALiBi's bias (the mask follows in the kernel). Built once where a kernel starts a tile
// (score_mods_of) and held across its key blocks: ALiBi's slope is a global load and a division
// (a MUFU.RCP), which built at the point of use sat on every step's path from S to P (the sm90
// forward's SASS: LDG, MUFU.RCP, FMUL right after the S GEMM's wait). Three registers.
template <int kVariant>
struct ScoreMods {
  Alibi alibi;
  bool alibi_on;

  template <typename KP, int kMTiles, int kNTiles>
  __device__ __forceinline__ void apply(float (&s)[kMTiles][kNTiles][4], const KP& kp, int row0,
                                        int col0, int lane) const {
    if constexpr (variant_may_softcap(kVariant)) {
      if (softcap_on<kVariant>(kp)) apply_softcap(s, kp.score.softcap_pre);
    }
    if constexpr (variant_may_alibi(kVariant)) {
      if (alibi_on) alibi.apply(s, row0, col0, lane);
    }
  }
};

template <int kVariant, typename KP>
__device__ __forceinline__ ScoreMods<kVariant> score_mods_of(const KP& kp, int batch, int head) {
  ScoreMods<kVariant> m{};  // alibi_on false
  if constexpr (variant_may_alibi(kVariant)) {
    m.alibi_on = alibi_on<kVariant>(kp);
    if (m.alibi_on) m.alibi = alibi_of<kVariant>(kp, batch, head);
  }
  return m;
}

// The same built at the point of use, for the kernels whose loops have no registers to hold
// it (the sm80 forward at d 64: ScoreMods held across its loop spilled 4-12 bytes more; the
// dQ and decode kernels not measured). Transposed tiles (the backward main kernels):
// apply_score_mods_transposed below.
template <int kVariant, typename KP, int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_score_mods(float (&s)[kMTiles][kNTiles][4], const KP& kp,
                                                 int batch, int head, int row0, int col0,
                                                 int lane) {
  if constexpr (variant_may_softcap(kVariant)) {
    if (softcap_on<kVariant>(kp)) apply_softcap(s, kp.score.softcap_pre);
  }
  if constexpr (variant_may_alibi(kVariant)) {
    if (alibi_on<kVariant>(kp)) alibi_of<kVariant>(kp, batch, head).apply(s, row0, col0, lane);
  }
}

// capped(s): called on the tile right after the softcap (the capped scores t), before ALiBi.
struct NoCappedHook {
  template <typename T>
  __device__ __forceinline__ void operator()(const T&) const {}
};

template <int kVariant, typename KP, int kQTiles, typename CappedHook = NoCappedHook>
__device__ __forceinline__ void apply_score_mods_transposed(float (&s)[kQTiles][4], const KP& kp,
                                                            int batch, int head, int key0,
                                                            int query0, int lane,
                                                            const CappedHook& capped = {}) {
  if constexpr (variant_may_softcap(kVariant)) {
    if (softcap_on<kVariant>(kp)) {
      apply_softcap(s, kp.score.softcap_pre);
      capped(s);
    }
  }
  if constexpr (variant_may_alibi(kVariant)) {
    if (alibi_on<kVariant>(kp)) {
      alibi_of<kVariant>(kp, batch, head).apply_transposed(s, key0, query0, lane);
    }
  }
}

// The softcap's factor on dS = P (dP - D): 1 - t^2, with t the capped score of this element.
// t is not kept from the recomputation (a second score-sized register array in kernels at 255
// registers); it is recovered from P and the row's (M, L): log2 P = (t + b - M) * scale_log2 - L
// gives t = (log2 P + L) / scale_log2 + M - b, b the element's ALiBi bias in score units (0
// without). P = 0 (masked, or underflowed) gives -inf, clamped to t = -1: factor 0, and dS is 0
// there anyway. From a 16-bit P, t is off by at most 2^-8 / ln 2 / scale_log2 (bf16), i.e.
// 0.004 / softcap: P's own rounding in dS is larger. The sm80 register-path backward keeps
// 1 - t^2 from the tanh instead (common/bwd_math.h, StoredSoftcapGradT); this serves the others.
__device__ __forceinline__ float softcap_grad(float p, float row_max, float row_log2sum,
                                              float inv_scale_log2, float bias) {
  const float t = fmaf(ptx::lg2_approx(p) + row_log2sum, inv_scale_log2, row_max - bias);
  const float c = fminf(fmaxf(t, -1.f), 1.f);
  return fmaf(-c, c, 1.f);
}

// dS factor on transposed tiles (the backward main kernels: rows are keys, columns queries), as
// a functor of (p, nt, hr, e): softcap_grad with the (M, L) of the step's queries from shared
// memory (s_max / s_log2sum at the warp's first query, fp32 per query) and, with ALiBi, the
// bias of (query0 + column, key_g + 8 hr).
template <bool kAlibi>
struct SoftcapGradT {
  const char* s_max;
  const char* s_log2sum;
  float inv_scale_log2;
  int t;
  AlibiTransposedTerms alibi;  // of the lane's keys and the warp's queries; zero: no bias

  __device__ __forceinline__ float operator()(float p, int nt, int hr, int e) const {
    const int col = nt * 8 + 2 * t + e;
    const float m = reinterpret_cast<const float*>(s_max)[col];
    const float l = reinterpret_cast<const float*>(s_log2sum)[col];
    const float b = kAlibi ? alibi.bias(nt, hr, e) : 0.f;
    return softcap_grad(p, m, l, inv_scale_log2, b);
  }
};

// No modifier on dS.
struct UnitGrad {
  __device__ __forceinline__ float operator()(float, int, int, int) const { return 1.f; }
};

// The dropout variant's dS factor: softcap's when the call has a softcap (with ALiBi's bias, or
// a zero slope without ALiBi), else 1.
struct RuntimeSoftcapGradT {
  SoftcapGradT<true> softcap;
  bool on;

  __device__ __forceinline__ float operator()(float p, int nt, int hr, int e) const {
    return on ? softcap(p, nt, hr, e) : 1.f;
  }
};

// The dS factor of kernel variant kVariant on a transposed tile of keys key_g - g .. (key_g: this
// lane's first key) and queries query0 .. of entry `batch`, query head `head`: UnitGrad for the
// variants without softcap. KP: backward::BwdKernelParams (score, p).
template <int kVariant, typename KP>
__device__ __forceinline__ auto ds_grad_t(const KP& kp, int batch, int head, const char* s_max,
                                          const char* s_log2sum, int key_g, int query0, int t) {
  if constexpr (variant_may_softcap(kVariant)) {
    SoftcapGradT<variant_may_alibi(kVariant)> gr;
    gr.s_max = s_max;
    gr.s_log2sum = s_log2sum;
    gr.inv_scale_log2 = kp.score.inv_scale_log2;
    gr.t = t;
    if constexpr (variant_may_alibi(kVariant)) {
      if (alibi_on<kVariant>(kp)) {
        gr.alibi = transposed_terms(alibi_of<kVariant>(kp, batch, head), key_g, query0, t);
      } else {
        gr.alibi = AlibiTransposedTerms{0.f, 0.f, 0.f, 0.f};  // bias 0
      }
    }
    if constexpr (variant_dropout(kVariant)) {
      return RuntimeSoftcapGradT{gr, softcap_on<kVariant>(kp)};
    } else {
      return gr;
    }
  } else {
    return UnitGrad{};
  }
}

}  // namespace flashattn_cu
