// tune_fwd90's modes on the modifier instances' softmax chain (benchmarks/NOTES.md 12.29): each
// an interleaved A/B (ab_sweep) of the library's tile against variants of it, on the library's
// schedule, 4k / 16k keys, non-causal and causal, two passes. tune_fwd90.cu runs them through
// run_chain_mode; -DTUNE_FWD90_ALIBI_ONLY builds these modes alone.
#pragma once

#include <string>
#include <vector>

#include "fwd90_harness.h"

// Runs `mode` if it is one of this file's; false otherwise.
inline bool run_chain_mode(const std::string& mode, const Buffers& b) {
  using fa::sm90::FwdTraits;
  const std::vector<int> sl = {4096, 16384};
  // The modes' common frame: the library's schedule, the A/B pairs run twice.
  auto twice = [](auto&& pairs) {
    g_library_schedule = true;
    for (int rep = 0; rep < 2; ++rep) pairs();
  };
  // The library's bounded-reference instances (sm90/fwd_launch.h LibraryFwdTraits): the A side
  // of bounded2 and bounded3.
  using Lib176 = fa::sm90::LibraryFwdTraits<128, fa::kStaticSoftcapVariant, false, true>::Type;
  using LibDyn128 = fa::sm90::LibraryFwdTraits<128, fa::kSoftcapVariant, false, true>::Type;
  using Lib64 = fa::sm90::LibraryFwdTraits<64, fa::kStaticSoftcapVariant, false, true>::Type;
  if (mode == "bounded2") {
    // The bounded reference's instances on other tiles (benchmarks/NOTES.md 12.33): in `bounded`
    // the dynamic d = 128 instance (128 x 128) with it ran as fast as the static one (128 x 176)
    // with it, 7% faster at 4k causal: the static-mask softcap instance on 128 x 128 (the
    // dynamic tile's own-box epilogue, and from the registers); d = 64's static on 128 x 128.
    using S128o1 = FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1, true, false, false,
                             true, true, false, true>;
    using S128o0 = FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 0, true, false, false,
                             true, true, false, true>;
    using S64n = FwdTraits<64, 128, 128, 2, true, 2, 0, true, false, 0, true, false, false, false,
                           true, true, true>;
    twice([&] {
      ab_sweep<128, Lib176, S128o1, kSoftcap | kStaticMask>("d128 bounded st: 128x128 o1", b, true, sl);
      ab_sweep<128, Lib176, S128o0, kSoftcap | kStaticMask>("d128 bounded st: 128x128 o0", b, true, sl);
      ab_sweep<64, Lib64, S64n, kSoftcap | kStaticMask>("d64 bounded st: 128x128", b, true, sl);
    });
    return true;
  }
  if (mode == "bounded3") {
    // benchmarks/NOTES.md 12.34 item 1, on the bounded reference's library instances: a share of
    // the exponentials on the FMA pipe (kPolyEighths) at d = 128 and a larger one at d = 64, now
    // that the bounded step issues fewer instructions; and 128 x 128 against 128 x 176 for causal
    // calls by length (bounded2: 0.93 at 4k causal, 1.01-1.02 at 16k), for a rule like
    // fwd_short_rows_sm90's. ptxas (sm_90a): d = 128 with 1 / 2 eighths spills 72 / 104 bytes
    // (0 without), d = 64 with 1 / 3 84 / 48 (48 with the library's 2).
    using S176e1 = FwdTraits<128, 128, 176, 2, true, 1, 0, true, false, 0, true, false, false,
                             true, true, false, true>;
    using S176e2 = FwdTraits<128, 128, 176, 2, true, 2, 0, true, false, 0, true, false, false,
                             true, true, false, true>;
    using S128o1 = FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1, true, false, false,
                             true, true, false, true>;
    using S64e3 = FwdTraits<64, 192, 128, 2, true, 3, 0, true, false, 0, true, false, false, false,
                            true, true, true>;
    using S64e1 = FwdTraits<64, 192, 128, 2, true, 1, 0, true, false, 0, true, false, false, false,
                            true, true, true>;
    // The used sums under the next S GEMM (FwdTraits kSumsUnderS) on the library's bounded
    // instances.
    using U176 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, true,
                           true, false, true, true>;
    using U128 = FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1, true, false, false, true,
                           true, false, true, true>;
    using U64 = FwdTraits<64, 192, 128, 2, true, 2, 0, true, false, 0, true, false, false, false,
                          true, true, true, true>;
    const std::vector<int> causal_lengths = {1024, 2048, 4096, 8192};
    twice([&] {
      ab_sweep<128, Lib176, U176, kSoftcap | kStaticMask>("d128 bounded st: sums under S", b, true,
                                                        sl);
      ab_sweep<128, LibDyn128, U128, kSoftcap>("d128 bounded dyn: sums under S", b, true, sl);
      ab_sweep<64, Lib64, U64, kSoftcap | kStaticMask>("d64 bounded st: sums under S", b, true, sl);
      ab_sweep<128, Lib176, S176e1, kSoftcap | kStaticMask>("d128 bounded st: exp 1/8", b, true, sl);
      ab_sweep<128, Lib176, S176e2, kSoftcap | kStaticMask>("d128 bounded st: exp 2/8", b, true, sl);
      ab_sweep<128, Lib176, S128o1, kSoftcap | kStaticMask>("d128 bounded st: 128x128 causal", b,
                                                          false, causal_lengths);
      ab_sweep<64, Lib64, S64e3, kSoftcap | kStaticMask>("d64 bounded st: exp 3/8", b, true, sl);
      ab_sweep<64, Lib64, S64e1, kSoftcap | kStaticMask>("d64 bounded st: exp 1/8", b, true, sl);
    });
    return true;
  }
  if (mode == "bounded4") {
    // benchmarks/NOTES.md 12.34 item 3: the bounded reference on the dynamic-mask softcap
    // instances it is off in (knobs.h fwd_bounded_ref_sm90): d = 64 (128 x 128, 2 eighths of the
    // exponentials on the FMA pipe) and d = 256 (128 x 64, the tanh interleaved); the dynamic
    // variant serves varlen and windowed softcap calls (Gemma 2's sliding-window layers). A: the
    // library's running max, B: the same instance bounded.
    using Dyn64 = fa::sm90::LibraryFwdTraits<64, fa::kSoftcapVariant, false, false>::Type;
    using Dyn64b = fa::sm90::LibraryFwdTraits<64, fa::kSoftcapVariant, false, true>::Type;
    using Dyn256 = fa::sm90::LibraryFwdTraits<256, fa::kSoftcapVariant, false, false>::Type;
    using Dyn256b = fa::sm90::LibraryFwdTraits<256, fa::kSoftcapVariant, false, true>::Type;
    twice([&] {
      ab_sweep<64, Dyn64, Dyn64b, kSoftcap>("d64 dyn: bounded", b, true, sl);
      ab_sweep<256, Dyn256, Dyn256b, kSoftcap>("d256 dyn: bounded", b, true, sl);
    });
    return true;
  }
#ifndef TUNE_FWD90_BOUNDED_ONLY  // -DTUNE_FWD90_BOUNDED_ONLY: "bounded2" to "bounded4" alone
  if (mode == "alibichain") {
    // The static-mask ALiBi instance at d = 64 (library: 192 x 128, sum tree; 0.84-0.88 of plain
    // in the features bench at 0ffe10c) against the same kernel with a shorter softmax chain
    // per step: the row max as a tree (kMaxTree), the O rescale under the next S GEMM
    // (kEarlyRescale), both; and against 128 x 128 with ping-pong and 192 x 128 with 3 stages.
    // Why: folding the bias's constant part into the row max (9f7fc52) took half an FADD a
    // score off the issue stream and measured 1-4% slower, as if the step were bound by its
    // dependent chain (S -> bias -> max -> exponentials -> P), not by its instruction count.
    using A64 = FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, false, false, true>;
    using Tree = FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, false, true, true>;
    using Early = FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, true, false, true>;
    using Both = FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, true, true, true>;
    using Pp = FwdTraits<64, 128, 128, 2, true, 0, 0, true, false, 0, false, false, false, true>;
    using S3 = FwdTraits<64, 192, 128, 3, true, 0, 0, true, false, 0, false, false, false, true>;
    twice([&] {
      ab_sweep<64, A64, Tree, kAlibi | kStaticMask>("d64 alibi st: max tree", b, true, sl);
      ab_sweep<64, A64, Early, kAlibi | kStaticMask>("d64 alibi st: early rescale", b, true, sl);
      ab_sweep<64, A64, Both, kAlibi | kStaticMask>("d64 alibi st: both", b, true, sl);
      ab_sweep<64, A64, Pp, kAlibi | kStaticMask>("d64 alibi st: 128x128 pingpong", b, true, sl);
      ab_sweep<64, A64, S3, kAlibi | kStaticMask>("d64 alibi st: 3 stages", b, true, sl);
    });
    return true;
  }
  if (mode == "alibichain128") {
    // As `alibichain`, on the static-mask ALiBi instance at d = 128 (library: 128 x 176, sum
    // tree; 0.90-0.96 of plain at 0ffe10c): the max tree, and the max tree with the early
    // rescale (the d = 64 instance's since alibichain). Also d = 64's library tile (now both)
    // against the max tree alone once more.
    using A128 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, true>;
    using Tree128 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, true, true>;
    using Both128 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, true, true, true>;
    using Both64 = FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, true, true, true>;
    using Tree64 = FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, false, true, true>;
    twice([&] {
      ab_sweep<128, A128, Tree128, kAlibi | kStaticMask>("d128 alibi st: max tree", b, true, sl);
      ab_sweep<128, A128, Both128, kAlibi | kStaticMask>("d128 alibi st: both", b, true, sl);
      ab_sweep<64, Both64, Tree64, kAlibi | kStaticMask>("d64 alibi st: both -> max tree", b, true, sl);
    });
    return true;
  }
  if (mode == "alibihoist") {
    // ALiBi's slope (a global load and a MUFU.RCP) built at every key block, right after the S
    // GEMM's wait (A, before ece7f2f) or once a tile (B, FwdTraits kModsPerTile: benchmarks/NOTES.md
    // 12.29 item 7, 12.31), on the library's ALiBi tiles: static d = 64 / 128 / 256 and the
    // dynamic variant at d = 64 (varlen / window calls). The library: knobs.h
    // fwd_mods_per_tile_sm90 (A at d = 64 static since 12.31).
    using A64 = FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, true, true, true, false>;
    using B64 = FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, true, true, true, true>;
    using A128 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, true, false>;
    using B128 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, true, true>;
    using A256 = FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2, false, true, true, true, false>;
    using B256 = FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2, false, true, true, true, true>;
    using A64d = FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, false, false, true, false>;
    using B64d = FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, false, false, true, true>;
    twice([&] {
      ab_sweep<64, A64, B64, kAlibi | kStaticMask>("d64 alibi st: per tile", b, true, sl);
      ab_sweep<128, A128, B128, kAlibi | kStaticMask>("d128 alibi st: per tile", b, true, sl);
      ab_sweep<256, A256, B256, kAlibi | kStaticMask>("d256 alibi st: per tile", b, true, sl);
      ab_sweep<64, A64d, B64d, kAlibi>("d64 alibi dyn: per tile", b, true, sl);
    });
    return true;
  }
  if (mode == "alibiwidth") {
    // The d = 64 static ALiBi instance (192 x 128 with the max tree and the early rescale, the
    // library's since 9508dce) against 96-key blocks with the same extras (a shorter chain a
    // step against more steps; 160 keys spill 208 bytes and serialize the wgmmas, C7512) and
    // against 1 of 8 exponentials on the FMA pipe (a shorter MUFU phase in the chain).
    using A64 = FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, true, true, true>;
    using N96 = FwdTraits<64, 192, 96, 2, true, 0, 0, true, false, 0, false, true, true, true>;
    using Poly1 = FwdTraits<64, 192, 128, 2, true, 1, 0, true, false, 0, false, true, true, true>;
    twice([&] {
      ab_sweep<64, A64, N96, kAlibi | kStaticMask>("d64 alibi st: 192x96", b, true, sl);
      ab_sweep<64, A64, Poly1, kAlibi | kStaticMask>("d64 alibi st: poly 1/8", b, true, sl);
    });
    return true;
  }
  if (mode == "capchain") {
    // As `alibichain`, on the static-mask softcap instances: d = 64 (library: 192 x 128, 2 of 8
    // exponentials on the FMA pipe, no sum tree; the max after the tanh) with the max tree, the
    // early rescale, both; d = 128 (128 x 176, the max over the raw scores beside the tanh
    // stream, sum tree) with the early rescale.
    using C64 = FwdTraits<64, 192, 128, 2, true, 2, 0, true, false, 0, false, false, false, false>;
    using C64Tree = FwdTraits<64, 192, 128, 2, true, 2, 0, true, false, 0, false, false, true, false>;
    using C64Early = FwdTraits<64, 192, 128, 2, true, 2, 0, true, false, 0, false, true, false, false>;
    using C64Both = FwdTraits<64, 192, 128, 2, true, 2, 0, true, false, 0, false, true, true, false>;
    using C128 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, true>;
    using C128Early = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, true, false, true>;
    twice([&] {
      ab_sweep<64, C64, C64Tree, kSoftcap | kStaticMask>("d64 cap st: max tree", b, true, sl);
      ab_sweep<64, C64, C64Early, kSoftcap | kStaticMask>("d64 cap st: early rescale", b, true, sl);
      ab_sweep<64, C64, C64Both, kSoftcap | kStaticMask>("d64 cap st: both", b, true, sl);
      ab_sweep<128, C128, C128Early, kSoftcap | kStaticMask>("d128 cap st: early rescale", b, true, sl);
    });
    return true;
  }
  if (mode == "capinterleave") {
    // Softcap's tanh stream (benchmarks/NOTES.md 12.31 item 5: the step's extra time, issued as
    // TANH x 88 then EX2 x 88 a lane) against each score's tanh issued in the exponentials' loop
    // (FwdTraits kCapInterleave, on kCapAfterMax's blocks without an element mask): the library's
    // static d = 128 (128 x 176) and dynamic d = 128 (128 x 128) softcap instances; at d = 64
    // (192 x 128, the tanh before the max in the library) the raw-max form alone and with it.
    using S128 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, true>;
    using S128i = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, true,
                            true, true>;
    using D128 = FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1, true, false, false, true>;
    using D128i = FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1, true, false, false, true,
                            true, true>;
    using S64 = FwdTraits<64, 192, 128, 2, true, 2, 0, true, false, 0, false, false, false, false>;
    using S64m = FwdTraits<64, 192, 128, 2, true, 2, 0, true, false, 0, true, false, false, false>;
    using S64i = FwdTraits<64, 192, 128, 2, true, 2, 0, true, false, 0, true, false, false, false,
                           true, true>;
    twice([&] {
      ab_sweep<128, S128, S128i, kSoftcap | kStaticMask>("d128 cap st: interleave", b, true, sl);
      ab_sweep<128, D128, D128i, kSoftcap>("d128 cap dyn: interleave", b, true, sl);
      ab_sweep<64, S64, S64m, kSoftcap | kStaticMask>("d64 cap st: raw max", b, true, sl);
      ab_sweep<64, S64, S64i, kSoftcap | kStaticMask>("d64 cap st: raw max + interleave", b, true,
                                                       sl);
    });
    return true;
  }
  if (mode == "capinterleave2") {
    // capinterleave's d = 64 win (12.33: the raw max with each tanh in the exponentials' loop,
    // time 0.94-0.96 on the static 192 x 128) tried on the other softcap instances the library
    // builds without the raw max: d = 64 dynamic (128 x 128), d = 256 static (128 x 80) and
    // dynamic (128 x 64).
    using D64 = FwdTraits<64, 128, 128, 2, true, 2, 0, true, false, 0, false, false, false, false>;
    using D64i = FwdTraits<64, 128, 128, 2, true, 2, 0, true, false, 0, true, false, false, false,
                           true, true>;
    using S256 = FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2, false, false, false, true>;
    using S256i = FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2, true, false, false, true,
                            true, true>;
    using D256 = FwdTraits<256, 128, 64, 2, true, 0, 0, true, false, 2, false, false, false, true>;
    using D256i = FwdTraits<256, 128, 64, 2, true, 0, 0, true, false, 2, true, false, false, true,
                            true, true>;
    twice([&] {
      ab_sweep<64, D64, D64i, kSoftcap>("d64 cap dyn: raw max + interleave", b, true, sl);
      ab_sweep<256, S256, S256i, kSoftcap | kStaticMask>("d256 cap st: raw max + interleave", b,
                                                          true, sl);
      ab_sweep<256, D256, D256i, kSoftcap>("d256 cap dyn: raw max + interleave", b, true, sl);
    });
    return true;
  }
  if (mode == "bounded") {
    // FwdTraits kBoundedRef (benchmarks/NOTES.md 12.33): softcap 30 in bf16 with each row's
    // exponents against a reference fixed at its first key block (no row max, no quad
    // reduction, no O rescale after it; each unmasked score's tanh beside its exponential) and
    // 1 / l from mma.sync sums of the 16-bit P, against the library's softcap instances: static
    // d = 64 (192 x 128), 128 (128 x 176), 256 (128 x 80), dynamic d = 128 (128 x 128).
    // Session 17 measured the idea at ~+3% on an older kernel, with the used sums formed on the
    // FMA pipe (1 FADD + unpack a score) instead of by the tensor cores.
    using S64 = FwdTraits<64, 192, 128, 2, true, 2, 0, true, false, 0, true, false, false, false,
                          true, true>;
    using S64b = FwdTraits<64, 192, 128, 2, true, 2, 0, true, false, 0, true, false, false, false,
                           true, true, true>;
    using S128 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, true>;
    using S128b = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, true,
                            true, false, true>;
    using S256 = FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2, false, false, false, true>;
    using S256b = FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2, false, false, false, true,
                            true, false, true>;
    using D128 = FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1, true, false, false, true>;
    using D128b = FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1, true, false, false, true,
                            true, false, true>;
    twice([&] {
      ab_sweep<128, S128, S128b, kSoftcap | kStaticMask>("d128 cap st: bounded", b, true, sl);
      ab_sweep<128, D128, D128b, kSoftcap>("d128 cap dyn: bounded", b, true, sl);
      ab_sweep<64, S64, S64b, kSoftcap | kStaticMask>("d64 cap st: bounded", b, true, sl);
      ab_sweep<256, S256, S256b, kSoftcap | kStaticMask>("d256 cap st: bounded", b, true, sl);
    });
    return true;
  }
  if (mode == "capphases") {
    // Where a softcap step's time goes (benchmarks/NOTES.md 12.32 item 2): the phase clocks
    // (fwd_clock.h, FwdTraits kStamps) on the library's static instances, plain attention and
    // softcap 30 on the same tile and knobs as the library gives each (d = 64 192 x 128: softcap
    // with 2 of 8 exponentials on the FMA pipe and no sum tree; d = 128 128 x 176: both alike),
    // 4k and 16k, non-causal and causal.
    const size_t stamp_slots = size_t{16384} * 3 * fa::sm90::kFwdClockSlots;
    unsigned long long* stamps = nullptr;
    CHECK(cudaMalloc(&stamps, stamp_slots * 8));
    using Plain64 = FwdTraits<64, 192, 128, 2, true, 0, 0, true, true, 0, false, false, false, true>;
    using Cap64 = FwdTraits<64, 192, 128, 2, true, 2, 0, true, true, 0, false, false, false, false>;
    using Both128 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, true, 0, true, false, false, true>;
    for (int seqlen : sl) {
      for (bool causal : {false, true}) {
        phases<64, Plain64>("d64 plain", b, stamps, stamp_slots, seqlen, causal);
        phases<64, Cap64, kSoftcap | kStaticMask>("d64 softcap", b, stamps, stamp_slots, seqlen,
                                                  causal);
        phases<128, Both128>("d128 plain", b, stamps, stamp_slots, seqlen, causal);
        phases<128, Both128, kSoftcap | kStaticMask>("d128 softcap", b, stamps, stamp_slots,
                                                     seqlen, causal);
      }
    }
    CHECK(cudaFree(stamps));
    return true;
  }
#endif  // TUNE_FWD90_BOUNDED_ONLY
  return false;
}
