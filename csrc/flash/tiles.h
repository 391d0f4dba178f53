// Tile sizes of the sm80 (mma.sync) kernels, one place, usable from host and device code.
//
// Shared memory per forward block = (kBlockM + 2 * kBlockN) rows x (head_dim + 8) fp16/bf16
// elements: Q, one K and one V tile, each row padded by one 16-byte chunk so that the 8 rows an
// ldmatrix reads land in 8 different bank groups. Per-SM budgets: 227 KB per block on sm_90,
// 163 KB on sm_80, 99 KB on sm_86/sm_89 (cudaDevAttrMaxSharedMemoryPerBlockOptin). Registers:
// 64K per SM; a warp holding 32 rows x d=128 of fp32 output plus a 32 x 64 score tile sits at
// ~255 registers/thread, so 4 warps x 255 = 2 blocks/SM; 16 rows per warp for d >= 160.
#pragma once

namespace flashattn_cu {

struct FwdTile {
  int block_m;  // query rows per thread block
  int block_n;  // keys per K/V tile
  int warps;
};

// `small_smem`: the device allows < 128 KB of shared memory per block (sm_86, sm_89).
// Rationale per head dim (H200 numbers in benchmarks/NOTES.md):
//  d <= 64 : 128 x 128, 4 warps (32 rows/warp): 55 KB smem; score tile 32 x 128 fits registers.
//  d <= 128: 128 x 64, 4 warps: 70 KB; 32 x 128 fp32 output + 32 x 64 scores ~ 255 regs, no spills.
//  d <= 160: 128 x 64, 8 warps (16 rows/warp): 86 KB, fits every sm_8x/9x.
//  d >= 192: 128 x 64, 8 warps where 103-135 KB of smem fit (sm_80, sm_90); else 64 x 64 (64 x 32
//            for d = 256) with 4 warps, which fit 99 KB.
__host__ __device__ constexpr FwdTile fwd_tile_sm80(int head_dim, bool small_smem) {
  if (head_dim <= 64) return FwdTile{128, 128, 4};
  if (head_dim <= 128) return FwdTile{128, 64, 4};
  if (head_dim <= 160) return FwdTile{128, 64, 8};
  if (!small_smem) return FwdTile{128, 64, 8};
  if (head_dim <= 224) return FwdTile{64, 64, 4};
  return FwdTile{64, 32, 4};
}

// Head dims that get their own compiled instance; a call with head_dim d runs the smallest
// instance >= d with the columns past d zero-filled on load and skipped on store.
__host__ __device__ constexpr int round_head_dim(int head_dim) {
  return head_dim <= 32 ? 32 : head_dim <= 64 ? 64 : head_dim <= 96 ? 96 : head_dim <= 128 ? 128
       : head_dim <= 160 ? 160 : head_dim <= 192 ? 192 : head_dim <= 224 ? 224 : 256;
}

__host__ __device__ constexpr int fwd_smem_bytes(FwdTile tile, int head_dim) {
  return (tile.block_m + 2 * tile.block_n) * (head_dim + 8) * 2;
}

// Threshold for the `small_smem` configs above.
constexpr int kLargeSmemBytes = 128 * 1024;

}  // namespace flashattn_cu
