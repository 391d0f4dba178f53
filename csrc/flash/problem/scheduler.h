// The tile scheduler: thread block index <-> the tile of the problem it computes, in one place
// for every kernel and its launch (grid size and decode agree by construction). Today one tile
// per block in a flat 1-D grid (2^31 - 1 blocks, so batch x heads is never capped at 65535);
// persistent and split-KV scheduling replace these functions.
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

__device__ __forceinline__ QueryTile query_tile(int num_m_blocks, int num_heads) {
  QueryTile t;
  t.m_block = num_m_blocks - 1 - static_cast<int>(blockIdx.x % num_m_blocks);
  const int bh = static_cast<int>(blockIdx.x / num_m_blocks);
  t.batch = bh / num_heads;
  t.head = bh % num_heads;
  return t;
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

}  // namespace flashattn_cu
