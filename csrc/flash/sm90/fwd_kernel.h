// FlashAttention forward on Hopper (sm_90a): TMA loads into an mbarrier ring, warp
// specialization, warpgroup MMA, a persistent grid.
//
// A CTA walks query tiles (kBlockM rows of one (batch, head)) in the scheduler's order
// (problem/scheduler.h: query_tile_at), one CTA per SM (persistent) when the tiles cost the same,
// else one tile per CTA so the hardware hands the next tile to whichever SM is free (causal,
// varlen), or, on the kernels whose producer hands out the tiles (fwd_work.h
// fwd_published_tiles), one CTA per SM taking the next tile from a counter as it frees up (the
// dynamic scheduler, fwd_launch.h), in kConsumers + 1 warpgroups:
//  * the producer (warpgroup 0) gives its registers back (setmaxnreg) and one elected thread
//    issues every load: per tile Q (once the consumers are done with the Q before it in its
//    buffer: the previous tile's, or with FwdTraits kDoubleQ the one two tiles back; with
//    FwdTraits kSplitQ each consumer's rows on their own, once that consumer is done with them),
//    then the K and V tiles of each visited key block, last block first (the masked boundary
//    blocks first, then the unmasked bulk), into a ring of kStages buffers that runs on across
//    tiles, so the next tile's first loads overlap this tile's last steps and epilogue; a
//    buffer's "full" mbarrier completes when its bytes have landed, its "empty" one when every
//    consumer warp is done reading it;
//  * each consumer warpgroup (fwd_consumer.h) owns 64 query rows of the tile and keeps their O
//    (64 x d fp32) and their online softmax state in registers:
//      S_i = Q K_i^T            wgmma SS (Q and K K-major in sw128 tiles)
//      O  += P_{i-1} V_{i-1}     wgmma RS, issued right behind S_i: P_{i-1} (16-bit) is the A
//                                operand straight from registers, V MN-major
//      softmax of S_i            while the P V product runs on the tensor cores
//      wait for P V, rescale O by the new row max, pack P_i for the next step
//      (FwdTraits kEarlyRescale: the rescale one step later, between S_{i+1} and P_i V_i).
//    With two consumers they also take turns issuing (ping-pong), so one's softmax overlaps
//    the other's GEMMs. The accumulator layout of S is the A-fragment layout of P
//    (ptx/wgmma.h), so P never leaves the registers, and every score tile of a warp is the
//    mma.sync layout of its 16 rows: the mask, the score modifiers and the online softmax are
//    the problem layer's and common/softmax.h's, as in the sm80 kernel;
//  * epilogue (fwd_epilogue.h): O / l as 16-bit pairs into a staging box per consumer, then one TMA
//    store of the box (FwdTraits kTmaStoreO: boxes of its own where the tile leaves shared memory
//    for them, else the consumer's own rows of Q's buffer, whose next Q then waits for the store),
//    or straight from the registers (tiles.h says which tile takes which; varlen calls always from
//    the registers); LSE and the row statistics as the sm80 kernel writes them. The next tile's
//    index arithmetic runs under the last P V.
// Loads address the tensors through TMA maps (d, rows, heads, batch) (fwd_launch.h): rows past
// the tensor are zero-filled; rows past a varlen entry belong to the next entry and are masked
// like the padded tail (keys: their V rows zeroed in shared memory, fwd_consumer.h) or never
// stored (queries).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/numeric.h"
#include "../common/softmax.h"
#include "../problem/dropout.h"
#include "../problem/mask.h"
#include "../problem/params.h"
#include "../problem/scheduler.h"
#include "../problem/score_mod.h"
#include "../problem/seqlen.h"
#include "../ptx/ldmatrix.h"
#include "../ptx/cluster.h"
#include "../ptx/mbarrier.h"
#include "../ptx/shared.h"
#include "../ptx/sync.h"
#include "../ptx/tma.h"
#include "../ptx/wgmma.h"
#include "fwd_clock.h"
#include "fwd_consumer.h"
#include "fwd_epilogue.h"
#include "fwd_producer.h"
#include "fwd_traits.h"
#include "fwd_work.h"
#include "pingpong.h"

namespace flashattn_cu::sm90 {

// The CTA walks its tiles (problem/scheduler.h: cta_tile_index, query_tile_at), the producer
// ahead of the consumers: persistent with a grid of one CTA
// per SM, one tile per CTA with a grid of every tile (fwd_launch.h says when).
template <typename Element, typename Traits, int kVariant, bool kCompactOnly>
__device__ __forceinline__ void fwd_block(const FwdTmaParams& tp, char* smem_raw) {
  constexpr bool kDynamic = variant_dynamic(kVariant);  // problem/mask.h: windows
  constexpr bool kSeqlens = variant_seqlens(kVariant);  // and sequence arrays
  constexpr bool kEntryShift = fwd_entry_shift<Traits, kVariant>();  // fwd_work.h
  const FwdParams& p = tp.kp.p;
  const int tid = threadIdx.x, warp = tid / 32, wg = warp / 4;
  const int num_m = ceil_div(p.seqlen_q, Traits::kBlockM);
  // The host's count (fwd_launch.h; below 2^31 there): compact for a varlen call on the
  // instances that decode them (fwd_work.h fwd_compact_in_walk, kCompactOnly).
  constexpr bool kCompact = kCompactOnly || fwd_compact_in_walk<Traits, kVariant>();
  // The producer hands out the walk's tiles (fwd_work.h fwd_published_tiles).
  constexpr bool kPublished = !kCompactOnly && fwd_published_tiles<Traits, kVariant>();
  const int num_tiles = static_cast<int>(fwd_tile_count<Traits, kVariant, kCompact>(p));
  static_assert(!Traits::kPairKV || (kVariant == kStaticVariant && !kPublished && !kCompactOnly),
                "FwdTraits kPairKV: the static variant's static walk");

  if constexpr (variant_dropout(kVariant)) {
    // The resolved random state for the backward (FwdParams::rng_state), once per call.
    if (p.rng_state != nullptr && blockIdx.x == 0 && tid == 0) {
      const PhiloxState st = philox_state_of(p);
      p.rng_state[0] = st.seed;
      p.rng_state[1] = st.offset;
    }
  }
  const uint32_t s_base = (ptx::smem_u32(smem_raw) + 1023u) & ~1023u;  // sw128 atoms
  const uint32_t bars = s_base + Traits::kOffBarriers;
  if (tid == 0) {
    if constexpr (Traits::kPrefetchMaps) {
      ptx::tma_prefetch_map(&tp.q_map);
      ptx::tma_prefetch_map(&tp.k_map);
      ptx::tma_prefetch_map(&tp.v_map);
      if (Traits::kTmaStoreO != 0 && tp.o_tma) ptx::tma_prefetch_map(&tp.o_map);
    }
#pragma unroll
    for (int s = 0; s < Traits::kQStages * Traits::kQParts; ++s) {
      ptx::mbarrier_init(bars + 8 * (Traits::kBarQFull + s), 1);
      ptx::mbarrier_init(bars + 8 * (Traits::kBarQEmpty + s), Traits::kQEmptyArrivals);
    }
#pragma unroll
    for (int s = 0; s < Traits::kStages; ++s) {
      ptx::mbarrier_init(bars + 8 * (Traits::kBarKFull + s), 1);
      ptx::mbarrier_init(bars + 8 * (Traits::kBarVFull + s), 1);
      ptx::mbarrier_init(bars + 8 * (Traits::kBarKEmpty + s), Traits::kKVEmptyArrivals);
      ptx::mbarrier_init(bars + 8 * (Traits::kBarVEmpty + s), Traits::kKVEmptyArrivals);
    }
    if constexpr (kPublished) {
#pragma unroll
      for (int s = 0; s < Traits::kTileSlots; ++s) {
        const TileSlot<Traits> slot(s_base, s);
        ptx::mbarrier_init(slot.full, 1);
        ptx::mbarrier_init(slot.empty, 128 * Traits::kConsumers);
      }
    }
    ptx::fence_mbarrier_init();
  }
  if constexpr (Traits::kSumsWgmma) {  // the ones tile of the used sums (FwdTraits kSumsWgmma)
    if (tid < Traits::kOnesBytes / 16) {
      constexpr uint32_t kOnes = ElementOps<Element>::kOnePair;
      ptx::st_shared_v4(s_base + Traits::kOffOnes + 16 * tid,
                        make_uint4(kOnes, kOnes, kOnes, kOnes));
      ptx::fence_proxy_async_shared();  // before the barrier below publishes it to the wgmmas
    }
  }
  __syncthreads();  // the last barrier of all warpgroups: the roles split here
  if constexpr (Traits::kPairKV) {
    // Both CTAs' barriers initialized before either's loads or arrivals reach the other's.
    ptx::cluster_sync();
  }

  if (wg == 0) {
    ptx::setmaxnreg_dec<Traits::kProducerRegs>();
    if (warp == 0 && ptx::elect_one_sync()) {
      produce_tiles<Traits, kDynamic, kSeqlens, kCompact, kEntryShift, kPublished>(
          tp, s_base, num_m, num_tiles);
    }
    return;
  }
  ptx::setmaxnreg_inc<Traits::kConsumerRegs>();
  const int consumer = wg - 1;  // query rows consumer * 64 .. of each tile
  const PingPong<Traits::kPingPong> turns{consumer};
  turns.start();
  int ring = 0;
  int q_tiles = 0;
  FwdClock<Traits::kStamps> clock;
  clock.start();
  auto finish = [&] {
    turns.finish();
    clock.write(tp.stamps, consumer, Traits::kConsumers);
    // The shared memory of the last TMA store must stay until the store has read it.
    if (Traits::kTmaStoreO != 0 && tp.o_tma && threadIdx.x % 128 == 0) ptx::tma_store_wait<0>();
    if constexpr (Traits::kPairKV) {
      // Neither CTA exits while the other's consumers may still arrive on its empty barriers
      // (the producer warpgroup has exited, which the cluster barrier counts as arrived).
      ptx::cluster_sync();
    }
  };
  if constexpr (kCompactOnly) {  // the CTA's one compact tile (a grid of one CTA per tile)
    if (static_cast<int>(blockIdx.x) < num_tiles) {
      const FwdWork w =
          fwd_work<kDynamic, kSeqlens, Traits::kBlockM, Traits::kBlockN, true, kEntryShift>(
              p, static_cast<int>(blockIdx.x), num_m, 0, 0, tp.m_shift, tp.varlen_block_major);
      if (!w.skip) {
        consume_tile<Element, Traits, kVariant>(tp, w, s_base, consumer, ring, q_tiles, turns,
                                                clock, [] {});
      }
    }
    finish();
    return;
  }
  if constexpr (kPublished) {
    // The walk as the producer hands it out (produce_tiles): tile slot k's index and tile, read
    // by every consumer thread, each of which then arrives on the slot's empty barrier (its
    // release orders that thread's own reads before the producer's next write of the slot; a
    // warp's one arrival after __syncwarp, which racecheck does not credit with the other lanes'
    // reads, had it report the slot's reuse); the next tile's is read during this one
    // (consume_tile's `ahead`, under the last P V). The loop below repeats the static walk's
    // tile step instead of sharing it through a lambda: shared, ptxas (sm_90a) gave d 128's
    // static softcap instance (128 x 176) 84 / 76 bytes of spills.
    auto take = [&](int k, int& index, FwdTileSeq& ts) {
      const TileSlot<Traits> slot(s_base, k);
      ptx::mbarrier_wait_parity(slot.full, slot.parity);
      const uint4 a = ptx::ld_shared_v4(slot.data);
      const uint4 b = ptx::ld_shared_v4(slot.data + 16);
      ptx::mbarrier_arrive(slot.empty);
      index = static_cast<int>(a.x);
      ts.tile = QueryTile{static_cast<int>(a.y), static_cast<int>(a.z), static_cast<int>(a.w)};
      ts.seq = SeqInfo{static_cast<int>(a.y), static_cast<int>(b.x), static_cast<int>(b.y),
                       static_cast<int>(b.z), static_cast<int>(b.w)};
    };
    int index = 0;
    FwdTileSeq ts;
    take(0, index, ts);
#pragma unroll 1
    for (int k = 0; index >= 0; ++k) {  // -1: the walk's end
      const FwdWork w =
          fwd_work<kDynamic, Traits::kBlockM, Traits::kBlockN, kEntryShift>(p, ts, tp.m_shift);
      int next_index = -1;
      auto ahead = [&] { take(k + 1, next_index, ts); };
      if (w.skip) {
        ahead();
      } else {
        consume_tile<Element, Traits, kVariant>(tp, w, s_base, consumer, ring, q_tiles, turns,
                                                clock, ahead);
        if (w.num_blocks > 0) {
          ring += w.num_blocks;
          ++q_tiles;
        }
      }
      index = next_index;
    }
    finish();
    return;
  }
  // The next tile's costly part is worked out during this one (consume_tile's `ahead`). This
  // walk never meets compact tiles: the instances that decode them publish their tiles
  // (fwd_work.h fwd_published_tiles) or run one per CTA (kCompactOnly), both returned above.
  FwdTileSeq ts;
  if (static_cast<int>(blockIdx.x) < num_tiles) {
    ts = fwd_tile_seq<kSeqlens, Traits::kBlockM, false>(p, static_cast<int>(blockIdx.x), num_m,
                                                        tp.group_heads,
                                                        kernel_defer_m<Traits, kDynamic>(tp));
  }
#pragma unroll 1
  for (int k = 0, index = blockIdx.x; index < num_tiles; ++k) {
    const FwdWork w =
        fwd_work<kDynamic, Traits::kBlockM, Traits::kBlockN, kEntryShift>(p, ts, tp.m_shift);
    const int next_index = walk_tile_index<Traits>(k + 1);
    auto ahead = [&] {
      if (next_index < num_tiles) {
        ts = fwd_tile_seq<kSeqlens, Traits::kBlockM, false>(p, next_index, num_m, tp.group_heads,
                                                            kernel_defer_m<Traits, kDynamic>(tp));
      }
    };
    if (w.skip) {
      ahead();
    } else {
      consume_tile<Element, Traits, kVariant>(tp, w, s_base, consumer, ring, q_tiles, turns,
                                              clock, ahead);
      if (w.num_blocks > 0) {
        ring += w.num_blocks;
        ++q_tiles;
      }
    }
    index = next_index;
  }
  finish();
}

// kCompactOnly: the instance for a varlen call's compact tiles where the walk's instance does
// not decode them (fwd_work.h fwd_compact_in_walk); fwd_launch.h launches it for those calls.
template <typename Element, typename Traits, int kVariant, bool kCompactOnly = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    fwd_kernel(const __grid_constant__ FwdTmaParams params) {
#if FLASHATTN_CU_SM90A
  extern __shared__ __align__(1024) char smem[];
  if constexpr (variant_seqlens(kVariant)) varlen_kernel_start(params.kp.p);  // problem/seqlen.h
  sm90::fwd_block<Element, Traits, kVariant, kCompactOnly>(params, smem);
#else
  ptx::unsupported_arch();
#endif
}

}  // namespace flashattn_cu::sm90
