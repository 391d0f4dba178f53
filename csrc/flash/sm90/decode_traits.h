// The sm90a decode kernel's layout (sm90/decode_kernel.h has the kernel): its parameters
// (DecodeTmaParams), the configuration and shared memory map (DecodeTraits), the ring slot of a
// key block (DecodeSlot) and the work both roles derive from a tile index (DecodeWork,
// decode_work), with the timeline's stamps (DecodeStamp).
#pragma once

#include <cstdint>

#include <cuda.h>

#include "../problem/kv_cache.h"
#include "../problem/mask.h"
#include "../problem/params.h"
#include "../problem/scheduler.h"
#include "../problem/seqlen.h"
#include "../tiles.h"

namespace flashattn_cu::sm90 {

// The decode kernel's parameters: the kvcache variant's (problem/params.h) and the TMA maps of
// the K and V caches (decode_launch.h).
struct DecodeTmaParams {
  CUtensorMap k_map;  // boxes of 64 columns x (kBlockN >> box_shift) rows
  CUtensorMap v_map;
  FwdKvcacheKernelParams kp;
  // Paged: TMA boxes of kBlockN >> box_shift rows, 2^box_shift per tile (decode_tiles.h
  // decode_box_rows_sm90: 0 where pages hold whole tiles, else a divisor of tile and page).
  int box_shift;
  // Tiles of the call (split_query_tile_count): CTA c walks tiles c, c + gridDim.x, ... (one per
  // CTA unless Traits::kPersistent).
  int num_tiles;
  // Traits::kStamps kernels only (benchmarks/tune/tune_decode90.cu `timeline`): per CTA
  // kDecodeStamps %globaltimer values (ns, comparable across SMs, coarse), then as many clock64
  // values (SM cycles, fine), at stamps[(2 * blockIdx.x + {0, 1}) * kDecodeStamps + DecodeStamp].
  unsigned long long* stamps = nullptr;
};

// The points of a CTA's life a kStamps kernel records (thread 0, the first consumer warp's lane
// 0): entry; past the PDL wait; Q in shared memory; the warp's first tile landed; every consumer
// warp's walk done (the merge's first barrier); thread 0's stores issued.
enum DecodeStamp : int {
  kStampEntry,
  kStampWaited,
  kStampQ,
  kStampFirstTile,
  kStampWalked,
  kStampStored,
  kDecodeStamps
};

template <int kHeadDim_, int kBlockN_, int kStages_, bool kTableEarly_ = true, int kMinCtas_ = 1,
          bool kStamps_ = false, bool kPersistent_ = false, int kProducerWarps_ = 1>
struct DecodeTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  // Paged caches: the producer warp reads the block table's slots for boxes g + 32 .. g + 63 when
  // it reaches box g (a round early), so no table latency sits between two TMA issues; false:
  // it reads boxes g .. g + 31 at box g (benchmarks/tune/tune_decode90.cu compares them).
  static constexpr bool kTableEarly = kTableEarly_;
  // CTAs per SM the registers are budgeted for (__launch_bounds__): each SM sub-partition holds
  // 16K registers and a CTA's five warps spread over four, so two CTAs need <= 168 registers a
  // thread (d 64: 182 -> 168, no spills), which ptxas works out from this bound.
  static constexpr int kMinCtas = kMinCtas_;
  // Harness only: record DecodeStamp times to DecodeTmaParams::stamps (off in the library).
  static constexpr bool kStamps = kStamps_;
  // A persistent grid (decode_launch.h: CTAs for every SM's slots, each walking the tiles
  // blockIdx.x, + gridDim.x, ...): the producer's ring runs on from one tile into the next while
  // the consumers merge and store the previous one and load the next Q, so a CTA's start (lengths,
  // Q, the first tile's latency: ~2.5-3 us, tune_decode90 timeline) and its merge (~1.5 us) are
  // paid once per SM slot rather than once per tile. The merge then needs its own shared memory
  // (the ring holds the next tile's K and V). false: one CTA per tile (the kernel's loop runs
  // once), the merge over the ring.
  static constexpr bool kPersistent = kPersistent_;
  static constexpr int kBlockM = kDecodeRowsSm90;  // query rows of a CTA (decode_tiles.h)
  static constexpr int kConsumerWarps = 4;
  // Producer warps (1, 2 or 4; benchmarks/tune/tune_decode90.cu `producers`): producer p issues
  // the key blocks of consumer warps p, p + kProducerWarps, ... (DecodeSlot::warp), so each
  // issues 1 / kProducerWarps of the walk's TMA boxes and waits only on its own warps' stages.
  // Pages read in 16-row boxes issue four times the TMA copies a contiguous cache does (d 64),
  // and there one producer's issue rate is the bound (NOTES 13.8 / 13.9).
  static constexpr int kProducerWarps = kProducerWarps_;
  static constexpr int kProducerWarp = kConsumerWarps;  // the first producer warp
  static constexpr int kNThreads = 32 * (kConsumerWarps + kProducerWarps);
  // Each consumer warp owns kStages / kConsumerWarps stages of the ring (DecodeSlot below): with
  // stages shared round-robin, a warp could reach tile i while tile i - kStages, another warp's,
  // had not landed yet (TMA copies complete out of order), and the one-bit phase parity of the
  // full barrier would then let it through a phase early.
  static constexpr int kWarpStages = kStages / kConsumerWarps;
  static constexpr int kAtoms = kHeadDim / 64;  // 64-column sw128 atoms of a row
  static constexpr int kNTiles = kBlockN / 8;   // 8-key accumulator tiles of S
  static constexpr int kDTiles = kHeadDim / 8;  // 8-column accumulator tiles of O
  static constexpr int kKSteps = kHeadDim / 16;
  static constexpr uint32_t kTileBytes = kAtoms * kBlockN * 128;  // one K or V tile
  static constexpr uint32_t kOffK = 0;
  static constexpr uint32_t kOffV = kStages * kTileBytes;
  static constexpr uint32_t kRingBytes = 2 * kStages * kTileBytes;
  // Barriers (at kOffBarriers): per stage full, then per stage empty.
  static constexpr int kBarFull = 0;
  static constexpr int kBarEmpty = kStages;
  static constexpr int kNumBarriers = 2 * kStages;
  // The merge (after the walk, over the ring): per consumer warp its 16 x d fp32 output and 16
  // LSEs.
  static constexpr uint32_t kMergeO = kConsumerWarps * kBlockM * kHeadDim * 4;
  static constexpr uint32_t kMergeLse = kConsumerWarps * kBlockM * 4;
  static constexpr uint32_t kMergeBytes = kMergeO + kMergeLse;
  // The merge's buffer: the ring (one tile per CTA), or after it (kPersistent).
  static constexpr uint32_t kOffMerge = kPersistent ? kRingBytes : 0;
  // The barriers after the ring and the merge (kPersistent), or after the larger of the two.
  static constexpr uint32_t kOffBarriers = kPersistent ? kRingBytes + kMergeBytes
                                           : kRingBytes > kMergeBytes ? kRingBytes
                                                                      : kMergeBytes;
  // Q: 16 rows of d columns, rows padded by 16 bytes (ldmatrix without bank conflicts), written
  // by the consumers once, read by every consumer warp's ldmatrix at every key block.
  // kPersistent: two buffers, the next tile's Q copied (cp.async) while this tile ends.
  static constexpr int kQRowBytes = kHeadDim * 2 + 16;
  static constexpr uint32_t kQBytes = kBlockM * kQRowBytes;
  static constexpr uint32_t kOffQ = kOffBarriers + 8 * kNumBarriers;
  // + 1024 bytes of alignment slack
  static constexpr int kSmemBytes = kOffQ + (kPersistent ? 2 : 1) * kQBytes + 1024;

  static_assert(kHeadDim % 64 == 0, "whole 64-column atoms");
  static_assert(kStages % kConsumerWarps == 0, "whole stages per consumer warp");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "key blocks of whole k16 steps, box rows <= 256");
  static_assert((kBlockN & (kBlockN - 1)) == 0, "a power of two: paged boxes split it by shifts");
  static_assert(kSmemBytes <= 227 * 1024, "fits the sm_90 shared memory");
  static_assert(kMergeBytes % 8 == 0, "8-byte aligned barriers after the merge");
  static_assert(!(kStamps && kPersistent), "the timeline stamps one tile per CTA");
  static_assert(kProducerWarps >= 1 && kConsumerWarps % kProducerWarps == 0,
                "every producer warp serves whole consumer warps");
};

// Byte offset of 16-byte chunk `chunk` (columns 8 chunk ..) of row `row` in a 128-byte-swizzled
// tile of kRows rows (atoms of 64 columns, each kRows x 128 bytes, 1024-byte aligned): the TMA's
// SWIZZLE_128B layout, chunk j of a 128-byte line at j ^ (line % 8).
template <int kRows>
__device__ __forceinline__ uint32_t sw128_offset(int row, int chunk) {
  return static_cast<uint32_t>((chunk / 8) * kRows * 128 + row * 128 +
                               (((chunk % 8) ^ (row % 8)) * 16));
}

// Where key block i of the CTA's walk lives (i counts the key blocks of the CTA's tiles, each
// tile's last block first, one tile after the other): consumer warp i % 4 reads it, from that
// warp's stage (i / 4) % kWarpStages, in phase (i / 4) / kWarpStages of the stage's barriers;
// the producer fills it in the same order.
template <typename Traits>
struct DecodeSlot {
  int warp;
  int stage;
  uint32_t parity;
  __device__ __forceinline__ explicit DecodeSlot(int i) {
    const int j = i / Traits::kConsumerWarps;  // the warp's j-th block
    warp = i % Traits::kConsumerWarps;
    stage = warp * Traits::kWarpStages + j % Traits::kWarpStages;
    parity = (j / Traits::kWarpStages) & 1;
  }
};

// What both roles derive from a tile index: its tile, entry, key blocks and cache addressing.
struct DecodeWork {
  SplitQueryTile tile;
  SeqInfo seq;
  GqaPack pack;
  int m_start;
  int rows_q;
  KeyBlocks blocks;  // the whole query block's (for the unmasked range)
  int n_begin, n_end;  // this split's share
  int cache_row0;      // key 0's cache row (cache_leftpad)
  int entry;           // contiguous cache: the cache entry (cache_batch_idx)
};

// The call's mask for a packed tile: of the call's queries (seqlen_q / group of them).
__device__ __forceinline__ Mask decode_mask(SeqInfo s, const FwdParams& p, const GqaPack& pack) {
  s.seqlen_q /= pack.group;
  return mask_of<true>(s, p);
}

template <int kBlockM, int kBlockN>
__device__ __forceinline__ DecodeWork decode_work(const FwdKvcacheKernelParams& kp, int index) {
  const FwdParams& p = kp.p;
  DecodeWork w;
  w.tile = split_query_tile_at(index, ceil_div(p.seqlen_q, kBlockM), p.num_heads,
                               kp.kv.num_splits);
  w.pack = GqaPack{kp.kv.pack_group};
  w.seq = packed_seq_info(p, w.tile.batch, w.pack.group);
  w.m_start = w.tile.m_block * kBlockM;
  w.rows_q = min(kBlockM, w.seq.seqlen_q - w.m_start);
  w.blocks = decode_mask(w.seq, p, w.pack)
                 .template key_blocks_of_queries<kBlockN>(w.pack.query(w.m_start),
                                                          w.pack.query(w.m_start + kBlockM - 1));
  const SplitBlocks share =
      split_key_blocks(w.blocks.begin, w.blocks.end, w.tile.split, kp.kv.num_splits);
  w.n_begin = share.begin;
  w.n_end = w.rows_q > 0 ? share.end : share.begin;
  w.cache_row0 = kp.kv.cache_leftpad != nullptr ? max(kp.kv.cache_leftpad[w.tile.batch], 0) : 0;
  w.entry = w.tile.batch;
  if (kp.kv.cache_batch_idx != nullptr) {  // clamped: flashattn_cu.h, KvcacheParams
    w.entry = min(max(kp.kv.cache_batch_idx[w.tile.batch], 0), kp.kv.batch_cache - 1);
  }
  return w;
}

}  // namespace flashattn_cu::sm90
