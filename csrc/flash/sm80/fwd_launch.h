// Host side of the sm80 forward: grid shape, shared-memory attribute, launch.
#pragma once

#include "../fwd/attn_probs.h"
#include "../launch.h"
#include "../problem/params.h"
#include "../problem/scheduler.h"
#include "../tiles.h"
#include "fwd_kernel.h"
#include "launch.h"

namespace flashattn_cu::sm80 {

template <typename Element, typename Traits>
Status launch_fwd(const FwdParams& p, cudaStream_t stream) {
  const FwdKernelParams kp = make_fwd_kernel_params(p);
  const int64_t tiles =
      query_tile_count(ceil_div(p.seqlen_q, Traits::kBlockM), p.batch, p.num_heads);
  const Status st = with_variant(kernel_variant(p), [&](auto variant) {
    constexpr int kVariant = decltype(variant)::value;
    if constexpr (kVariant == kSoftcapVariant && std::is_same_v<Element, __nv_bfloat16>) {
      // Softcap alone in bf16 within the bounded reference's caps (problem/score_mod.h).
      if (kp.score.bounded_ref) {
        return launch_tiles<fwd_kernel<Element, Traits, kVariant, true>>(
            tiles, Traits::kNThreads, Traits::kSmemBytes, stream, kp);
      }
    }
    return launch_tiles<fwd_kernel<Element, Traits, kVariant>>(tiles, Traits::kNThreads,
                                                                Traits::kSmemBytes, stream, kp);
  });
  if (st != Status::kSuccess || p.s_dmask == nullptr || !(p.dropout_p > 0.f)) return st;
  return forward::launch_attn_probs<Element>(kp, stream);  // reads the lse just written
}

template <typename Element, typename Traits>
Status launch_fwd_kvcache(const FwdKvcacheKernelParams& kp, cudaStream_t stream) {
  const FwdParams& p = kp.p;
  // Q, the K/V stages and the paged gather's row offsets (fwd_kernel.h: kvcache_smem_bytes).
  return launch_tiles<fwd_kvcache_kernel<Element, Traits>>(
      split_query_tile_count(ceil_div(p.seqlen_q, Traits::kBlockM), p.batch, p.num_heads,
                             kp.kv.num_splits),
      Traits::kNThreads, kvcache_smem_bytes<Traits>(), stream, kp);
}

// The library's configuration of the forward (kKvcache: the kvcache kernel's tiles) on its big or
// (kSmall) its small tile, with tiles.h's sm80 knobs: the one place they are read.
template <int kHeadDim, bool kKvcache, bool kSmall>
struct LibraryFwd {
  static constexpr FwdTile kTile = kKvcache ? fwd_tile_sm80_kvcache(kHeadDim, kSmall)
                                            : fwd_tile_sm80(kHeadDim, kSmall);
  using Traits = FwdTraits<kHeadDim, kTile.block_m, kTile.block_n, kTile.warps,
                           kTile.unpredicated_bulk_loads, fwd_lazy_rescale_sm80(),
                           fwd_skip_kept_sm80()>;
};

template <typename Element, int kHeadDim>
Status run_fwd_kvcache(const FwdKvcacheKernelParams& kp, bool small_smem, cudaStream_t stream) {
  constexpr FwdTile big = fwd_tile_sm80_kvcache(kHeadDim, false);
  constexpr FwdTile small = fwd_tile_sm80_kvcache(kHeadDim, true);
  if constexpr (big.block_m != small.block_m || big.block_n != small.block_n ||
                big.warps != small.warps) {
    if (small_smem) {
      return launch_fwd_kvcache<Element, typename LibraryFwd<kHeadDim, true, true>::Traits>(
          kp, stream);
    }
  }
  return launch_fwd_kvcache<Element, typename LibraryFwd<kHeadDim, true, false>::Traits>(kp,
                                                                                          stream);
}

template <typename Element, int kHeadDim>
Status run_fwd(const FwdParams& p, bool small_smem, cudaStream_t stream) {
  constexpr FwdTile big = fwd_tile_sm80(kHeadDim, false);
  constexpr FwdTile small = fwd_tile_sm80(kHeadDim, true);
  if constexpr (big.block_m != small.block_m || big.block_n != small.block_n ||
                big.warps != small.warps) {
    if (small_smem) {
      return launch_fwd<Element, typename LibraryFwd<kHeadDim, false, true>::Traits>(p, stream);
    }
  }
  return launch_fwd<Element, typename LibraryFwd<kHeadDim, false, false>::Traits>(p, stream);
}

}  // namespace flashattn_cu::sm80
