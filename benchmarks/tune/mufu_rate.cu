// Throughput of the special-function unit (MUFU) per instruction on this GPU, in results per
// clock per SM: each thread runs 8 independent dependency chains of one instruction; cycles from
// clock64 around the loop (per block, median over blocks). Decides whether softcap's tanh costs
// what an exp2 costs (benchmarks/NOTES.md). Build and run (device):
//   nvcc -O3 -arch=sm_90a benchmarks/tune/mufu_rate.cu -o /tmp/mufu_rate && /tmp/mufu_rate
#include <algorithm>
#include <cstdio>
#include <vector>

#define OP_F32(name, inst)                                                        \
  struct name {                                                                   \
    static const char* label() { return inst; }                                   \
    __device__ static float apply(float x) {                                      \
      float y;                                                                    \
      asm volatile(inst " %0, %1;" : "=f"(y) : "f"(x));                           \
      return y;                                                                   \
    }                                                                             \
  };
OP_F32(Tanh, "tanh.approx.f32")
OP_F32(Ex2, "ex2.approx.ftz.f32")
struct Fma {
  static const char* label() { return "fma.rn.f32 (reference: FMA pipe)"; }
  __device__ static float apply(float x) { return fmaf(x, 0.999f, 0.0001f); }
};
// One tanh and one exp2 per element, as softcap's softmax does.
struct TanhEx2 {
  static const char* label() { return "tanh.approx.f32 + ex2.approx.f32 (per result pair)"; }
  __device__ static float apply(float x) {
    float y;
    asm volatile("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(y));
    return y;
  }
};

template <typename Op>
__global__ void chains(float* out, long long* cycles, int iters) {
  float v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = 0.001f * (threadIdx.x + j);
  __syncthreads();
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = Op::apply(v[j]);
  }
  __syncthreads();
  const long long t1 = clock64();
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += v[j];
  if (s == 12345.f) out[0] = s;  // keeps the chains live
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <typename Op>
void run(int sms) {
  const int threads = 1024, iters = 4096;
  float* out;
  long long* cyc;
  cudaMalloc(&out, 4);
  cudaMalloc(&cyc, sms * 8);
  chains<Op><<<sms, threads>>>(out, cyc, 16);
  chains<Op><<<sms, threads>>>(out, cyc, iters);
  std::vector<long long> h(sms);
  cudaMemcpy(h.data(), cyc, sms * 8, cudaMemcpyDeviceToHost);
  std::sort(h.begin(), h.end());
  const double per_clk = double(threads) * iters * 8 / double(h[sms / 2]);
  std::printf("%-52s %7.2f results / clock / SM\n", Op::label(), per_clk);
  cudaFree(out);
  cudaFree(cyc);
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  run<Fma>(sms);
  run<Ex2>(sms);
  run<Tanh>(sms);
  run<TanhEx2>(sms);
  return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
