// Attention masks applied to a warp's S accumulators (raw scores, layout of mma C fragments:
// s[mt][nt][hr * 2 + e] is row (row0 + mt * 16 + g + hr * 8), key (col0 + nt * 8 + 2t + e)).
#pragma once

#include <math.h>

namespace flashattn_cu {

// Key limit of one query row: keys j < limit are visible. Causal is bottom-right aligned
// (flash_attn 2.1+): query i sees keys j <= i + seqlen_k - seqlen_q.
__host__ __device__ __forceinline__ int visible_key_limit(int row, int seqlen_q, int seqlen_k,
                                                          bool causal) {
  if (!causal) return seqlen_k;
  // (seqlen_k - seqlen_q) first: row + 1 + seqlen_k alone can pass INT_MAX (kMaxSeqlen).
  const int limit = row + 1 + (seqlen_k - seqlen_q);
  return limit < seqlen_k ? limit : seqlen_k;
}

// Sets every score whose key is past its row's limit (sequence tail, causal) to -inf.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void mask_scores(float (&s)[kMTiles][kNTiles][4], int row0, int col0,
                                            int seqlen_q, int seqlen_k, bool causal, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int limit = visible_key_limit(row0 + mt * 16 + g + hr * 8, seqlen_q, seqlen_k, causal);
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

// The same rule on a transposed score tile, as the backward holds S^T (rows are keys, columns are
// queries): s[nt][hr * 2 + e] is key (key0 + g + hr * 8), query (query0 + nt * 8 + 2t + e).
template <int kQTiles>
__device__ __forceinline__ void mask_scores_transposed(float (&s)[kQTiles][4], int key0,
                                                       int query0, int seqlen_q, int seqlen_k,
                                                       bool causal, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int nt = 0; nt < kQTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int limit = visible_key_limit(query0 + nt * 8 + 2 * t + e, seqlen_q, seqlen_k, causal);
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        if (key0 + g + hr * 8 >= limit) s[nt][hr * 2 + e] = -INFINITY;
      }
    }
  }
}

}  // namespace flashattn_cu
