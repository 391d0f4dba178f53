// Brute-force checks of the problem layer's host-callable math (no GPU, no API call): Philox and
// the dropout tile map, the causal limit and the mask policy's block ranges, the tile orders, the
// kvcache index math and split merge, the sm90 decode kernel's paged boxes, the sm90 backward's dQ
// accumulator layout. Run by api_checks
// (api_checks.cpp's main: run_problem_checks), built by CMake's ctest (.ci/run).
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
#include "problem/kv_cache.h"   // split ranges, the paged row map, the split heuristic and merge
#include "problem/mask.h"       // the mask policy (host/device), near INT_MAX too
#include "problem/scheduler.h"  // the tile orders: permutations
#include "tiles.h"  // the sm90 decode kernel's page rule (decode_tile_sm90_for, decode_box_rows_sm90)

namespace {

using flashattn_cu::FwdParams;
using flashattn_cu::KvcacheParams;
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

// The sm90 decode kernel's paged boxes (tiles.h), by brute force over page sizes: a page is taken
// iff its rows are a multiple of 16; its boxes are the largest power of two of >= 16 rows that
// divides both the tile and the page, so a tile is whole boxes and no box crosses a page.
void check_decode_page_boxes() {
  bool ok = true;
  for (int d : {64, 128}) {
    const flashattn_cu::DecodeTileSm90 tile = flashattn_cu::decode_tile_sm90(d);
    ok = ok && tile.supported && flashattn_cu::decode_box_rows_sm90(tile.block_n, 0) == tile.block_n;
    for (int page = 1; page <= 1024 && ok; ++page) {
      const bool taken = flashattn_cu::decode_tile_sm90_for(d, page).supported;
      ok = ok && taken == (page % 16 == 0);
      if (!taken) continue;
      const int box = flashattn_cu::decode_box_rows_sm90(tile.block_n, page);
      ok = ok && box >= 16 && (box & (box - 1)) == 0 && tile.block_n % box == 0 && page % box == 0;
      ok = ok && (2 * box > tile.block_n || page % (2 * box) != 0);  // the largest such
      for (int key = 0; key < 4 * page && ok; key += box) ok = ok && key / page == (key + box - 1) / page;
    }
  }
  expect(ok, "decode_box_rows_sm90: whole boxes per tile, none across a page, pages of 16k rows only");
}

// The decode kernel's CTAs per SM (tiles.h decode_ctas_sm90): two exactly for d 64 pages read in
// boxes below the tile with query tiles for >= a quarter of the SMs; one otherwise (contiguous
// caches, pages holding whole tiles, d 128, few tiles).
void check_decode_ctas() {
  bool ok = true;
  for (int d : {64, 128}) {
    for (int page = 0; page <= 512 && ok; page += 16) {
      for (int sms : {78, 114, 132}) {
        for (long long tiles = 1; tiles <= 300 && ok; ++tiles) {
          const int ctas = flashattn_cu::decode_ctas_sm90(d, page, tiles, sms);
          const bool boxed = page > 0 && flashattn_cu::decode_box_rows_sm90(64, page) < 64;
          const int want = d == 64 && boxed && 4 * tiles >= sms ? 2 : 1;
          ok = ok && ctas == want;
        }
      }
    }
  }
  ok = ok && flashattn_cu::decode_ctas_sm90(64, 16, 33, 132) == 2 &&
       flashattn_cu::decode_ctas_sm90(64, 16, 32, 132) == 1 &&
       flashattn_cu::decode_ctas_sm90(64, 48, 64, 132) == 2 &&
       flashattn_cu::decode_ctas_sm90(64, 256, 512, 132) == 1 &&
       flashattn_cu::decode_ctas_sm90(64, 0, 512, 132) == 1;
  expect(ok, "decode_ctas_sm90: two CTAs per SM for boxed d 64 pages with >= SMs / 4 tiles only");
}

// The kvcache index math (problem/kv_cache.h, problem/scheduler.h) by brute force.
void check_kvcache_math() {
  // The fused append's owners (append_share): every new row written by exactly one (query
  // block, split), for any counts.
  {
    bool once = true;
    for (int rows = 0; rows <= 300 && once; rows += rows < 20 ? 1 : 37) {
      for (int m_blocks = 1; m_blocks <= 5 && once; ++m_blocks) {
        for (int splits = 1; splits <= flashattn_cu::kMaxSplits && once; splits += splits < 8 ? 1 : 15) {
          std::vector<int> seen(rows, 0);
          for (int m = 0; m < m_blocks; ++m) {
            for (int s = 0; s < splits; ++s) {
              const flashattn_cu::AppendShare a =
                  flashattn_cu::append_share(rows, m, m_blocks, s, splits);
              once = once && 0 <= a.begin && a.begin <= a.end && a.end <= rows;
              for (int i = a.begin; i < a.end && once; ++i) ++seen[i];
            }
          }
          for (int n : seen) once = once && n == 1;
        }
      }
    }
    expect(once, "kvcache append: every new row has exactly one owning (query block, split)");
  }
  // Splits of [begin, end): disjoint, in order, covering it exactly, for every split count.
  bool splits_ok = true;
  for (int begin = 0; begin <= 5 && splits_ok; ++begin) {
    for (int end = 0; end <= 70 && splits_ok; ++end) {
      for (int splits = 1; splits <= flashattn_cu::kMaxSplits && splits_ok; ++splits) {
        int next = begin < end ? begin : end;
        for (int s = 0; s < splits; ++s) {
          const flashattn_cu::SplitBlocks b = flashattn_cu::split_key_blocks(begin, end, s, splits);
          if (b.begin > b.end) splits_ok = false;
          if (b.end > b.begin && b.begin != next) splits_ok = false;
          if (b.end > b.begin) next = b.end;
        }
        if (next != (begin < end ? end : next)) splits_ok = false;
      }
    }
  }
  expect(splits_ok, "split_key_blocks: the splits tile a query block's key blocks exactly");

  // The split tile order: every (batch, head, query block, split) exactly once.
  bool perm_ok = true;
  for (int splits : {1, 3, 128}) {
    const int batch = 3, heads = 5, m_blocks = 2;
    const int64_t n = flashattn_cu::split_query_tile_count(m_blocks, batch, heads, splits);
    std::vector<int> seen(static_cast<size_t>(n), 0);
    for (int64_t i = 0; i < n; ++i) {
      const flashattn_cu::SplitQueryTile t =
          flashattn_cu::split_query_tile_at(i, m_blocks, heads, splits);
      const int64_t key = ((static_cast<int64_t>(t.batch) * heads + t.head) * m_blocks +
                           t.m_block) * splits + t.split;
      if (t.batch < 0 || t.batch >= batch || t.head < 0 || t.head >= heads || t.m_block < 0 ||
          t.m_block >= m_blocks || t.split < 0 || t.split >= splits || key >= n) {
        perm_ok = false;
        break;
      }
      ++seen[static_cast<size_t>(key)];
    }
    for (int c : seen) perm_ok = perm_ok && c == 1;
  }
  expect(perm_ok, "split tile order: every (batch, head, query block, split) exactly once");

  // The paged row map against the definition, for page sizes that are and are not powers of
  // two; page numbers outside the cache are clamped into it.
  bool paged_ok = true;
  for (int page_size : {1, 3, 16, 64, 100, 256}) {
    const int num_pages = 7, max_pages = 5;
    std::vector<int> table(max_pages);
    for (int i = 0; i < max_pages; ++i) table[i] = (i * 3 + 2) % num_pages;
    table[max_pages - 1] = 99;  // out of range: clamped to the last page
    const flashattn_cu::PagedKv pages{table.data(), page_size, num_pages};
    const int64_t page_stride = static_cast<int64_t>(page_size) * 4 * 64, row_stride = 4 * 64;
    for (int row = 0; row < max_pages * page_size; ++row) {
      const int page = std::min(table[row / page_size], num_pages - 1);
      const int64_t want = page * page_stride + (row % page_size) * row_stride;
      if (pages.row_offset(row, page_stride, row_stride) != want) paged_ok = false;
    }
  }
  expect(paged_ok, "paged rows: block_table[r / page_size] * page + r % page_size, any page size");

  // GQA packing (GqaPack): the rows of kv head hk's packed tiles are every (query, query head
  // of its group) exactly once, at the q/o address and lse index of the unpacked call.
  bool pack_ok = true;
  for (int seqlen_q = 1; seqlen_q <= 9 && pack_ok; ++seqlen_q) {
    for (int group = 1; group <= 8 && pack_ok; ++group) {
      const int batch = 2, heads_k = 3, heads = heads_k * group;
      const int64_t row_stride = heads * 64, head_stride = 64;  // (batch, seqlen_q, heads, 64)
      const flashattn_cu::GqaPack pack{group};
      for (int b = 0; b < batch; ++b) {
        for (int hk = 0; hk < heads_k; ++hk) {
          std::vector<int> seen(static_cast<size_t>(seqlen_q) * group, 0);
          for (int r = 0; r < seqlen_q * group; ++r) {
            const int i = pack.query(r), h = hk * group + r % group;
            if (i < 0 || i >= seqlen_q || pack(r) != i) pack_ok = false;
            if (i * group + (h - hk * group) != r) pack_ok = false;  // query-major order
            ++seen[static_cast<size_t>(i) * group + (h - hk * group)];
            const int64_t want_addr = i * row_stride + (h - hk * group) * head_stride;
            if (pack.offset(r, row_stride, head_stride) != want_addr) pack_ok = false;
            const int64_t want_lse = (static_cast<int64_t>(b) * heads + h) * seqlen_q + i;
            const flashattn_cu::SeqInfo padded{b, seqlen_q * group, 0, -1, -1};
            if (pack.lse_index(padded, hk, heads_k, seqlen_q, 0, r) != want_lse) pack_ok = false;
            // Varlen (paged prefill): lse (heads, total_q), the entry's queries from start_q.
            const int total_q = 1000, start_q = 17 * b + 3;
            const flashattn_cu::SeqInfo varlen{b, seqlen_q * group, 0, start_q, 0};
            const int64_t want_varlen = static_cast<int64_t>(h) * total_q + start_q + i;
            if (pack.lse_index(varlen, hk, heads_k, seqlen_q, total_q, r) != want_varlen) {
              pack_ok = false;
            }
          }
          for (int c : seen) pack_ok = pack_ok && c == 1;
        }
      }
    }
  }
  expect(pack_ok, "GQA packing: row i * group + j is query i of head hk * group + j, its q/o "
                  "offset and lse index (padded and varlen) those of the unpacked call, each "
                  "pair once");

  // Varlen queries of the kvcache kernels (problem/seqlen.h: packed_seq_info): an entry's rows
  // are its queries (clamped to the packed bound / group) times the group, from its start;
  // keys from cu_seqlens_k clamped to seqlen_k.
  {
    const int lens_q[] = {0, 1, 5, 130, 7};
    const int lens_k[] = {3, 0, 700, 130, 1};
    int cu_q[6] = {0}, cu_k[6] = {0};
    for (int b = 0; b < 5; ++b) cu_q[b + 1] = cu_q[b] + lens_q[b], cu_k[b + 1] = cu_k[b] + lens_k[b];
    bool packed_seq_ok = true;
    for (int group : {1, 3, 4}) {
      for (int max_q : {130, 6}) {
        KvcacheParams p;
        p.batch = 5, p.seqlen_q = max_q * group, p.seqlen_k = 512;
        p.cu_seqlens_q = cu_q, p.cu_seqlens_k = cu_k, p.total_q = cu_q[5];
        for (int b = 0; b < 5; ++b) {
          const flashattn_cu::SeqInfo si = flashattn_cu::packed_seq_info(p, b, group);
          packed_seq_ok = packed_seq_ok && si.start_q == cu_q[b] &&
                          si.seqlen_q == std::min(lens_q[b], max_q) * group &&
                          si.seqlen_k == std::min(lens_k[b], 512);
        }
        p.cu_seqlens_q = nullptr, p.cu_seqlens_k = nullptr;  // padded: the bound itself
        const flashattn_cu::SeqInfo pad = flashattn_cu::packed_seq_info(p, 2, group);
        packed_seq_ok = packed_seq_ok && pad.start_q == -1 && pad.seqlen_q == max_q * group;
      }
    }
    expect(packed_seq_ok, "kvcache varlen: packed_seq_info rows, starts and key counts");
  }

  // A packed tile's key blocks (Mask::key_blocks_of_queries on its first and last rows'
  // queries) against every row's visible keys: the visited blocks cover every key some row
  // sees, and a block outside the masked ones is seen whole by every row.
  bool packed_blocks_ok = true;
  for (int seqlen_q : {1, 2, 3, 5, 8}) {
    for (int group : {1, 2, 4, 7}) {
      for (int seqlen_k : {1, 17, 64, 130}) {
        for (int w = 0; w < 4; ++w) {
          const int lefts[] = {-1, -1, 20, 3}, rights[] = {-1, 0, 0, 2};
          flashattn_cu::SeqInfo si{0, seqlen_q, seqlen_k, -1, -1};
          const flashattn_cu::Mask mask(si, w == 1, lefts[w], rights[w]);
          const flashattn_cu::GqaPack pack{group};
          constexpr int kBlockM = 16, kBlockN = 16;
          for (int m_start = 0; m_start < seqlen_q * group; m_start += kBlockM) {
            const flashattn_cu::KeyBlocks kb = mask.key_blocks_of_queries<kBlockN>(
                pack.query(m_start), pack.query(m_start + kBlockM - 1));
            for (int r = m_start; r < std::min(m_start + kBlockM, seqlen_q * group); ++r) {
              const int i = pack.query(r);
              for (int key = 0; key < seqlen_k; ++key) {
                const bool visible = key >= mask.key_begin(i) && key < mask.key_end(i);
                const int block = key / kBlockN;
                if (visible && (block < kb.begin || block >= kb.end)) packed_blocks_ok = false;
                const bool unmasked = block >= kb.unmasked_begin && block < kb.unmasked_end;
                if (unmasked && (!visible || (block + 1) * kBlockN > seqlen_k)) {
                  packed_blocks_ok = false;
                }
              }
            }
          }
        }
      }
    }
  }
  expect(packed_blocks_ok, "GQA-packed tiles: key blocks of the rows' queries cover every "
                           "visible key; unmasked blocks are whole and seen by every row");

  // The split heuristic: one split once the tiles fill 80% of the slots; else within
  // [1, min(128, slots, key blocks)], and more splits for fewer tiles.
  using flashattn_cu::num_splits_heuristic;
  bool heur_ok = num_splits_heuristic(264, 264, 512) == 1 && num_splits_heuristic(212, 264, 512) == 1 &&
                 num_splits_heuristic(8, 264, 1) == 1;
  for (int64_t tiles : {1, 2, 8, 32, 64, 100, 200}) {
    for (int n_blocks : {2, 7, 64, 512, 4096}) {
      const int s = num_splits_heuristic(tiles, 264, n_blocks);
      if (s < 1 || s > std::min(128, n_blocks)) heur_ok = false;
    }
  }
  heur_ok = heur_ok && num_splits_heuristic(8, 264, 2048) >= num_splits_heuristic(64, 264, 2048) &&
            num_splits_heuristic(8, 264, 2048) > 8;
  expect(heur_ok, "num_splits_heuristic: bounds, one split for full waves, more for fewer tiles");

  // The merge: splitting a row's keys anywhere gives the LSE of all of them; empty splits
  // count for nothing; a row with no key at all gets +inf.
  const float logits[] = {0.5f, -3.f, 20.f, 7.25f, -40.f, 19.5f, 1e-3f, 3.f, -1.f, 0.f};
  const int n = 10;
  double direct = 0.0;
  for (float x : logits) direct += std::exp(static_cast<double>(x) - 20.0);
  direct = 20.0 + std::log(direct);
  bool merge_ok = true;
  for (int cut1 = 0; cut1 <= n; ++cut1) {
    for (int cut2 = cut1; cut2 <= n; ++cut2) {
      const int bounds[] = {0, cut1, cut1, cut2, n};  // split 1 is always empty
      float part[4];
      for (int s = 0; s < 4; ++s) {
        double sum = 0.0, mx = -INFINITY;
        for (int j = bounds[s]; j < bounds[s + 1]; ++j) mx = std::max(mx, double(logits[j]));
        for (int j = bounds[s]; j < bounds[s + 1]; ++j) sum += std::exp(logits[j] - mx);
        part[s] = bounds[s] == bounds[s + 1] ? -INFINITY : static_cast<float>(mx + std::log(sum));
      }
      const float merged = flashattn_cu::merged_lse(part, 1, 4);
      if (!(std::fabs(merged - direct) < 1e-5)) merge_ok = false;
    }
  }
  const float empty[] = {-INFINITY, -INFINITY, -INFINITY};
  merge_ok = merge_ok && flashattn_cu::merged_lse(empty, 1, 3) == INFINITY;
  expect(merge_ok, "merged_lse: any split of the keys gives their LSE; all empty gives +inf");
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

  check_kvcache_math();
  check_varlen_tiles();
  check_decode_page_boxes();
  check_decode_ctas();
  check_dq_frag_layout();
}

}  // namespace flashattn_cu_checks
