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
  // Fused append + rotary (problem/kv_append.h; flashattn_cu.h: KvcacheParams::k_new). k_new
  // null: nothing is appended and the rest of this block is unused. cache_seqlens: the keys
  // before the append (FwdParams::seqused_k holds the counts after it).
  const void* k_new;
  const void* v_new;
  const int* cache_seqlens;
  int seqlen_new;
  int64_t knew_batch_stride, knew_row_stride, knew_head_stride;
  int64_t vnew_batch_stride, vnew_row_stride, vnew_head_stride;
  const void* rotary_cos;  // null: no rotary
  const void* rotary_sin;
  int rotary_dim;
  int rotary_seqlen;  // the tables' rows: positions clamp into [0, rotary_seqlen - 1]
  bool rotary_interleaved;
  bool rotary_q_per_row;  // q row i at cache_seqlens + i (causal or a window), else + 0
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
