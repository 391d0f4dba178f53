// The small kernels around every backward main kernel (sm80/ and sm90/ alike):
//  * preprocess: D = rowsum(dO * O) in fp32 and the (M, L) of P = exp2((S - M) * scale_log2 - L)
//    into the padded workspace rows: the forward's RowStats when given (exact at any logit
//    magnitude), else (0, lse * log2(e)); padding rows get D = 0, (M, L) = (+inf, 0), so they
//    produce P = 0. Clears the fp32 dQ accumulator when dQ is accumulated with atomics;
//  * postprocess: sums fp32 partials (dQ accumulator, or the dK/dV head-split partials in split
//    order) times a scale into the output dtype; a streamed dQ job converts each block of rows as
//    soon as the main kernel's key tiles that add to it say they are done (bwd/pipeline.h).
#pragma once

#include <math.h>

#include <cstdint>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/numeric.h"
#include "../problem/scheduler.h"
#include "../problem/score_mod.h"
#include "../problem/seqlen.h"
#include "../ptx/atomic.h"
#include "../ptx/cp_async.h"
#include "../ptx/sync.h"
#include "params.h"

namespace flashattn_cu::backward {

constexpr int kPrepThreads = 256;
constexpr int kPrepRowThreads = 8;  // threads sharing one row (kPrepRowsPerBlock rows a block)
static_assert(kPrepThreads / kPrepRowThreads == kPrepRowsPerBlock, "bwd/params.h prep_block_at");

template <typename Element, int kHeadDim, bool kDynamic>
__global__ void __launch_bounds__(kPrepThreads)
    bwd_preprocess_kernel(const __grid_constant__ BwdKernelParams kp) {
  using Ops = ElementOps<Element>;
  const BwdParams& p = kp.p;
  // The sm90 main kernel, launched programmatically after this one (bwd/pipeline.h), may be
  // scheduled once every block here has started: it waits for this grid's end before it reads
  // what this kernel writes. (No effect on a main kernel launched whole, or before sm_90.)
  ptx::launch_dependents();
  // For every kernel of the pipeline, this one running first (problem/seqlen.h): the entries
  // against the bounds, and the dq / dk / dv rows outside every entry (the main kernels and the
  // postprocess write only the entries' rows).
  if constexpr (kDynamic) varlen_kernel_start(p);
  // The streamed dQ convert's flags (bwd/params.h key_done), cleared grid-stride: the main
  // kernel sets them only after its wait for this grid, the postprocess reads them only after
  // every main-kernel block has passed that wait (sm90/bwd_kernel.h's launch_dependents).
  if (kp.key_done != nullptr) {
    const int64_t count = key_done_slice(p.batch, 0, 0, p.num_heads_k, kp.kv_splits, p.seqlen_k);
    for (int64_t i = blockIdx.x * static_cast<int64_t>(kPrepThreads) + threadIdx.x; i < count;
         i += static_cast<int64_t>(gridDim.x) * kPrepThreads) {
      kp.key_done[i] = 0;
    }
  }
  const int sub = threadIdx.x % kPrepRowThreads;
  const PrepBlock blk = prep_block_at<kDynamic>(p, kp.rows, blockIdx.x);
  if (!blk.valid) return;  // the whole block: no slot of any entry
  const int batch = blk.batch, head = blk.head;
  const int row = blk.row0 + threadIdx.x / kPrepRowThreads;
  const SeqInfo seq = seq_info<kDynamic>(p, batch);

  float sum = 0.f;
  if (row < seq.seqlen_q) {
    const Element* o = static_cast<const Element*>(p.o) +
                       seq.q_offset(p.o_batch_stride, p.o_row_stride) + head * p.o_head_stride +
                       row * p.o_row_stride;
    const Element* dout = static_cast<const Element*>(p.dout) +
                          seq.q_offset(p.do_batch_stride, p.do_row_stride) +
                          head * p.do_head_stride + row * p.do_row_stride;
#pragma unroll
    for (int c = sub; c < kHeadDim / 8; c += kPrepRowThreads) {
      if (c * 8 < p.head_dim) {
        const uint4 ov = *reinterpret_cast<const uint4*>(o + c * 8);
        const uint4 dv = *reinterpret_cast<const uint4*>(dout + c * 8);
        const uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w}, dw[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 a = Ops::unpack(ow[i]), b = Ops::unpack(dw[i]);
          sum = fmaf(a.x, b.x, sum);
          sum = fmaf(a.y, b.y, sum);
        }
      }
    }
  }
  // The 8 threads of a row are 8 aligned lanes of one warp.
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  sum += __shfl_xor_sync(0xffffffffu, sum, 4);
  // Rows of this entry's slot: its rows, then padding up to whole kBwdRowPad blocks (what the
  // main kernels read). In the varlen layout the rows past that belong to the next entry.
  const bool in_slot = row < (seq.seqlen_q + kBwdRowPad - 1) / kBwdRowPad * kBwdRowPad;
  const int64_t ws_row = ws_row0<kDynamic>(kp, seq, head) + row;
  if (sub == 0 && in_slot) {
    const bool real = row < seq.seqlen_q;
    float row_max = INFINITY, row_log2sum = 0.f;
    if (real) {
      const int64_t lse_row = seq.lse_row0(head, p.num_heads, p.seqlen_q, p.total_q) + row;
      if (p.softmax_stats != nullptr) {
        const float2 st = reinterpret_cast<const float2*>(p.softmax_stats)[lse_row];
        row_max = st.x;
        row_log2sum = st.y;
      } else {
        row_max = 0.f;
        row_log2sum = p.lse[lse_row] * kLog2e;
      }
    }
    kp.dpsum[ws_row] = real ? sum : 0.f;
    kp.row_max[ws_row] = row_max;
    kp.row_log2sum[ws_row] = row_log2sum;
  }
  if (kp.dq_accum != nullptr && in_slot) {
    float4* dq = reinterpret_cast<float4*>(kp.dq_accum + ws_row * kHeadDim);
#pragma unroll
    for (int i = sub; i < kHeadDim / 4; i += kPrepRowThreads) dq[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// The consumer side of the rows written above in the sm80 main kernel (the sm90 ones load them by
// bulk copies: sm90/bwd_common.h tma_query_block): issues the cp.async copies of the M, L and D
// rows of one query block (kBlockM each; workspace rows are padded, so whole 16-byte chunks are
// always valid) into the three shared arrays of buffer `stage` at Traits::kOffMax / kOffLog2Sum /
// kOffD. Threads below 3 kBlockM / 4 take one chunk each; no commit.
template <typename Traits>
__device__ __forceinline__ void load_row_stats_async(const BwdKernelParams& kp, int64_t ws_row,
                                                     uint32_t s_base, int stage, int tid) {
  constexpr int kBlockM = Traits::kBlockM;
  static_assert(Traits::kNThreads >= 3 * kBlockM / 4, "M/L/D rows: one chunk per thread");
  if (tid < 3 * kBlockM / 4) {
    const int plane = tid / (kBlockM / 4), c = tid % (kBlockM / 4);
    const float* src = plane == 0 ? kp.row_max : plane == 1 ? kp.row_log2sum : kp.dpsum;
    const int off = plane == 0 ? Traits::kOffMax : plane == 1 ? Traits::kOffLog2Sum : Traits::kOffD;
    ptx::cp_async_16_zfill(s_base + off + (stage * kBlockM + c * 4) * 4, src + ws_row + c * 4,
                           true);
  }
}

// The float offset of (entry batch, head)'s slot in a job's src (start: the entry's first row,
// varlen; -1 padded), and of its output row `row` in dst (Element).
__device__ __forceinline__ int64_t convert_src_slot(const BwdConvertJob& job, int batch, int head,
                                                    int start) {
  return job.src_plane != 0 ? varlen_ws_row0(job.src_plane, batch, start, head) * job.row_stride
                            : (static_cast<int64_t>(batch) * job.heads + head) * job.bh_stride;
}
__device__ __forceinline__ int64_t convert_dst_row(const BwdConvertJob& job, int batch, int head,
                                                   int row, int start) {
  const int64_t row0 = start >= 0 ? static_cast<int64_t>(start) * job.dst_row_stride
                                  : batch * job.dst_batch_stride;
  return row0 + row * job.dst_row_stride + head * job.dst_head_stride;
}

// One 16-byte chunk (columns c * 8 ..) of output row `row` of (entry batch, head) of a job:
// the splits' fp32 sums times the scale, packed. start: the entry's first row (varlen; -1
// padded).
template <typename Element, bool kFragWs>
__device__ __forceinline__ void convert_chunk(const BwdConvertJob& job, int batch, int head,
                                              int row, int c, int start) {
  using Ops = ElementOps<Element>;
  // The row's slot, then the row in it (plain, or in the fragment layout's blocks).
  const int64_t slot = convert_src_slot(job, batch, head, start);
  const int64_t in_slot =
      job.frag_d > 0
          ? static_cast<int64_t>(row - row % kDqFragRows) * job.row_stride +
                (kFragWs ? dq_frag_ws_offset(row % kDqFragRows, c * 8, job.frag_d)
                         : dq_frag_offset(row % kDqFragRows, c * 8, job.frag_d))
          : row * job.row_stride + c * 8;
  const float* src = job.src + slot + in_slot;
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
  for (int s = 0; s < job.splits; ++s) {
    // L2 only (.cg): each float is read once, and a streamed dQ block is read while other blocks
    // of the accumulator still receive additions.
    const float4 lo = __ldcg(reinterpret_cast<const float4*>(src + s * job.split_stride));
    const float4 hi = __ldcg(reinterpret_cast<const float4*>(src + s * job.split_stride + 4));
    acc[0] += lo.x; acc[1] += lo.y; acc[2] += lo.z; acc[3] += lo.w;
    acc[4] += hi.x; acc[5] += hi.y; acc[6] += hi.z; acc[7] += hi.w;
  }
  uint4 out;
  out.x = Ops::pack(acc[0] * job.scale, acc[1] * job.scale);
  out.y = Ops::pack(acc[2] * job.scale, acc[3] * job.scale);
  out.z = Ops::pack(acc[4] * job.scale, acc[5] * job.scale);
  out.w = Ops::pack(acc[6] * job.scale, acc[7] * job.scale);
  Element* dst = static_cast<Element*>(job.dst) + convert_dst_row(job, batch, head, row, start) +
                 c * 8;
  *reinterpret_cast<uint4*>(dst) = out;
}

// A frag_blocks job (BwdConvertJob): grid-stride over its blocks of kDqFragRows rows of
// (entry, head), m fastest. A block's floats are read in memory order (a thread 8 contiguous
// floats a piece, one row's 8 columns: a warp reads 1 KB), scaled, packed and staged as Element
// rows in shared memory (16-byte chunk c of row r at chunk c ^ (r % 8): the 8 rows of a quarter
// warp's pieces land in 8 distinct bank groups, and a row's 8 consecutive chunks read back
// conflict-free), then stored row after row (a warp 512 contiguous bytes, two rows at d 128).
template <typename Element, bool kFragWs>
__device__ __forceinline__ void convert_frag_blocks(const BwdConvertParams& cp,
                                                    const BwdConvertJob& job) {
  using Ops = ElementOps<Element>;
  constexpr int kMaxPieces = kDqFragRows * kConvertFragMaxD / 8;
  constexpr int kPerRound = 2;  // pieces a thread loads at once (16 floats: 64 registers)
  constexpr int kRounds = kMaxPieces / (kPerRound * kConvertThreads);
  static_assert(kMaxPieces % (kPerRound * kConvertThreads) == 0, "whole rounds of pieces");
  __shared__ uint4 tile[kMaxPieces];
  const int d = job.frag_d;
  const int chunks = d / 8, out_chunks = cp.head_dim / 8;
  const int pieces = kDqFragRows * chunks;
  const int num_m = dq_block_num_m(job);
  const int64_t blocks = static_cast<int64_t>(cp.batch) * job.heads * num_m;
  for (int64_t index = blockIdx.x; index < blocks; index += gridDim.x) {
    const int m = static_cast<int>(index % num_m);
    const int64_t bh = index / num_m;
    const int head = static_cast<int>(bh % job.heads), batch = static_cast<int>(bh / job.heads);
    int start = -1, len = job.rows;
    if (job.cu_seqlens != nullptr) {  // varlen: this entry's rows only (as seq_info clamps)
      start = job.cu_seqlens[batch];
      const int n = job.cu_seqlens[batch + 1] - start;
      len = n <= 0 ? 0 : n < job.rows ? n : job.rows;
    }
    const int row0 = m * kDqFragRows;
    if (row0 >= len) continue;  // the whole block alike
    const float* src =
        job.src + convert_src_slot(job, batch, head, start) + row0 * job.row_stride;
    __syncthreads();  // the previous block's stores have read the tile
#pragma unroll 1
    for (int round = 0; round < kRounds; ++round) {
      const int first = static_cast<int>(threadIdx.x) + round * kPerRound * kConvertThreads;
      if (first >= pieces) break;  // (pieces is a multiple of kConvertThreads)
      float4 lo[kPerRound], hi[kPerRound];
#pragma unroll
      for (int i = 0; i < kPerRound; ++i) {
        const int piece = first + i * kConvertThreads;
        if (piece < pieces) {
          // L2 only (.cg), as convert_chunk: each float is read once.
          lo[i] = __ldcg(reinterpret_cast<const float4*>(src + piece * 8));
          hi[i] = __ldcg(reinterpret_cast<const float4*>(src + piece * 8 + 4));
        }
      }
#pragma unroll
      for (int i = 0; i < kPerRound; ++i) {
        const int piece = first + i * kConvertThreads;
        if (piece < pieces) {
          int r, col;
          dq_frag_piece<kFragWs>(piece, d, r, col);
          uint4 out;
          out.x = Ops::pack(lo[i].x * job.scale, lo[i].y * job.scale);
          out.y = Ops::pack(lo[i].z * job.scale, lo[i].w * job.scale);
          out.z = Ops::pack(hi[i].x * job.scale, hi[i].y * job.scale);
          out.w = Ops::pack(hi[i].z * job.scale, hi[i].w * job.scale);
          tile[r * chunks + ((col / 8) ^ (r % 8))] = out;
        }
      }
    }
    __syncthreads();
    Element* dst = static_cast<Element*>(job.dst);
    for (int e = threadIdx.x; e < kDqFragRows * out_chunks; e += kConvertThreads) {
      const int r = e / out_chunks, c = e % out_chunks;
      if (row0 + r < len) {
        *reinterpret_cast<uint4*>(dst + convert_dst_row(job, batch, head, row0 + r, start) +
                                  c * 8) = tile[r * chunks + (c ^ (r % 8))];
      }
    }
  }
}

// Grid-stride over the blocks: waits (warp 0, 32 flags a load, one cache line; relaxed loads
// with a growing sleep until all are set, then the acquire fence and the block's barrier) and
// converts the block's rows. One warp's line a poll keeps the waiting blocks' traffic off the
// L2 the main kernel's last tiles use (the first version, every thread polling its own flag with
// acquire loads, measured slower than converting after the main kernel: NOTES 12.73).
template <typename Element>
__device__ __forceinline__ void convert_streamed_dq(const BwdConvertParams& cp,
                                                    const BwdConvertJob& job) {
  const int chunks = cp.head_dim / 8;
  const int group = job.heads / job.heads_k;
  const int64_t blocks = static_cast<int64_t>(cp.batch) * job.heads * dq_block_num_m(job);
  for (int64_t index = blockIdx.x; index < blocks; index += gridDim.x) {
    const DqStreamBlock b = dq_stream_block(job, cp.batch, index);
    const KeyBlocks keys = dq_stream_key_tiles(job, b.batch, b.m);
    const int head_k = b.head / group, split = (b.head % group) / job.heads_per_split;
    const int* flags = job.key_done + key_done_slice(b.batch, head_k, split, job.heads_k,
                                                     job.key_splits, job.seqlen_k);
    if (threadIdx.x < 32) {
      for (int n0 = keys.begin; n0 < keys.end; n0 += 32) {
        const int n = n0 + static_cast<int>(threadIdx.x);
        unsigned ns = 256;
        while (!__all_sync(0xffffffffu, n >= keys.end || ptx::ld_relaxed_gpu(flags + n) != 0)) {
          ptx::nanosleep(ns);
          if (ns < 4096) ns *= 2;
        }
      }
      ptx::fence_acq_rel_gpu();
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kDqFragRows * chunks; e += kConvertThreads) {
      const int row = b.m * kDqFragRows + e / chunks;
      if (row < job.rows) convert_chunk<Element, false>(job, b.batch, b.head, row, e % chunks, -1);
    }
  }
}

// Grid (x, number of jobs): each thread converts 16-byte chunks of output, grid-stride, or a
// frag_blocks job's blocks go through shared memory a block at a time (convert_frag_blocks).
// kFragWs: a job with frag_d reads dq_frag_ws_offset's order (sm90/bwd_ws_kernel.h and the split
// kernel) instead of dq_frag_offset's. A job with `total` (a varlen dQ) walks the compact tiles
// of kBwdRowPad rows (problem/scheduler.h), a tile per block in turn, instead of every entry's
// max_seqlen rows.
template <typename Element, bool kFragWs = false>
__global__ void __launch_bounds__(kConvertThreads, kConvertBlocksPerSm)
    bwd_convert_kernel(const __grid_constant__ BwdConvertParams cp) {
  const BwdConvertJob& job = cp.jobs[blockIdx.y];
  if constexpr (!kFragWs) {
    // A streamed dQ job waits for the main kernel's flags instead of its end: this grid is
    // scheduled once every main-kernel block has passed its wait for the preprocess, whose
    // clearing of the flags is then visible (bwd/pipeline.h). Each block still waits for the
    // main kernel's end before it exits: the stream (or a captured graph's plain edge) orders
    // the work after this grid only after this grid's end, and that work may read dk / dv.
    if (job.key_done != nullptr) {
      convert_streamed_dq<Element>(cp, job);
      ptx::grid_dependency_wait();
      return;
    }
  }
  // Launched programmatically after the sm90 main kernel (bwd/pipeline.h): nothing is read before
  // it has completed. (Returns at once after a kernel launched whole, and is empty before sm_90.)
  ptx::grid_dependency_wait();
  if (job.frag_blocks) {
    convert_frag_blocks<Element, kFragWs>(cp, job);
    return;
  }
  const int chunks = cp.head_dim / 8;
  if (job.total > 0) {
    const int64_t tiles = job.heads * varlen_slot_count(job.total, cp.batch, kBwdRowPad);
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const VarlenTile v = varlen_tile_at(job.cu_seqlens, cp.batch, kBwdRowPad, job.heads, tile);
      if (!v.valid) continue;
      const int start = job.cu_seqlens[v.entry];
      const int n = job.cu_seqlens[v.entry + 1] - start;
      const int len = n <= 0 ? 0 : n < job.rows ? n : job.rows;  // as seq_info clamps
      const int row0 = v.slot * kBwdRowPad;
      for (int e = threadIdx.x; e < kBwdRowPad * chunks; e += kConvertThreads) {
        const int row = row0 + e / chunks;
        if (row < len) convert_chunk<Element, kFragWs>(job, v.entry, v.slice, row, e % chunks, start);
      }
    }
    return;
  }
  const int64_t total = static_cast<int64_t>(cp.batch) * job.heads * job.rows * chunks;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(kConvertThreads) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * kConvertThreads) {
    const int c = static_cast<int>(idx % chunks);
    int64_t rest = idx / chunks;
    const int row = static_cast<int>(rest % job.rows);
    rest /= job.rows;
    const int head = static_cast<int>(rest % job.heads);
    const int batch = static_cast<int>(rest / job.heads);
    int start = -1;
    if (job.cu_seqlens != nullptr) {  // varlen: this entry's rows only
      start = job.cu_seqlens[batch];
      const int len = job.cu_seqlens[batch + 1] - start;
      if (row >= len) continue;  // (len <= 0 included); rows >= job.rows never get here
    }
    convert_chunk<Element, kFragWs>(job, batch, head, row, c, start);
  }
}

}  // namespace flashattn_cu::backward
