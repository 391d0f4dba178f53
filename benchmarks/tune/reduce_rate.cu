// How fast the GPU adds fp32 blocks into an accumulator in global memory, as the sm90 backward
// adds its dQ (benchmarks/NOTES.md 12.41: at d = 256 the dQ reductions take the backward from
// ~0.5 to 1.0 of its time with red.adds and to ~0.86 with bulk reductions, 2.2 TB/s of adds at
// causal 16k). One CTA per SM (132), each walking `steps` 64 KB blocks of a 128 MB accumulator
// (2048 blocks: d 256, 16k rows, 8 heads), one block a step, in the order of a wave of the
// backward's CTAs: `same` (every CTA the same block at the same step: a non-causal walk, all key
// blocks of a head from query block 0) or `stagger` (CTA c at block c + step: a causal walk).
// Per step either four 16 KB bulk reductions from shared memory (cp.reduce.async.bulk, one
// thread, the read waited for before the next, as the kernel's next loads wait) or every
// thread's red.global.add.v2 of its 64 floats (the kernel's fragments), then `gap` clocks of
// spinning (the step's compute, which the reductions may overlap). Prints TB/s of adds.
// Build and run (device):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DFLASHATTN_CU_HAS_SM90A=1 \
//        -Icsrc/flash -Icsrc/include benchmarks/tune/reduce_rate.cu -o /tmp/reduce_rate && /tmp/reduce_rate
#include <cstdint>
#include <cstdio>

#include "harness.h"
#include "ptx/atomic.h"
#include "ptx/tma.h"
#include "ptx/wgmma.h"  // fence_proxy_async_shared

namespace fa = flashattn_cu;

constexpr int kBlockFloats = 16384;  // 64 x 256 fp32: one query block's dQ at d 256
constexpr int kBlocks = 2048;        // 16k rows x 8 heads / 64
constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads, 1)
    reduce_kernel(float* accum, int steps, bool stagger, bool bulk, long long gap) {
  extern __shared__ __align__(128) float staged[];
  const int tid = threadIdx.x;
  for (int i = tid; i < kBlockFloats; i += kThreads) staged[i] = 1.f / 1024;
  fa::ptx::fence_proxy_async_shared();
  __syncthreads();
  const uint32_t s_base = static_cast<uint32_t>(__cvta_generic_to_shared(staged));
  for (int it = 0; it < steps; ++it) {
    const int block = stagger ? (blockIdx.x + it) % kBlocks : it % kBlocks;
    float* dst = accum + static_cast<int64_t>(block) * kBlockFloats;
    if (bulk) {
      if (tid == 0) {
        fa::ptx::tma_store_wait<0>();  // the last step's reductions have read the staging
        for (int q = 0; q < 4; ++q) {
          fa::ptx::bulk_reduce_add_f32(dst + q * (kBlockFloats / 4), s_base + q * 16384, 16384);
        }
        fa::ptx::tma_store_commit();
      }
    } else {
      // Thread tid's 64 floats as 32 pairs, a warp's pairs of one instruction 8 rows of 32 bytes
      // (the wgmma fragment's pattern: rows g, columns 2t of an 8-column tile).
      const int warp = tid / 32, lane = tid % 32;
      float* row = dst + ((warp % 4) * 16 + lane / 4) * 256 + (warp / 4) * 128 + 2 * (lane % 4);
      for (int hr = 0; hr < 2; ++hr)
        for (int nt = 0; nt < 16; ++nt) {
          fa::ptx::red_add_v2_f32(row + hr * 8 * 256 + nt * 8, 1.f / 1024, 1.f / 1024);
        }
    }
    const long long t0 = clock64();
    while (clock64() - t0 < gap) {
    }
    __syncthreads();
  }
  if (bulk && tid == 0) fa::ptx::bulk_wait_all<0>();
}

int main() {
  float* accum = nullptr;
  const size_t bytes = static_cast<size_t>(kBlocks) * kBlockFloats * 4;
  CHECK(cudaMalloc(&accum, bytes));
  CHECK(cudaMemset(accum, 0, bytes));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // 200 KB of shared memory a CTA: one CTA per SM, as the backward.
  const int smem = 200 * 1024;
  CHECK(cudaFuncSetAttribute(reduce_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int steps = 256;
  for (const bool bulk : {true, false}) {
    for (const bool stagger : {false, true}) {
      for (const long long gap : {0LL, 2000LL, 4000LL, 7000LL}) {
        const float ms = median_ms(
            [&] { reduce_kernel<<<sms, kThreads, smem>>>(accum, steps, stagger, bulk, gap); }, 10);
        CHECK(cudaGetLastError());
        const double tb = static_cast<double>(sms) * steps * kBlockFloats * 4 / (ms * 1e-3) / 1e12;
        std::printf("%-9s %-7s gap %5lld clocks: %8.3f ms, %.2f TB/s of adds, %.0f ns a step\n",
                    bulk ? "bulk" : "red.v2", stagger ? "stagger" : "same", gap, ms, tb,
                    ms * 1e6 / steps);
        std::fflush(stdout);
      }
    }
  }
  CHECK(cudaFree(accum));
  return 0;
}
