// Warpgroup MMA (wgmma, sm_90a): the Hopper tensor-core instructions, issued by the 128 threads of
// a warpgroup (4 consecutive warps, the first one's index a multiple of 4), asynchronous.
//
// Protocol (PTX ISA, "asynchronous warpgroup level matrix multiply"):
//   wgmma_fence()   before the first wgmma of a batch whenever other instructions wrote its
//                   accumulator or A registers since the last wgmma;
//   wgmma_*()       issue; wgmma_commit() closes a group; wgmma_wait<N>() waits until at most N
//                   groups are in flight. Registers of an in-flight wgmma are not to be touched.
//   fence_operand() after a wait: keeps the compiler from moving reads of the accumulator above it.
// Shared memory written by ordinary stores and read next by wgmma needs fence_proxy_async_shared()
// in the writing threads before the barrier that publishes it.
//
// Accumulator layout of m64nN (fp32): thread `lane` of warp w of the warpgroup holds
//   d[nt][hr * 2 + e] = row 16 w + lane / 4 + 8 hr, column 8 nt + 2 (lane % 4) + e,
// i.e. each warp owns 16 rows laid out like the mma.sync m16n8 C fragment, and an A operand from
// registers (m64k16, 16-bit) is the mma.sync m16n8k16 A fragment of the warp's 16 rows.
//
// Shared-memory operands use one layout, "sw128": a [rows][cols] 16-bit tile is stored as atoms
// of 64 columns (128 bytes per row), atom after atom; inside an atom, row r's 16-byte chunk c sits
// at chunk c ^ (r % 8) (the 128-byte swizzle), atoms 1024-byte aligned. The same tile is read
// K-major (cols = K) or MN-major (cols = M or N), see sw128_desc_k_major / _mn_major.
#pragma once

#include <cstdint>

#include "arch.h"

namespace flashattn_cu::ptx {

// Byte offset of 16-byte chunk `chunk` of row `row` in a sw128 tile of kRows rows.
template <int kRows>
__host__ __device__ __forceinline__ constexpr uint32_t sw128_offset(int row, int chunk) {
  return static_cast<uint32_t>((chunk / 8) * (kRows * 128) + row * 128 +
                               (((chunk % 8) ^ (row % 8)) * 16));
}

// Zeroes rows row0 .. kRows - 1 (kChunks 16-byte chunks each) of a sw128 tile of kRows rows,
// thread `share` of `threads` taking every threads-th chunk. Ordinary stores: a wgmma or TMA
// store that reads them next needs fence_proxy_async_shared() first.
template <int kRows, int kChunks>
FLASHATTN_CU_DEVICE void zero_rows_sw128(uint32_t tile, int row0, int share, int threads) {
  const int chunks = (kRows - row0) * kChunks;
#pragma unroll 1
  for (int idx = share; idx < chunks; idx += threads) {
    const uint32_t at = tile + sw128_offset<kRows>(row0 + idx / kChunks, idx % kChunks);
    asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(at), "r"(0) : "memory");
  }
}

// Matrix descriptor (PTX "matrix descriptor format"): start address, leading- and stride-dimension
// byte offsets (all >> 4), swizzle mode 1 = 128-byte.
FLASHATTN_CU_DEVICE uint64_t smem_desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(lbo_bytes >> 4) << 16) |
         (static_cast<uint64_t>(sbo_bytes >> 4) << 32) | (1ull << 62);
}

// The descriptor of a 16-byte aligned address `offset` bytes past the one `desc` describes: the
// start address field (bits 0-13, address bits 4-17) advanced by offset >> 4. Shared-memory
// addresses stay below 2^18 (228 KB on sm_90), so the field never carries into the next one, and
// the sum is the descriptor smem_desc gives for the address. With `desc` made once from a tile's
// base, every k-step's descriptor is one integer add of a constant (which ptxas folds into the
// uniform datapath) instead of a mask and shift of the address each time.
FLASHATTN_CU_DEVICE uint64_t desc_advance(uint64_t desc, uint32_t offset) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (offset >> 4);  // no carry out of the field
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// K-major view of a sw128 tile (cols = K): the 64 (M or N) x 16 (K) slab starting at row `row0`,
// k-step `ks` (columns 16 ks ..). Core-matrix groups of 8 rows are 1024 bytes apart; inside an atom
// the k-step moves the start by 32 bytes (the swizzle is applied to the final address).
template <int kRows>
FLASHATTN_CU_DEVICE uint64_t sw128_desc_k_major(uint32_t tile, int row0, int ks) {
  return desc_advance(smem_desc(tile, 16, 1024),
                      (ks / 4) * (kRows * 128) + row0 * 128 + (ks % 4) * 32);
}

// MN-major view of a sw128 tile (rows = K, cols = M or N): k-step `kk` (rows 16 kk ..), columns
// from `col0` on. The next 64 columns are one atom (kRows * 128 bytes) further (leading offset),
// the next 8 rows 1024 bytes (stride offset).
// Byte offset of column col0 (a multiple of 8) in row 0 of such a tile.
template <int kRows>
__host__ __device__ __forceinline__ constexpr uint32_t sw128_mn_col_offset(int col0) {
  return static_cast<uint32_t>((col0 / 64) * (kRows * 128) + (col0 % 64) * 2);
}
template <int kRows>
FLASHATTN_CU_DEVICE uint64_t sw128_desc_mn_major(uint32_t tile, int kk, int col0) {
  return desc_advance(smem_desc(tile, kRows * 128, 1024),
                      kk * 16 * 128 + sw128_mn_col_offset<kRows>(col0));
}

// A shared-memory address the compiler cannot hoist out of the loop it is read in (a volatile
// move): descriptors made from it are then formed where they are used, one add of a constant each
// (desc_advance), instead of being hoisted as loop invariants into registers that the kernels
// (255 registers at d 128) do not have.
FLASHATTN_CU_DEVICE uint32_t pin_smem_addr(uint32_t addr) {
  uint32_t r;
  asm volatile("mov.b32 %0, %1;\n" : "=r"(r) : "r"(addr));
  return r;
}

FLASHATTN_CU_DEVICE void wgmma_fence() {
#if FLASHATTN_CU_SM90A
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  unsupported_arch();
#endif
}

FLASHATTN_CU_DEVICE void wgmma_commit() {
#if FLASHATTN_CU_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  unsupported_arch();
#endif
}

template <int kPending>
FLASHATTN_CU_DEVICE void wgmma_wait() {
#if FLASHATTN_CU_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#else
  unsupported_arch();
#endif
}

template <int kRows, int kCols>
FLASHATTN_CU_DEVICE void fence_operand(float (&d)[kRows][kCols]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int j = 0; j < kCols; ++j) asm volatile("" : "+f"(d[i][j])::"memory");
}

FLASHATTN_CU_DEVICE void fence_proxy_async_shared() {
#if FLASHATTN_CU_SM90_OR_NEWER
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  unsupported_arch();
#endif
}

#if FLASHATTN_CU_SM90A
#include "wgmma_ops.h"
#endif

// d (m64 x kN) (+)= A (m64 x k16, shared, kTransA: MN-major) * B (k16 x kN, shared). d may be a
// wider accumulator: the product goes to its 8-column tiles kTile0 .. kTile0 + kN / 8, the others
// are left as they are.
template <int kN, bool kBf16, int kTransA, int kTransB, int kTile0 = 0, int kTiles>
FLASHATTN_CU_DEVICE void wgmma_ss(float (&d)[kTiles][4], uint64_t desc_a, uint64_t desc_b,
                                  int scale_d) {
#if FLASHATTN_CU_SM90A
  wgmma_ss_n<kN, kBf16, kTransA, kTransB, kTile0, kTiles>(d, desc_a, desc_b, scale_d);  // N: NS
#else
  unsupported_arch();
#endif
}

// d (m64 x kN) (+)= A (registers, mma.sync A fragments of each warp's 16 rows) * B (shared).
template <int kN, bool kBf16, int kTransB>
FLASHATTN_CU_DEVICE void wgmma_rs(float (&d)[kN / 8][4], const uint32_t (&a)[4], uint64_t desc_b,
                                  int scale_d) {
#if FLASHATTN_CU_SM90A
  wgmma_rs_n<kN, kBf16, kTransB>(d, a, desc_b, scale_d);
#else
  unsupported_arch();
#endif
}

}  // namespace flashattn_cu::ptx
