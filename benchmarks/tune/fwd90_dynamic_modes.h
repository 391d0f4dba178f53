// tune_fwd90's modes of session 57 (benchmarks/NOTES.md 12.71-12.72): `dyn256`, d 256's causal
// calls on the dynamic tile scheduler (sm90/fwd_launch.h: a CTA per SM taking the per-tile
// order's tiles from a counter; FwdTraits kPublishTiles) against the library's schedule.
//
// Why (NOTES 12.71 item 4): on the dynamic scheduler d 256's short causal calls (512-2k keys) ran
// 6-8% slower than one CTA per tile, and the persistent grid is slower there too, while cuDNN
// runs them 11-15% faster than we do (H100). The tile stages O in Q's buffer (FwdTraits kOInQ), so
// a CTA that walks on waits for its O stores before its next Q loads, where a fresh CTA's Q, K
// and V loads all start at once. With O stored from the registers (kTmaStoreO 0) the next Q
// waits only for the last S GEMMs: if that walk beats one CTA per tile, the library takes it.
#pragma once

#include <string>
#include <vector>

#include "fwd90_harness.h"
#include "fwd90_serial_modes.h"

// The library's static d 256 configuration (kShort: its short-row tile) with kTmaStoreO kOStore
// (-1: the tile's) and the producer handing out the tiles (kPublish).
template <bool kShort, int kOStore, bool kPublish>
using Dyn256 = typename fa::sm90::LibraryFwdTraits<256, fa::kStaticVariant, kShort, false, false,
                                                   false, false, kOStore, kPublish>::Type;

// One causal call of each length on the library's configuration and schedule (A) against
// configuration TraitsB launched one CTA per tile in head-after-head order (B), with the call's
// workspace (the dynamic scheduler, where TraitsB publishes its tiles) when `dynamic`, else
// without (one CTA per tile, or with `persistent` the persistent grid); timed as g_ab_flush says,
// both outputs checked against the sm80 kernel.
template <typename TraitsA, typename TraitsB>
void dynamic_ab(const char* name, const Buffers& b, const std::vector<int>& seqlens, bool dynamic,
                bool persistent, int* counter) {
  for (int seqlen : seqlens) {
    fa::FwdParams p = causal_case<256>(b, seqlen);
    auto library = [&] {
      g_library_schedule = true;
      return run_sm90<TraitsA>(p);
    };
    fa::FwdParams pb = p;
    if (dynamic) {
      pb.workspace = counter;
      pb.workspace_bytes = fa::kFwdWorkspaceBytes;
    }
    auto other = [&] {
      g_library_schedule = false;
      g_causal_persistent = persistent;
      g_causal_order = 0;
      return run_sm90<TraitsB>(pb);
    };
    const WalkAb r = walk_ab(b, p, library, other);
    const double flops = call_flops(p, kNoMods);
    std::printf("%-28s d=256 s=%5d causal, %s, B %s: library %6.1f  B %6.1f TFLOP/s  B/A time "
                "%.3f  max|diff| %.1e %.1e%s\n",
                name, seqlen, g_ab_flush > 0 ? "L2 flushed" : "back to back",
                dynamic ? "dynamic" : persistent ? "persistent" : "one CTA a tile",
                flops / r.t.a_ms * 1e-9, flops / r.t.b_ms * 1e-9, r.t.b_over_a, r.diff_a,
                r.diff_b, r.ok ? "" : "  WRONG");
    std::fflush(stdout);
  }
  g_library_schedule = true;
  g_causal_persistent = true;
}

// Runs `mode` if it is this file's; false otherwise.
inline bool run_dynamic_mode(const std::string& mode, const Buffers& b) {
  if (mode != "dyn256") return false;
  int* counter = nullptr;
  CHECK(cudaMalloc(&counter, fa::kFwdWorkspaceBytes));
  const std::vector<int> short_rows = {512, 768, 1024, 1536, 2048};
  const std::vector<int> long_rows = {4096, 6144, 8192};
  for (int rep = 0; rep < 2; ++rep) {
    // The short tile (128 x 64; the library: one CTA per tile up to 1k keys, persistent above):
    // O staged in Q's buffer on the dynamic walk; O from the registers on the dynamic walk, on
    // the persistent grid and one CTA per tile.
    using Short = LibStatic<256, true>;
    dynamic_ab<Short, Dyn256<true, -1, true>>("d256 128x64 O in Q", b, short_rows, true, false,
                                              counter);
    dynamic_ab<Short, Dyn256<true, 0, true>>("d256 128x64 O regs", b, short_rows, true, false,
                                             counter);
    dynamic_ab<Short, Dyn256<true, 0, false>>("d256 128x64 O regs", b, short_rows, false, true,
                                              counter);
    dynamic_ab<Short, Dyn256<true, 0, false>>("d256 128x64 O regs", b, short_rows, false, false,
                                              counter);
    // The long tile (128 x 80; the library: persistent at 4k, one CTA per tile past it).
    using Long = LibStatic<256>;
    dynamic_ab<Long, Dyn256<false, 0, true>>("d256 128x80 O regs", b, long_rows, true, false,
                                             counter);
  }
  CHECK(cudaFree(counter));
  return true;
}
