// fwd_kvcache and its sizing functions (flashattn_cu.h: KvcacheParams): GQA packing, the split
// count, the workspace, and the choice between the sm80 kvcache kernel and the sm90a decode
// kernel (with the standalone append ahead of it). Torch-free.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashattn_cu/flashattn_cu.h"
#include "dispatch_common.h"
#include "fwd/combine_launch.h"
#include "problem/kv_cache.h"
#include "problem/params.h"
#include "problem/scheduler.h"
#include "sm80/launch.h"
#include "sm90/launch.h"
#include "tiles.h"

namespace flashattn_cu {
using namespace detail;
namespace {

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
// device on the default path, a head-dim instance it has (decode_tiles.h decode_tile_sm90), at most 16
// packed query rows of a padded batch, and a cache its TMA maps can describe: a
// contiguous one, or pages of a multiple of 16 rows (without cache_leftpad, whose offset would
// cut pages). Everything else runs the sm80 kvcache kernel. An append (k_new, rotary) runs as its
// own kernel first (fwd/append.h), which writes q rotated to the workspace (rotated_q_copy).
// The decode kernel's tile for the (packed) call p: decode_tiles.h decode_tile_sm90_for, on the rule
// run_decode (sm90/decode_launch.h) launches by.
DecodeTileSm90 decode_tile_of(const KvcacheParams& p) {
  return decode_tile_sm90_for(round_head_dim(p.head_dim),
                              p.block_table != nullptr ? p.page_size : 0);
}

bool decode_sm90_ok(const KvcacheParams& p, const DeviceInfo& dev) {
  if (!use_sm90a(dev)) return false;
  const DecodeTileSm90 tile = decode_tile_of(p);
  if (!tile.supported || p.seqlen_q > kDecodeRowsSm90 || p.cu_seqlens_q != nullptr || p.seqlen_k <= 0) {
    return false;
  }
  // Pages of a multiple of 16 rows (decode_tile_sm90_for; read in boxes of the rows dividing
  // page and tile: decode_box_rows_sm90); pages of other sizes keep the sm80 kernel's row gather.
  if (p.block_table != nullptr && p.cache_leftpad != nullptr) return false;
  return p.block_table != nullptr ? sm90::kv_maps_ok(p, p.page_size, p.num_pages)
                                  : sm90::kv_maps_ok(p, p.seqlen_k, p.batch_cache);
}

// CTAs per SM of the (packed) call p on the sm90a decode kernel when decode_sm90_ok takes it
// (decode_tiles.h decode_ctas_sm90: two for d 64 pages read in boxes below the tile, when the call has
// enough query tiles), else 0: the sm80 kvcache kernel runs it.
int decode_ctas_of(const KvcacheParams& p, const DeviceInfo& dev) {
  if (!decode_sm90_ok(p, dev)) return 0;
  const int64_t tiles =
      query_tile_count(ceil_div(p.seqlen_q, kDecodeRowsSm90), p.batch, p.num_heads);
  return decode_ctas_sm90(round_head_dim(p.head_dim), p.block_table != nullptr ? p.page_size : 0,
                          tiles, dev.sm_count);
}

// The split count on `dev` for the (packed) call p: problem/kv_cache.h. Two blocks per SM run
// the sm80 kvcache tiles (tiles.h: fwd_tile_sm80_kvcache, shared memory), decode_ctas per SM
// the sm90a decode kernel's 16-row tiles (decode_ctas_of > 0), split to fill one wave of those
// slots (num_splits_one_wave).
int kvcache_splits(const KvcacheParams& p, const DeviceInfo& dev, int decode_ctas) {
  const bool decode90 = decode_ctas > 0;
  const FwdTile tile =
      fwd_tile_sm80_kvcache(round_head_dim(p.head_dim), dev.smem_optin < kLargeSmemBytes);
  const int block_m = decode90 ? kDecodeRowsSm90 : tile.block_m;
  const int block_n = decode90 ? decode_tile_of(p).block_n : tile.block_n;
  const int n_blocks = ceil_div(p.seqlen_k, block_n);
  int splits = p.num_splits;
  if (splits <= 0) {
    const int64_t tiles = query_tile_count(ceil_div(p.seqlen_q, block_m), p.batch, p.num_heads);
    splits = decode90 ? num_splits_one_wave(tiles, decode_ctas * dev.sm_count, n_blocks)
                      : num_splits_heuristic(tiles, 2 * dev.sm_count, n_blocks);
  }
  splits = splits < n_blocks ? splits : n_blocks;
  splits = splits < kMaxSplits ? splits : kMaxSplits;
  return splits > 1 ? splits : 1;
}

// The workspace: key counts (with cache_leftpad or an append), then the splits' LSEs and outputs.
struct KvcacheWorkspace {
  size_t counts = 0, lse = 0, o = 0, q = 0, bytes = 0;  // offsets and the total, 256-byte aligned
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

// Whether the (packed) call p, on the sm90 decode kernel (decode90), runs the standalone append
// with rotary ahead of it, which then reads q rotated from the workspace: (batch, seqlen_q,
// heads, d) of the unpacked call, contiguous.
bool rotated_q_copy(const KvcacheParams& p, bool decode90) {
  return decode90 && p.k_new != nullptr && p.rotary_cos != nullptr;
}

// p: the unpacked call; q_copy: rotated_q_copy of it.
KvcacheWorkspace kvcache_workspace(const KvcacheParams& p, int splits, bool q_copy) {
  KvcacheWorkspace w;
  size_t at = 0;
  if (needs_key_counts(p)) at = align256(sizeof(int) * static_cast<size_t>(p.batch));
  w.lse = at;
  const size_t rows = static_cast<size_t>(kvcache_lse_rows(p));
  if (splits > 1) at = align256(at + sizeof(float) * rows * splits);
  w.o = at;
  if (splits > 1) at = align256(at + sizeof(float) * rows * splits * p.head_dim);
  w.q = at;
  if (q_copy) {
    at = align256(at + 2 * static_cast<size_t>(p.batch) * p.seqlen_q * p.num_heads * p.head_dim);
  }
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
      !aligned16(p.k_new) || !aligned16(p.v_new) ||
      !strides_ok({p.knew_batch_stride, p.knew_row_stride, p.knew_head_stride,
                   p.vnew_batch_stride, p.vnew_row_stride, p.vnew_head_stride})) {
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
  // cu_seqlens_k, not cache_seqlens / cache_leftpad; otherwise cache_seqlens is required with an
  // append or cache_leftpad, and null means every entry holds seqlen_k keys.
  const bool varlen = p.cu_seqlens_q != nullptr;
  // Varlen queries read a paged cache only (flashattn_cu.h): a contiguous cache's entries are
  // not located by cu_seqlens_k.
  if (varlen && p.block_table == nullptr) return Status::kInvalidArgument;
  if (varlen ? p.cache_seqlens != nullptr || p.cache_leftpad != nullptr
             : p.cache_seqlens == nullptr &&
                   (p.k_new != nullptr || p.v_new != nullptr || p.cache_leftpad != nullptr)) {
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
  } else if (p.cache_batch_idx == nullptr && p.cu_seqlens_k == nullptr && p.seqlen_k > 0 &&
             p.batch_cache < p.batch) {
    // A contiguous cache read (and appended to) at entry b for query batch b: fewer entries
    // than the batch would read and write past the cache (the torch binding says so first).
    return Status::kInvalidArgument;
  }
  if (!pointer_ok(p.lse, has_q_rows(p))) return Status::kInvalidArgument;
  return check_kvcache_append(p);
}

}  // namespace

namespace {

bool kvcache_shape_ok(const KvcacheParams& params) {
  return params.batch > 0 && params.num_heads > 0 && params.num_heads_k > 0 &&
         params.seqlen_q > 0 && params.head_dim > 0 && params.num_heads % params.num_heads_k == 0;
}

// The device the sizing functions size for. No device to ask: the heuristic needs its SM count
// (one split: num_splits 0 then gives 1); an explicit count is sized for the large-shared-memory
// tiles; major 0: not the sm90 path.
DeviceInfo sizing_device() {
  DeviceInfo dev;
  if (query_device(&dev) != Status::kSuccess) {
    dev = DeviceInfo{};
    dev.smem_optin = kLargeSmemBytes;
  }
  return dev;
}

// The split count and whether the decode kernel runs, as fwd_kvcache decides them.
struct KvcachePlan {
  int splits;
  bool q_copy;
};

KvcachePlan plan_on(const KvcacheParams& params, const DeviceInfo& dev) {
  const KvcacheParams p = pack_gqa(params);
  const int decode_ctas = decode_ctas_of(p, dev);
  const int splits = dev.sm_count <= 0 && params.num_splits <= 0
                         ? 1
                         : kvcache_splits(p, dev, decode_ctas);
  return KvcachePlan{splits, rotated_q_copy(p, decode_ctas > 0)};
}

}  // namespace

int fwd_kvcache_num_splits(const KvcacheParams& params) {
  if (!kvcache_shape_ok(params)) return 1;
  return plan_on(params, sizing_device()).splits;
}

size_t fwd_kvcache_workspace_bytes(const KvcacheParams& params) {
  if (!kvcache_shape_ok(params)) return 0;
  const KvcachePlan plan = plan_on(params, sizing_device());
  return kvcache_workspace(params, plan.splits, plan.q_copy).bytes;
}

namespace {

// The kvcache kernel of the instance: the sm90a decode kernel when decode_sm90_ok chose it,
// else the sm80 one.
struct KvcacheRunner {
  const FwdKvcacheKernelParams& kp;
  bool small_smem;
  int decode_ctas;  // decode_ctas_of: CTAs per SM on the sm90a decode kernel, 0 for the sm80 one
  bool decode_persistent;  // the decode kernel on a persistent grid (decode_persistent_sm90)
  cudaStream_t stream;
  template <typename Element, int kHeadDim>
  Status run() const {
#if FLASHATTN_CU_HAS_SM90A
    if constexpr (decode_tile_sm90(kHeadDim).supported) {
      if (decode_ctas > 0) {
        return sm90::run_decode<Element, kHeadDim>(kp, decode_ctas, decode_persistent, stream);
      }
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
  if (!has_q_rows(params)) return varlen_without_tiles(params, stream);  // nothing to compute
  DeviceInfo dev;
  st = query_device(&dev);
  if (st != Status::kSuccess) return st;
  const KvcacheParams p = pack_gqa(params);
  const int decode_ctas = decode_ctas_of(p, dev);
  const bool decode90 = decode_ctas > 0;
  const int splits = kvcache_splits(p, dev, decode_ctas);
  const bool q_copy = rotated_q_copy(p, decode90);
  const KvcacheWorkspace ws = kvcache_workspace(params, splits, q_copy);
  if (!workspace_ok(params.workspace, params.workspace_bytes, ws.bytes)) {
    return Status::kInvalidArgument;
  }
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
                                            p.batch, counts, stream, decode90);
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
  kp.kv.rotary_seqlen = p.rotary_seqlen;
  kp.kv.rotary_interleaved = p.rotary_interleaved;
  kp.kv.rotary_q_per_row =
      params.is_causal || params.window_left >= 0 || params.window_right >= 0;

  const bool small_smem = dev.smem_optin < kLargeSmemBytes;
  if (decode90 && p.k_new != nullptr) {
    // The append (and q's rotary) as its own kernel (fwd/append.h), then the decode kernel on the
    // appended cache, with nothing left to append and q from the rotated copy.
    void* q_out = q_copy ? workspace + ws.q : nullptr;
    const int64_t head_stride = params.head_dim;
    const int64_t row_stride = head_stride * params.num_heads;
    const int64_t batch_stride = row_stride * params.seqlen_q;
    st = forward::launch_kvcache_append(kp, q_out, batch_stride, row_stride, head_stride, stream,
                                        true);
    if (st != Status::kSuccess) return st;
    if (q_copy) {
      kp.p.q = q_out;
      kp.p.q_batch_stride = batch_stride;
      kp.p.q_row_stride = row_stride;
      kp.p.q_head_stride = head_stride;
    }
    kp.kv.k_new = nullptr;
    kp.kv.v_new = nullptr;
    kp.kv.seqlen_new = 0;
    kp.kv.rotary_cos = nullptr;
    kp.kv.rotary_sin = nullptr;
  }
  // The decode kernel's tiles after splitting against its slots: a persistent grid where they
  // are more, at d 64 (decode_tiles.h decode_persistent_sm90).
  const bool decode_persistent =
      decode90 && decode_persistent_sm90(
                      round_head_dim(p.head_dim),
                      split_query_tile_count(ceil_div(p.seqlen_q, kDecodeRowsSm90), p.batch,
                                             p.num_heads, splits),
                      static_cast<long long>(decode_ctas) * dev.sm_count);
  st = dispatch_instance(p.dtype, p.head_dim,
                         KvcacheRunner{kp, small_smem, decode_ctas, decode_persistent, stream});
  if (st == Status::kSuccess && splits > 1) {
    // The partials' rows are the call's lse rows (batch, heads, seqlen_q), unpacked.
    FwdKvcacheKernelParams combine = kp;
    combine.p.seqlen_q = params.seqlen_q;
    combine.p.num_heads = params.num_heads;
    // After the sm90 decode kernel, programmatically: it lets the combine in once its walk is
    // done.
    st = forward::launch_split_combine(combine, stream, decode90);
  }
  // Paged prefill's q rows outside every entry (problem/seqlen.h), on the unpacked call, last:
  // the combine writes every token's row, those too, from partials nothing wrote.
  return st != Status::kSuccess ? st : forward::clear_outside_rows_of(params, stream);
}

}  // namespace flashattn_cu
