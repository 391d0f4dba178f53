// Sequence info: where one batch entry's rows start in each tensor and how long its query and
// key sequences are. Every kernel (forward, backward main kernels of both archs, dQ kernel,
// preprocess) asks this one function, so a layout is added here once: today the padded
// (batch, seqlen) layout, where entry b starts at b * batch_stride and every entry has seqlen_q
// queries and seqlen_k keys; variable-length batches (cu_seqlens: entry b starts at row
// cu_seqlens[b] of a packed (total, heads, d) tensor) and seqused_k plug in here.
#pragma once

#include <cstdint>

namespace flashattn_cu {

struct SeqInfo {
  int batch;     // the entry
  int seqlen_q;  // its query rows
  int seqlen_k;  // its keys

  // Element offset of the entry's row 0 in a q-like (rows of seqlen_q) or k-like tensor with
  // these strides.
  __host__ __device__ __forceinline__ int64_t q_offset(int64_t batch_stride,
                                                       int64_t /*row_stride*/) const {
    return batch * batch_stride;
  }
  __host__ __device__ __forceinline__ int64_t k_offset(int64_t batch_stride,
                                                       int64_t /*row_stride*/) const {
    return batch * batch_stride;
  }
};

// Params: any struct with seqlen_q and seqlen_k (FwdParams, BwdParams).
template <typename Params>
__host__ __device__ __forceinline__ SeqInfo seq_info(const Params& p, int batch) {
  return SeqInfo{batch, p.seqlen_q, p.seqlen_k};
}

}  // namespace flashattn_cu
