// Private kernel parameters. The public structs (csrc/include/flashattn_cu/flashattn_cu.h:
// AttnParams and its FwdParams / BwdParams) describe a call; the kernels receive these instead,
// built from them on the host, so a kernel can grow a field (a derived constant, a scheduler
// count, a workspace pointer) without changing the public ABI. The backward's lives with its
// pipeline (bwd/params.h: BwdKernelParams, with the workspace carving).
#pragma once

#include "flashattn_cu/flashattn_cu.h"

#include "score_mod.h"

namespace flashattn_cu {

struct FwdKernelParams {
  FwdParams p;
  float scale_log2;   // exponents are (s - max) * scale_log2 (problem/score_mod.h: score units)
  float score_scale;  // logit = s * score_scale
  float softcap_pre;  // softmax_scale / softcap, 0 without softcap
};

inline FwdKernelParams make_fwd_kernel_params(const FwdParams& p) {
  FwdKernelParams kp;
  kp.p = p;
  const ScoreScale sc = score_scale_of(p);
  kp.scale_log2 = sc.scale_log2;
  kp.score_scale = sc.score_scale;
  kp.softcap_pre = sc.softcap_pre;
  return kp;
}

}  // namespace flashattn_cu
