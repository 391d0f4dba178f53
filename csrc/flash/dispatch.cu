// The one place that picks arch path, dtype and head-dim instance. Torch-free.
#include <cmath>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashattn_cu/flashattn_cu.h"
#include "head_dims.h"
#include "launch.h"
#include "bwd/params.h"
#include "fwd/combine_launch.h"
#include "problem/kv_cache.h"
#include "problem/params.h"
#include "problem/scheduler.h"
#include "problem/score_mod.h"
#include "sm80/launch.h"
#include "sm90/launch.h"
#include "tiles.h"

#include <atomic>

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

namespace flashattn_cu {
namespace {

thread_local cudaError_t g_last_error = cudaSuccess;
std::atomic<int> g_kernel_path{static_cast<int>(KernelPath::kAuto)};

struct DeviceInfo {
  int major = 0;
  int minor = 0;
  int smem_optin = 0;
  int sm_count = 0;
};

Status query_device(DeviceInfo* info) {
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

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// A tensor with elements needs a non-null, 16-byte aligned pointer; an empty one may have any
// (it is never dereferenced). The one rule for every pointer of fwd() and bwd().
bool pointer_ok(const void* ptr, bool has_elements) {
  return has_elements ? ptr != nullptr && aligned16(ptr) : ptr == nullptr || aligned16(ptr);
}

// Whether q/o/dout/dq/lse (rows of seqlen_q) and k/v/dk/dv (rows of seqlen_k) have elements.
template <typename Params>
bool has_q_rows(const Params& p) {
  return p.batch > 0 && p.seqlen_q > 0 && (p.cu_seqlens_q == nullptr || p.total_q > 0);
}
template <typename Params>
bool has_k_rows(const Params& p) { return p.batch > 0 && p.seqlen_k > 0; }

// Every stride a multiple of 8 elements (16 bytes).
bool strides_ok(std::initializer_list<int64_t> strides) {
  for (int64_t s : strides) {
    if (s % 8 != 0) return false;
  }
  return true;
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
  if (p.head_dim <= 0 || p.head_dim > 256 || p.head_dim % 8 != 0) {
    return Status::kUnsupportedHeadDim;
  }
  if (!(p.softmax_scale > 0.f) || !std::isnormal(p.softmax_scale)) return Status::kInvalidArgument;
  if (p.window_left < -1 || p.window_right < -1) return Status::kInvalidArgument;
  // Softcap: 0 (none) or positive and normal, with finite softmax_scale / softcap and
  // softcap * log2(e) (problem/score_mod.h).
  if (p.softcap != 0.f &&
      (!(p.softcap > 0.f) || !std::isnormal(p.softcap) ||
       !std::isfinite(p.softmax_scale / p.softcap) || !std::isfinite(p.softcap * kLog2e))) {
    return Status::kInvalidArgument;
  }
  // Dropout: 0 <= dropout_p < 1 (NaN fails both); the forward's optional outputs 8- and
  // 16-byte aligned (flashattn_cu.h: rng_state, s_dmask).
  if (!(p.dropout_p >= 0.f && p.dropout_p < 1.f) ||
      reinterpret_cast<uintptr_t>(p.philox_seed_ptr) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(p.philox_offset_ptr) % 8 != 0) {
    return Status::kInvalidArgument;
  }
  if constexpr (std::is_same_v<Params, FwdParams>) {
    if (reinterpret_cast<uintptr_t>(p.rng_state) % 8 != 0 || !pointer_ok(p.s_dmask, false)) {
      return Status::kInvalidArgument;
    }
  }
  // Varlen: cu_seqlens_q and cu_seqlens_k together, int32-aligned; total_q >= 0.
  const bool varlen = p.cu_seqlens_q != nullptr;
  if (varlen != (p.cu_seqlens_k != nullptr) || (varlen && p.total_q < 0) ||
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
      if (sm90a) return sm90::run_bwd<Element, kHeadDim>(params, stream);
    }
#endif
    return sm80::run_bwd<Element, kHeadDim>(params, small_smem, stream);
  }
};

// sm_90a machine code runs on compute capability 9.0 only (not on later GPUs).
bool use_sm90a(const DeviceInfo& dev) {
  return FLASHATTN_CU_HAS_SM90A && dev.major == 9 && dev.minor == 0 &&
         g_kernel_path.load(std::memory_order_relaxed) == static_cast<int>(KernelPath::kAuto);
}

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
  const bool has_q = has_q_rows(p), has_k = has_k_rows(p);
  // The row statistics are read only through softmax_stats when it is given, else through lse.
  const bool has_stats = p.softmax_stats != nullptr;
  if (!pointer_ok(p.dout, has_q) || !pointer_ok(p.dq, has_q) || !pointer_ok(p.dk, has_k) ||
      !pointer_ok(p.dv, has_k) || !pointer_ok(p.softmax_stats, has_q && has_stats) ||
      !pointer_ok(p.lse, has_q && !has_stats)) {
    return Status::kInvalidArgument;
  }
  if (bwd_workspace_bytes(p) > 0 && !pointer_ok(p.workspace, true)) {
    return Status::kInvalidArgument;
  }
  return Status::kSuccess;
}

// ---------------------------------------------------------------------------------------------
// fwd_kvcache (flashattn_cu.h: KvcacheParams; problem/kv_cache.h)

// GQA packing (problem/kv_cache.h: GqaPack), for any seqlen_q: the group = heads / heads_k query
// heads of each kv head run as the rows of its tiles, (query i, head hk * group + j) as row
// i * group + j, so every K/V tile read serves the whole group (speculative decoding's 4 or 8
// queries too, not only one). The kernel maps each row to its query for the mask (causal and
// windows stay exact) and to its q / o address and lse index; the call's q/o strides are kept.
// Not with ALiBi, whose slope is per query head: a packed tile would need one per row.
bool gqa_packable(const KvcacheParams& p) {
  return p.num_heads > p.num_heads_k && p.alibi_slopes == nullptr &&
         static_cast<int64_t>(p.seqlen_q) * (p.num_heads / p.num_heads_k) <= kMaxSeqlen;
}

int pack_group_of(const KvcacheParams& p) {
  return gqa_packable(p) ? p.num_heads / p.num_heads_k : 1;
}

// The call as the kernels' grid sees it: seqlen_q * group rows of heads_k heads.
KvcacheParams pack_gqa(const KvcacheParams& in) {
  KvcacheParams p = in;
  const int group = pack_group_of(in);
  p.seqlen_q = in.seqlen_q * group;
  p.num_heads = in.num_heads / group;
  return p;
}

// Whether the (packed) call p runs the sm90a decode kernel (sm90/decode_kernel.h): an sm_90
// device on the default path, a head-dim instance it has (tiles.h decode_tile_sm90), at most 16
// packed query rows of a padded batch, nothing appended, and a cache its TMA maps can describe: a
// contiguous one, or pages that hold whole key blocks (without cache_leftpad, whose offset would
// cut pages). Everything else runs the sm80 kvcache kernel.
bool decode_sm90_ok(const KvcacheParams& p, const DeviceInfo& dev) {
  if (!use_sm90a(dev)) return false;
  const DecodeTileSm90 tile = decode_tile_sm90(round_head_dim(p.head_dim));
  if (!tile.supported || p.seqlen_q > kDecodeRowsSm90 || p.cu_seqlens_q != nullptr || p.k_new != nullptr ||
      p.seqlen_k <= 0) {
    return false;
  }
  // Pages smaller than a key block would take one TMA box each: the kernel handles them (16-row
  // pages measured 2464 GB/s at d = 128, batch 8, 32k keys), but the sm80 kernel's row gather is
  // faster there (2899), so only pages that hold whole key blocks come here.
  if (p.block_table != nullptr &&
      (p.cache_leftpad != nullptr || p.page_size % tile.block_n != 0)) {
    return false;
  }
  return p.block_table != nullptr ? sm90::kv_maps_ok(p, p.page_size, p.num_pages)
                                  : sm90::kv_maps_ok(p, p.seqlen_k, p.batch_cache);
}

// The split count on `dev` for the (packed) call p: problem/kv_cache.h. Two blocks per SM run
// the sm80 kvcache tiles (tiles.h: fwd_tile_sm80_kvcache, shared memory), one the sm90a decode
// kernel's 16-row tiles (decode_sm90_ok).
int kvcache_splits(const KvcacheParams& p, const DeviceInfo& dev, bool decode90) {
  const FwdTile tile =
      fwd_tile_sm80_kvcache(round_head_dim(p.head_dim), dev.smem_optin < kLargeSmemBytes);
  const int block_m = decode90 ? kDecodeRowsSm90 : tile.block_m;
  const int block_n = decode90 ? decode_tile_sm90(round_head_dim(p.head_dim)).block_n : tile.block_n;
  const int n_blocks = ceil_div(p.seqlen_k, block_n);
  int splits = p.num_splits;
  if (splits <= 0) {
    const int64_t tiles = query_tile_count(ceil_div(p.seqlen_q, block_m), p.batch, p.num_heads);
    splits = num_splits_heuristic(tiles, (decode90 ? 1 : 2) * dev.sm_count, n_blocks);
  }
  splits = splits < n_blocks ? splits : n_blocks;
  splits = splits < kMaxSplits ? splits : kMaxSplits;
  return splits > 1 ? splits : 1;
}

// The workspace: key counts (with cache_leftpad or an append), then the splits' LSEs and outputs.
struct KvcacheWorkspace {
  size_t counts = 0, lse = 0, o = 0, bytes = 0;  // offsets and the total, 256-byte aligned
};

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// The kernels' key counts differ from cache_seqlens (fwd/combine.h: kvcache_key_counts_kernel).
bool needs_key_counts(const KvcacheParams& p) {
  return p.cache_leftpad != nullptr || p.k_new != nullptr;
}

// Rows of the (unpacked) call's lse, and so of each split's partials: (batch, heads, seqlen_q),
// or varlen (heads, total_q).
int64_t kvcache_lse_rows(const KvcacheParams& p) {
  return p.cu_seqlens_q != nullptr ? static_cast<int64_t>(p.num_heads) * p.total_q
                                   : static_cast<int64_t>(p.batch) * p.num_heads * p.seqlen_q;
}

// p: the unpacked call.
KvcacheWorkspace kvcache_workspace(const KvcacheParams& p, int splits) {
  KvcacheWorkspace w;
  size_t at = 0;
  if (needs_key_counts(p)) at = align256(sizeof(int) * static_cast<size_t>(p.batch));
  w.lse = at;
  const size_t rows = static_cast<size_t>(kvcache_lse_rows(p));
  if (splits > 1) at = align256(at + sizeof(float) * rows * splits);
  w.o = at;
  if (splits > 1) at = align256(at + sizeof(float) * rows * splits * p.head_dim);
  w.bytes = at;
  return w;
}

bool aligned4(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 4 == 0; }

// The fused append + rotary's arguments (flashattn_cu.h: KvcacheParams::k_new, rotary_cos):
// 16-byte chunks of k_new / v_new rows and of the rotary tables' rows are read directly.
Status check_kvcache_append(const KvcacheParams& p) {
  const bool has_rotary = p.rotary_cos != nullptr || p.rotary_sin != nullptr;
  if ((p.k_new == nullptr) != (p.v_new == nullptr) ||
      (p.rotary_cos == nullptr) != (p.rotary_sin == nullptr)) {
    return Status::kInvalidArgument;
  }
  if (p.k_new == nullptr) {
    return has_rotary || p.seqlen_new != 0 ? Status::kInvalidArgument : Status::kSuccess;
  }
  if (p.cu_seqlens_q != nullptr || p.seqlen_new < 1 || p.seqlen_new > p.seqlen_k ||
      !aligned16(p.k_new) || !aligned16(p.v_new) || p.knew_row_stride % 8 != 0 ||
      p.knew_head_stride % 8 != 0 || p.knew_batch_stride % 8 != 0 ||
      p.vnew_row_stride % 8 != 0 || p.vnew_head_stride % 8 != 0 ||
      p.vnew_batch_stride % 8 != 0) {
    return Status::kInvalidArgument;
  }
  if (has_rotary &&
      (p.rotary_dim < 16 || p.rotary_dim % 16 != 0 || p.rotary_dim > p.head_dim ||
       p.rotary_seqlen < p.seqlen_k || !aligned16(p.rotary_cos) || !aligned16(p.rotary_sin))) {
    return Status::kInvalidArgument;
  }
  return Status::kSuccess;
}

// What fwd_kvcache() takes beyond check_common (flashattn_cu.h: KvcacheParams).
Status check_kvcache(const KvcacheParams& p) {
  Status st = check_common(static_cast<const FwdParams&>(p));
  if (st != Status::kSuccess) return st;
  if (p.seqused_k != nullptr || p.dropout_p != 0.f || p.softmax_stats != nullptr ||
      p.rng_state != nullptr || p.s_dmask != nullptr) {
    return Status::kInvalidArgument;
  }
  // Varlen (check_common: cu_seqlens_q and cu_seqlens_k together): the keys come from
  // cu_seqlens_k, not cache_seqlens / cache_leftpad; otherwise cache_seqlens is required.
  const bool varlen = p.cu_seqlens_q != nullptr;
  if (varlen ? p.cache_seqlens != nullptr || p.cache_leftpad != nullptr
             : p.cache_seqlens == nullptr) {
    return Status::kInvalidArgument;
  }
  if (!aligned4(p.cache_seqlens) || !aligned4(p.cache_batch_idx) ||
      !aligned4(p.cache_leftpad) || !aligned4(p.block_table) || p.num_splits < 0 ||
      p.num_splits > kMaxSplits) {
    return Status::kInvalidArgument;
  }
  if (p.block_table != nullptr) {
    if (p.cache_batch_idx != nullptr || p.page_size < 1 || p.num_pages < 1 ||
        p.block_table_batch_stride < ceil_div<int64_t>(p.seqlen_k, p.page_size)) {
      return Status::kInvalidArgument;
    }
  } else if (p.cache_batch_idx != nullptr && p.batch_cache < 1 && p.seqlen_k > 0) {
    return Status::kInvalidArgument;
  }
  if (!pointer_ok(p.lse, has_q_rows(p))) return Status::kInvalidArgument;
  return check_kvcache_append(p);
}

}  // namespace

int fwd_kvcache_num_splits(const KvcacheParams& params) {
  if (params.batch <= 0 || params.num_heads <= 0 || params.num_heads_k <= 0 ||
      params.seqlen_q <= 0 || params.head_dim <= 0 || params.num_heads % params.num_heads_k != 0) {
    return 1;
  }
  DeviceInfo dev;
  if (query_device(&dev) != Status::kSuccess) {
    // No device to ask: the heuristic needs its SM count (one split); an explicit count is
    // sized for the large-shared-memory tiles.
    if (params.num_splits <= 0) return 1;
    dev.smem_optin = kLargeSmemBytes;
  }
  const KvcacheParams p = pack_gqa(params);
  return kvcache_splits(p, dev, decode_sm90_ok(p, dev));
}

size_t fwd_kvcache_workspace_bytes(const KvcacheParams& params) {
  if (params.batch <= 0 || params.num_heads <= 0 || params.num_heads_k <= 0 ||
      params.seqlen_q <= 0 || params.head_dim <= 0 || params.num_heads % params.num_heads_k != 0) {
    return 0;
  }
  return kvcache_workspace(params, fwd_kvcache_num_splits(params)).bytes;
}

namespace {

// The kvcache kernel of the instance: the sm90a decode kernel when decode_sm90_ok chose it,
// else the sm80 one.
struct KvcacheRunner {
  const FwdKvcacheKernelParams& kp;
  bool small_smem;
  bool decode90;
  cudaStream_t stream;
  template <typename Element, int kHeadDim>
  Status run() const {
#if FLASHATTN_CU_HAS_SM90A
    if constexpr (decode_tile_sm90(kHeadDim).supported) {
      if (decode90) return sm90::run_decode<Element, kHeadDim>(kp, stream);
    }
#endif
    return sm80::run_fwd_kvcache<Element, kHeadDim>(kp, small_smem, stream);
  }
};

}  // namespace

Status fwd_kvcache(const KvcacheParams& params, cudaStream_t stream) {
  g_last_error = cudaSuccess;
  Status st = check_kvcache(params);
  if (st != Status::kSuccess) return st;
  if (!has_q_rows(params)) return Status::kSuccess;
  DeviceInfo dev;
  st = query_device(&dev);
  if (st != Status::kSuccess) return st;
  const KvcacheParams p = pack_gqa(params);
  const bool decode90 = decode_sm90_ok(p, dev);
  const int splits = kvcache_splits(p, dev, decode90);
  const KvcacheWorkspace ws = kvcache_workspace(params, splits);
  if (ws.bytes > 0 && !pointer_ok(params.workspace, true)) return Status::kInvalidArgument;
  char* workspace = static_cast<char*>(params.workspace);

  FwdKvcacheKernelParams kp;
  static_cast<FwdKernelParams&>(kp) = make_fwd_kernel_params(p);
  // The keys of each entry reach the kernels as seqused_k (problem/kv_cache.h), or varlen as
  // cu_seqlens_k (kept from p, as cu_seqlens_q and total_q are: problem/seqlen.h).
  kp.p.seqused_k = p.cache_seqlens;
  if (needs_key_counts(p)) {
    int* counts = reinterpret_cast<int*>(workspace + ws.counts);
    st = forward::launch_kvcache_key_counts(p.cache_seqlens, p.cache_leftpad,
                                            p.k_new != nullptr ? p.seqlen_new : 0, p.seqlen_k,
                                            p.batch, counts, stream);
    if (st != Status::kSuccess) return st;
    kp.p.seqused_k = counts;
  }
  kp.kv.cache_batch_idx = p.block_table != nullptr ? nullptr : p.cache_batch_idx;
  kp.kv.batch_cache = p.batch_cache;
  kp.kv.cache_leftpad = p.cache_leftpad;
  kp.kv.block_table = p.block_table;
  kp.kv.block_table_batch_stride = p.block_table_batch_stride;
  kp.kv.page_size = p.page_size;
  kp.kv.num_pages = p.num_pages;
  kp.kv.pack_group = pack_group_of(params);
  kp.kv.num_splits = splits;
  kp.kv.partial_rows = kvcache_lse_rows(params);
  kp.kv.lse_partial = splits > 1 ? reinterpret_cast<float*>(workspace + ws.lse) : nullptr;
  kp.kv.o_partial = splits > 1 ? reinterpret_cast<float*>(workspace + ws.o) : nullptr;
  // The fused append + rotary (problem/kv_append.h); q's rotary positions follow the unpacked
  // call's mask: per query with causal or a window (flash_attn's rule).
  kp.kv.k_new = p.k_new;
  kp.kv.v_new = p.v_new;
  kp.kv.cache_seqlens = p.cache_seqlens;
  kp.kv.seqlen_new = p.k_new != nullptr ? p.seqlen_new : 0;
  kp.kv.knew_batch_stride = p.knew_batch_stride;
  kp.kv.knew_row_stride = p.knew_row_stride;
  kp.kv.knew_head_stride = p.knew_head_stride;
  kp.kv.vnew_batch_stride = p.vnew_batch_stride;
  kp.kv.vnew_row_stride = p.vnew_row_stride;
  kp.kv.vnew_head_stride = p.vnew_head_stride;
  kp.kv.rotary_cos = p.k_new != nullptr ? p.rotary_cos : nullptr;
  kp.kv.rotary_sin = p.k_new != nullptr ? p.rotary_sin : nullptr;
  kp.kv.rotary_dim = p.rotary_dim;
  kp.kv.rotary_interleaved = p.rotary_interleaved;
  kp.kv.rotary_q_per_row =
      params.is_causal || params.window_left >= 0 || params.window_right >= 0;

  const bool small_smem = dev.smem_optin < kLargeSmemBytes;
  st = dispatch_instance(p.dtype, p.head_dim, KvcacheRunner{kp, small_smem, decode90, stream});
  if (st != Status::kSuccess || splits == 1) return st;
  // The partials' rows are the call's lse rows (batch, heads, seqlen_q), unpacked.
  FwdKvcacheKernelParams combine = kp;
  combine.p.seqlen_q = params.seqlen_q;
  combine.p.num_heads = params.num_heads;
  return forward::launch_split_combine(combine, stream);
}

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

Status fwd(const FwdParams& p, cudaStream_t stream) {
  g_last_error = cudaSuccess;
  Status st = check_common(p);
  if (st != Status::kSuccess) return st;
  if (!pointer_ok(p.lse, has_q_rows(p)) || !pointer_ok(p.softmax_stats, false)) {
    return Status::kInvalidArgument;
  }
  if (!has_q_rows(p)) return Status::kSuccess;  // no row to write (a keyless row is written: 0, +inf)
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
  if (p.batch == 0 || (p.seqlen_q == 0 && p.seqlen_k == 0)) return Status::kSuccess;
  DeviceInfo dev;
  st = query_device(&dev);
  if (st != Status::kSuccess) return st;
  const bool small_smem = dev.smem_optin < kLargeSmemBytes;
  return dispatch_instance(p.dtype, p.head_dim,
                           BwdRunner{p, small_smem, use_sm90a(dev), stream});
}

void set_kernel_path(KernelPath path) { g_kernel_path.store(static_cast<int>(path)); }

KernelPath kernel_path() { return static_cast<KernelPath>(g_kernel_path.load()); }

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
