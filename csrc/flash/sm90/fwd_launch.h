// Host side of the sm90a forward: the TMA maps of q, k and v, the grid, the launch.
#pragma once

#include <cuda.h>

#include "../launch.h"
#include "../problem/params.h"
#include "../problem/scheduler.h"
#include "../tiles.h"
#include "../tma_host.h"
#include "fwd_kernel.h"
#include "launch.h"

namespace flashattn_cu::sm90 {

// The map of a (batch, rows, heads, head_dim) tensor (varlen: one entry of `rows` = total rows)
// as (head_dim, rows, heads, batch), 128-byte swizzled boxes of 64 columns x box_rows rows: the
// sw128 atoms the wgmma descriptors read (ptx/wgmma.h). Strides in elements. A dimension of
// extent 1 gets a stride the driver accepts whatever the tensor's (it is never stepped).
inline Status encode_rows_map(CUtensorMap* map, DType dtype, const void* base, int head_dim,
                              int64_t rows, int heads, int batch, int64_t row_stride,
                              int64_t head_stride, int64_t batch_stride, int box_rows) {
  const uint64_t dims[4] = {static_cast<uint64_t>(head_dim), static_cast<uint64_t>(rows),
                            static_cast<uint64_t>(heads), static_cast<uint64_t>(batch)};
  const int64_t strides[3] = {row_stride, head_stride, batch_stride};
  uint64_t bytes[3];
  for (int i = 0; i < 3; ++i) {
    bytes[i] = dims[i + 1] == 1 ? 16u : static_cast<uint64_t>(strides[i]) * 2u;
  }
  const uint32_t box[4] = {64u, static_cast<uint32_t>(box_rows), 1u, 1u};
  return encode_tensor_map(map, dtype, 4, base, dims, bytes, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

template <typename Element, int kHeadDim>
Status run_fwd(const FwdParams& p, cudaStream_t stream) {
  constexpr FwdTileSm90 tile = fwd_tile_sm90(kHeadDim);
  static_assert(tile.supported, "no sm90 forward tile for this head dim");
  using Traits = FwdTraits<kHeadDim, tile.block_m, tile.block_n, tile.stages>;
  FwdTmaParams tp;
  tp.kp = make_fwd_kernel_params(p);
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t q_rows = varlen ? p.total_q : p.seqlen_q;
  const int64_t k_rows = varlen ? p.total_k : p.seqlen_k;
  const int batch = varlen ? 1 : p.batch;
  Status st = encode_rows_map(&tp.q_map, p.dtype, p.q, p.head_dim, q_rows, p.num_heads, batch,
                              p.q_row_stride, p.q_head_stride, p.q_batch_stride, Traits::kBlockM);
  if (st == Status::kSuccess) {
    st = encode_rows_map(&tp.k_map, p.dtype, p.k, p.head_dim, k_rows, p.num_heads_k, batch,
                         p.k_row_stride, p.k_head_stride, p.k_batch_stride, Traits::kBlockN);
  }
  if (st == Status::kSuccess) {
    st = encode_rows_map(&tp.v_map, p.dtype, p.v, p.head_dim, k_rows, p.num_heads_k, batch,
                         p.v_row_stride, p.v_head_stride, p.v_batch_stride, Traits::kBlockN);
  }
  if (st != Status::kSuccess) return st;
  return with_variant(kernel_variant(p), [&](auto variant) {
    return launch_tiles<fwd_kernel<Element, Traits, decltype(variant)::value>>(
        query_tile_count(ceil_div(p.seqlen_q, Traits::kBlockM), p.batch, p.num_heads),
        Traits::kNThreads, Traits::kSmemBytes, stream, tp);
  });
}

}  // namespace flashattn_cu::sm90
