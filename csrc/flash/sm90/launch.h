// Declarations of the per-(dtype, head dim) sm90a entry points, explicitly instantiated under
// sm90/inst/. Only head dims with bwd_tile_sm90(d).supported have one.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashattn_cu/flashattn_cu.h"

namespace flashattn_cu {
// problem/params.h (a declaration here: this header is also read by the torch binding's C++
// compiler, which should not see the device headers params.h brings in).
struct FwdKvcacheKernelParams;
}  // namespace flashattn_cu

namespace flashattn_cu::sm90 {

template <typename Element, int kHeadDim>
Status run_bwd(const BwdParams& params, cudaStream_t stream);

// Forward (fwd_tile_sm90(d, false).supported head dims), for calls with fwd_tma_ok(params).
template <typename Element, int kHeadDim>
Status run_fwd(const FwdParams& params, cudaStream_t stream);

// The decode kernel (decode_kernel.h; decode_tile_sm90(d).supported head dims), for the
// kvcache calls dispatch.cu's decode_sm90_ok admits: kp as the sm80 kvcache kernel takes it
// (GQA-packed, splits and workspace set); ctas_per_sm: decode_tiles.h decode_ctas_sm90 of the call
// (the splits are sized for it), which picks the instance; persistent: tiles.h
// decode_persistent_sm90 of the call (a grid of ctas_per_sm CTAs per SM walking the tiles).
template <typename Element, int kHeadDim>
Status run_decode(const FwdKvcacheKernelParams& kp, int ctas_per_sm, bool persistent,
                  cudaStream_t stream);

// Whether the sm90 forward's TMA maps can describe this call's q, k and v (fwd_launch.h): keys
// to read (a varlen call with its total_k), and every stride that is stepped positive and below
// the maps' 2^40 bytes. The other calls run the sm80 forward, which has no such bounds.
// The row and batch extents the forward's TMA maps give q and k / v: (seqlen, batch) padded,
// (total rows, 1) varlen, whose maps have one batch entry holding every entry's rows.
struct TmaExtents {
  int64_t q_rows, k_rows;
  int batch;
};

inline TmaExtents tma_extents(const AttnParams& p) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  return varlen ? TmaExtents{p.total_q, p.total_k, 1} : TmaExtents{p.seqlen_q, p.seqlen_k, p.batch};
}

// A map dimension of `extent` indices `stride` elements apart: never stepped (extent 1), or a
// positive stride below the maps' 2^40 bytes.
inline bool tma_stride_ok(int64_t extent, int64_t stride) {
  return extent == 1 || (stride > 0 && stride < (int64_t{1} << 39));
}

// A map (d, rows, heads, entries) of a tensor with these row / head / entry strides
// (tma_host.h encode_rows_map).
inline bool rows_map_ok(int64_t rows, int64_t heads, int64_t entries, int64_t row_stride,
                        int64_t head_stride, int64_t entry_stride) {
  return tma_stride_ok(rows, row_stride) && tma_stride_ok(heads, head_stride) &&
         tma_stride_ok(entries, entry_stride);
}

// The K and V maps (d, rows, heads_k, entries) with the call's k / v strides.
inline bool kv_maps_ok(const AttnParams& p, int64_t rows, int64_t entries) {
  return rows_map_ok(rows, p.num_heads_k, entries, p.k_row_stride, p.k_head_stride,
                     p.k_batch_stride) &&
         rows_map_ok(rows, p.num_heads_k, entries, p.v_row_stride, p.v_head_stride,
                     p.v_batch_stride);
}

inline bool fwd_tma_ok(const FwdParams& p) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  if (p.seqlen_k <= 0 || (varlen && (p.total_k <= 0 || p.total_q <= 0))) return false;
  if (p.q == nullptr || p.k == nullptr || p.v == nullptr) return false;
  const TmaExtents e = tma_extents(p);
  return rows_map_ok(e.q_rows, p.num_heads, e.batch, p.q_row_stride, p.q_head_stride,
                     p.q_batch_stride) &&
         kv_maps_ok(p, e.k_rows, e.batch);
}

// Whether the sm90 backward's TMA maps can describe this call's q and dout (bwd_common.h
// tma_query_block: every stride that is stepped positive and below the maps' 2^40 bytes); the
// other calls run the sm80 backward (both sm90 kernels, the split one at d 256 too, load so).
inline bool bwd_tma_ok(const BwdParams& p) {
  const TmaExtents e = tma_extents(p);
  return rows_map_ok(e.q_rows, p.num_heads, e.batch, p.q_row_stride, p.q_head_stride,
                     p.q_batch_stride) &&
         rows_map_ok(e.q_rows, p.num_heads, e.batch, p.do_row_stride, p.do_head_stride,
                     p.do_batch_stride);
}

// Test hook (sm90/selftest.cu): copies a rows x cols 16-bit matrix (row stride in elements, a
// multiple of 8; pointers 128-byte aligned) through TMA loads and stores.
Status tma_copy_selftest(const void* src, void* dst, int64_t rows, int64_t cols,
                         int64_t row_stride, DType dtype, cudaStream_t stream);

// Test hook (sm90/selftest.cu): clusters of two CTAs over `blocks` (even) blocks of 512 floats;
// block b of dst gets block b ^ 1 of src through distributed shared memory, ranks[b] the CTA's
// rank in its cluster.
Status cluster_exchange_selftest(const float* src, float* dst, int* ranks, int64_t blocks,
                                 cudaStream_t stream);

}  // namespace flashattn_cu::sm90
