// The torch binding (csrc/torch/*.cpp, the only C++ in the project that includes torch): it
// checks tensors, allocates outputs, fills the torch-free params structs and calls
// flashattn_cu::fwd / bwd / fwd_kvcache on the current stream; never synchronizes, never prints.
// This file registers the ops and the pybind11 module; the ops are in attention.cpp and
// kvcache.cpp, their shared checks and setters in binding.h / common.cpp.
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
// (gen, which must be one of q's device, or the device's default) and returns them as rng_state (int64 (2,), written by the
// kernel, so a captured CUDA graph records fresh values at each replay); the backward takes that
// rng_state and regenerates the same mask. S_dmask: flash_attn's return_softmax output
// (flashattn_cu.h, FwdParams::s_dmask), an empty tensor when not asked for.
// softmax_stats (batch, nheads, seqlen_q, 2) fp32 is what bwd needs to recompute the
// probabilities exactly at any logit magnitude (flashattn_cu.h, FwdParams); without it bwd
// works from softmax_lse alone, as flash_attn does.
// plus a pybind11 module (flashattn_cu._C) with build information and a test-only hook.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/extension.h>
#include <torch/library.h>

#include "binding.h"  // the ops (attention.cpp, kvcache.cpp) and helpers (common.cpp)
#include "head_dims.h"  // round_head_dim(), for the test hook _round_head_dim
#if FLASHATTN_CU_HAS_SM90A
#include "sm90/launch.h"  // the test hook _tma_copy_selftest
#endif

namespace flashattn_cu::binding {
namespace {

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
}  // namespace flashattn_cu::binding

using namespace flashattn_cu::binding;

TORCH_LIBRARY(flashattn_cu, m) {
  // The forwards draw dropout's (seed, offset) from torch's CUDA generator: tagged as seeded
  // random ops, as SDPA's flash op, so that torch.compile neither merges two identical calls
  // (two masks) nor recomputes one under activation checkpointing with a fresh offset (its
  // partitioner replays such an op with the generator state it ran with); with a dropout_p
  // known to be 0 the partitioner treats them as deterministic again (its is_rng_op).
  const std::vector<at::Tag> seeded{at::Tag::nondeterministic_seeded};
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, int window_left=-1, "
      "int window_right=-1, Tensor? alibi_slopes=None, float softcap=0.0, float dropout_p=0.0, "
      "bool return_softmax=False, Generator? gen=None) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor)",
      seeded);
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
      "(Tensor, Tensor, Tensor, Tensor, Tensor)",
      seeded);
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

// No op differentiates itself: flash_attn_func and its variants are autograd.Functions over fwd /
// bwd, which call them with grad mode off. Called directly with inputs that require grad, an op's
// outputs get a grad_fn that raises "derivative for flashattn_cu::<op> is not implemented" at
// backward, and forward-mode AD (jvp, forward_ad duals) raises at the call: torch's default
// fallback only warned at backward and gave zero gradients, and zero or no tangents silently
// (flash_attn_with_kvcache, flash_attn_func's split-KV route at decode shapes).
TORCH_LIBRARY_IMPL(flashattn_cu, Autograd, m) {
  for (const char* op : {"fwd", "bwd", "fwd_varlen", "bwd_varlen", "fwd_kvcache", "fwd_splitkv",
                         "fwd_kvcache_varlen"}) {
    m.impl(op, torch::autograd::autogradNotImplementedFallback());
  }
}
// fwd_kvcache writes the caches in place: their version counters move, as autograd expects of a
// mutated tensor.
TORCH_LIBRARY_IMPL(flashattn_cu, ADInplaceOrView, m) {
  m.impl("fwd_kvcache", torch::autograd::autogradNotImplementedInplaceOrViewFallback());
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
      "_set_fwd_causal_schedule",
      [](const std::string& schedule) {
        using flashattn_cu::FwdCausalSchedule;
        if (schedule == "auto") {
          flashattn_cu::set_fwd_causal_schedule(FwdCausalSchedule::kAuto);
        } else if (schedule == "persistent") {
          flashattn_cu::set_fwd_causal_schedule(FwdCausalSchedule::kPersistent);
        } else if (schedule == "per_tile") {
          flashattn_cu::set_fwd_causal_schedule(FwdCausalSchedule::kPerTile);
        } else {
          throw std::invalid_argument(
              "_set_fwd_causal_schedule: schedule must be 'auto', 'persistent' or 'per_tile', "
              "got '" + schedule + "'");
        }
      },
      "Test/benchmark: the sm90a forward's causal schedule: 'auto' (the measured rule), "
      "'persistent' (a CTA per SM walking tiles) or 'per_tile' (a CTA per tile)");
  m.def("_fwd_causal_schedule", []() {
    switch (flashattn_cu::fwd_causal_schedule()) {
      case flashattn_cu::FwdCausalSchedule::kPersistent: return std::string("persistent");
      case flashattn_cu::FwdCausalSchedule::kPerTile: return std::string("per_tile");
      default: return std::string("auto");
    }
  });
  m.def("_set_fwd_dynamic_tiles", [](bool enabled) { flashattn_cu::set_fwd_dynamic_tiles(enabled); },
        "Test/benchmark: whether the sm90a forward may take its dynamic tile scheduler where a "
        "call would run one CTA per tile (default true)");
  m.def("_fwd_dynamic_tiles", []() { return flashattn_cu::fwd_dynamic_tiles(); });
  m.def(
      "_set_fwd_varlen_order",
      [](const std::string& order) {
        using flashattn_cu::FwdVarlenOrder;
        if (order == "heads") {
          flashattn_cu::set_fwd_varlen_order(FwdVarlenOrder::kHeads);
        } else if (order == "blocks") {
          flashattn_cu::set_fwd_varlen_order(FwdVarlenOrder::kBlocks);
        } else {
          throw std::invalid_argument(
              "_set_fwd_varlen_order: order must be 'heads' or 'blocks', got '" + order + "'");
        }
      },
      "Test/benchmark: the sm90a forward's varlen tile order within an entry: 'heads' (head "
      "after head, the default) or 'blocks' (every head's longest query block first)");
  m.def("_fwd_varlen_order", []() {
    return std::string(flashattn_cu::fwd_varlen_order() == flashattn_cu::FwdVarlenOrder::kBlocks
                           ? "blocks"
                           : "heads");
  });
  m.def("_set_bwd_streamed_dq", [](bool enabled) { flashattn_cu::set_bwd_streamed_dq(enabled); },
        "Test/benchmark: whether the sm90a backward converts dQ streamed, block by block as the "
        "main kernel's key tiles finish, or after the main kernel (default false)");
  m.def("_bwd_streamed_dq", []() { return flashattn_cu::bwd_streamed_dq(); });
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
  m.def(
      "_cluster_exchange_selftest",
      [](const at::Tensor& src, at::Tensor& dst, at::Tensor& ranks) {
#if FLASHATTN_CU_HAS_SM90A
        TORCH_CHECK_VALUE(src.is_cuda() && dst.device() == src.device() &&
                              ranks.device() == src.device() && src.dim() == 2 &&
                              src.size(1) == 512 && src.size(0) % 2 == 0 &&
                              src.sizes() == dst.sizes() && src.is_contiguous() &&
                              dst.is_contiguous() && src.scalar_type() == at::kFloat &&
                              dst.scalar_type() == at::kFloat && ranks.is_contiguous() &&
                              ranks.scalar_type() == at::kInt && ranks.dim() == 1 &&
                              ranks.size(0) == src.size(0),
                          "_cluster_exchange_selftest: contiguous CUDA float32 src / dst of "
                          "shape (even blocks, 512) and int32 ranks (blocks,)");
        const c10::cuda::CUDAGuard guard(src.device());
        check_status(flashattn_cu::sm90::cluster_exchange_selftest(
                         src.data_ptr<float>(), dst.data_ptr<float>(), ranks.data_ptr<int>(),
                         src.size(0), c10::cuda::getCurrentCUDAStream()),
                     "_cluster_exchange_selftest");
#else
        (void)src;
        (void)dst;
        (void)ranks;
        TORCH_CHECK(false, "_cluster_exchange_selftest: this build has no sm_90a code");
#endif
      },
      "Test-only: each block of src to its cluster partner's block of dst through distributed "
      "shared memory (sm90/selftest.cu)");
}
