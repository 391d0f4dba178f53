// Tile sweep for the sm80 forward kernel, torch-free: times several (kBlockM, kBlockN, warps)
// instances of fwd_kernel on flash_attn's benchmark shapes with CUDA events (median of 30) and
// prints TFLOP/s, so tile choices in tiles.h rest on measurements; each configuration runs
// through the library's launch (sm80/fwd_launch.h launch_fwd). Build (sm_90a shown):
//   nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a \
//        -Icsrc/include -Icsrc/flash benchmarks/tune/tune_fwd.cu -o build/tune_fwd
#include <algorithm>
#include <cmath>
#include <string>
#include <cstdio>
#include <vector>

#include "sm80/fwd_launch.h"
#include "harness.h"
#include "library_status.h"

namespace fa = flashattn_cu;

// fp32 reference: one thread per (batch, head, query row); two passes over the keys.
__global__ void reference_fwd(fa::FwdParams p, float* out, float* lse) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  const int bh = blockIdx.y, b = bh / p.num_heads, h = bh % p.num_heads;
  if (row >= p.seqlen_q) return;
  const int hk = h / (p.num_heads / p.num_heads_k);
  auto q = static_cast<const __nv_bfloat16*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride + row * p.q_row_stride;
  auto k = static_cast<const __nv_bfloat16*>(p.k) + b * p.k_batch_stride + hk * p.k_head_stride;
  auto v = static_cast<const __nv_bfloat16*>(p.v) + b * p.v_batch_stride + hk * p.v_head_stride;
  const int limit = fa::visible_key_limit(row, p.seqlen_q, p.seqlen_k, p.is_causal);
  float m = -INFINITY;
  for (int j = 0; j < limit; ++j) {
    float s = 0.f;
    for (int d = 0; d < p.head_dim; ++d) s += __bfloat162float(q[d]) * __bfloat162float(k[j * p.k_row_stride + d]);
    m = fmaxf(m, s * p.softmax_scale);
  }
  float l = 0.f;
  float* o = out + (static_cast<int64_t>(bh) * p.seqlen_q + row) * p.head_dim;
  for (int d = 0; d < p.head_dim; ++d) o[d] = 0.f;
  for (int j = 0; j < limit; ++j) {
    float s = 0.f;
    for (int d = 0; d < p.head_dim; ++d) s += __bfloat162float(q[d]) * __bfloat162float(k[j * p.k_row_stride + d]);
    const float e = expf(s * p.softmax_scale - m);
    l += e;
    for (int d = 0; d < p.head_dim; ++d) o[d] += e * __bfloat162float(v[j * p.v_row_stride + d]);
  }
  for (int d = 0; d < p.head_dim; ++d) o[d] = l > 0 ? o[d] / l : 0.f;
  lse[static_cast<int64_t>(bh) * p.seqlen_q + row] = l > 0 ? m + logf(l) : INFINITY;
}

template <int D, int M, int N, int W, bool U = false>
void check(int batch, int heads, int heads_k, int sq, int sk, int head_dim, bool causal) {
  using Traits = fa::sm80::FwdTraits<D, M, N, W, U>;
  const size_t nq = size_t(batch) * sq * heads * head_dim, nk = size_t(batch) * sk * heads_k * head_dim;
  __nv_bfloat16 *q, *k, *v, *o;
  float *lse, *ref_o, *ref_lse;
  CHECK(cudaMalloc(&q, nq * 2)); CHECK(cudaMalloc(&k, nk * 2 + 16)); CHECK(cudaMalloc(&v, nk * 2 + 16));
  CHECK(cudaMalloc(&o, nq * 2)); CHECK(cudaMalloc(&lse, 4 * batch * heads * sq));
  CHECK(cudaMalloc(&ref_o, 4 * nq)); CHECK(cudaMalloc(&ref_lse, 4 * batch * heads * sq));
  fill_random<<<256, 256>>>(q, nq, 11); fill_random<<<256, 256>>>(k, nk, 12); fill_random<<<256, 256>>>(v, nk, 13);
  CHECK(cudaMemset(o, 0xff, nq * 2));  // NaN poison
  CHECK(cudaMemset(lse, 0xff, 4 * batch * heads * sq));
  fa::FwdParams p;
  p.q = q; p.k = k; p.v = v; p.o = o; p.lse = lse;
  p.q_row_stride = p.o_row_stride = heads * head_dim; p.q_batch_stride = p.o_batch_stride = p.q_row_stride * sq;
  p.q_head_stride = p.o_head_stride = head_dim;
  p.k_row_stride = p.v_row_stride = heads_k * head_dim; p.k_batch_stride = p.v_batch_stride = p.k_row_stride * sk;
  p.k_head_stride = p.v_head_stride = head_dim;
  p.batch = batch; p.seqlen_q = sq; p.seqlen_k = sk; p.num_heads = heads; p.num_heads_k = heads_k;
  p.head_dim = head_dim; p.softmax_scale = 1.f / sqrtf(head_dim); p.is_causal = causal;
  p.dtype = fa::DType::kBFloat16;
  // The library's launch of this configuration (sm80/fwd_launch.h: the call's kernel variant).
  if (fa::sm80::launch_fwd<__nv_bfloat16, Traits>(p, 0) != fa::Status::kSuccess) {
    std::printf("launch failed\n");
  }
  CHECK(cudaGetLastError());
  reference_fwd<<<dim3(fa::ceil_div(sq, 64), batch * heads), 64>>>(p, ref_o, ref_lse);
  CHECK(cudaDeviceSynchronize());
  std::vector<__nv_bfloat16> ho(nq);
  std::vector<float> hr(nq), hl(batch * heads * sq), hrl(batch * heads * sq);
  CHECK(cudaMemcpy(ho.data(), o, nq * 2, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hr.data(), ref_o, nq * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hl.data(), lse, hl.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hrl.data(), ref_lse, hl.size() * 4, cudaMemcpyDeviceToHost));
  double err = 0, lerr = 0;
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < sq; ++i)
      for (int h = 0; h < heads; ++h)
        for (int d = 0; d < head_dim; ++d) {
          const float x = __bfloat162float(ho[((size_t(b) * sq + i) * heads + h) * head_dim + d]);
          const float r = hr[((size_t(b) * heads + h) * sq + i) * head_dim + d];
          const double e = std::isnan(x) ? 1e9 : std::fabs(x - r);
          err = std::max(err, e);
        }
  for (size_t i = 0; i < hl.size(); ++i) {
    const double e = (std::isinf(hrl[i]) && std::isinf(hl[i])) ? 0 : std::isnan(hl[i]) ? 1e9 : std::fabs(hl[i] - hrl[i]);
    lerr = std::max(lerr, e);
  }
  std::printf("check d=%3d(%3d) %3dx%3d w%d b=%d h=%d/%d sq=%4d sk=%4d causal=%d: max|o-ref|=%.2e max|lse-ref|=%.2e %s\n",
              head_dim, D, M, N, W, batch, heads, heads_k, sq, sk, causal, err, lerr,
              (err < 2e-2 && lerr < 1e-3) ? "ok" : "FAIL");
  CHECK(cudaFree(q)); CHECK(cudaFree(k)); CHECK(cudaFree(v)); CHECK(cudaFree(o)); CHECK(cudaFree(lse));
  CHECK(cudaFree(ref_o)); CHECK(cudaFree(ref_lse));
}

template <typename Traits>
float time_config(fa::FwdParams p) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int it = 0; it < 35; ++it) {
    CHECK(cudaEventRecord(a));
    fa::sm80::launch_fwd<__nv_bfloat16, Traits>(p, 0);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaGetLastError());
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    if (it >= 5) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The benchmark's shape (flash_attn's: batch 16384 / seqlen, heads 2048 / d, bf16) over dense
// (batch, seqlen, heads, d) tensors.
fa::FwdParams bench_params(void* q, void* k, void* v, void* o, float* lse, int d, int seqlen,
                           bool causal) {
  const int batch = 16384 / seqlen, heads = 2048 / d;
  fa::FwdParams p;
  p.q = q; p.k = k; p.v = v; p.o = o; p.lse = lse;
  const int64_t rs = static_cast<int64_t>(heads) * d, bs = rs * seqlen;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = bs;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = rs;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
  p.batch = batch; p.seqlen_q = p.seqlen_k = seqlen; p.num_heads = p.num_heads_k = heads;
  p.head_dim = d; p.softmax_scale = 1.f / sqrtf(d); p.is_causal = causal;
  p.dtype = fa::DType::kBFloat16;
  return p;
}

template <int D, int M, int N, int W, bool U = false>
void run(int seqlen, bool causal, const char* tag) {
  using Traits = fa::sm80::FwdTraits<D, M, N, W, U>;
  const int batch = 16384 / seqlen, heads = 2048 / D;
  const size_t n = static_cast<size_t>(batch) * seqlen * heads * D;
  __nv_bfloat16 *q, *k, *v, *o;
  float* lse;
  CHECK(cudaMalloc(&q, n * 2)); CHECK(cudaMalloc(&k, n * 2)); CHECK(cudaMalloc(&v, n * 2));
  CHECK(cudaMalloc(&o, n * 2));
  CHECK(cudaMalloc(&lse, sizeof(float) * batch * heads * seqlen));
  fill_random<<<1024, 256>>>(q, n, 1); fill_random<<<1024, 256>>>(k, n, 2); fill_random<<<1024, 256>>>(v, n, 3);
  const fa::FwdParams p = bench_params(q, k, v, o, lse, D, seqlen, causal);
  const float ms = time_config<Traits>(p);
  const double flops = 4.0 * batch * heads * seqlen * seqlen * D / (causal ? 2 : 1);
  std::printf("%-4s d=%3d seqlen=%5d causal=%d  %3dx%3d w%d  %7.3f ms  %6.1f TFLOP/s\n", tag, D,
              seqlen, causal, M, N, W, ms, flops / ms / 1e9);
  CHECK(cudaFree(q)); CHECK(cudaFree(k)); CHECK(cudaFree(v)); CHECK(cudaFree(o)); CHECK(cudaFree(lse));
}

template <int D, int M, int N, int W, bool U = false>
void sweep(const char* tag) {
  for (int s : {2048, 8192})
    for (bool c : {false, true}) run<D, M, N, W, U>(s, c, tag);
}

// `lazy`: one library tile with a lazy row reference (B: FwdTraits kLazyRescale 8, common/
// softmax.h new_max kLazyLog2) against the running max (A) on the benchmark's shape, both
// outputs checked against each other (they differ by rounding only), then timed interleaved
// (harness.h ab_ms: 30 rounds of 4 calls): B / A time < 1 means the lazy reference is faster.
// kSkipB (`skipkept`): B the running max with FwdTraits kSkipKept instead, whose output must be
// bitwise A's (max|A - B| 0, else NOT BITWISE).
template <int D, int M, int N, int W, bool U = false, bool kSkipB = false>
void lazy_ab(int seqlen, bool causal) {
  using A = fa::sm80::FwdTraits<D, M, N, W, U, 0>;
  using B = fa::sm80::FwdTraits<D, M, N, W, U, kSkipB ? 0 : 8, kSkipB>;
  const int batch = 16384 / seqlen, heads = 2048 / D;
  const size_t n = static_cast<size_t>(batch) * seqlen * heads * D;
  __nv_bfloat16 *q, *k, *v, *oa, *ob;
  float* lse;
  CHECK(cudaMalloc(&q, n * 2)); CHECK(cudaMalloc(&k, n * 2)); CHECK(cudaMalloc(&v, n * 2));
  CHECK(cudaMalloc(&oa, n * 2)); CHECK(cudaMalloc(&ob, n * 2));
  CHECK(cudaMalloc(&lse, sizeof(float) * batch * heads * seqlen));
  fill_random<<<1024, 256>>>(q, n, 1); fill_random<<<1024, 256>>>(k, n, 2); fill_random<<<1024, 256>>>(v, n, 3);
  const fa::FwdParams pa = bench_params(q, k, v, oa, lse, D, seqlen, causal);
  const fa::FwdParams pb = bench_params(q, k, v, ob, lse, D, seqlen, causal);
  CHECK(cudaMemset(ob, 0xff, n * 2));  // NaN poison
  fa::sm80::launch_fwd<__nv_bfloat16, A>(pa, 0);
  fa::sm80::launch_fwd<__nv_bfloat16, B>(pb, 0);
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaGetLastError());
  float* scratch;
  CHECK(cudaMalloc(&scratch, sizeof(float)));
  const float diff = max_diff(oa, ob, n, scratch);
  CHECK(cudaFree(scratch));
  const AbTimes t = ab_ms([&] { fa::sm80::launch_fwd<__nv_bfloat16, A>(pa, 0); },
                          [&] { fa::sm80::launch_fwd<__nv_bfloat16, B>(pb, 0); }, 30, 4);
  const double flops = 4.0 * batch * heads * seqlen * seqlen * D / (causal ? 2 : 1);
  const char* verdict = kSkipB ? (diff == 0.f ? "" : "  NOT BITWISE") : diff < 2e-2f ? "" : "  WRONG";
  std::printf("%s d=%3d seqlen=%5d causal=%d %3dx%3d w%d: A %6.1f  B %6.1f TFLOP/s  B/A time %.3f"
              "  max|A - B| %.1e%s\n", kSkipB ? "skip" : "lazy", D, seqlen, causal, M, N, W,
              flops / t.a_ms * 1e-9, flops / t.b_ms * 1e-9, t.b_over_a, diff, verdict);
  std::fflush(stdout);
  CHECK(cudaFree(q)); CHECK(cudaFree(k)); CHECK(cudaFree(v)); CHECK(cudaFree(oa));
  CHECK(cudaFree(ob)); CHECK(cudaFree(lse));
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  if (mode == "ab") {  // the shipped configs of d = 64, 128, 256 at 8k, for A/B of code changes
    for (bool c : {false, true}) {
      run<64, 128, 128, 4>(8192, c, "ab");
      run<128, 128, 64, 4, true>(8192, c, "ab");
      run<256, 64, 64, 4>(8192, c, "ab");
      run<256, 64, 64, 4>(2048, c, "ab");
    }
    return 0;
  }
  if (mode == "lazy") {  // the shipped d = 64 / 128 / 256 tiles, two passes
    for (int rep = 0; rep < 2; ++rep)
      for (int s : {2048, 8192})
        for (bool c : {false, true}) {
          lazy_ab<64, 128, 128, 4>(s, c);
          lazy_ab<128, 128, 64, 4, true>(s, c);
          lazy_ab<256, 64, 64, 4>(s, c);
        }
    return 0;
  }
  if (mode == "skipkept") {  // the same tiles, the running max with FwdTraits kSkipKept as B
    for (int rep = 0; rep < 2; ++rep)
      for (int s : {2048, 8192})
        for (bool c : {false, true}) {
          lazy_ab<64, 128, 128, 4, false, true>(s, c);
          lazy_ab<128, 128, 64, 4, true, true>(s, c);
          lazy_ab<256, 64, 64, 4, false, true>(s, c);
        }
    return 0;
  }
  if (mode == "quick") {
    sweep<64, 128, 128, 4>("cur");
    sweep<128, 128, 64, 4, true>("cur");
    sweep<256, 64, 64, 4>("cur");
    sweep<256, 128, 64, 8>("alt");
    return 0;
  }
  if (mode == "ncu") {  // one launch each of the shipped d=64/128/256 configs, for ncu
    run<64, 128, 128, 4>(8192, false, "ncu");
    run<128, 128, 64, 4, true>(8192, false, "ncu");
    run<256, 64, 64, 4>(8192, false, "ncu");
    return 0;
  }
  if (mode == "all" || mode == "check")
  for (bool c : {false, true}) {
    check<64, 128, 128, 4>(2, 3, 3, 300, 300, 64, c);
    check<64, 128, 128, 4>(1, 4, 2, 113, 203, 40, c);
    check<128, 128, 64, 4>(2, 4, 1, 239, 1000, 128, c);
    check<128, 128, 64, 4>(1, 2, 2, 1000, 239, 120, c);
    check<128, 128, 64, 4>(1, 2, 2, 3, 799, 128, c);
    check<96, 128, 64, 4>(1, 6, 3, 257, 129, 96, c);
    check<160, 128, 64, 8>(1, 2, 2, 200, 333, 160, c);
    check<256, 128, 64, 8>(1, 2, 1, 512, 256, 256, c);
    check<256, 64, 32, 4>(1, 2, 1, 129, 511, 232, c);
    check<32, 128, 128, 4>(1, 2, 2, 130, 70, 32, c);
    check<256, 64, 64, 4>(2, 2, 1, 300, 301, 256, c);
    check<192, 64, 64, 4>(1, 3, 1, 200, 333, 184, c);
    check<224, 64, 64, 4>(1, 2, 2, 77, 400, 224, c);
  }
  if (mode == "check") return 0;
  sweep<64, 128, 128, 4>("cur");
  sweep<64, 128, 64, 4>("alt");
  sweep<128, 128, 64, 4, true>("cur");
  sweep<128, 128, 32, 4>("alt");
  sweep<96, 128, 64, 4>("cur");
  sweep<96, 128, 128, 4>("alt");
  sweep<160, 128, 64, 8>("cur");
  sweep<160, 64, 64, 4>("alt");
  sweep<192, 128, 64, 8>("cur");
  sweep<192, 64, 64, 4>("alt");
  sweep<224, 128, 64, 8>("cur");
  sweep<224, 64, 64, 4>("alt");
  sweep<256, 64, 64, 4>("cur");
  sweep<256, 128, 64, 8>("alt");
  return 0;
}
