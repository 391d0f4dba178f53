// tune_fwd90's `serial3` mode: three consumers at d = 128 on a step without the overlap of a
// consumer's two GEMMs (FwdTraits kSerialPV), against the library's static tiles. tune_fwd90.cu
// runs it through run_serial_mode; -DTUNE_FWD90_SERIAL_ONLY builds this mode alone.
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

// Runs `mode` if it is this file's; false otherwise.
inline bool run_serial_mode(const std::string& mode, const Buffers& b) {
  if (mode != "serial3") return false;
  using fa::sm90::FwdTraits;
  using fa::sm90::LibraryFwdTraits;
  g_library_schedule = true;
  // The library's static instances (A): d = 128 128 x 176, d = 64 192 x 128, the bf16 softcap
  // 30 bounded static instance at d = 128 (128 x 176).
  using Lib128 = LibraryFwdTraits<128, fa::kStaticVariant, false, false>::Type;
  using Lib64 = LibraryFwdTraits<64, fa::kStaticVariant, false, false>::Type;
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
