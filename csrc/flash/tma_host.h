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

// The map of a (batch, rows, heads, head_dim) tensor (varlen: one entry of `rows` = total rows)
// as (head_dim, rows, heads, batch), 128-byte swizzled boxes of 64 columns x box_rows rows: the
// sw128 atoms the wgmma descriptors read (ptx/wgmma.h; the sm90 forward and backward). Strides
// in elements. A dimension of extent 1 gets a stride the driver accepts whatever the tensor's
// (it is never stepped).
inline Status encode_rows_map(CUtensorMap* map, DType dtype, const void* base, int head_dim,
                              int64_t rows, int heads, int batch, int64_t row_stride,
                              int64_t head_stride, int64_t batch_stride, int box_rows) {
  const uint64_t dims[4] = {static_cast<uint64_t>(head_dim), static_cast<uint64_t>(rows),
                            static_cast<uint64_t>(heads), static_cast<uint64_t>(batch)};
  const int64_t strides[3] = {row_stride, head_stride, batch_stride};
  uint64_t bytes[3];
  for (int i = 0; i < 3; ++i) {
    bytes[i] = dims[i + 1] == 1 ? 16u : static_cast<uint64_t>(strides[i]) * 2u;
  }
  const uint32_t box[4] = {64u, static_cast<uint32_t>(box_rows), 1u, 1u};
  return encode_tensor_map(map, dtype, 4, base, dims, bytes, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace flashattn_cu
