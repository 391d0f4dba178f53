// The torch binding's shared pieces (csrc/torch/*.cpp, the only C++ in the project that
// includes torch): messages, tensor checks and layouts, the params setters every op uses, and the
// ops' implementations (attention.cpp: fwd / bwd and their varlen forms; kvcache.cpp:
// fwd_kvcache, fwd_splitkv, fwd_kvcache_varlen), registered in flashattn_cu.cpp. The
// definitions of the non-template helpers are in common.cpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include <ATen/ATen.h>

#include "flashattn_cu/flashattn_cu.h"

namespace flashattn_cu::binding {

// Test-only: when set, every output and the backward workspace is filled with NaN / 0xFF bytes
// right after allocation (on the stream, asynchronously), so an element the kernels fail to
// write shows up as NaN instead of as whatever the caching allocator handed back.
extern std::atomic<bool> g_poison_outputs;

void maybe_poison(at::Tensor& t);

flashattn_cu::DType to_dtype(at::ScalarType t);

// Error messages are built here with std::to_string / snprintf and handed to TORCH_CHECK* as one
// std::string, never streamed: on the H200 image (g++ 13.3 against torch 2.11.0+cu130) a message
// that streams a number through c10::str's std::ostringstream crashed the process (SIGSEGV)
// instead of raising; see benchmarks/NOTES.md, "TORCH_CHECK crash", for the diagnosis.
std::string text(const char* s);
std::string text(const std::string& s);
std::string text(int64_t v);
std::string text(int v);
std::string text(double v);
std::string text(at::ScalarType t);
std::string text(const c10::Device& d);
std::string text(at::IntArrayRef v);

template <typename... Parts>
std::string msg(const Parts&... parts) {
  std::string s = "flashattn_cu: ";
  ((s += text(parts)), ...);
  return s;
}

void check_input(const at::Tensor& t, const char* name, const at::Tensor& ref);

// The kernels need every non-last stride to be a multiple of 8 elements (16 bytes) and a 16-byte
// aligned base pointer. Anything else is still a valid tensor, so copy it rather than fail. Dims
// of size 1 never index past 0, so their stride does not matter (and is passed as 0).
bool kernel_layout_ok(const at::Tensor& t);

at::Tensor to_kernel_layout(const at::Tensor& t);

// A fresh tensor for an output or gradient with t's shape: t's strides where t is dense and they
// suit the kernels (the layout of flash_attn's `torch.empty_like(q)`, which is also what SDPA's
// meta functions give and what compiled graphs assert), contiguous otherwise. Decided from sizes
// and strides alone, so the fake implementations (flash_attn_interface.py) decide alike.
at::Tensor empty_like_layout(const at::Tensor& t);

// Stride of dim `i` as the kernels see it (elements; 0 for a size-1 dim).
int64_t kstride(const at::Tensor& t, int i);

// The (batch, row, head) strides of a (batch, seqlen, heads, head_dim) tensor.
void set_strides(int64_t& batch_stride, int64_t& row_stride, int64_t& head_stride,
                 const at::Tensor& t);

// A varlen tensor (total, heads, head_dim) as the kernels see it: a batch of one, so its batch
// stride is 0 (kstride of a size-1 dim) and the kernels offset rows by cu_seqlens instead.
at::Tensor as_batch(const at::Tensor& t, bool varlen);

// The pointers and strides of fwd()'s tensors; k and v are null when empty.
void set_fwd_tensors(flashattn_cu::FwdParams& p, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                     const at::Tensor& stats, bool varlen);

struct Sizes {
  int64_t batch, seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim;
};

// Checks q, k, v against each other and returns their sizes.
Sizes check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// The kernels take the scale as a float and flush subnormals: a double that is positive and
// finite can still become 0 (1e-50) or inf (1e39) there.
void check_scale(double softmax_scale);

// softcap: 0 (none), or a positive normal float32 with softmax_scale / softcap finite
// (flashattn_cu.h, AttnParams::softcap).
void check_softcap(double softcap, double softmax_scale);

template <typename P>
void set_softcap(P& p, double softcap) {
  p.softcap = static_cast<float>(softcap);
}

void check_status(flashattn_cu::Status st, const char* which);

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
                      at::IntArrayRef shape);

// window_left / window_right: flashattn_cu.h, AttnParams (-1: unbounded).
void check_window(int64_t window_left, int64_t window_right);

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
void check_dropout(double dropout_p, bool return_softmax);

// The forward's dropout outputs: rng_state int64 (2,) with dropout (written by the kernel), else
// empty (0,) (nothing to write, and no uninitialised values to compare: flash_attn returns an
// unwritten (2,) there); S_dmask (batch, nheads, seqlen_q, seqlen_k rounded up to 128) in q's
// dtype when asked for, else empty (0,).
struct DropoutOutputs {
  at::Tensor rng_state, s_dmask;
};

DropoutOutputs dropout_outputs(const at::Tensor& q, int64_t batch, int64_t num_heads,
                               int64_t seqlen_q, int64_t seqlen_k, double dropout_p,
                               bool return_softmax);

// Dropout's random state: `increment` counter values of the CUDA generator (gen, or the default
// generator of q's device) under its mutex, as torch's own dropout does; under CUDA graph capture
// the generator hands out device pointers that each replay refreshes, read by the kernel
// (flashattn_cu.h, AttnParams::philox_*).
void set_dropout(flashattn_cu::FwdParams& p, double dropout_p, const DropoutOutputs& d,
                 const std::optional<at::Generator>& gen, const at::Tensor& q);

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

// A scratch buffer of `bytes` on like's device for a params struct's `workspace` (poisoned when
// asked; left null for 0 bytes); the caller keeps the tensor alive across the call. The caching
// allocator hands out 512-byte aligned blocks, more than the 256 bwd() needs.
at::Tensor make_workspace(size_t bytes, const at::Tensor& like, void*& workspace_ptr);

// Checks a (total, heads, d) varlen tensor and returns it viewed as (1, total, heads, d).
at::Tensor varlen_view(const at::Tensor& t, const char* name);

// A cu_seqlens / seqused tensor: int32, 1-d of `n` elements, on q's device. Made contiguous.
at::Tensor check_seq_array(const at::Tensor& t, const char* name, const at::Tensor& q, int64_t n);

struct VarlenArgs {
  at::Tensor cu_q, cu_k, seqused_k;
  int64_t batch, max_q, max_k, total_q;
};

// t contiguous and 16-byte aligned, as the kernels read the row statistics (softmax_lse,
// softmax_stats): a contiguous view at another offset is copied rather than refused.
at::Tensor contiguous_aligned(const at::Tensor& t);

VarlenArgs check_varlen(const at::Tensor& q, const at::Tensor& cu_q, const at::Tensor& cu_k,
                        const std::optional<at::Tensor>& seqused_k, int64_t max_q, int64_t max_k);

// For a varlen call that launches no kernel (max_seqlen_q 0, ...): its cu_seqlens checked against
// the bounds on the GPU all the same (flashattn_cu::check_varlen_seqlens; a contradiction traps),
// so that rows cu_seqlens gives are never silently left at zero. total_k 0: not a bound.
void check_varlen_bounds(const VarlenArgs& a, int64_t total_k, const char* which);

template <typename P>
void set_varlen(P& p, const VarlenArgs& a) {
  p.batch = static_cast<int>(a.batch);
  p.seqlen_q = static_cast<int>(a.max_q);
  p.seqlen_k = static_cast<int>(a.max_k);
  p.total_q = static_cast<int>(a.total_q);
  p.cu_seqlens_q = a.cu_q.data_ptr<int>();
  p.cu_seqlens_k = a.cu_k.data_ptr<int>();
}

// ---------------------------------------------------------------------------------------------
// The ops (schemas in flashattn_cu.cpp).

FwdResult fwd_cuda(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                   double softmax_scale, bool causal, int64_t window_left, int64_t window_right,
                   const std::optional<at::Tensor>& alibi, double softcap, double dropout_p,
                   bool return_softmax, const std::optional<at::Generator>& gen);

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cuda(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& v_in, const at::Tensor& out_in, const at::Tensor& lse_in,
    double softmax_scale, bool causal, bool deterministic,
    const std::optional<at::Tensor>& stats_in, int64_t window_left, int64_t window_right,
    const std::optional<at::Tensor>& alibi, double softcap, double dropout_p,
    const std::optional<at::Tensor>& rng_state);

FwdResult fwd_varlen_cuda(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
    const std::optional<at::Tensor>& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
    double softmax_scale, bool causal, int64_t window_left, int64_t window_right,
    const std::optional<at::Tensor>& alibi, double softcap, double dropout_p, bool return_softmax,
    const std::optional<at::Generator>& gen);

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_varlen_cuda(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& v_in, const at::Tensor& out_in, const at::Tensor& lse_in,
    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, double softmax_scale, bool causal, bool deterministic,
    const std::optional<at::Tensor>& stats_in, int64_t window_left, int64_t window_right,
    const std::optional<at::Tensor>& alibi, double softcap, double dropout_p,
    const std::optional<at::Tensor>& rng_state);

std::tuple<at::Tensor, at::Tensor> fwd_kvcache_cuda(
    const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const std::optional<at::Tensor>& cache_seqlens_in,
    const std::optional<at::Tensor>& cache_batch_idx_in,
    const std::optional<at::Tensor>& cache_leftpad_in,
    const std::optional<at::Tensor>& block_table_in, double softmax_scale, bool causal,
    int64_t window_left, int64_t window_right, const std::optional<at::Tensor>& alibi,
    double softcap, int64_t num_splits, const std::optional<at::Tensor>& k_new_in,
    const std::optional<at::Tensor>& v_new_in, const std::optional<at::Tensor>& rotary_cos_in,
    const std::optional<at::Tensor>& rotary_sin_in, bool rotary_interleaved);

std::tuple<at::Tensor, at::Tensor> fwd_splitkv_cuda(
    const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v_in, double softmax_scale,
    bool causal, int64_t window_left, int64_t window_right, const std::optional<at::Tensor>& alibi,
    double softcap, int64_t num_splits);

std::tuple<at::Tensor, at::Tensor> fwd_kvcache_varlen_cuda(
    const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
    const at::Tensor& block_table_in, int64_t max_seqlen_q, int64_t max_seqlen_k,
    double softmax_scale, bool causal, int64_t window_left, int64_t window_right,
    const std::optional<at::Tensor>& alibi, double softcap, int64_t num_splits);

}  // namespace flashattn_cu::binding
