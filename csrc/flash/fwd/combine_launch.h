// Host entry points of csrc/flash/fwd/combine.cu (the split-KV combine and the kvcache key
// counts), for dispatch.cu, which sees no kernel.
#pragma once

#include <cuda_runtime.h>

#include "flashattn_cu/flashattn_cu.h"

#include "../problem/params.h"

namespace flashattn_cu::forward {

// Merges kp.kv.num_splits partials into kp.p.o and kp.p.lse (fwd/combine.h). `programmatic`:
// launched with programmatic stream serialization (launch.h StreamOrder; sm_90, after a kernel
// that calls ptx::launch_dependents: the sm90 decode kernel).
Status launch_split_combine(const FwdKvcacheKernelParams& kp, cudaStream_t stream,
                            bool programmatic = false);

// counts[b] = the keys entry b attends to, from cache_seqlens, cache_leftpad (may be null) and
// the rows appended (fwd/combine.h: kvcache_key_counts_kernel). `programmatic`, here and for the
// append: launched with programmatic stream serialization (sm_90, the decode path's chain).
Status launch_kvcache_key_counts(const int* cache_seqlens, const int* leftpad, int seqlen_new,
                                 int capacity, int batch, int* counts, cudaStream_t stream,
                                 bool programmatic = false);

// Writes the call's k_new / v_new rows to the cache (k rotated) and, with q_out, q rotated to
// q_out with the given strides (fwd/append.h); kp as the kvcache kernels take it (packed).
Status launch_kvcache_append(const FwdKvcacheKernelParams& kp, void* q_out,
                             int64_t q_batch_stride, int64_t q_row_stride, int64_t q_head_stride,
                             cudaStream_t stream, bool programmatic = false);

// A varlen call's rows outside every entry (problem/seqlen.h) by their own kernel: a forward's
// o / lse / row statistics, for the kvcache kernels' varlen mode (paged prefill: its packed
// parameters do not describe the unpacked o that the first CTAs of the other forward kernels
// clear) and the calls that launch no kernel; a backward's dq / dk / dv where no preprocess runs.
// No-ops (no launch) without cu_seqlens_q or rows.
Status clear_outside_rows_of(const FwdParams& p, cudaStream_t stream);
Status clear_outside_rows_of(const BwdParams& p, cudaStream_t stream);

}  // namespace flashattn_cu::forward
