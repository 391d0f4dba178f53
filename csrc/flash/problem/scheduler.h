// The tile scheduler: thread block index <-> the tile of the problem it computes, in one place
// for every kernel and its launch (grid size and decode agree by construction). Today one tile
// per block in a flat 1-D grid (2^31 - 1 blocks, so batch x heads is never capped at 65535);
// the split-KV and persistent schedules below walk the same tiles in other orders.
#pragma once

#include <cstdint>

namespace flashattn_cu {

// Query-block tiles (forward, deterministic dQ): (batch, head, m_block), the m_block fastest and
// in reverse, so the heaviest (last, for causal) query blocks of each (batch, head) start first.
struct QueryTile {
  int batch, head, m_block;
};

__host__ __device__ __forceinline__ int64_t query_tile_count(int num_m_blocks, int batch,
                                                             int num_heads) {
  return static_cast<int64_t>(num_m_blocks) * batch * num_heads;
}

#ifdef __CUDACC__  // blockIdx: the decoders of a kernel's own tile
__device__ __forceinline__ QueryTile query_tile(int num_m_blocks, int num_heads) {
  QueryTile t;
  t.m_block = num_m_blocks - 1 - static_cast<int>(blockIdx.x % num_m_blocks);
  const int bh = static_cast<int>(blockIdx.x / num_m_blocks);
  t.batch = bh / num_heads;
  t.head = bh % num_heads;
  return t;
}
#endif

// Split-KV query tiles (the kvcache forward): (batch, head, m_block, split), the split fastest,
// so the splits of one query block run side by side (and finish together for the combine), then
// the m_block in reverse as query_tile. splits = 1 is query_tile's order.
struct SplitQueryTile {
  int batch, head, m_block, split;
};

__host__ __device__ __forceinline__ int64_t split_query_tile_count(int num_m_blocks, int batch,
                                                                   int num_heads, int splits) {
  return query_tile_count(num_m_blocks, batch, num_heads) * splits;
}

// Tile `index` of split_query_tile_count (host checks; the kernel passes blockIdx.x).
__host__ __device__ __forceinline__ SplitQueryTile split_query_tile_at(int64_t index,
                                                                       int num_m_blocks,
                                                                       int num_heads,
                                                                       int splits) {
  SplitQueryTile t;
  t.split = static_cast<int>(index % splits);
  const int64_t rest = index / splits;
  t.m_block = num_m_blocks - 1 - static_cast<int>(rest % num_m_blocks);
  const int64_t bh = rest / num_m_blocks;
  t.batch = static_cast<int>(bh / num_heads);
  t.head = static_cast<int>(bh % num_heads);
  return t;
}

// The k-th tile index of CTA `cta` of `ctas` that walk several tiles each (the sm90 forward):
// round k is tiles k * ctas .. k * ctas + ctas - 1, handed out in snake order (odd rounds
// backwards), so with tiles in decreasing cost (the grouped order below) every CTA gets a heavy
// and a light one in turn instead of CTA 0 the heaviest of every round. Past the last tile once
// it returns >= the tile count (rounds only grow).
__host__ __device__ __forceinline__ int cta_tile_index(int k, int cta, int ctas) {
  return k * ctas + (k % 2 == 0 ? cta : ctas - 1 - cta);
}

// Tile `index` of the tiles of query_tile_count, for kernels that walk several tiles per CTA
// (cta_tile_index). Tile indices are below 2^31 (launch_tiles' bound on the tile count).
//  * group_heads == 0: query_tile's order (with a grid of one CTA per tile, query_tile itself).
//  * group_heads > 0, longest first (causal on a persistent grid): the (batch, head)s in groups
//    of group_heads, and within a group every head's last query block, then every head's
//    second to last, ..., so concurrent tiles cost about the same and the lightest come last,
//    while the group's K and V stay in L2 (the host sizes the group to it). Without the groups
//    (one group of every head) concurrent tiles span all heads, whose K and V no longer fit
//    (measured: d = 128, causal, 16k: 573 TFLOP/s against 674 in query_tile's order).
//  * defer_m > 0 (a left window, whose first query blocks see fewer keys than the others): the
//    order above over query blocks defer_m .. num_m_blocks - 1 of every head (total_heads of
//    them), then query block defer_m - 1 of every head, ..., block 0 of every head: the light
//    tiles last, longest first, where they fill the last round of a persistent walk instead of
//    lengthening a CTA that has a full round more (a static schedule of window (1024, 0) at 16k,
//    2048 tiles on 132 CTAs: 5.8% over the mean load in the grouped order, 1.1% so).
__host__ __device__ __forceinline__ QueryTile query_tile_at(int index, int num_m_blocks,
                                                            int num_heads, int group_heads = 0,
                                                            int total_heads = 0, int defer_m = 0) {
  QueryTile t;
  int bh;
  const int lead_m = num_m_blocks - defer_m;  // the query blocks in the order of group_heads
  if (defer_m > 0 && index >= lead_m * total_heads) {
    const int rest = index - lead_m * total_heads;
    t.m_block = defer_m - 1 - rest / total_heads;
    bh = rest % total_heads;
  } else if (group_heads <= 0) {
    t.m_block = num_m_blocks - 1 - index % lead_m;
    bh = index / lead_m;
  } else {
    const int group = index / (group_heads * lead_m);
    const int rest = index - group * group_heads * lead_m;
    const int first = group * group_heads;
    const int heads = total_heads - first < group_heads ? total_heads - first : group_heads;
    t.m_block = num_m_blocks - 1 - rest / heads;
    bh = first + rest % heads;
  }
  t.batch = bh / num_heads;
  t.head = bh % num_heads;
  return t;
}

// The leading query blocks (of block_m rows) whose rows' left windows (window_left >= 0,
// bottom-right aligned) are cut short by key 0, so that they visit fewer key blocks than the rest
// (window (1024, 0), blocks of 128: blocks 0 .. 7 see 1 .. 8 of the 9 key blocks the others see):
// query_tile_at's defer_m. 0 without a left window and when every block is light.
__host__ __device__ __forceinline__ int light_query_blocks(int window_left, int seqlen_q,
                                                           int seqlen_k, int block_m) {
  if (window_left < 0 || block_m <= 0 || seqlen_q <= 0) return 0;
  // Row r's window starts at key r + (seqlen_k - seqlen_q) - window_left: below 0 for the rows
  // r < cut, which the first ceil(cut / block_m) blocks hold.
  const int64_t cut = static_cast<int64_t>(window_left) - (static_cast<int64_t>(seqlen_k) - seqlen_q);
  const int64_t num_m = (static_cast<int64_t>(seqlen_q) + block_m - 1) / block_m;
  const int64_t light = cut <= 0 ? 0 : (cut + block_m - 1) / block_m;
  return light >= num_m ? 0 : static_cast<int>(light);
}

// Key-block tiles (backward main kernels): (batch, kv head, head split, n_block), the key block
// fastest: the blocks that read the same Q/dO run together and share them through L2; key block
// 0 (the longest for causal) of each head starts first.
struct KeyTile {
  int batch, head_k, split, n_block;
};

__host__ __device__ __forceinline__ int64_t key_tile_count(int num_n_blocks, int batch,
                                                           int num_heads_k, int splits) {
  return static_cast<int64_t>(num_n_blocks) * batch * num_heads_k * splits;
}

#ifdef __CUDACC__
__device__ __forceinline__ KeyTile key_tile(int num_n_blocks, int splits, int num_heads_k) {
  KeyTile t;
  int rest = static_cast<int>(blockIdx.x);
  t.n_block = rest % num_n_blocks;
  rest /= num_n_blocks;
  t.split = rest % splits;
  rest /= splits;
  t.head_k = rest % num_heads_k;
  t.batch = rest / num_heads_k;
  return t;
}
#endif

}  // namespace flashattn_cu
