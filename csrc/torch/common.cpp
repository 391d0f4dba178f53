// The torch binding's shared helpers (binding.h declares and documents them).
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>

#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAStream.h>

#include "binding.h"

namespace flashattn_cu::binding {

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

at::Tensor empty_like_layout(const at::Tensor& t) {
  bool keep = t.is_non_overlapping_and_dense() && (t.size(-1) <= 1 || t.stride(-1) == 1);
  for (int i = 0; keep && i < t.dim() - 1; ++i) {
    keep = t.size(i) <= 1 || t.stride(i) % 8 == 0;
  }
  return keep ? at::empty_strided(t.sizes(), t.strides(), t.options())
              : at::empty(t.sizes(), t.options());
}

int64_t kstride(const at::Tensor& t, int i) { return t.size(i) == 1 ? 0 : t.stride(i); }

void set_strides(int64_t& batch_stride, int64_t& row_stride, int64_t& head_stride,
                 const at::Tensor& t) {
  batch_stride = kstride(t, 0);
  row_stride = kstride(t, 1);
  head_stride = kstride(t, 2);
}

at::Tensor as_batch(const at::Tensor& t, bool varlen) { return varlen ? t.unsqueeze(0) : t; }

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
  TORCH_CHECK_VALUE(s.num_heads_k > 0 && s.num_heads > 0 && s.num_heads % s.num_heads_k == 0,
                    msg("nheads of q (", s.num_heads, ") must be a positive multiple of nheads of "
                        "k/v (", s.num_heads_k, ")"));
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

void check_scale(double softmax_scale) {
  // The kernels scale by softmax_scale * log2(e) in float32: finite below ~2.36e38.
  const float as_float = softmax_scale > 0 && softmax_scale < 2.3e38
                             ? static_cast<float>(softmax_scale)
                             : std::numeric_limits<float>::infinity();
  TORCH_CHECK_VALUE(std::isnormal(as_float) && as_float > 0.f,
                    msg("softmax_scale must be a positive number that is a normal float32 "
                        "below 2.3e38 (about 1.2e-38 to 2.3e38; the kernels compute in float32 "
                        "with softmax_scale * log2(e)), got ",
                        softmax_scale));
}

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

void check_status(flashattn_cu::Status st, const char* which) {
  if (st == flashattn_cu::Status::kSuccess) return;
  const cudaError_t err = flashattn_cu::last_cuda_error();
  // Past this binding's checks, an invalid argument from the library is most likely a launch it
  // cannot make: a grid of more than 2^31 - 1 thread blocks.
  const char* hint =
      st == flashattn_cu::Status::kInvalidArgument
          ? "; the arguments passed their checks, so most likely a kernel's grid would exceed "
            "2^31 - 1 thread blocks: batch x heads x the blocks of the longest sequence (a "
            "varlen batch of many entries with one very long one); split the batch"
          : "";
  TORCH_CHECK(false, msg(which, " failed: ", flashattn_cu::status_string(st), " (CUDA: ",
                         cudaGetErrorString(err), ")", hint));
}

void check_row_tensor(const at::Tensor& t, const char* name, const at::Tensor& q,
                      at::IntArrayRef shape) {
  TORCH_CHECK_VALUE(t.is_cuda() && t.device() == q.device(),
                    msg(name, " must be on ", q.device(), ", got ", t.device()));
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat,
                   msg(name, " must be float32, got ", t.scalar_type()));
  TORCH_CHECK_VALUE(t.sizes() == shape, msg(name, " must have shape ", shape, ", got ", t.sizes()));
}

void check_window(int64_t window_left, int64_t window_right) {
  TORCH_CHECK_VALUE(window_left >= -1 && window_right >= -1 &&
                        window_left <= std::numeric_limits<int>::max() &&
                        window_right <= std::numeric_limits<int>::max(),
                    msg("window sizes must be -1 (unbounded) or in [0, 2^31), got (", window_left,
                        ", ", window_right, ")"));
}

void check_dropout(double dropout_p, bool return_softmax) {
  TORCH_CHECK_VALUE(dropout_p >= 0.0 && dropout_p < 1.0,
                    msg("dropout_p must be a probability in [0, 1), got ", dropout_p));
  TORCH_CHECK_VALUE(!return_softmax || dropout_p > 0.0,
                    msg("return_softmax=True returns the dropout mask and needs dropout_p > 0 "
                        "(as flash_attn), got dropout_p=", dropout_p));
}

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

void set_dropout(flashattn_cu::FwdParams& p, double dropout_p, const DropoutOutputs& d,
                 const std::optional<at::Generator>& gen, const at::Tensor& q) {
  if (dropout_p == 0.0) return;
  p.dropout_p = static_cast<float>(dropout_p);
  p.rng_state = reinterpret_cast<uint64_t*>(d.rng_state.data_ptr<int64_t>());
  p.s_dmask = d.s_dmask.numel() > 0 ? d.s_dmask.data_ptr() : nullptr;
  // A generator of another GPU would be read (and advanced) for this call's mask.
  if (gen.has_value() && gen->defined() && gen->device().is_cuda()) {
    const int index = gen->device().index();
    TORCH_CHECK_VALUE(index < 0 || index == q.device().index(),
                      msg("gen must be a generator of q's device (", q.device(),
                          "), got one of ", gen->device()));
  }
  auto* g = at::get_generator_or_default<at::CUDAGeneratorImpl>(
      gen, at::cuda::detail::getDefaultCUDAGenerator(q.device().index()));
  // Four offsets a (batch entry, query head): one Philox counter each (common/philox.h).
  const uint64_t increment =
      4 * static_cast<uint64_t>(p.batch) * static_cast<uint64_t>(p.num_heads);
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

at::Tensor make_workspace(size_t bytes, const at::Tensor& like, void*& workspace_ptr) {
  at::Tensor workspace;
  if (bytes > 0) {
    workspace = at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
    maybe_poison(workspace);
    workspace_ptr = workspace.data_ptr();
  }
  return workspace;
}

at::Tensor varlen_view(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.dim() == 3, msg(name, " must have rank 3 (total_tokens, nheads, headdim) "
                                      "for the varlen functions, got shape ", t.sizes()));
  return t.unsqueeze(0);
}

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

at::Tensor contiguous_aligned(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  if (c.numel() > 0 && reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 != 0) {
    c = c.clone(at::MemoryFormat::Contiguous);  // a fresh allocation: 16-byte aligned
  }
  return c;
}

void check_varlen_bounds(const VarlenArgs& a, int64_t total_k, const char* which) {
  if (a.batch <= 0) return;
  flashattn_cu::AttnParams p;
  p.batch = static_cast<int>(a.batch);
  p.seqlen_q = static_cast<int>(a.max_q);
  p.seqlen_k = static_cast<int>(a.max_k);
  p.total_q = static_cast<int>(a.total_q);
  p.total_k = total_k <= std::numeric_limits<int>::max() ? static_cast<int>(total_k) : 0;
  p.cu_seqlens_q = a.cu_q.data_ptr<int>();
  p.cu_seqlens_k = a.cu_k.data_ptr<int>();
  check_status(flashattn_cu::check_varlen_seqlens(p, c10::cuda::getCurrentCUDAStream()), which);
}

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

}  // namespace flashattn_cu::binding
