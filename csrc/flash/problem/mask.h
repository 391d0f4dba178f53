// The mask policy: which keys each query row sees, in one place for every kernel. Today no mask
// and causal, bottom-right aligned as flash_attn 2.1+ defines it (query i sees keys
// j <= i + seqlen_k - seqlen_q); sliding windows join here. It answers three questions:
//  * key_blocks: the key blocks a query block visits, and from which one on the element mask is
//    needed (forward, deterministic dQ kernel), so the bulk of the loop pays nothing;
//  * query_blocks: the query blocks a key block visits, and up to which one the element mask is
//    needed (backward main kernels);
//  * the element mask itself on a score tile (apply, apply_transposed), also covering the
//    sequence tail (keys >= seqlen_k).
// Score tiles are mma C fragments: s[mt][nt][hr * 2 + e] is row (row0 + mt * 16 + g + hr * 8),
// key (col0 + nt * 8 + 2t + e), with g = lane / 4, t = lane % 4.
#pragma once

#include <math.h>

#include "../common/int_math.h"
#include "seqlen.h"

namespace flashattn_cu {

// Key limit of one query row: keys j < limit are visible (the causal rule above).
__host__ __device__ __forceinline__ int visible_key_limit(int row, int seqlen_q, int seqlen_k,
                                                          bool causal) {
  if (!causal) return seqlen_k;
  // (seqlen_k - seqlen_q) first: row + 1 + seqlen_k alone can pass INT_MAX (kMaxSeqlen).
  const int limit = row + 1 + (seqlen_k - seqlen_q);
  return limit < seqlen_k ? limit : seqlen_k;
}

// Key blocks [0, end) hold keys some row of the query block sees; blocks [0, unmasked) are seen
// whole by every row, the rest need the element mask.
struct KeyBlocks {
  int end;
  int unmasked;
};

// Query blocks [begin, num_m) see some key of the key block; blocks [begin, masked_end) need the
// element mask (a key past seqlen_k in the block, or a row that misses a key on the diagonal).
struct QueryBlocks {
  int begin;
  int masked_end;
};

struct Mask {
  int seqlen_q;
  int seqlen_k;
  bool causal;

  __host__ __device__ __forceinline__ Mask(const SeqInfo& si, bool is_causal)
      : seqlen_q(si.seqlen_q), seqlen_k(si.seqlen_k), causal(is_causal) {}

  __host__ __device__ __forceinline__ int key_limit(int row) const {
    return visible_key_limit(row, seqlen_q, seqlen_k, causal);
  }

  template <int kBlockM, int kBlockN>
  __host__ __device__ __forceinline__ KeyBlocks key_blocks(int m_start) const {
    const int shift = seqlen_k - seqlen_q;
    int key_end = seqlen_k, unmasked_keys = seqlen_k;
    if (causal) {
      key_end = imin(seqlen_k, m_start + kBlockM + shift);
      unmasked_keys = imin(seqlen_k, m_start + 1 + shift);
    }
    return KeyBlocks{key_end > 0 ? ceil_div(key_end, kBlockN) : 0,
                     unmasked_keys > 0 ? unmasked_keys / kBlockN : 0};
  }

  // n_start: the key block's first key; keys_valid: its keys below seqlen_k; num_m: query blocks.
  template <int kBlockM, int kBlockN>
  __host__ __device__ __forceinline__ QueryBlocks query_blocks(int n_start, int keys_valid,
                                                               int num_m) const {
    QueryBlocks r{0, keys_valid < kBlockN ? num_m : 0};
    if (causal) {
      const int shift = seqlen_k - seqlen_q;
      const int first_row = n_start - shift;                  // first query seeing key n_start
      const int full_row = n_start + keys_valid - 1 - shift;  // first query seeing every key
      r.begin = first_row <= 0 ? 0 : imin(num_m, first_row / kBlockM);
      r.masked_end =
          imax(r.masked_end, full_row <= 0 ? 0 : imin(num_m, ceil_div(full_row, kBlockM)));
    }
    return r;
  }

  // Sets every score whose key is past its row's limit to -inf.
  template <int kMTiles, int kNTiles>
  __device__ __forceinline__ void apply(float (&s)[kMTiles][kNTiles][4], int row0, int col0,
                                        int lane) const {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int limit = key_limit(row0 + mt * 16 + g + hr * 8);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (col0 + nt * 8 + 2 * t + e >= limit) s[mt][nt][hr * 2 + e] = -INFINITY;
          }
        }
      }
    }
  }

  // The same on a transposed score tile, as the backward holds S^T (rows are keys, columns are
  // queries): s[nt][hr * 2 + e] is key (key0 + g + hr * 8), query (query0 + nt * 8 + 2t + e).
  template <int kQTiles>
  __device__ __forceinline__ void apply_transposed(float (&s)[kQTiles][4], int key0, int query0,
                                                   int lane) const {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int limit = key_limit(query0 + nt * 8 + 2 * t + e);
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          if (key0 + g + hr * 8 >= limit) s[nt][hr * 2 + e] = -INFINITY;
        }
      }
    }
  }
};

}  // namespace flashattn_cu
