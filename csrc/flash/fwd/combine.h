// Split-KV combine (FlashDecoding): merges the num_splits partial results of every row
// (problem/kv_cache.h, problem/params.h: KvcacheKernelFields) into o and lse, exactly as the
// online softmax would have over all the keys at once:
//   lse = m + ln(sum_s exp(lse_s - m)),  m = max_s lse_s,
//   o   = sum_s exp(lse_s - lse) * o_s,
// each o_s normalised over its own keys. A split that saw no key of the row has lse_s = -inf and
// weight exp(-inf) = 0 (its o_s is written as 0); a row whose every split is empty saw
// no key at all: o = 0, lse = +inf, never NaN. Arch-neutral: one thread per 4 columns of a row,
// the splits' LSEs read from L2 per thread (at most kMaxSplits of them; the partials of a decode
// call are a few hundred KB).
#pragma once

#include <math.h>

#include <cstdint>

#include "../common/numeric.h"
#include "../problem/kv_cache.h"  // the partials (merged_lse: the formula inlined below)
#include "../problem/params.h"
#include "../ptx/sync.h"

namespace flashattn_cu::forward {

constexpr int kCombineThreads = 128;

template <typename Element>
__global__ void __launch_bounds__(kCombineThreads)
    split_combine_kernel(const __grid_constant__ FwdKvcacheKernelParams kp) {
  using Ops = ElementOps<Element>;
  const FwdParams& p = kp.p;
  const KvcacheKernelFields& kv = kp.kv;
  const int quads = p.head_dim / 4;
  // Launched programmatically after the sm90 decode kernel (fwd/combine.cu): its partials are
  // complete and visible past this wait; launched whole it returns at once.
  ptx::grid_dependency_wait();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kCombineThreads + threadIdx.x;
  if (idx >= kv.partial_rows * quads) return;
  const int64_t row = idx / quads;
  const int col = static_cast<int>(idx % quads) * 4;

  // The first kFirst splits' LSEs and partials are loaded at once, before anything is computed
  // from them: one L2 round trip for the merged LSE and the weighted sum of a call of up to
  // kFirst splits (the one-wave rule gives 16 at batch 1 on 132 SMs; problem/kv_cache.h). Before,
  // the LSE loop (merged_lse), then the partials eight at a time: three or more round trips
  // after the decode grid's completion, which nothing overlaps (fwd/combine.cu: this kernel runs
  // last in the PDL chain). Same arithmetic in the same order as merged_lse and the loop below,
  // so the same bits. Splits past kFirst: eight at a time, as before.
  constexpr int kFirst = 16;
  const int splits = kv.num_splits;
  // Split s's LSE and this thread's four columns of its partial (-inf and 0 past the splits).
  auto load_split = [&](int s, float& lse_v, float4& part_v) {
    lse_v = -INFINITY;
    part_v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (s < splits) {
      const int64_t plane_row = static_cast<int64_t>(s) * kv.partial_rows + row;
      lse_v = kv.lse_partial[plane_row];
      part_v = *reinterpret_cast<const float4*>(kv.o_partial + plane_row * p.head_dim + col);
    }
  };
  float lse_s[kFirst];
  float4 part[kFirst];
#pragma unroll
  for (int j = 0; j < kFirst; ++j) load_split(j, lse_s[j], part[j]);
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kFirst; ++j) m = fmaxf(m, lse_s[j]);
  for (int s = kFirst; s < splits; ++s) m = fmaxf(m, kv.lse_partial[s * kv.partial_rows + row]);
  float lse = INFINITY;  // every split empty: the row saw no key (o = 0)
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (m != -INFINITY) {
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kFirst; ++j) {
      if (j < splits) sum += expf(lse_s[j] - m);
    }
    for (int s = kFirst; s < splits; ++s) sum += expf(kv.lse_partial[s * kv.partial_rows + row] - m);
    lse = m + logf(sum);
    // A split of weight 0 (empty, or too small to count) adds w * 0 = 0: every kernel writes an
    // empty split's partial as 0 (common/softmax.h finalize: inv_l 0), never NaN.
    auto weigh = [&](float lse_v, const float4& part_v) {
      const float w = expf(lse_v - lse);
      acc.x = fmaf(w, part_v.x, acc.x);
      acc.y = fmaf(w, part_v.y, acc.y);
      acc.z = fmaf(w, part_v.z, acc.z);
      acc.w = fmaf(w, part_v.w, acc.w);
    };
#pragma unroll
    for (int j = 0; j < kFirst; ++j) weigh(lse_s[j], part[j]);
    // Eight splits at a time: their LSEs and partials loaded first, all eight in flight at
    // once, then weighed (a load behind a test of the weight waits for the LSE load: with the
    // test, ptxas predicated the partials' loads on it, two L2 latencies per four splits).
    constexpr int kAhead = 8;
    for (int s0 = kFirst; s0 < splits; s0 += kAhead) {
      float lse_r[kAhead];
      float4 part_r[kAhead];
#pragma unroll
      for (int j = 0; j < kAhead; ++j) load_split(s0 + j, lse_r[j], part_r[j]);
#pragma unroll
      for (int j = 0; j < kAhead; ++j) weigh(lse_r[j], part_r[j]);
    }
  }
  // The plane row is lse's index: (entry, head, query) of the padded layout, (head, token) of
  // the varlen one (cu_seqlens_q; a token of no entry was not computed: its row is written from
  // partials nothing wrote, and cleared after this kernel: dispatch_kvcache.cu).
  Element* o;
  if (p.cu_seqlens_q != nullptr) {
    const int64_t token = row % p.total_q;
    const int64_t head = row / p.total_q;
    o = static_cast<Element*>(p.o) + head * p.o_head_stride + token * p.o_row_stride + col;
  } else {
    const int m = static_cast<int>(row % p.seqlen_q);
    const int64_t bh = row / p.seqlen_q;
    const int head = static_cast<int>(bh % p.num_heads);
    const int64_t batch = bh / p.num_heads;
    o = static_cast<Element*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride +
        m * p.o_row_stride + col;
  }
  *reinterpret_cast<uint2*>(o) = make_uint2(Ops::pack(acc.x, acc.y), Ops::pack(acc.z, acc.w));
  if (col == 0) p.lse[row] = lse;
}

// Key counts of a call with cache_leftpad or an append of seqlen_new rows (FwdParams::seqused_k
// of the kernels): min(cache_seqlens[b] + seqlen_new, capacity) - leftpad[b], at least 0, with a
// negative or absent (null) leftpad read as 0.
__global__ void kvcache_key_counts_kernel(const int* cache_seqlens, const int* leftpad,
                                          int seqlen_new, int capacity, int batch, int* counts) {
  // Launched programmatically before the sm90 decode path's append (fwd/combine.cu): waits for
  // the caller's previous kernel, and lets the next one be scheduled at once (it waits for this
  // grid's completion in turn).
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  const int64_t keys = static_cast<int64_t>(cache_seqlens[b]) + seqlen_new;
  const int len = keys < capacity ? static_cast<int>(keys) : capacity;
  const int pad = leftpad != nullptr && leftpad[b] > 0 ? leftpad[b] : 0;
  counts[b] = len > pad ? len - pad : 0;
}

}  // namespace flashattn_cu::forward
