// The attention ops: fwd / bwd (padded batch) and fwd_varlen / bwd_varlen (flash_attn's
// packed layout); binding.h has the helpers, flashattn_cu.cpp the schemas.
#include <limits>
#include <vector>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>  // at::cuda::getCurrentCUDAStream is this, without cuBLAS/cuSPARSE headers

#include "binding.h"

namespace flashattn_cu::binding {
namespace {

// The backward's out (q's shape; its dtype and device checked by the caller), dout (an incoming
// gradient: q's shape and device, any layout, e.g. the stride-0 expand of out.sum()), and the
// forward's row statistics: softmax_lse of lse_shape, softmax_stats of lse_shape + (2,).
void check_bwd_inputs(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& out,
                      const at::Tensor& lse, const std::optional<at::Tensor>& stats,
                      std::vector<int64_t> lse_shape) {
  TORCH_CHECK_VALUE(out.sizes() == q.sizes(),
                    msg("out must have the shape of q ", q.sizes(), ", got ", out.sizes()));
  TORCH_CHECK_VALUE(dout.is_cuda() && dout.device() == q.device(),
                    msg("dout must be on ", q.device(), ", got ", dout.device()));
  TORCH_CHECK_VALUE(dout.sizes() == q.sizes(),
                    msg("dout must have the shape of q ", q.sizes(), ", got ", dout.sizes()));
  check_row_tensor(lse, "softmax_lse", q, lse_shape);
  if (stats.has_value()) {
    lse_shape.push_back(2);
    check_row_tensor(*stats, "softmax_stats", q, lse_shape);
  }
}

}  // namespace

FwdResult fwd_cuda(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                   double softmax_scale, bool causal, int64_t window_left, int64_t window_right,
                   const std::optional<at::Tensor>& alibi, double softcap, double dropout_p,
                   bool return_softmax, const std::optional<at::Generator>& gen) {
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
  p.workspace_bytes = flashattn_cu::fwd_workspace_bytes(p);
  const at::Tensor workspace = make_workspace(p.workspace_bytes, q, p.workspace);
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
  t.lse = contiguous_aligned(lse_in);
  t.stats = stats_in.has_value() ? contiguous_aligned(*stats_in) : at::Tensor();
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

// Allocates the workspace p needs (poisoned when asked) and runs bwd() on the current stream.
void run_bwd(flashattn_cu::BwdParams& p, const at::Tensor& like, const char* which) {
  p.workspace_bytes = flashattn_cu::bwd_workspace_bytes(p);
  const at::Tensor workspace = make_workspace(p.workspace_bytes, like, p.workspace);
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
  check_bwd_inputs(dout_in, q_in, out_in, lse_in, stats_in, {s.batch, s.num_heads, s.seqlen_q});
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
    check_varlen_bounds(a, k_in.size(0), "fwd_varlen");
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
  p.workspace_bytes = flashattn_cu::fwd_workspace_bytes(p);
  const at::Tensor workspace = make_workspace(p.workspace_bytes, q, p.workspace);
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
  check_bwd_inputs(dout_in, q_in, out_in, lse_in, stats_in, {s.num_heads, a.total_q});
  const c10::cuda::CUDAGuard guard(q_in.device());

  const BwdTensors t = bwd_tensors(dout_in, q_in, k_in, v_in, out_in, lse_in, stats_in);
  // Rows of entries whose length is 0 on the other side are written by the kernels (as zeros);
  // with no rows or no bounds on one side at all, nothing is launched.
  if (a.batch == 0 || a.total_q == 0 || t.k.size(0) == 0 || a.max_q == 0 || a.max_k == 0) {
    t.dq.zero_();
    t.dk.zero_();
    t.dv.zero_();
    check_varlen_bounds(a, t.k.size(0), "bwd_varlen");
    return {t.dq, t.dk, t.dv};
  }

  flashattn_cu::BwdParams p;
  set_bwd_tensors(p, t, /*varlen=*/true);  // batch strides 0: a batch of one
  set_sizes(p, s, softmax_scale, causal, t.q.scalar_type());
  set_varlen(p, a);
  // k's rows: the backward's preprocess zeroes dk / dv rows past the last entry (seqlen.h).
  p.total_k = t.k.size(0) <= std::numeric_limits<int>::max() ? static_cast<int>(t.k.size(0)) : 0;
  set_window(p, window_left, window_right);
  set_softcap(p, softcap);
  const at::Tensor slopes = set_alibi(p, alibi, q_in, a.batch, s.num_heads);
  set_bwd_dropout(p, dropout_p, rng_state, q_in);
  p.deterministic = deterministic;
  run_bwd(p, t.q, "bwd_varlen");
  return {t.dq, t.dk, t.dv};
}

}  // namespace flashattn_cu::binding
