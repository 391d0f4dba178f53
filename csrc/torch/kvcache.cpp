// The KV-cache ops: fwd_kvcache (flash_attn_with_kvcache), fwd_splitkv (flash_attn_func's
// inference calls on the split-KV kernels) and fwd_kvcache_varlen (flash_attn_varlen_func with
// block_table); binding.h has the helpers, flashattn_cu.cpp the schemas.
#include <limits>

#include <ATen/MemoryOverlap.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>  // at::cuda::getCurrentCUDAStream is this, without cuBLAS/cuSPARSE headers

#include "binding.h"

namespace flashattn_cu::binding {

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
  // Read in place when its rows are contiguous and do not overlap; copied otherwise (e.g. one
  // row expanded over the batch, stride 0: entries that share a prompt's pages).
  const bool rows_ok = (t.stride(1) == 1 || t.size(1) == 1) &&
                       (t.size(0) == 1 || t.stride(0) >= t.size(1));
  return rows_ok ? t : t.contiguous();
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
  TORCH_CHECK_VALUE(num_heads_k > 0 && num_heads > 0 && num_heads % num_heads_k == 0,
                    msg("nheads of q (", num_heads, ") must be a positive multiple of nheads of "
                        "k_cache (", num_heads_k, ")"));
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
  p.workspace_bytes = flashattn_cu::fwd_kvcache_workspace_bytes(p);
  const at::Tensor workspace = make_workspace(p.workspace_bytes, q, p.workspace);
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
                    msg("cache_seqlens is required with cache_leftpad or with k / v to append "
                        "(None means every entry holds the whole cache)"));
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
  if (app.k_new.defined()) {
    // The append writes the caches in place: elements sharing memory (an expanded cache) would
    // take several entries' rows in a race, and k_cache sharing v_cache's both.
    for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{k_cache, "k_cache"},
                                  {v_cache, "v_cache"}}) {
      TORCH_CHECK_VALUE(at::has_internal_overlap(t) != at::MemOverlap::Yes,
                        msg(name, " has elements that share memory (strides ", t.strides(),
                            "); k_new / v_new are written into it in place"));
    }
    const at::MemOverlapStatus both = at::get_overlap_status(k_cache, v_cache);
    TORCH_CHECK_VALUE(both != at::MemOverlapStatus::Full && both != at::MemOverlapStatus::Partial,
                      "flashattn_cu: k_cache and v_cache share memory; k_new / v_new are written "
                      "into them in place");
  }
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
    check_varlen_bounds(a, 0, "fwd_kvcache_varlen");  // paged keys: no row bound
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

}  // namespace flashattn_cu::binding
