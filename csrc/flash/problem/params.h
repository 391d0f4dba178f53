// Private kernel parameters. The public structs (csrc/include/flashattn_cu/flashattn_cu.h:
// AttnParams and its FwdParams / BwdParams) describe a call; the kernels receive these instead,
// built from them on the host, so a kernel can grow a field (a derived constant, a scheduler
// count, a workspace pointer) without changing the public ABI. The backward's lives with its
// pipeline (bwd/params.h: BwdKernelParams, with the workspace carving).
#pragma once

#include "flashattn_cu/flashattn_cu.h"

namespace flashattn_cu {

constexpr float kLog2e = 1.4426950408889634f;

struct FwdKernelParams {
  FwdParams p;
  float scale_log2;  // softmax_scale * log2(e): exponents are (s - max) * scale_log2
};

inline FwdKernelParams make_fwd_kernel_params(const FwdParams& p) {
  FwdKernelParams kp;
  kp.p = p;
  kp.scale_log2 = p.softmax_scale * kLog2e;
  return kp;
}

}  // namespace flashattn_cu
