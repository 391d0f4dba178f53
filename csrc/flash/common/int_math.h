// Integer helpers for host and device code alike (also compiled by a plain C++ compiler through
// problem/mask.h in tests/cpp/api_checks.cpp, so no CUDA builtins here).
#pragma once

#include <cstdint>

namespace flashattn_cu {

template <typename T>
__host__ __device__ constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

__host__ __device__ constexpr int imin(int a, int b) { return a < b ? a : b; }
__host__ __device__ constexpr int imax(int a, int b) { return a > b ? a : b; }
__host__ __device__ constexpr int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }

}  // namespace flashattn_cu
