// Using flashattn_cu from plain C++ (no PyTorch): forward and backward through the public header
// csrc/include/flashattn_cu/flashattn_cu.h, checked against a float64 reference on the CPU.
//
//   attention_demo [head_dim ...]     (default: 64 and 128 where built)
//
// Random fp16 q, k, v, dout; GQA (4 query heads over 2 kv heads); seqlen_q = 150, seqlen_k = 211;
// causal and not; deterministic and not. Prints the largest error of o, lse, dq, dk, dv relative
// to the largest reference value and exits 1 if any is above 2e-2 (fp16 rounding of the inputs,
// of P and of dS gives about 1e-3; a wrong kernel gives about 1).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <type_traits>
#include <vector>

#include "flashattn_cu/flashattn_cu.h"

namespace {

constexpr int kBatch = 2, kSeqQ = 150, kSeqK = 211, kHeads = 4, kHeadsK = 2;
constexpr double kTolerance = 2e-2;

#define CHECK_CUDA(expr)                                                                \
  do {                                                                                  \
    const cudaError_t err_ = (expr);                                                    \
    if (err_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(err_));         \
      std::exit(2);                                                                     \
    }                                                                                   \
  } while (0)

// A device copy of a host fp16 array (freed at exit; a demo).
template <typename T>
T* to_device(const std::vector<T>& host) {
  T* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, std::max<size_t>(host.size(), 1) * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return ptr;
}

template <typename T>
std::vector<T> to_host(const T* ptr, size_t n) {
  std::vector<T> host(n);
  CHECK_CUDA(cudaMemcpy(host.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

std::vector<__half> random_half(size_t n, std::mt19937& gen) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<__half> v(n);
  for (auto& x : v) x = __float2half(dist(gen));
  return v;
}

std::vector<double> widen(const std::vector<__half>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __half2float(v[i]);
  return out;
}

// max |a - b| / max |b|
template <typename A>
double rel_error(const std::vector<A>& a, const std::vector<double>& b) {
  double err = 0, scale = 1e-30;
  for (size_t i = 0; i < b.size(); ++i) {
    double x;
    if constexpr (std::is_same_v<A, __half>) {
      x = __half2float(a[i]);
    } else {
      x = a[i];
    }
    if (!std::isfinite(x)) return INFINITY;
    err = std::max(err, std::abs(x - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return err / scale;
}

struct Reference {
  std::vector<double> o, lse, dq, dk, dv;
};

// Attention in float64, (batch, seqlen, heads, d) layouts, causal bottom-right aligned.
Reference reference(const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>& dout, int d,
                    bool causal, double scale) {
  Reference r;
  r.o.assign(q.size(), 0);
  r.dq.assign(q.size(), 0);
  r.dk.assign(k.size(), 0);
  r.dv.assign(v.size(), 0);
  r.lse.assign(static_cast<size_t>(kBatch) * kHeads * kSeqQ, 0);
  auto qi = [&](int b, int s, int h) { return ((static_cast<size_t>(b) * kSeqQ + s) * kHeads + h) * d; };
  auto ki = [&](int b, int s, int h) { return ((static_cast<size_t>(b) * kSeqK + s) * kHeadsK + h) * d; };
  std::vector<double> p(kSeqK), dp(kSeqK);
  for (int b = 0; b < kBatch; ++b)
    for (int h = 0; h < kHeads; ++h) {
      const int hk = h / (kHeads / kHeadsK);
      for (int i = 0; i < kSeqQ; ++i) {
        const int limit = causal ? std::min(kSeqK, i + 1 + kSeqK - kSeqQ) : kSeqK;
        double m = -INFINITY;
        for (int j = 0; j < limit; ++j) {
          double s = 0;
          for (int c = 0; c < d; ++c) s += q[qi(b, i, h) + c] * k[ki(b, j, hk) + c];
          p[j] = s * scale;
          m = std::max(m, p[j]);
        }
        double sum = 0;
        for (int j = 0; j < limit; ++j) sum += std::exp(p[j] - m);
        const size_t li = (static_cast<size_t>(b) * kHeads + h) * kSeqQ + i;
        r.lse[li] = limit > 0 ? m + std::log(sum) : INFINITY;
        double dsum = 0;
        for (int j = 0; j < limit; ++j) {
          p[j] = std::exp(p[j] - r.lse[li]);
          dp[j] = 0;
          for (int c = 0; c < d; ++c) {
            r.o[qi(b, i, h) + c] += p[j] * v[ki(b, j, hk) + c];
            dp[j] += dout[qi(b, i, h) + c] * v[ki(b, j, hk) + c];
          }
          dsum += p[j] * dp[j];
        }
        for (int j = 0; j < limit; ++j) {
          const double ds = p[j] * (dp[j] - dsum);
          for (int c = 0; c < d; ++c) {
            r.dv[ki(b, j, hk) + c] += p[j] * dout[qi(b, i, h) + c];
            r.dq[qi(b, i, h) + c] += scale * ds * k[ki(b, j, hk) + c];
            r.dk[ki(b, j, hk) + c] += scale * ds * q[qi(b, i, h) + c];
          }
        }
      }
    }
  return r;
}

bool run_case(int d, bool causal, bool deterministic, std::mt19937& gen) {
  using flashattn_cu::Status;
  const size_t nq = static_cast<size_t>(kBatch) * kSeqQ * kHeads * d;
  const size_t nk = static_cast<size_t>(kBatch) * kSeqK * kHeadsK * d;
  const size_t nl = static_cast<size_t>(kBatch) * kHeads * kSeqQ;
  const auto hq = random_half(nq, gen), hk = random_half(nk, gen), hv = random_half(nk, gen);
  const auto hdo = random_half(nq, gen);
  __half *q = to_device(hq), *k = to_device(hk), *v = to_device(hv), *dout = to_device(hdo);
  __half *o = to_device(std::vector<__half>(nq)), *dq = to_device(std::vector<__half>(nq));
  __half *dk = to_device(std::vector<__half>(nk)), *dv = to_device(std::vector<__half>(nk));
  float* lse = to_device(std::vector<float>(nl));
  // Per-row (max, log2 sum): lets bwd() recompute the probabilities exactly (optional).
  float* stats = to_device(std::vector<float>(2 * nl));
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));

  // Contiguous (batch, seqlen, heads, d): strides in elements.
  const int64_t q_row = static_cast<int64_t>(kHeads) * d, q_batch = q_row * kSeqQ;
  const int64_t k_row = static_cast<int64_t>(kHeadsK) * d, k_batch = k_row * kSeqK;

  flashattn_cu::FwdParams f;
  f.q = q, f.k = k, f.v = v, f.o = o, f.lse = lse, f.softmax_stats = stats;
  f.q_batch_stride = f.o_batch_stride = q_batch;
  f.q_row_stride = f.o_row_stride = q_row;
  f.q_head_stride = f.o_head_stride = d;
  f.k_batch_stride = f.v_batch_stride = k_batch;
  f.k_row_stride = f.v_row_stride = k_row;
  f.k_head_stride = f.v_head_stride = d;
  f.batch = kBatch, f.seqlen_q = kSeqQ, f.seqlen_k = kSeqK;
  f.num_heads = kHeads, f.num_heads_k = kHeadsK, f.head_dim = d;
  f.softmax_scale = static_cast<float>(scale);
  f.is_causal = causal;
  f.dtype = flashattn_cu::DType::kFloat16;
  Status st = flashattn_cu::fwd(f, /*stream=*/nullptr);
  if (st != Status::kSuccess) {
    std::printf("d=%d: fwd() returned '%s' (CUDA: %s)\n", d, flashattn_cu::status_string(st),
                cudaGetErrorString(flashattn_cu::last_cuda_error()));
    return false;
  }

  flashattn_cu::BwdParams b;
  b.q = q, b.k = k, b.v = v, b.o = o, b.lse = lse, b.softmax_stats = stats, b.dout = dout;
  b.dq = dq, b.dk = dk, b.dv = dv;
  b.q_batch_stride = b.o_batch_stride = b.do_batch_stride = b.dq_batch_stride = q_batch;
  b.q_row_stride = b.o_row_stride = b.do_row_stride = b.dq_row_stride = q_row;
  b.q_head_stride = b.o_head_stride = b.do_head_stride = b.dq_head_stride = d;
  b.k_batch_stride = b.v_batch_stride = b.dk_batch_stride = b.dv_batch_stride = k_batch;
  b.k_row_stride = b.v_row_stride = b.dk_row_stride = b.dv_row_stride = k_row;
  b.k_head_stride = b.v_head_stride = b.dk_head_stride = b.dv_head_stride = d;
  b.batch = kBatch, b.seqlen_q = kSeqQ, b.seqlen_k = kSeqK;
  b.num_heads = kHeads, b.num_heads_k = kHeadsK, b.head_dim = d;
  b.softmax_scale = f.softmax_scale;
  b.is_causal = causal;
  b.deterministic = deterministic;
  b.dtype = f.dtype;
  const size_t ws_bytes = flashattn_cu::bwd_workspace_bytes(b);
  void* workspace = nullptr;
  if (ws_bytes > 0) CHECK_CUDA(cudaMalloc(&workspace, ws_bytes));
  b.workspace = workspace;
  st = flashattn_cu::bwd(b, /*stream=*/nullptr);
  if (st != Status::kSuccess) {
    std::printf("d=%d: bwd() returned '%s' (CUDA: %s)\n", d, flashattn_cu::status_string(st),
                cudaGetErrorString(flashattn_cu::last_cuda_error()));
    return false;
  }
  CHECK_CUDA(cudaDeviceSynchronize());

  const Reference ref =
      reference(widen(hq), widen(hk), widen(hv), widen(hdo), d, causal, scale);
  const double errs[] = {rel_error(to_host(o, nq), ref.o), rel_error(to_host(lse, nl), ref.lse),
                         rel_error(to_host(dq, nq), ref.dq), rel_error(to_host(dk, nk), ref.dk),
                         rel_error(to_host(dv, nk), ref.dv)};
  const bool ok = std::all_of(std::begin(errs), std::end(errs),
                              [](double e) { return e <= kTolerance; });
  std::printf("%s d=%3d causal=%d deterministic=%d: relative error o %.1e lse %.1e dq %.1e "
              "dk %.1e dv %.1e\n",
              ok ? "ok  " : "FAIL", d, causal, deterministic, errs[0], errs[1], errs[2], errs[3],
              errs[4]);
  for (void* ptr : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
                    static_cast<void*>(dout), static_cast<void*>(o), static_cast<void*>(dq),
                    static_cast<void*>(dk), static_cast<void*>(dv), static_cast<void*>(lse),
                    static_cast<void*>(stats), workspace}) {
    CHECK_CUDA(cudaFree(ptr));
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int archs[16], dims[16];
  const int n_archs = flashattn_cu::built_archs(archs, 16);
  const int n_dims = flashattn_cu::built_head_dims(dims, 16);
  std::printf("flashattn_cu library: archs");
  for (int i = 0; i < n_archs; ++i) std::printf(" %d", archs[i]);
  std::printf(", head dims");
  for (int i = 0; i < n_dims; ++i) std::printf(" %d", dims[i]);
  std::printf("\n");

  // No GPU (no driver, or a driver without a device) gets said as such, not as the runtime's
  // "CUDA driver version is insufficient" that the first kernel launch would report.
  int devices = 0;
  const cudaError_t dev_err = cudaGetDeviceCount(&devices);
  if (dev_err != cudaSuccess || devices == 0) {
    std::printf("attention_demo: no CUDA GPU found (%s); the demo needs an sm_80 or newer GPU\n",
                dev_err == cudaSuccess ? "0 devices" : cudaGetErrorString(dev_err));
    return 2;
  }

  std::vector<int> want;
  for (int i = 1; i < argc; ++i) want.push_back(std::atoi(argv[i]));
  if (want.empty()) {
    for (int i = 0; i < n_dims; ++i)
      if (dims[i] == 64 || dims[i] == 128) want.push_back(dims[i]);
  }
  if (want.empty()) {
    std::printf("no head dim to run: pass one, or build 64 or 128\n");
    return 1;
  }
  std::mt19937 gen(1234);
  bool ok = true;
  for (int d : want)
    for (bool causal : {false, true})
      for (bool deterministic : {false, true}) ok &= run_case(d, causal, deterministic, gen);
  std::printf(ok ? "attention_demo: all cases passed\n" : "attention_demo: FAILED\n");
  return ok ? 0 : 1;
}
