// The tiles and grid rules of the sm90a decode kernel (sm90/decode_kernel.h): keys per block and
// ring stages, the boxes of paged reads, CTAs per SM, producer warps and the persistent grid,
// each with the measurements that chose it. The other kernels' tiles are in tiles.h.
#pragma once

namespace flashattn_cu {

// The sm90a decode kernel (sm90/decode_kernel.h: split-KV over TMA, 16 query rows, a warp per
// key block): keys per block and ring stages. A stage is a K and a V tile, 16 KB at both head
// dims; four of them (one per consumer warp, which owns its stage) keep up to 64 KB per SM in
// flight (one CTA per SM: registers), a little above the H200's bandwidth-latency product per
// SM (4.3 TB/s x ~1.5 us / 132 SMs ~ 50 KB). Eight stages (128 KB in flight) were slower on
// every shape of benchmarks/tune/tune_decode90.cu (H200, bf16, 32/8 heads: d 128 batch 8 32k
// 3916 -> 4224 GB/s, 128k 4167 -> 4418; d 64 batch 8 128k 3626 -> 4328; batch 64 32k +5-6%;
// benchmarks/NOTES.md 13.6), as were 64-key d 128 and 128-key d 64 blocks (128 KB too).
// Other head dims run the sm80 kvcache kernel.
struct DecodeTileSm90 {
  bool supported;
  int block_n;
  int stages;
};

// Query rows of a decode CTA (one mma.sync row tile): the most packed rows a call may have to
// take the kernel (dispatch.cu decode_sm90_ok).
constexpr int kDecodeRowsSm90 = 16;

__host__ __device__ constexpr DecodeTileSm90 decode_tile_sm90(int head_dim) {
  if (head_dim == 64) return DecodeTileSm90{true, 64, 4};
  if (head_dim == 128) return DecodeTileSm90{true, 32, 4};
  return DecodeTileSm90{false, 0, 0};
}

// The tile of a call on the decode kernel: decode_tile_sm90's, for a contiguous cache
// (page_size <= 0) or pages of a multiple of 16 rows; other pages: none (the sm80 kernel).
// Pages that do not hold whole tiles are read in smaller boxes (decode_box_rows_sm90). Session
// 21 measured the alternative, 16-key tiles for 16-row pages (d 128 8 stages, d 64 16): a
// consumer warp's 16-key tile is too little work for its latency, one CTA per SM then reads at
// most ~2400 GB/s (d 128) and ~1450 GB/s (d 64), in order or shuffled, at 64 to 192 KB in flight
// (benchmarks/results/tune_decode90_v4_paged_h200.txt).
__host__ __device__ constexpr DecodeTileSm90 decode_tile_sm90_for(int head_dim, int page_size) {
  const DecodeTileSm90 tile = decode_tile_sm90(head_dim);
  if (!tile.supported || page_size <= 0 || page_size % 16 == 0) return tile;
  return DecodeTileSm90{false, 0, 0};
}

// Rows of one TMA box of the decode kernel's K or V tile of block_n keys: the tile, on a
// contiguous cache or pages holding whole tiles, else the largest divisor of both the tile and
// the page (a multiple of 16 where decode_tile_sm90_for supports the page): 16 for 16- or 48-row
// pages, 32 for 96-row pages under 64-key tiles. Each box comes from its own page.
__host__ __device__ constexpr int decode_box_rows_sm90(int block_n, int page_size) {
  if (page_size <= 0) return block_n;
  int a = block_n, b = page_size;
  while (b != 0) {
    const int r = a % b;
    a = b;
    b = r;
  }
  return a;
}

// Whether a call's pages are read in boxes below the decode tile (16- or 48-row pages; a
// contiguous cache, pages holding whole tiles and pages no tile supports: false), where the
// producer's issue rate bounds the walk (decode_ctas_sm90, decode_producers_sm90).
__host__ __device__ constexpr bool decode_boxed_pages_sm90(int head_dim, int page_size) {
  if (page_size <= 0) return false;
  const DecodeTileSm90 tile = decode_tile_sm90_for(head_dim, page_size);
  return tile.supported && decode_box_rows_sm90(tile.block_n, page_size) < tile.block_n;
}

// CTAs per SM of a call on the decode kernel: 2 (the d 64 instance budgeted for two CTAs:
// DecodeTraits kMinCtas 2, 168 registers, no spills) for d 64 pages read in boxes below the tile
// (16- or 48-row pages: the producer's issue rate per CTA bounds those, 13.8 / 13.9) when the call
// has query tiles for at least a quarter of the SMs, else 1. Measured with
// benchmarks/tune/tune_decode90.cu v7 (H200, bf16, 32/8 heads, 16-row pages, one CTA -> two,
// splits by the one-wave rule on each instance's slots; benchmarks/NOTES.md 13.11): batch 8
// 4k / 32k / 128k 1,929 -> 2,022, 3,257 -> 3,554, 3,574 -> 3,646 GB/s, batch 64 4k / 32k 3,076 ->
// 3,639, 3,599 -> 4,085; but batch 1 4k 565 -> 479 (8 tiles: splits double, each CTA's share
// halves), and contiguous caches or 256-row pages lose 4-17% at batch 8 (one CTA already keeps
// enough bytes in flight there). `tiles`: query tiles of the packed call before splitting.
__host__ __device__ constexpr int decode_ctas_sm90(int head_dim, int page_size, long long tiles,
                                                   int sms) {
  return head_dim == 64 && decode_boxed_pages_sm90(head_dim, page_size) && 4 * tiles >= sms ? 2 : 1;
}

// Producer warps of the decode kernel (DecodeTraits kProducerWarps: producer p issues the key
// blocks of consumer warps p, p + P, ...) for a call on pages read in boxes below the tile (16-
// or 48-row pages: a d 64 tile is four 16-row boxes, eight TMA copies, where a contiguous cache
// issues two; one warp's issue rate bounds those walks, NOTES 13.8 / 13.9). A build flag until
// benchmarks/tune/tune_decode90.cu `producers` has measured it: FLASHATTN_CU_DECODE_PRODUCERS
// (default 1: one producer on every call; 2 or 4: that many on boxed pages, compiled beside the
// one-producer instances), so that the suite and bench_decode can run with it before a rule.
#ifndef FLASHATTN_CU_DECODE_PRODUCERS
#define FLASHATTN_CU_DECODE_PRODUCERS 1
#endif
constexpr int kDecodeProducersBuilt = FLASHATTN_CU_DECODE_PRODUCERS;
static_assert(kDecodeProducersBuilt == 1 || kDecodeProducersBuilt == 2 ||
                  kDecodeProducersBuilt == 4,
              "FLASHATTN_CU_DECODE_PRODUCERS: 1, 2 or 4 producer warps");
__host__ __device__ constexpr int decode_producers_sm90(int head_dim, int page_size) {
  return decode_boxed_pages_sm90(head_dim, page_size) ? kDecodeProducersBuilt : 1;
}

// A persistent grid for the decode kernel (DecodeTraits kPersistent: a CTA per SM slot, each
// walking several tiles, its ring running on from one tile into the next) on calls with more
// tiles (after splitting) than slots. The timeline (tune_decode90, H200, read flush) has a
// CTA's start (lengths, Q, the first tile: ~2.5-3 us) and its merge and stores (~1.5 us) beside
// a walk of ~30 us at d 64 batch 64 4k and ~60 us at d 128. Measured (tune_decode90
// `persistent`, H100, two passes alike; benchmarks/NOTES.md 13.18): at d 64 batch 64 the
// persistent grid is faster on every cache (4k / 32k: contiguous 2.8% / 1.6%, 256-row pages
// 2.2% / 0.2%, the two-CTA instance on 16-row pages 1.6% / 4.0%); at d 128 mixed (4k 0.6-0.8%
// faster, 32k 0.4-0.9% slower): on at d 64 only (`head_dim`: the instance's). More splits than
// one wave's on it lose (batch 1 / 8: 2x splits 2-22% slower). FLASHATTN_CU_DECODE_PERSISTENT=0
// builds without it.
#ifndef FLASHATTN_CU_DECODE_PERSISTENT
#define FLASHATTN_CU_DECODE_PERSISTENT 1
#endif
constexpr bool kDecodePersistentBuilt = FLASHATTN_CU_DECODE_PERSISTENT != 0;
// Whether the head-dim instance has a persistent decode kernel (sm90/decode_launch.h compiles it
// where this says so).
__host__ __device__ constexpr bool decode_persistent_instance_sm90(int head_dim) {
  return kDecodePersistentBuilt && head_dim == 64;
}
__host__ __device__ constexpr bool decode_persistent_sm90(int head_dim, long long tiles,
                                                          long long slots) {
  return decode_persistent_instance_sm90(head_dim) && tiles > slots;
}

}  // namespace flashattn_cu
