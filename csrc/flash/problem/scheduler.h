// The tile scheduler: thread block index <-> the tile of the problem it computes, in one place
// for every kernel and its launch (grid size and decode agree by construction). Today one tile
// per block in a flat 1-D grid (2^31 - 1 blocks, so batch x heads is never capped at 65535);
// the split-KV and persistent schedules below walk the same tiles in other orders.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

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

// Tile `index` of split_query_tile_count (host checks; a kernel passes blockIdx.x, or each of a
// persistent CTA's tiles: sm90/decode_kernel.h).
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

// cta_tile_index for CTAs in pairs (the sm90 forward's FwdTraits kPairKV: clusters of two, CTAs
// 2c and 2c + 1; `ctas` even): the pair walks pair indices cta_tile_index(k, c, ctas / 2) and the
// CTA of rank cta % 2 takes tile 2 x pair + rank, so the two hold adjacent tiles at every step
// (in query_tile_at's order without groups, one head's adjacent query blocks while the head has
// an even count of them). k = 0 gives tile `cta`.
__host__ __device__ __forceinline__ int pair_tile_index(int k, int cta, int ctas) {
  return 2 * cta_tile_index(k, cta / 2, ctas / 2) + cta % 2;
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

// The longest walk of the static persistent schedule (cta_tile_index's rounds over
// query_tile_at's grouped order, defer_m 0) of `ctas` CTAs, in key blocks: query block m of
// every head walks blocks[m] of them, plus `fixed` for each tile that walks any (its start, last
// P V and epilogue, which no step of its own hides). Host only. A group's query block m is a run
// of equal tiles, consecutive in the order; each piece of a run within one round adds its cost
// to a contiguous range of CTAs (reversed on odd rounds), summed through a difference array:
// O(groups x num_m + tiles / ctas + ctas) without a division, not O(tiles).
inline double grouped_walk_longest(const int* blocks, int num_m, int total_heads, int group_heads,
                                   int ctas, double fixed, std::vector<double>& diff) {
  diff.resize(static_cast<size_t>(ctas) + 1);
  std::fill(diff.begin(), diff.end(), 0.0);
  int pos = 0;         // the next tile's place in its round
  bool forward = true;  // even rounds run CTA 0 .. ctas - 1, odd ones back
  for (int first = 0; first < total_heads; first += group_heads) {
    const int heads = std::min(group_heads, total_heads - first);
    for (int m = num_m - 1; m >= 0; --m) {
      const double cost = blocks[m] > 0 ? blocks[m] + fixed : 0.0;
      for (int left = heads; left > 0;) {
        const int take = std::min(left, ctas - pos);
        const int lo = forward ? pos : ctas - pos - take;
        diff[lo] += cost;
        diff[lo + take] -= cost;
        left -= take;
        pos += take;
        if (pos == ctas) {
          pos = 0;
          forward = !forward;
        }
      }
    }
  }
  double load = 0.0, longest = 0.0;
  for (int c = 0; c < ctas; ++c) longest = std::max(longest, load += diff[c]);
  return longest;
}

// query_tile_at's group_heads for a causal call's persistent walk, from the L2's bound (l2_group:
// fwd_launch.h l2_head_group) and a wider one (max_group, at least l2_group; the library's:
// kWalkGroupCap x l2_group).
// Of the sizes from l2_group down to half of it, the one whose longest walk (grouped_walk_longest)
// is the shortest, the larger on a tie. Within a group the snake pairs one round's heavy tiles
// with the next round's lighter ones; where a group ends mid-round the next group's heaviest
// tiles fall on the CTAs that just took heavy ones, and with the L2's group that left the longest
// walk 5-27% over the mean at some lengths (a simulation of the bench's shapes at 1k-6k keys,
// 50 MB of L2, 132 CTAs: d 64 192 x 128 2k 1.23, 4k 1.24; d 128 128 x 128 1k 1.10;
// benchmarks/NOTES.md 12.65), and 1-4% with the group chosen so. Smaller groups keep their K / V
// in the L2 all the same. Some lengths have no size within the L2's bound that balances (d 128
// 128 x 176 3k keys: 1.08 at best); the sizes past it, up to max_group, whose K / V no longer all
// fit half the L2, are weighed by (1 + kWalkL2Penalty x log2(size / l2_group)) on their longest
// walk, and the lightest of all is taken (the bounded one on a tie). kWalkL2Penalty from the H100
// (tune_fwd90 `groupcap`, NOTES 12.67): at equal modelled balance 2.75x the L2's group ran 1-2%
// slower than 1.4x (d 128 3k, 6k), and d 64 8k's 3.6x gained what the model said (1.1%) over 1.7x.
// At most 24 sizes are tried within the bound and 48 past it, fewer where a walk has many runs
// (10-60 us of a host at the bench's shapes, once per shape: fwd_launch.h fwd_walk_group keeps
// the answers).
constexpr double kWalkL2Penalty = 0.01;
constexpr double kWalkGroupCap = 4.0;  // the library's max_group over l2_group
inline int balanced_group_heads(const int* blocks, int num_m, int total_heads, int l2_group,
                                int ctas, double fixed, int max_group = 0) {
  l2_group = std::min(l2_group, total_heads);
  max_group = std::min(std::max(max_group, l2_group), total_heads);
  if (l2_group < 1 || ctas <= 1 || num_m <= 0) return l2_group < 1 ? 1 : l2_group;
  std::vector<double> diff;
  auto longest = [&](int g) {
    return grouped_walk_longest(blocks, num_m, total_heads, g, ctas, fixed, diff);
  };
  auto stride_over = [&](int lowest, int highest, int64_t most) {
    const int64_t runs = (static_cast<int64_t>(total_heads) / lowest + 1) * num_m;
    const int64_t tries = std::max<int64_t>(1, std::min<int64_t>(most, 400000 / (runs + ctas)));
    return static_cast<int>(std::max<int64_t>(1, (highest - lowest + tries - 1) / tries));
  };
  int best = l2_group;
  double best_len = longest(l2_group);
  if (l2_group > 1) {
    const int lowest = (l2_group + 1) / 2, stride = stride_over(lowest, l2_group, 24);
    for (int g = l2_group - stride; g >= lowest; g -= stride) {
      const double len = longest(g);
      if (len < best_len * (1.0 - 1e-9)) {
        best = g;
        best_len = len;
      }
    }
  }
  if (max_group > l2_group) {
    double best_weight = best_len;
    const int stride = stride_over(l2_group + 1, max_group, 48);
    for (int g = l2_group + 1; g <= max_group; g += stride) {
      const double weight =
          longest(g) * (1.0 + kWalkL2Penalty * std::log2(static_cast<double>(g) / l2_group));
      if (weight < best_weight * (1.0 - 1e-9)) {
        best = g;
        best_weight = weight;
      }
    }
  }
  return best;
}

// The leading query blocks (of block_m rows) whose rows' left windows (window_left >= 0,
// bottom-right aligned) are cut short by key 0, so that they visit fewer key blocks than the rest
// (window (1024, 0), blocks of 128: blocks 0 .. 7 see 1 .. 8 of the 9 key blocks the others see):
// query_tile_at's defer_m. 0 without a bounded window on both sides (window_right: 0 for causal;
// with the right side unbounded the rows cut by key 0 see every later key, the most of any row)
// and when every block is light.
__host__ __device__ __forceinline__ int light_query_blocks(int window_left, int window_right,
                                                           int seqlen_q, int seqlen_k,
                                                           int block_m) {
  if (window_left < 0 || window_right < 0 || block_m <= 0 || seqlen_q <= 0) return 0;
  // Row r's window starts at key r + (seqlen_k - seqlen_q) - window_left: below 0 for the rows
  // r < cut, which the first ceil(cut / block_m) blocks hold.
  const int64_t cut = static_cast<int64_t>(window_left) - (static_cast<int64_t>(seqlen_k) - seqlen_q);
  const int64_t num_m = (static_cast<int64_t>(seqlen_q) + block_m - 1) / block_m;
  const int64_t light = cut <= 0 ? 0 : (cut + block_m - 1) / block_m;
  return light >= num_m ? 0 : static_cast<int>(light);
}

// Varlen tiles, compact. A grid of batch x heads x the blocks of max_seqlen launches a CTA for
// every block of the longest entry in every entry: a pack of 300 documents whose longest has 8k
// tokens, 128k in all, is 19,200 query blocks of 128 a head where 1,300 hold rows (an empty CTA
// of the sm90 kernels still sets up its barriers and shared memory). The compact space gives
// entry b the slots from varlen_slot0(cu[b], b) = cu[b] / block + b up to entry b + 1's: its
// ceil(len / block) blocks and 0-2 slots that hold none (len = 0: one), total / block + batch
// slots in all (varlen_slot_count, with total >= cu[batch]: the host knows it without reading
// cu_seqlens). A tile index names (entry, slice, slot), entry-major: entry b's tiles are
// [slot0(b) x slices, slot0(b + 1) x slices), slice after slice (heads, or kv heads x splits),
// each the entry's span of slots. Finding the entry is a binary search over cu_seqlens
// (log2(batch + 1) loads of one small array, L1-resident). Contradictory arrays (decreasing, past
// total) are trapped by the first CTA (problem/seqlen.h check_seqlens); here they only give
// tiles that hold no block (valid false), never an index outside [0, batch].
__host__ __device__ __forceinline__ int64_t varlen_slot0(int start, int entry, int block) {
  return static_cast<int64_t>(start / block) + entry;
}

__host__ __device__ __forceinline__ int64_t varlen_slot_count(int64_t total, int batch,
                                                              int block) {
  return total / block + batch;
}

// The entry whose slots hold slot `s`: the largest b in [0, batch] with varlen_slot0(cu[b], b)
// <= s (b = batch: past every entry's slots), 0 when none is.
__host__ __device__ __forceinline__ int varlen_slot_entry(const int* cu, int batch, int block,
                                                          int64_t s) {
  int lo = 0, hi = batch;
  while (lo < hi) {
    const int mid = hi - (hi - lo) / 2;  // in (lo, hi]
    if (varlen_slot0(cu[mid], mid, block) <= s) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

struct VarlenTile {
  int entry, slice, slot, span;  // span: the entry's slots
  bool valid;                    // false: the tile holds no slot of any entry
};

// slot_major: within an entry, slot after slot (every slice's slot s before any slice's s + 1)
// instead of slice after slice.
__host__ __device__ __forceinline__ VarlenTile varlen_tile_at(const int* cu, int batch,
                                                              int block, int slices,
                                                              int64_t index,
                                                              bool slot_major = false) {
  VarlenTile t{0, 0, 0, 0, false};
  if (batch <= 0 || slices <= 0 || index < 0) return t;
  const int b = varlen_slot_entry(cu, batch, block, index / slices);
  if (b >= batch) return t;
  const int64_t first = varlen_slot0(cu[b], b, block);
  const int64_t span = varlen_slot0(cu[b + 1], b + 1, block) - first;
  const int64_t local = index - first * slices;
  if (span <= 0 || local < 0 || local >= span * slices) return t;
  t.entry = b;
  // One division either way (slot_major: by the slices, the quotient the slot).
  const int64_t divisor = slot_major ? slices : span;
  const int64_t quotient = local / divisor, rest = local - quotient * divisor;
  t.slice = static_cast<int>(slot_major ? rest : quotient);
  t.slot = static_cast<int>(slot_major ? quotient : rest);
  t.span = static_cast<int>(span);
  t.valid = true;
  return t;
}

// Whether a call's query tiles (key tiles) of `block` rows are the compact varlen ones:
// cu_seqlens with the row count it indexes (total_k is optional in the C++ API), and fewer
// compact slots than the padded grid's batch x ceil(max_seqlen / block) blocks. A buffer padded
// far past its last entry (CUDA-graph serving pads the token count) has more slots than that
// (batch 4, max_seqlen 256, 16k rows: 132 against 8 a head), a max_seqlen of 0 has no block.
// Both sides read only the call's fields, so the host's count and a kernel's decoding agree.
template <typename Params>
__host__ __device__ __forceinline__ bool compact_query_tiles(const Params& p, int block) {
  return p.cu_seqlens_q != nullptr &&  // total_q is required with it
         varlen_slot_count(p.total_q, p.batch, block) <
             static_cast<int64_t>(p.batch) * ((p.seqlen_q + block - 1) / block);
}
template <typename Params>
__host__ __device__ __forceinline__ bool compact_key_tiles(const Params& p, int block) {
  return p.cu_seqlens_k != nullptr && p.total_k > 0 &&
         varlen_slot_count(p.total_k, p.batch, block) <
             static_cast<int64_t>(p.batch) * ((p.seqlen_k + block - 1) / block);
}

// The query tiles of a call in blocks of block_m rows and their decoding, query_tile's order
// ((batch, head, m_block) with the m_block fastest and in reverse) in both layouts; a compact
// tile that holds no block gets m_block = num_m, so the kernels' "query block past the entry's
// rows" exit skips it. kSeqlens: the kernel instance reads sequence arrays (the others never
// see cu_seqlens: the host counts their tiles padded as well).
template <typename Params>
__host__ __device__ __forceinline__ int64_t query_tiles_of(const Params& p, int block_m) {
  return compact_query_tiles(p, block_m)
             ? p.num_heads * varlen_slot_count(p.total_q, p.batch, block_m)
             : query_tile_count((p.seqlen_q + block_m - 1) / block_m, p.batch, p.num_heads);
}

// block_major: a compact entry's tiles block after block (every head's longest query block,
// then every head's next, ...: varlen_tile_at's slot_major) instead of head after head.
template <bool kSeqlens, typename Params>
__host__ __device__ __forceinline__ QueryTile query_tile_of(const Params& p, int block_m,
                                                            int64_t index,
                                                            bool block_major = false) {
  const int num_m = (p.seqlen_q + block_m - 1) / block_m;
  if constexpr (kSeqlens) {
    if (compact_query_tiles(p, block_m)) {
      const VarlenTile v = varlen_tile_at(p.cu_seqlens_q, p.batch, block_m, p.num_heads, index,
                                          block_major);
      if (!v.valid) return QueryTile{0, 0, num_m};
      return QueryTile{v.entry, v.slice, v.span - 1 - v.slot};
    }
  }
  return query_tile_at(static_cast<int>(index), num_m, p.num_heads);
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

// Tile `index` of key_tile_count in that order; with defer_n > 0 (a window, whose last key
// blocks are seen by fewer query rows than the others: light_key_blocks) the order over key
// blocks 0 .. num_n_blocks - defer_n - 1 of every (batch, head_k, split) (total_slices of
// them), then key block num_n_blocks - defer_n of every slice, ..., the last block of every
// slice: the light tiles last, heaviest first, so that the hardware hands them to the SMs that
// free up at the end (the forward's defer_m mirrored: query_tile_at).
__host__ __device__ __forceinline__ KeyTile key_tile_at(int index, int num_n_blocks, int splits,
                                                        int num_heads_k, int total_slices = 0,
                                                        int defer_n = 0) {
  KeyTile t;
  const int lead_n = num_n_blocks - defer_n;
  int rest;
  if (defer_n > 0 && index >= lead_n * total_slices) {
    const int tail = index - lead_n * total_slices;
    t.n_block = lead_n + tail / total_slices;
    rest = tail % total_slices;
  } else {
    t.n_block = index % lead_n;
    rest = index / lead_n;
  }
  t.split = rest % splits;
  rest /= splits;
  t.head_k = rest % num_heads_k;
  t.batch = rest / num_heads_k;
  return t;
}

#ifdef __CUDACC__
__device__ __forceinline__ KeyTile key_tile(int num_n_blocks, int splits, int num_heads_k) {
  return key_tile_at(static_cast<int>(blockIdx.x), num_n_blocks, splits, num_heads_k);
}
#endif

// The key tiles of a call in blocks of block_n keys and their decoding, key_tile_at's order in
// both layouts (compact_key_tiles: the compact varlen one, slices = kv heads x splits, key
// blocks in order; a tile that holds no block gets n_block = num_n, past every entry's keys, so
// the kernels' "key block past the entry's length" exit skips it). total_slices / defer_n: as
// key_tile_at (padded calls only: varlen defers no block).
template <typename Params>
__host__ __device__ __forceinline__ int64_t key_tiles_of(const Params& p, int block_n,
                                                         int splits) {
  return compact_key_tiles(p, block_n)
             ? static_cast<int64_t>(p.num_heads_k) * splits *
                   varlen_slot_count(p.total_k, p.batch, block_n)
             : key_tile_count((p.seqlen_k + block_n - 1) / block_n, p.batch, p.num_heads_k,
                              splits);
}

template <bool kSeqlens, typename Params>
__host__ __device__ __forceinline__ KeyTile key_tile_of(const Params& p, int block_n, int splits,
                                                        int64_t index, int total_slices = 0,
                                                        int defer_n = 0) {
  const int num_n = (p.seqlen_k + block_n - 1) / block_n;
  if constexpr (kSeqlens) {
    if (compact_key_tiles(p, block_n)) {
      const VarlenTile v = varlen_tile_at(p.cu_seqlens_k, p.batch, block_n,
                                                       p.num_heads_k * splits, index);
      if (!v.valid) return KeyTile{0, 0, 0, num_n};
      return KeyTile{v.entry, v.slice / splits, v.slice % splits, v.slot};
    }
  }
  return key_tile_at(static_cast<int>(index), num_n, splits, p.num_heads_k, total_slices,
                     defer_n);
}

// The trailing key blocks (of block_n keys) whose keys are seen by fewer query rows than the
// others because the window's left side runs past the last query row (bottom-right aligned:
// key j's rows end at j - (seqlen_k - seqlen_q) + window_left, past seqlen_q - 1 for the keys
// j >= seqlen_k - window_left): key_tile_at's defer_n. Window (1024, 0), 16k keys, blocks of
// 128: the last 8 blocks, seen by 1024 + 1 .. 128 rows against 1152 for the others. 0 without a
// bounded window on both sides (with the right side unbounded those keys are seen by every
// earlier row, the most of any key) and when every block is light.
__host__ __device__ __forceinline__ int light_key_blocks(int window_left, int window_right,
                                                         int seqlen_q, int seqlen_k, int block_n) {
  if (window_left < 0 || window_right < 0 || block_n <= 0 || seqlen_q <= 0 || seqlen_k <= 0) {
    return 0;
  }
  const int64_t first_light_key = static_cast<int64_t>(seqlen_k) - window_left;
  if (first_light_key <= 0) return 0;
  const int64_t num_n = (static_cast<int64_t>(seqlen_k) + block_n - 1) / block_n;
  const int64_t light = num_n - first_light_key / block_n;
  return light >= num_n ? 0 : static_cast<int>(light);
}

}  // namespace flashattn_cu
