// The head-dim instances: the one list of head dims that get their own compiled kernels. A call
// with head_dim d runs the smallest instance >= d, with the columns past d zero-filled on load
// and skipped on store. Torch-free, usable from host and device code.
//
// Everything else reads this list: setup.py and CMakeLists.txt take the #define line below
// (by regex: keep it on one line, plain integers separated by commas) to check
// FLASHATTN_CU_HEAD_DIMS and to pick the sources csrc/flash/sm*/inst/*_hdim{d}_*.cu; dispatch.cu
// instantiates the built ones; head_dim_instances() (flashattn_cu.h) hands it to C++ callers and,
// through _C.head_dim_instances(), to Python. A new instance needs its inst/ sources, and the tile
// choices of tiles.h checked for it.
#pragma once

#include <cuda_runtime.h>  // __host__ / __device__ for a plain C++ compiler

// Ascending multiples of 8; the last one is the largest head dim the kernels take.
#define FLASHATTN_CU_HEAD_DIM_INSTANCES 32, 64, 96, 128, 160, 192, 224, 256

namespace flashattn_cu {

constexpr int kHeadDimInstances[] = {FLASHATTN_CU_HEAD_DIM_INSTANCES};
constexpr int kNumHeadDimInstances =
    static_cast<int>(sizeof(kHeadDimInstances) / sizeof(kHeadDimInstances[0]));

// The instance that runs head_dim: the smallest instance >= head_dim, the largest one for a
// head_dim past it (callers reject head_dim > 256 before).
__host__ __device__ constexpr int round_head_dim(int head_dim) {
  // A local copy of the list, not kHeadDimInstances: device code may not read a host array.
  constexpr int kDims[] = {FLASHATTN_CU_HEAD_DIM_INSTANCES};
  for (int d : kDims) {
    if (head_dim <= d) return d;
  }
  return kDims[sizeof(kDims) / sizeof(kDims[0]) - 1];
}

// Whether `head_dim` is one of the instances.
constexpr bool is_head_dim_instance(int head_dim) {
  for (int d : kHeadDimInstances) {
    if (d == head_dim) return true;
  }
  return false;
}

namespace detail {
constexpr bool head_dim_instances_ok() {
  for (int i = 0; i < kNumHeadDimInstances; ++i) {
    if (kHeadDimInstances[i] <= 0 || kHeadDimInstances[i] % 8 != 0) return false;
    if (i > 0 && kHeadDimInstances[i] <= kHeadDimInstances[i - 1]) return false;
  }
  return true;
}
}  // namespace detail

static_assert(detail::head_dim_instances_ok(),
              "FLASHATTN_CU_HEAD_DIM_INSTANCES: ascending positive multiples of 8");

}  // namespace flashattn_cu
