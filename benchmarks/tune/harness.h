// What the torch-free tuning harnesses (tune_fwd.cu, tune_fwd90.cu, tune_decode90.cu) share: a
// CUDA-call check that exits with the error, reproducible bf16 inputs uniform in [-1, 1) (never
// zeros: zeros run faster than real data and hide unwritten outputs), the largest difference of
// two outputs, and the timer.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define CHECK(x)                                                                          \
  do {                                                                                    \
    cudaError_t e = (x);                                                                  \
    if (e != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

__global__ inline void fill_random(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    x[i] = __float2bfloat16((h & 0xffff) / 32768.f - 1.f);
  }
}

__global__ inline void max_abs_diff(const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n,
                                    float* out) {
  float m = 0.f;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float d = fabsf(__bfloat162float(a[i]) - __bfloat162float(b[i]));
    m = d != d ? INFINITY : fmaxf(m, d);  // NaN counts as infinitely wrong
  }
  atomicMax(reinterpret_cast<int*>(out), __float_as_int(m));  // non-negative floats order as ints
}

// max |a - b| over n bf16 elements on the device (NaN: infinity); scratch: one device float.
inline float max_diff(const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n, float* scratch) {
  CHECK(cudaMemset(scratch, 0, 4));
  max_abs_diff<<<264, 256>>>(a, b, n, scratch);
  float d = 0.f;
  CHECK(cudaMemcpy(&d, scratch, 4, cudaMemcpyDeviceToHost));
  return d;
}

// Median ms of `reps` calls of fn, each between two CUDA events on the default stream, after 3
// untimed ones; with flush_bytes, a memset of that many bytes before each call, outside the
// events, so a working set the L2 could hold is read from memory as a real call would (the
// decode sweep's 4k-key caches: 50 MB of L2 on the H200).
// The flush buffer, one for every median_ms instantiation, grown to the largest size asked for.
inline void* flush_buffer(size_t bytes) {
  static void* buffer = nullptr;
  static size_t size = 0;
  if (bytes > size) {
    if (buffer != nullptr) CHECK(cudaFree(buffer));
    CHECK(cudaMalloc(&buffer, bytes));
    size = bytes;
  }
  return buffer;
}

// How the L2 is emptied before a timed call (flush_l2): by a memset of the flush buffer (the
// default, as triton's do_bench, whose zero_() leaves the L2 full of dirty lines that the timed
// kernel's first reads write back to memory), or, with g_flush_by_read, by reading it (clean
// lines, as after a kernel that only read, e.g. a GEMM's weights).
inline bool g_flush_by_read = false;

__global__ inline void read_flush_kernel(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads; practically never stores
}

inline void flush_l2(void* buffer, size_t bytes, int rep) {
  if (g_flush_by_read) {
    read_flush_kernel<<<1056, 256>>>(static_cast<const uint4*>(buffer), bytes / 16,
                                     static_cast<unsigned*>(buffer));
    CHECK(cudaGetLastError());
  } else {
    CHECK(cudaMemsetAsync(buffer, rep & 0xff, bytes));
  }
}

// The median of a non-empty sample (the upper one of an even count); sorts it.
inline float median_of(std::vector<float>& v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One call of fn between events a and b (the default stream), in ms; waits for it.
template <typename Fn>
float call_ms(cudaEvent_t a, cudaEvent_t b, const Fn& fn) {
  CHECK(cudaEventRecord(a));
  fn();
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms = 0.f;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

template <typename Fn>
float median_ms(const Fn& fn, int reps, size_t flush_bytes = 0) {
  void* const flush = flush_bytes > 0 ? flush_buffer(flush_bytes) : nullptr;
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < reps + 3; ++i) {
    if (flush_bytes > 0) flush_l2(flush, flush_bytes, i);
    const float ms = call_ms(a, b, fn);
    if (i >= 3) t.push_back(ms);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return median_of(t);
}

// An A/B of two launches, interleaved so that clock and thermal drift fall on both alike.
// Gives each one's median time per call and the median over the rounds of B's time / A's.
struct AbTimes {
  float a_ms, b_ms, b_over_a;
};
// The rounds of an A/B: round(i) gives round i's (A, B) times per call; two warm-up rounds.
template <typename Round>
AbTimes ab_rounds(int rounds, const Round& round) {
  std::vector<float> ta, tb, r;
  for (int i = 0; i < rounds + 2; ++i) {
    const std::pair<float, float> t = round(i);
    if (i >= 2) {
      ta.push_back(t.first);
      tb.push_back(t.second);
      r.push_back(t.second / t.first);
    }
  }
  return AbTimes{median_of(ta), median_of(tb), median_of(r)};
}

// Back to back: each round times `inner` calls of A in a row, then of B (B first on odd rounds),
// between events.
template <typename FnA, typename FnB>
AbTimes ab_ms(const FnA& fa, const FnB& fb, int rounds, int inner) {
  cudaEvent_t e0, e1, e2;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaEventCreate(&e2));
  const AbTimes t = ab_rounds(rounds, [&](int i) {
    const bool b_first = i % 2 == 1;
    CHECK(cudaEventRecord(e0));
    for (int k = 0; k < inner; ++k) b_first ? fb() : fa();
    CHECK(cudaEventRecord(e1));
    for (int k = 0; k < inner; ++k) b_first ? fa() : fb();
    CHECK(cudaEventRecord(e2));
    CHECK(cudaEventSynchronize(e2));
    float first = 0.f, second = 0.f;
    CHECK(cudaEventElapsedTime(&first, e0, e1));
    CHECK(cudaEventElapsedTime(&second, e1, e2));
    return b_first ? std::make_pair(second / inner, first / inner)
                   : std::make_pair(first / inner, second / inner);
  });
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  CHECK(cudaEventDestroy(e2));
  return t;
}

// As the bench times a call (benchmarks/bench.py: triton's do_bench empties the L2 before each
// call): each round times one call of A and one of B (B first on odd rounds), each between its
// own events after flush_l2 of flush_bytes outside them, so neither starts on the other's K / V
// in the L2 or under its tail. Session 55: the back-to-back A/B had d 256 causal 1k 1.6-5.6%
// faster on the persistent grid, the bench 7% slower (benchmarks/NOTES.md 12.67).
template <typename FnA, typename FnB>
AbTimes ab_ms_flushed(const FnA& fa, const FnB& fb, int rounds, size_t flush_bytes) {
  void* const flush = flush_buffer(flush_bytes);
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  auto timed = [&](auto&& fn, int rep) {
    flush_l2(flush, flush_bytes, rep);
    return call_ms(e0, e1, fn);
  };
  const AbTimes t = ab_rounds(rounds, [&](int i) {
    if (i % 2 == 1) {
      const float b = timed(fb, 2 * i);
      return std::make_pair(timed(fa, 2 * i + 1), b);
    }
    const float a = timed(fa, 2 * i);
    return std::make_pair(a, timed(fb, 2 * i + 1));
  });
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return t;
}
