// Host side of the sm90a backward: its wgmma main kernel's launch, in the arch-neutral pipeline of
// bwd/pipeline.h (preprocess, postprocess, deterministic dQ kernel, workspace).
#pragma once

#include <type_traits>

#include "../bwd/pipeline.h"
#include "../launch.h"
#include "../switches.h"
#include "../problem/scheduler.h"
#include "../tiles.h"
#include "../tma_host.h"
#include "bwd_kernel.h"
#include "bwd_split_kernel.h"
#include "bwd_ws_kernel.h"
#include "launch.h"

namespace flashattn_cu::sm90 {

template <typename Element, typename Traits, bool kSplit, bool kWs, int kVariant>
constexpr auto main_kernel() {
  if constexpr (kSplit) {
    return bwd_split_kernel<Element, Traits, kVariant>;
  } else if constexpr (kWs) {
    return bwd_ws_kernel<Element, Traits, kVariant>;
  } else {
    return bwd_kernel<Element, Traits, kVariant>;
  }
}

// The pipeline around main kernel Traits (kWs: bwd_ws_kernel.h's). defer_light: a window's light
// trailing key blocks last (problem/mask.h deferred_key_blocks; off: key_tile's order, for
// benchmarks/tune/tune_bwd90.cu's A/B). pdl: the main kernel and the postprocess launched
// programmatically (bwd/pipeline.h; off: each kernel whole, for the A/B). causal_lpt: a causal
// call without a window on padded rows walks its key tiles longest first over all of them
// (every key block deferred: key_tile_at's block-major order, key block 0, the longest, of
// every head first) instead of head after head (tune_bwd90 `lpt`). run_bwd_ordered's causal_lpt:
// 0 / 1 as given, -1 the library's rule (tiles.h bwd_causal_lpt_sm90 of the call's keys).
template <typename Element, int kHeadDim, typename Traits, bool kWs>
Status run_bwd_with(const BwdParams& p, cudaStream_t stream, bool defer_light, bool pdl,
                    bool causal_lpt = false) {
  constexpr BwdTileSm90 tile = bwd_tile_sm90(kHeadDim);
  static_assert(tile.supported, "no sm90 backward tile for this head dim");
  static_assert(Traits::kSmemBytes <= 227 * 1024, "fits the sm_90 shared memory");
  const auto main = [&](const BwdKernelParams& base, StreamOrder order) {
    BwdKernelParams kp = base;
    const bool lpt = causal_lpt && plain_causal(p);
    kp.defer_n = lpt           ? ceil_div(p.seqlen_k, Traits::kBlockN)
                 : defer_light ? deferred_key_blocks(p, Traits::kBlockN)
                               : 0;
    typename Traits::Params params;  // BwdTmaParams
    // The q and dout maps (boxes of 64 columns x kBlockM rows; varlen: one entry of every row).
    const TmaExtents e = tma_extents(p);
    const auto encode = [&](CUtensorMap* map, const void* base, int64_t row_stride,
                            int64_t head_stride, int64_t batch_stride) {
      return encode_rows_map(map, p.dtype, base, p.head_dim, e.q_rows, p.num_heads, e.batch,
                             row_stride, head_stride, batch_stride, Traits::kBlockM);
    };
    params.kp = kp;
    // No query rows: no step loads (the maps stay unencoded and unread).
    if (e.q_rows > 0 && e.batch > 0) {
      Status st = encode(&params.q_map, p.q, p.q_row_stride, p.q_head_stride, p.q_batch_stride);
      if (st == Status::kSuccess) {
        st = encode(&params.do_map, p.dout, p.do_row_stride, p.do_head_stride, p.do_batch_stride);
      }
      if (st != Status::kSuccess) return st;
    }
    const auto launch = [&](auto variant) {
      constexpr int kVariant = decltype(variant)::value;
      // Compact for a varlen call on the instances that take them (bwd_common.h).
      const int64_t tiles =
          bwd_compact_tiles<kHeadDim, kVariant>()
              ? key_tiles_of(p, Traits::kBlockN, kp.kv_splits)
              : key_tile_count(ceil_div(p.seqlen_k, Traits::kBlockN), p.batch, p.num_heads_k,
                               kp.kv_splits);
      return launch_tiles_ordered<main_kernel<Element, Traits, tile.split, kWs, kVariant>()>(
          order, tiles, Traits::kNThreads, Traits::kSmemBytes, stream, params);
    };
    // ALiBi alone or softcap alone on a padded call without a window: the static mask's
    // instance of that modifier (problem/mask.h kStaticAlibiVariant, kStaticSoftcapVariant),
    // without the dynamic variant's sequence arrays and window arithmetic; a window alone on a
    // padded call: the dynamic variant's mask without its sequence arrays (kPaddedWindowVariant).
    const Status st =
        static_alibi_call(p)     ? launch(std::integral_constant<int, kStaticAlibiVariant>{})
        : static_softcap_call(p) ? launch(std::integral_constant<int, kStaticSoftcapVariant>{})
        : padded_window_call(p)  ? launch(std::integral_constant<int, kPaddedWindowVariant>{})
                                 : with_variant(kernel_variant(p), launch);
    if (st != Status::kSuccess) return st;
    if (!p.deterministic) return Status::kSuccess;
    return backward::launch_bwd_dq_for<Element, kHeadDim, false>(kp, stream);
  };
  // dq_frag: bwd_kernel.h stages dQ in the fragment layout (bwd_ws_kernel.h and the split
  // kernel's bulk reductions in the warp-major order); the split kernel's red.adds add plain rows.
  if constexpr (tile.split) {
    return backward::run_bwd_pipeline<Element, kHeadDim, Traits::kBulkDq>(p, stream, main, pdl,
                                                                         Traits::kBulkDq);
  } else {
    // dQ streamed (bwd/pipeline.h) behind bwd_kernel.h, whose blocks set the key_done flags, in
    // the order its tiles complete query blocks: longest first over all tiles (causal_lpt) block
    // after block, else head after head.
    const bool stream_dq =
        !kWs && detail::g_bwd_streamed_dq.load(std::memory_order_relaxed);
    return backward::run_bwd_pipeline<Element, kHeadDim, kWs>(
        p, stream, main, pdl, true, stream_dq, causal_lpt && plain_causal(p));
  }
}

// warp_specialized: bwd_ws_kernel.h instead of bwd_kernel.h (d 64 / 128). Compiled only where
// FLASHATTN_CU_BWD_WS is defined (benchmarks/tune/tune_bwd90.cu, mode `ws`) until it has been
// measured; elsewhere asking for it is an invalid argument.
template <typename Element, int kHeadDim>
Status run_bwd_ordered(const BwdParams& p, cudaStream_t stream, bool defer_light,
                       bool pdl = true, bool warp_specialized = false,
                       int causal_lpt = -1) {
  constexpr BwdTileSm90 tile = bwd_tile_sm90(kHeadDim);
  static_assert(tile.supported, "no sm90 backward tile for this head dim");
  const bool lpt = causal_lpt < 0 ? bwd_causal_lpt_sm90(kHeadDim, p.seqlen_k) : causal_lpt != 0;
  if (warp_specialized) {
#ifdef FLASHATTN_CU_BWD_WS
    // Not for varlen calls: its consumers do not zero the rows past an entry in its last query
    // block (bwd_common.h clear_query_tail, which needs the whole CTA at a barrier).
    if (p.cu_seqlens_q != nullptr) return Status::kInvalidArgument;
    if constexpr (!tile.split) {
      // dK run on into the next step, as bwd_kernel.h (ptxas, sm_90a, within the consumers'
      // 240 registers: no spills at d 64; at d 128 none but 12-20 bytes in one modifier
      // variant, 44-60 with dropout, whose wgmmas ptxas also serializes (C7515), as it does at
      // d 64). -DFLASHATTN_CU_BWD_WS_DKNEXT=0 retires dK within its step instead.
#ifdef FLASHATTN_CU_BWD_WS_DKNEXT
      constexpr bool kDkNext = FLASHATTN_CU_BWD_WS_DKNEXT;
#else
      constexpr bool kDkNext = true;
#endif
      return run_bwd_with<Element, kHeadDim, BwdWsTraits<kHeadDim, tile.block_m, kDkNext>, true>(
          p, stream, defer_light, pdl, lpt);
    }
#endif
    return Status::kInvalidArgument;
  }
  using Traits = std::conditional_t<tile.split, BwdSplitTraits<kHeadDim, tile.block_m>,
                                    BwdTraits<kHeadDim, tile.block_m>>;
  return run_bwd_with<Element, kHeadDim, Traits, false>(p, stream, defer_light, pdl, lpt);
}

template <typename Element, int kHeadDim>
Status run_bwd(const BwdParams& p, cudaStream_t stream) {
#if defined(FLASHATTN_CU_BWD_WS) && defined(FLASHATTN_CU_BWD_WS_DEFAULT)
  // A build that runs every d 64 / 128 backward on bwd_ws_kernel.h, for its whole-suite test
  // before it replaces bwd_kernel.h (e.g. NVCC_APPEND_FLAGS="-DFLASHATTN_CU_BWD_WS
  // -DFLASHATTN_CU_BWD_WS_DEFAULT" for the extension's build).
  if constexpr (!bwd_tile_sm90(kHeadDim).split) {
    if (p.cu_seqlens_q == nullptr) {  // varlen: bwd_kernel.h (run_bwd_ordered's refusal)
      return run_bwd_ordered<Element, kHeadDim>(p, stream, true, true, true);
    }
  }
#endif
  return run_bwd_ordered<Element, kHeadDim>(p, stream, true);
}

}  // namespace flashattn_cu::sm90
