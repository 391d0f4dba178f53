// Sequence info: where one batch entry's rows start in each tensor and how long its query and
// key sequences are. Every kernel (forward, backward main kernels of both archs, dQ kernel,
// preprocess, convert) asks this one function. Two layouts:
//  * padded (batch, seqlen, ...): entry b starts at b * batch_stride, has seqlen_q queries and
//    seqlen_k keys;
//  * varlen (cu_seqlens, flash_attn's packed (total, heads, d) tensors): entry b starts at row
//    cu_seqlens[b] and has cu_seqlens[b + 1] - cu_seqlens[b] rows, clamped to the max_seqlen
//    bound the grid and the workspaces were sized with (params.seqlen_q / seqlen_k), which
//    check_seqlens below makes sure never cuts an entry;
// and seqused_k (either layout) shortens an entry's keys. The kvcache kernels ask
// packed_seq_info, the same with the GQA-packed query rows (problem/kv_cache.h: GqaPack).
#pragma once

#include <math.h>

#include <cstdint>

#include "flashattn_cu/flashattn_cu.h"

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

// A causal call on padded rows without a window (FwdParams, BwdParams): every (batch, head) has
// the same tiles, each longest-first order a fixed one (the sm90 forward's causal schedule and
// balanced walk, sm90/fwd_launch.h; the sm90 backward's longest-first key tiles).
template <typename Params>
__host__ __device__ __forceinline__ bool plain_causal(const Params& p) {
  return p.is_causal && p.window_left < 0 && !dynamic_seqlens(p);
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

#ifdef __CUDACC__  // device code (the host C++ of tests/cpp includes this header too)
// The rows of a varlen tensor (total rows) that no entry owns: before cu_seqlens[0] (0 by
// contract) and from cu_seqlens[batch] on, e.g. a buffer padded past its last sequence (as
// serving and CUDA-graph code pads the token count). No tile of the call covers them, so the
// kernels' outputs there would keep whatever memory held (flash_attn leaves them so): garbage,
// or NaN, flowing on from an output, and into weight gradients from dq / dk / dv. The first
// CTAs of each kernel that writes such an output clear them instead (clear_outside_rows):
// outputs 0 and lse +inf, as for a row that sees no key.
struct OutsideRows {
  int lo, hi, total;  // rows [0, lo) and [hi, total)
  __device__ __forceinline__ int count() const { return lo + (total - hi); }
  __device__ __forceinline__ int row(int i) const { return i < lo ? i : hi + (i - lo); }
};

__device__ __forceinline__ OutsideRows outside_rows(const int* cu, int batch, int total) {
  int lo = cu[0], hi = cu[batch];
  lo = lo < 0 ? 0 : lo > total ? total : lo;
  hi = hi < lo ? lo : hi > total ? total : hi;
  return OutsideRows{lo, hi, total};
}

// Zeroes the outside rows of a (total, heads, head_dim) 16-bit tensor (head_dim a multiple of 8,
// 16-byte aligned rows), thread `share` of `threads` taking every threads-th 16-byte chunk.
__device__ __forceinline__ void zero_outside_rows(void* base, int64_t row_stride,
                                                  int64_t head_stride, int heads, int head_dim,
                                                  const OutsideRows& rows, int share,
                                                  int threads) {
  const int chunks = head_dim / 8;
  const int64_t n = static_cast<int64_t>(rows.count()) * heads * chunks;
  for (int64_t i = share; i < n; i += threads) {
    const int64_t rh = i / chunks;
    const int64_t at = rows.row(static_cast<int>(rh / heads)) * row_stride +
                       (rh % heads) * head_stride + (i % chunks) * 8;
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(base) + at) = make_uint4(0u, 0u, 0u, 0u);
  }
}

// The CTAs that share the clearing: the first kClearOutsideCtas of a kernel's grid (the others
// do nothing, not even the two loads), so that a buffer padded by many rows is cleared at the
// rate of several SMs rather than one, and the other CTAs start their tiles as before.
constexpr int kClearOutsideCtas = 32;

// A forward's outside rows (FwdParams with cu_seqlens_q and total_q): o 0, lse +inf and the
// row statistics (+inf, 0) (flashattn_cu.h: a row that sees no key). Thread `share` of
// `threads` takes every threads-th element. Out of line, called at a kernel's start where
// nothing is live yet.
__device__ __noinline__ inline void clear_outside_share(const FwdParams& p, int share,
                                                        int threads) {
  if (p.total_q <= 0 || p.o == nullptr || p.lse == nullptr) return;
  const OutsideRows rows = outside_rows(p.cu_seqlens_q, p.batch, p.total_q);
  const int n = rows.count();
  if (n == 0) return;
  zero_outside_rows(p.o, p.o_row_stride, p.o_head_stride, p.num_heads, p.head_dim, rows, share,
                    threads);
  for (int64_t i = share; i < static_cast<int64_t>(n) * p.num_heads; i += threads) {
    const int64_t at = (i / n) * p.total_q + rows.row(static_cast<int>(i % n));
    p.lse[at] = INFINITY;
    if (p.softmax_stats != nullptr) {
      reinterpret_cast<float2*>(p.softmax_stats)[at] = make_float2(INFINITY, 0.f);
    }
  }
}

// A backward's outside rows (BwdParams with cu_seqlens_q / _k): dq 0 past the entries' queries
// (total_q rows), dk and dv 0 past their keys (total_k rows, where known). As above.
__device__ __noinline__ inline void clear_outside_share(const BwdParams& p, int share,
                                                        int threads) {
  if (p.total_q > 0 && p.dq != nullptr) {
    zero_outside_rows(p.dq, p.dq_row_stride, p.dq_head_stride, p.num_heads, p.head_dim,
                      outside_rows(p.cu_seqlens_q, p.batch, p.total_q), share, threads);
  }
  if (p.total_k > 0 && p.dk != nullptr && p.dv != nullptr) {
    const OutsideRows rows = outside_rows(p.cu_seqlens_k, p.batch, p.total_k);
    zero_outside_rows(p.dk, p.dk_row_stride, p.dk_head_stride, p.num_heads_k, p.head_dim, rows,
                      share, threads);
    zero_outside_rows(p.dv, p.dv_row_stride, p.dv_head_stride, p.num_heads_k, p.head_dim, rows,
                      share, threads);
  }
}

// The kernels' call (Params: FwdParams or BwdParams, a varlen call or not): the first
// kClearOutsideCtas CTAs of a 1-D grid clear the call's outside rows.
template <typename Params>
__device__ __forceinline__ void clear_outside_rows(const Params& p) {
  if (p.cu_seqlens_q == nullptr || p.batch < 0) return;
  const int ctas = gridDim.x < kClearOutsideCtas ? static_cast<int>(gridDim.x) : kClearOutsideCtas;
  if (static_cast<int>(blockIdx.x) >= ctas || blockIdx.y != 0 || blockIdx.z != 0) return;
  clear_outside_share(p, static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x),
                      ctas * static_cast<int>(blockDim.x));
}

// A varlen call's entries against its bounds: every cu_seqlens_q entry's rows (its queries
// times `group`, the kvcache kernels' GQA packing) within params.seqlen_q, every cu_seqlens_k
// entry's keys within params.seqlen_k, none negative, none past total_q / total_k (where
// known). An entry that is not would be computed clamped to the bound (seq_info): a longer
// entry's causal diagonal and key range shifted onto other keys, its last rows never written,
// or rows outside the tensors: a plausible wrong answer (flash_attn's kernels leave such rows
// unwritten too). The arrays live on the GPU, so no host check sees them without a
// synchronization; instead the first CTA of each kernel that reads them checks every entry at
// its start (its threads a strided share each) and stops the launch with a trap, which the
// CUDA runtime reports at the next synchronization, as PyTorch's device-side asserts on bad
// indices. At the start, not inside seq_info: a trap on seq_info's paths (the steps' masks,
// the next tile's arithmetic) made ptxas spill 300-1,600 bytes in the sm90 forward's varlen
// variants. Other CTAs start at once and may compute the bad entries before the trap lands;
// the launch fails all the same. A kernel with no sequence arrays returns at once.
// The check's loop, out of line: called at a kernel's start, where nothing is live yet, so the
// kernels' register allocation does not carry it (inlined, it moved the sm80 forward's varlen
// variants from 8-52 to 32-116 bytes of spills). No printf before the trap: even here, out of
// line, a printf of the bad entry moved those variants to 20-72 bytes (the sm90 kernels kept
// theirs); FLASHATTN_CU_CHECK_SEQLENS=1 gives the message from the host instead.
__device__ __noinline__ inline void check_seqlens_entries(const int* cu_q, const int* cu_k,
                                                         int batch, int64_t bound_q, int bound_k,
                                                         int total_q, int total_k, int group) {
  const int threads = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
  const int tid =
      static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  for (int b = tid; b < batch; b += threads) {
    bool bad = false;
    if (cu_q != nullptr) {
      const int start = cu_q[b], end = cu_q[b + 1];
      bad |= start < 0 || end < start || static_cast<int64_t>(end - start) * group > bound_q ||
             end > total_q;  // total_q is required with cu_seqlens_q (0: no query row)
    }
    if (cu_k != nullptr) {
      const int start = cu_k[b], end = cu_k[b + 1];
      bad |= start < 0 || end < start || end - start > bound_k || (total_k > 0 && end > total_k);
    }
    if (bad) __trap();
  }
}

template <typename Params>
__device__ __forceinline__ void check_seqlens(const Params& p, int group = 1) {
  if (p.cu_seqlens_q == nullptr && p.cu_seqlens_k == nullptr) return;
  if (blockIdx.x != 0 || blockIdx.y != 0 || blockIdx.z != 0) return;
  check_seqlens_entries(p.cu_seqlens_q, p.cu_seqlens_k, p.batch, p.seqlen_q, p.seqlen_k,
                        p.total_q, p.total_k, group);
}
// The start of a kernel that reads a call's sequence arrays and writes its outputs (the sm90 and
// sm80 forwards, the backward's preprocess, which runs first in its pipeline): the entries
// checked against the bounds (CTA 0) and the rows outside every entry cleared (the first
// CTAs). In the __global__ function itself: inside the sm90 forward's fwd_block the d = 256
// ALiBi variants spilled 0 -> 4 / 28 bytes. No-ops without sequence arrays.
template <typename Params>
__device__ __forceinline__ void varlen_kernel_start(const Params& p) {
  check_seqlens(p);
  clear_outside_rows(p);
}
#endif  // __CUDACC__

}  // namespace flashattn_cu
