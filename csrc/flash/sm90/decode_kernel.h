// Split-KV decoding on Hopper (sm_90a): flash_attn_with_kvcache's calls with few query rows per
// kv head (one to a few queries, GQA-packed: problem/kv_cache.h), no append, read the cache
// through TMA into a deep mbarrier ring, so each SM keeps up to kStages K/V tiles in flight
// (the sm80 kvcache kernel has one or two per block; decoding is bound by the bytes in flight:
// benchmarks/NOTES.md section 13).
//
// One CTA per (entry, kv head, 16-row query block, split), or (DecodeTraits kPersistent) a CTA
// per SM slot walking such tiles one after the other; five warps (more with DecodeTraits
// kProducerWarps > 1, each producer issuing the blocks of its share of the consumer warps):
//  * warp 4, the producer: its lane 0 issues, key block after key block (last first, as every
//    forward walks them), the K and V tile of the block into a stage of the warp that will read
//    it (DecodeSlot), once that warp has released the stage's previous tile ("empty" mbarrier);
//    a "full" mbarrier completes
//    when both tiles' bytes have landed. A contiguous cache is a 4-d map (d, rows, heads_k,
//    entries), one box per tile and matrix; a paged one a map over (d, page_size, heads_k, pages),
//    one box per tile where pages hold whole tiles, else boxes of the rows that divide both
//    (decode_tiles.h decode_box_rows_sm90: 16 for 16-row pages), each from its page, read from the
//    block table 32 boxes ahead by the whole warp.
//  * warps 0..3, the consumers: warp w takes key blocks w, w + 4, ... of the CTA's walk, each
//    whole: S = Q K^T and O += P V for the 16 query rows on mma.sync (Q in registers for the whole
//    walk, K and V by ldmatrix from the 128-byte-swizzled tiles the TMA wrote), its own online
//    softmax (common/softmax.h) with the mask and score modifiers of the problem layer. A warp
//    per tile wastes none of the tensor work the 64-row tiles of the sm80 kernel spend on padding
//    rows, and its four warps never wait on each other inside the walk.
//  * the merge: the four warps' normalised outputs and LSEs go through shared memory (the ring,
//    free once every tile has been read) and are combined as the split combine does
//    (fwd/combine.h); the CTA then writes o and lse, or with several splits its fp32 partial and
//    LSE for fwd/combine.h.
// Rows past an entry's keys inside its last tile: K's scores are masked; V's rows, which may hold
// anything (NaN in the tests), are zeroed in shared memory by the consuming warp before P V reads
// them (then published to the TMA unit, which writes the stage next, by fence.proxy.async).
#pragma once

#include <cstdint>

#include <cuda.h>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/numeric.h"
#include "../common/softmax.h"
#include "../problem/kv_cache.h"
#include "../problem/mask.h"
#include "../problem/params.h"
#include "../problem/scheduler.h"
#include "../problem/score_mod.h"
#include "../problem/seqlen.h"
#include "../ptx/cp_async.h"
#include "../ptx/ldmatrix.h"
#include "../ptx/mbarrier.h"
#include "../ptx/shared.h"
#include "../ptx/sync.h"
#include "../ptx/tma.h"
#include "../ptx/wgmma.h"
#include "../tiles.h"
#include "decode_traits.h"

namespace flashattn_cu::sm90 {

// The producer's lane 0: waits until stage `slot` is free (its warp released the previous tile)
// and arms its full barrier for both tiles' bytes.
template <typename Traits>
__device__ __forceinline__ void decode_acquire(uint32_t bars, const DecodeSlot<Traits>& slot) {
  // A fresh barrier's previous phase counts as complete: parity ^ 1.
  ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarEmpty + slot.stage), slot.parity ^ 1);
  ptx::mbarrier_arrive_expect_tx(bars + 8 * (Traits::kBarFull + slot.stage), 2 * Traits::kTileBytes);
}

// The producer's lane 0: K and V box `box` (of box_rows rows) of the tile in `slot`, every
// 64-column atom, from row `row` of cache entry (or page) `entry`.
template <typename Traits>
__device__ __forceinline__ void decode_issue(const DecodeTmaParams& tp, uint32_t s_base,
                                             const DecodeSlot<Traits>& slot, int box, int box_rows,
                                             int row, int kv_head, int entry) {
  const uint32_t full = s_base + Traits::kOffBarriers + 8 * (Traits::kBarFull + slot.stage);
#pragma unroll
  for (int a = 0; a < Traits::kAtoms; ++a) {
    const int32_t c[4] = {a * 64, row, kv_head, entry};
    const uint32_t dst =
        slot.stage * Traits::kTileBytes + a * Traits::kBlockN * 128 + box * box_rows * 128;
    ptx::tma_load<4>(s_base + Traits::kOffK + dst, &tp.k_map, full, c);
    ptx::tma_load<4>(s_base + Traits::kOffV + dst, &tp.v_map, full, c);
  }
}

// The producer warp, for one tile whose first key block is block `base` of the CTA's walk
// (DecodeSlot): its lane 0 issues K and V of each of the tile's key blocks, last first, into
// the ring, one TMA box per tile and matrix (and 64-column atom), or on pages that do not hold
// whole tiles 2^tp.box_shift boxes per tile, each from its own page. With a paged cache the whole
// warp works out 32 boxes at a time, one per lane (its table slot, page and row in the page),
// and lane 0 takes each box's by two shuffles, a tile's boxes in one unrolled block: one warp
// issues every box, so its issue loop holds no division and no table latency (session 21: with
// them, one warp issued a 16-row box every ~1000 cycles, 2200 GB/s at d 128; a loop per box
// ~370 cycles, 2570 GB/s at d 64). kTableEarly reads the next 32 boxes' table slots a round
// before they are issued. A contiguous cache's tiles are issued by lane 0 alone (the kernel
// calls this on lane 0 only), a paged cache's by the whole warp.
// With several producer warps (Traits::kProducerWarps = P), producer `producer` takes the
// tile's key blocks i with (base + i) % P == producer: those of consumer warps producer,
// producer + P, ... (DecodeSlot), i = i0 + u P for its u-th.
template <typename Traits>
__device__ __forceinline__ void decode_produce(const DecodeTmaParams& tp, const DecodeWork& w,
                                               uint32_t s_base, int base, int producer) {
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kP = Traits::kProducerWarps;
  const FwdKvcacheKernelParams& kp = tp.kp;
  const bool paged = kp.kv.block_table != nullptr;
  const int lane = threadIdx.x % 32;
  const uint32_t bars = s_base + Traits::kOffBarriers;
  // The tile's kv head (a packed call's heads are its kv heads).
  const int kv_head = w.tile.head / (kp.p.num_heads / kp.p.num_heads_k);
  const int num_blocks = w.n_end - w.n_begin;
  // This producer's first block of the tile (0 for one producer, folded at compile time).
  const int i0 = kP == 1 ? 0 : (producer - base % kP + kP) % kP;
  if (!paged) {  // a contiguous cache: cache_leftpad and cache_batch_idx folded into row, entry
#pragma unroll 1
    for (int i = i0; i < num_blocks; i += kP) {
      const DecodeSlot<Traits> slot(base + i);
      decode_acquire<Traits>(bars, slot);
      decode_issue<Traits>(tp, s_base, slot, 0, kBlockN, w.cache_row0 + (w.n_end - 1 - i) * kBlockN,
                           kv_head, w.entry);
    }
    return;
  }
  const int* table = kp.kv.block_table + w.tile.batch * kp.kv.block_table_batch_stride;
  const int page_size = kp.kv.page_size;
  // The last table slot with a key of this entry: a tile past the keys (never visited) or rows
  // of the last tile past them read that page (their values are masked or zeroed), so no slot
  // past the entry's row of the table is read.
  const int last_slot = w.seq.seqlen_k > 0 ? (w.seq.seqlen_k - 1) / page_size : 0;
  const int shift = tp.box_shift, box_rows = kBlockN >> shift;
  constexpr int kMaxBoxes = kBlockN / 16;  // boxes are >= 16 rows (decode_tile_sm90_for)
  const int own_blocks =
      kP == 1 ? num_blocks : num_blocks > i0 ? (num_blocks - i0 + kP - 1) / kP : 0;
  const int total = own_blocks << shift;  // boxes of this producer's share of the walk
  // Box g of the share: box g % 2^shift of its block g >> shift, the tile's block
  // i0 + (g >> shift) P (last first; no leftpad when paged). Lane's box of the round at g0: its
  // first key, table slot, and the slot's page.
  struct LaneBox {
    int key, slot, page;
  };
  auto lane_box = [&](int g0) {
    LaneBox b;
    const int g = g0 + lane;
    b.key = (w.n_end - 1 - (i0 + (g >> shift) * kP)) * kBlockN +
            (g & ((1 << shift) - 1)) * box_rows;
    b.slot = min(b.key / page_size, last_slot);
    b.page = g < total ? table[b.slot] : 0;
    return b;
  };
  LaneBox next{};
  if (Traits::kTableEarly) next = lane_box(0);
#pragma unroll 1
  for (int g0 = 0; g0 < total; g0 += 32) {
    LaneBox mine;
    if (Traits::kTableEarly) {
      mine = next;               // read a round ago
      next = lane_box(g0 + 32);  // first needed 32 boxes from now
    } else {
      mine = lane_box(g0);
    }
    const int entry = mine.page < 0 ? 0 : mine.page >= kp.kv.num_pages ? kp.kv.num_pages - 1 : mine.page;
    const int row = mine.key - mine.slot * page_size;
    // The round's whole tiles (32 is a multiple of the boxes per tile), each issued from one
    // unrolled block: its boxes' shuffles first, then lane 0's wait and TMA issues.
    const int round_tiles = min(32, total - g0) >> shift;
#pragma unroll 1
    for (int t = 0; t < round_tiles; ++t) {
      const int j0 = t << shift;
      int box_entry[kMaxBoxes], box_row[kMaxBoxes];
#pragma unroll
      for (int b = 0; b < kMaxBoxes; ++b) {
        if (b < (1 << shift)) {
          box_entry[b] = __shfl_sync(0xffffffffu, entry, j0 + b);
          box_row[b] = __shfl_sync(0xffffffffu, row, j0 + b);
        }
      }
      if (lane == 0) {
        const DecodeSlot<Traits> slot(base + i0 + ((g0 >> shift) + t) * kP);
        decode_acquire<Traits>(bars, slot);
#pragma unroll
        for (int b = 0; b < kMaxBoxes; ++b) {
          if (b < (1 << shift)) {
            decode_issue<Traits>(tp, s_base, slot, b, box_rows, box_row[b], kv_head, box_entry[b]);
          }
        }
      }
    }
  }
}

// Thread 0 records stamp `which` of this CTA (kStamps kernels; nothing otherwise).
template <typename Traits>
__device__ __forceinline__ void decode_stamp(const DecodeTmaParams& tp, DecodeStamp which) {
  if constexpr (Traits::kStamps) {
    if (threadIdx.x == 0) {
      unsigned long long* const at = tp.stamps + 2 * blockIdx.x * kDecodeStamps + which;
      at[0] = ptx::global_timer();
      at[kDecodeStamps] = clock64();
    }
  }
}

// Thread 0 initialises the ring's barriers; the whole CTA waits for it.
template <typename Traits>
__device__ __forceinline__ void decode_init_barriers(uint32_t bars) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < Traits::kStages; ++s) {
      ptx::mbarrier_init(bars + 8 * (Traits::kBarFull + s), 1);
      ptx::mbarrier_init(bars + 8 * (Traits::kBarEmpty + s), 1);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
}

// The 16-byte chunks of a tile's Q in shared memory (rows padded to kQRowBytes), this consumer
// thread's share: fn(byte offset in the Q buffer, the chunk's source in q, or nullptr for a row
// past the tile's rows or columns past head_dim, which are zero).
template <typename Element, typename Traits, typename Fn>
__device__ __forceinline__ void decode_q_chunks(const FwdKvcacheKernelParams& kp,
                                                const DecodeWork& w, Fn&& fn) {
  const FwdParams& p = kp.p;
  const Element* q = static_cast<const Element*>(p.q) +
                     w.seq.q_offset(p.q_batch_stride, p.q_row_stride) +
                     static_cast<int64_t>(w.tile.head) * w.pack.group * p.q_head_stride;
  constexpr int kRowChunks = Traits::kHeadDim / 8;
#pragma unroll 1
  for (int c = threadIdx.x; c < Traits::kBlockM * kRowChunks; c += 32 * Traits::kConsumerWarps) {
    const int r = c / kRowChunks, col = (c % kRowChunks) * 8;
    const bool valid = r < w.rows_q && col < p.head_dim;
    fn(static_cast<uint32_t>(r * Traits::kQRowBytes + col * 2),
       valid ? q + w.pack.offset(w.m_start + r, p.q_row_stride, p.q_head_stride) + col : nullptr);
  }
}

// The consumer warps' work on one tile, whose first key block is block `base` of the CTA's walk
// (DecodeSlot): Q into shared memory at sQ, the warp's key blocks, the merge of the four warps,
// the stores. after_walk() runs once the warp's key blocks are done (kPersistent: the next
// tile's Q copy is issued there, under the other warps' last blocks and the merge) and returns
// whether this was the CTA's last tile (the split combine may then be scheduled).
template <typename Element, typename Traits, typename AfterWalk>
__device__ __forceinline__ void decode_consume(const DecodeTmaParams& tp, const DecodeWork& w,
                                               uint32_t s_base, char* smem, uint32_t sQ, int base,
                                               AfterWalk&& after_walk) {
  using Ops = ElementOps<Element>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kNTiles = Traits::kNTiles, kDTiles = Traits::kDTiles;
  constexpr int kWarps = Traits::kConsumerWarps;
  const FwdKvcacheKernelParams& kp = tp.kp;
  const FwdParams& p = kp.p;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const uint32_t bars = s_base + Traits::kOffBarriers;
  const int g = lane / 4, t = lane % 4;
  const int head = w.tile.head;
  // Q in shared memory (decode_q_chunks), read by ldmatrix at every key block: Q's A fragments
  // held in registers for the whole walk pushed ptxas to 255 registers and spills at d = 128.
  // One tile per CTA: loaded here. kPersistent: copied by cp.async during the previous tile's
  // walk (or before the first), waited for here.
  if constexpr (Traits::kPersistent) {
    ptx::cp_async_wait<0>();
  } else {
    decode_q_chunks<Element, Traits>(kp, w, [&](uint32_t offset, const Element* src) {
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (src != nullptr) v = *reinterpret_cast<const uint4*>(src);
      ptx::st_shared_v4(sQ + offset, v);
    });
  }
  // Also: every thread is past the previous tile's stores, which read the merge buffer.
  ptx::named_barrier_sync(ptx::NamedBarrier::kWarpgroup0, 32 * kWarps);
  decode_stamp<Traits>(tp, kStampQ);
  const uint32_t q_lane = sQ + (lane % 16) * Traits::kQRowBytes + (lane / 16) * 16;

  float acc_o[1][kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[0][dt][e] = 0.f;
  OnlineSoftmax<1> softmax;
  softmax.init();
  const float scale_log2 = kp.score.scale_log2;
  const Mask mask = decode_mask(w.seq, p, w.pack);

  // Lane parts of the ldmatrix addresses (the sm80 kernel's lane mapping, ptx/ldmatrix.h, on
  // swizzled rows): K rows (lane / 16) * 8 + lane % 8 of each 16-key pair, chunk (lane / 8) % 2
  // of each k16 step; V rows lane % 16 of each k16 step, chunk lane / 16 of each 16-column pair.
  const int k_row = (lane / 16) * 8 + lane % 8, k_chunk = (lane / 8) % 2;
  const int v_row = lane % 16, v_chunk = lane / 16;
  const int num_blocks = w.n_end - w.n_begin;
  // This warp's blocks: i with (base + i) % kWarps == warp.
#pragma unroll 1
  for (int i = (warp - base % kWarps + kWarps) % kWarps; i < num_blocks; i += kWarps) {
    const int n = w.n_end - 1 - i;
    const DecodeSlot<Traits> slot(base + i);
    const int stage = slot.stage;
    const uint32_t sK = s_base + Traits::kOffK + stage * Traits::kTileBytes;
    const uint32_t sV = s_base + Traits::kOffV + stage * Traits::kTileBytes;
    ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarFull + stage), slot.parity);
    if (i == 0) decode_stamp<Traits>(tp, kStampFirstTile);

    float acc_s[1][kNTiles][4];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[0][nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < Traits::kKSteps; ++ks) {
      uint32_t qa[4];
      ptx::ldmatrix_x4(qa, q_lane + ks * 32);
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t kb[4];
        ptx::ldmatrix_x4(kb, sK + sw128_offset<kBlockN>(np * 16 + k_row, ks * 2 + k_chunk));
        Ops::mma(acc_s[0][2 * np], qa, kb[0], kb[1]);
        Ops::mma(acc_s[0][2 * np + 1], qa, kb[2], kb[3]);
      }
    }
    apply_score_mods<kKvcacheVariant>(acc_s, kp, w.tile.batch, head, w.m_start, n * kBlockN,
                                      lane);
    if (n >= w.blocks.unmasked_end || n < w.blocks.unmasked_begin) {
      mask.apply(acc_s, w.m_start, n * kBlockN, lane, w.pack);
    }
    softmax.update<DefaultExp>(acc_s, acc_o, scale_log2);

    // V rows past the entry's keys (the last tile): zeroed before P V reads them.
    const int valid = w.seq.seqlen_k - n * kBlockN;
    if (valid < kBlockN) {
      const int first = valid > 0 ? valid : 0;
      const int chunks = (kBlockN - first) * Traits::kAtoms * 8;
      for (int c = lane; c < chunks; c += 32) {
        const int row = first + c / (Traits::kAtoms * 8), chunk = c % (Traits::kAtoms * 8);
        ptx::st_shared_v4(sV + sw128_offset<kBlockN>(row, chunk), make_uint4(0u, 0u, 0u, 0u));
      }
      ptx::fence_proxy_async_shared();  // the TMA writes this stage next
      __syncwarp();
    }

#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t pa[4];
      pa[0] = Ops::pack(acc_s[0][2 * kk][0], acc_s[0][2 * kk][1]);
      pa[1] = Ops::pack(acc_s[0][2 * kk][2], acc_s[0][2 * kk][3]);
      pa[2] = Ops::pack(acc_s[0][2 * kk + 1][0], acc_s[0][2 * kk + 1][1]);
      pa[3] = Ops::pack(acc_s[0][2 * kk + 1][2], acc_s[0][2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t vb[4];
        ptx::ldmatrix_x4_trans(vb, sV + sw128_offset<kBlockN>(kk * 16 + v_row, dp * 2 + v_chunk));
        Ops::mma(acc_o[0][2 * dp], pa, vb[0], vb[1]);
        Ops::mma(acc_o[0][2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
    __syncwarp();  // every lane's ldmatrix of this stage is done
    if (lane == 0) ptx::mbarrier_arrive(bars + 8 * (Traits::kBarEmpty + stage));
  }

  // At the CTA's last tile the walk is done (the producer warp has exited): the split combine,
  // launched after this kernel programmatically, may be scheduled during the merge and the
  // stores; it waits for this grid to finish before it reads a partial (fwd/combine.h).
  if (after_walk()) ptx::launch_dependents();
  float inv_l[1][2], row_lse[1][2];
  RowStats row_stats[1][2];
  softmax.finalize(kp.score.score_scale, inv_l, row_lse, row_stats);

  // ---- the merge of the four warps: over the ring (one tile per CTA: every tile has been
  // waited for and read) or its own buffer (kPersistent: the ring holds the next tile's).
  ptx::named_barrier_sync(ptx::NamedBarrier::kWarpgroup0, 32 * kWarps);
  decode_stamp<Traits>(tp, kStampWalked);
  float* const merge_o = reinterpret_cast<float*>(smem + Traits::kOffMerge);  // [warp][row][d]
  float* const merge_lse = merge_o + kWarps * kBlockM * Traits::kHeadDim;  // [warp][row]
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int row = g + 8 * hr;
    float* dst = merge_o + (warp * kBlockM + row) * Traits::kHeadDim + 2 * t;
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      *reinterpret_cast<float2*>(dst + dt * 8) =
          make_float2(acc_o[0][dt][hr * 2] * inv_l[0][hr], acc_o[0][dt][hr * 2 + 1] * inv_l[0][hr]);
    }
    // A warp that saw no key of a row (+inf) weighs nothing.
    if (t == 0) merge_lse[warp * kBlockM + row] = row_lse[0][hr] == INFINITY ? -INFINITY : row_lse[0][hr];
  }
  ptx::named_barrier_sync(ptx::NamedBarrier::kWarpgroup0, 32 * kWarps);

  // Each item's thread merges its row's four LSEs itself (merged_lse, four expf: less than the
  // barrier and the shared round trip a per-row pass of 16 threads would put before the stores),
  // and the row's first item writes the LSE.
  const bool split = kp.kv.num_splits > 1;
  auto lse_row = [&](int r) {
    return w.pack.lse_index(w.seq, head, p.num_heads, p.seqlen_q / w.pack.group, p.total_q,
                            w.m_start + r);
  };
  // Eight columns per item: the merged row slice, stored as fp32 partials or 16-bit output.
  constexpr int kItems = kBlockM * Traits::kHeadDim / 8;
  Element* const o = static_cast<Element*>(p.o) + w.seq.q_offset(p.o_batch_stride, p.o_row_stride) +
                     static_cast<int64_t>(head) * w.pack.group * p.o_head_stride;
#pragma unroll 1
  for (int item = tid; item < kItems; item += 32 * kWarps) {
    const int r = item / (Traits::kHeadDim / 8), c0 = (item % (Traits::kHeadDim / 8)) * 8;
    if (r >= w.rows_q || c0 >= p.head_dim) continue;
    const float lse = merged_lse(merge_lse + r, kBlockM, kWarps);  // +inf: no warp saw a key
    if (c0 == 0) {
      if (split) {
        kp.kv.lse_partial[w.tile.split * kp.kv.partial_rows + lse_row(r)] =
            lse == INFINITY ? -INFINITY : lse;
      } else {
        p.lse[lse_row(r)] = lse;
      }
    }
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = 0.f;
#pragma unroll
    for (int x = 0; x < kWarps; ++x) {
      const float l = merge_lse[x * kBlockM + r];
      if (lse == INFINITY || l == -INFINITY) continue;  // a warp that saw no key weighs nothing
      const float wx = expf(l - lse);
      if (wx == 0.f) continue;
      const float* src = merge_o + (x * kBlockM + r) * Traits::kHeadDim + c0;
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = fmaf(wx, src[e], v[e]);
    }
    if (split) {
      float* dst = kp.kv.o_partial +
                   (w.tile.split * kp.kv.partial_rows + lse_row(r)) * p.head_dim + c0;
      *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      uint4 packed;
      packed.x = Ops::pack(v[0], v[1]);
      packed.y = Ops::pack(v[2], v[3]);
      packed.z = Ops::pack(v[4], v[5]);
      packed.w = Ops::pack(v[6], v[7]);
      *reinterpret_cast<uint4*>(o + w.pack.offset(w.m_start + r, p.o_row_stride, p.o_head_stride) +
                                c0) = packed;
    }
  }
  decode_stamp<Traits>(tp, kStampStored);
}

template <typename Element, typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinCtas)
    decode_kernel(const __grid_constant__ DecodeTmaParams tp) {
  extern __shared__ __align__(1024) char smem_raw[];
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  const FwdKvcacheKernelParams& kp = tp.kp;
  const int tid = threadIdx.x, warp = tid / 32;
  // The swizzled tiles need 1024-byte alignment.
  const uint32_t s_raw = ptx::smem_u32(smem_raw);
  const uint32_t s_base = (s_raw + 1023u) & ~1023u;
  char* const smem = smem_raw + (s_base - s_raw);
  const uint32_t bars = s_base + Traits::kOffBarriers;

  // Launched programmatically (decode_launch.h): nothing global is read before the previous
  // kernel in the stream (an append, or the caller's) has finished.
  decode_stamp<Traits>(tp, kStampEntry);
  // The maps are kernel parameters, not the previous kernel's output: their descriptors are
  // fetched while this CTA waits for it and reads its lengths (the first tile's TMA loads
  // landed ~3.3 us after the CTA's start at batch 1, tune_decode90 timeline).
  if (tid == 32 * Traits::kProducerWarp) {
    ptx::tma_prefetch_map(&tp.k_map);
    ptx::tma_prefetch_map(&tp.v_map);
  }
  ptx::grid_dependency_wait();
  decode_stamp<Traits>(tp, kStampWaited);
  const bool contiguous = kp.kv.block_table == nullptr;
  // The producers: the last kProducerWarps warps (a range test here: as a helper function it
  // changed the one-producer instances' SASS, scripts/sass_compare.sh).
  const bool producer =
      warp >= Traits::kProducerWarp && warp < Traits::kProducerWarp + Traits::kProducerWarps;
  if constexpr (!Traits::kPersistent) {  // one tile: blockIdx.x
    const DecodeWork w = decode_work<kBlockM, kBlockN>(kp, blockIdx.x);
    if (w.rows_q <= 0) return;  // varlen: a query block past this entry's rows (whole CTA)
    decode_init_barriers<Traits>(bars);
    if (producer) {
      if (contiguous && tid % 32 != 0) return;  // decode_produce: lane 0 alone
      decode_produce<Traits>(tp, w, s_base, 0, warp - Traits::kProducerWarp);
      return;
    }
    decode_consume<Element, Traits>(tp, w, s_base, smem, s_base + Traits::kOffQ, 0,
                                    [] { return true; });
    return;
  }
  // Persistent: tiles blockIdx.x, + gridDim.x, ... Both roles derive each tile's work alike,
  // skip the same ones (varlen: a query block past its entry's rows) and count the same key
  // blocks (base: the ring's slots, DecodeSlot).
  decode_init_barriers<Traits>(bars);
  if (producer) {
    if (contiguous && tid % 32 != 0) return;  // decode_produce: lane 0 alone
    int base = 0;
#pragma unroll 1
    for (int index = blockIdx.x; index < tp.num_tiles; index += gridDim.x) {
      const DecodeWork w = decode_work<kBlockM, kBlockN>(kp, index);
      if (w.rows_q <= 0) continue;
      decode_produce<Traits>(tp, w, s_base, base, warp - Traits::kProducerWarp);
      base += w.n_end - w.n_begin;
    }
    return;
  }
  // Q of tile k in buffer k % 2: the next tile's copy is issued once the warp's walk of this
  // tile is done (decode_consume's after_walk), into the buffer the previous tile's walk read,
  // which every consumer warp had finished at that tile's merge barrier (before this tile's Q
  // barrier).
  auto next_tile = [&](int index) {
    for (; index < tp.num_tiles; index += gridDim.x) {
      const DecodeWork w = decode_work<kBlockM, kBlockN>(kp, index);
      if (w.rows_q > 0) break;
    }
    return index;
  };
  auto copy_q = [&](int index, uint32_t sQ) {
    const DecodeWork w = decode_work<kBlockM, kBlockN>(kp, index);
    decode_q_chunks<Element, Traits>(kp, w, [&](uint32_t offset, const Element* src) {
      ptx::cp_async_16_zfill(sQ + offset, src != nullptr ? src : kp.p.q, src != nullptr);
    });
    ptx::cp_async_commit();
  };
  int base = 0, k = 0;
  int index = next_tile(blockIdx.x);
  if (index < tp.num_tiles) copy_q(index, s_base + Traits::kOffQ);
#pragma unroll 1
  for (; index < tp.num_tiles; ++k) {
    const DecodeWork w = decode_work<kBlockM, kBlockN>(kp, index);
    const uint32_t sQ = s_base + Traits::kOffQ + (k % 2) * Traits::kQBytes;
    int next = tp.num_tiles;
    decode_consume<Element, Traits>(tp, w, s_base, smem, sQ, base, [&] {
      next = next_tile(index + gridDim.x);
      if (next < tp.num_tiles) {
        copy_q(next, s_base + Traits::kOffQ + ((k + 1) % 2) * Traits::kQBytes);
      }
      return next >= tp.num_tiles;
    });
    base += w.n_end - w.n_begin;
    index = next;
  }
}

}  // namespace flashattn_cu::sm90
