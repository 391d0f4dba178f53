// The mask policy: which keys each query row sees, in one place for every kernel. flash_attn's
// rules, bottom-right aligned: with d = i + seqlen_k - seqlen_q the diagonal key of query i, it
// sees keys j with d - window_left <= j <= d + window_right (a side of -1 is unbounded); causal is
// window_right = 0. It answers three questions:
//  * key_blocks: the key blocks a query block visits, and which of them need the element mask
//    (forward, deterministic dQ kernel), so the bulk of the loop pays nothing and a window costs
//    only the blocks it covers;
//  * query_blocks: the query blocks a key block visits, and which need the element mask
//    (backward main kernels);
//  * the element mask itself on a score tile (apply, apply_transposed), also covering the
//    sequence tail (keys >= seqlen_k).
// Score tiles are mma C fragments: s[mt][nt][hr * 2 + e] is row (row0 + mt * 16 + g + hr * 8),
// key (col0 + nt * 8 + 2t + e), with g = lane / 4, t = lane % 4.
#pragma once

#include <math.h>

#include "../common/int_math.h"
#include "scheduler.h"
#include "seqlen.h"

namespace flashattn_cu {

// Key limit of one query row: keys j < limit are visible (the causal rule above).
__host__ __device__ __forceinline__ int visible_key_limit(int row, int seqlen_q, int seqlen_k,
                                                          bool causal) {
  if (!causal) return seqlen_k;
  // (seqlen_k - seqlen_q) first: row + 1 + seqlen_k alone can pass INT_MAX (kMaxSeqlen).
  const int limit = row + 1 + (seqlen_k - seqlen_q);
  return limit < seqlen_k ? limit : seqlen_k;
}

// Key blocks a query block visits: [begin, end). Blocks in [unmasked_begin, unmasked_end) are seen
// whole by every row of the query block; the others need the element mask.
struct KeyBlocks {
  int begin;
  int end;
  int unmasked_begin;
  int unmasked_end;
};

// Query blocks a key block is visited by: [begin, end). Blocks in [unmasked_begin, unmasked_end)
// see every key of the key block (and the key block is whole); the others need the element mask.
struct QueryBlocks {
  int begin;
  int end;
  int unmasked_begin;
  int unmasked_end;
};

// Which query a score tile's row is: the row itself, except in a GQA-packed tile
// (problem/kv_cache.h: GqaPack), whose row R is query R / group.
struct IdentityRows {
  __host__ __device__ __forceinline__ int operator()(int row) const { return row; }
};

struct Mask {
  int seqlen_q;
  int seqlen_k;
  int left;   // window: keys at most `left` before the diagonal; -1: unbounded
  int right;  // keys at most `right` after it; -1: unbounded; causal: 0

  // A window side at least as wide as the matrix is the same as none (and keeps the arithmetic
  // below within int64 trivially).
  __host__ __device__ __forceinline__ Mask(const SeqInfo& si, bool causal, int window_left = -1,
                                           int window_right = -1)
      : seqlen_q(si.seqlen_q),
        seqlen_k(si.seqlen_k),
        left(window_left < 0 || window_left >= si.seqlen_k ? -1 : window_left),
        right(causal ? 0 : window_right < 0 || window_right >= si.seqlen_q ? -1 : window_right) {}

  // Params: AttnParams or a struct derived from it (is_causal, window_left, window_right).
  template <typename Params>
  __host__ __device__ __forceinline__ Mask(const SeqInfo& si, const Params& p)
      : Mask(si, p.is_causal, p.window_left, p.window_right) {}

  // The visible keys of `row`: [key_begin(row), key_end(row)), empty when begin >= end.
  // (row + seqlen_k - seqlen_q) is the row's diagonal key; int64: window sides up to seqlen.
  __host__ __device__ __forceinline__ int key_begin(int row) const {
    if (left < 0) return 0;
    const int64_t b = static_cast<int64_t>(row) + (seqlen_k - seqlen_q) - left;
    return b <= 0 ? 0 : b >= seqlen_k ? seqlen_k : static_cast<int>(b);
  }
  __host__ __device__ __forceinline__ int key_end(int row) const {
    if (right < 0) return seqlen_k;
    if (right == 0) return visible_key_limit(row, seqlen_q, seqlen_k, true);
    const int64_t e = static_cast<int64_t>(row) + (seqlen_k - seqlen_q) + right + 1;
    return e <= 0 ? 0 : e >= seqlen_k ? seqlen_k : static_cast<int>(e);
  }
  // Kept for the causal-only callers: the end of row's visible keys.
  __host__ __device__ __forceinline__ int key_limit(int row) const { return key_end(row); }

  // Rows by which a forward's query blocks sit above multiples of kBlockM, so that the last
  // block ends at the last row and the partial block (seqlen_q not a multiple of kBlockM) is the
  // first: where every row's keys run from key 0 to an end that grows with the row (causal, or a
  // bounded right side with the left side unbounded), the first rows see fewest keys and the
  // partial block walks fewest key blocks, instead of a full walk for a few rows at the bottom.
  // 0 elsewhere: with no end by row the last rows see as many keys as any, and a bounded left
  // side walks a band the shift would move across key-block edges (benchmarks/tune/
  // walk_model.py: causal alone -1.4..-3.8% key-block steps, causal with left windows up to +5%).
  // The first block's m_start is then -shift: its rows above 0 are loaded as zeros (TMA) or as
  // the previous varlen entry's rows, and never stored (any shift in [0, kBlockM) is correct).
  template <int kBlockM>
  __host__ __device__ __forceinline__ int query_block_shift() const {
    if (right < 0 || left >= 0) return 0;
    const int partial = seqlen_q % kBlockM;
    return partial == 0 ? 0 : kBlockM - partial;
  }

  // The key blocks of the query block whose first row is m_start (< 0 for a shifted first block,
  // query_block_shift: its rows above 0 see no key and are never stored).
  template <int kBlockM, int kBlockN>
  __host__ __device__ __forceinline__ KeyBlocks key_blocks(int m_start) const {
    // Rows past seqlen_q are padding: never stored.
    return key_blocks_of_queries<kBlockN>(m_start, m_start + kBlockM - 1);
  }

  // The key blocks of a tile whose rows are queries first .. last (a GQA-packed tile: the
  // queries of its first and last rows).
  template <int kBlockN>
  __host__ __device__ __forceinline__ KeyBlocks key_blocks_of_queries(int first,
                                                                      int last) const {
    KeyBlocks r;
    r.begin = key_begin(first) / kBlockN;
    const int end_key = key_end(last);
    r.end = end_key > 0 ? ceil_div(end_key, kBlockN) : 0;
    if (r.end < r.begin) r.end = r.begin;
    // Keys every row sees: from the last row's begin to the first row's end.
    r.unmasked_begin = ceil_div(key_begin(last), kBlockN);
    const int all_end = key_end(first);
    r.unmasked_end = all_end > 0 ? all_end / kBlockN : 0;
    if (r.unmasked_end < r.unmasked_begin) r.unmasked_end = r.unmasked_begin;
    return r;
  }

  // n_start: the key block's first key; keys_valid: its keys below seqlen_k; num_m: query blocks.
  template <int kBlockM, int kBlockN>
  __host__ __device__ __forceinline__ QueryBlocks query_blocks(int n_start, int keys_valid,
                                                               int num_m) const {
    const int64_t shift = static_cast<int64_t>(seqlen_k) - seqlen_q;
    const int64_t first_key = n_start, last_key = static_cast<int64_t>(n_start) + keys_valid - 1;
    // Row i sees key j when j - shift - right <= i (right >= 0) and i <= j - shift + left
    // (left >= 0).
    const int64_t first_row = right < 0 ? 0 : first_key - shift - right;
    const int64_t last_row = left < 0 ? seqlen_q - 1 : last_key - shift + left;
    QueryBlocks r;
    r.begin = first_row <= 0 ? 0 : static_cast<int>(imin64(num_m, first_row / kBlockM));
    r.end = last_row < first_row || last_row < 0
                ? r.begin
                : static_cast<int>(imin64(num_m, last_row / kBlockM + 1));
    if (r.end < r.begin) r.end = r.begin;
    // Rows that see every key of the block: from the row that sees its last key to the row
    // that still sees its first key.
    if (keys_valid < kBlockN) {
      r.unmasked_begin = r.unmasked_end = num_m;
      return r;
    }
    const int64_t full_first = right < 0 ? 0 : last_key - shift - right;
    r.unmasked_begin = full_first <= 0 ? 0 : static_cast<int>(imin64(num_m, ceil_div<int64_t>(full_first, kBlockM)));
    if (left < 0) {
      r.unmasked_end = num_m;
    } else {
      const int64_t full_last = first_key - shift + left;  // inclusive
      r.unmasked_end = full_last < 0 ? 0 : static_cast<int>(imin64(num_m, (full_last + 1) / kBlockM));
    }
    if (r.unmasked_end < r.unmasked_begin) r.unmasked_end = r.unmasked_begin;
    return r;
  }

  // Sets every score whose key is past its row's limit to -inf. rows: a tile row's query.
  template <int kMTiles, int kNTiles, typename Rows = IdentityRows>
  __device__ __forceinline__ void apply(float (&s)[kMTiles][kNTiles][4], int row0, int col0,
                                        int lane, Rows rows = Rows{}) const {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int row = rows(row0 + mt * 16 + g + hr * 8);
        const int lo = key_begin(row), hi = key_end(row);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = col0 + nt * 8 + 2 * t + e;
            if (key >= hi || (left >= 0 && key < lo)) s[mt][nt][hr * 2 + e] = -INFINITY;
          }
        }
      }
    }
  }

  // The same on a transposed score tile, as the backward holds S^T (rows are keys, columns are
  // queries): s[nt][hr * 2 + e] is key (key0 + g + hr * 8), query (query0 + nt * 8 + 2t + e).
  template <int kQTiles>
  __device__ __forceinline__ void apply_transposed(float (&s)[kQTiles][4], int key0, int query0,
                                                   int lane) const {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int query = query0 + nt * 8 + 2 * t + e;
        const int lo = key_begin(query), hi = key_end(query);
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int key = key0 + g + hr * 8;
          if (key >= hi || (left >= 0 && key < lo)) s[nt][hr * 2 + e] = -INFINITY;
        }
      }
    }
  }
};

// Which compiled instance of a kernel a call needs: the dynamic one (kDynamic = true) reads
// sequence arrays (problem/seqlen.h) and applies sliding windows (a left window's first visited
// and first unmasked key blocks are live values in the main loop, a window's bounds need int64
// arithmetic); the static one knows at compile time there is neither, so the common case
// (padded, no mask or causal) keeps the registers it had.
template <typename Params>
__host__ __device__ __forceinline__ bool dynamic_mask_instance(const Params& p) {
  return dynamic_seqlens(p) || p.window_left >= 0 || (!p.is_causal && p.window_right >= 0);
}
template <typename Params>
__host__ __device__ __forceinline__ bool dynamic_instance(const Params& p) {
  return dynamic_mask_instance(p) || p.alibi_slopes != nullptr || p.softcap > 0.f;
}

// The compiled variants of the main kernels: static (padded, no mask or causal), dynamic
// (sequence arrays, windows), and dynamic with each score modifier (problem/score_mod.h): ALiBi,
// softcap, both; and dropout (problem/dropout.h), which takes ALiBi and softcap as run-time
// branches. Each modifier's per-tile work costs registers the others should not pay for
// (ALiBi with softcap, the rarest, spills the most), and dropout's Philox rounds cost more than
// the run-time modifier branches do, so one variant holds all of them with dropout instead of
// doubling the four modifier variants (the registers and the build time: benchmarks/NOTES.md
// section 11). A kernel template takes the variant; kDynamic / kAlibi / kSoftcap / kDropout
// derive from it (variant_*); the run-time modifiers ask alibi_on / softcap_on
// (problem/score_mod.h).
enum KernelVariant : int {
  kStaticVariant = 0,
  kDynamicVariant = 1,
  kAlibiVariant = 2,
  kSoftcapVariant = 3,
  kAlibiSoftcapVariant = 4,
  kDropoutVariant = 5,
  // flash_attn_with_kvcache (problem/kv_cache.h): dynamic, with ALiBi and softcap as run-time
  // branches like the dropout variant, plus the run-time modes of the cache: split-KV partial
  // outputs, a paged gather, cache_batch_idx and cache_leftpad. Only the sm80 forward compiles it
  // (one instance per tile, launched by run_fwd_kvcache); with_variant never picks it, so the
  // other kernels and their build are as before.
  kKvcacheVariant = 6,
  // Softcap alone on the static variant's mask (padded, no window): the sm90a forward's and
  // backward's instance for those calls (static_softcap_call), on the static variant's tiles,
  // which the dynamic softcap variant's live values do not fit (ptxas, sm_90a: d = 128 128 x 176
  // 0 bytes of spills against 288). with_variant never picks it; only sm90/fwd_launch.h and
  // sm90/bwd_launch.h compile it.
  kStaticSoftcapVariant = 7,
  // A sliding window alone on a padded call (no sequence arrays, no modifier, no dropout): the
  // dynamic variant's mask without its sequence arrays (padded_window_call), the sm90a forward's
  // and backward's instance for those calls. with_variant never picks it; only
  // sm90/fwd_launch.h and sm90/bwd_launch.h compile it.
  kPaddedWindowVariant = 8,
  // ALiBi alone on the static variant's mask (padded, no window): the sm90a forward's and
  // backward's instance for those calls (static_alibi_call), without the sequence arrays and the
  // window arithmetic of the dynamic ALiBi variant, on the static variant's tiles. with_variant
  // never picks it; only sm90/fwd_launch.h and sm90/bwd_launch.h compile it.
  kStaticAlibiVariant = 9
};
constexpr int kNumKernelVariants = 10;

// Whether a variant's mask may hold a window (and its kernels the int64 window arithmetic).
// Every such variant but kPaddedWindowVariant also reads the sequence arrays (variant_seqlens);
// the kernels that never compile that variant (all but the sm90 forward) take variant_dynamic
// for both.
constexpr bool variant_dynamic(int v) {
  return v != kStaticVariant && v != kStaticSoftcapVariant && v != kStaticAlibiVariant;
}
// Whether a variant reads the sequence arrays (cu_seqlens, seqused_k: problem/seqlen.h).
constexpr bool variant_seqlens(int v) { return variant_dynamic(v) && v != kPaddedWindowVariant; }
constexpr bool variant_alibi(int v) {
  return v == kAlibiVariant || v == kAlibiSoftcapVariant || v == kStaticAlibiVariant;
}
constexpr bool variant_softcap(int v) {
  return v == kSoftcapVariant || v == kAlibiSoftcapVariant || v == kStaticSoftcapVariant;
}
constexpr bool variant_dropout(int v) { return v == kDropoutVariant; }
constexpr bool variant_kvcache(int v) { return v == kKvcacheVariant; }
// The variants that decide ALiBi and softcap at run time (the others know at compile time).
constexpr bool variant_runtime_mods(int v) { return variant_dropout(v) || variant_kvcache(v); }
// Whether the variant may apply ALiBi / softcap at all (at compile time, or at run time).
constexpr bool variant_may_alibi(int v) { return variant_alibi(v) || variant_runtime_mods(v); }
constexpr bool variant_may_softcap(int v) { return variant_softcap(v) || variant_runtime_mods(v); }

template <typename Params>
__host__ __device__ __forceinline__ int kernel_variant(const Params& p) {
  const bool alibi = p.alibi_slopes != nullptr, softcap = p.softcap > 0.f;
  return p.dropout_p > 0.f       ? kDropoutVariant
         : alibi && softcap      ? kAlibiSoftcapVariant
         : alibi                 ? kAlibiVariant
         : softcap               ? kSoftcapVariant
         : dynamic_instance(p)   ? kDynamicVariant
                                 : kStaticVariant;
}

// Whether kStaticSoftcapVariant can serve a call of kSoftcapVariant (padded, no window).
template <typename Params>
__host__ __device__ __forceinline__ bool static_softcap_call(const Params& p) {
  return kernel_variant(p) == kSoftcapVariant && !dynamic_mask_instance(p);
}

// Whether kStaticAlibiVariant can serve a call of kAlibiVariant (padded, no window).
template <typename Params>
__host__ __device__ __forceinline__ bool static_alibi_call(const Params& p) {
  return kernel_variant(p) == kAlibiVariant && !dynamic_mask_instance(p);
}

// Whether kPaddedWindowVariant can serve a call of kDynamicVariant (a window, padded).
template <typename Params>
__host__ __device__ __forceinline__ bool padded_window_call(const Params& p) {
  return kernel_variant(p) == kDynamicVariant && !dynamic_seqlens(p);
}

// The mask of `seq` for kernel instance kDynamic (the static one has no window: none or causal,
// known at compile time to need no int64 window arithmetic).
template <bool kDynamic, typename Params>
__host__ __device__ __forceinline__ Mask mask_of(const SeqInfo& seq, const Params& p) {
  return Mask(seq, p.is_causal, kDynamic ? p.window_left : -1, kDynamic ? p.window_right : -1);
}

// The light blocks of a padded call's window that the schedulers walk last
// (problem/scheduler.h): leading query blocks (forward, query_tile_at's defer_m) or trailing
// key blocks (backward, key_tile_at's defer_n) of `block` rows / keys, from the call's window as
// the kernels normalize it (Mask). None for varlen, whose entries' lengths the host does not see.
template <typename Params>
inline int deferred_query_blocks(const Params& p, int block_m) {
  if (dynamic_seqlens(p)) return 0;
  const Mask mask = mask_of<true>(seq_info<false>(p, 0), p);
  return light_query_blocks(mask.left, mask.right, p.seqlen_q, p.seqlen_k, block_m);
}
template <typename Params>
inline int deferred_key_blocks(const Params& p, int block_n) {
  if (dynamic_seqlens(p)) return 0;
  const Mask mask = mask_of<true>(seq_info<false>(p, 0), p);
  return light_key_blocks(mask.left, mask.right, p.seqlen_q, p.seqlen_k, block_n);
}

}  // namespace flashattn_cu
