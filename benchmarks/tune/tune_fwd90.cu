// Configuration sweep for the sm90a forward kernel (sm90/fwd_kernel.h), torch-free: times
// several (kBlockM, kBlockN, stages, ping-pong) instances on flash_attn's benchmark shapes (bf16,
// 16k tokens, hidden 2048) with CUDA events (median of 20) and prints TFLOP/s, each instance's
// output first checked against the sm80 kernel's on the same inputs. Build and run (device):
//   nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -DFLASHATTN_CU_HAS_SM90A=1 \
//        -gencode arch=compute_90a,code=sm_90a -Icsrc/include -Icsrc/flash \
//        benchmarks/tune/tune_fwd90.cu csrc/flash/tma_host.cu -o /tmp/tune_fwd90 && /tmp/tune_fwd90
#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "sm80/fwd_kernel.h"
#include "sm90/fwd_launch.h"
#include "harness.h"

namespace fa = flashattn_cu;

namespace flashattn_cu {
Status cuda_status(cudaError_t err) {
  return err == cudaSuccess ? Status::kSuccess : Status::kLaunchFailed;
}
}  // namespace flashattn_cu

__global__ void max_abs_diff(const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n,
                             float* out) {
  float m = 0.f;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float d = fabsf(__bfloat162float(a[i]) - __bfloat162float(b[i]));
    m = d != d ? INFINITY : fmaxf(m, d);  // NaN counts as infinitely wrong
  }
  atomicMax(reinterpret_cast<int*>(out), __float_as_int(m));  // non-negative floats order as ints
}

template <typename Fn>
float median_ms(const Fn& fn, int reps) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < reps + 3; ++i) {
    CHECK(cudaEventRecord(a));
    fn();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0.f;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 3) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int g_sms = 132;  // the device's, set in main
int g_l2 = 50 << 20;
bool g_causal_persistent = true;  // fwd_schedule's causal choice (run_fwd: causal_persistent), swept in main

// The static-variant instance of one sm90 configuration (no other variant is compiled here),
// launched as the library launches it, with the causal schedule of this sweep pass.
template <typename Traits>
fa::Status run_sm90(const fa::FwdParams& p) {
  return fa::sm90::launch_fwd_config<__nv_bfloat16, Traits, fa::kStaticVariant>(
      p, g_sms, g_l2, g_causal_persistent, 0);
}

template <int kHeadDim>
fa::Status run_sm80(const fa::FwdParams& p) {
  constexpr fa::FwdTile t = fa::fwd_tile_sm80(kHeadDim, false);
  using Traits = fa::sm80::FwdTraits<kHeadDim, t.block_m, t.block_n, t.warps, t.unpredicated_bulk_loads>;
  const fa::FwdKernelParams kp = fa::make_fwd_kernel_params(p);
  return fa::launch_tiles<fa::sm80::fwd_kernel<__nv_bfloat16, Traits, fa::kStaticVariant>>(
      fa::query_tile_count(fa::ceil_div(p.seqlen_q, Traits::kBlockM), p.batch, p.num_heads),
      Traits::kNThreads, Traits::kSmemBytes, 0, kp);
}

struct Buffers {
  __nv_bfloat16 *q, *k, *v, *o, *o_ref;
  float *lse, *diff;
};

fa::FwdParams make_params(const Buffers& b, int d, int seqlen, bool causal) {
  fa::FwdParams p;
  p.batch = 16384 / seqlen;
  p.num_heads = p.num_heads_k = 2048 / d;
  p.seqlen_q = p.seqlen_k = seqlen;
  p.head_dim = d;
  p.q = b.q;
  p.k = b.k;
  p.v = b.v;
  p.o = b.o;
  p.lse = b.lse;
  const int64_t row = static_cast<int64_t>(p.num_heads) * d;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = row;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = row * seqlen;
  p.softmax_scale = 1.f / std::sqrt(static_cast<float>(d));
  p.is_causal = causal;
  p.dtype = fa::DType::kBFloat16;
  return p;
}

template <int kHeadDim, typename Traits>
void sweep(const char* name, const Buffers& b, bool with_non_causal) {
  const size_t n = 16384ull * 2048;
  for (int causal = with_non_causal ? 0 : 1; causal < 2; ++causal) {
    for (int seqlen : {1024, 4096, 8192, 16384}) {
      fa::FwdParams p = make_params(b, kHeadDim, seqlen, causal);
      p.o = b.o_ref;
      if (run_sm80<kHeadDim>(p) != fa::Status::kSuccess) std::printf("sm80 launch failed\n");
      p.o = b.o;
      CHECK(cudaMemset(b.o, 0xff, n * 2));  // NaN poison
      const fa::Status st = run_sm90<Traits>(p);
      CHECK(cudaDeviceSynchronize());
      if (st != fa::Status::kSuccess) {
        std::printf("%-26s d=%3d s=%5d c=%d: launch failed (%d)\n", name, kHeadDim, seqlen, causal,
                    static_cast<int>(st));
        continue;
      }
      CHECK(cudaMemset(b.diff, 0, 4));
      max_abs_diff<<<264, 256>>>(b.o, b.o_ref, n, b.diff);
      float diff = 0.f;
      CHECK(cudaMemcpy(&diff, b.diff, 4, cudaMemcpyDeviceToHost));
      const float ms = median_ms([&] { run_sm90<Traits>(p); }, 20);
      const float ms80 = median_ms([&] { run_sm80<kHeadDim>(p); }, 10);
      const double flops = 4.0 * p.batch * p.num_heads * double(seqlen) * seqlen * kHeadDim /
                           (causal ? 2 : 1);
      std::printf("%-26s d=%3d s=%5d c=%d: %6.1f TFLOP/s (sm80 %6.1f)  max|diff| %.2e%s\n", name,
                  kHeadDim, seqlen, causal, flops / ms * 1e-9, flops / ms80 * 1e-9, diff,
                  diff < 2e-2 ? "" : "  WRONG");
      std::fflush(stdout);
    }
  }
}

int main(int argc, char** argv) {
  const char* only = argc > 1 ? argv[1] : "";
  const size_t n = 16384ull * 2048;
  Buffers b;
  CHECK(cudaMalloc(&b.q, n * 2));
  CHECK(cudaMalloc(&b.k, n * 2));
  CHECK(cudaMalloc(&b.v, n * 2));
  CHECK(cudaMalloc(&b.o, n * 2));
  CHECK(cudaMalloc(&b.o_ref, n * 2));
  CHECK(cudaMalloc(&b.lse, 16384ull * 64 * 4));
  CHECK(cudaMalloc(&b.diff, 4));
  fill_random<<<1024, 256>>>(b.q, n, 1);
  fill_random<<<1024, 256>>>(b.k, n, 2);
  fill_random<<<1024, 256>>>(b.v, n, 3);
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaDeviceGetAttribute(&g_l2, cudaDevAttrL2CacheSize, 0));
  using fa::sm90::FwdTraits;
  auto want = [&](int d) { return only[0] == 0 || std::atoi(only) == d; };
  // Non-causal rows are independent of the causal schedule: the second pass (one CTA per causal
  // tile) shows its causal rows only.
  for (int pass = 0; pass < 2; ++pass) {
    g_causal_persistent = pass == 0;
    std::printf("--- causal schedule: %s\n", pass == 0 ? "persistent, longest first in L2 groups"
                                                       : "one CTA per tile");
    if (want(128)) {
      sweep<128, FwdTraits<128, 128, 176, 2, true>>("128x176 s2 pingpong", b, pass == 0);
      sweep<128, FwdTraits<128, 128, 128, 2, true>>("128x128 s2 pingpong", b, pass == 0);
    }
    if (want(64)) {
      sweep<64, FwdTraits<64, 192, 128, 2, false>>("192x128 s2 (3 consumers)", b, pass == 0);
      sweep<64, FwdTraits<64, 128, 128, 2, true>>("128x128 s2 pingpong", b, pass == 0);
    }
    if (want(256)) {
      sweep<256, FwdTraits<256, 128, 80, 2, true>>("128x80 s2 pingpong", b, pass == 0);
      sweep<256, FwdTraits<256, 128, 64, 2, true>>("128x64 s2 pingpong", b, pass == 0);
    }
  }
  return 0;
}
