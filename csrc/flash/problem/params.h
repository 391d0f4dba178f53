// Private kernel parameters. The public structs (csrc/include/flashattn_cu/flashattn_cu.h:
// AttnParams and its FwdParams / BwdParams) describe a call; the kernels receive these instead,
// built from them on the host, so a kernel can grow a field (a derived constant, a scheduler
// count, a workspace pointer) without changing the public ABI. The backward's lives with its
// pipeline (bwd/params.h: BwdKernelParams, with the workspace carving).
#pragma once

#include "flashattn_cu/flashattn_cu.h"

#include "dropout.h"
#include "score_mod.h"

namespace flashattn_cu {

struct FwdKernelParams {
  FwdParams p;
  ScoreScale score;  // problem/score_mod.h: the score units (scale_log2, softcap)
  DropoutScale dropout;  // problem/dropout.h: keep threshold and 1 / (1 - p)
};

inline FwdKernelParams make_fwd_kernel_params(const FwdParams& p) {
  FwdKernelParams kp;
  kp.p = p;
  kp.score = score_scale_of(p);
  kp.dropout = dropout_scale_of(p);
  return kp;
}

}  // namespace flashattn_cu
