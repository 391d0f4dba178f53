// The persistent causal walk's balance at the bench's shapes (host only, no GPU): for each tile
// and length, the busiest CTA's load over the mean with the L2's group of heads
// (fwd_launch.h l2_head_group), with fwd_walk_group's bounded by it (problem/scheduler.h
// balanced_group_heads) and with the library's wider bound (kWalkGroupCap x the L2's; the group
// size where it differs), 132 CTAs, batch 16k / seqlen, 2048 / d heads, causal, query blocks
// aligned to the last row where the tile takes the shift. benchmarks/NOTES.md 12.65 has the
// numbers. Its L2 group and causal key-block counts restate fwd_launch.h l2_head_group and
// problem/mask.h's causal rule for seqlen_q == seqlen_k (that header needs the CUDA driver's).
//   g++ -std=c++17 -O2 -Icsrc/flash -I<cuda>/include benchmarks/tune/walk_balance.cpp -o /tmp/wb
//   /tmp/wb [L2 MiB ...]        (default: 50 60)
#include <cuda_runtime.h>  // __host__ / __device__ for the shared header

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "problem/scheduler.h"

int main(int argc, char** argv) {
  std::vector<int> l2s;
  for (int i = 1; i < argc; ++i) l2s.push_back(std::atoi(argv[i]));
  if (l2s.empty()) l2s = {50, 60};
  constexpr double kFixed = 1.5;  // fwd_launch.h kFwdTileFixedSteps
  struct Tile {
    int d, bm, bn;
    bool shift;
  };
  const Tile tiles[] = {{64, 128, 128, true},  {64, 192, 128, true}, {128, 128, 128, false},
                        {128, 128, 176, true}, {256, 128, 64, false}, {256, 128, 80, true}};
  for (int l2_mib : l2s) {
    std::printf("L2 %d MiB: longest CTA / mean, the L2's group -> the balanced one -> up to %gx "
                "the L2's [its group / the L2's]\n", l2_mib, flashattn_cu::kWalkGroupCap);
    for (const Tile& t : tiles) {
      std::printf("d %3d %dx%d:", t.d, t.bm, t.bn);
      for (int s : {1024, 1536, 2048, 2560, 3072, 3584, 4096, 4608, 5120, 6144, 7168, 8192, 12288,
                    16384}) {
        const int heads = (16384 / s) * (2048 / t.d);
        const int num_m = (s + t.bm - 1) / t.bm, shift = t.shift ? num_m * t.bm - s : 0;
        std::vector<int> blocks(num_m);
        double total = 0.0;
        for (int m = 0; m < num_m; ++m) {
          const int last_row = (m + 1) * t.bm - shift - 1;  // causal, seqlen_q == seqlen_k
          blocks[m] = last_row / t.bn + 1;
          total += (blocks[m] + kFixed) * heads;
        }
        const long long kv = static_cast<long long>(s) * t.d * 4;
        const int l2_group = static_cast<int>(
            std::max(1LL, std::min<long long>(heads, l2_mib * (1LL << 19) / kv)));
        std::vector<double> diff;
        const double mean = total / 132;
        const double before = flashattn_cu::grouped_walk_longest(blocks.data(), num_m, heads,
                                                                 l2_group, 132, kFixed, diff);
        const int group =
            flashattn_cu::balanced_group_heads(blocks.data(), num_m, heads, l2_group, 132, kFixed);
        const double after = flashattn_cu::grouped_walk_longest(blocks.data(), num_m, heads, group,
                                                                132, kFixed, diff);
        const int wide = flashattn_cu::balanced_group_heads(blocks.data(), num_m, heads, l2_group,
                                                            132, kFixed,
            static_cast<int>(flashattn_cu::kWalkGroupCap * l2_group));
        const double wider = flashattn_cu::grouped_walk_longest(blocks.data(), num_m, heads, wide,
                                                                132, kFixed, diff);
        std::printf(" %gk %.3f->%.3f", s / 1024.0, before / mean, after / mean);
        if (wide != group) std::printf("->%.3f[%d/%d]", wider / mean, wide, l2_group);
      }
      std::printf("\n");
    }
  }
  return 0;
}
