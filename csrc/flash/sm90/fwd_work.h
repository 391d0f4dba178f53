// The sm90a forward's tiles as both roles see them (sm90/fwd_kernel.h): a tile's work (entry,
// head, first query row, key blocks), where its rows start in the TMA maps, and the ring slot of
// each key-block step. The producer (fwd_producer.h) and the consumers derive it the same way, so
// they walk the same tiles, key blocks and barrier phases.
#pragma once

#include <cstdint>

#include "../problem/mask.h"
#include "../problem/params.h"
#include "../problem/scheduler.h"
#include "../problem/seqlen.h"
#include "fwd_traits.h"

namespace flashattn_cu::sm90 {

// What one tile is to both roles: its entry, head, first query row and key blocks. The producer
// and the consumers derive it the same way, so they walk the same tiles, key blocks and barrier
// phases.
struct FwdWork {
  QueryTile tile;
  SeqInfo seq;
  int m_start;
  KeyBlocks blocks;
  int num_blocks;  // 0 also for a tile with no rows (skip)
  bool skip;       // varlen: the query block lies past this entry's length
};

// Where an entry's rows start in the TMA maps (fwd_launch.h): (row, batch) coordinates of its
// row 0, from its start in the packed rows (seq.start_q / start_k: varlen maps have one batch
// entry whose rows are all of the entries'; < 0: padded, the entry is its own batch index).
struct MapRows {
  int row0, batch;
};
__device__ __forceinline__ MapRows map_rows(int start, int batch) {
  return MapRows{start >= 0 ? start : 0, start >= 0 ? 0 : batch};
}

// The costly part of a tile's FwdWork (query_tile_at's integer divisions, the varlen entry's
// cu_seqlens loads), which the consumers work out one tile ahead (consume_tile's `ahead`).
struct FwdTileSeq {
  QueryTile tile;
  SeqInfo seq;
};

// Whether configuration (Traits, kVariant) runs a varlen call on compact tiles
// (problem/scheduler.h: query_tile_of, where compact_query_tiles says so): every variant with
// sequence arrays.
template <typename Traits, int kVariant>
__host__ __device__ constexpr bool fwd_compact_tiles() {
  return variant_seqlens(kVariant);
}

// Which kernel decodes them: the configuration's one kernel, in its walk's first tile
// (fwd_tile_seq kCompact), where ptxas (sm_90a) shows that costs no spills; elsewhere a kernel
// instance of its own (fwd_kernel kCompactOnly: one tile a CTA, no walk), since a decoded tile
// merged into the walk's is no longer rematerializable from the tile index: at d = 256 the
// dynamic and dropout variants went 0 -> 84 / 92 and 56 / 40 bytes of spills (local loads in
// the step loop, paid by the padded calls they serve too), the 128 x 176 tile (d 128 ALiBi)
// 0 -> 8 / 28; a path of its own inside the one kernel still spilled (softcap 28 / 32 ->
// 72 / 68, dropout 0 -> 60 / 68: both paths share one allocation).
template <typename Traits, int kVariant>
__host__ __device__ constexpr bool fwd_compact_in_walk() {
  return fwd_compact_tiles<Traits, kVariant>() && Traits::kHeadDim <= 128 &&
         Traits::kBlockN != 176;
}

// Whether configuration (Traits, kVariant)'s producer works out each tile of the CTA's walk and
// hands it to the consumers through shared memory (FwdTraits kOffTileSlots; fwd_producer.h
// produce_tiles kPublished), instead of both roles deriving the walk from cta_tile_index: the
// walk may then come from a counter (FwdTmaParams::tile_counter, the dynamic scheduler), and a
// varlen call's compact tiles are decoded for every tile of it (by the producer), not only a
// CTA's first. The instances that decode compact tiles in the walk (fwd_compact_in_walk): a
// varlen call there on the dynamic scheduler against one CTA per tile (H100, bench_features,
// benchmarks/results/features_h100_469b33f.md): 6 causal entries of 64-4k tokens (the issue's
// batch) -6% time, a pack of 266 documents -8%. Not the static variant's: published, its padded
// causal calls past the persistent grid's lengths on the dynamic scheduler against one CTA per
// tile (benchmarks/bench_schedule.py, benchmarks/results/schedule_h100_469b33f.md, time) had
// d 128 16k 1.00, d 256 6k / 8k 0.99-1.00, but d 256 512 / 1k / 2k 1.06-1.08 slower (its O
// staged in Q's buffer: a CTA's next Q waits for the stores, where a new CTA's loads all start
// at once), and ptxas (sm_90a) gave its d 128 static softcap instance 0 -> 96 / 84 bytes of
// spills had the other variants followed.
// FwdTraits kPublishTiles: any instance, for the harness's A/Bs.
template <typename Traits, int kVariant>
__host__ __device__ constexpr bool fwd_published_tiles() {
  return fwd_compact_in_walk<Traits, kVariant>() || Traits::kPublishTiles;
}

// The tiles of a call for kernel instance (Traits, kVariant, kCompact: it decodes compact
// tiles) (the host's grid, the kernel's walk).
template <typename Traits, int kVariant, bool kCompact>
__host__ __device__ __forceinline__ int64_t fwd_tile_count(const FwdParams& p) {
  return kCompact ? query_tiles_of(p, Traits::kBlockM)
                  : query_tile_count((p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM,
                                     p.batch, p.num_heads);
}

// Tile `index`'s entry, head and query block. kCompact (the kernel decodes them): a varlen call's
// compact tiles (group_heads and defer_m are 0), one CTA each where the consumers walk on their
// own (fwd_launch.h refuses any other grid for them): a CTA's walk is its one tile, so the
// decoding a walk does ahead (kCompact false) never needs the search, which stays out of the
// consumers' loop; where the producer hands out the tiles (fwd_published_tiles) it decodes every
// one, on any grid.
// block_major: the compact tiles' order within an entry (FwdTmaParams::varlen_block_major).
template <bool kSeqlens, int kBlockM, bool kCompact>
__device__ __forceinline__ FwdTileSeq fwd_tile_seq(const FwdParams& p, int index, int num_m,
                                                   int group_heads, int defer_m,
                                                   bool block_major = false) {
  FwdTileSeq ts;
  if (kSeqlens && kCompact && compact_query_tiles(p, kBlockM)) {
    ts.tile = query_tile_of<kSeqlens>(p, kBlockM, index, block_major);
  } else {
    ts.tile =
        query_tile_at(index, num_m, p.num_heads, group_heads, p.batch * p.num_heads, defer_m);
  }
  ts.seq = seq_info<kSeqlens>(p, ts.tile.batch);
  return ts;
}

// FwdTmaParams::m_shift's value for "each varlen entry's own shift" (fwd_entry_shift).
constexpr int kFwdEntryShift = -1;

// Whether configuration (Traits, kVariant) works out each varlen entry's query-block shift
// (problem/mask.h Mask::query_block_shift) in fwd_work: the variants with sequence arrays up to
// d = 128 but dropout (whose Philox map wants tiles at multiples of 16 rows: problem/dropout.h).
// At d = 256 the shift's arithmetic spilled (ptxas, sm_90a: the dynamic instance 0 -> 48 / 44
// bytes), so its entries keep their blocks at multiples of the tile.
template <typename Traits, int kVariant>
__host__ __device__ constexpr bool fwd_entry_shift() {
  return variant_seqlens(kVariant) && !variant_dropout(kVariant) && Traits::kHeadDim <= 128;
}

// Whether configuration (Traits, kVariant), whose O goes through a TMA map on padded calls
// (FwdTraits kTmaStoreO), stores a first block shifted above row 0 from the registers, so that
// such calls can take the shift too (fwd_launch.h fwd_m_shift): the static variants at d = 256.
template <typename Traits, int kVariant>
__host__ __device__ constexpr bool fwd_shifted_tma() {
  return Traits::kTmaStoreO != 0 && !variant_dynamic(kVariant) && Traits::kHeadDim > 128;
}

// A tile's work. m_shift (FwdTmaParams::m_shift): the rows its query blocks sit above
// multiples of kBlockM, or kFwdEntryShift (kEntryShift kernels only): the entry's own.
template <bool kDynamic, int kBlockM, int kBlockN, bool kEntryShift = false>
__device__ __forceinline__ FwdWork fwd_work(const FwdParams& p, const FwdTileSeq& ts,
                                            int m_shift) {
  FwdWork w;
  w.tile = ts.tile;
  w.seq = ts.seq;
  const Mask mask = mask_of<kDynamic>(w.seq, p);
  int shift = m_shift;
  if constexpr (kEntryShift) {
    if (m_shift == kFwdEntryShift) shift = mask.template query_block_shift<kBlockM>();
  }
  w.m_start = w.tile.m_block * kBlockM - shift;
  w.skip = w.m_start >= w.seq.seqlen_q;
  w.blocks = mask.template key_blocks<kBlockM, kBlockN>(w.m_start);
  w.num_blocks = w.skip ? 0 : w.blocks.end - w.blocks.begin;
  return w;
}

template <bool kDynamic, bool kSeqlens, int kBlockM, int kBlockN, bool kCompact,
          bool kEntryShift = false>
__device__ __forceinline__ FwdWork fwd_work(const FwdParams& p, int index, int num_m,
                                            int group_heads, int defer_m, int m_shift,
                                            bool block_major = false) {
  return fwd_work<kDynamic, kBlockM, kBlockN, kEntryShift>(
      p,
      fwd_tile_seq<kSeqlens, kBlockM, kCompact>(p, index, num_m, group_heads, defer_m,
                                                block_major),
      m_shift);
}

// The deferred light blocks a kernel walks (query_tile_at's defer_m): FwdTmaParams::defer_m in
// the variants that take windows (the dynamic mask) up to d = 128, a compile-time 0 in the
// others. At d = 256 the index arithmetic it adds under the last P V spills (ptxas, sm_90a:
// dynamic variant 0 -> 20 bytes, softcap 12 -> 36), and d = 256 windows run one CTA per tile
// unless non-causal.
template <typename Traits, bool kDynamic>
__device__ __forceinline__ int kernel_defer_m(const FwdTmaParams& tp) {
  return kDynamic && Traits::kHeadDim <= 128 ? tp.defer_m : 0;
}

// Tile k of the CTA's static walk (k = 0: blockIdx.x): cta_tile_index's, or with FwdTraits
// kPairKV pair_tile_index's (cluster c's two CTAs on adjacent tiles: one head's adjacent query
// blocks while the head has an even count of them, fwd_launch.h's condition).
template <typename Traits>
__device__ __forceinline__ int walk_tile_index(int k) {
  if constexpr (Traits::kPairKV) {
    return pair_tile_index(k, static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
  } else {
    return cta_tile_index(k, blockIdx.x, gridDim.x);
  }
}

// The buffer that use i (counted from 0) of a ring of kBuffers takes, and the phase parity of
// its barriers that use waits for.
template <int kBuffers>
struct Slot {
  int stage;
  uint32_t parity;
  __device__ __forceinline__ explicit Slot(int i)
      : stage(i % kBuffers), parity((i / kBuffers) & 1) {}
};
// Where step i of the CTA's key-block walk (counted over all its tiles) reads its K/V buffer,
// and the phase parity it waits for.
template <typename Traits>
using RingSlot = Slot<Traits::kStages>;
// Q's buffer and its barriers' phase for the CTA's tile that is its i-th with key blocks
// (FwdTraits kQStages: one buffer, or two in turn).
template <typename Traits>
using QSlot = Slot<Traits::kQStages>;

}  // namespace flashattn_cu::sm90
