// Brute-force checks of the tile scheduler's host-callable math (problem/scheduler.h; no GPU, no
// API call): the persistent forward's tile orders, the light query / key blocks of a left
// window, the backward's key-tile order, the compact varlen tiles (and the backward
// preprocess's row blocks of a varlen call), the persistent causal walk's balance. Run by
// api_checks (api_checks.cpp's main: run_scheduler_checks), built by CMake's ctest (.ci/run).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "flashattn_cu/flashattn_cu.h"

#include "bwd/params.h"  // the backward preprocess's varlen row blocks
#include "checks.h"
#include "problem/scheduler.h"

namespace {

using flashattn_cu::FwdParams;
using flashattn_cu_checks::expect;

// The compact varlen tiles (problem/scheduler.h: query_tile_of, key_tile_of) by brute force over
// random length lists (zeros, ones, one long entry, entries of whole blocks, rows past the last
// entry): every (entry, head / slice, block) that holds rows exactly once, in query_tile's /
// key_tile_at's order (entry-major, then slice; query blocks longest first, key blocks in
// order), every other tile past its entry's rows or past the bound the kernels skip at; the
// tile count within total / block + batch slots a slice; the padded layout's order unchanged.
// Contradictory arrays (decreasing, past total) give only skipped tiles or in-range entries.
void check_varlen_tiles() {
  bool cover = true, order = true, bound = true, padded = true, garbage = true, prep = true;
  int compact_trials = 0;
  uint32_t rng = 12345u;
  auto next = [&rng](int n) {
    rng = rng * 1664525u + 1013904223u;
    return static_cast<int>((rng >> 8) % static_cast<uint32_t>(n));
  };
  for (int trial = 0; trial < 400; ++trial) {
    const int batch = 1 + next(trial < 200 ? 9 : 60);
    const int block = trial % 4 == 0 ? 64 : trial % 4 == 1 ? 128 : trial % 4 == 2 ? 176 : 192;
    const int heads = 1 + next(4), splits = 1 + next(3);
    std::vector<int> cu(batch + 1, 0);
    int longest = 0;
    for (int b = 0; b < batch; ++b) {
      const int kind = next(6);
      const int len = kind == 0 ? 0 : kind == 1 ? 1 : kind == 2 ? block * (1 + next(3))
                    : kind == 3 ? 3000 + next(2000) : next(3 * block);
      cu[b + 1] = cu[b] + len;
      longest = std::max(longest, len);
    }
    const int total = cu[batch] + (trial % 3 == 0 ? next(700) : 0);  // rows past the last entry
    FwdParams p;
    p.batch = batch;
    p.num_heads = heads;
    p.num_heads_k = heads;
    p.seqlen_q = longest;  // max_seqlen_q
    p.seqlen_k = longest;
    p.cu_seqlens_q = cu.data();
    p.cu_seqlens_k = cu.data();
    p.total_q = total;
    p.total_k = total;
    const int num_m = (longest + block - 1) / block;
    const int64_t tiles = flashattn_cu::query_tiles_of(p, block);
    // Compact only with fewer slots than the padded grid's batch x num_m blocks a head.
    const int64_t slots = static_cast<int64_t>(total) / block + batch;
    const bool compact = slots < static_cast<int64_t>(batch) * num_m;
    compact_trials += compact;
    bound = bound && flashattn_cu::compact_query_tiles(p, block) == compact &&
            tiles == (compact ? heads * slots : flashattn_cu::query_tile_count(num_m, batch, heads));
    std::vector<int> seen;
    auto blocks_of = [&](int b) { return (cu[b + 1] - cu[b] + block - 1) / block; };
    auto id = [&](int b, int slices, int slice, int m) {
      int64_t at = 0;
      for (int e = 0; e < b; ++e) at += static_cast<int64_t>(blocks_of(e)) * slices;
      return at + static_cast<int64_t>(slice) * blocks_of(b) + m;
    };
    int64_t count = 0;
    for (int b = 0; b < batch; ++b) count += static_cast<int64_t>(blocks_of(b)) * heads;
    seen.assign(count, 0);
    int64_t prev = -1;
    for (int64_t i = 0; i < tiles; ++i) {
      const flashattn_cu::QueryTile t = flashattn_cu::query_tile_of<true>(p, block, i);
      if (t.batch < 0 || t.batch >= batch || t.head < 0 || t.head >= heads || t.m_block < 0) {
        cover = false;
        break;
      }
      const int len = cu[t.batch + 1] - cu[t.batch];
      if (static_cast<int64_t>(t.m_block) * block >= len) continue;  // the kernels' skip
      const int64_t at = id(t.batch, heads, t.head, t.m_block);
      ++seen[at];
      // (entry, head) in order, query blocks longest first within one.
      const int64_t key = (static_cast<int64_t>(t.batch) * heads + t.head) * (num_m + 1) +
                          (num_m - t.m_block);
      if (key <= prev) order = false;
      prev = key;
    }
    for (int c : seen) cover = cover && c == 1;
    // The block-major order (query_tile_of block_major: FwdVarlenOrder::kBlocks): the same tiles
    // exactly once, within an entry block after block (every head's block m before any head's
    // m - 1); the padded layout ignores it.
    seen.assign(count, 0);
    prev = -1;
    for (int64_t i = 0; i < tiles; ++i) {
      const flashattn_cu::QueryTile t = flashattn_cu::query_tile_of<true>(p, block, i, true);
      if (t.batch < 0 || t.batch >= batch || t.head < 0 || t.head >= heads || t.m_block < 0) {
        cover = false;
        break;
      }
      const int len = cu[t.batch + 1] - cu[t.batch];
      if (!compact) {
        const flashattn_cu::QueryTile u = flashattn_cu::query_tile_of<true>(p, block, i);
        order = order && u.batch == t.batch && u.head == t.head && u.m_block == t.m_block;
      }
      if (static_cast<int64_t>(t.m_block) * block >= len) continue;
      ++seen[id(t.batch, heads, t.head, t.m_block)];
      if (compact) {
        const int64_t key = (static_cast<int64_t>(t.batch) * (num_m + 1) + (num_m - t.m_block)) *
                                heads + t.head;
        if (key <= prev) order = false;
        prev = key;
      }
    }
    for (int c : seen) cover = cover && c == 1;
    // The backward preprocess's blocks (bwd/params.h prep_block_at): every row of every (entry,
    // head) below its length rounded up to kBwdRowPad (the P = 0 padding the main kernels read)
    // exactly once, in either grid.
    {
      using flashattn_cu::backward::kBwdRowPad;
      const int64_t ws_rows = (static_cast<int64_t>(longest) + kBwdRowPad - 1) / kBwdRowPad * kBwdRowPad;
      std::vector<int64_t> first_row(batch + 1, 0);
      for (int b = 0; b < batch; ++b) {
        const int64_t padded_len = (cu[b + 1] - cu[b] + kBwdRowPad - 1) / kBwdRowPad * kBwdRowPad;
        first_row[b + 1] = first_row[b] + padded_len * heads;
      }
      std::vector<int> rows_seen(first_row[batch], 0);
      const int64_t blocks = flashattn_cu::backward::prep_blocks(p, ws_rows);
      for (int64_t i = 0; i < blocks && prep; ++i) {
        const flashattn_cu::backward::PrepBlock blk =
            flashattn_cu::backward::prep_block_at<true>(p, ws_rows, i);
        if (!blk.valid) continue;
        if (blk.batch < 0 || blk.batch >= batch || blk.head < 0 || blk.head >= heads ||
            blk.row0 < 0) {
          prep = false;
          break;
        }
        const int64_t padded_len =
            (cu[blk.batch + 1] - cu[blk.batch] + kBwdRowPad - 1) / kBwdRowPad * kBwdRowPad;
        for (int r = 0; r < flashattn_cu::backward::kPrepRowsPerBlock; ++r) {
          const int64_t row = blk.row0 + r;
          if (row < padded_len) ++rows_seen[first_row[blk.batch] + blk.head * padded_len + row];
        }
      }
      for (int c : rows_seen) prep = prep && c == 1;
    }
    // Key tiles: kv heads x splits slices, key blocks in order.
    const int64_t ktiles = flashattn_cu::key_tiles_of(p, block, splits);
    // (total_k 0 means unknown: the padded count, 0 blocks when every entry is empty.)
    bound = bound && ktiles == (total > 0 && compact
                                    ? static_cast<int64_t>(heads) * splits * slots
                                    : flashattn_cu::key_tile_count(num_m, batch, heads, splits));
    count = 0;
    for (int b = 0; b < batch; ++b) count += static_cast<int64_t>(blocks_of(b)) * heads * splits;
    seen.assign(count, 0);
    prev = -1;
    for (int64_t i = 0; i < ktiles; ++i) {
      const flashattn_cu::KeyTile t = flashattn_cu::key_tile_of<true>(p, block, splits, i);
      if (t.batch < 0 || t.batch >= batch || t.head_k < 0 || t.head_k >= heads || t.split < 0 ||
          t.split >= splits || t.n_block < 0) {
        cover = false;
        break;
      }
      const int len = cu[t.batch + 1] - cu[t.batch];
      if (static_cast<int64_t>(t.n_block) * block >= len) continue;
      const int slice = t.head_k * splits + t.split;
      ++seen[id(t.batch, heads * splits, slice, t.n_block)];
      const int64_t key =
          (static_cast<int64_t>(t.batch) * heads * splits + slice) * (num_m + 1) + t.n_block;
      if (key <= prev) order = false;
      prev = key;
    }
    for (int c : seen) cover = cover && c == 1;
    // Without total_k the key tiles stay padded (key_tile_at's), as without cu_seqlens.
    FwdParams q = p;
    q.total_k = 0;
    padded = padded && flashattn_cu::key_tiles_of(q, block, splits) ==
                           flashattn_cu::key_tile_count(num_m, batch, heads, splits);
    for (int64_t i = 0; i < flashattn_cu::key_tiles_of(q, block, splits) && padded; ++i) {
      const flashattn_cu::KeyTile a = flashattn_cu::key_tile_of<true>(q, block, splits, i);
      const flashattn_cu::KeyTile c =
          flashattn_cu::key_tile_at(static_cast<int>(i), num_m, splits, heads);
      padded = a.batch == c.batch && a.head_k == c.head_k && a.split == c.split &&
               a.n_block == c.n_block;
    }
    q = p;
    q.cu_seqlens_q = nullptr;
    q.cu_seqlens_k = nullptr;
    padded = padded && flashattn_cu::query_tiles_of(q, block) ==
                           flashattn_cu::query_tile_count(num_m, batch, heads);
    for (int64_t i = 0; i < flashattn_cu::query_tiles_of(q, block) && padded; ++i) {
      const flashattn_cu::QueryTile a = flashattn_cu::query_tile_of<true>(q, block, i);
      const flashattn_cu::QueryTile c =
          flashattn_cu::query_tile_at(static_cast<int>(i), num_m, heads);
      padded = a.batch == c.batch && a.head == c.head && a.m_block == c.m_block;
    }
    // Contradictory arrays: entries in range, skipped or not, never a crash.
    std::vector<int> bad(batch + 1);
    for (int b = 0; b <= batch; ++b) bad[b] = next(2 * total + 2) - (b == 0 ? 0 : next(50));
    q = p;
    q.cu_seqlens_q = bad.data();
    for (int64_t i = 0; i < tiles; ++i) {
      const flashattn_cu::QueryTile t = flashattn_cu::query_tile_of<true>(q, block, i);
      garbage = garbage && t.batch >= 0 && t.batch < batch && t.head >= 0 && t.head < heads &&
                t.m_block >= 0;
    }
  }
  {
    // The rule: a buffer padded far past its last entry (4 entries under max_seqlen 256, 16k
    // rows) keeps the padded grid (8 blocks of 128 a head against 132 slots); a skewed pack
    // (266 entries under 8192, 128k rows: 17,024 against 1,290) is compact; max_seqlen 0 has
    // no tile either way.
    std::vector<int> cu4 = {0, 100, 300, 356, 600};
    FwdParams p;
    p.batch = 4;
    p.num_heads = 2;
    p.seqlen_q = 256;
    p.cu_seqlens_q = cu4.data();
    p.total_q = 16384;
    bool rule = !flashattn_cu::compact_query_tiles(p, 128) &&
                flashattn_cu::query_tiles_of(p, 128) == 2 * 4 * 2;
    p.total_q = 600;
    rule = rule && flashattn_cu::compact_query_tiles(p, 128) == (600 / 128 + 4 < 4 * 2);
    std::vector<int> cu266(267, 0);
    for (int b = 0; b < 266; ++b) cu266[b + 1] = cu266[b] + (b == 0 ? 8192 : 462);
    p.batch = 266;
    p.seqlen_q = 8192;
    p.cu_seqlens_q = cu266.data();
    p.total_q = cu266[266];
    rule = rule && flashattn_cu::compact_query_tiles(p, 128) &&
           flashattn_cu::query_tiles_of(p, 128) == 2 * (p.total_q / 128 + 266);
    p.seqlen_q = 0;
    rule = rule && !flashattn_cu::compact_query_tiles(p, 128) &&
           flashattn_cu::query_tiles_of(p, 128) == 0;
    expect(rule, "varlen compact tiles: only where fewer than the padded grid's");
  }
  std::printf("     (%d of 400 random packs compact)\n", compact_trials);
  expect(compact_trials >= 100 && compact_trials <= 380,
         "varlen compact tiles: the random packs cover both grids");
  expect(cover, "varlen compact tiles: every (entry, head / slice, block) with rows exactly once");
  expect(order, "varlen compact tiles: query_tile's and key_tile_at's orders");
  expect(bound, "varlen compact tiles: heads x (total / block + batch) tiles");
  expect(padded, "varlen compact tiles: padded calls and total_k 0 keep the padded orders");
  expect(garbage, "varlen compact tiles: contradictory cu_seqlens give in-range entries");
  expect(prep, "backward preprocess blocks: every padded row of every (entry, head) exactly once");
}

// The persistent causal walk's balance (problem/scheduler.h grouped_walk_longest,
// balanced_group_heads) against a brute-force walk: every tile of every CTA through
// cta_tile_index and query_tile_at, with random key blocks per query block (zeros included),
// heads, group sizes and CTA counts (every tile walked exactly once, whatever the group); the
// chosen group within [ceil(max / 2), max] and never longer than the L2's; with a wider bound,
// the bounded choice or a wider group whose weighed walk (kWalkL2Penalty) is lighter.
void check_walk_balance() {
  bool exact = true, chosen = true, covered = true, wider = true;
  uint32_t rng = 777u;
  auto next = [&rng](int n) {
    rng = rng * 1664525u + 1013904223u;
    return static_cast<int>((rng >> 8) % static_cast<uint32_t>(n));
  };
  std::vector<double> diff;
  for (int trial = 0; trial < 400; ++trial) {
    const int num_m = 1 + next(24), total = 1 + next(300), ctas = 1 + next(140);
    const int group = 1 + next(total);
    std::vector<int> blocks(num_m);
    for (int& b : blocks) b = next(5) == 0 ? 0 : 1 + next(40);
    const double fixed = 0.5 * next(4);
    const int tiles = num_m * total;
    std::vector<double> load(ctas, 0.0);
    std::vector<int> seen(tiles, 0);
    for (int cta = 0; cta < ctas; ++cta) {
      for (int k = 0;; ++k) {
        const int index = flashattn_cu::cta_tile_index(k, cta, ctas);
        if (index >= tiles) break;
        const flashattn_cu::QueryTile t =
            flashattn_cu::query_tile_at(index, num_m, total, group, total, 0);
        ++seen[t.head * num_m + t.m_block];
        const int b = blocks[t.m_block];
        load[cta] += b > 0 ? b + fixed : 0.0;
      }
    }
    covered = covered && std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; });
    const double brute = *std::max_element(load.begin(), load.end());
    const double fast = flashattn_cu::grouped_walk_longest(blocks.data(), num_m, total, group,
                                                           ctas, fixed, diff);
    exact = exact && std::fabs(brute - fast) <= 1e-9 * (1.0 + brute);
    const int g = flashattn_cu::balanced_group_heads(blocks.data(), num_m, total, group, ctas,
                                                     fixed);
    const double with_g =
        flashattn_cu::grouped_walk_longest(blocks.data(), num_m, total, g, ctas, fixed, diff);
    chosen = chosen && g >= 1 && g <= group && (group == 1 || ctas == 1 || g >= (group + 1) / 2) &&
             with_g <= fast * (1.0 + 1e-9);
    // With a wider bound (up to 4x): the bounded choice, or a wider size whose longest walk,
    // weighed by kWalkL2Penalty per doubling past the L2's group, is lighter than it.
    const int cap = group + next(3 * group + 1);
    const int w = flashattn_cu::balanced_group_heads(blocks.data(), num_m, total, group, ctas,
                                                     fixed, cap);
    const double with_w =
        flashattn_cu::grouped_walk_longest(blocks.data(), num_m, total, w, ctas, fixed, diff);
    wider = wider && (w == g || (w > group && w <= std::min(cap, total) &&
                                 with_w * (1.0 + flashattn_cu::kWalkL2Penalty *
                                                     std::log2(static_cast<double>(w) / group)) <
                                     with_g));
  }
  expect(covered, "cta_tile_index over query_tile_at's groups: every tile walked once");
  expect(exact, "grouped_walk_longest: the static walk's longest CTA, as a brute-force walk");
  expect(chosen, "balanced_group_heads: a group in [ceil(max / 2), max], never a longer walk");
  expect(wider,
         "balanced_group_heads past the L2's group: the bounded one or a lighter weighed walk");
}

// The tile orders (query_tile_at, key_tile_at) and a left window's light blocks
// (light_query_blocks, light_key_blocks).
void check_tile_orders() {
  // Tile orders of the persistent forward (problem/scheduler.h: query_tile_at): every order a
  // permutation of the (batch, head, query block) tiles; the grouped one longest first inside
  // each group of heads; with deferred light query blocks (defer_m, a left window's first
  // blocks) that order over blocks >= defer_m first, then blocks defer_m - 1 down to 0 of every
  // head in turn.
  {
    bool perm_ok = true, lpt_ok = true, defer_perm_ok = true, defer_order_ok = true;
    // num_m, batch, heads, group_heads, defer_m
    const int shapes[][5] = {{8, 2, 3, 0, 0},    {8, 2, 3, 4, 0},     {5, 3, 7, 6, 0},
                             {1, 1, 1, 1, 0},    {16, 1, 16, 3, 0},   {3, 4, 5, 20, 0},
                             {64, 2, 16, 32, 0}, {128, 1, 16, 3, 8},  {128, 1, 16, 0, 8},
                             {9, 2, 3, 4, 8},    {9, 2, 3, 0, 1},     {5, 3, 7, 6, 4},
                             {2, 1, 1, 1, 1}};
    for (const auto& sh : shapes) {
      const int num_m = sh[0], batch = sh[1], heads = sh[2], group = sh[3], defer = sh[4];
      const int tiles = num_m * batch * heads, lead = (num_m - defer) * batch * heads;
      bool& perm = defer > 0 ? defer_perm_ok : perm_ok;
      std::vector<int> seen(tiles, 0);
      int prev_group = -1, prev_m = 0;
      for (int i = 0; i < tiles; ++i) {
        const flashattn_cu::QueryTile t =
            flashattn_cu::query_tile_at(i, num_m, heads, group, batch * heads, defer);
        const int bh = t.batch * heads + t.head;
        if (t.m_block < 0 || t.m_block >= num_m || t.batch < 0 || t.batch >= batch ||
            t.head < 0 || t.head >= heads) {
          perm = false;
          break;
        }
        ++seen[bh * num_m + t.m_block];
        if (i < lead) {
          if (t.m_block < defer) defer_order_ok = false;
          if (group > 0) {
            const int g = bh / group;
            if (g == prev_group && t.m_block > prev_m) lpt_ok = false;
            if (g < prev_group) lpt_ok = false;
            prev_group = g;
            prev_m = t.m_block;
          }
        } else if (t.m_block != defer - 1 - (i - lead) / (batch * heads) ||
                   bh != (i - lead) % (batch * heads)) {
          defer_order_ok = false;
        }
      }
      for (int c : seen) perm = perm && c == 1;
    }
    // cta_tile_index: the CTAs' walks together visit every tile once.
    for (int tiles : {1, 131, 132, 133, 2048, 2731}) {
      std::vector<int> seen(tiles, 0);
      for (int c = 0; c < 132; ++c) {
        for (int k = 0, i = c; i < tiles; i = flashattn_cu::cta_tile_index(++k, c, 132)) ++seen[i];
      }
      for (int n : seen) perm_ok = perm_ok && n == 1;
    }
    // pair_tile_index (the sm90 forward's CTA pairs): together every tile once, and at each step
    // a pair's two CTAs on one head's adjacent query blocks (an even count of them a head).
    bool pair_ok = true;
    for (int ctas : {2, 132}) {
      for (int num_m : {2, 64, 86}) {
        const int heads = 3, batch = 5, tiles = num_m * heads * batch;
        std::vector<int> seen(tiles, 0);
        for (int c = 0; c < ctas; c += 2) {
          for (int k = 0;; ++k) {
            const int i0 = flashattn_cu::pair_tile_index(k, c, ctas);
            const int i1 = flashattn_cu::pair_tile_index(k, c + 1, ctas);
            pair_ok = pair_ok && (i0 < tiles) == (i1 < tiles) && i1 == i0 + 1;
            if (i0 >= tiles) break;
            ++seen[i0];
            ++seen[i1];
            const auto t0 = flashattn_cu::query_tile_at(i0, num_m, heads);
            const auto t1 = flashattn_cu::query_tile_at(i1, num_m, heads);
            pair_ok = pair_ok && t0.batch == t1.batch && t0.head == t1.head &&
                      (t0.m_block - t1.m_block == 1 || t1.m_block - t0.m_block == 1);
          }
          pair_ok = pair_ok && flashattn_cu::pair_tile_index(0, c, ctas) == c &&
                    flashattn_cu::pair_tile_index(0, c + 1, ctas) == c + 1;
        }
        for (int n : seen) pair_ok = pair_ok && n == 1;
      }
    }
    expect(pair_ok, "pair_tile_index: every tile once, a pair on one head's adjacent query blocks");
    expect(perm_ok, "tile orders: every (batch, head, query block) exactly once");
    expect(lpt_ok, "grouped tile order: longest first inside each group of heads");
    expect(defer_perm_ok, "tile orders with deferred light blocks: every tile exactly once");
    expect(defer_order_ok,
           "tile orders with deferred light blocks: the light blocks last, longest first");
  }
  {
    using flashattn_cu::light_query_blocks;
    // window (1024, 0) at 16k in blocks of 128: blocks 0 .. 7 start before key 0; block 8's
    // first row (1024) sees keys 0 .. 1024, all its rows a whole window.
    const bool ok = light_query_blocks(1024, 0, 16384, 16384, 128) == 8 &&
                    light_query_blocks(1000, 0, 16384, 16384, 128) == 8 &&
                    light_query_blocks(1025, 0, 16384, 16384, 128) == 9 &&
                    light_query_blocks(1024, 64, 16384, 16384, 128) == 8 &&  // bounded right
                    light_query_blocks(-1, 0, 16384, 16384, 128) == 0 &&     // no left window
                    light_query_blocks(1024, -1, 16384, 16384, 128) == 0 &&  // right unbounded
                    light_query_blocks(1024, 0, 1024, 4096, 128) == 0 &&     // seqlen_k - seqlen_q >= left
                    light_query_blocks(1024, 0, 1000, 1500, 128) == 5 &&     // cut 524 rows
                    light_query_blocks(4096, 0, 2048, 2048, 128) == 0 &&     // every block light
                    light_query_blocks(1024, 0, 16384, 16384, 192) == 6;
    expect(ok, "light_query_blocks: the leading query blocks a left window cuts at key 0");
  }
  {
    using flashattn_cu::light_key_blocks;
    // window (1024, 0) at 16k in blocks of 128: keys 15360 .. are seen by fewer than 1025 rows
    // (the last query row is 16383), blocks 120 .. 127.
    const bool ok = light_key_blocks(1024, 0, 16384, 16384, 128) == 8 &&
                    light_key_blocks(1000, 0, 16384, 16384, 128) == 8 &&   // keys 15384 ..: block 120
                    light_key_blocks(1025, 0, 16384, 16384, 128) == 9 &&
                    light_key_blocks(1024, 0, 8192, 16384, 128) == 8 &&    // sq != sk: the same keys
                    light_key_blocks(1024, 0, 16384, 16384, 64) == 16 &&
                    light_key_blocks(-1, 0, 16384, 16384, 128) == 0 &&     // no left window
                    light_key_blocks(1024, -1, 16384, 16384, 128) == 0 &&  // right unbounded
                    light_key_blocks(4096, 0, 2048, 2048, 128) == 0 &&     // every block light
                    light_key_blocks(1024, 0, 1500, 1500, 128) == 9;       // keys 476 ..: blocks 3 .. 11
    expect(ok, "light_key_blocks: the trailing key blocks a left window cuts at the last row");
  }
  {
    // key_tile_at: a permutation of the key tiles; without defer_n key_tile's order (n fastest,
    // then split, head_k, batch); with it the first num_n - defer_n blocks of every slice in
    // that order, then the light blocks, heaviest (lowest n) first, slice by slice.
    bool perm = true, order = true;
    const int shapes[][5] = {{128, 1, 16, 1, 8}, {12, 2, 3, 2, 4}, {7, 1, 1, 1, 0},
                             {9, 3, 2, 1, 8}, {5, 2, 4, 3, 0}, {1, 1, 1, 1, 0}};
    for (const auto& sh : shapes) {
      const int num_n = sh[0], batch = sh[1], heads_k = sh[2], splits = sh[3], defer = sh[4];
      const int slices = batch * heads_k * splits, tiles = num_n * slices;
      const int lead = (num_n - defer) * slices;
      std::vector<int> seen(tiles, 0);
      for (int i = 0; i < tiles; ++i) {
        const flashattn_cu::KeyTile t =
            flashattn_cu::key_tile_at(i, num_n, splits, heads_k, slices, defer);
        if (t.n_block < 0 || t.n_block >= num_n || t.split < 0 || t.split >= splits ||
            t.head_k < 0 || t.head_k >= heads_k || t.batch < 0 || t.batch >= batch) {
          perm = false;
          break;
        }
        const int slice = (t.batch * heads_k + t.head_k) * splits + t.split;
        ++seen[slice * num_n + t.n_block];
        if (i < lead) {
          if (t.n_block != i % (num_n - defer) || slice != i / (num_n - defer)) order = false;
        } else if (t.n_block != num_n - defer + (i - lead) / slices || slice != (i - lead) % slices) {
          order = false;
        }
      }
      for (int c : seen) perm = perm && c == 1;
    }
    expect(perm, "key_tile_at: every (batch, head_k, split, key block) exactly once");
    expect(order, "key_tile_at: key_tile's order, then the deferred light blocks heaviest first");
  }
}

}  // namespace

namespace flashattn_cu_checks {

// Every check of this file (api_checks.cpp's main calls it).
void run_scheduler_checks() {
  check_tile_orders();
  check_varlen_tiles();
  check_walk_balance();
}

}  // namespace flashattn_cu_checks
