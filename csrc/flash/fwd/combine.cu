// The split-KV combine, the kvcache key counts, the standalone append + rotary (ahead of the
// sm90 decode kernel) and the paged prefill's rows outside its entries: compiled once (both
// dtypes), not per head dim.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../launch.h"
#include "../problem/seqlen.h"
#include "append.h"
#include "combine.h"
#include "combine_launch.h"

namespace flashattn_cu::forward {

Status launch_split_combine(const FwdKvcacheKernelParams& kp, cudaStream_t stream,
                            bool programmatic) {
  const int64_t threads = kp.kv.partial_rows * (kp.p.head_dim / 4);
  const int64_t blocks = ceil_div<int64_t>(threads, kCombineThreads);
  const StreamOrder order = programmatic ? StreamOrder::kProgrammatic : StreamOrder::kWhole;
  return kp.p.dtype == DType::kBFloat16
             ? launch_tiles_ordered<split_combine_kernel<__nv_bfloat16>>(
                   order, blocks, kCombineThreads, 0, stream, kp)
             : launch_tiles_ordered<split_combine_kernel<__half>>(order, blocks, kCombineThreads,
                                                                  0, stream, kp);
}

Status launch_kvcache_key_counts(const int* cache_seqlens, const int* leftpad, int seqlen_new,
                                 int capacity, int batch, int* counts, cudaStream_t stream,
                                 bool programmatic) {
  constexpr int kThreads = 128;
  const StreamOrder order = programmatic ? StreamOrder::kProgrammatic : StreamOrder::kWhole;
  return launch_tiles_ordered<kvcache_key_counts_kernel>(order, ceil_div(batch, kThreads),
                                                         kThreads, 0, stream, cache_seqlens,
                                                         leftpad, seqlen_new, capacity, batch,
                                                         counts);
}

Status launch_kvcache_append(const FwdKvcacheKernelParams& kp, void* q_out,
                             int64_t q_batch_stride, int64_t q_row_stride, int64_t q_head_stride,
                             cudaStream_t stream, bool programmatic) {
  const RotatedQ rq{q_out, q_batch_stride, q_row_stride, q_head_stride};
  const int64_t blocks = static_cast<int64_t>(kp.p.batch) * kp.p.num_heads;
  const StreamOrder order = programmatic ? StreamOrder::kProgrammatic : StreamOrder::kWhole;
  return kp.p.dtype == DType::kBFloat16
             ? launch_tiles_ordered<kvcache_append_kernel<__nv_bfloat16>>(
                   order, blocks, kAppendThreads, 0, stream, kp, rq)
             : launch_tiles_ordered<kvcache_append_kernel<__half>>(order, blocks, kAppendThreads,
                                                                   0, stream, kp, rq);
}

template <typename Params>
__global__ void __launch_bounds__(256) clear_outside_rows_kernel(const __grid_constant__ Params p) {
  clear_outside_rows(p);
}

Status clear_outside_rows_of(const FwdParams& p, cudaStream_t stream) {
  if (p.cu_seqlens_q == nullptr || p.total_q <= 0 || p.batch < 0) return Status::kSuccess;
  return launch_tiles_ordered<clear_outside_rows_kernel<FwdParams>>(
      StreamOrder::kWhole, kClearOutsideCtas, 256, 0, stream, p);
}

Status clear_outside_rows_of(const BwdParams& p, cudaStream_t stream) {
  if (p.cu_seqlens_q == nullptr || p.batch < 0 || (p.total_q <= 0 && p.total_k <= 0)) {
    return Status::kSuccess;
  }
  return launch_tiles_ordered<clear_outside_rows_kernel<BwdParams>>(
      StreamOrder::kWhole, kClearOutsideCtas, 256, 0, stream, p);
}

}  // namespace flashattn_cu::forward
