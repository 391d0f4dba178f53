// A self-test of the Hopper data-movement wrappers (ptx/tma.h, ptx/mbarrier.h, ptx/sync.h,
// tma_host.h), run by tests/test_hopper_ptx.py through _C._tma_copy_selftest: a 2-d copy of a
// 16-bit matrix tile by tile, global -> shared by a TMA load completing on an mbarrier, shared ->
// global by a TMA store, both through 128-byte-swizzled 64 x 64 boxes (the layout the wgmma
// kernels read), with partial boxes at the edges (zero-filled loads, clipped stores). A wrong
// coordinate order, swizzle, byte count or barrier protocol shows up as a wrong copy or a hang.
// And of the cluster wrappers (ptx/cluster.h), through _C._cluster_exchange_selftest: clusters of
// two CTAs, each staging its block of floats in shared memory, then reading its partner's through
// distributed shared memory between cluster barriers: a wrong rank, mapping or barrier shows up
// as a block that is not the partner's.
#include <cstdint>

#include "../launch.h"
#include "../ptx/arch.h"
#include "../ptx/cluster.h"
#include "../ptx/ldmatrix.h"
#include "../ptx/mbarrier.h"
#include "../ptx/sync.h"
#include "../ptx/tma.h"
#include "../ptx/wgmma.h"
#include "../tma_host.h"
#include "launch.h"

namespace flashattn_cu::sm90 {
namespace {

constexpr int kBox = 64;                        // 64 x 64 16-bit elements: one sw128 atom
constexpr uint32_t kBoxBytes = kBox * kBox * 2;  // 8 KiB
constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    tma_copy_kernel(const __grid_constant__ CUtensorMap src, const __grid_constant__ CUtensorMap dst) {
  extern __shared__ char smem_raw[];
  __shared__ alignas(8) uint64_t full;
  // 128-byte swizzled boxes need 1024-byte aligned shared memory.
  const uint32_t tile = (ptx::smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t bar = ptx::smem_u32(&full);
  const int32_t coords[2] = {static_cast<int32_t>(blockIdx.x) * kBox,
                             static_cast<int32_t>(blockIdx.y) * kBox};
  if (threadIdx.x == 0) {
    ptx::tma_prefetch_map(&src);
    ptx::mbarrier_init(bar, 1);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x / 32 == 0 && ptx::elect_one_sync()) {
    ptx::mbarrier_arrive_expect_tx(bar, kBoxBytes);  // the whole box, also where it overhangs
    ptx::tma_load<2>(tile, &src, bar, coords);
  }
  ptx::mbarrier_wait_parity(bar, 0);  // every thread: phase 0 complete, the tile has landed
  ptx::named_barrier_sync(ptx::NamedBarrier::kSelftest, kThreads);
  if (threadIdx.x == 0) {
    ptx::tma_store<2>(&dst, tile, coords);
    ptx::tma_store_commit();
    ptx::tma_store_wait<0>();  // shared memory read before the block exits
  }
}

constexpr int kExchangeFloats = 4 * kThreads;  // a block: four floats a thread

__global__ void __launch_bounds__(kThreads)
    cluster_exchange_kernel(const float* src, float* dst, int* ranks) {
  __shared__ alignas(16) float staged[kExchangeFloats];
  const int t = static_cast<int>(threadIdx.x);
  const int64_t block = blockIdx.x;
  reinterpret_cast<float4*>(staged)[t] =
      reinterpret_cast<const float4*>(src + block * kExchangeFloats)[t];
  const uint32_t rank = ptx::cluster_ctarank();
  if (t == 0) ranks[block] = static_cast<int>(rank);
  ptx::cluster_sync();  // both CTAs staged
  const uint32_t theirs = ptx::map_shared_cluster(ptx::smem_u32(staged) + 16 * t, rank ^ 1);
  reinterpret_cast<float4*>(dst + block * kExchangeFloats)[t] = ptx::ld_shared_cluster_v4(theirs);
  ptx::cluster_sync();  // the partner has read this CTA's staging before it exits
}

}  // namespace

Status cluster_exchange_selftest(const float* src, float* dst, int* ranks, int64_t blocks,
                                 cudaStream_t stream) {
  if (blocks <= 0) return Status::kSuccess;
  if (blocks % 2 != 0 || blocks > 65536) return Status::kInvalidArgument;
  return launch_kernel_clustered<cluster_exchange_kernel>(StreamOrder::kWhole, 2,
                                                          dim3(static_cast<unsigned>(blocks)),
                                                          dim3(kThreads), 0, stream, src, dst,
                                                          ranks);
}

Status tma_copy_selftest(const void* src, void* dst, int64_t rows, int64_t cols,
                         int64_t row_stride, DType dtype, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return Status::kSuccess;
  CUtensorMap src_map, dst_map;
  const uint64_t dims[2] = {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)};
  const uint64_t strides[1] = {static_cast<uint64_t>(row_stride) * 2};
  const uint32_t box[2] = {kBox, kBox};
  Status st = encode_tensor_map(&src_map, dtype, 2, src, dims, strides, box,
                                CU_TENSOR_MAP_SWIZZLE_128B);
  if (st == Status::kSuccess) {
    st = encode_tensor_map(&dst_map, dtype, 2, dst, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
  }
  if (st != Status::kSuccess) return st;
  const dim3 grid(static_cast<unsigned>((cols + kBox - 1) / kBox),
                  static_cast<unsigned>((rows + kBox - 1) / kBox));
  return launch_kernel<tma_copy_kernel>(grid, dim3(kThreads), kBoxBytes + 1024, stream, src_map,
                                        dst_map);
}

}  // namespace flashattn_cu::sm90
