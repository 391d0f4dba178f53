// The sm90a forward's producer (sm90/fwd_kernel.h): one elected thread of warpgroup 0 issues
// every TMA load of the CTA's tiles into the K / V ring.
#pragma once

#include <cstdint>

#include "../ptx/mbarrier.h"
#include "../ptx/tma.h"
#include "fwd_traits.h"
#include "fwd_work.h"

namespace flashattn_cu::sm90 {

// The producer: one thread issues, tile after tile, Q's load (once the consumers are done with
// the Q before it in its buffer: the last tile's, or with FwdTraits kDoubleQ the one before),
// then K and V of each visited key block, last first, into the ring. FwdTraits kSplitQ: Q's
// parts one by one between the key blocks, each once its own consumer is done with it.
template <typename Traits, bool kDynamic, bool kSeqlens, bool kCompact, bool kEntryShift>
__device__ __forceinline__ void produce_tiles(const FwdTmaParams& tp, uint32_t s_base, int num_m,
                                              int num_tiles) {
  constexpr int kBlockN = Traits::kBlockN;
  const FwdParams& p = tp.kp.p;
  const uint32_t bars = s_base + Traits::kOffBarriers;
  const int group = p.num_heads / p.num_heads_k;
  int ring = 0;     // key-block steps so far
  int q_tiles = 0;  // tiles with key blocks so far (fwd_work.h QSlot)
#pragma unroll 1
  for (int k = 0, index = blockIdx.x; index < num_tiles;
       index = cta_tile_index(++k, blockIdx.x, gridDim.x)) {
    const FwdWork w =
        fwd_work<kDynamic, kSeqlens, Traits::kBlockM, kBlockN, kCompact, kEntryShift>(
            p, index, num_m, tp.group_heads, kernel_defer_m<Traits, kDynamic>(tp), tp.m_shift);
    if (w.num_blocks <= 0) continue;  // the consumers wait for nothing either
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
    ring += w.num_blocks;
    ++q_tiles;
  }
}

}  // namespace flashattn_cu::sm90
