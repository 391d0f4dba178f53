// What dispatch.cu and dispatch_kvcache.cu share: the device query, the argument rules common to
// every entry point, the compiled head-dim instances and the one function that turns a call's
// dtype and head dim into a kernel instance, the kernel-path switch. Torch-free; internal to the
// library (namespace detail).
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashattn_cu/flashattn_cu.h"
#include "fwd/combine_launch.h"
#include "head_dims.h"
#include "problem/score_mod.h"
#include "switches.h"
#include "tiles.h"


#ifndef FLASHATTN_CU_BUILT_ARCHS
#define FLASHATTN_CU_BUILT_ARCHS 80
#endif
// setup.py defines it when sm_90a machine code is built (the sm90/ instances then exist).
#ifndef FLASHATTN_CU_HAS_SM90A
#define FLASHATTN_CU_HAS_SM90A 0
#endif
// The head-dim instances compiled in (FLASHATTN_CU_HEAD_DIMS of setup.py / CMakeLists.txt), an
// int array initializer such as 64,128; every instance of head_dims.h when absent.
#ifndef FLASHATTN_CU_BUILT_HEAD_DIMS
#define FLASHATTN_CU_BUILT_HEAD_DIMS FLASHATTN_CU_HEAD_DIM_INSTANCES
#endif

namespace flashattn_cu::detail {

inline thread_local cudaError_t g_last_error = cudaSuccess;

struct DeviceInfo {
  int major = 0;
  int minor = 0;
  int smem_optin = 0;
  int sm_count = 0;
};

inline Status query_device(DeviceInfo* info) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&info->major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&info->minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&info->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&info->sm_count, cudaDevAttrMultiProcessorCount, device);
  }
  if (err != cudaSuccess) {
    g_last_error = err;
    return Status::kLaunchFailed;
  }
  return info->major >= 8 ? Status::kSuccess : Status::kUnsupportedDevice;
}

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// A tensor with elements needs a non-null, 16-byte aligned pointer; an empty one may have any
// (it is never dereferenced). The one rule for every pointer of fwd() and bwd().
inline bool pointer_ok(const void* ptr, bool has_elements) {
  return has_elements ? ptr != nullptr && aligned16(ptr) : ptr == nullptr || aligned16(ptr);
}

// The workspace of a call that needs `need` bytes: given (and aligned) when it needs any, and
// not smaller than that where the caller states its size (`given` nonzero).
inline bool workspace_ok(const void* workspace, size_t given, size_t need) {
  return need == 0 || (pointer_ok(workspace, true) && (given == 0 || given >= need));
}

// Whether q/o/dout/dq/lse (rows of seqlen_q) and k/v/dk/dv (rows of seqlen_k) have elements.
template <typename Params>
bool has_q_rows(const Params& p) {
  return p.batch > 0 && p.seqlen_q > 0 && (p.cu_seqlens_q == nullptr || p.total_q > 0);
}
template <typename Params>
bool has_k_rows(const Params& p) { return p.batch > 0 && p.seqlen_k > 0; }

// A call that launches no tile (or, backward, no preprocess): its cu_seqlens checked on the
// GPU all the same and its varlen rows outside every entry cleared by their own kernels, as the
// kernels' start would have done (problem/seqlen.h varlen_kernel_start). No launch without
// sequence arrays.
template <typename Params>
Status varlen_without_tiles(const Params& p, cudaStream_t stream) {
  const Status st = check_varlen_seqlens(p, stream);
  return st != Status::kSuccess ? st : forward::clear_outside_rows_of(p, stream);
}

// Every stride non-negative (0: a broadcast input) and a multiple of 8 elements (16 bytes).
inline bool strides_ok(std::initializer_list<int64_t> strides) {
  for (int64_t s : strides) {
    if (s < 0 || s % 8 != 0) return false;
  }
  return true;
}

// Whether a written (n0, n1, n2, n3) tensor with strides (s0, s1, s2, 1) puts every element in
// a place of its own (no two threads' stores race to one address): its dims of more than one
// element, in the order of their strides, each stride past the extent of the dims before it.
inline bool writes_do_not_overlap(int64_t n0, int64_t s0, int64_t n1, int64_t s1, int64_t n2,
                                  int64_t s2, int64_t n3) {
  std::pair<int64_t, int64_t> dims[4] = {{s0, n0}, {s1, n1}, {s2, n2}, {1, n3}};
  std::sort(dims, dims + 4);
  int64_t extent = 1;  // 1 + the largest offset of the dims so far
  for (const auto& [stride, size] : dims) {
    if (size <= 1) continue;
    if (stride < extent) return false;
    if (size - 1 > (INT64_MAX - extent) / stride) return true;  // past any memory
    extent += (size - 1) * stride;
  }
  return true;
}

constexpr int kBuiltHeadDims[] = {FLASHATTN_CU_BUILT_HEAD_DIMS};
constexpr int kNumBuiltHeadDims =
    static_cast<int>(sizeof(kBuiltHeadDims) / sizeof(kBuiltHeadDims[0]));

constexpr bool built_head_dims_ok() {
  for (int i = 0; i < kNumBuiltHeadDims; ++i) {
    if (!is_head_dim_instance(kBuiltHeadDims[i])) return false;
    if (i > 0 && kBuiltHeadDims[i] <= kBuiltHeadDims[i - 1]) return false;
  }
  return true;
}
static_assert(built_head_dims_ok(),
              "FLASHATTN_CU_BUILT_HEAD_DIMS: ascending instances of head_dims.h");

// Whether head_dim runs on an instance this build compiled.
inline bool head_dim_built(int head_dim) {
  const int rounded = round_head_dim(head_dim);
  for (int i = 0; i < kNumBuiltHeadDims; ++i) {
    if (kBuiltHeadDims[i] == rounded) return true;
  }
  return false;
}

// Checks shared by fwd() and bwd(); the torch binding checks the same things first with
// messages that name the argument, so these fire only for direct C++ callers.
template <typename Params>
Status check_common(const Params& p) {
  if (p.batch < 0 || p.seqlen_q < 0 || p.seqlen_k < 0 || p.num_heads <= 0 ||
      p.num_heads_k <= 0 || p.num_heads % p.num_heads_k != 0 || p.seqlen_q > kMaxSeqlen ||
      p.seqlen_k > kMaxSeqlen) {
    return Status::kInvalidArgument;
  }
  // Refused before anything runs (fwd_kvcache() appends before its kernel's dispatch).
  if (p.head_dim <= 0 || p.head_dim > 256 || p.head_dim % 8 != 0 || !head_dim_built(p.head_dim)) {
    return Status::kUnsupportedHeadDim;
  }
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return Status::kInvalidArgument;
  // softmax_scale: positive and normal, with softmax_scale * log2(e) finite (the kernels' unit).
  if (!(p.softmax_scale > 0.f) || !std::isnormal(p.softmax_scale) ||
      !std::isfinite(p.softmax_scale * kLog2e)) {
    return Status::kInvalidArgument;
  }
  if (p.window_left < -1 || p.window_right < -1) return Status::kInvalidArgument;
  // ALiBi slopes: float-aligned, the batch stride 0 (one slope per head) or positive.
  if (reinterpret_cast<uintptr_t>(p.alibi_slopes) % 4 != 0 || p.alibi_slopes_batch_stride < 0) {
    return Status::kInvalidArgument;
  }
  // Softcap: 0 (none) or positive and normal, with finite softmax_scale / softcap and
  // softcap * log2(e) (problem/score_mod.h).
  if (p.softcap != 0.f &&
      (!(p.softcap > 0.f) || !std::isnormal(p.softcap) ||
       !std::isfinite(p.softmax_scale / p.softcap) || !std::isfinite(p.softcap * kLog2e))) {
    return Status::kInvalidArgument;
  }
  // Dropout: 0 <= dropout_p < 1 (NaN fails both), philox_offset a multiple of 4 (flashattn_cu.h);
  // the forward's optional outputs 8- and 16-byte aligned (flashattn_cu.h: rng_state, s_dmask).
  if (!(p.dropout_p >= 0.f && p.dropout_p < 1.f) ||
      (p.dropout_p > 0.f && p.philox_offset % 4 != 0) ||
      reinterpret_cast<uintptr_t>(p.philox_seed_ptr) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(p.philox_offset_ptr) % 8 != 0) {
    return Status::kInvalidArgument;
  }
  if constexpr (std::is_same_v<Params, FwdParams>) {
    if (reinterpret_cast<uintptr_t>(p.rng_state) % 8 != 0 || !pointer_ok(p.s_dmask, false)) {
      return Status::kInvalidArgument;
    }
    // o is written: its rows, heads and columns each in a place of their own.
    const bool packed_rows = p.cu_seqlens_q != nullptr;
    if (!writes_do_not_overlap(packed_rows ? 1 : p.batch, p.o_batch_stride,
                               packed_rows ? p.total_q : p.seqlen_q, p.o_row_stride, p.num_heads,
                               p.o_head_stride, p.head_dim)) {
      return Status::kInvalidArgument;
    }
  }
  // Varlen: cu_seqlens_q and cu_seqlens_k together, int32-aligned; total_q / total_k in
  // [0, kMaxSeqlen] (the kernels index rows in int32, workspace slots rounded up past them).
  const bool varlen = p.cu_seqlens_q != nullptr;
  if (varlen != (p.cu_seqlens_k != nullptr) ||
      (varlen && (p.total_q < 0 || p.total_q > kMaxSeqlen || p.total_k < 0 ||
                  p.total_k > kMaxSeqlen)) ||
      reinterpret_cast<uintptr_t>(p.cu_seqlens_q) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(p.cu_seqlens_k) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(p.seqused_k) % 4 != 0) {
    return Status::kInvalidArgument;
  }
  if (!strides_ok({p.q_batch_stride, p.q_row_stride, p.q_head_stride,
                   p.k_batch_stride, p.k_row_stride, p.k_head_stride,
                   p.v_batch_stride, p.v_row_stride, p.v_head_stride,
                   p.o_batch_stride, p.o_row_stride, p.o_head_stride})) {
    return Status::kInvalidArgument;
  }
  if (!pointer_ok(p.q, has_q_rows(p)) || !pointer_ok(p.o, has_q_rows(p)) ||
      !pointer_ok(p.k, has_k_rows(p)) || !pointer_ok(p.v, has_k_rows(p))) {
    return Status::kInvalidArgument;
  }
  return Status::kSuccess;
}

// fn.template run<Element, kBuiltHeadDims[I]>() for the one I whose instance is `rounded`;
// kUnsupportedHeadDim when none is.
template <typename Element, typename Fn, std::size_t... I>
Status run_built_instance(int rounded, const Fn& fn, std::index_sequence<I...>) {
  Status status = Status::kUnsupportedHeadDim;
  (void)((rounded == kBuiltHeadDims[I] &&
          (status = fn.template run<Element, kBuiltHeadDims[I]>(), true)) ||
         ...);
  return status;
}

// Calls fn.template run<Element, kHeadDim>() for the compiled instance covering head_dim.
template <typename Fn>
Status dispatch_instance(DType dtype, int head_dim, const Fn& fn) {
  const int rounded = round_head_dim(head_dim);
  constexpr auto kBuilt = std::make_index_sequence<kNumBuiltHeadDims>();
  return dtype == DType::kBFloat16 ? run_built_instance<__nv_bfloat16>(rounded, fn, kBuilt)
                                   : run_built_instance<__half>(rounded, fn, kBuilt);
}

// sm_90a machine code runs on compute capability 9.0 only (not on later GPUs).
inline bool use_sm90a(const DeviceInfo& dev) {
  return FLASHATTN_CU_HAS_SM90A && dev.major == 9 && dev.minor == 0 &&
         g_kernel_path.load(std::memory_order_relaxed) == static_cast<int>(KernelPath::kAuto);
}

}  // namespace flashattn_cu::detail
