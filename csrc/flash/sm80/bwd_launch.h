// Host side of the sm80 backward: its main kernel's launch, in the arch-neutral pipeline of
// bwd/pipeline.h (preprocess -> main kernel -> [deterministic dQ kernel] -> postprocess).
#pragma once

#include "../bwd/pipeline.h"
#include "../launch.h"
#include "../problem/scheduler.h"
#include "../tiles.h"
#include "bwd_kernel.h"
#include "launch.h"

namespace flashattn_cu::sm80 {

using backward::BwdKernelParams;

// Whether the large and the small shared-memory class share one tile config at kHeadDim.
constexpr bool same_bwd_tiles(int head_dim) {
  const BwdTile big = bwd_tile_sm80(head_dim, false), small = bwd_tile_sm80(head_dim, true);
  return big.block_m == small.block_m && big.block_n == small.block_n &&
         big.warps == small.warps && big.stages == small.stages &&
         big.dq_warps_m == small.dq_warps_m && big.dq_passes == small.dq_passes &&
         big.dq_block_m == small.dq_block_m && big.dq_block_n == small.dq_block_n &&
         big.dq_stages == small.dq_stages;
}

// Dropout at d <= 64 takes the 64-query steps of the small class: at 128 x 128 its keep bits
// and Philox rounds spill ~650 bytes next to 128 query columns of S^T and dP^T, at 64 x 128
// none (benchmarks/NOTES.md section 11). The large class then has no dropout instance.
constexpr bool dropout_on_small_tiles(int head_dim) {
  return head_dim <= 64 && !same_bwd_tiles(head_dim);
}

template <typename Element, typename Traits, bool kHasDropout>
Status launch_bwd_main(const BwdKernelParams& kp, cudaStream_t stream) {
  const BwdParams& p = kp.p;
  return with_variant(kernel_variant(p), [&](auto variant) {
    constexpr int kVariant = decltype(variant)::value;
    if constexpr (variant_dropout(kVariant) && !kHasDropout) {
      return Status::kInvalidArgument;  // run_bwd sends dropout to the other tile class
    } else {
      return launch_tiles<bwd_kernel<Element, Traits, kVariant>>(
          key_tile_count(ceil_div(p.seqlen_k, Traits::kBlockN), p.batch, p.num_heads_k,
                         kp.kv_splits),
          Traits::kNThreads, Traits::kSmemBytes, stream, kp);
    }
  });
}

template <typename Element, int kHeadDim, bool kSmall>
Status launch_bwd_tiles(const BwdKernelParams& kp, cudaStream_t stream) {
  constexpr BwdTile tile = bwd_tile_sm80(kHeadDim, kSmall);
  using Main = BwdTraits<kHeadDim, tile.block_m, tile.block_n, tile.warps, tile.stages,
                         tile.dq_warps_m, tile.dq_passes>;
  static_assert(Main::kSmemBytes == bwd_smem_bytes(tile, kHeadDim), "tiles.h formula");
  static_assert(kSmall ? Main::kSmemBytes <= 99 * 1024 &&
                             bwd_dq_smem_bytes(tile, kHeadDim) <= 99 * 1024
                       : Main::kSmemBytes <= 163 * 1024 &&
                             bwd_dq_smem_bytes(tile, kHeadDim) <= 163 * 1024,
                "fits the shared memory of its class");
  Status st = launch_bwd_main<Element, Main, kSmall || !dropout_on_small_tiles(kHeadDim)>(kp,
                                                                                       stream);
  if (st == Status::kSuccess && kp.p.deterministic) {
    st = backward::launch_bwd_dq_for<Element, kHeadDim, kSmall>(kp, stream);
  }
  return st;
}

template <typename Element, int kHeadDim>
Status run_bwd(const BwdParams& p, bool small_smem, cudaStream_t stream) {
  const bool small_tiles =
      small_smem || (dropout_on_small_tiles(kHeadDim) && kernel_variant(p) == kDropoutVariant);
  return backward::run_bwd_pipeline<Element, kHeadDim>(p, stream, [&](const BwdKernelParams& kp,
                                                                        StreamOrder) {
    if constexpr (!same_bwd_tiles(kHeadDim)) {
      return small_tiles ? launch_bwd_tiles<Element, kHeadDim, true>(kp, stream)
                         : launch_bwd_tiles<Element, kHeadDim, false>(kp, stream);
    } else {
      return launch_bwd_tiles<Element, kHeadDim, false>(kp, stream);
    }
  });
}

}  // namespace flashattn_cu::sm80
