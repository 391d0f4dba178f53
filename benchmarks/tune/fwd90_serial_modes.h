// tune_fwd90's modes of session 44 (benchmarks/NOTES.md 12.45): `serial3`, three consumers at
// d = 128 on a step without the overlap of a consumer's two GEMMs (FwdTraits kSerialPV), against
// the library's static tiles; `lpt`, the causal tile orders of a grid of one CTA per tile
// (fwd_schedule's causal_order); `orders` (session 50), the library's causal schedule of tiles.h
// against the one before it; `lastaligned` (session 52), causal query blocks aligned to the last
// row (fwd_launch.h fwd_m_shift) against blocks at multiples of the tile; `shortlong` (session
// 52), the long-row tiles against the short ones around tiles.h fwd_short_rows_sm90's causal
// bound, now that only the long tiles take the shift; `persist4k` (session 53), the persistent
// grid against the library's causal schedule around 4k keys; (`packedexp`, the exponentials
// two per SFU instruction, measured slower and dropped in session 54); `shortlongnc`,
// `shortlong` with non-causal calls; `doubleq`, two Q buffers; `balance` (session 54), the
// persistent causal walk's groups sized for its balance against the L2's; `persist256`, d 256's
// causal calls on that walk against the library's grid; `groupcap`, that walk's groups allowed
// past the L2's bound; `groupcap2` (session 55), the library's groups (past the L2's where they
// balance, problem/scheduler.h kWalkL2Penalty) against the bounded ones at the lengths where the
// model has them differ; `persist8k`, the persistent grid against one CTA per tile past the
// library's persistent range; `persist256f`, d 256's short causal calls timed as the bench
// times them (the L2 emptied before each); `persist16k` (session 56), the persistent grid on the
// longest causal rows with the walk's groups up to every head; `splitq`, Q in one part per
// consumer (FwdTraits kSplitQ); `prefetch`, the TMA descriptors prefetched (kPrefetchMaps).
// (The lazy reference's modes: fwd90_lazy_modes.h.) tune_fwd90.cu runs them
// through run_serial_mode / run_order_mode;
// -DTUNE_FWD90_SERIAL_ONLY builds these modes alone.
//
// Why (benchmarks/NOTES.md 12.45): the phase clocks (12.14 item 7) have the d = 128 128 x 176
// step at 3,618 cycles for 2,816 of tensor work, set by each consumer's own path (S landed
// 1,068, row max 674, exponentials 1,229, pack 270), which has to fit under the other
// consumer's GEMMs (1,408 cycles) plus its own P V. A third consumer would give each softmax
// two other consumers' GEMMs to hide under, but the overlapped step holds O + S + P (64 + 64 +
// 32 registers at 192 x 128), which 160 registers a thread cannot (12.12 item 2: 192 x 96 /
// 192 x 128 serialized their wgmmas, the narrower 192 x 64 / 80 lost 5-14%). Retiring P V
// before S is issued leaves O + S (128), d = 64's 192 x 128 footprint.
#pragma once

#include <string>
#include <vector>

#include "fwd90_harness.h"

// The library's static-variant (plain attention) configuration at a head dim: its long-row tile,
// or with kShort its short-row one (tiles.h fwd_short_rows_sm90); kDoubleQ / kSplitQ /
// kPrefetch: with FwdTraits kDoubleQ (`doubleq`) / kSplitQ (`splitq`) / kPrefetchMaps
// (`prefetch`) on; kLazy >= 0: FwdTraits kLazyRescale (fwd90_lazy_modes.h `lazy`) in place of
// the library's.
template <int kHeadDim, bool kShort = false, bool kDoubleQ = false, bool kSplitQ = false,
          bool kPrefetch = false, int kLazy = -1>
using LibStatic =
    typename fa::sm90::LibraryFwdTraits<kHeadDim, fa::kStaticVariant, kShort, false, kDoubleQ,
                                        kSplitQ, kPrefetch, -1, false, kLazy>::Type;

// Runs `mode` if it is this file's; false otherwise.
inline bool run_serial_mode(const std::string& mode, const Buffers& b) {
  if (mode != "serial3") return false;
  using fa::sm90::FwdTraits;
  using fa::sm90::LibraryFwdTraits;
  g_library_schedule = true;
  // The library's static instances (A): d = 128 128 x 176, d = 64 192 x 128, the bf16 softcap
  // 30 bounded static instance at d = 128 (128 x 176).
  using Lib128 = LibStatic<128>;
  using Lib64 = LibStatic<64>;
  using LibCap128 = LibraryFwdTraits<128, fa::kStaticSoftcapVariant, false, true>::Type;
  // B: the library's knobs (fused exponent, sum tree, registers epilogue) with kSerialPV.
  //                     d    M    N  st  pp poly hv wfx stamp o  capmax early maxt sumt mods capil bnd  sus  serial
  using S3x128 = FwdTraits<128, 192, 128, 2, true, 0, 0, true, false, 0, true, false, false, true, true, false, false, false, true>;
  using S3x128t = FwdTraits<128, 192, 128, 2, true, 0, 0, true, false, 0, true, false, true, true, true, false, false, false, true>;
  using S3x96 = FwdTraits<128, 192, 96, 2, true, 0, 0, true, false, 0, true, false, false, true, true, false, false, false, true>;
  // The row max as a tree (kMaxTree): in the serial step each consumer's whole chain is its own.
  // Controls: the serial step on the two-consumer tiles (what the lost overlap costs alone).
  using S2x176 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, true, true, false, false, false, true>;
  using S3x64 = FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, false, false, true, true, false, false, false, true>;
  using Cap3x128 = FwdTraits<128, 192, 128, 2, true, 0, 0, true, false, 0, true, false, false, true, true, false, true, false, true>;
  const std::vector<int> sl = {4096, 8192, 16384};
  for (int rep = 0; rep < 2; ++rep) {
    ab_sweep<128, Lib128, S3x128>("d128 3x serial 192x128", b, true, sl);
    ab_sweep<128, Lib128, S3x96>("d128 3x serial 192x96", b, true, sl);
    ab_sweep<128, S3x128, S3x128t>("d128 3x serial, max tree", b, true, {8192});
    ab_sweep<128, Lib128, S2x176>("d128 2x serial 128x176", b, true, {8192});
    ab_sweep<64, Lib64, S3x64>("d64 3x serial 192x128", b, true, {8192});
    ab_sweep<128, LibCap128, Cap3x128, kSoftcap | kStaticMask>("d128 cap 3x serial 192x128", b,
                                                               true, {4096, 16384});
  }
  ab_sweep<128, Lib128, S3x128>("d128 3x serial 192x128", b, true, {1024, 2048});
  // Where the cycles go (sm90/fwd_clock.h; in the serial step "P V wait" is P V issued and
  // retired, "S issued, landed" S's): the library's tile, then the serial 192 x 128.
  const size_t stamp_slots = size_t{16384} * 3 * fa::sm90::kFwdClockSlots;
  unsigned long long* stamps = nullptr;
  CHECK(cudaMalloc(&stamps, stamp_slots * 8));
  phases<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true, true, 0, true, false, false, true>>(
      "d128 128x176 library", b, stamps, stamp_slots, 8192, false);
  phases<128, FwdTraits<128, 192, 128, 2, true, 0, 0, true, true, 0, true, false, false, true,
                        true, false, false, false, true>>("d128 192x128 serial", b, stamps,
                                                          stamp_slots, 8192, false);
  return true;
}

// `lpt`: causal calls on a grid of one CTA per tile, the hardware handing the tiles out in index
// order as SMs free up. The library's order there (fwd_schedule causal_order 0) runs each head's
// query blocks longest first, head after head, so the last heads' longest tiles start near the
// end: a greedy list-scheduling model of that hand-out (block-steps per tile plus 2.25 fixed,
// benchmarks/NOTES.md 12.45) puts the busiest SM 5.3% over the mean at d 128 8k (128 x 176),
// 4.8% at d 64 8k, 11-14% at d 256 1k-8k (every d 256 causal call runs one CTA per tile), and
// 0.4-1.8% for longest first over all tiles. That order reads each head's K / V from several
// tiles far apart in time, where the library's keeps one head's tiles together in L2: the
// measurement decides. Per shape: A the library's schedule (persistent where it is: d <= 128
// up to 4k keys), B one CTA per tile longest first over all tiles, C the same in groups of heads
// whose K / V fit half the L2 (the persistent grid's grouping), interleaved (ab_ms), outputs
// checked against the sm80 kernel.
// A causal call of the tune shapes (plain attention) with its sm80 reference output written.
template <int kHeadDim>
fa::FwdParams causal_case(const Buffers& b, int seqlen) {
  fa::FwdParams p;
  mods_params(b, kHeadDim, seqlen, true, kNoMods, &p);
  reference_output<kHeadDim>(b, p);
  p.o = b.o;
  return p;
}

template <int kHeadDim, typename Traits>
void order_ab(const char* name, const Buffers& b, const std::vector<int>& seqlens) {
  for (int seqlen : seqlens) {
    const fa::FwdParams p = causal_case<kHeadDim>(b, seqlen);
    const int total = p.batch * p.num_heads;
    const int l2_group = fa::sm90::l2_head_group(p, g_l2);  // the persistent grid's grouping
    auto launch = [&](int order) {  // order 0: the library's schedule
      g_library_schedule = order == 0;
      g_causal_persistent = false;
      g_causal_order = order;
      return run_sm90<Traits>(p);
    };
    for (int order : {-1, l2_group}) {
      fa::Status st;
      const float diff = checked_diff(b, p, [&] { return launch(order); }, &st);
      const AbTimes t = ab_ms([&] { launch(0); }, [&] { launch(order); }, 30, 4);
      const double flops = call_flops(p, kNoMods);
      std::printf("%-20s d=%3d s=%5d causal, B = %s: A %6.1f  B %6.1f TFLOP/s  B/A time %.3f  "
                  "max|diff| %.1e%s\n",
                  name, kHeadDim, seqlen, order < 0 ? "longest first over all" : "groups of heads",
                  flops / t.a_ms * 1e-9, flops / t.b_ms * 1e-9, t.b_over_a, diff,
                  st == fa::Status::kSuccess && diff < 2e-2f ? "" : "  WRONG");
      if (order > 0) std::printf("%-20s   (groups of %d heads of %d)\n", "", order, total);
      std::fflush(stdout);
    }
  }
  g_library_schedule = true;
  g_causal_order = 0;
}

// The walk modes' A/B of two launches of call p: both outputs checked against the sm80 kernel,
// then timed back to back (ab_ms) or one call at a time after an L2 flush (g_ab_flush:
// ab_ms_flushed, as the bench); `ok` when both ran and matched.
struct WalkAb {
  AbTimes t;
  float diff_a, diff_b;
  bool ok;
};
template <typename LaunchA, typename LaunchB>
WalkAb walk_ab(const Buffers& b, const fa::FwdParams& p, const LaunchA& launch_a,
               const LaunchB& launch_b) {
  fa::Status st_a, st_b;
  WalkAb r;
  r.diff_a = checked_diff(b, p, launch_a, &st_a);
  r.diff_b = checked_diff(b, p, launch_b, &st_b);
  auto a = [&] { launch_a(); };
  auto bb = [&] { launch_b(); };
  r.t = g_ab_flush > 0 ? ab_ms_flushed(a, bb, 60, g_ab_flush) : ab_ms(a, bb, 30, 4);
  r.ok = st_a == fa::Status::kSuccess && st_b == fa::Status::kSuccess && r.diff_a < 2e-2f &&
         r.diff_b < 2e-2f;
  return r;
}

// The group of heads a persistent walk of call p takes on instance Traits (fwd_walk_group_of with
// the harness's m_shift) for `balanced` / `cap`; the L2's group in *l2_group.
template <typename Traits>
int walk_group(const fa::FwdParams& p, bool balanced, double cap, int* l2_group) {
  *l2_group = fa::sm90::l2_head_group(p, g_l2);
  const int m_shift = fa::sm90::fwd_m_shift<Traits, fa::kStaticVariant>(
      p, Traits::kTmaStoreO != 0, shift_tma_of<Traits>());
  return fa::sm90::fwd_walk_group_of<Traits, fa::kStaticVariant>(p, g_sms, *l2_group, m_shift,
                                                                 balanced, cap);
}

// `orders`: the library's causal schedule (tiles.h fwd_causal_persistent_sm90 /
// fwd_causal_order_sm90, since session 50) against the one before it (B / A): the persistent
// grid at d <= 128 up to 4k keys, else one CTA per tile head after head; interleaved (ab_ms),
// both outputs checked against the sm80 kernel. Where both are the same schedule the ratio is
// noise. persistent: A is the persistent grid at every length (`persist4k`, session 53: around
// 4k keys, where that session's `orders` on the H200 had the persistent grid 4.7% / 8.7% faster
// at d 128 / 64 and the H100 of session 51 7% slower; benchmarks/NOTES.md 12.63).
template <int kHeadDim, typename Traits>
void library_order_ab(const char* name, const Buffers& b, const std::vector<int>& seqlens,
                      bool persistent = false) {
  for (int seqlen : seqlens) {
    const fa::FwdParams p = causal_case<kHeadDim>(b, seqlen);
    auto before = [&] {
      g_library_schedule = false;
      g_causal_persistent = persistent || (kHeadDim <= 128 && seqlen <= 4096);
      g_causal_order = 0;
      return run_sm90<Traits>(p);
    };
    auto library = [&] {
      g_library_schedule = true;
      return run_sm90<Traits>(p);
    };
    const WalkAb r = walk_ab(b, p, before, library);
    const double flops = call_flops(p, kNoMods);
    std::printf("%-20s d=%3d s=%5d causal, order %2d%s: %s %6.1f  library %6.1f TFLOP/s  "
                "B/A time %.3f  max|diff| %.1e %.1e%s\n",
                name, kHeadDim, seqlen, fa::sm90::causal_order(p),
                fa::sm90::causal_persistent(p) ? " (persistent)" : "",
                persistent ? "persistent" : "before", flops / r.t.a_ms * 1e-9,
                flops / r.t.b_ms * 1e-9, r.t.b_over_a, r.diff_a, r.diff_b, r.ok ? "" : "  WRONG");
    std::fflush(stdout);
  }
  g_library_schedule = true;
  g_causal_persistent = true;
  g_causal_order = 0;
}

// A persistent causal walk's group choice (launch_fwd_config's balanced_groups / group_cap).
struct WalkChoice {
  bool balanced;
  double cap;
};

// `balance` and `groupcap` (session 54): the library's schedule (library_schedule) or the
// persistent grid whatever the length, with the walk's groups chosen as `a` (A) and as `b` (B),
// interleaved (ab_ms), both outputs checked against the sm80 kernel, both group sizes printed
// (equal: the same launch, the ratio is noise). `balance`: the L2's groups against the balanced
// ones (fwd_launch.h fwd_walk_group), which differ only where the library's grid is the
// persistent one (tiles.h fwd_causal_persistent_sm90); `groupcap`: the balanced search bounded
// by the L2's group against `cap` x it (benchmarks/NOTES.md 12.66 item 2: groups 2-4x the L2's
// balance d 128 3k-6k and d 64 8k to ~1.005 of the mean, while their K / V no longer fit half
// the L2).
template <int kHeadDim, typename Traits>
void walk_group_ab(const char* name, const Buffers& b, const std::vector<int>& seqlens,
                   WalkChoice choice_a, WalkChoice choice_b, bool library_schedule) {
  g_library_schedule = library_schedule;
  g_causal_persistent = true;
  g_causal_order = 0;
  for (int seqlen : seqlens) {
    const fa::FwdParams p = causal_case<kHeadDim>(b, seqlen);
    auto launch = [&](WalkChoice c) {
      g_balanced = c.balanced;
      g_group_cap = c.cap;
      return run_sm90<Traits>(p);
    };
    const WalkAb r =
        walk_ab(b, p, [&] { return launch(choice_a); }, [&] { return launch(choice_b); });
    int l2_group = 0;
    auto group_of = [&](WalkChoice c) {
      return walk_group<Traits>(p, c.balanced, c.cap, &l2_group);
    };
    const int group_a = group_of(choice_a), group_b = group_of(choice_b);
    const bool persistent = !library_schedule || fa::sm90::causal_persistent(p);
    const double flops = call_flops(p, kNoMods);
    std::printf("%-20s d=%3d s=%5d causal%s, L2 group %3d, groups %3d -> %3d of %4d: A %6.1f  "
                "B %6.1f TFLOP/s  B/A time %.3f  max|diff| %.1e %.1e%s\n",
                name, kHeadDim, seqlen, persistent ? " (persistent)" : "", l2_group,
                group_a, group_b, p.batch * p.num_heads,
                flops / r.t.a_ms * 1e-9, flops / r.t.b_ms * 1e-9, r.t.b_over_a, r.diff_a,
                r.diff_b, r.ok ? "" : "  WRONG");
    std::fflush(stdout);
  }
  g_library_schedule = true;
  g_balanced = true;
  g_group_cap = fa::kWalkGroupCap;
}

// `lastaligned`: causal calls with the query blocks aligned to the last row (B: the library's,
// problem/mask.h Mask::query_block_shift) against blocks at multiples of the tile (A), the
// library's schedule for both, interleaved (ab_ms), B's output checked against the sm80 kernel.
// Where the tile's rows divide seqlen_q both are the same launch and the ratio is noise.
// shift_tma: B shifts the calls whose O goes through a TMA map too (tiles.h
// fwd_shift_tma_store_sm90 on; d 256's static tiles).
template <int kHeadDim, typename Traits>
void last_aligned_ab(const char* name, const Buffers& b, const std::vector<int>& seqlens,
                     bool shift_tma = false) {
  g_library_schedule = true;
  g_shift_tma = shift_tma ? 1 : 0;
  for (int seqlen : seqlens) {
    const fa::FwdParams p = causal_case<kHeadDim>(b, seqlen);
    auto launch = [&](bool aligned) {
      g_last_aligned = aligned;
      return run_sm90<Traits>(p);
    };
    fa::Status st;
    const float diff = checked_diff(b, p, [&] { return launch(true); }, &st);
    const AbTimes t = ab_ms([&] { launch(false); }, [&] { launch(true); }, 30, 4);
    const double flops = call_flops(p, kNoMods);
    std::printf("%-20s d=%3d s=%5d causal, shift %3d: A %6.1f  B %6.1f TFLOP/s  B/A time %.3f  "
                "max|diff| %.1e%s\n",
                name, kHeadDim, seqlen,
                fa::sm90::fwd_m_shift<Traits, fa::kStaticVariant>(p, Traits::kTmaStoreO != 0,
                                                                   shift_tma),
                flops / t.a_ms * 1e-9, flops / t.b_ms * 1e-9, t.b_over_a, diff,
                st == fa::Status::kSuccess && diff < 2e-2f ? "" : "  WRONG");
    std::fflush(stdout);
  }
  g_last_aligned = true;
  g_shift_tma = -1;
}

// `persist256f`: one CTA per tile in head-after-head order (A) against the persistent grid with
// the walk's groups bounded by cap x the L2's (B), whatever the library takes; timed as
// g_ab_flush says; both outputs checked against the sm80 kernel.
template <int kHeadDim, typename Traits>
void persistent_ab(const char* name, const Buffers& b, const std::vector<int>& seqlens,
                   double cap) {
  g_library_schedule = false;
  g_causal_order = 0;
  g_group_cap = cap;
  for (int seqlen : seqlens) {
    const fa::FwdParams p = causal_case<kHeadDim>(b, seqlen);
    auto launch = [&](bool persistent) {
      g_causal_persistent = persistent;
      return run_sm90<Traits>(p);
    };
    const WalkAb r = walk_ab(b, p, [&] { return launch(false); }, [&] { return launch(true); });
    int l2_group = 0;
    const int group = walk_group<Traits>(p, g_balanced, cap, &l2_group);
    const double flops = call_flops(p, kNoMods);
    std::printf("%-20s d=%3d s=%5d causal, %s, groups %3d (L2 %3d, cap %.0f): one CTA a tile "
                "%6.1f  persistent %6.1f TFLOP/s  B/A time %.3f  max|diff| %.1e %.1e%s\n",
                name, kHeadDim, seqlen, g_ab_flush > 0 ? "L2 flushed" : "back to back", group,
                l2_group, cap, flops / r.t.a_ms * 1e-9, flops / r.t.b_ms * 1e-9, r.t.b_over_a,
                r.diff_a, r.diff_b, r.ok ? "" : "  WRONG");
    std::fflush(stdout);
  }
  g_library_schedule = true;
  g_causal_persistent = true;
  g_group_cap = fa::kWalkGroupCap;
}

inline bool run_order_mode(const std::string& mode, const Buffers& b) {
  if (mode == "doubleq") {
    // Two Q buffers (B: FwdTraits kDoubleQ, the next tile's Q loaded during this one) against
    // the library's one (A), the library's schedule (persistent where a CTA walks several
    // tiles), interleaved, two passes. d 128's 128 x 176 has no room for a second Q; d 256's
    // tiles stage O in Q's buffer.
    g_library_schedule = true;
    for (int rep = 0; rep < 2; ++rep) {
      ab_sweep<64, LibStatic<64, true>, LibStatic<64, true, true>>("d64 128x128 2Q", b, true,
                                                                   {1024});
      ab_sweep<64, LibStatic<64>, LibStatic<64, false, true>>("d64 192x128 2Q", b, true,
                                                              {2048, 4096});
      ab_sweep<128, LibStatic<128, true>, LibStatic<128, true, true>>("d128 128x128 2Q", b, true,
                                                                      {1024, 2048});
    }
    return true;
  }
  if (mode == "splitq") {
    // Q in one part per consumer (B: FwdTraits kSplitQ, each part's own barriers, so a consumer
    // starts its next tile once its own rows of Q are in) against the library's one Q (A), the
    // library's schedule, interleaved, two passes; then d 256's short causal tiles on the
    // persistent grid (the bench's d 256 1k, where that grid has lost: NOTES 12.69), where the
    // phase clocks had a tile's Q wait at ~3,500 cycles with O staged in Q's buffer.
    g_library_schedule = true;
    for (int rep = 0; rep < 2; ++rep) {
      ab_sweep<256, LibStatic<256>, LibStatic<256, false, false, true>>("d256 128x80 splitQ", b,
                                                                        true, {1024, 2048, 4096});
      ab_sweep<256, LibStatic<256, true>, LibStatic<256, true, false, true>>(
          "d256 128x64 splitQ", b, false, {1024, 2048});
      ab_sweep<128, LibStatic<128>, LibStatic<128, false, false, true>>("d128 128x176 splitQ", b,
                                                                        true, {1024, 4096});
      ab_sweep<128, LibStatic<128, true>, LibStatic<128, true, false, true>>(
          "d128 128x128 splitQ", b, true, {1024, 2048});
      ab_sweep<64, LibStatic<64, true>, LibStatic<64, true, false, true>>("d64 128x128 splitQ", b,
                                                                          true, {1024});
      ab_sweep<64, LibStatic<64>, LibStatic<64, false, false, true>>("d64 192x128 splitQ", b,
                                                                     true, {2048, 4096});
    }
    g_library_schedule = false;
    g_causal_persistent = true;
    g_causal_order = 0;
    for (int rep = 0; rep < 2; ++rep) {
      ab_sweep<256, LibStatic<256, true>, LibStatic<256, true, false, true>>(
          "d256 128x64 splitQ pers", b, false, {512, 1024});
    }
    g_library_schedule = true;
    return true;
  }
  if (mode == "prefetch") {
    // The TMA maps' descriptors prefetched at the CTA's start (B: FwdTraits kPrefetchMaps)
    // against the library's (A), the library's schedule, interleaved, two passes: mostly the
    // grids of one CTA per tile (d 256 causal <= 1k and >= 6k, d 64 / d 128 causal 16k), then
    // persistent grids, where a CTA fetches them once for many tiles (the control).
    g_library_schedule = true;
    for (int rep = 0; rep < 2; ++rep) {
      ab_sweep<256, LibStatic<256, true>, LibStatic<256, true, false, false, true>>(
          "d256 128x64 prefetch", b, false, {512, 1024});
      ab_sweep<256, LibStatic<256>, LibStatic<256, false, false, false, true>>(
          "d256 128x80 prefetch", b, false, {8192});
      ab_sweep<128, LibStatic<128>, LibStatic<128, false, false, false, true>>(
          "d128 128x176 prefetch", b, true, {16384});
      ab_sweep<64, LibStatic<64>, LibStatic<64, false, false, false, true>>(
          "d64 192x128 prefetch", b, true, {16384});
    }
    return true;
  }
  if (mode == "shortlongnc") {
    // `shortlong` with the non-causal calls too, at the lengths where the bench's forward is
    // below cuDNN on the H200 (df8d3c6: d 64 1k non-causal 0.94, d 128 non-causal 1k / 2k / 4k
    // 0.95 / 0.98 / 0.96): A the long-row tile, B the short one (d 64 takes B for up to 1024
    // query rows, d 128 only for causal calls up to 3k keys).
    g_library_schedule = true;
    for (int rep = 0; rep < 2; ++rep) {
      ab_sweep<64, LibStatic<64>, LibStatic<64, true>>("d64 192x128 | 128x128", b, true,
                                                       {256, 384, 512, 768, 1024});
      ab_sweep<128, LibStatic<128>, LibStatic<128, true>>("d128 128x176 | 128x128", b, true,
                                                          {512, 1024, 1536, 2048, 4096});
      // d 256 (1k causal 0.97x cuDNN at df8d3c6): 128 x 80 against 128 x 64, both sides of
      // the causal bound (2k).
      ab_sweep<256, LibStatic<256>, LibStatic<256, true>>("d256 128x80 | 128x64", b, true,
                                                          {1024, 1536, 2048, 3072});
    }
    return true;
  }
  if (mode == "balance") {
    for (int rep = 0; rep < 2; ++rep) {
      const WalkChoice l2{false, 1.0}, balanced{true, 1.0};
      walk_group_ab<64, LibStatic<64, true>>("d64 128x128", b, {512, 768, 1000, 1024}, l2,
                                             balanced, true);
      walk_group_ab<64, LibStatic<64>>("d64 192x128", b, {1536, 2048, 2560, 3072, 3584}, l2,
                                       balanced, true);
      walk_group_ab<128, LibStatic<128, true>>("d128 128x128", b, {1024, 1536, 2048}, l2,
                                               balanced, true);
    }
    return true;
  }
  if (mode == "groupcap") {
    for (int rep = 0; rep < 2; ++rep) {
      for (double cap : {1.5, 2.0, 4.0}) {
        const WalkChoice l2_bound{true, 1.0}, wider{true, cap};
        walk_group_ab<128, LibStatic<128>>("d128 128x176", b, {3072, 4608, 6144}, l2_bound,
                                           wider, false);
        walk_group_ab<64, LibStatic<64>>("d64 192x128", b, {8192}, l2_bound, wider, false);
      }
    }
    return true;
  }
  if (mode == "groupcap2") {
    // The library's groups (problem/scheduler.h kWalkGroupCap, B) against those within the L2's
    // bound (A), the library's schedule and tiles, at the lengths where
    // benchmarks/tune/walk_balance.cpp has them differ on a 50 MB L2 (equal groups: noise).
    for (int rep = 0; rep < 2; ++rep) {
      const WalkChoice bounded{true, 1.0}, library{true, fa::kWalkGroupCap};
      walk_group_ab<64, LibStatic<64>>("d64 192x128", b, {3584, 4608, 6144}, bounded, library,
                                       true);
      walk_group_ab<128, LibStatic<128, true>>("d128 128x128", b, {1536, 2560, 3072}, bounded,
                                               library, true);
      walk_group_ab<128, LibStatic<128>>("d128 128x176", b, {4608, 5120, 6144}, bounded, library,
                                         true);
      walk_group_ab<256, LibStatic<256, true>>("d256 128x64", b, {1024, 1536, 2048}, bounded,
                                               library, true);
      walk_group_ab<256, LibStatic<256>>("d256 128x80", b, {3072, 4096}, bounded, library, true);
    }
    return true;
  }
  if (mode == "persist16k") {
    // The persistent grid (A) against the library's one CTA per tile (B) on the long causal rows
    // past the persistent range, with the walk's groups up to the library's bound (kWalkGroupCap
    // x the L2's) and then up to every head (cap 64): walk_balance's model has the library's
    // groups 5% over the mean at d 128 16k (7 of 16 heads) and every head in one group within
    // 0.3-0.4% at d 64 16k, d 128 16k, d 256 8k / 16k, where longest first over all tiles cost
    // one CTA per tile 0.5% at 16k (tiles.h, the `lpt` sweep): the L2 against the balance.
    for (int rep = 0; rep < 2; ++rep) {
      for (double cap : {fa::kWalkGroupCap, 64.0}) {
        g_group_cap = cap;
        auto groups = [&](auto tag, int d, int seqlen) {
          using Traits = decltype(tag);
          const fa::FwdParams p = make_params(b, d, seqlen, true);
          int l2_group = 0;
          const int group = walk_group<Traits>(p, true, cap, &l2_group);
          std::printf("cap %4.0f: d %3d s %5d walks groups of %d heads (L2's %d, of %d)\n", cap, d,
                      seqlen, group, l2_group, p.batch * p.num_heads);
        };
        groups(LibStatic<64>{}, 64, 12288);
        groups(LibStatic<64>{}, 64, 16384);
        groups(LibStatic<128>{}, 128, 16384);
        groups(LibStatic<256>{}, 256, 8192);
        groups(LibStatic<256>{}, 256, 16384);
        library_order_ab<64, LibStatic<64>>("d64 192x128", b, {12288, 16384}, true);
        library_order_ab<128, LibStatic<128>>("d128 128x176", b, {16384}, true);
        library_order_ab<256, LibStatic<256>>("d256 128x80", b, {8192, 16384}, true);
      }
      g_group_cap = fa::kWalkGroupCap;
    }
    return true;
  }
  if (mode == "persist8k") {
    // The persistent grid with the library's groups (A) against the library's one CTA per tile
    // (B) past the persistent range (tiles.h fwd_causal_persistent_sm90): the model has the
    // walk within 0.4-2% of the mean at d 64 / 128 7k / 8k / 12k and d 256 6k, 3.6% at d 256 5k
    // (walk_balance.cpp; the L2's groups had 1.19-1.35 at 8k-12k).
    for (int rep = 0; rep < 2; ++rep) {
      library_order_ab<64, LibStatic<64>>("d64 192x128", b, {7168, 8192, 12288}, true);
      library_order_ab<128, LibStatic<128>>("d128 128x176", b, {7168, 8192, 12288}, true);
      library_order_ab<256, LibStatic<256>>("d256 128x80", b, {5120, 6144}, true);
    }
    return true;
  }
  if (mode == "persist256f") {
    // `persist256` around the bench's disagreement (session 55: at d 256 causal 512 / 1k the
    // bench had the persistent grid 5-7% slower, the harness's back-to-back A/B 1.6-5.6% faster):
    // one CTA per tile head after head (A) against the persistent grid (B; the library's wider
    // groups, then the L2-bounded ones), each call timed alone after a 256 MB memset of the L2
    // (ab_ms_flushed, as the bench), then back to back for the same shapes.
    for (size_t flush : {size_t(256) << 20, size_t(0)}) {
      g_ab_flush = flush;
      for (double cap : {fa::kWalkGroupCap, 1.0}) {
        persistent_ab<256, LibStatic<256, true>>("d256 128x64", b, {512, 768, 1024, 1536, 2048},
                                                 cap);
      }
    }
    g_ab_flush = 0;
    return true;
  }
  if (mode == "persist256") {
    // d 256's causal calls on the persistent grid with the balanced walk groups (A) against the
    // library's one CTA per tile (B); benchmarks/tune/walk_balance.cpp has the L2's groups 20%
    // over the mean at 1k / 2k / 4k and the balanced ones 2-4% (NOTES 12.66 item 2).
    for (int rep = 0; rep < 2; ++rep) {
      library_order_ab<256, LibStatic<256, true>>("d256 128x64", b, {1024, 1536, 2048}, true);
      library_order_ab<256, LibStatic<256>>("d256 128x80", b, {3072, 4096, 6144}, true);
    }
    return true;
  }
  if (mode == "persist4k") {
    for (int rep = 0; rep < 2; ++rep) {
      library_order_ab<64, LibStatic<64>>("d64 192x128", b, {3072, 3584, 4096, 4608, 5120, 6144},
                                          true);
      library_order_ab<128, LibStatic<128>>("d128 128x176", b, {3584, 4096, 4608, 5120, 6144},
                                            true);
    }
    return true;
  }
  if (mode == "shortlong") {
    // Causal calls, the library's schedule: A the long-row tile (d 64 192 x 128, d 128 128 x 176,
    // both with the last-aligned shift where seqlen_q is not a multiple of their rows), B the
    // short tile of fwd_short_rows_sm90 (128 x 128 at d 64 / 128, which stores O by TMA at d 128
    // and so takes no shift there; its rows equal its key blocks', where the shift saves nothing
    // anyway), interleaved, two passes. The library takes B up to 1k keys at d 64 and 2k at d 128;
    // d 64 causal 1k / 2k run 0.87x cuDNN on the H100 (benchmarks/NOTES.md 12.61).
    g_library_schedule = true;
    for (int rep = 0; rep < 2; ++rep) {
      ab_sweep<64, LibStatic<64>, LibStatic<64, true>>("d64 192x128 | 128x128", b, false,
                                                       {1000, 1024, 1536, 2048, 2500, 3072});
      ab_sweep<128, LibStatic<128>, LibStatic<128, true>>("d128 128x176 | 128x128", b, false,
                                                          {1500, 2048, 2500, 3072, 4096});
    }
    return true;
  }
  if (mode == "lastaligned") {
    // d 256's tile stores O by TMA (FwdTraits kTmaStoreO): its rows with shift_tma (tiles.h
    // fwd_shift_tma_store_sm90, off in the library until measured).
    for (int rep = 0; rep < 2; ++rep) {
      last_aligned_ab<64, LibStatic<64>>("d64 192x128", b, {2048, 3000, 4096, 8192, 16384});
      last_aligned_ab<128, LibStatic<128>>("d128 128x176", b, {3000, 5000});
      last_aligned_ab<256, LibStatic<256>>("d256 128x80", b, {1000, 3000, 5000}, true);
    }
    return true;
  }
  if (mode == "orders") {
    for (int rep = 0; rep < 2; ++rep) {
      library_order_ab<256, LibStatic<256>>("d256 128x80", b, {3072, 4096, 8192, 16384});
      library_order_ab<128, LibStatic<128>>("d128 128x176", b, {3072, 4096, 6144, 8192, 16384});
      library_order_ab<64, LibStatic<64>>("d64 192x128", b, {2048, 3072, 4096, 8192, 16384});
    }
    return true;
  }
  if (mode != "lpt") return false;
  for (int rep = 0; rep < 2; ++rep) {
    order_ab<256, LibStatic<256, true>>("d256 128x64 (short)", b, {1024, 2048});
    order_ab<256, LibStatic<256>>("d256 128x80", b, {4096, 8192, 16384});
    order_ab<128, LibStatic<128, true>>("d128 128x128 (short)", b, {1024, 2048});
    order_ab<128, LibStatic<128>>("d128 128x176", b, {4096, 8192, 16384});
    order_ab<64, LibStatic<64, true>>("d64 128x128 (short)", b, {1024});
    order_ab<64, LibStatic<64>>("d64 192x128", b, {2048, 4096, 8192, 16384});
  }
  return true;
}
