// The streamed dQ convert: the postprocess of the dQ accumulator, run under the main kernel's
// last wave instead of after it (the sm90 main kernel, sm90/bwd_kernel.h, with
// BwdKernelParams::dq_count set by bwd/pipeline.h).
//
// The main kernel's thread blocks add each step's dQ partial sums into the fp32 accumulator by a
// bulk reduction per block of kDqFragRows query rows; once a reduction has completed (its global
// writes done, bulk_wait_all) the issuing thread adds 1 to that block's counter with release
// semantics. Each CTA here owns one such block (batch, query head, m): it counts the key blocks
// whose walk visits the block (problem/mask.h query_blocks, the main kernel's own rule:
// sm90/bwd_common.h bwd_work), waits (acquire) until the counter reaches that number, and writes
// the block's rows of dq = softmax_scale * accumulator in the output dtype. A block no key block
// visits is written as zeros without reading the accumulator.
//
// Launched programmatically after the main kernel (bwd/pipeline.h), so its CTAs are scheduled
// only once every main CTA has executed launch_dependents, which the main kernel does after its
// own grid_dependency_wait: by then the preprocess (which zeroed the counters and the
// accumulator) has completed, and every main CTA is resident or done, so the waits here cannot
// hold up the CTAs they wait for. The grid's last CTA waits for the main kernel's completion
// before it exits, so that this grid (and what the stream runs after it: dK, dV included) never
// completes before the main kernel.
#pragma once

#include <cstdint>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/int_math.h"
#include "../common/numeric.h"
#include "../problem/mask.h"
#include "../problem/seqlen.h"
#include "../ptx/atomic.h"
#include "../ptx/sync.h"
#include "params.h"
#include "preprocess.h"

namespace flashattn_cu::backward {

// Query blocks of kDqFragRows rows over the call's largest entry: one CTA each, (batch, head, m)
// with m fastest.
inline int64_t dq_stream_blocks(const BwdParams& p) {
  return static_cast<int64_t>(p.batch) * p.num_heads * ceil_div(p.seqlen_q, kDqFragRows);
}

// kHeadDim: the accumulator's row (round_head_dim(head_dim)); kBlockN: the main kernel's key
// block; kSeqlens: sequence arrays (dynamic_seqlens).
template <typename Element, int kHeadDim, int kBlockN, bool kSeqlens>
__global__ void __launch_bounds__(kConvertThreads)
    bwd_dq_stream_kernel(const __grid_constant__ BwdKernelParams kp) {
  using Ops = ElementOps<Element>;
  constexpr int kRows = kDqFragRows;
  const BwdParams& p = kp.p;
  const int num_m = ceil_div(p.seqlen_q, kRows);
  const int m = static_cast<int>(blockIdx.x % num_m);
  const int64_t bh = blockIdx.x / num_m;
  const int head = static_cast<int>(bh % p.num_heads), batch = static_cast<int>(bh / p.num_heads);
  const SeqInfo seq = seq_info<kSeqlens>(p, batch);
  const int tid = threadIdx.x;
#ifdef FLASHATTN_CU_DQ_STREAM_STAMPS
  if (tid == 0 && blockIdx.x < kStampBlocks) g_dq_stream_stamps[3 * blockIdx.x] = ptx::global_timer();
#endif

  if (m * kRows < seq.seqlen_q) {
    // The key blocks whose walk visits query block m (each adds 1 once its dQ landed).
    const Mask mask = mask_of<true>(seq, p);
    const int entry_m = ceil_div(seq.seqlen_q, kRows);
    const int num_n = seq.seqlen_k > 0 ? ceil_div(seq.seqlen_k, kBlockN) : 0;
    int expected = 0;
    for (int n0 = 0; n0 < num_n; n0 += kConvertThreads) {
      const int n = n0 + tid;
      bool visits = false;
      if (n < num_n) {
        const int keys_valid = min(kBlockN, seq.seqlen_k - n * kBlockN);
        const QueryBlocks qb =
            mask.template query_blocks<kRows, kBlockN>(n * kBlockN, keys_valid, entry_m);
        visits = qb.begin <= m && m < qb.end;
      }
      expected += __syncthreads_count(visits);
    }
    const int64_t block_row = ws_row0<kSeqlens>(kp, seq, head) + static_cast<int64_t>(m) * kRows;
    if (expected > 0) {
      if (tid == 0) {
        const int* count = kp.dq_count + block_row / kRows;
        while (ptx::ld_acquire_gpu_s32(count) < expected) __nanosleep(256);
      }
      __syncthreads();  // the acquire (thread 0) before every thread's reads
    }
#ifdef FLASHATTN_CU_DQ_STREAM_STAMPS
    if (tid == 0 && blockIdx.x < kStampBlocks) {
      g_dq_stream_stamps[3 * blockIdx.x + 1] = ptx::global_timer();
    }
#endif
    // Each thread's chunks (8 columns of a row) of the block, all loads issued before any store.
    constexpr int kChunks = kHeadDim / 8;
    constexpr int kPerThread = kRows * kChunks / kConvertThreads;
    static_assert(kRows * kChunks % kConvertThreads == 0, "whole passes");
    const int chunks = p.head_dim / 8;  // of the output (head_dim <= kHeadDim)
    const float* src = kp.dq_accum + block_row * kHeadDim;
    Element* dst = static_cast<Element*>(p.dq) + seq.q_offset(p.dq_batch_stride, p.dq_row_stride) +
                   head * p.dq_head_stride;
    float4 v[kPerThread][2];
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int i = tid + j * kConvertThreads, r = i / kChunks, c = i % kChunks;
      v[j][0] = v[j][1] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (expected > 0 && m * kRows + r < seq.seqlen_q && c < chunks) {
        // At L2 (.cg): the accumulator was written by other SMs' reductions.
        const float* a = src + dq_frag_offset(r, c * 8, kHeadDim);
        v[j][0] = __ldcg(reinterpret_cast<const float4*>(a));
        v[j][1] = __ldcg(reinterpret_cast<const float4*>(a + 4));
      }
    }
    const float scale = p.softmax_scale;  // the main kernel accumulates dS K without it
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int i = tid + j * kConvertThreads, r = i / kChunks, c = i % kChunks;
      if (m * kRows + r < seq.seqlen_q && c < chunks) {
        uint4 out;
        out.x = Ops::pack(v[j][0].x * scale, v[j][0].y * scale);
        out.y = Ops::pack(v[j][0].z * scale, v[j][0].w * scale);
        out.z = Ops::pack(v[j][1].x * scale, v[j][1].y * scale);
        out.w = Ops::pack(v[j][1].z * scale, v[j][1].w * scale);
        *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(m * kRows + r) * p.dq_row_stride +
                                  c * 8) = out;
      }
    }
  }
#ifdef FLASHATTN_CU_DQ_STREAM_STAMPS
  __syncthreads();
  if (tid == 0 && blockIdx.x < kStampBlocks) {
    g_dq_stream_stamps[3 * blockIdx.x + 2] = ptx::global_timer();
  }
#endif
  // This grid completes only after the main kernel (header).
  if (blockIdx.x == gridDim.x - 1) ptx::grid_dependency_wait();
}

}  // namespace flashattn_cu::backward
