// The KV cache of flash_attn_with_kvcache, as the kernels see it (flashattn_cu.h: KvcacheParams):
// where a key row of an entry lives (contiguous or paged), which key blocks a split walks, and how
// many splits a call gets. Host and device code: tests/cpp/api_checks.cpp checks the index math
// by brute force.
//
//  * Keys. Entry b attends to keys 0 .. n_b - 1 with n_b = cache_seqlens[b] - cache_leftpad[b]
//    (the kernels take n_b through FwdParams::seqused_k, so the mask, ALiBi and the tail all see
//    the same length); logical key j is cache row leftpad[b] + j of cache entry
//    cache_batch_idx[b] (b without it).
//  * Contiguous cache (batch_cache, seqlen_cache, heads_k, d): row r of entry e at
//    e * batch_stride + r * row_stride.
//  * Paged cache (num_pages, page_size, heads_k, d) with block_table (batch, max_pages): row r of
//    entry b is row r % page_size of page block_table[b][r / page_size], at
//    page * page_stride + (r % page_size) * row_stride, for any page_size >= 1. A page number
//    outside [0, num_pages) is a caller's bug the host cannot see without a sync; the kernels
//    clamp it into range, so it reads some page's rows but never outside the cache.
//  * Varlen queries (flash_attn_varlen_func with block_table: paged prefill). With cu_seqlens_q,
//    entry b's queries are rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q and o (total_q,
//    heads, d) and lse is (heads, total_q), as the varlen forward's (problem/seqlen.h:
//    packed_seq_info, SeqInfo::lse_row0); with cu_seqlens_k, entry b's keys are the first
//    cu_seqlens_k[b + 1] - cu_seqlens_k[b] rows of its cache (the kernels take them through
//    FwdParams::cu_seqlens_k and seq_info, in place of seqused_k). The causal / window diagonal
//    is each entry's own.
//  * GQA packing (GqaPack). The `group` query heads of one kv head run as the rows of one tile:
//    packed row R is query R / group of query head hk * group + R % group (query-major), so every
//    K/V tile read serves the whole group, and a tile's rows cover consecutive queries, whose
//    causal / window key range is the tile's (the mask maps each row to its query). group = 1:
//    no packing, row R is query R.
//  * Split-KV. The key blocks a query block visits, [begin, end) of problem/mask.h, are cut into
//    num_splits contiguous shares of ceil((end - begin) / num_splits) blocks; split s walks
//    [begin + s * share, min(end, begin + (s + 1) * share)), possibly nothing. Each split writes
//    its normalised fp32 output and its LSE (-inf when its share is empty or masked for a row),
//    and fwd/combine.h merges them.
//  * Appending (k_new / v_new: problem/kv_append.h). New row i of entry b goes to cache row
//    cache_seqlens[b] + i and is logical key cache_seqlens[b] - leftpad[b] + i; append_share
//    below says which block writes it.
#pragma once

#include <math.h>

#include <cstdint>

#include "../common/int_math.h"
#include "mask.h"

namespace flashattn_cu {

// The most splits a call takes (flash_attn's limit): the combine reads every split's LSE per row.
constexpr int kMaxSplits = 128;

// Key blocks [begin, end) of split `split` of `splits` over the query block's blocks [begin,
// end) (empty: begin == end).
struct SplitBlocks {
  int begin;
  int end;
};

__host__ __device__ __forceinline__ SplitBlocks split_key_blocks(int begin, int end, int split,
                                                                 int splits) {
  const int blocks = end > begin ? end - begin : 0;
  const int share = ceil_div(blocks, splits);
  SplitBlocks r;
  r.begin = begin + split * share;
  r.end = r.begin + share < end ? r.begin + share : end;
  if (r.begin > end) r.begin = end;
  if (r.end < r.begin) r.end = r.begin;
  return r;
}

// The fused append (problem/kv_append.h, rule 2): rows [begin, end) of the seqlen_new new rows
// of an (entry, kv head) that its owning block (m_block, split) writes, of m_blocks query blocks
// and `splits` splits; owner o = m_block * splits + split takes the o-th share of
// ceil(seqlen_new / owners) rows. Every row once, whatever the mask and the splits' key ranges.
struct AppendShare {
  int begin;
  int end;
};

__host__ __device__ __forceinline__ AppendShare append_share(int seqlen_new, int m_block,
                                                             int m_blocks, int split,
                                                             int splits) {
  // 64-bit products: owners x share can pass 2^31 by up to one share.
  const int64_t owners = static_cast<int64_t>(m_blocks) * splits;
  const int64_t share = (seqlen_new + owners - 1) / owners;
  const int64_t begin = (static_cast<int64_t>(m_block) * splits + split) * share;
  AppendShare r;
  r.begin = static_cast<int>(begin < seqlen_new ? begin : seqlen_new);
  r.end = static_cast<int>(begin + share < seqlen_new ? begin + share : seqlen_new);
  return r;
}

// The row map of a GQA-packed tile (see the top of this file); the kernels take group through
// KvcacheKernelFields::pack_group, and a packed call's seqlen_q rows are seqlen_q * group.
struct GqaPack {
  int group;

  __host__ __device__ __forceinline__ int query(int row) const { return row / group; }
  // The mask's row map (problem/mask.h: Mask::apply).
  __host__ __device__ __forceinline__ int operator()(int row) const { return query(row); }
  // Element offset of packed row `row` in q or o from (entry, query head hk * group, query 0).
  __host__ __device__ __forceinline__ int64_t offset(int row, int64_t row_stride,
                                                     int64_t head_stride) const {
    const int i = query(row);
    return static_cast<int64_t>(i) * row_stride +
           static_cast<int64_t>(row - i * group) * head_stride;
  }
  // The index of packed row `row` of (entry seq, kv head head_k) in the unpacked call's lse,
  // (batch, heads_k * group, max_seqlen_q) or, varlen (seq.start_q >= 0), (heads_k * group,
  // total_q); and so in the split partials (fwd/combine.h).
  __host__ __device__ __forceinline__ int64_t lse_index(const SeqInfo& seq, int head_k,
                                                        int heads_k, int max_seqlen_q,
                                                        int total_q, int row) const {
    const int i = query(row);
    return seq.lse_row0(head_k * group + (row - i * group), heads_k * group, max_seqlen_q,
                        total_q) + i;
  }
};

// Where a cache row of a paged entry lives: its page (clamped into the cache) and its row there.
struct PagedRow {
  int page;
  int in_page;
};

// The paged cache of one entry: its row of the block table.
struct PagedKv {
  const int* table;  // block_table + batch * block_table_batch_stride
  int page_size;
  int num_pages;

  // Cache row `row` (row / page_size < max_pages: the caller's rows are below the cache
  // capacity max_pages * page_size): one division and one table read.
  __host__ __device__ __forceinline__ PagedRow locate(int row) const {
    const int slot = row / page_size;
    int page = table[slot];
    page = page < 0 ? 0 : page >= num_pages ? num_pages - 1 : page;  // never outside the cache
    return PagedRow{page, row - slot * page_size};
  }

  // Element offset of cache row `row`.
  __host__ __device__ __forceinline__ int64_t row_offset(int row, int64_t page_stride,
                                                         int64_t row_stride) const {
    const PagedRow r = locate(row);
    return static_cast<int64_t>(r.page) * page_stride +
           static_cast<int64_t>(r.in_page) * row_stride;
  }
};

// The merged LSE of one row from its splits' LSEs (lse_partial[s * stride], s < splits; -inf for a
// split that saw no key of the row): m + ln(sum_s exp(lse_s - m)) with m the largest, so the
// largest term is exactly 1 and nothing overflows; +inf when every split is empty (the row saw
// no key). fwd/combine.h weighs split s by exp(lse_s - merged).
__host__ __device__ __forceinline__ float merged_lse(const float* lse_partial, int64_t stride,
                                                     int splits) {
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, lse_partial[s * stride]);
  if (m == -INFINITY) return INFINITY;
  float sum = 0.f;
  for (int s = 0; s < splits; ++s) sum += expf(lse_partial[s * stride] - m);
  return m + logf(sum);
}

// How many splits a call with `tiles` (batch x heads x query blocks) thread blocks, `n_blocks`
// key blocks per query block and room for `slots` concurrent blocks (SMs x blocks per SM) gets:
// flash_attn's num_splits_heuristic. One split when the tiles alone nearly fill the GPU (>= 80%
// of a wave); else the fewest splits whose wave efficiency (tiles * splits / slots over its
// ceiling) is within 85% of the best, among split counts that change the share of key blocks
// (11 and 12 splits of 64 blocks both give 6 blocks a split: the extra one would only idle).
// At most kMaxSplits, slots and n_blocks.
__host__ __device__ inline int num_splits_heuristic(int64_t tiles, int slots, int n_blocks,
                                                    int max_splits = kMaxSplits) {
  if (tiles <= 0 || slots <= 0 || n_blocks <= 1) return 1;
  if (static_cast<double>(tiles) >= 0.8 * slots) return 1;
  int limit = max_splits < slots ? max_splits : slots;
  limit = limit < n_blocks ? limit : n_blocks;
  auto eligible = [&](int s) {
    return s == 1 || ceil_div(n_blocks, s) != ceil_div(n_blocks, s - 1);
  };
  auto efficiency = [&](int s) {
    const double waves = static_cast<double>(tiles) * s / slots;
    const double whole = static_cast<double>(static_cast<int64_t>(waves) +
                                             (waves > static_cast<int64_t>(waves) ? 1 : 0));
    return waves / whole;
  };
  double best = 0.0;
  for (int s = 1; s <= limit; ++s) {
    if (eligible(s)) best = efficiency(s) > best ? efficiency(s) : best;
  }
  for (int s = 1; s <= limit; ++s) {
    if (eligible(s) && efficiency(s) >= 0.85 * best) return s;
  }
  return 1;
}

// The split count of the sm90a decode kernel (dispatch_kvcache.cu), whose CTAs stream their keys
// at memory bandwidth with one CTA per SM: as many splits as one wave holds (every tile split
// alike, tiles * splits <= slots), so that the most SMs read; one split when the tiles alone
// nearly fill a wave (>= 80%). A second wave only adds a drain and a refill of each SM's ring.
// Batch 1 with 8 kv heads on 132 SMs: 16 splits, 128 CTAs (the rule above gives 14: 112 CTAs).
// At most kMaxSplits and n_blocks.
__host__ __device__ inline int num_splits_one_wave(int64_t tiles, int slots, int n_blocks,
                                                   int max_splits = kMaxSplits) {
  if (tiles <= 0 || slots <= 0 || n_blocks <= 1) return 1;
  if (static_cast<double>(tiles) >= 0.8 * slots) return 1;
  int64_t s = slots / tiles;
  s = s < max_splits ? s : max_splits;
  s = s < n_blocks ? s : n_blocks;
  return s > 1 ? static_cast<int>(s) : 1;
}

}  // namespace flashattn_cu
