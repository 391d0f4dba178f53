// The forward's S_dmask (FwdParams::s_dmask, flash_attn's return_softmax with dropout): the
// softmax probabilities of every element, negated where dropout drops it. A testing aid, so a
// plain kernel after the forward rather than a store in the forward's loop: one thread block per
// (entry, head, row of the rounded matrix), q's row in shared memory, one fp32 dot product per
// key, P = exp(logit - lse) from the LSE the forward wrote, the mask from dropout_keep (one
// Philox call per element, the reference form of the map in common/philox.h).
#pragma once

#include <math.h>

#include <cstdint>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/philox.h"
#include "../launch.h"
#include "../problem/dropout.h"
#include "../problem/mask.h"
#include "../problem/params.h"
#include "../problem/score_mod.h"
#include "../problem/seqlen.h"

namespace flashattn_cu::forward {

constexpr int kProbsThreads = 128;
constexpr int kProbsRound = 128;  // S_dmask's rows and columns are rounded up to this (flash_attn)

__host__ __device__ __forceinline__ int probs_rounded(int n) {
  return (n + kProbsRound - 1) / kProbsRound * kProbsRound;
}

template <typename Element>
__global__ void __launch_bounds__(kProbsThreads)
    attn_probs_kernel(const __grid_constant__ FwdKernelParams kp) {
  __shared__ float s_q[256];
  const FwdParams& p = kp.p;
  const int rows = probs_rounded(p.seqlen_q), cols = probs_rounded(p.seqlen_k);
  const int row = static_cast<int>(blockIdx.x % rows);
  const int bh = static_cast<int>(blockIdx.x / rows);
  const int batch = bh / p.num_heads, head = bh % p.num_heads;
  const int head_k = head / (p.num_heads / p.num_heads_k);
  const SeqInfo seq = seq_info<true>(p, batch);
  Element* out = static_cast<Element*>(p.s_dmask) + static_cast<int64_t>(blockIdx.x) * cols;
  const Element zero = static_cast<Element>(0.f);
  if (row >= seq.seqlen_q) {
    for (int key = threadIdx.x; key < cols; key += kProbsThreads) out[key] = zero;
    return;
  }
  const Element* q = static_cast<const Element*>(p.q) +
                     seq.q_offset(p.q_batch_stride, p.q_row_stride) + head * p.q_head_stride +
                     static_cast<int64_t>(row) * p.q_row_stride;
  for (int c = threadIdx.x; c < p.head_dim; c += kProbsThreads) {
    s_q[c] = static_cast<float>(q[c]);
  }
  __syncthreads();
  const Element* k = static_cast<const Element*>(p.k) +
                     seq.k_offset(p.k_batch_stride, p.k_row_stride) + head_k * p.k_head_stride;
  const float lse = p.lse[seq.lse_row0(head, p.num_heads, p.seqlen_q, p.total_q) + row];
  const Mask mask = mask_of<true>(seq, p);
  const int key_begin = mask.key_begin(row), key_end = mask.key_end(row);
  const bool alibi = p.alibi_slopes != nullptr;
  const Alibi bias = alibi ? alibi_of(seq, p, head, kp.score.score_scale) : Alibi{0.f, 0, true};
  const PhiloxState st = philox_state_of(p);
  const uint64_t stream = dropout_stream(st.offset, batch, p.num_heads, head);
  for (int key = threadIdx.x; key < cols; key += kProbsThreads) {
    if (key >= seq.seqlen_k) {
      out[key] = zero;
      continue;
    }
    float prob = 0.f;
    if (key >= key_begin && key < key_end && lse != INFINITY) {
      const Element* k_row = k + static_cast<int64_t>(key) * p.k_row_stride;
      float s = 0.f;
      for (int c = 0; c < p.head_dim; ++c) s = fmaf(s_q[c], static_cast<float>(k_row[c]), s);
      // Score units (problem/score_mod.h): the logit is s * score_scale.
      if (p.softcap > 0.f) s = tanhf(s * kp.score.softcap_pre);
      s += bias.bias(row, key);
      prob = expf(s * kp.score.score_scale - lse);
    }
    const bool kept = dropout_keep(st.seed, stream, row, key, kp.dropout.keep_threshold);
    out[key] = static_cast<Element>(kept ? prob : -prob);
  }
}

template <typename Element>
Status launch_attn_probs(const FwdKernelParams& kp, cudaStream_t stream) {
  const FwdParams& p = kp.p;
  const int64_t blocks = static_cast<int64_t>(p.batch) * p.num_heads * probs_rounded(p.seqlen_q);
  return launch_tiles<attn_probs_kernel<Element>>(blocks, kProbsThreads, 0, stream, kp);
}

}  // namespace flashattn_cu::forward
