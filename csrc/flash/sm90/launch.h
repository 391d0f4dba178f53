// Declarations of the per-(dtype, head dim) sm90a entry points, explicitly instantiated under
// sm90/inst/. Only head dims with bwd_tile_sm90(d).supported have one.
#pragma once

#include <cuda_runtime.h>

#include "flashattn_cu/flashattn_cu.h"

namespace flashattn_cu::sm90 {

template <typename Element, int kHeadDim>
Status run_bwd(const BwdParams& params, cudaStream_t stream);

}  // namespace flashattn_cu::sm90
