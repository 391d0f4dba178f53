// The sm90a forward's epilogue (sm90/fwd_consumer.h consume_tile): one consumer warpgroup's 64 rows
// of a tile, O / l as 16-bit pairs through a staging box and a TMA store or straight from the
// registers, LSE and the row statistics as the sm80 kernel writes them.
#pragma once

#include <cstdint>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/numeric.h"
#include "../common/softmax.h"
#include "../problem/mask.h"
#include "../problem/params.h"
#include "../ptx/mbarrier.h"
#include "../ptx/shared.h"
#include "../ptx/sync.h"
#include "../ptx/tma.h"
#include "fwd_traits.h"
#include "fwd_work.h"

namespace flashattn_cu::sm90 {

// acc_o: the warpgroup's unnormalized O; softmax: its rows' online softmax state, finalized
// here; used_acc: the sums of the 16-bit P that P V read (kUsedSums: FwdTraits kBoundedRef),
// which 1 / l is then of; qs: the tile's Q buffer (kOInQ: the staging box and the
// buffer released here).
template <typename Element, typename Traits, int kVariant, bool kUsedSums>
__device__ __forceinline__ void store_tile_output(const FwdTmaParams& tp, const FwdWork& w,
                                                  uint32_t s_base, int consumer,
                                                  const QSlot<Traits>& qs,
                                                  OnlineSoftmax<1>& softmax,
                                                  const float (&used_acc)[4],
                                                  const float (&acc_o)[1][Traits::kDTiles][4]) {
  using Ops = ElementOps<Element>;
  constexpr int kBlockM = Traits::kBlockM, kDTiles = Traits::kDTiles;
  const FwdKernelParams& kp = tp.kp;
  const FwdParams& p = kp.p;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int head = w.tile.head, m_start = w.m_start;
  const int warp_row0 = consumer * 64 + (warp % 4) * 16;  // this warp's 16 rows in the tile
  const uint32_t bars = s_base + Traits::kOffBarriers;
  const uint32_t sQ = s_base + Traits::kOffQ + qs.stage * Traits::kQBytes;
  const int g = lane / 4, t = lane % 4;
  // The tile's rows in [rows_lo, rows_q): a first block shifted above row 0 (fwd_work.h m_shift;
  // from the registers, fwd_launch.h fwd_m_shift) stores none of its rows above 0.
  const int rows_q = min(kBlockM, w.seq.seqlen_q - m_start);
  const int rows_lo = max(0, -m_start);
  const int64_t row0 = w.seq.lse_row0(head, p.num_heads, p.seqlen_q, p.total_q) + m_start;
  float inv_l[1][2], row_lse[1][2];
  RowStats row_stats[1][2];
  const float used_sums[1][2] = {{used_acc[0], used_acc[2]}};
  softmax.finalize(kp.score.score_scale, inv_l, row_lse, row_stats,
                   kUsedSums ? used_sums : nullptr);
  if constexpr (variant_dropout(kVariant)) {
    inv_l[0][0] *= kp.dropout.rp;
    inv_l[0][1] *= kp.dropout.rp;
  }
  Element* o = static_cast<Element*>(p.o) + w.seq.q_offset(p.o_batch_stride, p.o_row_stride) +
               head * p.o_head_stride + m_start * p.o_row_stride;
  // The TMA-store epilogue (Traits::kTmaStoreO) where the launch could map o (tp.o_tma: padded
  // calls; o's map clips rows at seqlen_q, but a varlen tile's rows past its entry are the next
  // entry's); kOInQ: only on a tile whose Q was loaded (a tile with no key block has none, and
  // the next tile's Q may be landing in the buffer); kShiftedTma: not on a first block shifted
  // above row 0, which stores from the registers (a TMA store at a negative row faults).
  constexpr bool kShiftedTma = fwd_shifted_tma<Traits, kVariant>();
  const bool via_tma = Traits::kTmaStoreO != 0 && tp.o_tma && (!kShiftedTma || m_start >= 0) &&
                       (!Traits::kOInQ || w.num_blocks > 0);
  const bool leader = threadIdx.x % 128 == 0;
  if constexpr (Traits::kTmaStoreO != 0) {
    if (via_tma) {
      // This consumer's 64 rows into its staging boxes (the TMA map's sw128 layout: chunk j of
      // a 128-byte row at j ^ (row % 8), which also spreads a warp's 8 rows over all banks),
      // then one thread stores the boxes. Own boxes: once the previous tile's store has read
      // them. In Q's buffer: the consumer's own rows, which only its own S GEMMs read (all
      // done once every warp of the warpgroup is past the barrier).
      const auto wg_barrier = static_cast<ptx::NamedBarrier>(
          static_cast<int>(ptx::NamedBarrier::kWarpgroup0) + consumer);
      if (!Traits::kOInQ && leader) ptx::tma_store_wait<0>();  // the previous tile's store
      ptx::named_barrier_sync(wg_barrier, 128);
      constexpr uint32_t kBoxStride = Traits::kOInQ ? Traits::kBlockM * 128 : Traits::kOBoxBytes;
      const uint32_t sO = Traits::kOInQ
                              ? sQ + consumer * 64 * 128
                              : s_base + Traits::kOffO + consumer * Traits::kAtoms * Traits::kOBoxBytes;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int row = (warp % 4) * 16 + g + hr * 8;  // in the consumer's 64
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          const uint32_t at = sO + (dt / 8) * kBoxStride + row * 128 +
                              (((dt % 8) ^ (row % 8)) * 16) + t * 4;
          ptx::st_shared_b32(at, Ops::pack(acc_o[0][dt][hr * 2] * inv_l[0][hr],
                                           acc_o[0][dt][hr * 2 + 1] * inv_l[0][hr]));
        }
      }
      ptx::fence_proxy_async_shared();
      ptx::named_barrier_sync(wg_barrier, 128);
      if (leader) {
        const MapRows om = map_rows(w.seq.start_q, w.seq.batch);  // o's map is q's shape
#pragma unroll
        for (int a = 0; a < Traits::kAtoms; ++a) {
          const int32_t c[4] = {a * 64, om.row0 + m_start + consumer * 64, head, om.batch};
          ptx::tma_store<4>(&tp.o_map, sO + a * kBoxStride, c);
        }
        ptx::tma_store_commit();
      }
    }
  }
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int row = warp_row0 + g + hr * 8;
    if (row >= rows_q || row < rows_lo) continue;
    if (t == 0) {
      p.lse[row0 + row] = row_lse[0][hr];
      if (p.softmax_stats != nullptr) {
        reinterpret_cast<float2*>(p.softmax_stats)[row0 + row] =
            make_float2(row_stats[0][hr].row_max, row_stats[0][hr].log2_sum);
      }
    }
    if (via_tma) continue;  // stored above
    Element* o_row = o + row * p.o_row_stride + 2 * t;
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      if (dt * 8 + 2 * t < p.head_dim) {
        *reinterpret_cast<uint32_t*>(o_row + dt * 8) = Ops::pack(
            acc_o[0][dt][hr * 2] * inv_l[0][hr], acc_o[0][dt][hr * 2 + 1] * inv_l[0][hr]);
      }
    }
  }
  // kOInQ: Q's buffer is the producer's again once this consumer's store has read its rows
  // (whichever epilogue ran: the barrier counts one arrival per consumer of a tile with Q, or
  // with FwdTraits kSplitQ this consumer's part's one arrival).
  if (Traits::kOInQ && w.num_blocks > 0 && leader) {
    if (via_tma) ptx::tma_store_wait<0>();
    ptx::mbarrier_arrive(
        bars + 8 * Traits::q_bar(Traits::kBarQEmpty, qs.stage, Traits::q_part(consumer)));
  }
}

}  // namespace flashattn_cu::sm90
