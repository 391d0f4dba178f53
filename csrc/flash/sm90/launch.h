// Declarations of the per-(dtype, head dim) sm90a entry points, explicitly instantiated under
// sm90/inst/. Only head dims with bwd_tile_sm90(d).supported have one.
#pragma once

#include <cuda_runtime.h>

#include "flashattn_cu/flashattn_cu.h"

namespace flashattn_cu::sm90 {

template <typename Element, int kHeadDim>
Status run_bwd(const BwdParams& params, cudaStream_t stream);

// Test hook (sm90/selftest.cu): copies a rows x cols 16-bit matrix (row stride in elements, a
// multiple of 8; pointers 128-byte aligned) through TMA loads and stores.
Status tma_copy_selftest(const void* src, void* dst, int64_t rows, int64_t cols,
                         int64_t row_stride, DType dtype, cudaStream_t stream);

}  // namespace flashattn_cu::sm90
