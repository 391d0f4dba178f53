// Declarations of the per-(dtype, head dim) sm80 entry points. Each is explicitly instantiated
// in its own file under sm80/inst/, so dispatch.cu links against them without seeing a kernel.
#pragma once

#include <cuda_runtime.h>

#include "flashattn_cu/flashattn_cu.h"

#include "../problem/params.h"

namespace flashattn_cu::sm80 {

// `small_smem`: the device allows less than kLargeSmemBytes of shared memory per block.
template <typename Element, int kHeadDim>
Status run_fwd(const FwdParams& params, bool small_smem, cudaStream_t stream);

// The kvcache variant of the forward (problem/kv_cache.h), on tiles.h's fwd_tile_sm80_kvcache;
// kp.kv is complete (split count, workspace, cache fields).
template <typename Element, int kHeadDim>
Status run_fwd_kvcache(const FwdKvcacheKernelParams& kp, bool small_smem, cudaStream_t stream);

template <typename Element, int kHeadDim>
Status run_bwd(const BwdParams& params, bool small_smem, cudaStream_t stream);

}  // namespace flashattn_cu::sm80
