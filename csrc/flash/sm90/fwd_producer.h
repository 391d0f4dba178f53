// The sm90a forward's producer (sm90/fwd_kernel.h): one elected thread of warpgroup 0 issues
// every TMA load of the CTA's tiles into the K / V ring.
#pragma once

#include <cstdint>

#include "../ptx/cluster.h"
#include "../ptx/mbarrier.h"
#include "../ptx/shared.h"
#include "../ptx/tma.h"
#include "fwd_traits.h"
#include "fwd_work.h"

namespace flashattn_cu::sm90 {

// One tile's loads (produce_tiles): Q (once the consumers are done with the Q before it in its
// buffer: the last tile's, or with FwdTraits kDoubleQ the one before), then K and V of each
// visited key block, last first, into the ring. FwdTraits kSplitQ: Q's parts one by one between
// the key blocks, each once its own consumer is done with it. `ring` / `q_tiles`: the CTA's
// key-block steps and tiles with key blocks before this one (fwd_work.h RingSlot / QSlot).
template <typename Traits>
__device__ __forceinline__ void produce_tile(const FwdTmaParams& tp, uint32_t s_base,
                                             const FwdWork& w, int ring, int q_tiles) {
  constexpr int kBlockN = Traits::kBlockN;
  const FwdParams& p = tp.kp.p;
  const uint32_t bars = s_base + Traits::kOffBarriers;
  const int group = p.num_heads / p.num_heads_k;
  const MapRows qm = map_rows(w.seq.start_q, w.seq.batch);
  const MapRows km = map_rows(w.seq.start_k, w.seq.batch);
  const int head_k = w.tile.head / group;

  // Part `part` of Q (the whole tile unless FwdTraits kSplitQ: consumer `part`'s rows), once
  // the consumers reading it are done with it; the map's boxes are kQPartRows rows high
  // (fwd_launch.h).
  auto load_q_part = [&](int part) {
    const QSlot<Traits> qs(q_tiles);
    const uint32_t q_full = bars + 8 * Traits::q_bar(Traits::kBarQFull, qs.stage, part);
    ptx::mbarrier_wait_parity(bars + 8 * Traits::q_bar(Traits::kBarQEmpty, qs.stage, part),
                              qs.parity ^ 1);
    ptx::mbarrier_arrive_expect_tx(q_full, Traits::kQBytes / Traits::kQParts);
#pragma unroll
    for (int a = 0; a < Traits::kAtoms; ++a) {
      const int32_t c[4] = {a * 64, qm.row0 + w.m_start + part * Traits::kQPartRows,
                            w.tile.head, qm.batch};
      ptx::tma_load<4>(s_base + Traits::kOffQ + qs.stage * Traits::kQBytes +
                           a * Traits::kBlockM * 128 + part * Traits::kQPartRows * 128,
                       &tp.q_map, q_full, c);
    }
  };
  // Part i goes with key block i: before its K / V, or with O staged in Q's buffer
  // (Traits::kOInQ, where Q is free only after the last tile's stores) after them, so that the
  // first K / V block lands during the last tile's epilogue. With kSplitQ a consumer that is
  // done then waits neither for the other consumers' parts nor for key blocks queued behind
  // them; parts past the tile's key blocks follow the last block.
  if constexpr (!Traits::kOInQ) load_q_part(0);
#pragma unroll 1
  for (int i = 0; i < w.num_blocks; ++i) {
    if (!Traits::kOInQ && i > 0 && i < Traits::kQParts) load_q_part(i);
    const int n = w.blocks.end - 1 - i;
    const RingSlot<Traits> slot(ring + i);
    const uint32_t parity = slot.parity ^ 1;  // a fresh barrier's previous phase is complete
    const uint32_t k_full = bars + 8 * (Traits::kBarKFull + slot.stage);
    const uint32_t v_full = bars + 8 * (Traits::kBarVFull + slot.stage);
    ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarKEmpty + slot.stage), parity);
    ptx::mbarrier_arrive_expect_tx(k_full, Traits::kKVBytes);
#pragma unroll
    for (int a = 0; a < Traits::kAtoms; ++a) {
      const int32_t c[4] = {a * 64, km.row0 + n * kBlockN, head_k, km.batch};
      ptx::tma_load<4>(s_base + Traits::kOffK + slot.stage * Traits::kKVBytes + a * kBlockN * 128,
                       &tp.k_map, k_full, c);
    }
    ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarVEmpty + slot.stage), parity);
    ptx::mbarrier_arrive_expect_tx(v_full, Traits::kKVBytes);
#pragma unroll
    for (int a = 0; a < Traits::kAtoms; ++a) {
      const int32_t c[4] = {a * 64, km.row0 + n * kBlockN, head_k, km.batch};
      ptx::tma_load<4>(s_base + Traits::kOffV + slot.stage * Traits::kKVBytes + a * kBlockN * 128,
                       &tp.v_map, v_full, c);
    }
    if (Traits::kOInQ && i < Traits::kQParts) load_q_part(i);
  }
  if constexpr (Traits::kQParts > 1) {  // (a tile here has a key block: part 0 is in)
#pragma unroll 1
    for (int part = w.num_blocks; part < Traits::kQParts; ++part) load_q_part(part);
  }
}

// Tile slot `k`'s address and its full / empty barriers (FwdTraits kOffTileSlots: the published
// tiles' ring, use k of the CTA's walk in slot k % kTileSlots).
template <typename Traits>
struct TileSlot {
  uint32_t data, full, empty, parity;
  __device__ __forceinline__ TileSlot(uint32_t s_base, int k) {
    const Slot<Traits::kTileSlots> slot(k);
    data = s_base + Traits::kOffTileSlots + slot.stage * Traits::kTileSlotBytes;
    full = s_base + Traits::kOffTileBars + 8 * slot.stage;
    empty = s_base + Traits::kOffTileBars + 8 * (Traits::kTileSlots + slot.stage);
    parity = slot.parity;
  }
};

// The producer: one thread issues, tile after tile, each tile's loads (produce_tile).
// kPublished (fwd_work.h fwd_published_tiles): it also works out each tile of the CTA's walk (a
// varlen call's compact tiles decoded for every one) and hands it to the consumers through tile
// slot k (index, QueryTile, the entry's lengths and starts) before its loads, the slot's full
// barrier releasing the bytes; past the last tile it hands over index -1, which ends the
// consumers' walk. The walk: the CTA's index, then tp.tile_counter's (the dynamic
// scheduler: gridDim.x + the counter's next value, fetched when a tile's loads start, so the
// atomic's round trip runs under them) or cta_tile_index's.
template <typename Traits, bool kDynamic, bool kSeqlens, bool kCompact, bool kEntryShift,
          bool kPublished>
__device__ __forceinline__ void produce_tiles(const FwdTmaParams& tp, uint32_t s_base, int num_m,
                                              int num_tiles) {
  constexpr int kBlockN = Traits::kBlockN;
  const FwdParams& p = tp.kp.p;
  int ring = 0;     // key-block steps so far
  int q_tiles = 0;  // tiles with key blocks so far (fwd_work.h QSlot)
  if constexpr (kPublished) {
    const int defer_m = kernel_defer_m<Traits, kDynamic>(tp);
#pragma unroll 1
    for (int k = 0, index = blockIdx.x;; ++k) {
      FwdTileSeq ts{};
      if (index < num_tiles) {
        ts = fwd_tile_seq<kSeqlens, Traits::kBlockM, kCompact>(p, index, num_m, tp.group_heads,
                                                               defer_m, tp.varlen_block_major);
      }
      const TileSlot<Traits> slot(s_base, k);
      ptx::mbarrier_wait_parity(slot.empty, slot.parity ^ 1);
      ptx::st_shared_v4(slot.data, make_uint4(index < num_tiles ? index : -1, ts.tile.batch,
                                              ts.tile.head, ts.tile.m_block));
      ptx::st_shared_v4(slot.data + 16, make_uint4(ts.seq.seqlen_q, ts.seq.seqlen_k,
                                                   ts.seq.start_q, ts.seq.start_k));
      ptx::mbarrier_arrive(slot.full);
      if (index >= num_tiles) break;
      const int next = tp.tile_counter != nullptr
                           ? static_cast<int>(gridDim.x) + atomicAdd(tp.tile_counter, 1)
                           : cta_tile_index(k + 1, blockIdx.x, gridDim.x);
      const FwdWork w = fwd_work<kDynamic, Traits::kBlockM, kBlockN, kEntryShift>(p, ts,
                                                                                  tp.m_shift);
      if (w.num_blocks > 0) {  // else the consumers wait for nothing either
        produce_tile<Traits>(tp, s_base, w, ring, q_tiles);
        ring += w.num_blocks;
        ++q_tiles;
      }
      index = next;
    }
  } else {
    // The static walk keeps its tile's loads inline: the same code through produce_tile moved
    // ptxas's allocation of the d = 128 ALiBi instance (128 x 176) to 16 bytes of spills in its
    // consumers (sm_90a, ptxas -v).
    const uint32_t bars = s_base + Traits::kOffBarriers;
    const int group = p.num_heads / p.num_heads_k;
#pragma unroll 1
    for (int k = 0, index = blockIdx.x; index < num_tiles; index = walk_tile_index<Traits>(++k)) {
      const FwdWork w =
          fwd_work<kDynamic, kSeqlens, Traits::kBlockM, kBlockN, kCompact, kEntryShift>(
              p, index, num_m, tp.group_heads, kernel_defer_m<Traits, kDynamic>(tp), tp.m_shift,
              tp.varlen_block_major);
      if (w.num_blocks <= 0) continue;  // the consumers wait for nothing either
      const MapRows qm = map_rows(w.seq.start_q, w.seq.batch);
      const MapRows km = map_rows(w.seq.start_k, w.seq.batch);
      const int head_k = w.tile.head / group;
      // FwdTraits kPairKV: this CTA's half of key block n's rows (rank r: kKVBoxRows rows from
      // r x kKVBoxRows) into the same rows of both CTAs' buffer at `offset`, each CTA's barrier
      // at full's offset counting them (the pair's CTAs load the same blocks in the same order).
      [[maybe_unused]] auto load_pair_half = [&](const CUtensorMap* map, uint32_t offset,
                                                 uint32_t full, int n) {
        const int half = static_cast<int>(ptx::cluster_ctarank()) * Traits::kKVBoxRows;
#pragma unroll
        for (int a = 0; a < Traits::kAtoms; ++a) {
          const int32_t c[4] = {a * 64, km.row0 + n * kBlockN + half, head_k, km.batch};
          ptx::tma_load_multicast<4>(s_base + offset + (a * kBlockN + half) * 128, map, full, c,
                                     uint16_t{0x3});
        }
      };

      // Part `part` of Q (the whole tile unless FwdTraits kSplitQ: consumer `part`'s rows), once
      // the consumers reading it are done with it; the map's boxes are kQPartRows rows high
      // (fwd_launch.h).
      auto load_q_part = [&](int part) {
        const QSlot<Traits> qs(q_tiles);
        const uint32_t q_full = bars + 8 * Traits::q_bar(Traits::kBarQFull, qs.stage, part);
        ptx::mbarrier_wait_parity(bars + 8 * Traits::q_bar(Traits::kBarQEmpty, qs.stage, part),
                                  qs.parity ^ 1);
        ptx::mbarrier_arrive_expect_tx(q_full, Traits::kQBytes / Traits::kQParts);
#pragma unroll
        for (int a = 0; a < Traits::kAtoms; ++a) {
          const int32_t c[4] = {a * 64, qm.row0 + w.m_start + part * Traits::kQPartRows,
                                w.tile.head, qm.batch};
          ptx::tma_load<4>(s_base + Traits::kOffQ + qs.stage * Traits::kQBytes +
                               a * Traits::kBlockM * 128 + part * Traits::kQPartRows * 128,
                           &tp.q_map, q_full, c);
        }
      };
      // Part i goes with key block i: before its K / V, or with O staged in Q's buffer
      // (Traits::kOInQ, where Q is free only after the last tile's stores) after them, so that the
      // first K / V block lands during the last tile's epilogue. With kSplitQ a consumer that is
      // done then waits neither for the other consumers' parts nor for key blocks queued behind
      // them; parts past the tile's key blocks follow the last block.
      if constexpr (!Traits::kOInQ) load_q_part(0);
#pragma unroll 1
      for (int i = 0; i < w.num_blocks; ++i) {
        if (!Traits::kOInQ && i > 0 && i < Traits::kQParts) load_q_part(i);
        const int n = w.blocks.end - 1 - i;
        const RingSlot<Traits> slot(ring + i);
        const uint32_t parity = slot.parity ^ 1;  // a fresh barrier's previous phase is complete
        const uint32_t k_full = bars + 8 * (Traits::kBarKFull + slot.stage);
        const uint32_t v_full = bars + 8 * (Traits::kBarVFull + slot.stage);
        ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarKEmpty + slot.stage), parity);
        ptx::mbarrier_arrive_expect_tx(k_full, Traits::kKVBytes);
        if constexpr (Traits::kPairKV) {
          load_pair_half(&tp.k_map, Traits::kOffK + slot.stage * Traits::kKVBytes, k_full, n);
        } else {
#pragma unroll
          for (int a = 0; a < Traits::kAtoms; ++a) {
            const int32_t c[4] = {a * 64, km.row0 + n * kBlockN, head_k, km.batch};
            ptx::tma_load<4>(
                s_base + Traits::kOffK + slot.stage * Traits::kKVBytes + a * kBlockN * 128,
                &tp.k_map, k_full, c);
          }
        }
        ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarVEmpty + slot.stage), parity);
        ptx::mbarrier_arrive_expect_tx(v_full, Traits::kKVBytes);
        if constexpr (Traits::kPairKV) {
          load_pair_half(&tp.v_map, Traits::kOffV + slot.stage * Traits::kKVBytes, v_full, n);
        } else {
#pragma unroll
          for (int a = 0; a < Traits::kAtoms; ++a) {
            const int32_t c[4] = {a * 64, km.row0 + n * kBlockN, head_k, km.batch};
            ptx::tma_load<4>(
                s_base + Traits::kOffV + slot.stage * Traits::kKVBytes + a * kBlockN * 128,
                &tp.v_map, v_full, c);
          }
        }
        if (Traits::kOInQ && i < Traits::kQParts) load_q_part(i);
      }
      if constexpr (Traits::kQParts > 1) {  // (a tile here has a key block: part 0 is in)
#pragma unroll 1
        for (int part = w.num_blocks; part < Traits::kQParts; ++part) load_q_part(part);
      }
      ring += w.num_blocks;
      ++q_tiles;
    }
  }
}

}  // namespace flashattn_cu::sm90
