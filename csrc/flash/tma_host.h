// Host side of TMA: tensor maps (CUtensorMap) for ptx/tma.h, encoded by the driver's
// cuTensorMapEncodeTiled. The function is fetched through the runtime
// (cudaGetDriverEntryPointByVersion) the first time it is needed, so nothing links against
// libcuda; cuda.h is read for the declarations only. Torch-free.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "flashattn_cu/flashattn_cu.h"

namespace flashattn_cu {

// A tiled tensor map of `rank` (1..5) dimensions, innermost first: dims[i] elements,
// byte_strides[i] between consecutive indices of dimension i + 1 (rank - 1 of them, multiples of
// 16), boxes of box[i] elements (box[0] * element size a multiple of 16 bytes, <= the swizzle
// span for a swizzled map), elements zero-filled out of bounds. base 16-byte aligned (128 for a
// swizzled map). kInvalidArgument when the driver rejects the description, kUnsupportedDevice
// when the driver has no TMA.
Status encode_tensor_map(CUtensorMap* map, DType dtype, int rank, const void* base,
                         const uint64_t* dims, const uint64_t* byte_strides, const uint32_t* box,
                         CUtensorMapSwizzle swizzle);

}  // namespace flashattn_cu
