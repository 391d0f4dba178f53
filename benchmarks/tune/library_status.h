// The one library function the torch-free harnesses that launch through csrc/flash/launch.h need
// and do not link (dispatch.cu defines it for the library): cuda_status. Included once by each
// harness program (tune_fwd.cu, tune_fwd90.cu, tune_bwd90.cu, tune_decode90.cu,
// cluster_occupancy.cu).
#pragma once

#include <cuda_runtime.h>

#include "flashattn_cu/flashattn_cu.h"

namespace flashattn_cu {
Status cuda_status(cudaError_t err) {
  return err == cudaSuccess ? Status::kSuccess : Status::kLaunchFailed;
}
}  // namespace flashattn_cu
