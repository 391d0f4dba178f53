// K/V tile loads of the kvcache variant through the block table (problem/kv_cache.h: PagedKv).
// A page may hold any number of rows (1, 16, 64, 100, 256, ...) and a tile may straddle pages.
// Device only (cp.async).
//
// The gather is split in three steps so that the block-table read is off the load's critical
// path and the per-16-byte cost is that of a contiguous tile plus one shared-memory read:
//  1. paged_tile_row: thread tid < kRows reads the table entry of tile row tid (one integer
//     division and one 4-byte global load per row and tile, for K and V together; consecutive
//     rows read consecutive or equal entries, so a warp's reads coalesce). The kernel issues it a
//     tile early, before the S = Q K^T of the current tile, so its latency hides behind that
//     tile's V load.
//  2. store_paged_offsets: the same thread writes the row's element offsets in the K and the V
//     cache (int64: a cache may exceed 2^31 elements) to a shared-memory slot of the tile.
//  3. load_paged_tile_async: after a barrier, every 16-byte chunk reads its row's offset from
//     the slot (one LDS.64, broadcast to the row's threads) and issues the same coalesced
//     cp.async pattern as load_tile_async (common/tile_io.h).
#pragma once

#include <cstdint>

#include "../common/numeric.h"
#include "../ptx/cp_async.h"
#include "kv_cache.h"

namespace flashattn_cu {

// Shared memory of the offsets: two tile slots (the tile being loaded and the next one), each
// kRows K offsets then kRows V offsets.
template <int kRows>
__host__ __device__ constexpr int paged_offsets_bytes() {
  return 2 * 2 * kRows * static_cast<int>(sizeof(int64_t));
}

// Step 1 for the tile at cache row row0 with rows_valid rows below the entry's length: where
// row tid lives (PagedKv::locate); rows past the valid ones (or tid >= kRows) are not looked up.
template <int kRows>
__device__ __forceinline__ PagedRow paged_tile_row(const PagedKv& pages, int row0,
                                                   int rows_valid, int tid) {
  PagedRow r{0, 0};
  if (tid < kRows && tid < rows_valid) r = pages.locate(row0 + tid);
  return r;
}

// Step 2: offsets (elements) of row tid in the K and V caches, to `slot` (paged_offsets_bytes /
// 2 bytes: K offsets, then V offsets).
template <int kRows>
__device__ __forceinline__ void store_paged_offsets(int64_t* slot, const PagedRow& r,
                                                    int64_t k_page_stride, int64_t k_row_stride,
                                                    int64_t v_page_stride, int64_t v_row_stride,
                                                    int tid) {
  if (tid < kRows) {
    slot[tid] = static_cast<int64_t>(r.page) * k_page_stride +
                static_cast<int64_t>(r.in_page) * k_row_stride;
    slot[kRows + tid] = static_cast<int64_t>(r.page) * v_page_stride +
                        static_cast<int64_t>(r.in_page) * v_row_stride;
  }
}

// The rows of a tile gathered row by row into a padded shared-memory tile (common/tile_io.h's
// layout, load_tile_async's coalesced walk over 16-byte chunks): row r's elements start at
// base + row_offset(r); rows >= rows_valid and columns >= head_dim are zero-filled (row_offset is
// not called for them).
template <typename Traits, int kRows, typename Element, typename RowOffset>
__device__ __forceinline__ void load_rows_async(uint32_t smem, const Element* base,
                                                const RowOffset& row_offset, int rows_valid,
                                                int head_dim, int tid) {
  constexpr int kChunks = Traits::kChunks, kThreads = Traits::kNThreads;
  constexpr int kRowStep = kThreads / kChunks, kColStep = kThreads % kChunks;
  int r = tid / kChunks, c = tid % kChunks;
#pragma unroll
  for (int i = 0; i < ceil_div(kRows * kChunks, kThreads); ++i) {
    if ((kRows * kChunks) % kThreads != 0 && r >= kRows) break;
    const bool valid = r < rows_valid && c * 8 < head_dim;
    const Element* src = valid ? base + row_offset(r) + c * 8 : base;
    ptx::cp_async_16_zfill(smem + (r * Traits::kSmemRowChunks + c) * 16, src, valid);
    r += kRowStep;
    c += kColStep;
    if (kColStep != 0 && c >= kChunks) {
      c -= kChunks;
      ++r;
    }
  }
}

// Step 3: the tile's rows at the offsets of its slot (row_offsets: the K or V half). base: the
// cache's element 0 of this kv head.
template <typename Traits, int kRows, typename Element>
__device__ __forceinline__ void load_paged_tile_async(uint32_t smem, const Element* base,
                                                      const int64_t* row_offsets,
                                                      int rows_valid, int head_dim, int tid) {
  load_rows_async<Traits, kRows>(
      smem, base, [&](int r) { return row_offsets[r]; }, rows_valid, head_dim, tid);
}

// The Q tile of a kvcache block: packed rows row0 .. row0 + kRows - 1 (problem/kv_cache.h:
// GqaPack; group 1 is a plain tile), row R at base + pack.offset(R) in q. Once per block: one
// division per row and thread.
template <typename Traits, int kRows, typename Element>
__device__ __forceinline__ void load_packed_rows_async(uint32_t smem, const Element* base,
                                                       const GqaPack& pack, int row0,
                                                       int64_t row_stride, int64_t head_stride,
                                                       int rows_valid, int head_dim, int tid) {
  load_rows_async<Traits, kRows>(
      smem, base, [&](int r) { return pack.offset(row0 + r, row_stride, head_stride); },
      rows_valid, head_dim, tid);
}

}  // namespace flashattn_cu
