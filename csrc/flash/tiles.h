// Tile sizes of the sm80 (mma.sync) kernels, one place, usable from host and device code.
//
// Shared memory per forward block = (kBlockM + 2 * kBlockN) rows x (head_dim + 8) fp16/bf16
// elements: Q, one K and one V tile, each row padded by one 16-byte chunk so that the 8 rows an
// ldmatrix reads land in 8 different bank groups. Per-SM budgets: 227 KB per block on sm_90,
// 163 KB on sm_80, 99 KB on sm_86/sm_89 (cudaDevAttrMaxSharedMemoryPerBlockOptin). Registers:
// 64K per SM; a warp holding 32 rows x d=128 of fp32 output plus a 32 x 64 score tile sits at
// ~255 registers/thread, so 4 warps x 255 = 2 blocks/SM; 16 rows per warp for d > 128.
#pragma once

#include "decode_tiles.h"  // the decode kernel's rules (kept apart: one idea per file)
#include "head_dims.h"  // round_head_dim(): the instance that runs a head dim
#include "knobs.h"  // the forward step's instruction-order knobs, by instance (one idea per file)

namespace flashattn_cu {

struct FwdTile {
  int block_m;  // query rows per thread block
  int block_n;  // keys per K/V tile
  int warps;
  // Full K/V tiles (head_dim == instance, all rows in range) are copied without per-chunk
  // predicates. Measured on the H200 at seqlen 8k: +3.5% at d = 128 (355 vs 344 TFLOP/s), but
  // -1% at d = 64 and -7% at d = 256 (ptxas schedules the predicated form better there).
  bool unpredicated_bulk_loads = false;
};

// `small_smem`: the device allows < 128 KB of shared memory per block (sm_86, sm_89).
// Measured on the H200 (benchmarks/tune/tune_fwd.cu, bf16, batch x seqlen = 16k, hidden 2048,
// TFLOP/s at seqlen 8k non-causal; full tables in benchmarks/NOTES.md):
//  d <= 64 : 128 x 128, 4 warps (32 rows/warp): 315, vs 297 for 128 x 64 and 224 with 8 warps.
//  d <= 128: 128 x 64, 4 warps: 343, vs 310 (128 x 32), 281 (64 x 64), 258 (128 x 128, 8 warps).
//            32 rows/warp halve the shared-memory reads per mma against 16 rows/warp, which is
//            what every 8-warp variant lost; 128 x 128 would need 256 accumulator registers.
//  d  > 128: 64 x 64, 4 warps (16 rows/warp, 2 blocks/SM): d=160 261 vs 229, d=192 285 vs 253,
//            d=224 279 vs 251 for 128 x 64 with 8 warps (1 block/SM): two independent blocks
//            overlap each other's barriers and softmax. 32 rows/warp do not fit in registers.
//  small smem, d = 256: 64 x 32 (64 x 64 needs 101 KB with the padded rows).
__host__ __device__ constexpr FwdTile fwd_tile_sm80(int head_dim, bool small_smem) {
  if (head_dim <= 64) return FwdTile{128, 128, 4};
  if (head_dim <= 96) return FwdTile{128, 64, 4};
  if (head_dim <= 128) return FwdTile{128, 64, 4, true};
  if (head_dim <= 224 || !small_smem) return FwdTile{64, 64, 4};
  return FwdTile{64, 32, 4};
}

// The kvcache forward (sm80/fwd_kernel.h, kvcache variant; one instance per head dim and
// dtype, two for d = 256). Decode has few query rows (seqlen_q 1 .. 8, or the packed query heads
// of a kv group), so 64-row tiles (16 rows per warp) waste half as many tensor-core rows as 128
// and hold half the output accumulators. Chosen by ptxas (sm_80), not measured on a GPU yet:
// with fwd_tile_sm80's 128-row tiles the variant spilled 612 bytes at d = 64 and 280 at
// d = 128; 64 x 128 at d = 64: no spills; at d = 128, 64 x 128 spilled 80 bytes (the paged
// gather's 16 row lookups per thread), 64 x 64: 250 registers, none. Shared memory with the
// K/V stages below and the paged offsets: d = 64 87 KB, d = 128 89 KB (two stages), d = 256 x 64
// 102 KB (one; small class: x 32, 68 KB).
__host__ __device__ constexpr FwdTile fwd_tile_sm80_kvcache(int head_dim, bool small_smem) {
  if (head_dim <= 64) return FwdTile{64, 128, 4};
  if (head_dim <= 128) return FwdTile{64, 64, 4};
  if (head_dim <= 224 || !small_smem) return FwdTile{64, 64, 4};
  return FwdTile{64, 32, 4};
}

// K/V stages of the kvcache forward: 2 double-buffers the (K, V) pair of a tile, so tile n - 1's
// K and V (2 x block_n x d x 2 bytes, 32 KB at d = 128) are in flight during all of tile n's
// work, where one stage has a single 16 KB K or V tile in flight and waits for each in turn
// (decode is bandwidth-bound: bytes in flight per SM set the rate; benchmarks/NOTES.md section
// 13). Up to d = 128 the second stage fits two blocks per SM (87 KB at d = 128, 83 KB at
// d = 64, within the small class's 99 KB too); above, it would halve the blocks per SM (and not
// fit the small class), so one stage.
__host__ __device__ constexpr int fwd_kvcache_stages(int head_dim) {
  return head_dim <= 128 ? 2 : 1;
}

__host__ __device__ constexpr int fwd_smem_bytes(FwdTile tile, int head_dim) {
  return (tile.block_m + 2 * tile.block_n) * (head_dim + 8) * 2;
}

// Threshold for the `small_smem` configs above.
constexpr int kLargeSmemBytes = 128 * 1024;

// fwd()'s optional workspace (flashattn_cu.h FwdParams::workspace, fwd_workspace_bytes()): the
// sm_90a forward's tile counter (sm90/fwd_launch.h), an int, in 16 aligned bytes.
constexpr int kFwdWorkspaceBytes = 16;

// ---------------------------------------------------------------------------------------------
// Backward (sm80/bwd_kernel.h; the pipeline around it in bwd/). The main kernel gives each thread
// block block_n keys of one kv head; its warps own 16 keys each and loop over the query blocks
// (block_m rows) that see them.
//
//  * Register path (warps == block_n / 16): a warp computes S^T = K Q^T and dP^T = V dO^T for its
//    16 keys x all block_m queries, so P^T and dS^T come out in mma accumulator layout already
//    shaped as the A operand of dV += P^T dO and dK += dS^T Q. No shared-memory round trip for
//    P, and dS^T goes to shared memory only for the dQ GEMM. A thread holds dK + dV (head_dim
//    fp32 registers) and S^T + dP^T (block_m registers): head_dim + block_m <= 192 fits the
//    255-register budget, hence 64 x 128 at d = 128, 128 x 128 at d <= 64.
//  * Split path (warps == 2 * block_n / 16), d >= 160: dK + dV alone would be > 160 registers,
//    so two warps share each 16 keys: for S^T/dP^T they split the queries, for dK/dV the
//    columns, and P^T/dS^T are exchanged through shared memory.
//  * dQ (non-deterministic) = dS K per query block on a dq_warps_m x (warps / dq_warps_m) warp
//    grid, red.global.add into an fp32 accumulator; dq_passes > 1 splits the columns so fewer
//    accumulators are live next to dK/dV (d = 256).
//  * stages = 2 double-buffers Q/dO (the next block loads during the whole step); 1 loads the
//    next block only after dK, overlapping just the dQ GEMM (d >= 192 on 163 KB sm_80 class).
//  * Deterministic mode skips the atomics and runs a separate dQ kernel (bwd/dq_kernel.h):
//    dq_block_m queries per thread block (16 per warp), key blocks of dq_block_n walked in order,
//    dq_stages K/V buffers.
// Shared memory (bytes): main = (2 block_n + 2 stages block_m) (d + 8) 2 + split block_n
// (block_m + 8) 2 + 12 stages block_m (M, L, D per query); dQ kernel = (2 dq_block_m + 2 dq_stages dq_block_n) (d + 8) 2.
// Large class: <= 163 KB (sm_80; sm_90 has 227 KB but shares the config); small: <= 99 KB.
// These are first choices by register/shared-memory arithmetic, to be revised with H200 numbers
// in benchmarks/NOTES.md.
struct BwdTile {
  int block_m;
  int block_n;
  int warps;
  int stages;
  int dq_warps_m;
  int dq_passes;
  int dq_block_m;
  int dq_block_n;
  int dq_stages;
};

__host__ __device__ constexpr BwdTile bwd_tile_sm80(int head_dim, bool small_smem) {
  // d = 32: 96 KB, fits both classes.
  if (head_dim <= 32) return BwdTile{128, 128, 8, 2, 4, 1, 128, 64, 2};
  // d = 64: 144 KB (large); 91 KB with 64-query steps (small).
  if (head_dim <= 64) {
    return small_smem ? BwdTile{64, 128, 8, 2, 2, 1, 128, 64, 2}
                      : BwdTile{128, 128, 8, 2, 4, 1, 128, 64, 2};
  }
  // d = 96: 123 KB (large); 4 warps x 16 keys, 88 KB (small).
  if (head_dim <= 96) {
    return small_smem ? BwdTile{64, 64, 4, 2, 2, 1, 64, 64, 2}
                      : BwdTile{64, 128, 8, 2, 4, 1, 128, 64, 2};
  }
  // d = 128: 155 KB, 192 accumulator registers (large); 4 warps, single-buffered, 78 KB (small).
  if (head_dim <= 128) {
    return small_smem ? BwdTile{64, 64, 4, 1, 2, 2, 64, 32, 2}
                      : BwdTile{64, 128, 8, 2, 2, 1, 128, 64, 2};
  }
  // d >= 160: split path, 64 keys x 8 warps.
  if (head_dim <= 160) {
    return small_smem ? BwdTile{32, 64, 8, 2, 2, 1, 64, 32, 2}   // 95 KB
                      : BwdTile{64, 64, 8, 2, 4, 1, 64, 64, 2};  // 145 KB
  }
  if (head_dim <= 192) {
    return small_smem ? BwdTile{32, 64, 8, 1, 2, 1, 64, 32, 1}   // 85 KB
                      : BwdTile{64, 64, 8, 1, 4, 1, 64, 64, 2};  // 119 KB
  }
  if (head_dim <= 224) {
    return small_smem ? BwdTile{32, 64, 8, 1, 2, 1, 64, 32, 1}   // 97 KB
                      : BwdTile{64, 64, 8, 1, 4, 1, 64, 32, 2};  // 134 KB
  }
  return small_smem ? BwdTile{32, 32, 4, 1, 2, 2, 32, 32, 1}     // 71 KB
                    : BwdTile{64, 64, 8, 1, 4, 2, 64, 32, 2};    // 150 KB
}

__host__ __device__ constexpr int bwd_smem_bytes(BwdTile tile, int head_dim) {
  return (2 * tile.block_n + 2 * tile.stages * tile.block_m) * (head_dim + 8) * 2 +
         (tile.warps * 16 / tile.block_n) * tile.block_n * (tile.block_m + 8) * 2 +
         12 * tile.stages * tile.block_m;
}

__host__ __device__ constexpr int bwd_dq_smem_bytes(BwdTile tile, int head_dim) {
  return (2 * tile.dq_block_m + 2 * tile.dq_stages * tile.dq_block_n) * (head_dim + 8) * 2;
}

// sm90a backward. Register path (sm90/bwd_kernel.h): 128 keys per block in two warpgroups of
// 64, kBlockM queries per step; a thread holds dK + dV (d fp32 registers) and S^T + dP^T
// (kBlockM), so d + kBlockM <= 192 as on sm80. Split path (sm90/bwd_split_kernel.h, d = 256):
// 64 keys per block, warpgroup 0 computes S^T and warpgroup 1 dP^T, each owns half of the dK/dV
// columns. Head dims without an sm90 instance use the sm80 kernels.
// Measured on the H200 (bf16, benchmarks/NOTES.md section 5): d=128 8k 365-375 TFLOP/s vs 264 for
// the sm80 kernel in the same run; d=64 1.05-1.10x FA2; d=256 split 1.03-1.07x FA2. block_m = 128
// at d=64 needs 255 registers with 172 bytes of spills (ptxas), so 64 there too.
struct BwdTileSm90 {
  bool supported;
  bool split;
  int block_m;
};

__host__ __device__ constexpr BwdTileSm90 bwd_tile_sm90(int head_dim) {
  if (head_dim == 64) return BwdTileSm90{true, false, 64};
  if (head_dim == 128) return BwdTileSm90{true, false, 64};
  if (head_dim == 256) return BwdTileSm90{true, true, 64};
  return BwdTileSm90{false, false, 0};
}

// sm90a forward (sm90/fwd_kernel.h): a producer warpgroup (TMA) and block_m / 64 consumer
// warpgroups of 64 query rows, key blocks of block_n in a ring of `stages` K/V buffers. A consumer
// thread holds O (d / 2 fp32), S (block_n / 2 fp32) and P (block_n / 4 registers) within its
// setmaxnreg budget (240 with 2 consumers, 160 with 3). Shared memory: Q + stages (K + V), d
// rounded up to 64-column atoms, at most 227 KB.
// Measured on the H200 (benchmarks/tune/tune_fwd90.cu, bf16, 16k tokens, hidden 2048, TFLOP/s
// non-causal / causal at seqlen 8k; benchmarks/results/tune_fwd90_*_h200.txt):
//  d = 64 : 192 x 128, 3 consumers: 472 / 435, vs 430 / 409 for 128 x 128 with ping-pong (the
//           exponentials are as costly as the GEMMs here: a third warpgroup hides more of them).
//  d = 128: 128 x 176, ping-pong: 659 / 602, vs 617 / 583 (128 x 128), 597 / 526 (no ping-pong),
//           616 / 567 (3 stages): 208 KB.
//  d = 256: 128 x 80, ping-pong: 712 / 646, vs 618 / 581 (128 x 64): 224 KB.
//  d = 96, 192 (not measured yet): 128 x 128 (160 KB) and 128 x 96 (192 KB), ping-pong.
// `dynamic`: the kernel variants beyond the static one (problem/mask.h: varlen, windows, ALiBi,
// softcap) hold more live values (window bounds, sequence info, the modifiers); with the tiles
// above they spill (ptxas, sm_90a: d = 64 168-240 bytes, d = 128 x 176 176-228, d = 256 x 80
// 72-80), so they take the next narrower tile: 128 x 128 ping-pong at d = 64 and 128, 128 x 64
// at d = 256 (no spills). Softcap alone on a padded call without a window takes the static-mask
// softcap instance (problem/mask.h kStaticSoftcapVariant), whose `dynamic` is false: the static
// tiles (benchmarks/NOTES.md 12.10: +6% at d = 64, +1-5% at d = 128, +8-11% at d = 256).
struct FwdTileSm90 {
  bool supported;
  int block_m;
  int block_n;
  int stages;
  // The epilogue of padded calls (FwdTraits kTmaStoreO): 0 4-byte stores from the registers,
  // 1 a TMA store from staging boxes of its own, 2 a TMA store staged in Q's buffer. Measured
  // on the H200 (tune_fwd90 `tmastore`, results/tune_fwd90_v13_tmastore_h200.txt; TFLOP/s,
  // registers -> the choice, mean of two passes, 1k / 2k / 4k / 16k, non-causal then causal;
  // benchmarks/NOTES.md 12.9): d = 256 128 x 80 in Q's buffer 593 -> 581, 679 -> 684, 716 ->
  // 731, 700 -> 738; causal 363 -> 412, 490 -> 528, 587 -> 615, 747 -> 747; 128 x 64 causal
  // (1k / 2k) 362 -> 403, 471 -> 502. d = 128 128 x 128 own boxes: 527 -> 556, 601 -> 605;
  // causal 396 -> 402, 497 -> 494. Left on the registers: d = 128 128 x 176 (in Q's buffer
  // 1k -11%, 16k -2%: Q's load behind the store is exposed), d = 64 192 x 128 (own boxes
  // +2.5% at 1k / 2k, -2% at 16k), d = 64 128 x 128 (own boxes -2.5% to -4%). Those are the
  // static variant's kernels; the other variants' tiles of the same shape (d = 128 128 x 128,
  // d = 256 128 x 64) take the same epilogue by analogy, not measured on their own yet.
  int o_store = 0;
  // FwdTraits kSerialPV: each consumer's P V retired before its next S GEMM (three consumers'
  // registers at d = 128; fwd_serial_sm90 below).
  bool serial = false;
};

// The sm90a backward's causal key tiles longest first over all tiles (sm90/bwd_launch.h
// run_bwd_with causal_lpt) instead of head after head, for a causal call on padded rows without
// a window. A list-scheduling model of the hardware's hand-out of one CTA per key tile
// (benchmarks/NOTES.md 12.45) put the library's order 3-7% over the mean load at d 64-256 and
// 1k-8k keys, the other 0.2-0.8%; it reads each head's Q / dO from tiles further apart in time.
// Measured on an H100 (tune_bwd90 `lpt`, one pass, benchmarks/results/
// tune_bwd90_earlydv_lpt_h100_73b9447.txt), time longest first / head after head: d 128 1k-4k
// 1.41-1.81, 8k 0.963, 16k 0.989; d 64 1k-4k 1.44-1.57, 8k 1.002, 16k 0.981; d 256 not yet.
// So from 8k keys at d 128 and past 8k at d 64; FLASHATTN_CU_BWD_CAUSAL_LPT=0 turns it off,
// =1 on for every causal call (the A/Bs).
#ifndef FLASHATTN_CU_BWD_CAUSAL_LPT
#define FLASHATTN_CU_BWD_CAUSAL_LPT -1
#endif
__host__ __device__ constexpr bool bwd_causal_lpt_sm90(int head_dim, int seqlen_k) {
  if (FLASHATTN_CU_BWD_CAUSAL_LPT >= 0) return FLASHATTN_CU_BWD_CAUSAL_LPT != 0;
  return head_dim <= 64 ? seqlen_k > 8192 : head_dim <= 128 && seqlen_k >= 8192;
}

// Three consumers on a serial step (FwdTraits kSerialPV; benchmarks/NOTES.md 12.45): the
// 192 x 128 tile for d = 128's static instance (plain attention, long rows), each consumer's
// softmax under the other two's GEMMs. Not measured yet (tune_fwd90 `serial3` A/Bs it against
// the library's tile), so off unless the build defines FLASHATTN_CU_FWD_SERIAL3=1, which
// builds the whole library with it for the suite and the bench in one device call.
#ifndef FLASHATTN_CU_FWD_SERIAL3
#define FLASHATTN_CU_FWD_SERIAL3 0
#endif
__host__ __device__ constexpr bool fwd_serial_sm90(int head_dim, bool static_plain_long_rows) {
  return FLASHATTN_CU_FWD_SERIAL3 != 0 && head_dim == 128 && static_plain_long_rows;
}

// `alibi`: the ALiBi variant (without softcap), whose bias is now a few FMA-pipe instructions per
// score from per-lane float terms (problem/score_mod.h): it keeps the static tiles at d = 64 and
// 128 with no spills (ptxas, sm_90a) and measures faster there than on 128 x 128
// (tune_fwd90_v4_mods_h200.txt, TFLOP/s 4k / 16k non-causal, causal: d = 128 605 589 521 602
// against 605 573 538 567; d = 64 404 431 351 404 against 396 401 357 409).
__host__ __device__ constexpr FwdTileSm90 fwd_tile_sm90(int head_dim, bool dynamic,
                                                       bool alibi = false) {
  const bool narrow = dynamic && !alibi;
  if (head_dim == 64) return narrow ? FwdTileSm90{true, 128, 128, 2} : FwdTileSm90{true, 192, 128, 2};
  if (head_dim == 96) return FwdTileSm90{true, 128, 128, 2};
  if (head_dim == 128) return narrow ? FwdTileSm90{true, 128, 128, 2, 1} : FwdTileSm90{true, 128, 176, 2};
  if (head_dim == 192) return FwdTileSm90{true, 128, 96, 2};
  if (head_dim == 256) return dynamic ? FwdTileSm90{true, 128, 64, 2, 2} : FwdTileSm90{true, 128, 80, 2, 2};
  return FwdTileSm90{false, 0, 0, 0};
}

// Whether a window alone on a padded call takes the padded window instance (problem/mask.h
// kPaddedWindowVariant: the dynamic variant's mask and tile above, without its sequence arrays)
// at this head dim. Measured on the H200 (tune_fwd90 `window`, window (1024, 0), causal, 4k / 8k
// / 16k, two passes, TFLOP/s dynamic -> padded; benchmarks/NOTES.md 12.12): d = 64 308 / 307 /
// 315 -> 318 / 321 / 324 and 298 / 304 / 315 -> 316 / 318 / 322 (+3-6%); d = 128 493 / 477 /
// 488 -> 491 / 474 / 486 and 474 / 459 / 465 -> 486 / 470 / 474 (-0.5% to +2.5%); d = 256 503 /
// 505 / 508 -> 502 / 492 / 500 and 504 / 508 / 499 -> 492 / 495 / 503 (-2.5% to +1%: its
// instance spilled 4 bytes then), so not at d = 256 until its lazy rescale (fwd_lazy_rescale_sm90
// kPaddedWindow, no spills): on an H100 (tune_fwd90 `window256`, the same calls, dynamic -> padded,
// benchmarks/results/tune_fwd90_window256_h100_d1e7ec3.txt) d = 256 497 / 464 / 475 -> 528 / 499 /
// 509 and 469 / 470 / 474 -> 504 / 506 / 508 (time 0.93-0.96), d = 128's control 0.99-1.01. That
// gain was the lazy reference's, which the library no longer takes (knobs.h fwd_lazy_rescale_sm90:
// its accuracy cost), so d = 256 is back on the dynamic instance (the running-max A/B of 12.12:
// -2.5% to +1%). d = 96 and 192 not measured.
__host__ __device__ constexpr bool fwd_padded_window_sm90(int head_dim) {
  return head_dim == 64 || head_dim == 128;
}

// Short rows (the static variant only): a causal tile of 128 (192) query rows over key blocks of
// 176 (128) computes the entries past the diagonal up to its last block's end, and a 192-row tile
// past the end of 1024 query rows, which narrower tiles skip: at d = 128, 1k causal, 30 blocks of
// 128 x 176 hold 1.29x the triangle's entries, 36 of 128 x 128 1.12x; at d = 64 192 x 128 holds
// 1.50x, 128 x 128 1.12x. Measured on the H200 (tune_fwd90 `short`,
// benchmarks/results/tune_fwd90_v10_short_h200.txt; TFLOP/s, library tile -> this one, causal at
// 512 / 1k / 2k / 4k keys): d = 64 178 -> 214, 245 -> 290, 358 -> 350, 423 -> 394 (and
// non-causal 512 / 1k 313 -> 332, 362 -> 386, 2k 453 -> 419); d = 128 222 -> 254, 333 -> 364,
// 444 -> 467, 541 -> 544 (non-causal within 2% up to 2k, 4k 626 -> 608); d = 256 (128 x 64) 214
// -> 234, 331 -> 348, 458 -> 468, 563 -> 565. The dynamic variant's instance of the same tile
// measured 3-12% below the static one on these calls, hence an instance of its own.
__host__ __device__ constexpr FwdTileSm90 fwd_tile_sm90_short(int head_dim) {
  if (head_dim == 64) return FwdTileSm90{true, 128, 128, 2};
  if (head_dim == 128) return FwdTileSm90{true, 128, 128, 2, 1};
  if (head_dim == 256) return FwdTileSm90{true, 128, 64, 2, 2};
  return FwdTileSm90{false, 0, 0, 0};
}

// A tuning knob of the sm90a forward (sm90/fwd_traits.h kDoubleQ), off in the library until
// measured (tune_fwd90 `doubleq`, benchmarks/NOTES.md 12.64 / 12.65): a build with
// -DFLASHATTN_CU_FWD_DOUBLE_Q=1 gives the static variant's tiles two Q buffers where their
// shared memory holds a second Q and O is not staged in Q's buffer (sm90/fwd_launch.h
// LibraryFwdTraits), so that the suite and the bench can run with it before a rule is chosen.
// (The exponentials two per SFU instruction, ex2.approx.f16x2, were measured and dropped:
// benchmarks/tune/mufu_rate.cu has the packed forms at the f32 form's 16 results a clock an SM,
// NOTES 12.65.)
#ifndef FLASHATTN_CU_FWD_DOUBLE_Q
#define FLASHATTN_CU_FWD_DOUBLE_Q 0
#endif
__host__ __device__ constexpr bool fwd_double_q_sm90() { return FLASHATTN_CU_FWD_DOUBLE_Q != 0; }

// Whether the sm90a forward's instances load Q in one part per consumer, each with its own
// barriers (FwdTraits kSplitQ): a build flag, off by default, for the whole suite and the bench
// with it on (tune_fwd90 `splitq` A/Bs it without a build of the library).
#ifndef FLASHATTN_CU_FWD_SPLIT_Q
#define FLASHATTN_CU_FWD_SPLIT_Q 0
#endif
__host__ __device__ constexpr bool fwd_split_q_sm90() { return FLASHATTN_CU_FWD_SPLIT_Q != 0; }

// Whether a static-variant call of the head-dim instance `head_dim` takes fwd_tile_sm90_short's
// tile (the measurements above: the last lengths at which it won). `plain`: a call without score
// modifiers (the static variant itself); d = 128's plain causal calls keep the short tile up to
// 3k keys, remeasured with the long tile's last-aligned query blocks (tune_fwd90 `shortlong`,
// H100, two passes, benchmarks/results/tune_fwd90_shortlong_h100_8707a5c.txt; time 128 x 128 /
// 128 x 176, causal): 1.5k 0.97, 2k 0.94, 2.5k 0.96, 3k 0.97, 4k 1.00. The modifier variants'
// choice (static ALiBi / softcap on the long tile, else the dynamic one on the short) keeps 2k:
// not measured past it. d = 64 (same run, 192 x 128 against 128 x 128): 1,000 keys 1.08, 1,024
// 1.00, 1.5k 1.07, 2k 0.95, 2.5k 0.96, 3k 1.12, no bound that wins on both sides; unchanged.
// Plain non-causal calls (tune_fwd90 `shortlongnc`, H100, two calls of two passes each,
// benchmarks/results/tune_fwd90_shortlongnc_h100_{94270b0,1452686}.txt; time short / long
// tile): d = 64 256 / 384 / 512 / 768 / 1,024 rows 0.81-0.84 / 1.12-1.14 / 1.03-1.04 /
// 1.15-1.16 / 1.05-1.06, so they take 192 x 128 above 256 rows (1,024 = 5 x 192 + 64 wastes
// two thirds of a tile and still wins: three consumers' step costs ~19% less a row); d = 128
// 512 / 1k / 1.5k / 2k / 4k keys 0.90 / 0.96 / 0.99 / 1.01 / 1.04, so up to 1,536 keys the
// 128 x 128 tile. (d = 256, same runs, 128 x 64 / 128 x 80: non-causal 1.02-1.045 at 1k-3k, the
// long tile as before; causal 1k 0.98, 1.5k 0.99, 2k 1.01, 3k 1.00: the 2k bound left as is.)
__host__ __device__ constexpr bool fwd_short_rows_sm90(int head_dim, bool causal, int seqlen_q,
                                                      int seqlen_k, bool plain = false) {
  if (head_dim == 64) {
    if (plain && !causal) return seqlen_q <= 256;
    return seqlen_q <= 1024 || (causal && seqlen_k <= 1024);
  }
  if (head_dim == 128) {
    return causal ? seqlen_k <= (plain ? 3072 : 2048) : plain && seqlen_k <= 1536;
  }
  if (head_dim == 256) return causal && seqlen_k <= 2048;
  return false;
}

// The sm90a forward's schedule of a causal call on padded rows without a window
// (sm90/fwd_launch.h causal_persistent and causal_order), by head dim (of the call) and keys.
// Measured on an H100 (tune_fwd90 `lpt`, two passes within 1% of each other,
// benchmarks/results/tune_fwd90_lpt_h100_73b9447.txt; time against the schedule before:
// the persistent grid at d <= 128 up to 4k keys, else one CTA per tile head after head):
//   d 64:  4k one CTA per tile in groups of heads whose K / V fit half the L2 -7%, 8k -2.2%;
//          16k longest first over all tiles -2.4% (groups -1%)
//   d 128: 4k groups -7% (longest first -3%); 8k longest first -2% (groups -0.5%); 16k the
//          head after head order stays (longest first +0.5%, groups +4%)
//   d 256: 4k / 8k longest first -5..-6% (groups +2.5..+4.5%); 16k head after head stays (+5%)
//   1k / 2k: every other order lost (6-58%): the persistent grid (d <= 128), head after head.
// d 96 follows d 128 and d 192 keeps head after head (not measured). The rule against the
// schedule before (tune_fwd90 `orders`, H100, two passes,
// benchmarks/results/tune_fwd90_orders_h100_3acfa01.txt) at 3k / 4k / 6k / 8k / 16k keys: d 128 0.97 / 0.93 / 0.97 / 0.98 / 1.00, d 256 1.01-1.05 /
// 0.95-0.97 / - / 0.94 / 1.00, d 64 4k / 8k / 16k 0.93 / 0.98 / 0.98; but d 64 at 3k 1.126 (the
// persistent grid ran 429 TFLOP/s there against 362 at 4k): d 64 keeps the persistent grid
// below 4k keys. Not yet measured on the H200 (benchmarks/NOTES.md 12.60).
// With the persistent walk's groups sized for its balance (sm90/fwd_launch.h fwd_walk_group,
// session 54: the L2's groups had left its busiest CTA 17-27% over the mean at the lengths where
// it lost), the persistent grid against the orders above (tune_fwd90 `persist4k`, H100, two
// passes, benchmarks/results/tune_fwd90_persist4k_h100_1452686.txt; time of the orders /
// persistent): d 64 4k 1.13, 4.5k 1.075, 5k 1.065, 6k 1.06; d 128 3.5k 1.08, 4k 1.095, 4.5k
// 1.05, 5k 1.045, 6k 1.00. So the persistent grid up to 6k keys at d 64 and 5k at d 128 (d 128
// 2.5k / 3k, not measured, predicted about even by benchmarks/tune/walk_balance.cpp).
// Session 55 (H100, two passes each, benchmarks/results/tune_fwd90_{persist256,groupcap}_h100_
// 6a73fc8.txt): d 256's causal calls on that walk against one CTA per tile (tune_fwd90
// `persist256`; time one CTA per tile / persistent) 1k 1.016-1.056, 1.5k 1.03, 2k 1.10, 3k 1.02,
// 4k 1.05, 6k 0.95; groups past the L2's bound where none within it balances
// (problem/scheduler.h balanced_group_heads, problem/scheduler.h kWalkGroupCap; tune_fwd90
// `groupcap`) took d 128 at 6k 5-6% below the orders' time (the persistent grid with the bounded
// groups had been even with them), so d 128 up to 6k. The bench at 16d1429 (H100, d 256 causal
// persistent up to 4k with those groups, against 6a73fc8's run; ratios to cuDNN in each run):
// 2k 0.98 -> 1.02, 4k 1.07 -> 1.08, but 512 0.92 -> 0.87 and 1k 0.95 -> 0.89 (the H200's v3_snake
// had d 256 1k persistent 11% slower too, with the L2's groups), against the harness's 1k
// +1.6-5.6%: d 256 took it above 1k keys, to 4k (1k's disagreement: NOTES 12.67 item 4).
// Session 56, the first H200 run of these (tune_fwd90 `persist8k_flushed`, `persist256f`, L2
// emptied before each call, benchmarks/results/tune_fwd90_{persist8k,persist256f}_h200_3a6d34b.txt;
// time one CTA per tile in the orders below / persistent): d 64 7k / 8k / 12k 1.03 / 1.05 / 1.04,
// d 128 1.06 / 1.05 / 1.07, d 256 5k / 6k 1.03 / 1.02 (the H100 had 6k 0.95); d 256 at 512 /
// 768 / 1k / 1.5k / 2k 1.00 / 1.04 / 1.06 / 1.02 / 1.09 (back to back alike). The bench with the
// persistent grid up to 12k at d <= 128 and from 513 keys at d 256 (4736334, an H100, FA4 beside
// it, benchmarks/results/fa4_side_by_side_h100_4736334.md; ratios in each run, 6a73fc8 -> it):
// d 128 causal 8k 0.96 -> 1.06x cuDNN, 0.86 -> 0.98x FA4; but d 64 8k 1.20 -> 1.16 / 1.04 ->
// 1.00, and d 256 1k 0.96 -> 0.91 / 1.00 -> 0.92 (the third bench to time d 256 1k persistent
// slower than the harness does; NOTES 12.69). So d 96 / 128 up to 12k keys (16k not measured on
// these groups), d 64 up to 6k and d 256 above 1k up to 4k as before.
// Session 57 (H100; benchmarks/bench_schedule.py, the library's two schedules interleaved, L2
// emptied by a memset and by a read before each call, benchmarks/results/
// schedule_h100_defe98e.md; time persistent / one CTA per tile, memset / read): d 64 8k 0.949 /
// 0.919, 12k 0.965 / 0.977, 16k 0.968 / 1.003; tune_fwd90 `persist16k_flushed` (time one CTA per
// tile / persistent) d 64 12k 1.037-1.040, 16k 1.024-1.025. With the H200's 7k / 8k / 12k above,
// d 64 takes the persistent grid up to 16k keys (past that not measured). The same run kept the
// rest: d 128 16k 1.038 / 1.046 (one CTA per tile), d 256 512 / 1k 1.06 / 1.08 (one CTA per
// tile; the harness's 1k disagrees again), 6k 0.973 / 0.980 (within the run's ~3% between two
// timings of one kernel), 8k 1.034 / 1.037.
constexpr int kFwdCausalL2Groups = -2;  // fwd_schedule: groups of heads of half the L2 each
__host__ __device__ constexpr bool fwd_causal_persistent_sm90(int head_dim, int seqlen_k) {
  return head_dim <= 64    ? seqlen_k <= 16384
         : head_dim <= 128 ? seqlen_k <= 12288
                           : head_dim > 192 && seqlen_k > 1024 && seqlen_k <= 4096;
}
// 0: head after head (each head's query blocks longest first); -1: longest first over all tiles;
// kFwdCausalL2Groups: longest first within groups of heads whose K / V fit half the L2.
// Where the rule above takes the persistent grid, these are the orders a call forced onto one CTA
// per tile (flashattn_cu.h set_fwd_causal_schedule) takes: head after head up to 2k keys (the
// `lpt` sweep's 1k / 2k), else what the lengths past the persistent range measured.
__host__ __device__ constexpr int fwd_causal_order_sm90(int head_dim, int seqlen_k) {
  if (seqlen_k <= 2048) return 0;
  if (head_dim <= 64) return seqlen_k <= 8192 ? kFwdCausalL2Groups : -1;
  if (head_dim <= 128) return seqlen_k <= 8192 ? -1 : 0;
  if (head_dim > 192) return seqlen_k > 2048 && seqlen_k <= 8192 ? -1 : 0;
  return 0;
}

// Whether the sm90a forward aligns the query blocks of a padded call whose O goes through a TMA
// map to the last row (sm90/fwd_launch.h fwd_m_shift; the instances that can: fwd_work.h
// fwd_shifted_tma, d = 256's static ones, whose shifted first block stores from the registers,
// the rest of its blocks by TMA). The walk model has d = 256's 128 x 80 tile at 3,000 causal keys
// -3.9% key-block steps (benchmarks/tune/walk_model.py); nothing where 128 divides seqlen_q.
// Measured on the H100 (tune_fwd90 `lastaligned`, two passes, benchmarks/results/
// tune_fwd90_lastaligned_h100_8707a5c.txt; time shifted / at multiples of the tile, causal):
// d = 256 128 x 80 at 1,000 / 3,000 / 5,000 keys 0.996 / 0.967-0.970 / 0.959-0.960. A build with
// -DFLASHATTN_CU_FWD_SHIFT_TMA=0 turns it off.
#ifndef FLASHATTN_CU_FWD_SHIFT_TMA
#define FLASHATTN_CU_FWD_SHIFT_TMA 1
#endif
__host__ __device__ constexpr bool fwd_shift_tma_store_sm90(int head_dim) {
  return FLASHATTN_CU_FWD_SHIFT_TMA != 0 && head_dim > 128;
}

}  // namespace flashattn_cu
