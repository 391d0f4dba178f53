// How fast the GPU adds fp32 blocks into an accumulator in global memory, as the sm90 backward
// adds its dQ (benchmarks/NOTES.md 12.41: at d = 256 the dQ reductions take the backward from
// ~0.5 to 1.0 of its time with red.adds and to ~0.86 with bulk reductions, 2.2 TB/s of adds at
// causal 16k). One CTA per SM (132), each walking `steps` 64 KB blocks of a 128 MB accumulator
// (2048 blocks: d 256, 16k rows, 8 heads), one block a step, in the order of a wave of the
// backward's CTAs: `same` (every CTA the same block at the same step: a non-causal walk, all key
// blocks of a head from query block 0) or `stagger` (CTA c at block c + step: a causal walk).
// Per step, after `gap` clocks of spinning (the step's compute, which the reductions overlap):
//   bulk:   every thread writes its 64 floats of the staged block (as the kernel stages dQ), one
//           thread issues four 16 KB bulk reductions (cp.reduce.async.bulk) once the last step's
//           have read the staging;
//   red.v2: every thread's red.global.add.v2 of its 64 floats (the fragments' pattern);
//   pair:   clusters of two CTAs (a pair of adjacent key blocks) on the same block: each stages
//           its block, a cluster barrier, each adds the partner's half of it (distributed shared
//           memory, 32 KB) into its own and reduces that half alone (two 16 KB reductions: half
//           the L2 adds), a second cluster barrier before the staging is rewritten
//           (NOTES 12.42 item 2's design).
// Prints TB/s of dQ delivered (64 KB a CTA a step in every mode) and the time a step.
// Build and run (device):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DFLASHATTN_CU_HAS_SM90A=1 \
//        -Icsrc/flash -Icsrc/include benchmarks/tune/reduce_rate.cu -o /tmp/reduce_rate &&
//   /tmp/reduce_rate
#include <cstdint>
#include <cstdio>

#include "harness.h"
#include "ptx/atomic.h"
#include "ptx/cluster.h"
#include "ptx/tma.h"
#include "ptx/wgmma.h"  // fence_proxy_async_shared

namespace fa = flashattn_cu;

constexpr int kBlockFloats = 16384;  // 64 x 256 fp32: one query block's dQ at d 256
constexpr int kBlocks = 2048;        // 16k rows x 8 heads / 64
constexpr int kThreads = 256;

enum Mode { kBulk, kRedV2, kPair };

__global__ void __launch_bounds__(kThreads, 1)
    reduce_kernel(float* accum, int steps, bool stagger, int mode, long long gap) {
  extern __shared__ __align__(128) float staged[];
  const int tid = threadIdx.x;
  const uint32_t s_base = static_cast<uint32_t>(__cvta_generic_to_shared(staged));
  // pair: this CTA's rank, the half of the block it reduces, and the partner's staging.
  const uint32_t rank = mode == kPair ? fa::ptx::cluster_ctarank() : 0;
  const uint32_t partner = mode == kPair ? fa::ptx::map_shared_cluster(s_base, rank ^ 1) : 0;
  const int walker = mode == kPair ? blockIdx.x / 2 : blockIdx.x;
  for (int it = 0; it < steps; ++it) {
    const long long t0 = clock64();
    while (clock64() - t0 < gap) {
    }
    const int block = stagger ? (walker + it) % kBlocks : it % kBlocks;
    float* dst = accum + static_cast<int64_t>(block) * kBlockFloats;
    if (mode == kRedV2) {
      // Thread tid's 64 floats as 32 pairs, a warp's pairs of one instruction 8 rows of 32
      // bytes (the wgmma fragment's pattern: rows g, columns 2t of an 8-column tile).
      const int warp = tid / 32, lane = tid % 32;
      float* row = dst + ((warp % 4) * 16 + lane / 4) * 256 + (warp / 4) * 128 + 2 * (lane % 4);
      for (int hr = 0; hr < 2; ++hr)
        for (int nt = 0; nt < 16; ++nt) {
          fa::ptx::red_add_v2_f32(row + hr * 8 * 256 + nt * 8, 1.f / 1024, 1.f / 1024);
        }
      __syncthreads();
      continue;
    }
    if (tid == 0) fa::ptx::tma_store_wait<0>();  // the last step's reductions read the staging
    __syncthreads();
    // The staging: warp w's 8 KB run, lane l's pairs 256 bytes apart (conflict-free).
    float* run = staged + (tid / 32) * 2048 + (tid % 32) * 2;
    for (int j = 0; j < 32; ++j) {
      *reinterpret_cast<float2*>(run + j * 64) = make_float2(1.f / 1024, 1.f / 1024);
    }
    if (mode == kPair) {
      fa::ptx::cluster_sync();  // both CTAs staged
      // This thread's 32 floats of half `rank`: the partner's added into this CTA's.
      const int f0 = static_cast<int>(rank) * (kBlockFloats / 2) + tid * 32;
      for (int j = 0; j < 8; ++j) {
        const float4 o = fa::ptx::ld_shared_cluster_v4(partner + (f0 + 4 * j) * 4);
        float4* mine = reinterpret_cast<float4*>(staged + f0 + 4 * j);
        const float4 m = *mine;
        *mine = make_float4(m.x + o.x, m.y + o.y, m.z + o.z, m.w + o.w);
      }
      fa::ptx::cluster_sync();  // the partner has read this CTA's staging
    }
    fa::ptx::fence_proxy_async_shared();
    __syncthreads();
    if (tid == 0) {
      // pair: quarters 2 rank, 2 rank + 1 (this CTA's half); otherwise all four.
      const int q0 = mode == kPair ? 2 * static_cast<int>(rank) : 0;
      const int q1 = mode == kPair ? q0 + 2 : 4;
      for (int q = q0; q < q1; ++q) {
        fa::ptx::bulk_reduce_add_f32(dst + q * (kBlockFloats / 4), s_base + q * 16384, 16384);
      }
      fa::ptx::tma_store_commit();
    }
  }
  if (mode != kRedV2 && tid == 0) fa::ptx::bulk_wait_all<0>();
  if (mode == kPair) {  // no CTA leaves while its partner may read its shared memory
    fa::ptx::cluster_sync();
  }
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
  const int grid = sms - sms % 2;  // whole pairs
  const char* names[] = {"bulk", "red.v2", "pair"};
  for (const int mode : {kBulk, kRedV2, kPair}) {
    for (const bool stagger : {false, true}) {
      for (const long long gap : {0LL, 2000LL, 4000LL, 7000LL}) {
        const auto launch = [&] {
          cudaLaunchConfig_t cfg = {};
          cfg.gridDim = dim3(grid);
          cfg.blockDim = dim3(kThreads);
          cfg.dynamicSmemBytes = smem;
          cudaLaunchAttribute attr[1];
          attr[0].id = cudaLaunchAttributeClusterDimension;
          attr[0].val.clusterDim.x = mode == kPair ? 2 : 1;
          attr[0].val.clusterDim.y = 1;
          attr[0].val.clusterDim.z = 1;
          cfg.attrs = attr;
          cfg.numAttrs = 1;
          CHECK(cudaLaunchKernelEx(&cfg, reduce_kernel, accum, steps, stagger, mode, gap));
        };
        const float ms = median_ms(launch, 10);
        const double tb = static_cast<double>(grid) * steps * kBlockFloats * 4 / (ms * 1e-3) / 1e12;
        std::printf("%-7s %-7s gap %5lld clocks: %8.3f ms, %.2f TB/s of dQ, %.0f ns a step\n",
                    names[mode], stagger ? "stagger" : "same", gap, ms, tb, ms * 1e6 / steps);
        std::fflush(stdout);
      }
    }
  }
  CHECK(cudaFree(accum));
  return 0;
}
