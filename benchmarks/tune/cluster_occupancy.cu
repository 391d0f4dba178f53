// How many thread-block clusters of the sm90a decode kernel fit on this GPU at once, by cluster
// size (cudaOccupancyMaxActiveClusters), torch-free: the question behind merging a tile's
// split-KV partials inside the kernel through distributed shared memory (the splits of one tile
// as one cluster) instead of a combine kernel. A cluster's CTAs share a GPC, so a cluster of n
// needs n free SMs of one GPC: with the decode kernel at one CTA per SM, the clusters that fit
// are bounded by the GPCs' SM counts, not only by 132 / n. Build and run (device):
//   nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -DFLASHATTN_CU_HAS_SM90A=1 \
//        -gencode arch=compute_90a,code=sm_90a -Icsrc/include -Icsrc/flash \
//        benchmarks/tune/cluster_occupancy.cu -o /tmp/cluster_occupancy && /tmp/cluster_occupancy
#include <cstdio>

#include "harness.h"
#include "library_status.h"
#include "sm90/decode_launch.h"

namespace fa = flashattn_cu;

namespace {

template <typename Traits>
int report(const char* name) {
  auto kernel = fa::sm90::decode_kernel<__nv_bfloat16, Traits>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Traits::kSmemBytes));
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Traits::kNThreads,
                                                      Traits::kSmemBytes));
  std::printf("%s: %d threads, %d bytes of shared memory, %d CTAs per SM\n", name,
              Traits::kNThreads, Traits::kSmemBytes, per_sm);
  for (int size = 1; size <= 16; size *= 2) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(size * 64);
    config.blockDim = dim3(Traits::kNThreads);
    config.dynamicSmemBytes = Traits::kSmemBytes;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = size;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    int clusters = 0;
    const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
    if (e != cudaSuccess) {  // a size this GPU refuses: said, not fatal
      std::printf("  cluster %2d: %s\n", size, cudaGetErrorString(e));
      cudaGetLastError();
      continue;
    }
    std::printf("  cluster %2d: %3d clusters at once = %3d CTAs\n", size, clusters,
                clusters * size);
  }
  return 0;
}

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("SMs: %d\n", sms);
  constexpr fa::DecodeTileSm90 t128 = fa::decode_tile_sm90(128), t64 = fa::decode_tile_sm90(64);
  int rc = report<fa::sm90::DecodeTraits<128, t128.block_n, t128.stages>>("decode d 128");
  rc |= report<fa::sm90::DecodeTraits<64, t64.block_n, t64.stages>>("decode d 64");
  return rc;
}
