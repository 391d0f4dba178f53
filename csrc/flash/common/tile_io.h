// Global <-> shared tile movement shared by the sm80 kernels.
//
// Shared-memory tiles are row-major with each row padded by one 16-byte chunk
// (Traits::kSmemRowChunks = head_dim / 8 + 1, odd): the 8 row addresses of one ldmatrix then
// fall into 8 different 4-bank groups, so ldmatrix and ldmatrix.trans are conflict-free without
// a swizzle. A Traits type provides kChunks (16-byte chunks per row in global memory),
// kSmemRowChunks and kNThreads.
#pragma once

#include <cstdint>

#include "../ptx/cp_async.h"
#include "numeric.h"

namespace flashattn_cu {

// Copies a kRows x head_dim tile (row stride `row_stride` elements) into padded shared memory
// with cp.async; rows >= rows_valid and columns >= head_dim are zero-filled. kPredicated=false
// is the bulk-loop form for full tiles (rows_valid >= kRows, head_dim == kChunks * 8): no
// per-chunk predicate or select.
template <typename Traits, int kRows, bool kPredicated = true, typename Element>
__device__ __forceinline__ void load_tile_async(uint32_t smem, const Element* gmem,
                                                int64_t row_stride, int rows_valid,
                                                int head_dim, int tid) {
  constexpr int kChunks = Traits::kChunks, kThreads = Traits::kNThreads;
  // Thread tid copies chunks tid, tid + kThreads, ...; walk (row, col) incrementally so only
  // one running pointer is live.
  constexpr int kRowStep = kThreads / kChunks, kColStep = kThreads % kChunks;
  int r = tid / kChunks, c = tid % kChunks;
  const Element* src = gmem + r * row_stride + c * 8;
#pragma unroll
  for (int i = 0; i < ceil_div(kRows * kChunks, kThreads); ++i) {
    if ((kRows * kChunks) % kThreads != 0 && r >= kRows) break;
    const uint32_t dst = smem + (r * Traits::kSmemRowChunks + c) * 16;
    if constexpr (kPredicated) {
      const bool valid = r < rows_valid && c * 8 < head_dim;
      ptx::cp_async_16_zfill(dst, valid ? src : gmem, valid);
    } else {
      ptx::cp_async_16(dst, src);
    }
    r += kRowStep;
    c += kColStep;
    src += kRowStep * row_stride + kColStep * 8;
    if (kColStep != 0 && c >= kChunks) {
      c -= kChunks;
      ++r;
      src += row_stride - kChunks * 8;
    }
  }
}

}  // namespace flashattn_cu
