// The sm90a forward tuning harness's shared parts (benchmarks/tune/tune_fwd90.cu holds the
// modes, which configurations each times): the buffers and calls of flash_attn's benchmark
// shapes (bf16, 16k tokens, hidden 2048), the sm80 reference, and the three ways a
// configuration is measured: sweep (TFLOP/s, median of g_reps single launches), ab_sweep (two
// configurations interleaved, harness.h ab_ms) and phases (the phase clocks, sm90/fwd_clock.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "sm80/fwd_launch.h"
#include "sm90/fwd_launch.h"
#include "harness.h"

namespace fa = flashattn_cu;

inline int g_sms = 132;  // the device's, set in main
inline int g_l2 = 50 << 20;
inline int g_reps = 20;  // timed repetitions (0: one checked launch, for profiling)
inline bool g_library_schedule = false;  // the library's causal choices (causal_persistent(p),
                                         // causal_order(p)) instead of the two below
inline bool g_causal_persistent = true;  // fwd_schedule's causal choice (run_fwd: causal_persistent), swept in main
inline bool g_defer_light = true;  // launch_fwd_config's defer_light (fwd_defer_m's tile order)
inline int g_causal_order = 0;     // launch_fwd_config's causal_order (fwd_schedule)
// ab_sweep's B side with this SM count (0: g_sms): a count past the tiles gives fwd_schedule's
// grid of one CTA per tile (the hardware's hand-out) instead of the persistent walk.
inline int g_sms_b = 0;
inline bool g_last_aligned = true;  // launch_fwd_config's last_aligned (fwd_m_shift's blocks)
inline int g_shift_tma = -1;  // and its shift_tma: -1 the library's (tiles.h
                              // fwd_shift_tma_store_sm90, shift_tma_of), 0 / 1 forced
inline bool g_balanced = true;      // and its balanced_groups (fwd_launch.h fwd_walk_group)
inline double g_group_cap = fa::kWalkGroupCap;  // and its group_cap (their wider bound)
// The walk modes' A/B (library_order_ab, walk_group_ab): back to back (ab_ms) when 0, else one
// call at a time after emptying the L2 with a flush of this many bytes (ab_ms_flushed, as the
// bench times them).
inline size_t g_ab_flush = 0;

// launch_fwd_config's shift_tma for instance Traits under g_shift_tma.
template <typename Traits>
bool shift_tma_of() {
  return g_shift_tma < 0 ? fa::fwd_shift_tma_store_sm90(Traits::kHeadDim) : g_shift_tma != 0;
}

// The static-variant instance of one sm90 configuration (no other variant is compiled here),
// launched as the library launches it, with the causal schedule of this sweep pass.
template <typename Traits, int kVariant = fa::kStaticVariant>
fa::Status run_sm90(const fa::FwdParams& p) {
  return fa::sm90::launch_fwd_config<__nv_bfloat16, Traits, kVariant>(
      p, g_sms, g_l2, g_library_schedule ? fa::sm90::causal_persistent(p) : g_causal_persistent, 0,
      nullptr, g_defer_light, g_library_schedule ? fa::sm90::causal_order(p) : g_causal_order,
      g_last_aligned, shift_tma_of<Traits>(), g_balanced, g_group_cap);
}

// The reference: the sm80 kernel of the sweep's head dim, launched as the library launches it
// (sm80/fwd_launch.h: the call's variant, the bounded reference where it applies).
template <int kHeadDim>
fa::Status run_sm80(const fa::FwdParams& p) {
  constexpr fa::FwdTile t = fa::fwd_tile_sm80(kHeadDim, false);
  using Traits = fa::sm80::FwdTraits<kHeadDim, t.block_m, t.block_n, t.warps, t.unpredicated_bulk_loads>;
  return fa::sm80::launch_fwd<__nv_bfloat16, Traits>(p, 0);
}

struct Buffers {
  __nv_bfloat16 *q, *k, *v, *o, *o_ref;
  float *lse, *diff, *slopes;
};

// The score modifiers of a sweep (problem/mask.h's variant for each): none, softcap 30, ALiBi
// (slopes 2^(-8 (h + 1) / heads)), both.
// kRunningMax (with kSoftcap): the sm80 kernel takes the bounded reference of bf16 softcap calls
// (problem/score_mod.h) unless kRunningMax tags the call fp16 (score_scale_of then leaves
// bounded_ref off; the kernels' loads move the same 2-byte elements): an A/B on the same data.
// kDynamicPlain: a plain call on the dynamic variant's instance (the one varlen and windows take).
// kStaticMask (with kSoftcap alone): the static mask's softcap instance (problem/mask.h
// kStaticSoftcapVariant), which the library takes for padded calls without a window; (with
// kAlibi alone) the static mask's ALiBi instance (kStaticAlibiVariant), likewise; (with
// kWindow1k) the padded window instance (kPaddedWindowVariant).
enum Mods {
  kNoMods = 0, kSoftcap = 1, kAlibi = 2, kBoth = 3, kWindow1k = 4, kRunningMax = 8,
  kDynamicPlain = 16, kStaticMask = 32
};
constexpr int variant_of(int mods) {
  return mods == (kSoftcap | kStaticMask) ? fa::kStaticSoftcapVariant
         : mods == (kAlibi | kStaticMask)       ? fa::kStaticAlibiVariant
         : mods == (kWindow1k | kStaticMask)     ? fa::kPaddedWindowVariant
         : mods == kWindow1k || mods == kDynamicPlain ? fa::kDynamicVariant
         : (mods & ~kRunningMax) == kSoftcap ? fa::kSoftcapVariant
         : mods == kAlibi ? fa::kAlibiVariant
         : mods == kBoth  ? fa::kAlibiSoftcapVariant
                          : fa::kStaticVariant;
}

inline fa::FwdParams make_params(const Buffers& b, int d, int seqlen, bool causal) {
  fa::FwdParams p;
  p.batch = 16384 / seqlen;
  p.num_heads = p.num_heads_k = 2048 / d;
  p.seqlen_q = p.seqlen_k = seqlen;
  p.head_dim = d;
  p.q = b.q;
  p.k = b.k;
  p.v = b.v;
  p.o = b.o;
  p.lse = b.lse;
  const int64_t row = static_cast<int64_t>(p.num_heads) * d;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = row;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = row * seqlen;
  p.softmax_scale = 1.f / std::sqrt(static_cast<float>(d));
  p.is_causal = causal;
  p.dtype = fa::DType::kBFloat16;
  return p;
}

// A sweep's call at one shape: make_params with the modifiers of kMods (softcap 30, ALiBi,
// the fp16 tag, window (1024, 0)); false for a window mode's non-causal pass, which is skipped.
inline bool mods_params(const Buffers& b, int d, int seqlen, bool causal, int mods,
                        fa::FwdParams* p) {
  *p = make_params(b, d, seqlen, causal);
  if (mods & kSoftcap) p->softcap = 30.f;
  if (mods & kAlibi) p->alibi_slopes = b.slopes;
  if (mods & kRunningMax) p->dtype = fa::DType::kFloat16;
  if (mods & kWindow1k) {  // window (1024, 0): causal, 1024 keys to the left
    p->window_left = 1024;
    p->window_right = 0;
    if (!causal) return false;
  }
  return true;
}

// The call's FLOP count: flash_attn's (causal halves it), or the entries a window covers.
inline double call_flops(const fa::FwdParams& p, int mods) {
  const double seqlen = p.seqlen_q;
  if (mods & kWindow1k) {
    return 4.0 * p.batch * p.num_heads * p.head_dim * (1025.0 * seqlen - 1025.0 * 1024 / 2);
  }
  return 4.0 * p.batch * p.num_heads * seqlen * seqlen * p.head_dim / (p.is_causal ? 2 : 1);
}

// The sm80 kernel's output of the call into b.o_ref (the reference of checked_diff).
template <int kHeadDim>
void reference_output(const Buffers& b, fa::FwdParams p) {
  p.o = b.o_ref;
  if (run_sm80<kHeadDim>(p) != fa::Status::kSuccess) std::printf("sm80 launch failed\n");
}

// One launch of `run` (call p, writing b.o, NaN-poisoned first), then max|o - o_ref| over the
// call's rows (batch x seqlen_q of them: fewer than the buffers' 16k where 16k tokens do not
// divide into whole sequences); *st its status (the diff is INFINITY when the launch failed).
template <typename Run>
float checked_diff(const Buffers& b, const fa::FwdParams& p, const Run& run, fa::Status* st) {
  const size_t n = static_cast<size_t>(p.batch) * p.seqlen_q * p.o_row_stride;
  CHECK(cudaMemset(b.o, 0xff, n * 2));  // NaN poison
  *st = run();
  CHECK(cudaDeviceSynchronize());
  if (*st != fa::Status::kSuccess) return INFINITY;
  return max_diff(b.o, b.o_ref, n, b.diff);
}

template <int kHeadDim, typename Traits, int kMods = kNoMods>
void sweep(const char* name, const Buffers& b, bool with_non_causal,
           std::vector<int> seqlens = {1024, 4096, 8192, 16384}) {
  constexpr int kVariant = variant_of(kMods);
  for (int causal = with_non_causal ? 0 : 1; causal < 2; ++causal) {
    for (int seqlen : seqlens) {
      fa::FwdParams p;
      if (!mods_params(b, kHeadDim, seqlen, causal, kMods, &p)) continue;
      reference_output<kHeadDim>(b, p);
      p.o = b.o;
      fa::Status st;
      const float diff = checked_diff(b, p, [&] { return run_sm90<Traits, kVariant>(p); }, &st);
      if (st != fa::Status::kSuccess) {
        std::printf("%-26s d=%3d s=%5d c=%d: launch failed (%d)\n", name, kHeadDim, seqlen, causal,
                    static_cast<int>(st));
        continue;
      }
      if (g_reps == 0) {
        std::printf("%-26s d=%3d s=%5d c=%d: max|diff| %.2e%s\n", name, kHeadDim, seqlen, causal,
                    diff, diff < 2e-2 ? "" : "  WRONG");
        continue;
      }
      const float ms = median_ms([&] { run_sm90<Traits, kVariant>(p); }, g_reps);
      const float ms80 = median_ms([&] { run_sm80<kHeadDim>(p); }, 10);
      const double flops = call_flops(p, kMods);
      std::printf("%-26s d=%3d s=%5d c=%d: %6.1f TFLOP/s (sm80 %6.1f)  max|diff| %.2e%s\n", name,
                  kHeadDim, seqlen, causal, flops / ms * 1e-9, flops / ms80 * 1e-9, diff,
                  diff < 2e-2 ? "" : "  WRONG");
      std::fflush(stdout);
    }
  }
}

// Two configurations of one variant on the same calls, each output checked against the sm80
// kernel's, then timed interleaved (harness.h ab_ms: 30 rounds of 4 back-to-back calls each):
// A's and B's TFLOP/s and the median of B's time / A's over the rounds (< 1: B faster).
// schedule_ab: A and B the same configuration (TraitsA), A without fwd_defer_m's tile order, B
// with it. with_causal false: the non-causal calls alone. g_sms_b: B's grid rule. kModsB >= 0: B runs the variant of kModsB on kMods's calls (the same parameters: e.g.
// kWindow1k's dynamic instance against kWindow1k | kStaticMask's padded window one).
template <int kHeadDim, typename TraitsA, typename TraitsB, int kMods = kNoMods, int kModsB = -1>
void ab_sweep(const char* name, const Buffers& b, bool with_non_causal, std::vector<int> seqlens,
              bool schedule_ab = false, bool with_causal = true) {
  constexpr int kVariant = variant_of(kMods);
  constexpr int kVariantB = kModsB >= 0 ? variant_of(kModsB) : kVariant;
  for (int causal = with_non_causal ? 0 : 1; causal < (with_causal ? 2 : 1); ++causal) {
    for (int seqlen : seqlens) {
      fa::FwdParams p;
      if (!mods_params(b, kHeadDim, seqlen, causal, kMods, &p)) continue;
      reference_output<kHeadDim>(b, p);
      p.o = b.o;
      // Configuration A or B, with the tile order schedule_ab gives it.
      auto run = [&](bool is_b) {
        g_defer_light = !schedule_ab || is_b;
        const int sms = g_sms;
        if (is_b && g_sms_b > 0) g_sms = g_sms_b;
        const fa::Status st = is_b && !schedule_ab ? run_sm90<TraitsB, kVariantB>(p)
                                                   : run_sm90<TraitsA, kVariant>(p);
        g_sms = sms;
        return st;
      };
      float diffs[2];
      bool failed = false;
      for (int which = 0; which < 2; ++which) {
        fa::Status st;
        diffs[which] = checked_diff(b, p, [&] { return run(which == 1); }, &st);
        if (st != fa::Status::kSuccess) {
          std::printf("%-24s d=%3d s=%5d c=%d: launch %c failed\n", name, kHeadDim, seqlen, causal,
                      which == 0 ? 'A' : 'B');
          failed = true;
        }
      }
      if (failed) continue;
      const AbTimes t = ab_ms([&] { run(false); }, [&] { run(true); }, 30, 4);
      g_defer_light = true;
      const double flops = call_flops(p, kMods);
      const bool wrong = !(diffs[0] < 2e-2f) || !(diffs[1] < 2e-2f);
      std::printf("%-24s d=%3d s=%5d c=%d: A %6.1f  B %6.1f TFLOP/s  B/A time %.3f  max|diff| %.1e %.1e%s\n",
                  name, kHeadDim, seqlen, causal, flops / t.a_ms * 1e-9, flops / t.b_ms * 1e-9,
                  t.b_over_a, diffs[0], diffs[1], wrong ? "  WRONG" : "");
      std::fflush(stdout);
    }
  }
}

// Where a tile's time goes (sm90/fwd_clock.h): the library configuration of a shape built with
// kStamps, launched as the library launches it (its causal schedule), once after three warm-up
// calls; the consumers' phase cycles summed over all CTAs and divided by the tiles, and one
// step's cycles (the steps phase over the key blocks past each tile's first). The stamped
// kernel's TFLOP/s beside (the clock reads cost a little). kMods: the call's modifiers and the
// variant they select (variant_of), plain attention by default.
template <int kHeadDim, typename Traits, int kMods = kNoMods>
void phases(const char* name, const Buffers& b, unsigned long long* stamps, size_t stamp_slots,
            int seqlen, bool causal) {
  static_assert(Traits::kStamps, "a configuration with the phase clocks");
  namespace sm90 = fa::sm90;
  fa::FwdParams p;
  if (!mods_params(b, kHeadDim, seqlen, causal, kMods, &p)) return;
  const bool persistent = sm90::causal_persistent(p);
  const int64_t tiles =
      fa::query_tile_count(fa::ceil_div(p.seqlen_q, Traits::kBlockM), p.batch, p.num_heads);
  const int grid = sm90::fwd_schedule(p, tiles, g_sms, g_l2, persistent).grid;
  const size_t slots = size_t{1} * grid * Traits::kConsumers * sm90::kFwdClockSlots;
  if (slots > stamp_slots) {
    std::printf("%s: %d CTAs, more than the stamp buffer holds\n", name, grid);
    return;
  }
  auto launch = [&] {
    return sm90::launch_fwd_config<__nv_bfloat16, Traits, variant_of(kMods)>(p, g_sms, g_l2,
                                                                              persistent, 0, stamps);
  };
  for (int i = 0; i < 4; ++i) {
    if (launch() != fa::Status::kSuccess) {
      std::printf("%s: launch failed\n", name);
      return;
    }
  }
  CHECK(cudaDeviceSynchronize());
  std::vector<unsigned long long> h(slots);
  CHECK(cudaMemcpy(h.data(), stamps, slots * 8, cudaMemcpyDeviceToHost));
  double sums[sm90::kFwdPhases] = {}, n_tiles = 0, n_blocks = 0, walk = 0;
  for (size_t c = 0; c < slots / sm90::kFwdClockSlots; ++c) {
    const unsigned long long* at = h.data() + c * sm90::kFwdClockSlots;
    for (int k = 0; k < sm90::kFwdPhases; ++k) sums[k] += double(at[k]);
    n_tiles += double(at[sm90::kFwdPhases]);
    n_blocks += double(at[sm90::kFwdPhases + 1]);
    walk += double(at[sm90::kFwdPhases + 2]);
  }
  const float ms = median_ms([&] { launch(); }, g_reps);
  const double flops = call_flops(p, kMods);
  const double per = n_tiles > 0 ? 1.0 / n_tiles : 0.0;  // per consumer tile
  const double step = n_blocks > n_tiles ? sums[sm90::kPhaseSteps] / (n_blocks - n_tiles) : 0.0;
  double parts[sm90::kFwdStepParts] = {};  // a step's parts, per step past each tile's first
  for (size_t c = 0; c < slots / sm90::kFwdClockSlots; ++c) {
    for (int k = 0; k < sm90::kFwdStepParts; ++k) {
      parts[k] += double(h[c * sm90::kFwdClockSlots + sm90::kFwdPhases + 3 + k]);
    }
  }
  for (double& v : parts) v = n_blocks > n_tiles ? v / (n_blocks - n_tiles) : 0.0;
  std::printf("%-18s d=%3d s=%5d c=%d grid=%5d %s: %6.1f TFLOP/s, %5.2f blocks a tile; cycles a "
              "tile: schedule %5.0f, Q wait %5.0f, first K %5.0f, first step %5.0f, steps %6.0f "
              "(%5.0f a step), last P V %5.0f, epilogue %5.0f; walk %6.0f a tile\n",
              name, kHeadDim, seqlen, int(causal), grid, persistent || !causal ? "persistent" : "per tile",
              flops / ms * 1e-9, n_blocks * per, sums[sm90::kPhaseSchedule] * per,
              sums[sm90::kPhaseQWait] * per, sums[sm90::kPhaseFirstK] * per,
              sums[sm90::kPhaseFirstStep] * per, sums[sm90::kPhaseSteps] * per, step,
              sums[sm90::kPhaseLastPV] * per, sums[sm90::kPhaseEpilogue] * per, walk * per);
  std::printf("%-18s   a step's parts (cycles): K/V wait %5.0f, turn %5.0f, S issued and landed "
              "%5.0f, row max %5.0f, exponentials %5.0f, P V wait %5.0f, rescale and pack %5.0f\n",
              "", parts[sm90::kStepWaitKV], parts[sm90::kStepTurn], parts[sm90::kStepS],
              parts[sm90::kStepMax], parts[sm90::kStepExp], parts[sm90::kStepWaitPV],
              parts[sm90::kStepPack]);
  std::fflush(stdout);
}
