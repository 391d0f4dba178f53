// Host side of the sm80 backward: workspace carving and the launch sequence
//   preprocess (D, row max / log2 sum, clear dQ accumulator) -> main kernel (dK, dV, atomic dQ)
//   -> [deterministic: dQ kernel] -> postprocess (dQ accumulator and/or dK/dV head-split partials
//   to the output dtype; skipped when there is nothing to convert).
#pragma once

#include <climits>

#include "../launch.h"
#include "../tiles.h"
#include "bwd_dq_kernel.h"
#include "bwd_kernel.h"
#include "bwd_params.h"
#include "bwd_preprocess.h"
#include "launch.h"

namespace flashattn_cu::sm80 {

template <typename Element, typename Traits>
Status launch_bwd_main(const BwdKernelParams& kp, cudaStream_t stream) {
  const BwdParams& p = kp.p;
  const int64_t blocks =
      ceil_div<int64_t>(p.seqlen_k, Traits::kBlockN) * p.batch * p.num_heads_k * kp.kv_splits;
  if (blocks == 0) return Status::kSuccess;
  if (blocks > INT_MAX) return Status::kInvalidArgument;
  return launch_kernel<bwd_kernel<Element, Traits>>(dim3(static_cast<unsigned>(blocks)),
                       dim3(Traits::kNThreads), Traits::kSmemBytes, stream, kp);
}

template <typename Element, typename Traits>
Status launch_bwd_dq(const BwdKernelParams& kp, cudaStream_t stream) {
  const BwdParams& p = kp.p;
  const int64_t blocks = ceil_div<int64_t>(p.seqlen_q, Traits::kBlockM) * p.batch * p.num_heads;
  if (blocks == 0) return Status::kSuccess;
  if (blocks > INT_MAX) return Status::kInvalidArgument;
  return launch_kernel<bwd_dq_kernel<Element, Traits>>(dim3(static_cast<unsigned>(blocks)),
                       dim3(Traits::kNThreads), Traits::kSmemBytes, stream, kp);
}

template <typename Element, int kHeadDim, bool kSmall>
Status launch_bwd_tiles(const BwdKernelParams& kp, cudaStream_t stream) {
  constexpr BwdTile tile = bwd_tile_sm80(kHeadDim, kSmall);
  using Main = BwdTraits<kHeadDim, tile.block_m, tile.block_n, tile.warps, tile.stages,
                         tile.dq_warps_m, tile.dq_passes>;
  using Dq = BwdDqTraits<kHeadDim, tile.dq_block_m, tile.dq_block_n, tile.dq_stages>;
  static_assert(Main::kSmemBytes == bwd_smem_bytes(tile, kHeadDim), "tiles.h formula");
  static_assert(Dq::kSmemBytes == bwd_dq_smem_bytes(tile, kHeadDim), "tiles.h formula");
  static_assert(kSmall ? Main::kSmemBytes <= 99 * 1024 && Dq::kSmemBytes <= 99 * 1024
                       : Main::kSmemBytes <= 163 * 1024 && Dq::kSmemBytes <= 163 * 1024,
                "fits the shared memory of its class");
  Status st = launch_bwd_main<Element, Main>(kp, stream);
  if (st == Status::kSuccess && kp.p.deterministic) st = launch_bwd_dq<Element, Dq>(kp, stream);
  return st;
}

// preprocess -> main(kp) -> postprocess. `main` launches the main kernel (and, when
// deterministic, the dQ kernel); the sm90 path shares the rest.
template <typename Element, int kHeadDim, typename MainFn>
Status run_bwd_pipeline(const BwdParams& p, cudaStream_t stream, const MainFn& main) {
  const BwdWorkspaceLayout ws = bwd_workspace_layout(p);
  const BwdKernelParams kp = make_bwd_kernel_params(p, ws);

  // 1. Preprocess.
  const int64_t prep_blocks = static_cast<int64_t>(p.batch) * p.num_heads * ws.rows /
                              kPrepRowsPerBlock;
  if (prep_blocks > INT_MAX) return Status::kInvalidArgument;
  if (prep_blocks > 0) {
    const Status st = launch_kernel<bwd_preprocess_kernel<Element, kHeadDim>>(
                                    dim3(static_cast<unsigned>(prep_blocks)), dim3(kPrepThreads),
                                    0, stream, kp);
    if (st != Status::kSuccess) return st;
  }

  // 2. Main kernel (and the deterministic dQ kernel).
  const Status st = main(kp);
  if (st != Status::kSuccess) return st;

  // 3. Postprocess.
  const BwdConvertParams cp = make_bwd_convert_params(kp);
  if (cp.num_jobs == 0) return Status::kSuccess;
  const int64_t want = ceil_div<int64_t>(cp.max_chunks, kConvertThreads);
  const unsigned blocks = static_cast<unsigned>(want < 65536 ? want : 65536);
  return launch_kernel<bwd_convert_kernel<Element>>(dim3(blocks, cp.num_jobs),
                       dim3(kConvertThreads), 0, stream, cp);
}

// The deterministic dQ kernel of head dim kHeadDim's tiles (also used by the sm90 path).
template <typename Element, int kHeadDim, bool kSmall>
Status launch_bwd_dq_for(const BwdKernelParams& kp, cudaStream_t stream) {
  constexpr BwdTile tile = bwd_tile_sm80(kHeadDim, kSmall);
  using Dq = BwdDqTraits<kHeadDim, tile.dq_block_m, tile.dq_block_n, tile.dq_stages>;
  return launch_bwd_dq<Element, Dq>(kp, stream);
}

template <typename Element, int kHeadDim>
Status run_bwd(const BwdParams& p, bool small_smem, cudaStream_t stream) {
  constexpr BwdTile big = bwd_tile_sm80(kHeadDim, false);
  constexpr BwdTile small = bwd_tile_sm80(kHeadDim, true);
  constexpr bool kSameTiles =
      big.block_m == small.block_m && big.block_n == small.block_n && big.warps == small.warps &&
      big.stages == small.stages && big.dq_warps_m == small.dq_warps_m &&
      big.dq_passes == small.dq_passes && big.dq_block_m == small.dq_block_m &&
      big.dq_block_n == small.dq_block_n && big.dq_stages == small.dq_stages;
  return run_bwd_pipeline<Element, kHeadDim>(p, stream, [&](const BwdKernelParams& kp) {
    if constexpr (!kSameTiles) {
      return small_smem ? launch_bwd_tiles<Element, kHeadDim, true>(kp, stream)
                        : launch_bwd_tiles<Element, kHeadDim, false>(kp, stream);
    } else {
      return launch_bwd_tiles<Element, kHeadDim, false>(kp, stream);
    }
  });
}

}  // namespace flashattn_cu::sm80
