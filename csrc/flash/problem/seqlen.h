// Sequence info: where one batch entry's rows start in each tensor and how long its query and
// key sequences are. Every kernel (forward, backward main kernels of both archs, dQ kernel,
// preprocess, convert) asks this one function. Two layouts:
//  * padded (batch, seqlen, ...): entry b starts at b * batch_stride, has seqlen_q queries and
//    seqlen_k keys;
//  * varlen (cu_seqlens, flash_attn's packed (total, heads, d) tensors): entry b starts at row
//    cu_seqlens[b] and has cu_seqlens[b + 1] - cu_seqlens[b] rows, clamped to the max_seqlen
//    bound the grid and the workspaces were sized with (params.seqlen_q / seqlen_k);
// and seqused_k (either layout) shortens an entry's keys. The kvcache kernels ask
// packed_seq_info, the same with the GQA-packed query rows (problem/kv_cache.h: GqaPack).
#pragma once

#include <cstdint>

namespace flashattn_cu {

struct SeqInfo {
  int batch;     // the entry
  int seqlen_q;  // its query rows
  int seqlen_k;  // its keys
  int start_q;   // varlen: its first row in q/o; -1 in the padded layout
  int start_k;   // varlen: its first row in k/v; -1 in the padded layout

  // Element offset of the entry's row 0 in a q-like (rows of seqlen_q) or k-like tensor with
  // these strides.
  __host__ __device__ __forceinline__ int64_t q_offset(int64_t batch_stride,
                                                       int64_t row_stride) const {
    return start_q >= 0 ? static_cast<int64_t>(start_q) * row_stride
                        : static_cast<int64_t>(batch) * batch_stride;
  }
  __host__ __device__ __forceinline__ int64_t k_offset(int64_t batch_stride,
                                                       int64_t row_stride) const {
    return start_k >= 0 ? static_cast<int64_t>(start_k) * row_stride
                        : static_cast<int64_t>(batch) * batch_stride;
  }
  // Index of (head, the entry's row 0) in a per-row fp32 array laid out as the forward's lse:
  // (batch, num_heads, max_seqlen_q) padded, (num_heads, total_q) varlen.
  __host__ __device__ __forceinline__ int64_t lse_row0(int head, int num_heads, int max_seqlen_q,
                                                       int total_q) const {
    return start_q >= 0 ? static_cast<int64_t>(head) * total_q + start_q
                        : (static_cast<int64_t>(batch) * num_heads + head) * max_seqlen_q;
  }
};

// Whether a call needs the dynamic sequence info (cu_seqlens or seqused_k): kernels are compiled
// twice, the padded instance (kDynamic = false) reads no sequence array and costs nothing.
template <typename Params>
__host__ __device__ __forceinline__ bool dynamic_seqlens(const Params& p) {
  return p.cu_seqlens_q != nullptr || p.seqused_k != nullptr;
}

// Params: any struct with the AttnParams fields (FwdParams, BwdParams). kDynamic: read
// cu_seqlens and seqused_k from global memory when present (dynamic_seqlens(p) must be false
// for the kDynamic = false instance).
template <bool kDynamic, typename Params>
__host__ __device__ __forceinline__ SeqInfo seq_info(const Params& p, int batch) {
  SeqInfo s{batch, p.seqlen_q, p.seqlen_k, -1, -1};
  if constexpr (!kDynamic) return s;
  if (p.cu_seqlens_q != nullptr) {
    s.start_q = p.cu_seqlens_q[batch];
    const int n = p.cu_seqlens_q[batch + 1] - s.start_q;
    s.seqlen_q = n <= 0 ? 0 : n < p.seqlen_q ? n : p.seqlen_q;
  }
  if (p.cu_seqlens_k != nullptr) {
    s.start_k = p.cu_seqlens_k[batch];
    const int n = p.cu_seqlens_k[batch + 1] - s.start_k;
    s.seqlen_k = n <= 0 ? 0 : n < p.seqlen_k ? n : p.seqlen_k;
  }
  if (p.seqused_k != nullptr) {
    const int used = p.seqused_k[batch];
    s.seqlen_k = used < s.seqlen_k ? (used > 0 ? used : 0) : s.seqlen_k;
  }
  return s;
}

// The kvcache kernels' view (problem/kv_cache.h): each query of an entry is `group` tile rows
// (GqaPack; 1 without packing) and p.seqlen_q is the packed bound (max queries x group), so a
// varlen entry has min(its queries, the bound / group) x group rows; start_q stays its first
// query's row in q / o. Keys as seq_info's. Computed as min(n x group, bound) in int64 (equal to
// the clamped queries times group, without a division). seq_info itself is left as it was, so
// the other kernels compile as before.
template <typename Params>
__host__ __device__ __forceinline__ SeqInfo packed_seq_info(const Params& p, int batch,
                                                            int group) {
  SeqInfo s = seq_info<true>(p, batch);
  if (p.cu_seqlens_q != nullptr) {
    const int64_t rows =
        static_cast<int64_t>(p.cu_seqlens_q[batch + 1] - s.start_q) * group;
    s.seqlen_q = rows <= 0 ? 0 : rows < p.seqlen_q ? static_cast<int>(rows) : p.seqlen_q;
  }
  return s;
}

}  // namespace flashattn_cu
