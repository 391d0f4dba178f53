// Host side of the sm90a decode kernel (decode_kernel.h): the TMA maps of the K and V caches, the
// grid, the launch. dispatch.cu decides which calls take it (decode_sm90_ok) and sizes the splits.
#pragma once

#include <cuda.h>

#include "../launch.h"
#include "../problem/params.h"
#include "../problem/scheduler.h"
#include "../tiles.h"
#include "decode_kernel.h"
#include "fwd_launch.h"
#include "launch.h"

namespace flashattn_cu::sm90 {

// The launch of one compiled configuration (benchmarks/tune/tune_decode90.cu sweeps them): kp as
// dispatch builds it (GQA-packed, splits and workspace set). stamps: Traits::kStamps
// configurations only (the harness's timeline; DecodeStamp).
template <typename Element, typename Traits>
Status launch_decode_config(const FwdKvcacheKernelParams& kp, cudaStream_t stream,
                            unsigned long long* stamps = nullptr) {
  const FwdParams& p = kp.p;
  if (Traits::kStamps != (stamps != nullptr)) return Status::kInvalidArgument;
  DecodeTmaParams tp;
  tp.kp = kp;
  tp.stamps = stamps;
  // A paged cache is (pages, page_size, heads_k, d): its pages are the map's entries, read in
  // boxes of the rows that divide both tile and page (decode_tiles.h decode_box_rows_sm90). A
  // contiguous one is (entries, capacity, heads_k, d), one box per tile.
  const bool paged = kp.kv.block_table != nullptr;
  const int64_t rows = paged ? kp.kv.page_size : p.seqlen_k;
  const int entries = paged ? kp.kv.num_pages : (kp.kv.batch_cache > 0 ? kp.kv.batch_cache : p.batch);
  const int box_rows = decode_box_rows_sm90(Traits::kBlockN, paged ? kp.kv.page_size : 0);
  if (box_rows % 16 != 0) return Status::kInvalidArgument;  // decode_tile_sm90_for refuses those
  tp.box_shift = 0;  // box_rows divides the power-of-two kBlockN: a power of two too
  while ((box_rows << tp.box_shift) < Traits::kBlockN) ++tp.box_shift;
  Status st = encode_rows_map(&tp.k_map, p.dtype, p.k, p.head_dim, rows, p.num_heads_k, entries,
                              p.k_row_stride, p.k_head_stride, p.k_batch_stride, box_rows);
  if (st == Status::kSuccess) {
    st = encode_rows_map(&tp.v_map, p.dtype, p.v, p.head_dim, rows, p.num_heads_k, entries,
                         p.v_row_stride, p.v_head_stride, p.v_batch_stride, box_rows);
  }
  if (st != Status::kSuccess) return st;
  const int64_t tiles = split_query_tile_count(ceil_div(p.seqlen_q, Traits::kBlockM), p.batch,
                                               p.num_heads, kp.kv.num_splits);
  // (Persistent CTAs step their tile index by the grid: room above the count for one step.)
  if (tiles > INT_MAX - (Traits::kPersistent ? 65536 : 0)) return Status::kInvalidArgument;
  tp.num_tiles = static_cast<int>(tiles);
  // One CTA per tile, or (kPersistent) at most kMinCtas per SM, each walking several tiles.
  int64_t ctas = tiles;
  if constexpr (Traits::kPersistent) {
    int device = 0, sms = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) {
      err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    }
    if (err != cudaSuccess) return cuda_status(err);
    const int64_t slots = static_cast<int64_t>(sms) * Traits::kMinCtas;
    ctas = tiles < slots ? tiles : slots;
  }
  // Programmatic (launch.h): the CTAs may be scheduled while the previous kernel in the stream
  // finishes; the kernel waits for it before its first global access (decode_kernel.h).
  return launch_tiles_ordered<decode_kernel<Element, Traits>>(
      StreamOrder::kProgrammatic, ctas, Traits::kNThreads, Traits::kSmemBytes, stream, tp);
}

// The instances of one producer count (DecodeTraits kProducerWarps): the configuration
// decode_tiles.h picks for the head dim (decode_tile_sm90; every supported page takes it:
// decode_tile_sm90_for, the rule dispatch_kvcache.cu routes by; launch_decode_config refuses the
// other pages), budgeted for ctas_per_sm CTAs per SM (decode_ctas_sm90: 2 only at d 64, the one head dim with
// an instance for two), on a persistent grid where `persistent` (decode_persistent_sm90; the
// instances decode_persistent_instance_sm90 names: d 64).
template <typename Element, int kHeadDim, int kProducers>
Status run_decode_instances(const FwdKvcacheKernelParams& kp, int ctas_per_sm, bool persistent,
                            cudaStream_t stream) {
  constexpr DecodeTileSm90 tile = decode_tile_sm90(kHeadDim);
  static_assert(tile.supported, "an sm90 decode tile for this head dim");
  if (ctas_per_sm != 1 && !(kHeadDim == 64 && ctas_per_sm == 2)) return Status::kInvalidArgument;
  if constexpr (decode_persistent_instance_sm90(kHeadDim)) {
    if (persistent) {
      if (ctas_per_sm == 2) {
        return launch_decode_config<Element, DecodeTraits<kHeadDim, tile.block_n, tile.stages, true,
                                                          2, false, true, kProducers>>(kp, stream);
      }
      return launch_decode_config<Element, DecodeTraits<kHeadDim, tile.block_n, tile.stages, true,
                                                        1, false, true, kProducers>>(kp, stream);
    }
  } else if (persistent) {
    return Status::kInvalidArgument;  // not this instance (dispatch never asks for it then)
  }
  if constexpr (kHeadDim == 64) {
    if (ctas_per_sm == 2) {
      return launch_decode_config<Element, DecodeTraits<kHeadDim, tile.block_n, tile.stages, true,
                                                        2, false, false, kProducers>>(kp, stream);
    }
  }
  return launch_decode_config<Element, DecodeTraits<kHeadDim, tile.block_n, tile.stages, true, 1,
                                                    false, false, kProducers>>(kp, stream);
}

// The decode kernel for a call: its producer count from the cache (decode_tiles.h
// decode_producers_sm90: more than one only in a build with FLASHATTN_CU_DECODE_PRODUCERS > 1, on
// pages read in boxes), then run_decode_instances.
template <typename Element, int kHeadDim>
Status run_decode(const FwdKvcacheKernelParams& kp, int ctas_per_sm, bool persistent,
                  cudaStream_t stream) {
  const int producers =
      decode_producers_sm90(kHeadDim, kp.kv.block_table != nullptr ? kp.kv.page_size : 0);
  if constexpr (kDecodeProducersBuilt > 1) {
    if (producers == kDecodeProducersBuilt) {
      return run_decode_instances<Element, kHeadDim, kDecodeProducersBuilt>(kp, ctas_per_sm,
                                                                           persistent, stream);
    }
  }
  if (producers != 1) return Status::kInvalidArgument;
  return run_decode_instances<Element, kHeadDim, 1>(kp, ctas_per_sm, persistent, stream);
}

}  // namespace flashattn_cu::sm90
