// The backward's launch sequence, shared by every path (arch-neutral):
//   preprocess (D, row max / log2 sum, clear dQ accumulator) -> main kernel (dK, dV, atomic dQ;
//   supplied by the path: sm80/bwd_launch.h, sm90/bwd_launch.h) -> [deterministic: dQ kernel]
//   -> postprocess (dQ accumulator and/or dK/dV head-split partials to the output dtype; skipped
//   when there is nothing to convert).
#pragma once

#include "../launch.h"
#include "../problem/scheduler.h"
#include "../tiles.h"
#include "dq_kernel.h"
#include "params.h"
#include "preprocess.h"

namespace flashattn_cu::backward {

template <typename Element, typename Traits>
Status launch_bwd_dq(const BwdKernelParams& kp, cudaStream_t stream) {
  const BwdParams& p = kp.p;
  return with_variant(kernel_variant(p), [&](auto variant) {
    return launch_tiles<bwd_dq_kernel<Element, Traits, decltype(variant)::value>>(
        query_tiles_of(p, Traits::kBlockM),  // compact for varlen (query_tile_of)
        Traits::kNThreads, Traits::kSmemBytes, stream, kp);
  });
}

// The deterministic dQ kernel with head dim kHeadDim's tiles (tiles.h, bwd_tile_sm80).
template <typename Element, int kHeadDim, bool kSmall>
Status launch_bwd_dq_for(const BwdKernelParams& kp, cudaStream_t stream) {
  constexpr BwdTile tile = bwd_tile_sm80(kHeadDim, kSmall);
  using Dq = BwdDqTraits<kHeadDim, tile.dq_block_m, tile.dq_block_n, tile.dq_stages>;
  static_assert(Dq::kSmemBytes == bwd_dq_smem_bytes(tile, kHeadDim), "tiles.h formula");
  return launch_bwd_dq<Element, Dq>(kp, stream);
}

// preprocess -> main(kp, order) -> postprocess. `main` launches the path's main kernel (ordered
// after the preprocess by `order`) and, when deterministic, the dQ kernel. `pdl`: the path's main
// kernel is launched programmatically (sm90/bwd_launch.h: its CTAs start during the preprocess's
// last wave, load K / V / Q / dO, and wait for the preprocess before reading its rows or adding
// to the dQ accumulator), and so is the postprocess (it waits first, then reads); the main kernel
// is launched whole when there is no preprocess to start under (its early loads are safe only
// behind a kernel that itself started after everything before it in the stream). `dq_frag`: the
// main kernel accumulates dQ in bwd/params.h dq_frag_offset's layout (the postprocess reads it so;
// with kFragWs, dq_frag_ws_offset's: sm90/bwd_ws_kernel.h). `stream_dq` (with pdl; only behind a
// main kernel that sets bwd/params.h's key_done flags: sm90/bwd_kernel.h): the
// postprocess converts dQ streamed, each block of rows once the key tiles that add to it are
// done, in the order they complete (`block_major`: block after block over every head, else head
// after head), on the SMs the main kernel's last tiles leave idle; a call whose workspace has no
// flags (bwd/params.h bwd_has_key_done) converts after the main kernel as without it.
template <typename Element, int kHeadDim, bool kFragWs = false, typename MainFn>
Status run_bwd_pipeline(const BwdParams& p, cudaStream_t stream, const MainFn& main,
                        bool pdl = false, bool dq_frag = false, bool stream_dq = false,
                        bool block_major = false) {
  const BwdWorkspaceLayout ws = bwd_workspace_layout(p);
  BwdKernelParams kp = make_bwd_kernel_params(p, ws);

  // 1. Preprocess.
  const int64_t prep = prep_blocks(p, ws.rows);
  // The flags are cleared by the preprocess and read after the main kernel's wait for it: only
  // with a preprocess and the programmatic chain (a workspace with flags has a dQ accumulator).
  if (stream_dq && pdl && prep > 0 && ws.key_done_count > 0) {
    kp.key_done = reinterpret_cast<int*>(static_cast<char*>(p.workspace) + ws.key_done);
    kp.key_done_block_major = block_major;
  }
  Status st = dynamic_instance(p)
                  ? launch_tiles<bwd_preprocess_kernel<Element, kHeadDim, true>>(
                        prep, kPrepThreads, 0, stream, kp)
                  : launch_tiles<bwd_preprocess_kernel<Element, kHeadDim, false>>(
                        prep, kPrepThreads, 0, stream, kp);
  if (st != Status::kSuccess) return st;

  // 2. Main kernel (and the deterministic dQ kernel).
  st = main(kp, pdl && prep > 0 ? StreamOrder::kProgrammatic : StreamOrder::kWhole);
  if (st != Status::kSuccess) return st;

  // 3. Postprocess.
  const BwdConvertParams cp = make_bwd_convert_params(kp, dq_frag);
  if (cp.num_jobs == 0) return Status::kSuccess;
  const int64_t want = ceil_div<int64_t>(cp.max_chunks, kConvertThreads);
  const unsigned blocks = static_cast<unsigned>(want < 65536 ? want : 65536);
  return launch_kernel_ordered<bwd_convert_kernel<Element, kFragWs>>(
      pdl ? StreamOrder::kProgrammatic : StreamOrder::kWhole, dim3(blocks, cp.num_jobs),
      dim3(kConvertThreads), 0, stream, cp);
}

}  // namespace flashattn_cu::backward
