// The one place that picks arch path, dtype and head-dim instance: fwd() and bwd(), the status and
// build queries (fwd_kvcache: dispatch_kvcache.cu; what both share: dispatch_common.h).
// Torch-free.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashattn_cu/flashattn_cu.h"
#include "dispatch_common.h"
#include "launch.h"
#include "bwd/params.h"
#include "sm80/launch.h"
#include "sm90/launch.h"
#include "tiles.h"

namespace flashattn_cu {
using namespace detail;
namespace {
struct FwdRunner {
  const FwdParams& params;
  bool small_smem;
  bool sm90a;  // the device runs sm_90a code and the sm90 path is allowed
  cudaStream_t stream;
  template <typename Element, int kHeadDim>
  Status run() const {
#if FLASHATTN_CU_HAS_SM90A
    if constexpr (fwd_tile_sm90(kHeadDim, false).supported) {
      if (sm90a && sm90::fwd_tma_ok(params)) return sm90::run_fwd<Element, kHeadDim>(params, stream);
    }
#endif
    return sm80::run_fwd<Element, kHeadDim>(params, small_smem, stream);
  }
};

struct BwdRunner {
  const BwdParams& params;
  bool small_smem;
  bool sm90a;  // the device runs sm_90a code and the sm90 path is allowed
  cudaStream_t stream;
  template <typename Element, int kHeadDim>
  Status run() const {
#if FLASHATTN_CU_HAS_SM90A
    if constexpr (bwd_tile_sm90(kHeadDim).supported) {
      if (sm90a && sm90::bwd_tma_ok(params)) {  // both sm90 kernels load q / dout by TMA
        return sm90::run_bwd<Element, kHeadDim>(params, stream);
      }
    }
#endif
    return sm80::run_bwd<Element, kHeadDim>(params, small_smem, stream);
  }
};

// bwd() needs, beyond check_common: dout/dq/dk/dv like o/q/k/v (strides multiples of 8, the
// pointer rule of check_common), the forward's softmax_stats or lse, and a workspace of
// bwd_workspace_bytes().
Status check_bwd(const BwdParams& p) {
  if (p.seqused_k != nullptr) return Status::kInvalidArgument;  // fwd() only (flashattn_cu.h)
  if (!strides_ok({p.do_batch_stride, p.do_row_stride, p.do_head_stride,
                   p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride,
                   p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride,
                   p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride})) {
    return Status::kInvalidArgument;
  }
  // dq, dk, dv are written: each element in a place of its own.
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q;
  const int64_t rows_k = varlen && p.total_k > 0 ? p.total_k : p.seqlen_k;
  const int64_t batch = varlen ? 1 : p.batch;
  if (!writes_do_not_overlap(batch, p.dq_batch_stride, rows_q, p.dq_row_stride, p.num_heads,
                             p.dq_head_stride, p.head_dim) ||
      !writes_do_not_overlap(batch, p.dk_batch_stride, rows_k, p.dk_row_stride, p.num_heads_k,
                             p.dk_head_stride, p.head_dim) ||
      !writes_do_not_overlap(batch, p.dv_batch_stride, rows_k, p.dv_row_stride, p.num_heads_k,
                             p.dv_head_stride, p.head_dim)) {
    return Status::kInvalidArgument;
  }
  const bool has_q = has_q_rows(p), has_k = has_k_rows(p);
  // The row statistics are read only through softmax_stats when it is given, else through lse.
  const bool has_stats = p.softmax_stats != nullptr;
  if (!pointer_ok(p.dout, has_q) || !pointer_ok(p.dq, has_q) || !pointer_ok(p.dk, has_k) ||
      !pointer_ok(p.dv, has_k) || !pointer_ok(p.softmax_stats, has_q && has_stats) ||
      !pointer_ok(p.lse, has_q && !has_stats)) {
    return Status::kInvalidArgument;
  }
  if (!workspace_ok(p.workspace, p.workspace_bytes, bwd_workspace_bytes(p))) {
    return Status::kInvalidArgument;
  }
  return Status::kSuccess;
}

}  // namespace

Status cuda_status(cudaError_t err) {
  if (err == cudaSuccess) return Status::kSuccess;
  g_last_error = err;
  // The failed call recorded err as the thread's last error; take it back off (it is ours, and a
  // later unrelated check should not see it). Sticky errors stay, as CUDA keeps them.
  (void)cudaGetLastError();
  if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction) {
    return Status::kUnsupportedDevice;
  }
  return Status::kLaunchFailed;
}

const char* status_string(Status status) {
  switch (status) {
    case Status::kSuccess: return "success";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kUnsupportedDevice: return "unsupported device (needs sm_80 or newer, in this build)";
    case Status::kUnsupportedHeadDim: return "unsupported head dim (multiple of 8, <= 256, compiled in)";
    case Status::kLaunchFailed: return "CUDA launch failed";
  }
  return "unknown status";
}

cudaError_t last_cuda_error() { return g_last_error; }

namespace {
__global__ void __launch_bounds__(256) check_seqlens_kernel(const int* cu_q, const int* cu_k,
                                                            int batch, int seqlen_q,
                                                            int seqlen_k, int total_q,
                                                            int total_k) {
  check_seqlens_entries(cu_q, cu_k, batch, seqlen_q, seqlen_k, total_q, total_k, 1);
}
}  // namespace

Status check_varlen_seqlens(const AttnParams& p, cudaStream_t stream) {
  if (p.batch <= 0 || (p.cu_seqlens_q == nullptr && p.cu_seqlens_k == nullptr)) {
    return Status::kSuccess;
  }
  return launch_kernel<check_seqlens_kernel>(dim3(1), dim3(256), 0, stream, p.cu_seqlens_q,
                                             p.cu_seqlens_k, p.batch, p.seqlen_q, p.seqlen_k,
                                             p.total_q, p.total_k);
}

Status fwd(const FwdParams& p, cudaStream_t stream) {
  g_last_error = cudaSuccess;
  Status st = check_common(p);
  if (st != Status::kSuccess) return st;
  if (!pointer_ok(p.lse, has_q_rows(p)) || !pointer_ok(p.softmax_stats, false)) {
    return Status::kInvalidArgument;
  }
  // The workspace is optional (null: the static schedules); one given must be aligned, and big
  // enough for the tile counter where the call may use it.
  if (!pointer_ok(p.workspace, false) ||
      (p.workspace != nullptr &&
       !workspace_ok(p.workspace, p.workspace_bytes, fwd_workspace_bytes(p)))) {
    return Status::kInvalidArgument;
  }
  // No tile to compute (a keyless row is written: 0, +inf); cu_seqlens still checked, and a
  // varlen call's rows outside every entry cleared by their own kernel (problem/seqlen.h).
  if (!has_q_rows(p)) return varlen_without_tiles(p, stream);
  DeviceInfo dev;
  st = query_device(&dev);
  if (st != Status::kSuccess) return st;
  const bool small_smem = dev.smem_optin < kLargeSmemBytes;
  return dispatch_instance(p.dtype, p.head_dim, FwdRunner{p, small_smem, use_sm90a(dev), stream});
}

size_t bwd_workspace_bytes(const BwdParams& p) {
  if (p.batch <= 0 || p.num_heads <= 0 || p.num_heads_k <= 0 || p.seqlen_q < 0 ||
      p.seqlen_k < 0 || p.head_dim <= 0 || p.num_heads % p.num_heads_k != 0) {
    return 0;
  }
  return backward::bwd_workspace_layout(p).bytes;
}

Status bwd(const BwdParams& p, cudaStream_t stream) {
  g_last_error = cudaSuccess;
  Status st = check_common(p);
  if (st != Status::kSuccess) return st;
  st = check_bwd(p);
  if (st != Status::kSuccess) return st;
  // Nothing to compute or write: no rows at all. (seqlen_q == 0 alone still zeroes dk/dv,
  // seqlen_k == 0 alone still zeroes dq.)
  // The varlen rows outside every entry are cleared by the preprocess (problem/seqlen.h), or
  // by their own kernel when it has no block (no query row).
  if (p.batch == 0 || (p.seqlen_q == 0 && p.seqlen_k == 0)) {
    return varlen_without_tiles(p, stream);
  }
  // A varlen call without query rows (total_q 0): every entry must be empty, which the check
  // below traps on if not; computed as max_seqlen_q 0 (dk / dv zeroed), so that nothing sizes
  // or indexes query rows by a bound the tensors do not have.
  if (p.cu_seqlens_q != nullptr && p.total_q == 0 && p.seqlen_q > 0) {
    BwdParams none = p;
    none.seqlen_q = 0;
    return bwd(none, stream);
  }
  // No query rows: the preprocess, which does both for the pipeline, has no block.
  if (p.seqlen_q == 0) {
    st = varlen_without_tiles(p, stream);
    if (st != Status::kSuccess) return st;
  }
  DeviceInfo dev;
  st = query_device(&dev);
  if (st != Status::kSuccess) return st;
  const bool small_smem = dev.smem_optin < kLargeSmemBytes;
  return dispatch_instance(p.dtype, p.head_dim,
                           BwdRunner{p, small_smem, use_sm90a(dev), stream});
}

void set_kernel_path(KernelPath path) { g_kernel_path.store(static_cast<int>(path)); }

KernelPath kernel_path() { return static_cast<KernelPath>(g_kernel_path.load()); }

void set_fwd_causal_schedule(FwdCausalSchedule schedule) {
  g_fwd_causal_schedule.store(static_cast<int>(schedule));
}

FwdCausalSchedule fwd_causal_schedule() {
  return static_cast<FwdCausalSchedule>(g_fwd_causal_schedule.load());
}

void set_fwd_dynamic_tiles(bool enabled) { g_fwd_dynamic_tiles.store(enabled); }

bool fwd_dynamic_tiles() { return g_fwd_dynamic_tiles.load(); }

void set_fwd_varlen_order(FwdVarlenOrder order) {
  g_fwd_varlen_order.store(static_cast<int>(order));
}

FwdVarlenOrder fwd_varlen_order() {
  return static_cast<FwdVarlenOrder>(g_fwd_varlen_order.load());
}

void set_bwd_streamed_dq(bool enabled) { g_bwd_streamed_dq.store(enabled); }

bool bwd_streamed_dq() { return g_bwd_streamed_dq.load(); }

// The calls whose tiles may cost unlike amounts (sm90/fwd_launch.h: the dynamic scheduler runs
// only where the static schedule would be one CTA per tile): varlen, seqused_k, causal, windows.
size_t fwd_workspace_bytes(const FwdParams& p) {
  const bool uneven = p.cu_seqlens_q != nullptr || p.cu_seqlens_k != nullptr ||
                      p.seqused_k != nullptr || p.is_causal || p.window_left >= 0 ||
                      p.window_right >= 0;
  return has_q_rows(p) && uneven ? kFwdWorkspaceBytes : 0;
}

int built_archs(int* out, int max) {
  static const int kArchs[] = {FLASHATTN_CU_BUILT_ARCHS};
  const int n = static_cast<int>(sizeof(kArchs) / sizeof(kArchs[0]));
  for (int i = 0; i < n && i < max; ++i) out[i] = kArchs[i];
  return n;
}

int built_head_dims(int* out, int max) {
  for (int i = 0; i < kNumBuiltHeadDims && i < max; ++i) out[i] = kBuiltHeadDims[i];
  return kNumBuiltHeadDims;
}

int head_dim_instances(int* out, int max) {
  for (int i = 0; i < kNumHeadDimInstances && i < max; ++i) out[i] = kHeadDimInstances[i];
  return kNumHeadDimInstances;
}

}  // namespace flashattn_cu
