// cuTensorMapEncodeTiled through the runtime's driver entry point (tma_host.h).
#include "tma_host.h"

#include <cuda_runtime.h>

namespace flashattn_cu {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's function, looked up once (the ABI of CUDA 12.0's version, which TMA came with).
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                                             cudaEnableDefault, &found);
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();  // ours; not left for an unrelated later check
      return static_cast<EncodeTiled>(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(ptr);
  }();
  return fn;
}

}  // namespace

Status encode_tensor_map(CUtensorMap* map, DType dtype, int rank, const void* base,
                         const uint64_t* dims, const uint64_t* byte_strides, const uint32_t* box,
                         CUtensorMapSwizzle swizzle) {
  if (map == nullptr || rank < 1 || rank > 5 || base == nullptr) return Status::kInvalidArgument;
  const EncodeTiled fn = encode_tiled();
  if (fn == nullptr) return Status::kUnsupportedDevice;
  cuuint64_t d[5], s[4];
  cuuint32_t b[5], unit[5];
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    unit[i] = 1;  // every element of the box, no striding
    if (i + 1 < rank) s[i] = byte_strides[i];
  }
  const CUtensorMapDataType type = dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                             : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult res = fn(map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(base), d, s,
                          b, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return res == CUDA_SUCCESS ? Status::kSuccess : Status::kInvalidArgument;
}

}  // namespace flashattn_cu
