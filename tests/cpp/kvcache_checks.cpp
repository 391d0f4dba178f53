// Brute-force checks of the KV-cache side's host-callable math (no GPU, no API call): the fused
// append's owners, the split ranges and the split tile order, the paged row map, GQA packing,
// the kvcache kernels' varlen queries and a packed tile's key blocks, the split heuristic and the
// merge (problem/kv_cache.h, problem/scheduler.h, problem/seqlen.h, problem/mask.h), and the sm90
// decode kernel's paged boxes and CTAs per SM (tiles.h). Run by api_checks (api_checks.cpp's
// main: run_kvcache_checks), built by CMake's ctest (.ci/run).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "flashattn_cu/flashattn_cu.h"

#include "checks.h"
#include "problem/kv_cache.h"   // split ranges, the paged row map, the split heuristic and merge
#include "problem/mask.h"       // a packed tile's key blocks
#include "problem/scheduler.h"  // the split tile order
#include "problem/seqlen.h"     // the kvcache kernels' varlen queries (packed_seq_info)
#include "tiles.h"  // the sm90 decode kernel's page rule (decode_tile_sm90_for, decode_box_rows_sm90)

namespace {

using flashattn_cu::KvcacheParams;
using flashattn_cu_checks::expect;

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

// The decode kernel's CTAs per SM (decode_tiles.h decode_ctas_sm90): two exactly for d 64 pages read in
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

}  // namespace

namespace flashattn_cu_checks {

// Every check of this file (api_checks.cpp's main calls it).
void run_kvcache_checks() {
  check_kvcache_math();
  check_decode_page_boxes();
  check_decode_ctas();
}

}  // namespace flashattn_cu_checks
