// Host-side launch helper shared by every arch path. Each kernel is launched through
// cudaLaunchKernelEx, whose return value is the error of this launch alone: the thread's
// last-error state, which may hold an unrelated error of another library, is neither read nor
// cleared on success (a `kernel<<<...>>>` launch can only be checked through that state).
#pragma once

#include <cuda_runtime.h>

#include "flashattn_cu/flashattn_cu.h"

namespace flashattn_cu {

// Maps the result of one of our own CUDA calls to a Status; a failure is recorded for
// last_cuda_error() and taken off the thread's last-error state (it is ours). dispatch.cu.
Status cuda_status(cudaError_t err);

// Launches kernel<<<grid, block, smem_bytes, stream>>>(args...), first raising the kernel's
// dynamic shared-memory limit when it needs more than the default 48 KB.
template <typename... KernelArgs, typename... Args>
Status launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, int smem_bytes,
                     cudaStream_t stream, const Args&... args) {
  if (smem_bytes > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (err != cudaSuccess) return cuda_status(err);
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  config.stream = stream;
  return cuda_status(cudaLaunchKernelEx(&config, kernel, args...));
}

}  // namespace flashattn_cu
