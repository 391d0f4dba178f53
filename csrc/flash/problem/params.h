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

// What only the kvcache variant reads (problem/kv_cache.h, flashattn_cu.h: KvcacheParams), in
// FwdKvcacheKernelParams below: the other kernels' parameters stay as they were.
struct KvcacheKernelFields {
  const int* cache_batch_idx;
  int batch_cache;
  const int* cache_leftpad;
  const int* block_table;
  int64_t block_table_batch_stride;
  int page_size;
  int num_pages;
  // GQA packing (problem/kv_cache.h: GqaPack): query heads per kv head in a tile's rows, 1 for
  // none. With group > 1, FwdParams::seqlen_q is the packed rows (queries x group) and
  // num_heads the kv heads; the q/o strides are the call's own.
  int pack_group;
  // Split-KV: num_splits > 1 writes split s's normalised output of plane row r (the index of r
  // in lse) to o_partial[(s * partial_rows + r) * head_dim ..] and its LSE to
  // lse_partial[s * partial_rows + r] (fwd/combine.h merges them into o and lse).
  int num_splits;
  int64_t partial_rows;
  float* o_partial;
  float* lse_partial;
};

struct FwdKernelParams {
  FwdParams p;
  ScoreScale score;  // problem/score_mod.h: the score units (scale_log2, softcap)
  DropoutScale dropout;  // problem/dropout.h: keep threshold and 1 / (1 - p)
};

// The kvcache variant's parameters (sm80/fwd_kernel.h picks this type for it).
struct FwdKvcacheKernelParams : FwdKernelParams {
  KvcacheKernelFields kv;
};

inline FwdKernelParams make_fwd_kernel_params(const FwdParams& p) {
  FwdKernelParams kp;
  kp.p = p;
  kp.score = score_scale_of(p);
  kp.dropout = dropout_scale_of(p);
  return kp;
}

}  // namespace flashattn_cu
