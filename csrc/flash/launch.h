// Host-side launch helper shared by every arch path. Each kernel is launched through
// cudaLaunchKernelEx, whose return value is the error of this launch alone: the thread's
// last-error state, which may hold an unrelated error of another library, is not read.
//
// Nor is it cleared: cudaFuncSetAttribute resets that state to cudaSuccess even when it succeeds
// (measured on the H200, CUDA 13.0 runtime; a launch, cudaGetDevice and cudaDeviceGetAttribute
// leave it), so the shared-memory limit of each kernel is raised once per device and not on
// every call. The first call on a device can still clear a pending foreign error that way.
#pragma once

#include <atomic>
#include <climits>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "flashattn_cu/flashattn_cu.h"

namespace flashattn_cu {

// Maps the result of one of our own CUDA calls to a Status; a failure is recorded for
// last_cuda_error() and taken off the thread's last-error state (it is ours). dispatch.cu.
Status cuda_status(cudaError_t err);

// How a launch is ordered after the previous work in its stream: whole (the default), or
// programmatically (PDL, sm_90 and later: the kernel's CTAs may be scheduled before the previous
// kernel has finished, and the kernel waits for it in ptx::grid_dependency_wait before touching
// global memory; the previous kernel may let it in early with ptx::launch_dependents).
enum class StreamOrder { kWhole, kProgrammatic };

// Launches Kernel<<<grid, block, smem_bytes, stream>>>(args...) in clusters of `cluster` CTAs
// along x (1: no cluster attribute), first raising the kernel's dynamic shared-memory limit on
// the current device when it needs more than the default 48 KB and has not been raised that far
// there yet.
template <auto Kernel, typename... Args>
Status launch_kernel_clustered(StreamOrder order, int cluster, dim3 grid, dim3 block,
                               int smem_bytes, cudaStream_t stream, const Args&... args) {
  if (smem_bytes > 48 * 1024) {
    constexpr int kMaxDevices = 64;
    static std::atomic<int> raised_to[kMaxDevices];  // per device, zero-initialised
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return cuda_status(err);
    if (device >= kMaxDevices || raised_to[device].load(std::memory_order_relaxed) < smem_bytes) {
      err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
      if (err != cudaSuccess) return cuda_status(err);
      if (device < kMaxDevices) raised_to[device].store(smem_bytes, std::memory_order_relaxed);
    }
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  config.stream = stream;
  cudaLaunchAttribute attributes[2] = {};
  config.attrs = attributes;
  if (order == StreamOrder::kProgrammatic) {
    cudaLaunchAttribute& a = attributes[config.numAttrs++];
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    cudaLaunchAttribute& a = attributes[config.numAttrs++];
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = static_cast<unsigned>(cluster);
    a.val.clusterDim.y = 1;
    a.val.clusterDim.z = 1;
  }
  return cuda_status(cudaLaunchKernelEx(&config, Kernel, args...));
}

template <auto Kernel, typename... Args>
Status launch_kernel_ordered(StreamOrder order, dim3 grid, dim3 block, int smem_bytes,
                             cudaStream_t stream, const Args&... args) {
  return launch_kernel_clustered<Kernel>(order, 1, grid, block, smem_bytes, stream, args...);
}

template <auto Kernel, typename... Args>
Status launch_kernel(dim3 grid, dim3 block, int smem_bytes, cudaStream_t stream,
                     const Args&... args) {
  return launch_kernel_ordered<Kernel>(StreamOrder::kWhole, grid, block, smem_bytes, stream,
                                       args...);
}

// fn(std::integral_constant<int, V>{}) for the kernel variant `variant` (problem/mask.h:
// static, dynamic, ALiBi, softcap, both, dropout): the one place a runtime variant becomes a
// template argument.
template <typename Fn>
Status with_variant(int variant, const Fn& fn) {
  switch (variant) {
    case 5: return fn(std::integral_constant<int, 5>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 1: return fn(std::integral_constant<int, 1>{});
    default: return fn(std::integral_constant<int, 0>{});
  }
}

// launch_kernel over a flat 1-D grid of `blocks` tiles (problem/scheduler.h counts them; one grid
// dimension, so batch x heads is never capped at 65535): nothing to launch for 0, kInvalidArgument
// past the 2^31 - 1 blocks a grid dimension holds.
template <auto Kernel, typename... Args>
Status launch_tiles_ordered(StreamOrder order, int64_t blocks, int threads, int smem_bytes,
                            cudaStream_t stream, const Args&... args) {
  if (blocks == 0) return Status::kSuccess;
  if (blocks > INT_MAX) return Status::kInvalidArgument;
  return launch_kernel_ordered<Kernel>(order, dim3(static_cast<unsigned>(blocks)), dim3(threads),
                                       smem_bytes, stream, args...);
}

template <auto Kernel, typename... Args>
Status launch_tiles(int64_t blocks, int threads, int smem_bytes, cudaStream_t stream,
                    const Args&... args) {
  return launch_tiles_ordered<Kernel>(StreamOrder::kWhole, blocks, threads, smem_bytes, stream,
                                      args...);
}

}  // namespace flashattn_cu
