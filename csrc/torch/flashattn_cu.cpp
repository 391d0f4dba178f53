// The torch binding: the only C++ in the project that includes torch. It checks tensors, allocates
// outputs, fills the torch-free params structs and calls flashattn_cu::fwd / flashattn_cu::bwd on
// the current stream. Never synchronizes, never prints.
//
// Ops (TORCH_LIBRARY, so torch.compile and torch.library see them; full schemas at the end):
//   flashattn_cu::fwd(q, k, v, softmax_scale, causal, ..., dropout_p=0.0, return_softmax=False,
//                     gen=None) -> (out, softmax_lse, softmax_stats, rng_state, S_dmask)
//   flashattn_cu::bwd(dout, q, k, v, out, softmax_lse, softmax_scale, causal, deterministic,
//                     softmax_stats=None, ..., dropout_p=0.0, rng_state=None) -> (dq, dk, dv)
// and their varlen forms, and
//   flashattn_cu::fwd_kvcache(q, k_cache!, v_cache!, cache_seqlens, cache_batch_idx, cache_leftpad,
//                             block_table, softmax_scale, causal, ..., num_splits=0,
//                             k_new=None, v_new=None, rotary_cos=None, rotary_sin=None,
//                             rotary_interleaved=True) -> (out, softmax_lse)
//   flashattn_cu::fwd_splitkv(q, k, v, softmax_scale, causal, ..., num_splits=0) -> (out, lse)
//   flashattn_cu::fwd_kvcache_varlen(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k,
//                                    block_table, max_seqlen_q, max_seqlen_k, ...) -> (out, lse)
// (flash_attn_with_kvcache's attention, appending k_new / v_new to the cache in place with the
// rotary embedding fused into the kernel; and flash_attn_varlen_func's with block_table). Dropout: the forward draws (seed, offset) from the CUDA generator
// (gen, or the device's default) and returns them as rng_state (int64 (2,), written by the
// kernel, so a captured CUDA graph records fresh values at each replay); the backward takes that
// rng_state and regenerates the same mask. S_dmask: flash_attn's return_softmax output
// (flashattn_cu.h, FwdParams::s_dmask), an empty tensor when not asked for.
// softmax_stats (batch, nheads, seqlen_q, 2) fp32 is what bwd needs to recompute the
// probabilities exactly at any logit magnitude (flashattn_cu.h, FwdParams); without it bwd
// works from softmax_lse alone, as flash_attn does.
// plus a pybind11 module (flashattn_cu._C) with build information and a test-only hook.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <optional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>  // at::cuda::getCurrentCUDAStream is this, without cuBLAS/cuSPARSE headers
#include <torch/extension.h>
#include <torch/library.h>

#include "flashattn_cu/flashattn_cu.h"
#include "head_dims.h"  // round_head_dim(), for the test hook _round_head_dim
#if FLASHATTN_CU_HAS_SM90A
#include "sm90/launch.h"  // the test hook _tma_copy_selftest
#endif

namespace {

// Test-only: when set, every output and the backward workspace is filled with NaN / 0xFF bytes
// right after allocation (on the stream, asynchronously), so an element the kernels fail to
// write shows up as NaN instead of as whatever the caching allocator handed back.
std::atomic<bool> g_poison_outputs{false};

void maybe_poison(at::Tensor& t) {
  if (!g_poison_outputs.load(std::memory_order_relaxed) || t.numel() == 0) return;
  if (t.scalar_type() == at::kByte) {
    t.fill_(0xFF);
  } else {
    t.fill_(std::numeric_limits<float>::quiet_NaN());
  }
}

flashattn_cu::DType to_dtype(at::ScalarType t) {
  return t == at::kBFloat16 ? flashattn_cu::DType::kBFloat16 : flashattn_cu::DType::kFloat16;
}

// Error messages are built here with std::to_string / snprintf and handed to TORCH_CHECK* as one
// std::string, never streamed: on the H200 image (g++ 13.3 against torch 2.11.0+cu130) a message
// that streams a number through c10::str's std::ostringstream crashed the process (SIGSEGV)
// instead of raising; see benchmarks/NOTES.md, "TORCH_CHECK crash", for the diagnosis.
std::string text(const char* s) { return s; }
std::string text(const std::string& s) { return s; }
std::string text(int64_t v) { return std::to_string(v); }
std::string text(int v) { return std::to_string(v); }
std::string text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}
std::string text(at::ScalarType t) { return c10::toString(t); }
std::string text(const c10::Device& d) {
  std::string s = d.is_cuda() ? "cuda" : d.is_cpu() ? "cpu" : "device type " +
                                                              std::to_string(static_cast<int>(d.type()));
  if (d.has_index()) s += ":" + std::to_string(d.index());
  return s;
}
std::string text(at::IntArrayRef v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

template <typename... Parts>
std::string msg(const Parts&... parts) {
  std::string s = "flashattn_cu: ";
  ((s += text(parts)), ...);
  return s;
}

void check_input(const at::Tensor& t, const char* name, const at::Tensor& ref) {
  TORCH_CHECK_VALUE(t.is_cuda(), msg(name, " must be a CUDA tensor, got device ", t.device()));
  TORCH_CHECK_VALUE(t.device() == ref.device(),
                    msg(name, " is on ", t.device(), " but q is on ", ref.device(),
                        "; all tensors must be on the same GPU"));
  TORCH_CHECK_TYPE(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16,
                   msg(name, " has dtype ", t.scalar_type(), "; supported: float16, bfloat16"));
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(),
                   msg(name, " has dtype ", t.scalar_type(), " but q has ", ref.scalar_type(),
                       "; dtypes must match"));
  TORCH_CHECK_VALUE(t.dim() == 4, msg(name, " must have rank 4 (batch, seqlen, nheads, headdim), "
                                      "got shape ", t.sizes()));
  TORCH_CHECK_VALUE(t.size(-1) == 0 || t.stride(-1) == 1 || t.size(-1) == 1,
                    msg(name, " must be contiguous in its last (head) dimension, got strides ",
                        t.strides()));
}

// The kernels need every non-last stride to be a multiple of 8 elements (16 bytes) and a 16-byte
// aligned base pointer. Anything else is still a valid tensor, so copy it rather than fail. Dims
// of size 1 never index past 0, so their stride does not matter (and is passed as 0).
bool kernel_layout_ok(const at::Tensor& t) {
  if (t.numel() == 0) return true;
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  if (t.size(-1) > 1 && t.stride(-1) != 1) return false;
  for (int i = 0; i < t.dim() - 1; ++i) {
    if (t.size(i) > 1 && t.stride(i) % 8 != 0) return false;
  }
  return true;
}

at::Tensor to_kernel_layout(const at::Tensor& t) {
  // clone, not contiguous(): a contiguous tensor at a misaligned offset would come back as is.
  return kernel_layout_ok(t) ? t : t.clone(at::MemoryFormat::Contiguous);
}

// A fresh tensor for an output or gradient with t's shape: t's strides where t is dense and they
// suit the kernels (the layout of flash_attn's `torch.empty_like(q)`, which is also what SDPA's
// meta functions give and what compiled graphs assert), contiguous otherwise. Decided from sizes
// and strides alone, so the fake implementations (flash_attn_interface.py) decide alike.
at::Tensor empty_like_layout(const at::Tensor& t) {
  bool keep = t.is_non_overlapping_and_dense() && (t.size(-1) <= 1 || t.stride(-1) == 1);
  for (int i = 0; keep && i < t.dim() - 1; ++i) {
    keep = t.size(i) <= 1 || t.stride(i) % 8 == 0;
  }
  return keep ? at::empty_strided(t.sizes(), t.strides(), t.options())
              : at::empty(t.sizes(), t.options());
}

// Stride of dim `i` as the kernels see it (elements; 0 for a size-1 dim).
int64_t kstride(const at::Tensor& t, int i) { return t.size(i) == 1 ? 0 : t.stride(i); }

// The (batch, row, head) strides of a (batch, seqlen, heads, head_dim) tensor.
void set_strides(int64_t& batch_stride, int64_t& row_stride, int64_t& head_stride,
                 const at::Tensor& t) {
  batch_stride = kstride(t, 0);
  row_stride = kstride(t, 1);
  head_stride = kstride(t, 2);
}

// A varlen tensor (total, heads, head_dim) as the kernels see it: a batch of one, so its batch
// stride is 0 (kstride of a size-1 dim) and the kernels offset rows by cu_seqlens instead.
at::Tensor as_batch(const at::Tensor& t, bool varlen) { return varlen ? t.unsqueeze(0) : t; }

// The pointers and strides of fwd()'s tensors; k and v are null when empty.
void set_fwd_tensors(flashattn_cu::FwdParams& p, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                     const at::Tensor& stats, bool varlen) {
  p.q = q.data_ptr();
  p.k = k.numel() > 0 ? k.data_ptr() : nullptr;
  p.v = v.numel() > 0 ? v.data_ptr() : nullptr;
  p.o = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.softmax_stats = stats.data_ptr<float>();
  set_strides(p.q_batch_stride, p.q_row_stride, p.q_head_stride, as_batch(q, varlen));
  set_strides(p.k_batch_stride, p.k_row_stride, p.k_head_stride, as_batch(k, varlen));
  set_strides(p.v_batch_stride, p.v_row_stride, p.v_head_stride, as_batch(v, varlen));
  set_strides(p.o_batch_stride, p.o_row_stride, p.o_head_stride, as_batch(out, varlen));
}

struct Sizes {
  int64_t batch, seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim;
};

// Checks q, k, v against each other and returns their sizes.
Sizes check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check_input(q, "q", q);
  check_input(k, "k", q);
  check_input(v, "v", q);
  const Sizes s{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3)};
  TORCH_CHECK_VALUE(k.size(0) == s.batch && v.size(0) == s.batch,
                    msg("batch sizes differ: q ", s.batch, ", k ", k.size(0), ", v ", v.size(0)));
  TORCH_CHECK_VALUE(k.size(3) == s.head_dim && v.size(3) == s.head_dim,
                    msg("head dims differ: q ", s.head_dim, ", k ", k.size(3), ", v ", v.size(3)));
  TORCH_CHECK_VALUE(v.size(1) == s.seqlen_k && v.size(2) == s.num_heads_k,
                    msg("k and v must have the same (seqlen, nheads), got k ", k.sizes(), ", v ",
                        v.sizes()));
  TORCH_CHECK_VALUE(s.head_dim % 8 == 0 && s.head_dim > 0 && s.head_dim <= 256,
                    msg("head dim must be a positive multiple of 8 and <= 256, got ", s.head_dim,
                        " (flash_attn_func pads other sizes)"));
  TORCH_CHECK_VALUE(s.num_heads_k > 0 && s.num_heads % s.num_heads_k == 0,
                    msg("nheads of q (", s.num_heads, ") must be a multiple of nheads of k/v (",
                        s.num_heads_k, ")"));
  const int64_t kIntMax = std::numeric_limits<int>::max();
  TORCH_CHECK_VALUE(s.seqlen_q <= flashattn_cu::kMaxSeqlen && s.seqlen_k <= flashattn_cu::kMaxSeqlen,
                    msg("seqlen_q (", s.seqlen_q, ") and seqlen_k (", s.seqlen_k,
                        ") must be at most ", static_cast<int64_t>(flashattn_cu::kMaxSeqlen),
                        " (2^31 - 2^16), the longest sequence the kernels index"));
  TORCH_CHECK_VALUE(s.batch <= kIntMax && s.num_heads <= kIntMax,
                    msg("batch (", s.batch, ") and nheads (", s.num_heads,
                        ") must fit in int32"));
  return s;
}

// The kernels take the scale as a float and flush subnormals: a double that is positive and
// finite can still become 0 (1e-50) or inf (1e39) there.
void check_scale(double softmax_scale) {
  const float as_float = softmax_scale > 0 && softmax_scale < 3.5e38
                             ? static_cast<float>(softmax_scale)
                             : std::numeric_limits<float>::infinity();
  TORCH_CHECK_VALUE(std::isnormal(as_float) && as_float > 0.f,
                    msg("softmax_scale must be a positive number that is a normal float32 "
                        "(about 1.2e-38 to 3.4e38; the kernels compute in float32), got ",
                        softmax_scale));
}

// softcap: 0 (none), or a positive normal float32 with softmax_scale / softcap finite
// (flashattn_cu.h, AttnParams::softcap).
void check_softcap(double softcap, double softmax_scale) {
  if (softcap == 0.0) return;
  const float as_float = softcap > 0 && softcap < 2.3e38 ? static_cast<float>(softcap)
                                                         : std::numeric_limits<float>::infinity();
  TORCH_CHECK_VALUE(std::isnormal(as_float) && as_float > 0.f &&
                        std::isfinite(static_cast<float>(softmax_scale) / as_float),
                    msg("softcap must be 0 (none) or a positive normal float32 below 2.3e38 "
                        "with softmax_scale / softcap finite, got softcap=",
                        softcap, " (softmax_scale ", softmax_scale, ")"));
}

template <typename P>
void set_softcap(P& p, double softcap) {
  p.softcap = static_cast<float>(softcap);
}

void check_status(flashattn_cu::Status st, const char* which) {
  if (st == flashattn_cu::Status::kSuccess) return;
  const cudaError_t err = flashattn_cu::last_cuda_error();
  TORCH_CHECK(false, msg(which, " failed: ", flashattn_cu::status_string(st), " (CUDA: ",
                         cudaGetErrorString(err), ")"));
}

template <typename P>
void set_sizes(P& p, const Sizes& s, double softmax_scale, bool causal, at::ScalarType dtype) {
  p.batch = static_cast<int>(s.batch);
  p.seqlen_q = static_cast<int>(s.seqlen_q);
  p.seqlen_k = static_cast<int>(s.seqlen_k);
  p.num_heads = static_cast<int>(s.num_heads);
  p.num_heads_k = static_cast<int>(s.num_heads_k);
  p.head_dim = static_cast<int>(s.head_dim);
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.is_causal = causal;
  p.dtype = to_dtype(dtype);
}

// A float32 tensor on q's device with the given shape (softmax_lse, softmax_stats).
void check_row_tensor(const at::Tensor& t, const char* name, const at::Tensor& q,
                      at::IntArrayRef shape) {
  TORCH_CHECK_VALUE(t.is_cuda() && t.device() == q.device(),
                    msg(name, " must be on ", q.device(), ", got ", t.device()));
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat,
                   msg(name, " must be float32, got ", t.scalar_type()));
  TORCH_CHECK_VALUE(t.sizes() == shape, msg(name, " must have shape ", shape, ", got ", t.sizes()));
}

// window_left / window_right: flashattn_cu.h, AttnParams (-1: unbounded).
void check_window(int64_t window_left, int64_t window_right) {
  TORCH_CHECK_VALUE(window_left >= -1 && window_right >= -1 &&
                        window_left <= std::numeric_limits<int>::max() &&
                        window_right <= std::numeric_limits<int>::max(),
                    msg("window sizes must be -1 (unbounded) or in [0, 2^31), got (", window_left,
                        ", ", window_right, ")"));
}

template <typename P>
void set_window(P& p, int64_t window_left, int64_t window_right) {
  p.window_left = static_cast<int>(window_left);
  p.window_right = static_cast<int>(window_right);
}

// alibi_slopes: fp32 (nheads,) or (batch, nheads) on q's device; the returned tensor (contiguous)
// must outlive the call.
template <typename P>
at::Tensor set_alibi(P& p, const std::optional<at::Tensor>& slopes, const at::Tensor& q,
                     int64_t batch, int64_t num_heads) {
  if (!slopes.has_value()) return at::Tensor();
  const at::Tensor& t = *slopes;
  TORCH_CHECK_VALUE(t.is_cuda() && t.device() == q.device(),
                    msg("alibi_slopes must be on ", q.device(), ", got ", t.device()));
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat,
                   msg("alibi_slopes must be float32, got ", t.scalar_type()));
  const bool per_head = t.dim() == 1 && t.size(0) == num_heads;
  const bool per_batch = t.dim() == 2 && t.size(0) == batch && t.size(1) == num_heads;
  TORCH_CHECK_VALUE(per_head || per_batch,
                    msg("alibi_slopes must have shape (nheads,) = (", num_heads,
                        ",) or (batch, nheads) = (", batch, ", ", num_heads, "), got ",
                        t.sizes()));
  at::Tensor c = t.contiguous();
  p.alibi_slopes = c.data_ptr<float>();
  p.alibi_slopes_batch_stride = per_batch ? num_heads : 0;
  return c;
}

// dropout_p: in [0, 1) (flashattn_cu.h, AttnParams::dropout_p); return_softmax needs dropout
// (as flash_attn: S_dmask encodes the mask).
void check_dropout(double dropout_p, bool return_softmax) {
  TORCH_CHECK_VALUE(dropout_p >= 0.0 && dropout_p < 1.0,
                    msg("dropout_p must be a probability in [0, 1), got ", dropout_p));
  TORCH_CHECK_VALUE(!return_softmax || dropout_p > 0.0,
                    msg("return_softmax=True returns the dropout mask and needs dropout_p > 0 "
                        "(as flash_attn), got dropout_p=", dropout_p));
}

// The forward's dropout outputs: rng_state int64 (2,) with dropout (written by the kernel), else
// empty (0,) (nothing to write, and no uninitialised values to compare: flash_attn returns an
// unwritten (2,) there); S_dmask (batch, nheads, seqlen_q, seqlen_k rounded up to 128) in q's
// dtype when asked for, else empty (0,).
struct DropoutOutputs {
  at::Tensor rng_state, s_dmask;
};

DropoutOutputs dropout_outputs(const at::Tensor& q, int64_t batch, int64_t num_heads,
                               int64_t seqlen_q, int64_t seqlen_k, double dropout_p,
                               bool return_softmax) {
  auto round128 = [](int64_t n) { return (n + 127) / 128 * 128; };
  DropoutOutputs d;
  d.rng_state = at::empty({dropout_p > 0.0 ? 2 : 0}, q.options().dtype(at::kLong));
  d.s_dmask = return_softmax
                  ? at::empty({batch, num_heads, round128(seqlen_q), round128(seqlen_k)},
                              q.options())
                  : at::empty({0}, q.options());
  maybe_poison(d.s_dmask);
  return d;
}

// Dropout's random state: `increment` counter values of the CUDA generator (gen, or the default
// generator of q's device) under its mutex, as torch's own dropout does; under CUDA graph capture
// the generator hands out device pointers that each replay refreshes, read by the kernel
// (flashattn_cu.h, AttnParams::philox_*).
void set_dropout(flashattn_cu::FwdParams& p, double dropout_p, const DropoutOutputs& d,
                 const std::optional<at::Generator>& gen, const at::Tensor& q) {
  if (dropout_p == 0.0) return;
  p.dropout_p = static_cast<float>(dropout_p);
  p.rng_state = reinterpret_cast<uint64_t*>(d.rng_state.data_ptr<int64_t>());
  p.s_dmask = d.s_dmask.numel() > 0 ? d.s_dmask.data_ptr() : nullptr;
  auto* g = at::get_generator_or_default<at::CUDAGeneratorImpl>(
      gen, at::cuda::detail::getDefaultCUDAGenerator(q.device().index()));
  const uint64_t increment = static_cast<uint64_t>(p.batch) * static_cast<uint64_t>(p.num_heads);
  at::PhiloxCudaState state;
  {
    std::lock_guard<std::mutex> lock(g->mutex_);
    state = g->philox_cuda_state(increment);
  }
  if (state.captured_) {
    p.philox_seed_ptr = reinterpret_cast<const uint64_t*>(state.seed_.ptr);
    p.philox_offset_ptr = reinterpret_cast<const uint64_t*>(state.offset_.ptr);
    p.philox_offset = state.offset_intragraph_;
  } else {
    p.philox_seed = state.seed_.val;
    p.philox_offset = state.offset_.val;
  }
}

// The backward's dropout: the forward's rng_state (int64 (2,) on q's device), read by the
// kernels at run time.
template <typename P>
void set_bwd_dropout(P& p, double dropout_p, const std::optional<at::Tensor>& rng_state,
                     const at::Tensor& q) {
  TORCH_CHECK_VALUE(dropout_p >= 0.0 && dropout_p < 1.0,
                    msg("dropout_p must be a probability in [0, 1), got ", dropout_p));
  if (dropout_p == 0.0) return;
  TORCH_CHECK_VALUE(rng_state.has_value(),
                    msg("dropout_p=", dropout_p, " needs the forward's rng_state, got None"));
  const at::Tensor& r = *rng_state;
  TORCH_CHECK_VALUE(r.is_cuda() && r.device() == q.device() && r.scalar_type() == at::kLong &&
                        r.dim() == 1 && r.size(0) == 2 && r.is_contiguous(),
                    msg("rng_state must be the forward's contiguous int64 (2,) tensor on ",
                        q.device(), ", got ", r.scalar_type(), " ", r.sizes(), " on ",
                        r.device()));
  p.dropout_p = static_cast<float>(dropout_p);
  p.philox_seed_ptr = reinterpret_cast<const uint64_t*>(r.data_ptr<int64_t>());
  p.philox_offset_ptr = p.philox_seed_ptr + 1;
}

using FwdResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

FwdResult fwd_cuda(const at::Tensor& q_in,
                                                        const at::Tensor& k_in,
                                                        const at::Tensor& v_in,
                                                        double softmax_scale, bool causal,
                                                        int64_t window_left,
                                                        int64_t window_right,
                                                        const std::optional<at::Tensor>& alibi,
                                                        double softcap, double dropout_p,
                                                        bool return_softmax,
                                                        const std::optional<at::Generator>& gen) {
  check_window(window_left, window_right);
  const Sizes s = check_qkv(q_in, k_in, v_in);
  check_scale(softmax_scale);
  check_softcap(softcap, softmax_scale);
  check_dropout(dropout_p, return_softmax);
  const c10::cuda::CUDAGuard guard(q_in.device());

  const at::Tensor q = to_kernel_layout(q_in);
  const at::Tensor k = to_kernel_layout(k_in);
  const at::Tensor v = to_kernel_layout(v_in);
  at::Tensor out = empty_like_layout(q_in);
  at::Tensor lse = at::empty({s.batch, s.num_heads, s.seqlen_q}, q.options().dtype(at::kFloat));
  at::Tensor stats =
      at::empty({s.batch, s.num_heads, s.seqlen_q, 2}, q.options().dtype(at::kFloat));
  maybe_poison(out);
  maybe_poison(lse);
  maybe_poison(stats);
  const DropoutOutputs d =
      dropout_outputs(q, s.batch, s.num_heads, s.seqlen_q, s.seqlen_k, dropout_p, return_softmax);
  if (out.numel() == 0) return {out, lse, stats, d.rng_state, d.s_dmask};

  flashattn_cu::FwdParams p;
  set_fwd_tensors(p, q, k, v, out, lse, stats, /*varlen=*/false);
  set_sizes(p, s, softmax_scale, causal, q.scalar_type());
  set_window(p, window_left, window_right);
  set_softcap(p, softcap);
  const at::Tensor slopes = set_alibi(p, alibi, q_in, s.batch, s.num_heads);
  set_dropout(p, dropout_p, d, gen, q);
  check_status(flashattn_cu::fwd(p, c10::cuda::getCurrentCUDAStream()), "fwd");
  return {out, lse, stats, d.rng_state, d.s_dmask};
}

// The backward's inputs in the kernels' layout (dout cast to q's dtype: an incoming gradient may
// come in any dtype and layout) and its outputs dq, dk, dv laid out like q, k, v.
struct BwdTensors {
  at::Tensor q, k, v, out, lse, stats, dout, dq, dk, dv;
};

BwdTensors bwd_tensors(const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in,
                       const at::Tensor& v_in, const at::Tensor& out_in, const at::Tensor& lse_in,
                       const std::optional<at::Tensor>& stats_in) {
  BwdTensors t;
  t.q = to_kernel_layout(q_in);
  t.k = to_kernel_layout(k_in);
  t.v = to_kernel_layout(v_in);
  t.out = to_kernel_layout(out_in);
  t.lse = lse_in.contiguous();
  t.stats = stats_in.has_value() ? stats_in->contiguous() : at::Tensor();
  t.dout = to_kernel_layout(dout_in.scalar_type() == t.q.scalar_type()
                                ? dout_in
                                : dout_in.to(t.q.scalar_type()));
  t.dq = empty_like_layout(q_in);
  t.dk = empty_like_layout(k_in);
  t.dv = empty_like_layout(v_in);
  maybe_poison(t.dq);
  maybe_poison(t.dk);
  maybe_poison(t.dv);
  return t;
}

// The pointers and strides of bwd()'s tensors.
void set_bwd_tensors(flashattn_cu::BwdParams& p, const BwdTensors& t, bool varlen) {
  p.q = t.q.data_ptr();
  p.k = t.k.data_ptr();
  p.v = t.v.data_ptr();
  p.o = t.out.data_ptr();
  p.lse = t.lse.data_ptr<float>();
  p.softmax_stats = t.stats.defined() ? t.stats.data_ptr<float>() : nullptr;
  p.dout = t.dout.data_ptr();
  p.dq = t.dq.data_ptr();
  p.dk = t.dk.data_ptr();
  p.dv = t.dv.data_ptr();
  set_strides(p.q_batch_stride, p.q_row_stride, p.q_head_stride, as_batch(t.q, varlen));
  set_strides(p.k_batch_stride, p.k_row_stride, p.k_head_stride, as_batch(t.k, varlen));
  set_strides(p.v_batch_stride, p.v_row_stride, p.v_head_stride, as_batch(t.v, varlen));
  set_strides(p.o_batch_stride, p.o_row_stride, p.o_head_stride, as_batch(t.out, varlen));
  set_strides(p.do_batch_stride, p.do_row_stride, p.do_head_stride, as_batch(t.dout, varlen));
  set_strides(p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, as_batch(t.dq, varlen));
  set_strides(p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, as_batch(t.dk, varlen));
  set_strides(p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, as_batch(t.dv, varlen));
}

// A scratch buffer of `bytes` on like's device for a params struct's `workspace` (poisoned when
// asked; left null for 0 bytes); the caller keeps the tensor alive across the call. The caching
// allocator hands out 512-byte aligned blocks, more than the 256 bwd() needs.
at::Tensor make_workspace(size_t bytes, const at::Tensor& like, void*& workspace_ptr) {
  at::Tensor workspace;
  if (bytes > 0) {
    workspace = at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
    maybe_poison(workspace);
    workspace_ptr = workspace.data_ptr();
  }
  return workspace;
}

// Allocates the workspace p needs (poisoned when asked) and runs bwd() on the current stream.
void run_bwd(flashattn_cu::BwdParams& p, const at::Tensor& like, const char* which) {
  const at::Tensor workspace =
      make_workspace(flashattn_cu::bwd_workspace_bytes(p), like, p.workspace);
  check_status(flashattn_cu::bwd(p, c10::cuda::getCurrentCUDAStream()), which);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cuda(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& v_in, const at::Tensor& out_in, const at::Tensor& lse_in,
    double softmax_scale, bool causal, bool deterministic,
    const std::optional<at::Tensor>& stats_in, int64_t window_left, int64_t window_right,
    const std::optional<at::Tensor>& alibi, double softcap, double dropout_p,
    const std::optional<at::Tensor>& rng_state) {
  check_window(window_left, window_right);
  const Sizes s = check_qkv(q_in, k_in, v_in);
  check_scale(softmax_scale);
  check_softcap(softcap, softmax_scale);
  check_input(out_in, "out", q_in);
  TORCH_CHECK_VALUE(out_in.sizes() == q_in.sizes(),
                    msg("out must have the shape of q ", q_in.sizes(), ", got ", out_in.sizes()));
  // dout is an incoming gradient: any layout (e.g. the stride-0 expand of out.sum()) is accepted.
  TORCH_CHECK_VALUE(dout_in.is_cuda() && dout_in.device() == q_in.device(),
                    msg("dout must be on ", q_in.device(), ", got ", dout_in.device()));
  TORCH_CHECK_VALUE(dout_in.sizes() == q_in.sizes(),
                    msg("dout must have the shape of q ", q_in.sizes(), ", got ", dout_in.sizes()));
  check_row_tensor(lse_in, "softmax_lse", q_in, {s.batch, s.num_heads, s.seqlen_q});
  if (stats_in.has_value()) {
    check_row_tensor(*stats_in, "softmax_stats", q_in, {s.batch, s.num_heads, s.seqlen_q, 2});
  }
  const c10::cuda::CUDAGuard guard(q_in.device());

  const BwdTensors t = bwd_tensors(dout_in, q_in, k_in, v_in, out_in, lse_in, stats_in);
  // Degenerate sizes: no query rows means no gradient reaches k/v; no keys means every output
  // row is the constant 0 and q gets no gradient. Nothing to launch.
  if (s.batch == 0 || s.seqlen_q == 0 || s.seqlen_k == 0) {
    t.dq.zero_();
    t.dk.zero_();
    t.dv.zero_();
    return {t.dq, t.dk, t.dv};
  }

  flashattn_cu::BwdParams p;
  set_bwd_tensors(p, t, /*varlen=*/false);
  set_sizes(p, s, softmax_scale, causal, t.q.scalar_type());
  set_window(p, window_left, window_right);
  set_softcap(p, softcap);
  const at::Tensor slopes = set_alibi(p, alibi, q_in, s.batch, s.num_heads);
  set_bwd_dropout(p, dropout_p, rng_state, q_in);
  p.deterministic = deterministic;
  run_bwd(p, t.q, "bwd");
  return {t.dq, t.dk, t.dv};
}

// ---------------------------------------------------------------------------------------------
// Varlen (flash_attn's packed layout): q, out (total_q, nheads, d); k, v (total_k, nheads_k, d);
// cu_seqlens_q / cu_seqlens_k int32 (batch + 1); lse (nheads, total_q). The tensors are handed to
// the kernels as the rows of one (1, total, heads, d) entry (batch stride unused), with the
// entries' starts and lengths in cu_seqlens.

// Checks a (total, heads, d) varlen tensor and returns it viewed as (1, total, heads, d).
at::Tensor varlen_view(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.dim() == 3, msg(name, " must have rank 3 (total_tokens, nheads, headdim) "
                                      "for the varlen functions, got shape ", t.sizes()));
  return t.unsqueeze(0);
}

// A cu_seqlens / seqused tensor: int32, 1-d of `n` elements, on q's device. Made contiguous.
at::Tensor check_seq_array(const at::Tensor& t, const char* name, const at::Tensor& q, int64_t n) {
  TORCH_CHECK_VALUE(t.is_cuda() && t.device() == q.device(),
                    msg(name, " must be on ", q.device(), ", got ", t.device()));
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt,
                   msg(name, " must be int32, got ", t.scalar_type()));
  TORCH_CHECK_VALUE(t.dim() == 1 && (n < 0 || t.size(0) == n),
                    msg(name, " must be 1-d",
                        n < 0 ? std::string() : " of " + std::to_string(n) + " elements",
                        ", got shape ", t.sizes()));
  return t.contiguous();
}

struct VarlenArgs {
  at::Tensor cu_q, cu_k, seqused_k;
  int64_t batch, max_q, max_k, total_q;
};

VarlenArgs check_varlen(const at::Tensor& q, const at::Tensor& cu_q, const at::Tensor& cu_k,
                        const std::optional<at::Tensor>& seqused_k, int64_t max_q, int64_t max_k) {
  VarlenArgs a;
  a.cu_q = check_seq_array(cu_q, "cu_seqlens_q", q, -1);
  TORCH_CHECK_VALUE(a.cu_q.size(0) >= 1, msg("cu_seqlens_q must have batch + 1 >= 1 elements, "
                                             "got shape ", cu_q.sizes()));
  a.batch = a.cu_q.size(0) - 1;
  a.cu_k = check_seq_array(cu_k, "cu_seqlens_k", q, a.batch + 1);
  if (seqused_k.has_value()) a.seqused_k = check_seq_array(*seqused_k, "seqused_k", q, a.batch);
  TORCH_CHECK_VALUE(max_q >= 0 && max_k >= 0 && max_q <= flashattn_cu::kMaxSeqlen &&
                        max_k <= flashattn_cu::kMaxSeqlen,
                    msg("max_seqlen_q (", max_q, ") and max_seqlen_k (", max_k,
                        ") must be in [0, ", static_cast<int64_t>(flashattn_cu::kMaxSeqlen), "]"));
  TORCH_CHECK_VALUE(q.size(0) <= std::numeric_limits<int>::max() && a.batch < (1 << 30),
                    msg("total_q (", q.size(0), ") and batch (", a.batch, ") must fit in int32"));
  a.max_q = max_q;
  a.max_k = max_k;
  a.total_q = q.size(0);
  return a;
}

template <typename P>
void set_varlen(P& p, const VarlenArgs& a) {
  p.batch = static_cast<int>(a.batch);
  p.seqlen_q = static_cast<int>(a.max_q);
  p.seqlen_k = static_cast<int>(a.max_k);
  p.total_q = static_cast<int>(a.total_q);
  p.cu_seqlens_q = a.cu_q.data_ptr<int>();
  p.cu_seqlens_k = a.cu_k.data_ptr<int>();
}

FwdResult fwd_varlen_cuda(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
    const std::optional<at::Tensor>& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
    double softmax_scale, bool causal, int64_t window_left, int64_t window_right,
    const std::optional<at::Tensor>& alibi, double softcap, double dropout_p, bool return_softmax,
    const std::optional<at::Generator>& gen) {
  check_window(window_left, window_right);
  const Sizes s = check_qkv(varlen_view(q_in, "q"), varlen_view(k_in, "k"), varlen_view(v_in, "v"));
  check_scale(softmax_scale);
  check_softcap(softcap, softmax_scale);
  check_dropout(dropout_p, return_softmax);
  VarlenArgs a =
      check_varlen(q_in, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k);
  if (k_in.size(0) == 0) a.max_k = 0;  // no key rows at all: every query sees no key
  const c10::cuda::CUDAGuard guard(q_in.device());

  const at::Tensor q = to_kernel_layout(q_in);
  const at::Tensor k = to_kernel_layout(k_in);
  const at::Tensor v = to_kernel_layout(v_in);
  at::Tensor out = empty_like_layout(q_in);
  at::Tensor lse = at::empty({s.num_heads, a.total_q}, q.options().dtype(at::kFloat));
  at::Tensor stats = at::empty({s.num_heads, a.total_q, 2}, q.options().dtype(at::kFloat));
  maybe_poison(out);
  maybe_poison(lse);
  maybe_poison(stats);
  const DropoutOutputs d =
      dropout_outputs(q, a.batch, s.num_heads, max_seqlen_q, max_seqlen_k, dropout_p,
                      return_softmax);
  if (out.numel() == 0 || a.batch == 0 || a.max_q == 0) {
    // Rows past every max_seqlen_q bound are not computed (flash_attn's contract); with no
    // bound at all there is nothing to launch: zero output, +inf LSE (no key seen).
    out.zero_();
    lse.fill_(std::numeric_limits<float>::infinity());
    stats.select(-1, 0).fill_(std::numeric_limits<float>::infinity());
    stats.select(-1, 1).zero_();
    if (d.s_dmask.numel() > 0) d.s_dmask.zero_();
    return {out, lse, stats, d.rng_state, d.s_dmask};
  }

  flashattn_cu::FwdParams p;
  set_fwd_tensors(p, q, k, v, out, lse, stats, /*varlen=*/true);
  set_sizes(p, s, softmax_scale, causal, q.scalar_type());
  set_varlen(p, a);
  // The rows of k and v bound the sm90 forward's TMA maps (0, unknown, runs the sm80 kernels).
  p.total_k = k.size(0) <= std::numeric_limits<int>::max() ? static_cast<int>(k.size(0)) : 0;
  set_window(p, window_left, window_right);
  set_softcap(p, softcap);
  const at::Tensor slopes = set_alibi(p, alibi, q_in, a.batch, s.num_heads);
  p.seqused_k = a.seqused_k.defined() ? a.seqused_k.data_ptr<int>() : nullptr;
  set_dropout(p, dropout_p, d, gen, q);
  // No key rows at all: the S_dmask kernel sees max_seqlen_k 0 and writes no column.
  if (a.max_k == 0 && d.s_dmask.numel() > 0) d.s_dmask.zero_();
  check_status(flashattn_cu::fwd(p, c10::cuda::getCurrentCUDAStream()), "fwd_varlen");
  return {out, lse, stats, d.rng_state, d.s_dmask};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_varlen_cuda(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& v_in, const at::Tensor& out_in, const at::Tensor& lse_in,
    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, double softmax_scale, bool causal, bool deterministic,
    const std::optional<at::Tensor>& stats_in, int64_t window_left, int64_t window_right,
    const std::optional<at::Tensor>& alibi, double softcap, double dropout_p,
    const std::optional<at::Tensor>& rng_state) {
  check_window(window_left, window_right);
  const Sizes s = check_qkv(varlen_view(q_in, "q"), varlen_view(k_in, "k"), varlen_view(v_in, "v"));
  check_scale(softmax_scale);
  check_softcap(softcap, softmax_scale);
  const VarlenArgs a = check_varlen(q_in, cu_seqlens_q, cu_seqlens_k, std::nullopt, max_seqlen_q,
                                    max_seqlen_k);
  check_input(varlen_view(out_in, "out"), "out", q_in.unsqueeze(0));
  TORCH_CHECK_VALUE(out_in.sizes() == q_in.sizes(),
                    msg("out must have the shape of q ", q_in.sizes(), ", got ", out_in.sizes()));
  TORCH_CHECK_VALUE(dout_in.is_cuda() && dout_in.device() == q_in.device(),
                    msg("dout must be on ", q_in.device(), ", got ", dout_in.device()));
  TORCH_CHECK_VALUE(dout_in.sizes() == q_in.sizes(),
                    msg("dout must have the shape of q ", q_in.sizes(), ", got ", dout_in.sizes()));
  check_row_tensor(lse_in, "softmax_lse", q_in, {s.num_heads, a.total_q});
  if (stats_in.has_value()) {
    check_row_tensor(*stats_in, "softmax_stats", q_in, {s.num_heads, a.total_q, 2});
  }
  const c10::cuda::CUDAGuard guard(q_in.device());

  const BwdTensors t = bwd_tensors(dout_in, q_in, k_in, v_in, out_in, lse_in, stats_in);
  // Rows of entries whose length is 0 on the other side are written by the kernels (as zeros);
  // with no rows or no bounds on one side at all, nothing is launched.
  if (a.batch == 0 || a.total_q == 0 || t.k.size(0) == 0 || a.max_q == 0 || a.max_k == 0) {
    t.dq.zero_();
    t.dk.zero_();
    t.dv.zero_();
    return {t.dq, t.dk, t.dv};
  }

  flashattn_cu::BwdParams p;
  set_bwd_tensors(p, t, /*varlen=*/true);  // batch strides 0: a batch of one
  set_sizes(p, s, softmax_scale, causal, t.q.scalar_type());
  set_varlen(p, a);
  set_window(p, window_left, window_right);
  set_softcap(p, softcap);
  const at::Tensor slopes = set_alibi(p, alibi, q_in, a.batch, s.num_heads);
  set_bwd_dropout(p, dropout_p, rng_state, q_in);
  p.deterministic = deterministic;
  run_bwd(p, t.q, "bwd_varlen");
  return {t.dq, t.dk, t.dv};
}

// ---------------------------------------------------------------------------------------------
// KV cache (flash_attn_with_kvcache's attention; flashattn_cu.h: KvcacheParams): q (batch,
// seqlen_q, nheads, d); k_cache / v_cache (batch_cache, seqlen_cache, nheads_k, d) or, with
// block_table (batch, max_pages) int32, (num_pages, page_size, nheads_k, d); cache_seqlens
// (batch) int32: the keys of each entry before the append. With k_new / v_new (batch,
// seqlen_new, nheads_k, d) the kernel writes them into the caches in place at rows
// cache_seqlens[b] + i and attends to them too; with rotary_cos / rotary_sin (seqlen_ro,
// rotary_dim / 2) it rotates q and the new keys first (problem/kv_append.h; q is not modified).

// A cache tensor is read in place (a copy would cost what the kernel saves): it must already
// have the kernels' layout.
void check_cache(const at::Tensor& t, const char* name, const at::Tensor& q) {
  check_input(t, name, q);
  TORCH_CHECK_VALUE(kernel_layout_ok(t),
                    msg(name, " must have a contiguous last dim, every other stride a multiple "
                              "of 8 elements and a 16-byte aligned start, got strides ",
                        t.strides(), " (the cache is read in place, not copied)"));
}

// An optional (batch) int32 index tensor on q's device, made contiguous.
at::Tensor check_index_array(const std::optional<at::Tensor>& t, const char* name,
                             const at::Tensor& q, int64_t batch) {
  if (!t.has_value()) return at::Tensor();
  return check_seq_array(*t, name, q, batch);
}

// A paged cache's block table: int32 (batch, >= 1) on q's device, rows contiguous (copied
// otherwise); the cache at least one page of one row.
at::Tensor check_block_table(const at::Tensor& t, const at::Tensor& q, int64_t batch,
                             const at::Tensor& k_cache) {
  TORCH_CHECK_VALUE(t.is_cuda() && t.device() == q.device(),
                    msg("block_table must be on ", q.device(), ", got ", t.device()));
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt,
                   msg("block_table must be int32, got ", t.scalar_type()));
  TORCH_CHECK_VALUE(t.dim() == 2 && t.size(0) == batch && t.size(1) >= 1,
                    msg("block_table must have shape (batch, max_num_blocks) = (", batch,
                        ", >= 1), got ", t.sizes()));
  TORCH_CHECK_VALUE(k_cache.size(0) >= 1 && k_cache.size(1) >= 1,
                    msg("a paged k_cache needs at least one page of at least one row, got ",
                        k_cache.sizes()));
  return t.stride(1) == 1 || t.size(1) == 1 ? t : t.contiguous();
}

// The cache pair of fwd_kvcache / fwd_kvcache_varlen (checked by check_cache) against q's heads
// and head dim, and the split count.
void check_cache_pair(const at::Tensor& k_cache, const at::Tensor& v_cache, int64_t num_heads,
                      int64_t head_dim, int64_t num_splits) {
  const int64_t num_heads_k = k_cache.size(2);
  TORCH_CHECK_VALUE(k_cache.sizes() == v_cache.sizes(),
                    msg("k_cache and v_cache must have the same shape, got ", k_cache.sizes(),
                        " and ", v_cache.sizes()));
  TORCH_CHECK_VALUE(k_cache.size(3) == head_dim,
                    msg("k_cache has head dim ", k_cache.size(3), " but q has ", head_dim));
  TORCH_CHECK_VALUE(head_dim % 8 == 0 && head_dim > 0 && head_dim <= 256,
                    msg("head dim must be a positive multiple of 8 and <= 256, got ", head_dim));
  TORCH_CHECK_VALUE(num_heads_k > 0 && num_heads % num_heads_k == 0,
                    msg("nheads of q (", num_heads, ") must be a multiple of nheads of k_cache (",
                        num_heads_k, ")"));
  TORCH_CHECK_VALUE(num_splits >= 0 && num_splits <= 128,
                    msg("num_splits must be 0 (heuristic) or 1 .. 128, got ", num_splits));
}

// The cache fields of p: pointers, strides as (entries or pages, rows, heads) (a size-1 dim is
// only ever indexed at 0), the number of entries (or pages).
void set_cache(flashattn_cu::KvcacheParams& p, const at::Tensor& k_cache,
               const at::Tensor& v_cache) {
  p.k = k_cache.numel() > 0 ? k_cache.data_ptr() : nullptr;
  p.v = v_cache.numel() > 0 ? v_cache.data_ptr() : nullptr;
  set_strides(p.k_batch_stride, p.k_row_stride, p.k_head_stride, k_cache);
  set_strides(p.v_batch_stride, p.v_row_stride, p.v_head_stride, v_cache);
  p.batch_cache = static_cast<int>(k_cache.size(0));
}

// The paged fields of p from a checked block table and the (num_pages, page_size, ...) cache.
void set_block_table(flashattn_cu::KvcacheParams& p, const at::Tensor& block_table,
                     const at::Tensor& k_cache) {
  p.block_table = block_table.data_ptr<int>();
  p.block_table_batch_stride =
      block_table.size(0) == 1 ? block_table.size(1) : block_table.stride(0);
  p.page_size = static_cast<int>(k_cache.size(1));
  p.num_pages = static_cast<int>(k_cache.size(0));
}

// fwd_kvcache's optional append (k_new, v_new) and rotary tables (rotary_cos, rotary_sin), checked
// and in the kernels' layout (k_new / v_new copied if their strides do not suit; the tables
// made contiguous). An empty k_new (seqlen_new 0) appends nothing.
struct AppendArgs {
  at::Tensor k_new, v_new, cos, sin;
};

at::Tensor rotary_table(const at::Tensor& t, const char* name, const at::Tensor& q) {
  TORCH_CHECK_VALUE(t.is_cuda() && t.device() == q.device(),
                    msg(name, " must be on ", q.device(), ", got ", t.device()));
  TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type(),
                   msg(name, " has dtype ", t.scalar_type(), " but q has ", q.scalar_type()));
  TORCH_CHECK_VALUE(t.dim() == 2, msg(name, " must have rank 2 (seqlen_ro, rotary_dim / 2), got "
                                      "shape ", t.sizes()));
  const at::Tensor c = t.contiguous();
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c
                                                             : c.clone(at::MemoryFormat::Contiguous);
}

AppendArgs check_append(const std::optional<at::Tensor>& k_new,
                        const std::optional<at::Tensor>& v_new,
                        const std::optional<at::Tensor>& cos,
                        const std::optional<at::Tensor>& sin, const at::Tensor& q,
                        int64_t batch, int64_t num_heads_k, int64_t head_dim, int64_t seqlen_k) {
  AppendArgs a;
  TORCH_CHECK_VALUE(k_new.has_value() == v_new.has_value(),
                    "flashattn_cu: k_new and v_new must be given together");
  TORCH_CHECK_VALUE(cos.has_value() == sin.has_value(),
                    "flashattn_cu: rotary_cos and rotary_sin must be given together");
  TORCH_CHECK_VALUE(!cos.has_value() || k_new.has_value(),
                    "flashattn_cu: rotary_cos / rotary_sin need k_new and v_new to rotate");
  if (!k_new.has_value()) return a;
  check_input(*k_new, "k_new", q);
  check_input(*v_new, "v_new", q);
  const int64_t seqlen_new = k_new->size(1);
  const std::vector<int64_t> want{batch, seqlen_new, num_heads_k, head_dim};
  for (const at::Tensor* t : {&*k_new, &*v_new}) {
    TORCH_CHECK_VALUE(t->sizes() == at::IntArrayRef(want),
                      msg(t == &*k_new ? "k_new" : "v_new",
                          " must have shape (batch, seqlen_new, nheads_k, headdim) = ",
                          at::IntArrayRef(want), ", got ", t->sizes()));
  }
  TORCH_CHECK_VALUE(seqlen_new <= seqlen_k,
                    msg("k_new has ", seqlen_new, " rows but the cache holds ", seqlen_k,
                        " keys per entry"));
  if (seqlen_new == 0) {
    // The kernel rotates q only on the way of an append; Python's wrapper rotates q itself here.
    TORCH_CHECK_VALUE(!cos.has_value(),
                      "flashattn_cu: rotary_cos / rotary_sin need at least one new row in k_new");
    return a;
  }
  TORCH_CHECK_VALUE(q.size(1) > 0,
                    msg("k_new needs q with at least one query row (the kernel that appends is "
                        "the attention's), got q of shape ", q.sizes()));
  a.k_new = to_kernel_layout(*k_new);
  a.v_new = to_kernel_layout(*v_new);
  if (cos.has_value()) {
    a.cos = rotary_table(*cos, "rotary_cos", q);
    a.sin = rotary_table(*sin, "rotary_sin", q);
    TORCH_CHECK_VALUE(a.cos.sizes() == a.sin.sizes(),
                      msg("rotary_sin has shape ", a.sin.sizes(), " but rotary_cos has ",
                          a.cos.sizes()));
    const int64_t rotary_dim = 2 * a.cos.size(1);
    TORCH_CHECK_VALUE(rotary_dim > 0 && rotary_dim % 16 == 0 && rotary_dim <= head_dim,
                      msg("rotary_dim = 2 * rotary_cos.shape[1] = ", rotary_dim,
                          " must be a positive multiple of 16 and <= headdim ", head_dim));
    TORCH_CHECK_VALUE(a.cos.size(0) >= seqlen_k,
                      msg("rotary_cos has ", a.cos.size(0), " positions; it needs at least the "
                          "cache's ", seqlen_k));
  }
  return a;
}

// Runs fwd_kvcache with its split-KV workspace.
void run_fwd_kvcache(flashattn_cu::KvcacheParams& p, const at::Tensor& q, const char* which) {
  const at::Tensor workspace =
      make_workspace(flashattn_cu::fwd_kvcache_workspace_bytes(p), q, p.workspace);
  check_status(flashattn_cu::fwd_kvcache(p, c10::cuda::getCurrentCUDAStream()), which);
}

// The kvcache forward; cache_seqlens absent (None): every entry holds the whole cache, without an
// append or cache_leftpad (fwd_splitkv's calls, which then launch no fill kernel for lengths).
std::tuple<at::Tensor, at::Tensor> fwd_kvcache_cuda(
    const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const std::optional<at::Tensor>& cache_seqlens_in,
    const std::optional<at::Tensor>& cache_batch_idx_in,
    const std::optional<at::Tensor>& cache_leftpad_in,
    const std::optional<at::Tensor>& block_table_in, double softmax_scale, bool causal,
    int64_t window_left, int64_t window_right, const std::optional<at::Tensor>& alibi,
    double softcap, int64_t num_splits, const std::optional<at::Tensor>& k_new_in,
    const std::optional<at::Tensor>& v_new_in, const std::optional<at::Tensor>& rotary_cos_in,
    const std::optional<at::Tensor>& rotary_sin_in, bool rotary_interleaved) {
  check_window(window_left, window_right);
  check_input(q_in, "q", q_in);
  check_cache(k_cache, "k_cache", q_in);
  check_cache(v_cache, "v_cache", q_in);
  check_scale(softmax_scale);
  check_softcap(softcap, softmax_scale);
  const int64_t batch = q_in.size(0), seqlen_q = q_in.size(1), num_heads = q_in.size(2);
  const int64_t head_dim = q_in.size(3), num_heads_k = k_cache.size(2);
  check_cache_pair(k_cache, v_cache, num_heads, head_dim, num_splits);
  TORCH_CHECK_VALUE(seqlen_q <= flashattn_cu::kMaxSeqlen && batch <= (1 << 30) &&
                        num_heads <= (1 << 30),
                    msg("q's sizes ", q_in.sizes(), " are too large"));
  TORCH_CHECK_VALUE(cache_seqlens_in.has_value() ||
                        (!cache_leftpad_in.has_value() && !k_new_in.has_value() &&
                         !v_new_in.has_value()),
                    "cache_seqlens is required with cache_leftpad or with k / v to append (None "
                    "means every entry holds the whole cache)");
  const at::Tensor cache_seqlens =
      cache_seqlens_in.has_value()
          ? check_seq_array(*cache_seqlens_in, "cache_seqlens", q_in, batch)
          : at::Tensor();
  const at::Tensor cache_batch_idx = check_index_array(cache_batch_idx_in, "cache_batch_idx", q_in, batch);
  const at::Tensor cache_leftpad = check_index_array(cache_leftpad_in, "cache_leftpad", q_in, batch);
  at::Tensor block_table;
  int64_t seqlen_k = k_cache.size(1);
  if (block_table_in.has_value()) {
    TORCH_CHECK_VALUE(!cache_batch_idx.defined(),
                      "flashattn_cu: cache_batch_idx is not supported with a paged cache "
                      "(block_table): index the block table instead");
    block_table = check_block_table(*block_table_in, q_in, batch, k_cache);
    seqlen_k = block_table.size(1) * k_cache.size(1);
  } else if (!cache_batch_idx.defined()) {
    TORCH_CHECK_VALUE(k_cache.size(0) >= batch,
                      msg("k_cache has ", k_cache.size(0), " entries but q has batch ", batch,
                          " (pass cache_batch_idx to pick entries)"));
  }
  TORCH_CHECK_VALUE(seqlen_k <= flashattn_cu::kMaxSeqlen && k_cache.size(0) <= std::numeric_limits<int>::max(),
                    msg("the cache holds ", seqlen_k, " keys per entry; at most ",
                        static_cast<int64_t>(flashattn_cu::kMaxSeqlen), " are supported"));
  const AppendArgs app = check_append(k_new_in, v_new_in, rotary_cos_in, rotary_sin_in, q_in,
                                      batch, num_heads_k, head_dim, seqlen_k);
  const c10::cuda::CUDAGuard guard(q_in.device());

  const at::Tensor q = to_kernel_layout(q_in);
  at::Tensor out = empty_like_layout(q_in);
  at::Tensor lse = at::empty({batch, num_heads, seqlen_q}, q.options().dtype(at::kFloat));
  maybe_poison(out);
  maybe_poison(lse);
  if (out.numel() == 0) return {out, lse};  // check_append: nothing to append either

  flashattn_cu::KvcacheParams p;
  p.q = q.data_ptr();
  p.o = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  set_strides(p.q_batch_stride, p.q_row_stride, p.q_head_stride, q);
  set_strides(p.o_batch_stride, p.o_row_stride, p.o_head_stride, out);
  set_cache(p, k_cache, v_cache);
  const Sizes s{batch, seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim};
  set_sizes(p, s, softmax_scale, causal, q.scalar_type());
  set_window(p, window_left, window_right);
  set_softcap(p, softcap);
  const at::Tensor slopes = set_alibi(p, alibi, q_in, batch, num_heads);
  p.cache_seqlens = cache_seqlens.defined() ? cache_seqlens.data_ptr<int>() : nullptr;
  p.cache_batch_idx = cache_batch_idx.defined() ? cache_batch_idx.data_ptr<int>() : nullptr;
  p.cache_leftpad = cache_leftpad.defined() ? cache_leftpad.data_ptr<int>() : nullptr;
  if (block_table.defined()) set_block_table(p, block_table, k_cache);
  p.num_splits = static_cast<int>(num_splits);
  if (app.k_new.defined()) {
    p.k_new = app.k_new.data_ptr();
    p.v_new = app.v_new.data_ptr();
    p.seqlen_new = static_cast<int>(app.k_new.size(1));
    set_strides(p.knew_batch_stride, p.knew_row_stride, p.knew_head_stride, app.k_new);
    set_strides(p.vnew_batch_stride, p.vnew_row_stride, p.vnew_head_stride, app.v_new);
  }
  if (app.cos.defined()) {
    p.rotary_cos = app.cos.data_ptr();
    p.rotary_sin = app.sin.data_ptr();
    p.rotary_dim = static_cast<int>(2 * app.cos.size(1));
    p.rotary_seqlen = static_cast<int>(std::min<int64_t>(app.cos.size(0), flashattn_cu::kMaxSeqlen));
    p.rotary_interleaved = rotary_interleaved;
  }
  run_fwd_kvcache(p, q, "fwd_kvcache");
  return {out, lse};
}

// flash_attn_func's forward on the split-KV kernel, for calls without autograd whose query rows
// per kv head are few (decoding, speculative steps: flash_attn_interface._split_kv_route): k and
// v as a whole cache, nothing appended, so unlike fwd_kvcache nothing is written to them. Inputs
// in another layout are copied as fwd does.
std::tuple<at::Tensor, at::Tensor> fwd_splitkv_cuda(
    const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v_in, double softmax_scale,
    bool causal, int64_t window_left, int64_t window_right, const std::optional<at::Tensor>& alibi,
    double softcap, int64_t num_splits) {
  check_input(q, "q", q);
  check_input(k_in, "k", q);
  check_input(v_in, "v", q);
  TORCH_CHECK_VALUE(k_in.size(0) == q.size(0) && v_in.sizes() == k_in.sizes(),
                    msg("k and v must have q's batch and the same shape, got q ", q.sizes(),
                        ", k ", k_in.sizes(), ", v ", v_in.sizes()));
  const at::Tensor k = to_kernel_layout(k_in), v = to_kernel_layout(v_in);
  return fwd_kvcache_cuda(q, k, v, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                          softmax_scale, causal, window_left, window_right, alibi, softcap,
                          num_splits, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                          true);
}

// Paged prefill (flash_attn_varlen_func with block_table): varlen q (total_q, nheads, d) with
// cu_seqlens_q against a paged cache (num_pages, page_size, nheads_k, d) through block_table
// (batch, max_pages); sequence b's keys are the first cu_seqlens_k[b + 1] - cu_seqlens_k[b] rows
// of its pages (flashattn_cu.h: KvcacheParams, varlen). Returns (out, lse (nheads, total_q)).
std::tuple<at::Tensor, at::Tensor> fwd_kvcache_varlen_cuda(
    const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
    const at::Tensor& block_table_in, int64_t max_seqlen_q, int64_t max_seqlen_k,
    double softmax_scale, bool causal, int64_t window_left, int64_t window_right,
    const std::optional<at::Tensor>& alibi, double softcap, int64_t num_splits) {
  check_window(window_left, window_right);
  const at::Tensor q4 = varlen_view(q_in, "q");
  check_input(q4, "q", q4);
  check_cache(k_cache, "k_cache", q4);
  check_cache(v_cache, "v_cache", q4);
  check_scale(softmax_scale);
  check_softcap(softcap, softmax_scale);
  const int64_t num_heads = q_in.size(1), head_dim = q_in.size(2);
  const int64_t num_heads_k = k_cache.size(2);
  check_cache_pair(k_cache, v_cache, num_heads, head_dim, num_splits);
  TORCH_CHECK_VALUE(num_heads <= (1 << 30), msg("q's sizes ", q_in.sizes(), " are too large"));
  const VarlenArgs a =
      check_varlen(q_in, cu_seqlens_q, cu_seqlens_k, std::nullopt, max_seqlen_q, max_seqlen_k);
  const at::Tensor block_table = check_block_table(block_table_in, q_in, a.batch, k_cache);
  const int64_t capacity = block_table.size(1) * k_cache.size(1);
  TORCH_CHECK_VALUE(max_seqlen_k <= capacity,
                    msg("block_table has ", block_table.size(1), " pages of ", k_cache.size(1),
                        " rows per sequence (", capacity, " keys) but max_seqlen_k is ",
                        max_seqlen_k, "; it needs at least ceil(max_seqlen_k / page_block_size)"
                        " columns"));
  TORCH_CHECK_VALUE(k_cache.size(0) <= std::numeric_limits<int>::max(),
                    msg("k_cache has ", k_cache.size(0), " pages; at most 2^31 - 1"));
  const c10::cuda::CUDAGuard guard(q_in.device());

  const at::Tensor q = to_kernel_layout(q4);
  at::Tensor out = empty_like_layout(q_in);
  at::Tensor lse = at::empty({num_heads, a.total_q}, q.options().dtype(at::kFloat));
  maybe_poison(out);
  maybe_poison(lse);
  if (out.numel() == 0 || a.batch == 0 || a.max_q == 0) {
    // As fwd_varlen: nothing to launch; rows past every bound are 0 with LSE +inf.
    out.zero_();
    lse.fill_(std::numeric_limits<float>::infinity());
    return {out, lse};
  }
  const at::Tensor out4 = out.unsqueeze(0);

  flashattn_cu::KvcacheParams p;
  p.q = q.data_ptr();
  p.o = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  set_strides(p.q_batch_stride, p.q_row_stride, p.q_head_stride, q);  // a batch of one
  set_strides(p.o_batch_stride, p.o_row_stride, p.o_head_stride, out4);
  set_cache(p, k_cache, v_cache);
  const Sizes s{a.batch, a.max_q, a.max_k, num_heads, num_heads_k, head_dim};
  set_sizes(p, s, softmax_scale, causal, q.scalar_type());
  set_varlen(p, a);
  set_window(p, window_left, window_right);
  set_softcap(p, softcap);
  const at::Tensor slopes = set_alibi(p, alibi, q_in, a.batch, num_heads);
  set_block_table(p, block_table, k_cache);
  p.num_splits = static_cast<int>(num_splits);
  run_fwd_kvcache(p, q, "fwd_kvcache_varlen");
  return {out, lse};
}

std::vector<int64_t> built_archs() {
  int buf[32];
  const int n = flashattn_cu::built_archs(buf, 32);
  return std::vector<int64_t>(buf, buf + std::min(n, 32));
}

std::vector<int64_t> built_head_dims() {
  int buf[32];
  const int n = flashattn_cu::built_head_dims(buf, 32);
  return std::vector<int64_t>(buf, buf + std::min(n, 32));
}

std::vector<int64_t> head_dim_instances() {
  int buf[32];
  const int n = flashattn_cu::head_dim_instances(buf, 32);
  return std::vector<int64_t>(buf, buf + std::min(n, 32));
}

}  // namespace

TORCH_LIBRARY(flashattn_cu, m) {
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, int window_left=-1, "
      "int window_right=-1, Tensor? alibi_slopes=None, float softcap=0.0, float dropout_p=0.0, "
      "bool return_softmax=False, Generator? gen=None) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
      "float softmax_scale, bool causal, bool deterministic, Tensor? softmax_stats=None, "
      "int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None, float softcap=0.0, "
      "float dropout_p=0.0, Tensor? rng_state=None) -> (Tensor, Tensor, Tensor)");
  m.def(
      "fwd_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
      "Tensor? seqused_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal, "
      "int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None, float softcap=0.0, "
      "float dropout_p=0.0, bool return_softmax=False, Generator? gen=None) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "bwd_varlen(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
      "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, "
      "float softmax_scale, bool causal, bool deterministic, Tensor? softmax_stats=None, "
      "int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None, float softcap=0.0, "
      "float dropout_p=0.0, Tensor? rng_state=None) -> (Tensor, Tensor, Tensor)");
  m.def(
      "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? cache_seqlens, "
      "Tensor? cache_batch_idx, Tensor? cache_leftpad, Tensor? block_table, float softmax_scale, "
      "bool causal, int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None, "
      "float softcap=0.0, int num_splits=0, Tensor? k_new=None, Tensor? v_new=None, "
      "Tensor? rotary_cos=None, Tensor? rotary_sin=None, bool rotary_interleaved=True) -> "
      "(Tensor, Tensor)");
  m.def(
      "fwd_splitkv(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, "
      "int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None, float softcap=0.0, "
      "int num_splits=0) -> (Tensor, Tensor)");
  m.def(
      "fwd_kvcache_varlen(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cu_seqlens_q, "
      "Tensor cu_seqlens_k, Tensor block_table, int max_seqlen_q, int max_seqlen_k, "
      "float softmax_scale, bool causal, int window_left=-1, int window_right=-1, "
      "Tensor? alibi_slopes=None, float softcap=0.0, int num_splits=0) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(flashattn_cu, CUDA, m) {
  m.impl("fwd", &fwd_cuda);
  m.impl("bwd", &bwd_cuda);
  m.impl("fwd_varlen", &fwd_varlen_cuda);
  m.impl("bwd_varlen", &bwd_varlen_cuda);
  m.impl("fwd_kvcache", &fwd_kvcache_cuda);
  m.impl("fwd_splitkv", &fwd_splitkv_cuda);
  m.impl("fwd_kvcache_varlen", &fwd_kvcache_varlen_cuda);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "flashattn_cu native extension (ops live in torch.ops.flashattn_cu)";
  m.def("built_archs", &built_archs, "Compute capabilities this build has machine code for");
  m.def("built_head_dims", &built_head_dims, "Head-dim instances compiled into this build");
  m.def("head_dim_instances", &head_dim_instances,
        "Every head-dim instance, built or not; a head dim runs on the smallest one >= it");
  m.def(
      "_round_head_dim", [](int head_dim) { return flashattn_cu::round_head_dim(head_dim); },
      "Test-only: the instance the kernels run `head_dim` on (round_head_dim of head_dims.h)");
  m.def(
      "_set_poison_outputs", [](bool on) { g_poison_outputs.store(on); },
      "Test-only: fill outputs with NaN right after allocation");
  m.def("_poison_outputs", []() { return g_poison_outputs.load(); });
  m.def(
      "_set_kernel_path",
      [](const std::string& path) {
        if (path == "auto") {
          flashattn_cu::set_kernel_path(flashattn_cu::KernelPath::kAuto);
        } else if (path == "sm80") {
          flashattn_cu::set_kernel_path(flashattn_cu::KernelPath::kSm80);
        } else {
          throw std::invalid_argument("_set_kernel_path: path must be 'auto' or 'sm80', got '" +
                                      path + "'");
        }
      },
      "Test/benchmark: 'auto' (fastest kernels for the GPU) or 'sm80' (mma.sync kernels only)");
  m.def(
      "_raise_with_number",
      [](int64_t x) { TORCH_CHECK(false, "flashattn_cu: a message that streams a number: ", x); },
      "Test-only: raises through c10::str's std::ostringstream (crashed when the extension "
      "carried a static copy of libstdc++; setup.py, shared_libstdcxx_link_args)");
  m.def("_kernel_path", []() {
    return std::string(flashattn_cu::kernel_path() == flashattn_cu::KernelPath::kSm80 ? "sm80"
                                                                                      : "auto");
  });
  m.def(
      "_tma_copy_selftest",
      [](const at::Tensor& src, at::Tensor& dst) {
#if FLASHATTN_CU_HAS_SM90A
        TORCH_CHECK_VALUE(src.is_cuda() && dst.is_cuda() && src.device() == dst.device() &&
                              src.dim() == 2 && src.sizes() == dst.sizes() &&
                              src.strides() == dst.strides() && src.stride(1) == 1 &&
                              src.stride(0) % 8 == 0 &&
                              (src.scalar_type() == at::kHalf ||
                               src.scalar_type() == at::kBFloat16) &&
                              dst.scalar_type() == src.scalar_type(),
                          "_tma_copy_selftest: two 2-d CUDA fp16/bf16 tensors of one shape and "
                          "layout, rows contiguous, row stride a multiple of 8");
        const c10::cuda::CUDAGuard guard(src.device());
        check_status(flashattn_cu::sm90::tma_copy_selftest(
                         src.data_ptr(), dst.data_ptr(), src.size(0), src.size(1), src.stride(0),
                         to_dtype(src.scalar_type()), c10::cuda::getCurrentCUDAStream()),
                     "_tma_copy_selftest");
#else
        (void)src;
        (void)dst;
        TORCH_CHECK(false, "_tma_copy_selftest: this build has no sm_90a code");
#endif
      },
      "Test-only: copies src to dst through TMA loads and stores (sm90/selftest.cu)");
}
