// Brute-force checks of the problem layer's host-callable math (no GPU, no API call): Philox and
// the dropout tile map, the causal limit and the mask policy's block ranges, the tile orders and
// the compact varlen tiles, the sm90 backward's dQ accumulator layout (the KV-cache side:
// kvcache_checks.cpp). Run by api_checks (api_checks.cpp's main: run_problem_checks), built by
// CMake's ctest (.ci/run).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "flashattn_cu/flashattn_cu.h"

#include "bwd/params.h"  // the sm90 backward's dQ accumulator layout (dq_frag_offset)
#include "checks.h"
#include "problem/dropout.h"    // Philox and the dropout tile map (host/device)
#include "problem/mask.h"       // the mask policy (host/device), near INT_MAX too
#include "problem/scheduler.h"  // the tile orders: permutations

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

// The sm90 backward's dQ accumulator layouts (bwd/params.h), the contract between the main
// kernels' staging (one bulk reduction or a few add the staged block) and the postprocess (reads
// columns 8c .. 8c + 7 of a row as one 32-byte chunk): dq_frag_offset (sm90/bwd_kernel.h: warp
// w, lane l stores its pair (hr, nt) at float ((hr * d / 16 + nt) * 8 + w) * 64 + 2 l of the
// block) and dq_frag_ws_offset (sm90/bwd_ws_kernel.h and the split kernel at d 256: at
// ((w * 2 + hr) * d / 16 + nt) * 64 + 2 l, each warp's pairs one run): a permutation of the
// block, 8-column chunks contiguous, and the kernels' pairs where the layout puts their elements.
void check_dq_frag_layout() {
  namespace bw = flashattn_cu::backward;
  for (const bool ws : {false, true}) {
    const auto offset = [ws](int r, int col, int d) {
      return ws ? bw::dq_frag_ws_offset(r, col, d) : bw::dq_frag_offset(r, col, d);
    };
    bool perm = true, chunks = true, kernel = true;
    for (int d : {64, 128, 256}) {
      const int rows = bw::kDqFragRows, half = d / 2;
      std::vector<int> seen(static_cast<size_t>(rows) * d, 0);
      for (int r = 0; r < rows; ++r) {
        for (int col = 0; col < d; ++col) {
          const int64_t o = offset(r, col, d);
          if (o < 0 || o >= static_cast<int64_t>(rows) * d) {
            perm = false;
            continue;
          }
          ++seen[static_cast<size_t>(o)];
          chunks = chunks && o == offset(r, col - col % 8, d) + col % 8;
        }
      }
      perm = perm && std::all_of(seen.begin(), seen.end(), [](int x) { return x == 1; });
      for (int w = 0; w < 8; ++w) {
        for (int l = 0; l < 32; ++l) {
          for (int hr = 0; hr < 2; ++hr) {
            for (int nt = 0; nt < half / 8; ++nt) {
              const int row = (w % 4) * 16 + l / 4 + 8 * hr;
              const int col = (w / 4) * half + 8 * nt + 2 * (l % 4);
              const int64_t at = ws ? ((w * 2 + hr) * (half / 8) + nt) * 64 + 2 * l
                                    : ((hr * (half / 8) + nt) * 8 + w) * 64 + 2 * l;
              kernel = kernel && offset(row, col, d) == at && offset(row, col + 1, d) == at + 1;
            }
          }
        }
      }
    }
    const std::string name = ws ? "dq_frag_ws_offset" : "dq_frag_offset";
    expect(perm, (name + ": a permutation of each 64-row block (d 64, 128, 256)").c_str());
    expect(chunks, (name + ": columns 8c .. 8c + 7 of a row contiguous").c_str());
    expect(kernel, (name + ": the sm90 kernels' staged pairs where the layout puts them").c_str());
  }
}

// The persistent causal walk's balance (problem/scheduler.h grouped_walk_longest,
// balanced_group_heads) against a brute-force walk: every tile of every CTA through
// cta_tile_index and query_tile_at, with random key blocks per query block (zeros included),
// heads, group sizes and CTA counts (every tile walked exactly once, whatever the group); the
// chosen group within [ceil(max / 2), max] and never longer than the L2's.
void check_walk_balance() {
  bool exact = true, chosen = true, covered = true;
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
  }
  expect(covered, "cta_tile_index over query_tile_at's groups: every tile walked once");
  expect(exact, "grouped_walk_longest: the static walk's longest CTA, as a brute-force walk");
  expect(chosen, "balanced_group_heads: a group in [ceil(max / 2), max], never a longer walk");
}

}  // namespace

namespace flashattn_cu_checks {

// Every check of this file (api_checks.cpp's main calls it).
void run_problem_checks() {
  // Philox4x32-10 against the Random123 known-answer vectors (also torch's philox_engine).
  {
    const flashattn_cu::PhiloxOut z = flashattn_cu::philox4x32_10(0, 0, 0, 0, 0, 0);
    const flashattn_cu::PhiloxOut f = flashattn_cu::philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
    expect(z.w[0] == 0x6627e8d5u && z.w[1] == 0xe169c58du && z.w[2] == 0xbc57ac4cu &&
               z.w[3] == 0x9b00dbd8u && f.w[0] == 0x408f276du && f.w[1] == 0x41c83b0eu &&
               f.w[2] == 0xa20bc7c6u && f.w[3] == 0x6d5451fdu,
           "philox4x32_10: Random123 known answers");
    expect(flashattn_cu::dropout_keep_threshold(0.f) == 65536u &&
               flashattn_cu::dropout_keep_threshold(0.5f) == 32768u &&
               flashattn_cu::dropout_keep_threshold(0.9999999f) == 1u,
           "dropout_keep_threshold: round((1 - p) * 65536) in [1, 65536]");
  }

  // The dropout tile map: the row-major tile (forward, dQ kernel) and the transposed tile (the
  // backward main kernels) give every lane's element the decision of dropout_keep, at small and
  // near-kMaxSeqlen rows and keys and with a counter stream past 2^32; and the kept fraction of
  // p = 0.3 is 0.7 (to 4 standard deviations over 2^18 elements).
  {
    struct Case { int row0, col0; uint64_t seed, offset; int batch, head; };
    const Case cases[] = {{0, 0, 42, 0, 0, 0}, {16, 48, 0x123456789abcdefull, 12, 1, 3},
                          {flashattn_cu::kMaxSeqlen - 128, flashattn_cu::kMaxSeqlen - 64,
                           ~0ull, (1ull << 34) - 8, 3, 7}};
    const uint32_t threshold = flashattn_cu::dropout_keep_threshold(0.3f);
    bool rows_ok = true, transposed_ok = true;
    int64_t kept = 0, total = 0;
    for (const Case& c : cases) {
      struct { FwdParams p; flashattn_cu::DropoutScale dropout; } kp;
      kp.p.num_heads = 8;
      kp.p.philox_seed = c.seed;
      kp.p.philox_offset = c.offset;
      kp.dropout.keep_threshold = threshold;
      const flashattn_cu::Dropout d = flashattn_cu::dropout_of(kp, c.batch, c.head);
      const uint64_t stream = c.offset / 4 + static_cast<uint64_t>(c.batch) * 8 + c.head;
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        uint32_t row_bits[2];  // 32 rows x 64 keys
        d.keep_bits<2, 8>(row_bits, c.row0, c.col0, lane);
        for (int mt = 0; mt < 2; ++mt)
          for (int nt = 0; nt < 8; ++nt)
            for (int i = 0; i < 4; ++i) {
              const int row = c.row0 + mt * 16 + g + (i / 2) * 8;
              const int key = c.col0 + nt * 8 + 2 * t + i % 2;
              const int bit = (mt * 8 + nt) * 4 + i;
              const bool got = (row_bits[bit / 32] >> (bit % 32)) & 1u;
              rows_ok = rows_ok &&
                        got == flashattn_cu::dropout_keep(c.seed, stream, row, key, threshold);
            }
        uint32_t bits[2];  // 16 keys x 128 queries
        d.keep_bits_transposed<16>(bits, c.col0, c.row0, lane);
        for (int nt = 0; nt < 16; ++nt)
          for (int i = 0; i < 4; ++i) {
            const int key = c.col0 + g + (i / 2) * 8, query = c.row0 + nt * 8 + 2 * t + i % 2;
            const int bit = nt * 4 + i;
            const bool got = (bits[bit / 32] >> (bit % 32)) & 1u;
            transposed_ok = transposed_ok &&
                            got == flashattn_cu::dropout_keep(c.seed, stream, query, key, threshold);
          }
      }
    }
    for (int row = 0; row < 512; ++row)
      for (int key = 0; key < 512; ++key) {
        kept += flashattn_cu::dropout_keep(7, 1000, row, key, threshold);
        ++total;
      }
    const double frac = static_cast<double>(kept) / total, sd = std::sqrt(0.21 / total);
    expect(rows_ok, "dropout: row-major tile map == dropout_keep for every lane");
    expect(transposed_ok, "dropout: transposed tile map == dropout_keep for every lane");
    expect(std::fabs(frac - threshold / 65536.0) < 4 * sd, "dropout: kept fraction of p = 0.3");
  }

  // The causal key limit at the largest supported sequence lengths (no int overflow).
  {
    const int kMax = flashattn_cu::kMaxSeqlen;
    expect(flashattn_cu::visible_key_limit(0, 1, kMax, true) == kMax,
           "causal limit: 1 query over kMaxSeqlen keys sees them all");
    expect(flashattn_cu::visible_key_limit(kMax - 1, kMax, kMax, true) == kMax,
           "causal limit: last row of kMaxSeqlen x kMaxSeqlen");
    expect(flashattn_cu::visible_key_limit(0, kMax, kMax, true) == 1,
           "causal limit: first row of kMaxSeqlen x kMaxSeqlen");
    expect(flashattn_cu::visible_key_limit(5, kMax, 10, true) <= 0,
           "causal limit: a row that sees no key is <= 0 (kMaxSeqlen queries over 10 keys)");
  }

  // The mask policy's block ranges against the element rule, brute force over small shapes,
  // causal and sliding windows: key_blocks(m_start) must visit every key block holding a key some
  // row of the query block sees and skip the element mask only on blocks every row sees whole;
  // query_blocks(n_start) likewise from the key block's side.
  {
    constexpr int kBM = 16, kBN = 8;
    const int windows[][3] = {{0, -1, -1}, {1, -1, -1}, {0, 0, -1}, {0, 3, 5}, {0, -1, 0},
                              {0, 17, 0},  {1, 9, -1},  {0, 0, 0},  {0, 40, 2}, {0, 2, 40}};
    bool ok = true, tight = true;
    for (int sq = 1; sq <= 40 && ok; sq += 3) {
      for (int sk = 1; sk <= 40 && ok; sk += 5) {
        for (const auto& w : windows) {
          if (!ok) break;
          flashattn_cu::SeqInfo si{0, sq, sk, -1, -1};
          const flashattn_cu::Mask mask(si, w[0] != 0, w[1], w[2]);
          const int num_m = (sq + kBM - 1) / kBM, num_n = (sk + kBN - 1) / kBN;
          // The rule itself, from flash_attn's definition (not from Mask).
          auto sees = [&](int row, int key) {
            const int d = row + sk - sq;
            const int right = w[0] != 0 ? 0 : w[2];
            return key >= 0 && key < sk && (w[1] < 0 || key >= d - w[1]) &&
                   (right < 0 || key <= d + right);
          };
          // Whether some row of query block m sees a key of key block n (any), and every row
          // every key (all, and-ed into its argument).
          auto block_sees = [&](int m, int n, bool& any, bool& all) {
            for (int r = m * kBM; r < (m + 1) * kBM && r < sq; ++r) {
              for (int j = n * kBN; j < (n + 1) * kBN; ++j) {
                const bool v = sees(r, j);
                any = any || v;
                all = all && v;
              }
            }
          };
          for (int m = 0; m < num_m; ++m) {
            const flashattn_cu::KeyBlocks kb = mask.key_blocks<kBM, kBN>(m * kBM);
            for (int n = 0; n < num_n; ++n) {
              bool any = false, all = true;
              block_sees(m, n, any, all);
              const bool visited = n >= kb.begin && n < kb.end;
              const bool unmasked = n >= kb.unmasked_begin && n < kb.unmasked_end;
              if (any && !visited) ok = false;        // a visible key skipped
              if (unmasked && (!all || !visited)) ok = false;  // mask skipped where needed
              // Tight: a whole query block visits no key block it sees nothing of (the cost
              // of a window is the blocks it covers).
              if (visited && !any && (m + 1) * kBM <= sq) tight = false;
            }
            for (int r = m * kBM; r < (m + 1) * kBM && r < sq; ++r) {  // the element rule
              for (int j = 0; j < sk; ++j) {
                if (sees(r, j) != (j >= mask.key_begin(r) && j < mask.key_end(r))) ok = false;
              }
            }
          }
          for (int n = 0; n < num_n; ++n) {
            const int keys_valid = sk - n * kBN < kBN ? sk - n * kBN : kBN;
            const flashattn_cu::QueryBlocks qb =
                mask.query_blocks<kBM, kBN>(n * kBN, keys_valid, num_m);
            for (int m = 0; m < num_m; ++m) {
              bool any = false, all = keys_valid == kBN;
              block_sees(m, n, any, all);
              const bool visited = m >= qb.begin && m < qb.end;
              const bool unmasked = m >= qb.unmasked_begin && m < qb.unmasked_end;
              if (any && !visited) ok = false;
              if (unmasked && (!all || !visited)) ok = false;
              if (visited && !any && (m + 1) * kBM <= sq) tight = false;
            }
          }
          if (!ok) {
            std::printf("mask block ranges wrong at sq=%d sk=%d causal=%d window=(%d, %d)\n", sq,
                        sk, w[0], w[1], w[2]);
          }
        }
      }
    }
    expect(ok, "mask policy: key_blocks / query_blocks agree with the element rule");
    expect(tight, "mask policy: whole query blocks visit only blocks they see a key of");
    const int kMax = flashattn_cu::kMaxSeqlen;
    const flashattn_cu::Mask big(flashattn_cu::SeqInfo{0, kMax, kMax, -1, -1}, true);
    const flashattn_cu::KeyBlocks last = big.key_blocks<128, 128>(kMax - 128);
    expect(last.begin == 0 && last.end == kMax / 128 && last.unmasked_begin == 0 &&
               last.unmasked_end == (kMax - 127) / 128,
           "mask policy: key blocks of the last query block at kMaxSeqlen");
    const flashattn_cu::QueryBlocks first = big.query_blocks<128, 128>(0, 128, kMax / 128);
    expect(first.begin == 0 && first.end == kMax / 128 && first.unmasked_begin == 1 &&
               first.unmasked_end == kMax / 128,
           "mask policy: query blocks of the first key block at kMaxSeqlen");
    const flashattn_cu::Mask wide(flashattn_cu::SeqInfo{0, kMax, kMax, -1, -1}, false,
                                  kMax - 1, kMax - 1);
    const flashattn_cu::KeyBlocks wb = wide.key_blocks<128, 128>(kMax - 128);
    expect(wb.begin == 0 && wb.end == kMax / 128 && wide.key_end(0) == kMax &&
               wide.key_begin(kMax - 1) == 0,
           "mask policy: windows as wide as kMaxSeqlen do not overflow");
  }

  // The forward's query blocks aligned to the last row (Mask::query_block_shift, sm90/fwd_work.h:
  // block m's first row m x kBM - shift), brute force over small shapes: every row stored by
  // exactly one block (rows [max(0, m_start), min(m_start + kBM, sq))), its visible keys inside
  // that block's key-block walk, the element mask skipped only on blocks its stored rows see
  // whole, the shift only where every row's keys run from key 0 to an end growing with the row
  // (and never kBM), and no more key-block steps in all than blocks at multiples of kBM.
  {
    constexpr int kBM = 16, kBN = 8;
    const int windows[][3] = {{0, -1, -1}, {1, -1, -1}, {0, -1, 0}, {0, -1, 5}, {0, 3, 5},
                              {1, 9, -1},  {0, 0, 0},   {0, -1, 40}};
    bool ok = true, fewer = true;
    for (int sq = 1; sq <= 70 && ok; sq += 3) {
      for (int sk = 1; sk <= 70 && ok; sk += 7) {
        for (const auto& w : windows) {
          flashattn_cu::SeqInfo si{0, sq, sk, -1, -1};
          const flashattn_cu::Mask mask(si, w[0] != 0, w[1], w[2]);
          const int shift = mask.query_block_shift<kBM>();
          const bool grows = mask.right >= 0 && mask.left < 0;
          if (shift < 0 || shift >= kBM || (!grows && shift != 0) ||
              (grows && (sq + shift) % kBM != 0)) {
            ok = false;
          }
          const int num_m = (sq + kBM - 1) / kBM;
          std::vector<int> stored(sq, 0);
          long steps = 0, steps_unshifted = 0;
          for (int m = 0; m < num_m; ++m) {
            const flashattn_cu::KeyBlocks unshifted = mask.key_blocks<kBM, kBN>(m * kBM);
            steps_unshifted += unshifted.end - unshifted.begin;
            const int m_start = m * kBM - shift;
            if (m_start >= sq) continue;
            const flashattn_cu::KeyBlocks kb = mask.key_blocks<kBM, kBN>(m_start);
            steps += kb.end - kb.begin;
            for (int r = m_start < 0 ? 0 : m_start; r < m_start + kBM && r < sq; ++r) {
              ++stored[r];
              const int lo = mask.key_begin(r), hi = mask.key_end(r);
              if (lo < hi && (lo < kb.begin * kBN || hi > kb.end * kBN)) ok = false;
              for (int n = kb.unmasked_begin; n < kb.unmasked_end; ++n) {
                if (n * kBN < lo || (n + 1) * kBN > hi) ok = false;  // a masked key unmasked
              }
            }
          }
          for (int r = 0; r < sq; ++r) ok = ok && stored[r] == 1;
          if (steps > steps_unshifted) fewer = false;
          if (!ok) {
            std::printf("last-aligned blocks wrong at sq=%d sk=%d causal=%d window=(%d, %d) "
                        "shift=%d\n", sq, sk, w[0], w[1], w[2], shift);
            break;
          }
        }
      }
    }
    expect(ok, "last-aligned query blocks: every row stored once, its keys inside its walk");
    expect(fewer, "last-aligned query blocks: never more key-block steps than unshifted");
  }

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

  check_varlen_tiles();
  check_walk_balance();
  check_dq_frag_layout();
}

}  // namespace flashattn_cu_checks
