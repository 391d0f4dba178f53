// FlashAttention-2 forward on mma.sync (sm_80 and newer).
//
// One thread block owns kBlockM query rows of one (batch, head); each warp owns kWarpRows of
// them. K and V tiles of kBlockN keys stream through shared memory from the last tile to the
// first (masked tiles - the sequence tail and the causal diagonal - come first, then the
// unmasked bulk runs without any mask arithmetic). Loads overlap compute the FA2 way: the V tile
// of step n is in flight while S = Q K^T runs, the K tile of step n-1 while O += P V runs.
//
// The kvcache variant (problem/kv_cache.h) is the same loop with run-time modes: its block also
// owns a split of the query block's key blocks (writing fp32 partials for fwd/combine.h when
// there are several), and reads K/V from a contiguous cache (cache_batch_idx, cache_leftpad) or
// gathers them through the block table; its queries may be varlen (cu_seqlens_q: paged prefill).
// With an append (k_new, v_new) it writes the new rows to the cache itself and reads them for the
// attention from k_new / v_new, rotating q and the new keys on their way into shared memory when
// the call has a rotary table (problem/kv_append.h: the row-ownership rule).
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/numeric.h"
#include "../common/softmax.h"
#include "../common/tile_io.h"
#include "../problem/dropout.h"
#include "../problem/kv_append.h"
#include "../problem/kv_cache.h"
#include "../problem/kv_load.h"
#include "../problem/mask.h"
#include "../problem/params.h"
#include "../problem/scheduler.h"
#include "../problem/score_mod.h"
#include "../problem/seqlen.h"
#include "../ptx/cp_async.h"
#include "../ptx/ldmatrix.h"
#include "../tiles.h"

namespace flashattn_cu::sm80 {

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_,
          bool kUnpredicatedBulkLoads_ = false, int kLazyRescale_ = 0, bool kSkipKept_ = false>
struct FwdTraits {
  static constexpr bool kUnpredicatedBulkLoads = kUnpredicatedBulkLoads_;
  // With the running max (kLazyRescale 0): a warp whose rows all kept their max skips O's
  // rescale (common/softmax.h new_max kKeep; the sm90a forward's FwdTraits kSkipKept), the
  // output bitwise the running max's. knobs.h fwd_skip_kept_sm80 says where; tune_fwd
  // `skipkept` A/Bs it.
  static constexpr bool kSkipKept = kSkipKept_ && kLazyRescale_ == 0;
  // b > 0: each row's exponents against a lazy reference, O rescaled only where a key block's
  // max passes it by more than 2^b in P (common/softmax.h new_max kLazyLog2; the sm90a forward's
  // FwdTraits kLazyRescale). knobs.h fwd_lazy_rescale_sm80 says where; tune_fwd `lazy` A/Bs it.
  static constexpr int kLazyRescale = kLazyRescale_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kWarpRows = kBlockM / kNWarps;
  static constexpr int kMTiles = kWarpRows / 16;  // 16-row mma tiles per warp
  static constexpr int kNTiles = kBlockN / 8;     // 8-key accumulator tiles of S
  static constexpr int kDTiles = kHeadDim / 8;    // 8-column accumulator tiles of O
  static constexpr int kChunks = kHeadDim / 8;    // 16-byte chunks per row
  static constexpr int kSmemRowChunks = kChunks + 1;  // padded: odd stride, no ldmatrix conflicts
  static constexpr int kSmemBytes = (kBlockM + 2 * kBlockN) * kSmemRowChunks * 16;
  static_assert(kWarpRows % 16 == 0, "each warp owns whole 16-row mma tiles");
  static_assert(kBlockN % 16 == 0 && kHeadDim % 32 == 0, "tiles are made of 16x16 mma steps");
};

// How the forward of a variant forms its exponentials (common/softmax.h, ExpPolicy): the
// softcap variants take kSoftcapPolyEighths / 8 of their exp2 on the FMA pipe, and softcap alone
// fuses the exponent into one FFMA (its scores are within [-1, 1]).
template <int kVariant>
using FwdExpPolicy = ExpPolicy<variant_softcap(kVariant) ? kSoftcapPolyEighths : 0,
                               kVariant == kSoftcapVariant>;

// Shared memory of the kvcache variant: Q, fwd_kvcache_stages (tiles.h) stages of a (K, V) tile
// pair (stage 0 where the other variants have their K and V), then the paged gather's row
// offsets (problem/kv_load.h).
template <typename Traits>
constexpr int kvcache_stage_bytes() {
  return 2 * Traits::kBlockN * Traits::kSmemRowChunks * 16;
}
template <typename Traits>
constexpr int kvcache_tiles_bytes() {
  return Traits::kSmemBytes +
         (fwd_kvcache_stages(Traits::kHeadDim) - 1) * kvcache_stage_bytes<Traits>();
}
template <typename Traits>
constexpr int kvcache_smem_bytes() {
  return kvcache_tiles_bytes<Traits>() + paged_offsets_bytes<Traits::kBlockN>();
}

// The kernel parameters of a variant: the kvcache one carries the cache fields too.
template <int kVariant>
using FwdKernelParamsOf =
    std::conditional_t<variant_kvcache(kVariant), FwdKvcacheKernelParams, FwdKernelParams>;

// The fp32 output and LSE of one split (kvcache variant, several splits): row r of the block
// goes to plane row lse_row(r) of the split's slab (problem/params.h: KvcacheKernelFields; the
// row's index in the call's lse); a row that saw no key of this split gets LSE -inf, which the
// combine weighs as nothing.
template <typename Traits, int kMTiles, int kDTiles, typename LseRow>
__device__ __forceinline__ void store_split_partial(const KvcacheKernelFields& kv, int split,
                                                    const LseRow& lse_row, int rows_q,
                                                    int head_dim,
                                                    int warp_row0, int lane,
                                                    const float (&acc_o)[kMTiles][kDTiles][4],
                                                    const float (&inv_l)[kMTiles][2],
                                                    const float (&row_lse)[kMTiles][2]) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = warp_row0 + mt * 16 + g + hr * 8;
      if (row >= rows_q) continue;
      const int64_t plane_row = split * kv.partial_rows + lse_row(row);
      if (t == 0) {
        kv.lse_partial[plane_row] = row_lse[mt][hr] == INFINITY ? -INFINITY : row_lse[mt][hr];
      }
      float* dst = kv.o_partial + plane_row * head_dim + 2 * t;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        if (dt * 8 < head_dim) {
          *reinterpret_cast<float2*>(dst + dt * 8) =
              make_float2(acc_o[mt][dt][hr * 2] * inv_l[mt][hr],
                          acc_o[mt][dt][hr * 2 + 1] * inv_l[mt][hr]);
        }
      }
    }
  }
}

// The sequence info of a block's entry: the kvcache variant's rows are GQA-packed
// (problem/seqlen.h: packed_seq_info), the others' are their queries.
template <int kVariant>
__device__ __forceinline__ SeqInfo block_seq_info(const FwdKernelParamsOf<kVariant>& kp,
                                                  int batch) {
  if constexpr (variant_kvcache(kVariant)) {
    return packed_seq_info(kp.p, batch, kp.kv.pack_group);
  } else {
    return seq_info<variant_dynamic(kVariant)>(kp.p, batch);
  }
}

// kBoundedRef: the softcap variant's instance for bf16 calls with ScoreScale::bounded_ref
// (problem/score_mod.h; fwd_launch.h picks it): the exponents against a reference fixed at the
// first key block, no running max (common/softmax.h, fix_reference).
template <typename Element, typename Traits, int kVariant, bool kBoundedRef = false>
__device__ __forceinline__ void fwd_block(const FwdKernelParamsOf<kVariant>& kp, char* smem_raw) {
  static_assert(!kBoundedRef || (kVariant == kSoftcapVariant &&
                                 std::is_same_v<Element, __nv_bfloat16>),
                "the bounded reference is softcap alone in bf16 (problem/score_mod.h)");
  constexpr bool kDynamic = variant_dynamic(kVariant);  // problem/mask.h
  constexpr bool kKvcache = variant_kvcache(kVariant);
  // kvcache with two K/V stages: tile n - 1's K and V load during all of tile n (tiles.h).
  constexpr bool kKvPipelined = kKvcache && fwd_kvcache_stages(Traits::kHeadDim) == 2;
  using Ops = ElementOps<Element>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kMTiles = Traits::kMTiles, kNTiles = Traits::kNTiles, kDTiles = Traits::kDTiles;
  constexpr int kRowChunks = Traits::kSmemRowChunks;

  const FwdParams& p = kp.p;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if constexpr (variant_dropout(kVariant)) {
    // The resolved random state for the backward (FwdParams::rng_state), once per call.
    if (p.rng_state != nullptr && blockIdx.x == 0 && tid == 0) {
      const PhiloxState st = philox_state_of(p);
      p.rng_state[0] = st.seed;
      p.rng_state[1] = st.offset;
    }
  }
  // The kvcache variant overrides what it computes differently right after the common line, so
  // the other variants compile exactly as before (their SASS is unchanged).
  QueryTile tile = query_tile(ceil_div(p.seqlen_q, kBlockM), p.num_heads);
  int split = 0;  // kvcache: this block's share of the key blocks
  if constexpr (kKvcache) {
    const SplitQueryTile st = split_query_tile_at(blockIdx.x, ceil_div(p.seqlen_q, kBlockM),
                                                  p.num_heads, kp.kv.num_splits);
    tile = QueryTile{st.batch, st.head, st.m_block};
    split = st.split;
  }
  const SeqInfo seq = block_seq_info<kVariant>(kp, tile.batch);
  const int head = tile.head;
  const int head_k = head / (p.num_heads / p.num_heads_k);
  const int m_start = tile.m_block * kBlockM;
  if (m_start >= seq.seqlen_q) return;  // varlen: a query block past this entry's length
  const int rows_q = min(kBlockM, seq.seqlen_q - m_start);

  const Element* q = static_cast<const Element*>(p.q) +
                     seq.q_offset(p.q_batch_stride, p.q_row_stride) + head * p.q_head_stride +
                     m_start * p.q_row_stride;
  const Element* k = static_cast<const Element*>(p.k) +
                     seq.k_offset(p.k_batch_stride, p.k_row_stride) + head_k * p.k_head_stride;
  const Element* v = static_cast<const Element*>(p.v) +
                     seq.k_offset(p.v_batch_stride, p.v_row_stride) + head_k * p.v_head_stride;
  // kvcache: key 0 is cache row `cache_row0` (cache_leftpad); a contiguous cache folds it and
  // the cache entry (cache_batch_idx) into k and v, a paged one gathers rows from `pages`.
  int cache_row0 = 0;
  PagedKv pages{};
  // kvcache: the block's rows are the packed (query, query head) pairs of kv head `head`
  // (problem/kv_cache.h: GqaPack; group 1 without packing), q and o rows at pack.offset.
  GqaPack pack{1};
  if constexpr (kKvcache) {
    pack.group = kp.kv.pack_group;
    q = static_cast<const Element*>(p.q) + seq.q_offset(p.q_batch_stride, p.q_row_stride) +
        static_cast<int64_t>(head) * pack.group * p.q_head_stride;
    cache_row0 = kp.kv.cache_leftpad != nullptr ? max(kp.kv.cache_leftpad[tile.batch], 0) : 0;
    k = static_cast<const Element*>(p.k) + head_k * p.k_head_stride;
    v = static_cast<const Element*>(p.v) + head_k * p.v_head_stride;
    if (kp.kv.block_table != nullptr) {
      pages = PagedKv{kp.kv.block_table + tile.batch * kp.kv.block_table_batch_stride,
                      kp.kv.page_size, kp.kv.num_pages};
    } else {
      int entry = tile.batch;
      if (kp.kv.cache_batch_idx != nullptr) {  // clamped: flashattn_cu.h, KvcacheParams
        entry = min(max(kp.kv.cache_batch_idx[tile.batch], 0), kp.kv.batch_cache - 1);
      }
      k += entry * p.k_batch_stride + static_cast<int64_t>(cache_row0) * p.k_row_stride;
      v += entry * p.v_batch_stride + static_cast<int64_t>(cache_row0) * p.v_row_stride;
    }
  }
  // kvcache with an append (problem/kv_append.h): keys >= new_key0 are the new rows, read from
  // k_new / v_new; without one no key is (INT_MAX).
  int new_key0 = INT_MAX;
  if constexpr (kKvcache) {
    if (kp.kv.k_new != nullptr) {
      new_key0 = kp.kv.cache_seqlens[tile.batch] - cache_row0;
      // Rule 2: the first query head of each kv head's group writes its share of the rows.
      if (head % (p.num_heads / p.num_heads_k) == 0) {
        Element* const k_cache = const_cast<Element*>(k);
        Element* const v_cache = const_cast<Element*>(v);
        auto cache_row = [&](int row, bool is_v) -> Element* {
          Element* const base = is_v ? v_cache : k_cache;
          if (kp.kv.block_table != nullptr) {
            return base + (is_v ? pages.row_offset(row, p.v_batch_stride, p.v_row_stride)
                                : pages.row_offset(row, p.k_batch_stride, p.k_row_stride));
          }
          return base + static_cast<int64_t>(row - cache_row0) *
                            (is_v ? p.v_row_stride : p.k_row_stride);
        };
        write_appended_rows<Traits::kNThreads>(
            appended_rows_of<Element>(p, kp.kv, tile.batch, head, new_key0, cache_row0),
            append_share(kp.kv.seqlen_new, tile.m_block, ceil_div(p.seqlen_q, kBlockM), split,
                         kp.kv.num_splits),
            p.seqlen_k, p.head_dim, rotary_of(kp.kv), cache_row, tid);
      }
    }
  }

  const uint32_t sQ = ptx::smem_u32(smem_raw);
  const uint32_t sK = sQ + kBlockM * kRowChunks * 16;
  const uint32_t sV = sK + kBlockN * kRowChunks * 16;
  // kvcache, paged: the row offsets of two tiles past the K/V tiles (problem/kv_load.h); tile n
  // uses slot n % 2 (written during step n + 1, read by V_n at step n and K_n at step n + 1).
  int64_t* const paged_offsets = reinterpret_cast<int64_t*>(
      smem_raw + (kKvcache ? kvcache_tiles_bytes<Traits>() : Traits::kSmemBytes));
  auto paged_slot = [&](int n) { return paged_offsets + (n & 1) * 2 * kBlockN; };
  // kvcache, two stages: tile n's K and V at sK / sV + stage_offset(n).
  auto stage_offset = [&](int n) -> uint32_t {
    return kKvPipelined ? (n & 1) * kvcache_stage_bytes<Traits>() : 0;
  };

  // Key blocks [n_begin, n_end) hold keys some row of this block sees; those in
  // [um_begin, um_end) are seen whole by every row of the block (problem/mask.h).
  // kvcache: the mask is of the call's queries (seqlen_q / group of them), a packed tile's rows
  // those of queries m_start / group .. (m_start + kBlockM - 1) / group.
  auto kv_mask = [&](SeqInfo s) {
    s.seqlen_q /= pack.group;
    return mask_of<kDynamic>(s, p);
  };
  KeyBlocks key_blocks;
  if constexpr (kKvcache) {
    key_blocks = kv_mask(seq).template key_blocks_of_queries<kBlockN>(
        pack.query(m_start), pack.query(m_start + kBlockM - 1));
  } else {
    key_blocks = mask_of<kDynamic>(seq, p).template key_blocks<kBlockM, kBlockN>(m_start);
  }
  int n_begin = key_blocks.begin, n_end = key_blocks.end;
  if constexpr (kKvcache) {
    const SplitBlocks share = split_key_blocks(n_begin, n_end, split, kp.kv.num_splits);
    n_begin = share.begin;
    n_end = share.end;
  }
  const int um_begin = key_blocks.unmasked_begin, um_end = key_blocks.unmasked_end;

  const int g = lane / 4, t = lane % 4;
  const int warp_row0 = warp * Traits::kWarpRows;

  float acc_o[kMTiles][kDTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.f;

  OnlineSoftmax<kMTiles> softmax;
  softmax.init();
  const float scale_log2 = kp.score.scale_log2;
  // The bounded reference's sums of the 16-bit P the P V product reads (common/softmax.h,
  // exponentiate_fixed): one more MMA per P fragment against a ones column (B = bf16 1.0 pairs),
  // so each row's sum comes out of the tensor cores exactly and already quad-reduced: element
  // [hr * 2] of used_acc[mt] is row g + 8 hr's.
  float used_acc[kMTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) used_acc[mt][e] = 0.f;

  // Full tiles of a head_dim == kHeadDim call may take the unpredicated copy (tiles.h says where).
  const bool full_cols = p.head_dim == Traits::kHeadDim;
  // is_v: which half of a paged tile's offset slot (the K and V caches may have other strides).
  auto load_kv_tile = [&](uint32_t smem, const Element* base, int64_t row_stride, bool is_v,
                          int n) {
    if constexpr (kKvcache) {
      if ((n + 1) * kBlockN > new_key0) {  // the tile holds appended keys (kv_append.h)
        const int64_t* const offsets = paged_slot(n) + (is_v ? kBlockN : 0);
        auto cache_src = [&](int r) {
          return kp.kv.block_table != nullptr ? base + offsets[r]
                                              : base + (n * kBlockN + r) * row_stride;
        };
        load_appended_tile<Traits, kBlockN>(
            smem, appended_rows_of<Element>(p, kp.kv, tile.batch, head, new_key0, cache_row0),
            is_v, n * kBlockN, seq.seqlen_k, p.head_dim, rotary_of(kp.kv), cache_src, tid);
        return;
      }
      if (kp.kv.block_table != nullptr) {
        load_paged_tile_async<Traits, kBlockN>(smem, base, paged_slot(n) + (is_v ? kBlockN : 0),
                                               seq.seqlen_k - n * kBlockN, p.head_dim, tid);
        return;
      }
    }
    const Element* src = base + n * kBlockN * row_stride;
    const int rows = seq.seqlen_k - n * kBlockN;
    if (Traits::kUnpredicatedBulkLoads && full_cols && rows >= kBlockN) {
      load_tile_async<Traits, kBlockN, false>(smem, src, row_stride, rows, p.head_dim, tid);
    } else {
      load_tile_async<Traits, kBlockN>(smem, src, row_stride, rows, p.head_dim, tid);
    }
  };

  // kvcache, paged: the table lookups of tile n (problem/kv_load.h, steps 1 and 2).
  auto paged_row = [&](int n) {
    return paged_tile_row<kBlockN>(pages, cache_row0 + n * kBlockN, seq.seqlen_k - n * kBlockN,
                                   tid);
  };
  auto store_offsets = [&](int n, const PagedRow& r) {
    store_paged_offsets<kBlockN>(paged_slot(n), r, p.k_batch_stride, p.k_row_stride,
                                 p.v_batch_stride, p.v_row_stride, tid);
  };

  if (n_end > n_begin) {
    if constexpr (kKvcache) {
      if (kp.kv.rotary_cos != nullptr) {  // rotary: q at cache_seqlens (+ its query), kv_append.h
        load_rotated_rows<Traits, kBlockM>(sQ, q, pack, m_start, p.q_row_stride, p.q_head_stride,
                                           rows_q, p.head_dim, rotary_of(kp.kv),
                                           new_key0 + cache_row0, kp.kv.rotary_q_per_row, tid);
      } else {
        load_packed_rows_async<Traits, kBlockM>(sQ, q, pack, m_start, p.q_row_stride,
                                                p.q_head_stride, rows_q, p.head_dim, tid);
      }
    } else {
      load_tile_async<Traits, kBlockM>(sQ, q, p.q_row_stride, rows_q, p.head_dim, tid);
    }
    if constexpr (kKvcache) {
      if (kp.kv.block_table != nullptr) {
        store_offsets(n_end - 1, paged_row(n_end - 1));
        __syncthreads();
      }
    }
    if constexpr (kKvPipelined) {
      load_kv_tile(sK + stage_offset(n_end - 1), k, p.k_row_stride, false, n_end - 1);
      load_kv_tile(sV + stage_offset(n_end - 1), v, p.v_row_stride, true, n_end - 1);
      ptx::cp_async_commit();
      // The next tile's offsets, for its load at the loop's first step (after its barrier).
      if (kp.kv.block_table != nullptr && n_end - 2 >= n_begin) {
        store_offsets(n_end - 2, paged_row(n_end - 2));
      }
    } else {
      load_kv_tile(sK, k, p.k_row_stride, false, n_end - 1);
      ptx::cp_async_commit();
    }
  }

  // Lane-constant parts of the ldmatrix addresses (see ptx/ldmatrix.h for the lane mapping).
  const uint32_t q_lane = sQ + ((warp_row0 + lane % 16) * kRowChunks + lane / 16) * 16;
  const uint32_t k_lane = sK + (((lane / 16) * 8 + lane % 8) * kRowChunks + (lane / 8) % 2) * 16;
  const uint32_t v_lane = sV + ((lane % 16) * kRowChunks + lane / 16) * 16;

  // Key blocks outside [um_begin, um_end) need the mask; inside, the branch is skipped uniformly.
#pragma unroll 1
  for (int n = n_end - 1; n >= n_begin; --n) {
    PagedRow next_row{0, 0};
    if constexpr (kKvPipelined) {
      // Stage (n - 1) % 2 held tile n + 1, which every warp is done with; tile n - 1's offsets
      // (written at the end of step n + 1) are in.
      __syncthreads();
      if (n > n_begin) {
        load_kv_tile(sK + stage_offset(n - 1), k, p.k_row_stride, false, n - 1);
        load_kv_tile(sV + stage_offset(n - 1), v, p.v_row_stride, true, n - 1);
      }
      ptx::cp_async_commit();  // possibly empty: the group count stays one per step
      // Paged: the table entries of tile n - 2, in flight during this step.
      if (kp.kv.block_table != nullptr && n - 2 >= n_begin) next_row = paged_row(n - 2);
      ptx::cp_async_wait<1>();
      __syncthreads();  // tile n landed for all threads
    } else {
      ptx::cp_async_wait<0>();
      __syncthreads();  // K_n landed for all threads; every warp is done reading V_{n+1}
      load_kv_tile(sV, v, p.v_row_stride, true, n);
      ptx::cp_async_commit();
      // kvcache, paged: the next tile's table entries, in flight during this tile's S and V load.
      if constexpr (kKvcache) {
        if (kp.kv.block_table != nullptr && n > n_begin) next_row = paged_row(n - 1);
      }
    }

    float acc_s[kMTiles][kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.f;

#pragma unroll
    for (int ks = 0; ks < Traits::kHeadDim / 16; ++ks) {
      uint32_t qa[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
        ptx::ldmatrix_x4(qa[mt], q_lane + (mt * 16 * kRowChunks + ks * 2) * 16);
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t kb[4];
        ptx::ldmatrix_x4(kb,
                         k_lane + stage_offset(n) + (np * 16 * kRowChunks + ks * 2) * 16);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Ops::mma(acc_s[mt][2 * np], qa[mt], kb[0], kb[1]);
          Ops::mma(acc_s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }

    apply_score_mods<kVariant>(acc_s, kp, tile.batch, head, m_start + warp_row0, n * kBlockN,
                               lane);
    if (n >= um_end || n < um_begin) {
      // Built here, not held across the loop (whose registers are full).
      if constexpr (kKvcache) {
        kv_mask(block_seq_info<kVariant>(kp, tile.batch))
            .apply(acc_s, m_start + warp_row0, n * kBlockN, lane, pack);
      } else {
        mask_of<kDynamic>(seq_info<kDynamic>(p, tile.batch), p)
            .apply(acc_s, m_start + warp_row0, n * kBlockN, lane);
      }
    }
    if constexpr (kBoundedRef) {
      // The bounded reference (softcap alone, bf16, ScoreScale::bounded_ref; this instance is
      // chosen in launch_fwd): fixed at the first key block; no max, no rescale after it
      // (common/softmax.h, fix_reference).
      if (n == n_end - 1) softmax.fix_reference(acc_s, kp.score.ref_floor);
      softmax.template exponentiate_fixed<FwdExpPolicy<kVariant>>(acc_s, scale_log2);
    } else {
      softmax.template update<FwdExpPolicy<kVariant>, Traits::kLazyRescale, Traits::kSkipKept>(
          acc_s, acc_o, scale_log2);
    }
    if constexpr (variant_dropout(kVariant)) {
      // After the row statistics (the LSE is of the undropped P): dropped elements leave P V.
      dropout_of(kp, tile.batch, head).drop(acc_s, m_start + warp_row0, n * kBlockN, lane);
    }

    if constexpr (!kKvPipelined) {
      if constexpr (kKvcache) {
        // Slot (n - 1) % 2 was last read by V_{n+1}'s load, before the previous barrier.
        if (kp.kv.block_table != nullptr && n > n_begin) store_offsets(n - 1, next_row);
      }
      ptx::cp_async_wait<0>();
      __syncthreads();  // V_n landed; every warp is done reading K_n (and the offsets are in)
      if (n > n_begin) {
        load_kv_tile(sK, k, p.k_row_stride, false, n - 1);
        ptx::cp_async_commit();
      }
    }

#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t pa[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        pa[mt][0] = Ops::pack(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
        pa[mt][1] = Ops::pack(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
        pa[mt][2] = Ops::pack(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
        pa[mt][3] = Ops::pack(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t vb[4];
        ptx::ldmatrix_x4_trans(vb,
                               v_lane + stage_offset(n) + (kk * 16 * kRowChunks + dp * 2) * 16);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Ops::mma(acc_o[mt][2 * dp], pa[mt], vb[0], vb[1]);
          Ops::mma(acc_o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
      if constexpr (kBoundedRef) {
        constexpr uint32_t kOnes = Ops::kOnePair;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) Ops::mma(used_acc[mt], pa[mt], kOnes, kOnes);
      }
    }
    if constexpr (kKvPipelined) {
      // Slot n % 2 was last read by tile n's load (step n + 1, before this step's barriers);
      // the next step's first barrier publishes it.
      if (kp.kv.block_table != nullptr && n - 2 >= n_begin) store_offsets(n - 2, next_row);
    }
  }

  Element* o = static_cast<Element*>(p.o) + seq.q_offset(p.o_batch_stride, p.o_row_stride) +
               head * p.o_head_stride + m_start * p.o_row_stride;
  const int64_t row0 = seq.lse_row0(head, p.num_heads, p.seqlen_q, p.total_q) + m_start;
  float* lse = p.lse + row0;
  float2* stats = p.softmax_stats != nullptr ? reinterpret_cast<float2*>(p.softmax_stats) + row0
                                             : nullptr;
  float inv_l[kMTiles][2], row_lse[kMTiles][2];
  RowStats row_stats[kMTiles][2];
  float used_sums[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    used_sums[mt][0] = used_acc[mt][0];
    used_sums[mt][1] = used_acc[mt][2];
  }
  softmax.finalize(kp.score.score_scale, inv_l, row_lse, row_stats,
                   kBoundedRef ? used_sums : nullptr);
  // kvcache: row r's index in the call's lse (and in the split partials).
  auto kv_lse_row = [&](int r) {
    return pack.lse_index(seq, head, p.num_heads, p.seqlen_q / pack.group, p.total_q,
                          m_start + r);
  };
  if constexpr (kKvcache) {
    if (kp.kv.num_splits > 1) {
      store_split_partial<Traits>(kp.kv, split, kv_lse_row, rows_q, p.head_dim, warp_row0, lane,
                                  acc_o, inv_l, row_lse);
      return;
    }
    o = static_cast<Element*>(p.o) + seq.q_offset(p.o_batch_stride, p.o_row_stride) +
        static_cast<int64_t>(head) * pack.group * p.o_head_stride;
  }
  if constexpr (variant_dropout(kVariant)) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) inv_l[mt][hr] *= kp.dropout.rp;  // the kept elements' scale
  }

  // Stage O through this warp's own rows of sQ (only this warp ever read them), then write
  // 16-byte chunks to global memory. The staging stores land on bytes that other lanes of the
  // warp read with ldmatrix in the last step, and nothing orders the two under independent
  // thread scheduling (compute-sanitizer racecheck flagged it on the kvcache variant, session
  // 23): the barrier does, once per tile.
  __syncthreads();
  char* sO = smem_raw;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = warp_row0 + mt * 16 + g + hr * 8;
      if (t == 0 && row < rows_q) {
        if constexpr (kKvcache) {
          p.lse[kv_lse_row(row)] = row_lse[mt][hr];
        } else {
          lse[row] = row_lse[mt][hr];
        }
        if (stats != nullptr) {
          stats[row] = make_float2(row_stats[mt][hr].row_max, row_stats[mt][hr].log2_sum);
        }
      }
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const uint32_t packed = Ops::pack(acc_o[mt][dt][hr * 2] * inv_l[mt][hr],
                                          acc_o[mt][dt][hr * 2 + 1] * inv_l[mt][hr]);
        *reinterpret_cast<uint32_t*>(sO + (row * kRowChunks + dt) * 16 + t * 4) = packed;
      }
    }
  }
  __syncthreads();
  constexpr int kTotal = kBlockM * Traits::kChunks;
#pragma unroll
  for (int i = 0; i < ceil_div(kTotal, Traits::kNThreads); ++i) {
    const int idx = tid + i * Traits::kNThreads;
    if (kTotal % Traits::kNThreads != 0 && idx >= kTotal) break;
    const int r = idx / Traits::kChunks, c = idx % Traits::kChunks;
    if (r < rows_q && c * 8 < p.head_dim) {
      Element* dst = o + r * p.o_row_stride + c * 8;
      if constexpr (kKvcache) {
        dst = o + pack.offset(m_start + r, p.o_row_stride, p.o_head_stride) + c * 8;
      }
      *reinterpret_cast<uint4*>(dst) =
          *reinterpret_cast<const uint4*>(sO + (r * kRowChunks + c) * 16);
    }
  }
}

// kDynamic: sequence lengths from cu_seqlens / seqused_k (problem/seqlen.h).
template <typename Element, typename Traits, int kVariant, bool kBoundedRef = false>
__global__ void __launch_bounds__(Traits::kNThreads)
    fwd_kernel(const __grid_constant__ FwdKernelParams params) {
  extern __shared__ __align__(128) char smem[];
  if constexpr (variant_dynamic(kVariant)) varlen_kernel_start(params.p);  // problem/seqlen.h
  fwd_block<Element, Traits, kVariant, kBoundedRef>(params, smem);
}

// The kvcache variant (problem/kv_cache.h), with its own parameter type.
template <typename Element, typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads)
    fwd_kvcache_kernel(const __grid_constant__ FwdKvcacheKernelParams params) {
  extern __shared__ __align__(128) char smem[];
  // Paged prefill's cu_seqlens (packed queries); its outside rows are cleared on the unpacked
  // call after it (dispatch_kvcache.cu), these parameters being packed.
  check_seqlens(params.p, params.kv.pack_group);
  fwd_block<Element, Traits, kKvcacheVariant>(params, smem);
}

}  // namespace flashattn_cu::sm80
