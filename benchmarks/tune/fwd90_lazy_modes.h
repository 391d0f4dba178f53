// tune_fwd90's modes of the forward's lazy row reference (sm90/fwd_traits.h kLazyRescale; knobs.h
// fwd_lazy_rescale_sm90) and of the running max's skipped rescale: `lazy` (session 61), the
// rows' lazy reference and O's skipped rescale against the running max; `lazydyn` (session 63),
// the same on the instances `lazy` left out (windows, the dynamic variant, static ALiBi at d =
// 128 / 256); `window256` (session 66), d = 256's window on the padded window instance (lazy
// there since `lazydyn`) against the dynamic one; `skipkept` (session 68), the running max with
// O's rescale skipped by a warp whose rows all kept their max (FwdTraits kSkipKept) against the
// running max, outputs bitwise compared; `sumswgmma` (session 68), the bounded reference's used
// sums by wgmma (FwdTraits kSumsWgmma) against mma.sync's (benchmarks/NOTES.md 12.79, 12.83,
// 12.89, 12.94, 12.95; session 67's `lazysums` went with FwdTraits kLazySums in session 69);
// `tailinexp`, the overlapped step's tail (P V's wait, O's rescale, P's pack) inside the
// exponentials' arms (FwdTraits kTailInExp) against the library's order, outputs bitwise compared;
// `tailmods`, its level 2 (softcap's max over the raw scores and the early rescale; the library's
// since benchmarks/NOTES.md 12.99) against level 1; `twop`, the bounded reference's P in two
// register sets (FwdTraits kTwoP) against one, outputs bitwise compared; `pairkv`, two CTAs of a
// cluster sharing each K / V block by TMA multicast (FwdTraits kPairKV) against one CTA a tile,
// outputs bitwise compared (`pairkv_check`: its bitwise rows on short calls, for
// compute-sanitizer).
// tune_fwd90.cu runs them through run_lazy_mode, in -DTUNE_FWD90_SERIAL_ONLY builds too.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fwd90_harness.h"
#include "fwd90_serial_modes.h"  // LibStatic

// The library's static configuration with FwdTraits kLazyRescale b (`lazy`).
template <int kHeadDim, bool kShort, int kLazy>
using LazyStatic = LibStatic<kHeadDim, kShort, false, false, false, kLazy>;

// The library's configuration of variant kVariant (long rows) with FwdTraits kLazyRescale b.
template <int kHeadDim, int kVariant, int kLazy>
using LazyOf = typename fa::sm90::LibraryFwdTraits<kHeadDim, kVariant, false, false, false, false,
                                                   false, -1, false, kLazy>::Type;

// The library's configuration of variant kVariant (kShort: its short-row tile) on the running max
// with FwdTraits kSkipKept s (`skipkept`).
template <int kHeadDim, int kVariant, bool kShort, int kSkip>
using SkipOf =
    typename fa::sm90::LibraryFwdTraits<kHeadDim, kVariant, kShort, false, false, false, false, -1,
                                        false, 0, kSkip>::Type;

// The library's configuration of variant kVariant (kShort: its short-row tile) on the bounded
// reference with FwdTraits kSumsWgmma w (`sumswgmma`).
template <int kHeadDim, int kVariant, bool kShort, int kW>
using SumsOf = typename fa::sm90::LibraryFwdTraits<kHeadDim, kVariant, kShort, true, false, false,
                                                   false, -1, false, -1, -1, kW>::Type;

// The library's configuration of variant kVariant (kShort: its short-row tile) on the bounded
// reference with FwdTraits kTwoP level t (`twop`; every other knob the library's).
template <int kHeadDim, int kVariant, bool kShort, int kT>
using TwoPOf = typename fa::sm90::LibraryFwdTraits<kHeadDim, kVariant, kShort, true, false, false,
                                                   false, -1, false, -1, -1, -1, -1, kT>::Type;

// The library's static long-row configuration with FwdTraits kPairKV b (`pairkv`).
template <int kHeadDim, bool kPair>
using PairOf = typename fa::sm90::LibraryFwdTraits<kHeadDim, fa::kStaticVariant, false, false,
                                                   false, false, false, -1, false, -1, -1, -1,
                                                   -1, -1, kPair>::Type;

// The library's configuration of variant kVariant (kShort: its short-row tile; kBounded: the
// bounded reference's instance, false the unbounded one fp16 runs) with FwdTraits kTailInExp's
// level t, -1 the library's (`tailmods`; every other knob the library's).
template <int kHeadDim, int kVariant, bool kShort, bool kBounded, int kTail>
using TailModsOf =
    typename fa::sm90::LibraryFwdTraits<kHeadDim, kVariant, kShort, kBounded, false, false, false,
                                        -1, false, -1, -1, -1, kTail>::Type;
// The same off the bounded reference (`tailinexp`).
template <int kHeadDim, int kVariant, bool kShort, int kTail>
using TailOf = TailModsOf<kHeadDim, kVariant, kShort, false, kTail>;

// One launch of configuration Traits (variant kVariant) on call p into b.o and b.lse, each
// NaN-poisoned first, copied to o and lse; false if the launch failed.
template <typename Traits, int kVariant>
bool output_of(const Buffers& b, const fa::FwdParams& p, std::vector<uint16_t>& o,
               std::vector<float>& lse) {
  CHECK(cudaMemset(b.o, 0xff, o.size() * 2));
  CHECK(cudaMemset(b.lse, 0xff, lse.size() * 4));
  if (run_sm90<Traits, kVariant>(p) != fa::Status::kSuccess) return false;
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(o.data(), b.o, o.size() * 2, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(lse.data(), b.lse, lse.size() * 4, cudaMemcpyDeviceToHost));
  return true;
}

// Whether B writes bitwise A's output and LSE on the call (kMods's modifiers at d = kHeadDim,
// seqlen, causal): the count of 16-bit outputs and of LSE floats whose bits differ.
template <int kHeadDim, typename TraitsA, typename TraitsB, int kMods = kNoMods>
void bitwise_ab(const char* name, const Buffers& b, int seqlen, bool causal) {
  constexpr int kVariant = variant_of(kMods);
  fa::FwdParams p;
  if (!mods_params(b, kHeadDim, seqlen, causal, kMods, &p)) return;
  const size_t n = static_cast<size_t>(p.batch) * p.seqlen_q * p.o_row_stride;
  const size_t nl = static_cast<size_t>(p.batch) * p.num_heads * p.seqlen_q;
  std::vector<uint16_t> oa(n), ob(n);
  std::vector<float> la(nl), lb(nl);
  if (!output_of<TraitsA, kVariant>(b, p, oa, la) || !output_of<TraitsB, kVariant>(b, p, ob, lb)) {
    std::printf("%-24s d=%3d s=%5d c=%d: launch failed\n", name, kHeadDim, seqlen, causal);
    return;
  }
  size_t od = 0, ld = 0;
  for (size_t i = 0; i < n; ++i) od += oa[i] != ob[i];
  for (size_t i = 0; i < nl; ++i) ld += std::memcmp(&la[i], &lb[i], 4) != 0;
  std::printf("%-24s d=%3d s=%5d c=%d: B against A, %zu of %zu outputs and %zu of %zu LSEs differ%s\n",
              name, kHeadDim, seqlen, causal, od, n, ld, nl, od + ld ? "  NOT BITWISE" : "");
  std::fflush(stdout);
}

// Runs `mode` if it is this file's; false otherwise.
inline bool run_lazy_mode(const std::string& mode, const Buffers& b) {
  if (mode == "lazy") {
    // A lazy reference (B: FwdTraits kLazyRescale 8, common/softmax.h new_max kLazyLog2: a row's
    // reference moves only where a key block's max passes it by 2^8 in P, and a warp whose rows
    // all keep theirs skips O's rescale) against the running max (A: kLazyRescale 0), the library's
    // tiles and schedule, interleaved, two passes: the long-row tiles at 4k / 8k / 16k, the
    // short ones at 1k, and ALiBi's static instance (its bias moves the max along a row).
    g_library_schedule = true;
    using fa::sm90::LibraryFwdTraits;
    constexpr int kA = fa::kStaticAlibiVariant;
    for (int rep = 0; rep < 2; ++rep) {
      const std::vector<int> sl = {4096, 8192, 16384};
      ab_sweep<128, LazyStatic<128, false, 0>, LazyStatic<128, false, 8>>(
          "d128 128x176 lazy", b, true, sl);
      ab_sweep<64, LazyStatic<64, false, 0>, LazyStatic<64, false, 8>>(
          "d64 192x128 lazy", b, true, sl);
      ab_sweep<256, LazyStatic<256, false, 0>, LazyStatic<256, false, 8>>(
          "d256 128x80 lazy", b, true, sl);
      ab_sweep<128, LazyStatic<128, true, 0>, LazyStatic<128, true, 8>>(
          "d128 128x128 lazy", b, true, {1024});
      ab_sweep<64, LazyStatic<64, true, 0>, LazyStatic<64, true, 8>>(
          "d64 128x128 lazy", b, true, {1024});
      ab_sweep<64, LibraryFwdTraits<64, kA, false, false, false, false, false, -1, false, 0>::Type,
               LibraryFwdTraits<64, kA, false, false, false, false, false, -1, false, 8>::Type,
               kAlibi | kStaticMask>("d64 alibi lazy", b, true, {4096, 16384});
    }
    return true;
  }
  if (mode == "lazydyn") {
    // `lazy` (b = 8 against the running max, interleaved, two passes) on the instances the
    // library's rule leaves on the running max because they were not measured (knobs.h
    // fwd_lazy_rescale_sm90): the padded window (1024, 0) at 8k / 16k, the dynamic variant on
    // padded rows (the instance of varlen and seqused_k calls) at 4k / 16k, and the static ALiBi
    // instance at d = 128 / 256 (d = 64's lost in `lazy`). Not d = 256's dynamic instance (ptxas
    // spilled it with the lazy reference).
    g_library_schedule = true;
    constexpr int kW = fa::kPaddedWindowVariant, kD = fa::kDynamicVariant;
    constexpr int kA = fa::kStaticAlibiVariant;
    constexpr int kWin = kWindow1k | kStaticMask, kAl = kAlibi | kStaticMask;
    for (int rep = 0; rep < 2; ++rep) {
      const std::vector<int> wl = {8192, 16384}, sl = {4096, 16384};
      ab_sweep<128, LazyOf<128, kW, 0>, LazyOf<128, kW, 8>, kWin>("d128 window lazy", b, false, wl);
      ab_sweep<64, LazyOf<64, kW, 0>, LazyOf<64, kW, 8>, kWin>("d64 window lazy", b, false, wl);
      ab_sweep<256, LazyOf<256, kW, 0>, LazyOf<256, kW, 8>, kWin>("d256 window lazy", b, false, wl);
      ab_sweep<128, LazyOf<128, kD, 0>, LazyOf<128, kD, 8>, kDynamicPlain>("d128 dynamic lazy", b,
                                                                            true, sl);
      ab_sweep<64, LazyOf<64, kD, 0>, LazyOf<64, kD, 8>, kDynamicPlain>("d64 dynamic lazy", b,
                                                                         true, sl);
      ab_sweep<128, LazyOf<128, kA, 0>, LazyOf<128, kA, 8>, kAl>("d128 alibi lazy", b, true, sl);
      ab_sweep<256, LazyOf<256, kA, 0>, LazyOf<256, kA, 8>, kAl>("d256 alibi lazy", b, true, sl);
    }
    return true;
  }
  if (mode == "skipkept") {
    // The running max with O's rescale skipped by a warp whose rows all kept their max (B:
    // FwdTraits kSkipKept, common/softmax.h new_max kKeep) against the running max (A), the
    // library's tiles and schedule: first whether B's outputs and LSEs are bitwise A's on each
    // instance kind, then the times, interleaved, two passes: the static long rows at 4k / 16k,
    // the short rows at 1k, the windows (1024, 0) at 8k / 16k (d = 256 on the dynamic instance,
    // the library's), the dynamic instance on padded rows and static ALiBi at 4k / 16k.
    g_library_schedule = true;
    constexpr int kS = fa::kStaticVariant, kW = fa::kPaddedWindowVariant;
    constexpr int kD = fa::kDynamicVariant, kA = fa::kStaticAlibiVariant;
    constexpr int kWin = kWindow1k | kStaticMask, kAl = kAlibi | kStaticMask;
    for (int causal = 0; causal < 2; ++causal) {
      bitwise_ab<128, SkipOf<128, kS, false, 0>, SkipOf<128, kS, false, 1>>("d128 128x176 bits", b,
                                                                            4096, causal);
      bitwise_ab<64, SkipOf<64, kS, false, 0>, SkipOf<64, kS, false, 1>>("d64 192x128 bits", b,
                                                                         4096, causal);
      bitwise_ab<256, SkipOf<256, kS, false, 0>, SkipOf<256, kS, false, 1>>("d256 128x80 bits", b,
                                                                            4096, causal);
      bitwise_ab<128, SkipOf<128, kS, true, 0>, SkipOf<128, kS, true, 1>>("d128 128x128 bits", b,
                                                                          1024, causal);
      bitwise_ab<128, SkipOf<128, kD, false, 0>, SkipOf<128, kD, false, 1>, kDynamicPlain>(
          "d128 dynamic bits", b, 4096, causal);
      bitwise_ab<256, SkipOf<256, kA, false, 0>, SkipOf<256, kA, false, 1>, kAl>(
          "d256 alibi bits", b, 4096, causal);
    }
    bitwise_ab<128, SkipOf<128, kW, false, 0>, SkipOf<128, kW, false, 1>, kWin>(
        "d128 window bits", b, 8192, true);
    for (int rep = 0; rep < 2; ++rep) {
      const std::vector<int> sl = {4096, 16384}, wl = {8192, 16384};
      ab_sweep<128, SkipOf<128, kS, false, 0>, SkipOf<128, kS, false, 1>>(
          "d128 128x176 skip", b, true, sl);
      ab_sweep<64, SkipOf<64, kS, false, 0>, SkipOf<64, kS, false, 1>>(
          "d64 192x128 skip", b, true, sl);
      ab_sweep<256, SkipOf<256, kS, false, 0>, SkipOf<256, kS, false, 1>>(
          "d256 128x80 skip", b, true, sl);
      ab_sweep<128, SkipOf<128, kS, true, 0>, SkipOf<128, kS, true, 1>>(
          "d128 128x128 skip", b, true, {1024});
      ab_sweep<64, SkipOf<64, kS, true, 0>, SkipOf<64, kS, true, 1>>(
          "d64 128x128 skip", b, true, {1024});
      ab_sweep<128, SkipOf<128, kW, false, 0>, SkipOf<128, kW, false, 1>, kWin>(
          "d128 window skip", b, false, wl);
      ab_sweep<64, SkipOf<64, kW, false, 0>, SkipOf<64, kW, false, 1>, kWin>(
          "d64 window skip", b, false, wl);
      ab_sweep<256, SkipOf<256, kD, false, 0>, SkipOf<256, kD, false, 1>, kWindow1k>(
          "d256 window skip", b, false, wl);
      ab_sweep<128, SkipOf<128, kD, false, 0>, SkipOf<128, kD, false, 1>, kDynamicPlain>(
          "d128 dynamic skip", b, true, sl);
      ab_sweep<64, SkipOf<64, kD, false, 0>, SkipOf<64, kD, false, 1>, kDynamicPlain>(
          "d64 dynamic skip", b, true, sl);
      ab_sweep<128, SkipOf<128, kA, false, 0>, SkipOf<128, kA, false, 1>, kAl>(
          "d128 alibi skip", b, true, sl);
      ab_sweep<256, SkipOf<256, kA, false, 0>, SkipOf<256, kA, false, 1>, kAl>(
          "d256 alibi skip", b, true, sl);
    }
    return true;
  }
  if (mode == "tailinexp") {
    // The overlapped step's tail (the wait for P_{i-1} V_{i-1}, O's rescale, P_i's pack) inlined
    // into each arm of the exponentials (B: FwdTraits kTailInExp, common/softmax.h exponentiate's
    // `after`), where ptxas interleaves its FMULs and F2FPs with the MUFU.EX2 stream, against the
    // library's order, the tail after both arms (A: kTailInExp off), the library's tiles and
    // schedule: first whether B's outputs and LSEs are bitwise A's (the same instructions on the
    // same values, in another order) on each instance kind the knob reaches, then the times,
    // interleaved, two passes: the static long rows at 4k / 16k (not d = 256's, whose early
    // rescale leaves the knob inert), the short rows at 1k, the windows (1024, 0) at 8k / 16k
    // (d = 256 on the dynamic instance, the library's), the dynamic instance on padded rows and
    // d = 128's static ALiBi at 4k / 16k. Not softcap (its row max over the raw scores), the
    // bounded reference or dropout, where the knob is inert.
    g_library_schedule = true;
    constexpr int kS = fa::kStaticVariant, kW = fa::kPaddedWindowVariant;
    constexpr int kD = fa::kDynamicVariant, kA = fa::kStaticAlibiVariant;
    constexpr int kWin = kWindow1k | kStaticMask, kAl = kAlibi | kStaticMask;
    for (int causal = 0; causal < 2; ++causal) {
      bitwise_ab<128, TailOf<128, kS, false, 0>, TailOf<128, kS, false, 1>>("d128 128x176 bits", b,
                                                                            4096, causal);
      bitwise_ab<64, TailOf<64, kS, false, 0>, TailOf<64, kS, false, 1>>("d64 192x128 bits", b,
                                                                         4096, causal);
      bitwise_ab<128, TailOf<128, kS, true, 0>, TailOf<128, kS, true, 1>>("d128 128x128 bits", b,
                                                                          1024, causal);
      bitwise_ab<128, TailOf<128, kD, false, 0>, TailOf<128, kD, false, 1>, kDynamicPlain>(
          "d128 dynamic bits", b, 4096, causal);
      bitwise_ab<256, TailOf<256, kD, false, 0>, TailOf<256, kD, false, 1>, kDynamicPlain>(
          "d256 dynamic bits", b, 4096, causal);
      bitwise_ab<128, TailOf<128, kA, false, 0>, TailOf<128, kA, false, 1>, kAl>(
          "d128 alibi bits", b, 4096, causal);
    }
    bitwise_ab<128, TailOf<128, kW, false, 0>, TailOf<128, kW, false, 1>, kWin>(
        "d128 window bits", b, 8192, true);
    for (int rep = 0; rep < 2; ++rep) {
      const std::vector<int> sl = {4096, 16384}, wl = {8192, 16384};
      ab_sweep<128, TailOf<128, kS, false, 0>, TailOf<128, kS, false, 1>>(
          "d128 128x176 tail", b, true, sl);
      ab_sweep<64, TailOf<64, kS, false, 0>, TailOf<64, kS, false, 1>>(
          "d64 192x128 tail", b, true, sl);
      ab_sweep<128, TailOf<128, kS, true, 0>, TailOf<128, kS, true, 1>>(
          "d128 128x128 tail", b, true, {1024});
      ab_sweep<64, TailOf<64, kS, true, 0>, TailOf<64, kS, true, 1>>(
          "d64 128x128 tail", b, true, {1024});
      ab_sweep<128, TailOf<128, kW, false, 0>, TailOf<128, kW, false, 1>, kWin>(
          "d128 window tail", b, false, wl);
      ab_sweep<64, TailOf<64, kW, false, 0>, TailOf<64, kW, false, 1>, kWin>(
          "d64 window tail", b, false, wl);
      ab_sweep<256, TailOf<256, kD, false, 0>, TailOf<256, kD, false, 1>, kWindow1k>(
          "d256 window tail", b, false, wl);
      ab_sweep<128, TailOf<128, kD, false, 0>, TailOf<128, kD, false, 1>, kDynamicPlain>(
          "d128 dynamic tail", b, true, sl);
      ab_sweep<64, TailOf<64, kD, false, 0>, TailOf<64, kD, false, 1>, kDynamicPlain>(
          "d64 dynamic tail", b, true, sl);
      ab_sweep<128, TailOf<128, kA, false, 0>, TailOf<128, kA, false, 1>, kAl>(
          "d128 alibi tail", b, true, sl);
    }
    return true;
  }
  if (mode == "tailmods") {
    // kTailInExp's level 2 (B, the library's since 12.99) against level 1 (A): the tail
    // (P V's wait, V's release, P's pack) inside the exponentials where level 1 leaves it after
    // them: softcap's max over the raw scores (the unbounded softcap instances, as fp16 runs
    // them; d = 128 static 128 x 176 and dynamic 128 x 128) and the early rescale (d = 256's
    // static long rows, plain and ALiBi). Bitwise first, then interleaved, two passes, 4k / 16k
    // non-causal then causal.
    g_library_schedule = true;
    constexpr int kS = fa::kStaticVariant, kA = fa::kStaticAlibiVariant;
    constexpr int kC = fa::kSoftcapVariant, kCs = fa::kStaticSoftcapVariant;
    constexpr int kCap = kSoftcap, kCapS = kSoftcap | kStaticMask, kAl = kAlibi | kStaticMask;
    for (int causal = 0; causal < 2; ++causal) {
      bitwise_ab<128, TailModsOf<128, kCs, false, false, 1>,
                 TailModsOf<128, kCs, false, false, 2>, kCapS>("d128 softcap st bits", b, 4096,
                                                               causal);
      bitwise_ab<128, TailModsOf<128, kC, false, false, 1>, TailModsOf<128, kC, false, false, 2>,
                 kCap>("d128 softcap dyn bits", b, 4096, causal);
      bitwise_ab<256, TailModsOf<256, kS, false, false, 1>, TailModsOf<256, kS, false, false, 2>>(
          "d256 early bits", b, 4096, causal);
      bitwise_ab<256, TailModsOf<256, kA, false, false, 1>, TailModsOf<256, kA, false, false, 2>,
                 kAl>("d256 alibi early bits", b, 4096, causal);
    }
    for (int rep = 0; rep < 2; ++rep) {
      const std::vector<int> sl = {4096, 16384};
      ab_sweep<128, TailModsOf<128, kCs, false, false, 1>, TailModsOf<128, kCs, false, false, 2>,
               kCapS>("d128 softcap st tail2", b, true, sl);
      ab_sweep<128, TailModsOf<128, kC, false, false, 1>, TailModsOf<128, kC, false, false, 2>,
               kCap>("d128 softcap dyn tail2", b, true, sl);
      ab_sweep<256, TailModsOf<256, kS, false, false, 1>, TailModsOf<256, kS, false, false, 2>>(
          "d256 early tail2", b, true, sl);
      ab_sweep<256, TailModsOf<256, kA, false, false, 1>, TailModsOf<256, kA, false, false, 2>,
               kAl>("d256 alibi early tail2", b, true, sl);
    }
    return true;
  }
  if (mode == "twop") {
    // The bounded reference's P in two register sets (B: FwdTraits kTwoP level 1, the wait for
    // P V after the exponentials; C: level 2, no wait in the step) against one (A), bf16 softcap
    // 30, on the bounded instances whose registers hold the second set (knobs.h fwd_two_p_sm90):
    // d = 128's static short tile (128 x 128) and dynamic tile, d = 64's dynamic tile; bitwise
    // first (the same instructions on the same values), then interleaved, two passes. And d =
    // 128's long rows on the 128 x 128 tile with two sets (level 1) against the library's
    // 128 x 176 with one (the tile too large for a second set), where fwd_bounded_short_sm90
    // takes the long tile (non-causal past 4k, causal past 8k).
    g_library_schedule = true;
    constexpr int kC = fa::kSoftcapVariant, kCs = fa::kStaticSoftcapVariant;
    constexpr int kCap = kSoftcap, kCapS = kSoftcap | kStaticMask;
    for (int causal = 0; causal < 2; ++causal) {
      bitwise_ab<128, TwoPOf<128, kCs, true, 0>, TwoPOf<128, kCs, true, 1>, kCapS>(
          "d128 twop1 short bits", b, 4096, causal);
      bitwise_ab<128, TwoPOf<128, kCs, true, 0>, TwoPOf<128, kCs, true, 2>, kCapS>(
          "d128 twop2 short bits", b, 4096, causal);
      bitwise_ab<128, TwoPOf<128, kC, false, 0>, TwoPOf<128, kC, false, 1>, kCap>(
          "d128 twop1 dyn bits", b, 4096, causal);
      bitwise_ab<128, TwoPOf<128, kC, false, 0>, TwoPOf<128, kC, false, 2>, kCap>(
          "d128 twop2 dyn bits", b, 4096, causal);
      bitwise_ab<64, TwoPOf<64, kC, false, 0>, TwoPOf<64, kC, false, 1>, kCap>(
          "d64 twop1 dyn bits", b, 4096, causal);
      bitwise_ab<64, TwoPOf<64, kC, false, 0>, TwoPOf<64, kC, false, 2>, kCap>(
          "d64 twop2 dyn bits", b, 4096, causal);
    }
    for (int rep = 0; rep < 2; ++rep) {
      const std::vector<int> sl = {4096, 16384};
      ab_sweep<128, TwoPOf<128, kCs, true, 0>, TwoPOf<128, kCs, true, 1>, kCapS>(
          "d128 twop1 short", b, true, {1024, 4096});
      ab_sweep<128, TwoPOf<128, kCs, true, 0>, TwoPOf<128, kCs, true, 2>, kCapS>(
          "d128 twop2 short", b, true, {1024, 4096});
      ab_sweep<128, TwoPOf<128, kC, false, 0>, TwoPOf<128, kC, false, 1>, kCap>(
          "d128 twop1 dyn", b, true, sl);
      ab_sweep<128, TwoPOf<128, kC, false, 0>, TwoPOf<128, kC, false, 2>, kCap>(
          "d128 twop2 dyn", b, true, sl);
      ab_sweep<64, TwoPOf<64, kC, false, 0>, TwoPOf<64, kC, false, 1>, kCap>(
          "d64 twop1 dyn", b, true, sl);
      ab_sweep<64, TwoPOf<64, kC, false, 0>, TwoPOf<64, kC, false, 2>, kCap>(
          "d64 twop2 dyn", b, true, sl);
      ab_sweep<128, TwoPOf<128, kCs, false, 0>, TwoPOf<128, kCs, true, 1>, kCapS>(
          "d128 176x1 vs 128x2", b, true, {8192, 16384});
    }
    return true;
  }
  if (mode == "pairkv_check") {
    // `pairkv`'s bitwise rows alone on short calls (512 / 768 keys), for compute-sanitizer
    // (synccheck / racecheck on the cluster's barriers and multicast loads).
    g_library_schedule = true;
    bitwise_ab<128, PairOf<128, false>, PairOf<128, true>>("d128 pairkv bits", b, 512, false);
    bitwise_ab<64, PairOf<64, false>, PairOf<64, true>>("d64 pairkv bits", b, 768, false);
    bitwise_ab<256, PairOf<256, false>, PairOf<256, true>>("d256 pairkv bits", b, 512, false);
    return true;
  }
  if (mode == "pairkv") {
    // Two CTAs of a cluster on adjacent query tiles of a head, each K / V block loaded half by
    // each into both by TMA multicast (B: FwdTraits kPairKV) against one CTA a tile (A), the
    // library's static long-row tiles (d = 128 128 x 176, d = 64 192 x 128, d = 256 128 x 80),
    // plain attention, non-causal (kPairKV's calls: fwd_launch.h; an even count of query tiles
    // a head, hence d = 64's lengths); bitwise first (the same arithmetic on the same blocks),
    // then interleaved, two passes. Then the grid of one CTA per tile (FlashAttention-4's).
    g_library_schedule = true;
    for (int seqlen : {1024, 4096, 16384}) {
      bitwise_ab<128, PairOf<128, false>, PairOf<128, true>>("d128 pairkv bits", b, seqlen, false);
      bitwise_ab<64, PairOf<64, false>, PairOf<64, true>>("d64 pairkv bits", b, seqlen, false);
      bitwise_ab<256, PairOf<256, false>, PairOf<256, true>>("d256 pairkv bits", b, seqlen, false);
    }
    for (int rep = 0; rep < 2; ++rep) {
      ab_sweep<128, PairOf<128, false>, PairOf<128, true>>("d128 128x176 pairkv", b, true,
                                                           {2048, 4096, 8192, 16384}, false, false);
      ab_sweep<64, PairOf<64, false>, PairOf<64, true>>("d64 192x128 pairkv", b, true,
                                                        {1024, 4096, 16384}, false, false);
      ab_sweep<256, PairOf<256, false>, PairOf<256, true>>("d256 128x80 pairkv", b, true,
                                                           {2048, 4096, 8192, 16384}, false, false);
    }
    // The other way to L2 sharing (benchmarks/NOTES.md 12.101 item 2): FlashAttention-4's grid,
    // one CTA per tile, whose CTAs of a head start together (B: g_sms_b past the tiles), against
    // the persistent walk (A), d = 128 non-causal; then the pairs on that grid against it.
    g_sms_b = 1 << 30;
    for (int rep = 0; rep < 2; ++rep) {
      ab_sweep<128, PairOf<128, false>, PairOf<128, false>>("d128 pertile", b, true,
                                                            {4096, 8192, 16384}, false, false);
      ab_sweep<128, PairOf<128, false>, PairOf<128, true>>("d128 pairkv pertile", b, true,
                                                           {4096, 8192, 16384}, false, false);
    }
    g_sms_b = 0;
    return true;
  }
  if (mode == "sumswgmma") {
    // The bounded reference's used sums by wgmma m64n8k16 against a ones tile (B: FwdTraits
    // kSumsWgmma) against mma.sync's (A), interleaved, two passes: its library instances (bf16
    // softcap 30; d = 128 static 128 x 176 and its 1k tile 128 x 128, dynamic 128 x 128; d = 64
    // static and dynamic), each A / B pair with the sums rule of knobs.h fwd_sums_wgmma_sm90 set
    // explicitly on both sides.
    g_library_schedule = true;
    constexpr int kC = fa::kSoftcapVariant, kCs = fa::kStaticSoftcapVariant;
    constexpr int kCap = kSoftcap, kCapS = kSoftcap | kStaticMask;
    for (int rep = 0; rep < 2; ++rep) {
      const std::vector<int> sl = {4096, 16384};
      ab_sweep<128, SumsOf<128, kCs, false, 0>, SumsOf<128, kCs, false, 1>, kCapS>(
          "d128 bounded st wgmma", b, true, sl);
      ab_sweep<128, SumsOf<128, kCs, true, 0>, SumsOf<128, kCs, true, 1>, kCapS>(
          "d128 bounded 1k wgmma", b, true, {1024});
      ab_sweep<128, SumsOf<128, kC, false, 0>, SumsOf<128, kC, false, 1>, kCap>(
          "d128 bounded dyn wgmma", b, true, sl);
      ab_sweep<64, SumsOf<64, kCs, false, 0>, SumsOf<64, kCs, false, 1>, kCapS>(
          "d64 bounded st wgmma", b, true, sl);
      ab_sweep<64, SumsOf<64, kC, false, 0>, SumsOf<64, kC, false, 1>, kCap>(
          "d64 bounded dyn wgmma", b, true, sl);
    }
    return true;
  }
  if (mode == "window256") {
    // d = 256's window (1024, 0) on a padded call: the dynamic variant's instance (the
    // library's until 1144b1e, tiles.h fwd_padded_window_sm90 false at 256) against the padded
    // window one, which takes the lazy reference (`lazydyn`: 0.947 against itself without it,
    // which had lost -2.5% to +1% to the dynamic one on the H200, NOTES 12.12); 4k / 8k / 16k,
    // causal, two passes. Then d = 128's pair (the padded window instance is the library's
    // there) as the control.
    g_library_schedule = true;
    constexpr int kW = fa::kPaddedWindowVariant, kD = fa::kDynamicVariant;
    constexpr int kWin = kWindow1k | kStaticMask;
    const std::vector<int> wl = {4096, 8192, 16384};
    for (int rep = 0; rep < 2; ++rep) {
      ab_sweep<256, LazyOf<256, kD, -1>, LazyOf<256, kW, -1>, kWindow1k, kWin>(
          "d256 window dyn|padded", b, false, wl);
      ab_sweep<128, LazyOf<128, kD, -1>, LazyOf<128, kW, -1>, kWindow1k, kWin>(
          "d128 window dyn|padded", b, false, wl);
    }
    return true;
  }
  return false;
}
