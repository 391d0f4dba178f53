// K/V tile loads of the kvcache variant through the block table (problem/kv_cache.h: PagedKv):
// every row of a tile is gathered from its own page, so a page may hold any number of rows
// (1, 16, 64, 256, 100, ...) and a tile may straddle pages. Device only (cp.async).
#pragma once

#include <cstdint>

#include "../common/numeric.h"
#include "../ptx/cp_async.h"
#include "kv_cache.h"

namespace flashattn_cu {

// Copies cache rows row0 .. row0 + kRows - 1 of the entry behind `pages` into a padded
// shared-memory tile (common/tile_io.h's layout); rows >= rows_valid and columns >= head_dim are
// zero-filled (and their block-table entries not read). base: the cache's element 0 of this kv
// head.
template <typename Traits, int kRows, typename Element>
__device__ __forceinline__ void load_paged_tile_async(uint32_t smem, const Element* base,
                                                      const PagedKv& pages, int row0,
                                                      int64_t page_stride, int64_t row_stride,
                                                      int rows_valid, int head_dim, int tid) {
  constexpr int kChunks = Traits::kChunks, kThreads = Traits::kNThreads;
#pragma unroll
  for (int i = 0; i < ceil_div(kRows * kChunks, kThreads); ++i) {
    const int idx = tid + i * kThreads;
    if ((kRows * kChunks) % kThreads != 0 && idx >= kRows * kChunks) break;
    const int r = idx / kChunks, c = idx % kChunks;
    const bool valid = r < rows_valid && c * 8 < head_dim;
    const Element* src = base;
    if (valid) src += pages.row_offset(row0 + r, page_stride, row_stride) + c * 8;
    ptx::cp_async_16_zfill(smem + (r * Traits::kSmemRowChunks + c) * 16, src, valid);
  }
}

}  // namespace flashattn_cu
