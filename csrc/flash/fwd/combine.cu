// The split-KV combine and the kvcache key counts: compiled once (both dtypes), not per head dim.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../launch.h"
#include "combine.h"
#include "combine_launch.h"

namespace flashattn_cu::forward {

Status launch_split_combine(const FwdKvcacheKernelParams& kp, cudaStream_t stream) {
  const int64_t threads = kp.kv.partial_rows * (kp.p.head_dim / 4);
  const int64_t blocks = ceil_div<int64_t>(threads, kCombineThreads);
  return kp.p.dtype == DType::kBFloat16
             ? launch_tiles<split_combine_kernel<__nv_bfloat16>>(blocks, kCombineThreads, 0,
                                                                 stream, kp)
             : launch_tiles<split_combine_kernel<__half>>(blocks, kCombineThreads, 0, stream, kp);
}

Status launch_kvcache_key_counts(const int* cache_seqlens, const int* leftpad, int seqlen_new,
                                 int capacity, int batch, int* counts, cudaStream_t stream) {
  constexpr int kThreads = 128;
  return launch_tiles<kvcache_key_counts_kernel>(ceil_div(batch, kThreads), kThreads, 0, stream,
                                                 cache_seqlens, leftpad, seqlen_new, capacity,
                                                 batch, counts);
}

}  // namespace flashattn_cu::forward
