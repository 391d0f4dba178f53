// The fused append + rotary of the kvcache variant: flash_attn_with_kvcache(..., k, v,
// rotary_cos, rotary_sin) in the attention kernel itself (flashattn_cu.h: KvcacheParams::k_new;
// kernel fields problem/params.h: KvcacheKernelFields). Device only.
//
// Keys. Entry b's logical key j is cache row leftpad + j; with an append, keys
// j < new_key0 = cache_seqlens[b] - leftpad[b] are the cache's, keys new_key0 + i (i < seqlen_new)
// are new row i of k_new / v_new, bound for cache row cache_seqlens[b] + i, and the entry attends
// to min(cache_seqlens[b] + seqlen_new, capacity) - leftpad[b] keys (FwdParams::seqused_k).
//
// Row ownership: no block waits for another, and no two blocks touch one cache row.
//  1. The attention never reads an appended row from the cache. A K/V tile holding some key
//     >= new_key0 is loaded by load_appended_tile: cache keys by cp.async from the cache, new keys
//     from k_new / v_new (k rotated in registers on its way to shared memory). So no block of the
//     call depends on a write of another block (there is no grid-wide order in one launch), and
//     the splits of a query block and the query blocks / query heads of a kv head may run in any
//     order.
//  2. Each appended row (entry b, kv head hk, row i) is written by exactly one block
//     (kv_cache.h: append_share): among the blocks of entry b whose query head is the first of hk's group
//     (head % (heads / heads_k) == 0; under GQA packing every block's head is a kv head, so all
//     of them), the (query block, split) pair of index o = m_block * num_splits + split writes
//     rows [o * share, (o + 1) * share) of owners = query_blocks * num_splits, share =
//     ceil(seqlen_new / owners). The rule uses neither the mask nor the split's key range, so rows
//     that no query sees (a window, causal with seqlen_new > seqlen_q) are written too, once.
//  3. The rows written (cache rows >= cache_seqlens[b]) and the rows read (leftpad .. below
//     cache_seqlens[b]) are disjoint, so reads and writes of one launch never meet; unless the
//     caller aliases them (two entries on one cache_batch_idx, or block tables sharing the page
//     being appended to), where, as in flash_attn, what a reader sees is unordered. Rows at or
//     past the capacity are not written (a caller's bug: cache_seqlens + seqlen_new must fit).
//  The cache receives the bytes the attention used: both come from rotated_chunk on the same row,
//  position and table, and that is torch's fp32 arithmetic step by step (ptx::mul_rn / sub_rn /
//  add_rn, no FMA, no flush to zero), rounded to nearest even: what flashattn_cu/kvcache.py's
//  `_rotate` writes, bit for bit.
#pragma once

#include <cstdint>

#include "../common/int_math.h"
#include "../common/numeric.h"
#include "../ptx/cp_async.h"
#include "../ptx/math.h"
#include "../ptx/shared.h"
#include "kv_cache.h"
#include "params.h"

namespace flashattn_cu {

// The rotary tables (rotary_seqlen, dim / 2) of a call; cos null: no rotary.
struct RotaryTable {
  const void* cos;
  const void* sin;
  int dim;
  bool interleaved;
  int max_pos;  // positions are clamped into [0, max_pos] (the tables' last row)

  __device__ __forceinline__ int clamp(int pos) const {
    return pos < 0 ? 0 : pos > max_pos ? max_pos : pos;
  }
};

// Chunk c (channels 8c .. 8c + 7) of `row` (q, k_new: head_dim contiguous channels) with the
// rotary embedding at position pos applied (channels >= dim and a null table: unchanged).
// interleaved: pair (2k, 2k + 1) -> (x0 cos_k - x1 sin_k, x0 sin_k + x1 cos_k); else channel
// k < dim / 2 pairs with k + dim / 2: x_k cos_k - x_{k+h} sin_k and x_k sin_k + x_{k+h} cos_k.
// dim % 16 == 0, so a chunk lies in one half and its partner chunk is whole.
template <typename Element>
__device__ __forceinline__ uint4 rotated_chunk(const Element* row, int c, const RotaryTable& rot,
                                               int pos) {
  using Ops = ElementOps<Element>;
  const uint4 x = *reinterpret_cast<const uint4*>(row + c * 8);
  if (rot.cos == nullptr || c * 8 >= rot.dim) return x;
  const int64_t half = rot.dim / 2;
  const Element* cos = static_cast<const Element*>(rot.cos) + pos * half;
  const Element* sin = static_cast<const Element*>(rot.sin) + pos * half;
  const uint32_t xw[4] = {x.x, x.y, x.z, x.w};
  uint32_t out[4];
  if (rot.interleaved) {
    // Pairs 4c .. 4c + 3: word k of the chunk is pair 4c + k.
    const uint2 cv = *reinterpret_cast<const uint2*>(cos + c * 4);
    const uint2 sv = *reinterpret_cast<const uint2*>(sin + c * 4);
    const float2 cf[2] = {Ops::unpack(cv.x), Ops::unpack(cv.y)};
    const float2 sf[2] = {Ops::unpack(sv.x), Ops::unpack(sv.y)};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 v = Ops::unpack(xw[k]);
      const float co = k % 2 ? cf[k / 2].y : cf[k / 2].x;
      const float si = k % 2 ? sf[k / 2].y : sf[k / 2].x;
      out[k] = Ops::pack(ptx::sub_rn(ptx::mul_rn(v.x, co), ptx::mul_rn(v.y, si)),
                         ptx::add_rn(ptx::mul_rn(v.x, si), ptx::mul_rn(v.y, co)));
    }
  } else {
    const int half_chunks = rot.dim / 16;
    const bool first = c < half_chunks;
    const int partner = first ? c + half_chunks : c - half_chunks;
    const uint4 pv = *reinterpret_cast<const uint4*>(row + partner * 8);
    const int k0 = (first ? c : partner) * 8;
    const uint4 cv = *reinterpret_cast<const uint4*>(cos + k0);
    const uint4 sv = *reinterpret_cast<const uint4*>(sin + k0);
    const uint32_t pw[4] = {pv.x, pv.y, pv.z, pv.w};
    const uint32_t cw[4] = {cv.x, cv.y, cv.z, cv.w};
    const uint32_t sw[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 v = Ops::unpack(xw[k]), p = Ops::unpack(pw[k]);
      const float2 co = Ops::unpack(cw[k]), si = Ops::unpack(sw[k]);
      // First half: x1 cos - x2 sin (x1 = this channel); second: x1 sin + x2 cos (x1 = partner).
      out[k] = first ? Ops::pack(ptx::sub_rn(ptx::mul_rn(v.x, co.x), ptx::mul_rn(p.x, si.x)),
                                 ptx::sub_rn(ptx::mul_rn(v.y, co.y), ptx::mul_rn(p.y, si.y)))
                     : Ops::pack(ptx::add_rn(ptx::mul_rn(p.x, si.x), ptx::mul_rn(v.x, co.x)),
                                 ptx::add_rn(ptx::mul_rn(p.y, si.y), ptx::mul_rn(v.y, co.y)));
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// The appended rows of one entry and kv head, as the kernel sees them.
template <typename Element>
struct AppendedRows {
  const Element* k;  // k_new row 0 of (entry, kv head)
  const Element* v;
  int64_t k_row_stride, v_row_stride;
  int new_key0;   // logical key of new row 0 (cache_seqlens - leftpad; may be < 0)
  int first_row;  // cache row of new row 0 (cache_seqlens)
};

// The appended rows of (entry batch, query head head) of a kvcache call with k_new; leftpad: the
// entry's cache row of key 0.
template <typename Element>
__device__ __forceinline__ AppendedRows<Element> appended_rows_of(const FwdParams& p,
                                                                  const KvcacheKernelFields& kv,
                                                                  int batch, int head,
                                                                  int new_key0, int leftpad) {
  const int head_k = head / (p.num_heads / p.num_heads_k);
  AppendedRows<Element> a;
  a.k = static_cast<const Element*>(kv.k_new) + batch * kv.knew_batch_stride +
        head_k * kv.knew_head_stride;
  a.v = static_cast<const Element*>(kv.v_new) + batch * kv.vnew_batch_stride +
        head_k * kv.vnew_head_stride;
  a.k_row_stride = kv.knew_row_stride;
  a.v_row_stride = kv.vnew_row_stride;
  a.new_key0 = new_key0;
  a.first_row = new_key0 + leftpad;
  return a;
}

// The call's rotary table (cos null without one); positions clamp to the tables' last row, as
// far as flash_attn reads them: an appended key's position is its cache row (< the capacity <=
// rotary_seqlen), a query's cache_seqlens + its index, which may pass the capacity when seqlen_q
// exceeds seqlen_new (flash_attn then reads the tables' rows past the capacity, so these do too).
__device__ __forceinline__ RotaryTable rotary_of(const KvcacheKernelFields& kv) {
  return RotaryTable{kv.rotary_cos, kv.rotary_sin, kv.rotary_dim, kv.rotary_interleaved,
                     kv.rotary_seqlen - 1};
}

// Writes this block's share of the appended rows to the cache: k rotated at its position,
// v as is. cache_row(row, is_v): element 0 of cache row `row` (absolute) in the K or V cache.
template <int kThreads, typename Element, typename CacheRow>
__device__ __forceinline__ void write_appended_rows(const AppendedRows<Element>& rows,
                                                    AppendShare share, int capacity,
                                                    int head_dim, const RotaryTable& rot,
                                                    const CacheRow& cache_row, int tid) {
  const int chunks = head_dim / 8;
  // 64-bit: one block may own every appended row (the sm90 decode path's append kernel), and
  // rows x chunks passes 2^31 from 2^34 / head_dim rows on.
  const int64_t total = static_cast<int64_t>(share.end - share.begin) * chunks;
#pragma unroll 1
  for (int64_t idx = tid; idx < total; idx += kThreads) {
    const int i = share.begin + static_cast<int>(idx / chunks);
    const int c = static_cast<int>(idx % chunks);
    const int row = rows.first_row + i;
    if (row < 0 || row >= capacity) continue;  // a caller's bug: never outside the cache
    const uint4 kc = rotated_chunk(rows.k + i * rows.k_row_stride, c, rot, rot.clamp(row));
    const uint4 vc = *reinterpret_cast<const uint4*>(rows.v + i * rows.v_row_stride + c * 8);
    *reinterpret_cast<uint4*>(cache_row(row, false) + c * 8) = kc;
    *reinterpret_cast<uint4*>(cache_row(row, true) + c * 8) = vc;
  }
}

// A K (is_v false) or V tile of kRows keys key0 .. key0 + kRows - 1 that holds appended keys
// (some key0 + r >= rows.new_key0): keys below new_key0 by cp.async from the cache (cache_src(r):
// element 0 of the tile's row r there), keys in [new_key0, keys) from k_new / v_new (v and an
// unrotated k by cp.async, a rotated k through registers and a shared store), keys >= keys and
// columns >= head_dim zero-filled; common/tile_io.h's padded layout. The caller's
// cp_async_wait + __syncthreads publishes both kinds of store. Only the one or two tiles at the
// end of an entry take this path, so it is not unrolled.
template <typename Traits, int kRows, typename Element, typename CacheSrc>
__device__ __forceinline__ void load_appended_tile(uint32_t smem,
                                                   const AppendedRows<Element>& rows, bool is_v,
                                                   int key0, int keys, int head_dim,
                                                   const RotaryTable& rot,
                                                   const CacheSrc& cache_src, int tid) {
  constexpr int kChunks = Traits::kChunks, kThreads = Traits::kNThreads;
  const Element* fresh = is_v ? rows.v : rows.k;
  const int64_t fresh_stride = is_v ? rows.v_row_stride : rows.k_row_stride;
  const bool rotate = !is_v && rot.cos != nullptr;
#pragma unroll 1
  for (int idx = tid; idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const int key = key0 + r;
    const uint32_t dst = smem + (r * Traits::kSmemRowChunks + c) * 16;
    const bool valid = key < keys && c * 8 < head_dim;
    if (valid && key >= rows.new_key0) {
      const int i = key - rows.new_key0;
      const Element* src = fresh + i * fresh_stride;
      if (rotate) {
        ptx::st_shared_v4(dst, rotated_chunk(src, c, rot, rot.clamp(rows.first_row + i)));
      } else {
        ptx::cp_async_16(dst, src + c * 8);
      }
    } else {
      ptx::cp_async_16_zfill(dst, valid ? cache_src(r) + c * 8 : fresh, valid);
    }
  }
}

// The Q tile of a kvcache block with the rotary embedding: packed rows row0 .. row0 + kRows - 1
// (problem/kv_cache.h: GqaPack), row R at base + pack.offset(R), query pack.query(R) at position
// pos0 + (per_row ? query : 0); rows >= rows_valid and columns >= head_dim zero-filled. Register
// loads and shared stores (load_packed_rows_async's layout); once per block.
template <typename Traits, int kRows, typename Element, typename Pack>
__device__ __forceinline__ void load_rotated_rows(uint32_t smem, const Element* base,
                                                  const Pack& pack, int row0, int64_t row_stride,
                                                  int64_t head_stride, int rows_valid,
                                                  int head_dim, const RotaryTable& rot, int pos0,
                                                  bool per_row, int tid) {
  constexpr int kChunks = Traits::kChunks, kThreads = Traits::kNThreads;
#pragma unroll 1
  for (int idx = tid; idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const uint32_t dst = smem + (r * Traits::kSmemRowChunks + c) * 16;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows_valid && c * 8 < head_dim) {
      const int query = pack.query(row0 + r);
      val = rotated_chunk(base + pack.offset(row0 + r, row_stride, head_stride), c, rot,
                          rot.clamp(pos0 + (per_row ? query : 0)));
    }
    ptx::st_shared_v4(dst, val);
  }
}

}  // namespace flashattn_cu
