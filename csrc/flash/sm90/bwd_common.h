// Pieces shared by the two sm90a backward main kernels (bwd_kernel.h: register path, d <= 128;
// bwd_split_kernel.h: d = 256): the block's work, tile loads into sw128 shared memory, the dK/dV
// epilogue. A Traits type provides kHeadDim, kBlockM, kBlockN, kChunks, kNThreads, kQBytes and
// the shared-memory offsets kOffK, kOffV, kOffQ, kOffDO, kOffMax, kOffLog2Sum, kOffD (buffers of
// Q, dO, M, L, D: bwd_split_kernel.h's two, bwd_kernel.h's three) and kOffBar (the buffers'
// mbarriers, 8 bytes each).
#pragma once

#include <cstdint>

#include <cuda.h>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/bwd_math.h"
#include "../common/numeric.h"
#include "../problem/mask.h"
#include "../problem/scheduler.h"
#include "../problem/score_mod.h"
#include "../problem/seqlen.h"
#include "../ptx/atomic.h"
#include "../ptx/cp_async.h"
#include "../ptx/ldmatrix.h"
#include "../ptx/mbarrier.h"
#include "../ptx/sync.h"
#include "../ptx/tma.h"
#include "../ptx/wgmma.h"
#include "../bwd/params.h"

namespace flashattn_cu::sm90 {

using backward::BwdKernelParams;

// Copies a kRows x head_dim tile into a sw128 tile with cp.async; rows >= rows_valid and columns
// >= head_dim are zero-filled.
template <int kRows, int kChunks, int kThreads, typename Element>
__device__ __forceinline__ void load_tile_sw128(uint32_t smem, const Element* gmem,
                                                int64_t row_stride, int rows_valid, int head_dim,
                                                int tid) {
  static_assert((kRows * kChunks) % kThreads == 0, "whole passes");
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    const int r = idx / kChunks, c = idx % kChunks;
    const bool valid = r < rows_valid && c * 8 < head_dim;
    const Element* src = gmem + r * row_stride + c * 8;
    ptx::cp_async_16_zfill(smem + ptx::sw128_offset<kRows>(r, c), valid ? src : gmem, valid);
  }
}

// What one thread block does (its tile from problem/scheduler.h): kBlockN keys of
// (batch, head_k), query heads head_first .. + heads_per_split, query blocks [m_begin, m_end) of
// each; blocks outside [um_begin, um_end) need the mask (problem/mask.h).
// kDynamic: the mask may hold a window (problem/mask.h variant_dynamic); kSeqlens: sequence
// lengths from cu_seqlens / seqused_k (problem/seqlen.h; variant_seqlens).
template <bool kDynamic_, bool kSeqlens_>
struct BwdWork {
  static constexpr bool kDynamic = kDynamic_;
  static constexpr bool kSeqlens = kSeqlens_;
  int batch, head_k, hsplit, head_first;
  int n_start, keys_valid;
  int m_begin, m_end, um_begin, um_end;
  int total;  // steps: heads_per_split * (m_end - m_begin)
  // The entry's lengths (the variants with sequence arrays: block_mask reads them here instead
  // of loading the arrays again at each boundary step).
  int seqlen_q, seqlen_k;
};

// Whether the main kernels of head dim kHeadDim, variant kVariant walk a varlen call's compact
// key tiles (problem/scheduler.h: key_tile_of, where compact_key_tiles says so): the variants
// with sequence arrays where ptxas (sm_90a) shows the decoding costs no spills; not d = 256's
// softcap variant (0 -> 12 / 8 bytes, one local access in its step loop, paid by the padded
// softcap + window calls it serves too), which keeps the batch x ceil(max_seqlen_k) grid.
template <int kHeadDim, int kVariant>
__host__ __device__ constexpr bool bwd_compact_tiles() {
  return variant_seqlens(kVariant) && !(kHeadDim == 256 && kVariant == kSoftcapVariant);
}

template <int kBlockM, int kBlockN, int kVariant, bool kCompact,
          bool kDynamic = variant_dynamic(kVariant), bool kSeqlens = variant_seqlens(kVariant)>
__device__ __forceinline__ BwdWork<kDynamic, kSeqlens> bwd_work(const BwdKernelParams& kp) {
  const BwdParams& p = kp.p;
  BwdWork<kDynamic, kSeqlens> w;
  // kp.defer_n: a window's light trailing key blocks last, or every key block deferred (the
  // order longest first over all tiles of a causal call: run_bwd_with's causal_lpt).
  // A varlen call's tiles are the compact ones (problem/scheduler.h: key_tile_of), where this
  // instance takes them (bwd_compact_tiles).
  const KeyTile tile = key_tile_of<kSeqlens && kCompact>(
      p, kBlockN, kp.kv_splits, blockIdx.x, p.batch * p.num_heads_k * kp.kv_splits, kp.defer_n);
  const SeqInfo seq = seq_info<kSeqlens>(p, tile.batch);
  w.batch = tile.batch;
  w.hsplit = tile.split;
  w.head_k = tile.head_k;
  w.head_first = w.head_k * (p.num_heads / p.num_heads_k) + w.hsplit * kp.heads_per_split;
  w.seqlen_q = seq.seqlen_q;
  w.seqlen_k = seq.seqlen_k;
  w.n_start = tile.n_block * kBlockN;
  w.keys_valid = min(kBlockN, seq.seqlen_k - w.n_start);
  const int num_m = ceil_div(seq.seqlen_q, kBlockM);
  const QueryBlocks query_blocks =
      mask_of<kDynamic>(seq, p).template query_blocks<kBlockM, kBlockN>(w.n_start, w.keys_valid,
                                                                        num_m);
  // The static instance has no window: blocks run to num_m, unmasked up to the end.
  w.m_begin = query_blocks.begin;
  w.m_end = kDynamic ? query_blocks.end : num_m;
  w.um_begin = query_blocks.unmasked_begin;
  w.um_end = kDynamic ? query_blocks.unmasked_end : num_m;
  w.total = kp.heads_per_split * (w.m_end - w.m_begin);
  return w;
}

// The block's mask, built where it is applied: a Mask held across the main loop keeps its
// fields in registers (measured: one more spilled register in the d = 128 kernel); built at the
// point of use it reads them from the kernel parameters.
template <typename Work>
__device__ __forceinline__ Mask block_mask(const BwdParams& p, const Work& w) {
  if constexpr (Work::kSeqlens) {
    return mask_of<Work::kDynamic>(SeqInfo{w.batch, w.seqlen_q, w.seqlen_k, -1, -1}, p);
  } else {
    return mask_of<Work::kDynamic>(seq_info<false>(p, w.batch), p);
  }
}

// Issues the cp.async loads of K and V of the block over kThreads threads (no commit).
template <typename Traits, typename Element, int kThreads = Traits::kNThreads, typename Work>
__device__ __forceinline__ void load_kv(const BwdKernelParams& kp, const Work& w,
                                        uint32_t s_base, int tid) {
  const BwdParams& p = kp.p;
  const SeqInfo seq = seq_info<Work::kSeqlens>(p, w.batch);
  const Element* k = static_cast<const Element*>(p.k) +
                     seq.k_offset(p.k_batch_stride, p.k_row_stride) +
                     w.head_k * p.k_head_stride + w.n_start * p.k_row_stride;
  const Element* v = static_cast<const Element*>(p.v) +
                     seq.k_offset(p.v_batch_stride, p.v_row_stride) +
                     w.head_k * p.v_head_stride + w.n_start * p.v_row_stride;
  load_tile_sw128<Traits::kBlockN, Traits::kChunks, kThreads>(
      s_base + Traits::kOffK, k, p.k_row_stride, w.keys_valid, p.head_dim, tid);
  load_tile_sw128<Traits::kBlockN, Traits::kChunks, kThreads>(
      s_base + Traits::kOffV, v, p.v_row_stride, w.keys_valid, p.head_dim, tid);
}

// The dynamic shared memory rounded up to 1024 bytes (sw128 atoms; the Traits reserve the
// slack): its shared-window address in s_base, its generic pointer returned.
__device__ __forceinline__ char* align_smem_1024(char* smem_raw, uint32_t& s_base) {
  s_base = (ptx::smem_u32(smem_raw) + 1023u) & ~1023u;
  return smem_raw + (s_base - ptx::smem_u32(smem_raw));
}

// The streamed dQ convert's flag of this block's key tile (bwd/params.h key_done; none: a no-op),
// set by thread 0, the thread that issued the block's dQ bulk reductions and waited for their
// completion (bulk_wait_all): the proxy fence orders those async-proxy writes before the
// release store that publishes them. Every block sets it, also one that walks no step.
template <int kBlockN, typename Work>
__device__ __forceinline__ void key_tile_done(const BwdKernelParams& kp, const Work& w, int tid) {
  static_assert(kBlockN == backward::kDqStreamBlockN, "key_done counts blocks of this kernel");
  if (kp.key_done != nullptr && tid == 0) {
    const int n_block = w.n_start / kBlockN;
    ptx::fence_proxy_async_global();
    if (n_block < backward::key_done_blocks(kp.p.seqlen_k)) {
      ptx::st_release_gpu(kp.key_done + n_block +
                              backward::key_done_slice(w.batch, w.head_k, w.hsplit,
                                                       kp.p.num_heads_k, kp.kv_splits,
                                                       kp.p.seqlen_k),
                          1);
    }
  }
}

// Query head and query block of one step of the block's walk: query blocks m_begin .. m_end - 1
// of head_first, then of the next head, ...
struct BwdStep {
  int head, m;
};

template <typename Work>
__device__ __forceinline__ BwdStep next_step(const Work& w, BwdStep s) {
  if (++s.m == w.m_end) {
    s.m = w.m_begin;
    ++s.head;
  }
  return s;
}

// The main kernels' parameters (both load Q / dO by TMA: tma_query_block): the arch-neutral ones
// and the maps of q and dout (boxes of 64 columns x kBlockM rows; bwd_launch.h).
struct BwdTmaParams {
  CUtensorMap q_map;
  CUtensorMap do_map;
  backward::BwdKernelParams kp;
};

// The loads of (query head `head`, query block m): Q (TMA, the q map) into Q buffer q_stage
// completing q_bar, dO (TMA, the dout map) and its M / L / D rows (bulk copies) into buffer
// do_stage completing do_bar, after an arrival with the expected bytes on each (kOneBarrier:
// q_bar is do_bar, one arrival for all). With
// `after_preprocess` the rows are loaded only once the preprocess that writes them is done
// (bwd/pipeline.h's programmatic launch). Rows past a padded entry's end are zero (the maps end
// there); a varlen entry's last block reads the next entry's rows, which the mask's P = 0 drops
// and clear_query_tail zeroes (as the forward's V rows past an entry's keys).
template <typename Traits, bool kOneBarrier, typename Work>
__device__ __forceinline__ void tma_query_loads(const BwdKernelParams& kp, const Work& w,
                                                const void* q_map, const void* do_map,
                                                uint32_t s_base, int head, int m, int q_stage,
                                                uint32_t q_bar, int do_stage, uint32_t do_bar,
                                                bool after_preprocess) {
  constexpr int kBlockM = Traits::kBlockM;
  const SeqInfo seq = seq_info<Work::kSeqlens>(kp.p, w.batch);
  // Map coordinates: (row in the entry, batch) padded; (row in the packed rows, 0) varlen.
  const int map_row = (seq.start_q >= 0 ? seq.start_q : 0) + m * kBlockM;
  const int map_batch = seq.start_q >= 0 ? 0 : seq.batch;
  constexpr uint32_t kRowBytes = 3 * kBlockM * 4;
  if constexpr (kOneBarrier) {
    ptx::mbarrier_arrive_expect_tx(q_bar, 2 * Traits::kQBytes + kRowBytes);
  } else {
    ptx::mbarrier_arrive_expect_tx(q_bar, Traits::kQBytes);
    ptx::mbarrier_arrive_expect_tx(do_bar, Traits::kQBytes + kRowBytes);
  }
#pragma unroll
  for (int a = 0; a < Traits::kHeadDim / 64; ++a) {
    const int32_t c[4] = {a * 64, map_row, head, map_batch};
    ptx::tma_load<4>(s_base + Traits::kOffQ + q_stage * Traits::kQBytes + a * kBlockM * 128,
                     q_map, q_bar, c);
    ptx::tma_load<4>(s_base + Traits::kOffDO + do_stage * Traits::kQBytes + a * kBlockM * 128,
                     do_map, do_bar, c);
  }
  if (after_preprocess) ptx::grid_dependency_wait();
  const int64_t ws_row = backward::ws_row0<Work::kSeqlens>(kp, seq, head) + m * kBlockM;
  ptx::bulk_load(s_base + Traits::kOffMax + do_stage * kBlockM * 4, kp.row_max + ws_row,
                 kBlockM * 4, do_bar);
  ptx::bulk_load(s_base + Traits::kOffLog2Sum + do_stage * kBlockM * 4, kp.row_log2sum + ws_row,
                 kBlockM * 4, do_bar);
  ptx::bulk_load(s_base + Traits::kOffD + do_stage * kBlockM * 4, kp.dpsum + ws_row, kBlockM * 4,
                 do_bar);
}

// A varlen entry's last query block (rows_valid of its kBlockM rows are the entry's): the rows
// past them were loaded by TMA from the next entry's rows of q and dout, or the tensors' unused
// ones past the last entry (the maps end at total_q; the padded layout's end at seqlen_q and
// zero-fill). P and dS are 0 there (the preprocess's M = +inf, D = 0), but 0 times a NaN or an
// infinity is NaN in the tensor cores (dV += P^T dO, dK += dS^T Q, and dP^T = V dO^T feeds
// dS = P (dP - D)), so a key of this entry would get NaN gradients from data outside it. Every
// thread of the CTA zeroes a share of those rows of this step's Q and dO buffers and publishes
// them to the async proxy, then the CTA meets at a barrier, before the step's GEMMs read them.
// Call from every thread, after the buffer's mbarrier wait; a uniform no-op on other steps.
template <typename Traits, bool kSeqlens>
__device__ __forceinline__ void clear_query_tail(const BwdParams& p, int rows_valid,
                                                 uint32_t sQs, uint32_t sDOs, int tid) {
  if constexpr (kSeqlens) {
    constexpr int kRows = Traits::kBlockM, kChunks = Traits::kHeadDim / 8;
    if (rows_valid >= kRows || p.cu_seqlens_q == nullptr) return;
    ptx::zero_rows_sw128<kRows, kChunks>(sQs, rows_valid, tid, Traits::kNThreads);
    ptx::zero_rows_sw128<kRows, kChunks>(sDOs, rows_valid, tid, Traits::kNThreads);
    ptx::fence_proxy_async_shared();
    __syncthreads();
  }
}

// Thread 0: tma_query_loads with Q, dO and the rows all into buffer `stage`, completing that
// buffer's mbarrier.
template <typename Traits, typename Work>
__device__ __forceinline__ void tma_query_block(const BwdKernelParams& kp, const Work& w,
                                                const void* q_map, const void* do_map,
                                                uint32_t s_base, int head, int m, int stage,
                                                bool after_preprocess) {
  const uint32_t bar = s_base + Traits::kOffBar + 8 * stage;
  tma_query_loads<Traits, true>(kp, w, q_map, do_map, s_base, head, m, stage, bar, stage, bar,
                                after_preprocess);
}

// A main kernel's start (both sm90 kernels): the Traits::kStages buffers' mbarriers (at kOffBar),
// K / V of the block by cp.async (every thread; committed), the first step's Q / dO / rows by
// thread 0 into buffer 0; then every block waits for the preprocess (bwd/pipeline.h's
// programmatic launch), also one that walks no step, so that this grid never ends before it.
template <typename Traits, typename Element, typename Work>
__device__ __forceinline__ void begin_block(const BwdKernelParams& kp, const Work& w,
                                            const void* q_map, const void* do_map,
                                            uint32_t s_base, int tid) {
  if (tid == 0) {
#pragma unroll
    for (int b = 0; b < Traits::kStages; ++b) {
      ptx::mbarrier_init(s_base + Traits::kOffBar + 8 * b, 1);
    }
    ptx::fence_mbarrier_init();
  }
  if (w.total > 0) {
    load_kv<Traits, Element>(kp, w, s_base, tid);
    ptx::cp_async_commit();
    if (tid == 0) {
      tma_query_block<Traits>(kp, w, q_map, do_map, s_base, w.head_first, w.m_begin, 0, true);
    }
  }
  ptx::grid_dependency_wait();
}

// Start of step `it` (both sm90 kernels): K / V (cp.async, the first step only) landed and
// published to the async proxy; every warpgroup done with the last step, so that step `next`'s
// loads (thread 0) may take buffer `next_stage` (kIssueNext; without it the caller issues them
// later, as the split kernel's kBulkDq does). The caller then waits for its own buffer's
// mbarrier.
template <typename Traits, bool kIssueNext = true, typename Work>
__device__ __forceinline__ void begin_step(const BwdKernelParams& kp, const Work& w,
                                           const void* q_map, const void* do_map,
                                           uint32_t s_base, int it, BwdStep next, int next_stage,
                                           int tid) {
  if (it == 0) {
    ptx::cp_async_wait<0>();
    ptx::fence_proxy_async_shared();
  }
  __syncthreads();
  if (kIssueNext && tid == 0 && it + 1 < w.total) {
    tma_query_block<Traits>(kp, w, q_map, do_map, s_base, next.head, next.m, next_stage, false);
  }
}

// Query block m of query head `head` in the dQ accumulator (kBlockM rows of kHeadDim floats, one
// block of the fragment layouts), for the entry whose sequence info is `seq`.
template <int kBlockM, int kHeadDim, bool kSeqlens>
__device__ __forceinline__ float* dq_accum_block(const BwdKernelParams& kp, const SeqInfo& seq,
                                                 int head, int m) {
  const int64_t block_row = backward::ws_row0<kSeqlens>(kp, seq, head) + m * kBlockM;
  return kp.dq_accum + block_row * kHeadDim;
}

// Stores an A-fragment quadruple of a 16-row x 16-column slab of a [row][col] sw128 tile of
// kRows rows (16-bit pairs): a0 = (row g, cols 2t..), a1 = row g + 8, a2 = cols + 8, a3 = both.
// One stmatrix (ptx/ldmatrix.h): lane l addresses row l % 8 of matrix j = l / 8, i.e. row
// row0 + l % 8 + (j % 2) * 8, columns col0 + (j / 2) * 8 .. (col0 a multiple of 8). The same
// bytes land where the four 32-bit stores of each lane's own pairs put them (load_a_frag_sw128
// and the softcap's Sw128GradSlots read that image); which lane writes which pair changes, inside
// the warp's own 16 rows. kAfterLaneReads: the slab's bytes were read in this step by the lanes
// that owned them in that layout (the softcap's kept 1 - t^2, the dropout variant's undropped
// P^T under the split kernel's dS^T): a __syncwarp orders those reads before the other lanes'
// writes (stmatrix's .sync waits for the warp but is not documented to order its memory).
template <int kRows, bool kAfterLaneReads = false>
__device__ __forceinline__ void store_a_frag_sw128(char* tile, int row0, int col0,
                                                   const uint32_t (&a)[4], int lane) {
  if constexpr (kAfterLaneReads) __syncwarp();
  const int j = lane / 8;
  const int row = row0 + lane % 8 + (j % 2) * 8;
  const int col = col0 + (j / 2) * 8;
  ptx::stmatrix_x4(ptx::smem_u32(tile + ptx::sw128_offset<kRows>(row, col / 8)), a);
}

// The softcap's factor on dS (1 - t^2, t the capped score) kept, as the sm80 register path does
// (common/bwd_math.h StoredSoftcapGradT), in the lane's own dS^T slots of the sw128 [key][query]
// tile instead of recovered from P (problem/score_mod.h softcap_grad: a third MUFU a score, LG2,
// beside the TANH and the EX2). The kernels use the slots from the step's start, when the last
// step's readers of the tile have retired, until the lane (or, in the split kernel, the lane of
// the other warpgroup at the same fragment position) forms dS^T from them and stores it over
// them (store_a_frag_sw128's slots). 1 - t^2 in 16 bits (relative 2^-9 in bf16) errs less than
// t recovered from a 16-bit P.
template <int kRows>
struct Sw128GradSlots {
  char* tile;
  int row0;  // the warp's first key row (g and 8 hr added per element)
  int lane;

  __device__ __forceinline__ uint32_t* word(int nt, int hr) const {
    const int row = row0 + lane / 4 + 8 * hr;
    return reinterpret_cast<uint32_t*>(tile + ptx::sw128_offset<kRows>(row, nt) + (lane % 4) * 4);
  }
};
template <typename Element, int kRows>
using StoredSoftcapGradSw128 = StoredSoftcapGradT<Element, Sw128GradSlots<kRows>>;

// apply_score_mods_transposed's hook on the capped scores: the softcap variants keep 1 - t^2 in
// `stored`'s slots; the others (the dropout variant's run-time softcap included) keep nothing.
// `stored` is captured by value (a pointer and two ints): captured by reference, ptxas emitted
// 8-16 more instructions in every softcap variant (sm_90a).
template <int kVariant, typename Stored>
__device__ __forceinline__ auto capped_hook(const Stored& stored) {
  if constexpr (variant_softcap(kVariant)) {
    return [stored](const auto& capped) { stored.store(capped); };
  } else {
    return NoCappedHook{};
  }
}

// The dS factor of a step (common/bwd_math.h ds_from_probs's `grad`): the kept 1 - t^2 in the softcap
// variants, else problem/score_mod.h ds_grad_t (1, or t recovered from P in the dropout variant).
template <int kVariant, typename Stored>
__device__ __forceinline__ auto step_ds_grad(const Stored& stored, const BwdKernelParams& kp,
                                             int batch, int head, const char* s_max,
                                             const char* s_log2sum, int key_g, int query0, int t) {
  if constexpr (variant_softcap(kVariant)) {
    return stored;
  } else {
    return ds_grad_t<kVariant>(kp, batch, head, s_max, s_log2sum, key_g, query0, t);
  }
}

// Loads what store_a_frag_sw128 stored (same thread layout).
template <int kRows>
__device__ __forceinline__ void load_a_frag_sw128(const char* tile, int row0, int col0,
                                                  uint32_t (&a)[4], int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int row = row0 + g + (j % 2) * 8;
    const int col = col0 + (j / 2) * 8 + 2 * t;
    a[j] = *reinterpret_cast<const uint32_t*>(tile + ptx::sw128_offset<kRows>(row, col / 8) +
                                              (col % 8) * 2);
  }
}

// The walk's dK / dV accumulators once their last wgmma has retired: fenced for the reads that
// follow, and dV scaled by 1 / (1 - p) in the dropout variants (left out of dV's operand).
template <bool kDropout, int kColTiles>
__device__ __forceinline__ void finish_dkdv(const BwdKernelParams& kp,
                                            float (&acc_dk)[kColTiles][4],
                                            float (&acc_dv)[kColTiles][4]) {
  ptx::fence_operand(acc_dk);
  ptx::fence_operand(acc_dv);
  if constexpr (kDropout) {
#pragma unroll
    for (int i = 0; i < kColTiles; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dv[i][e] *= kp.dropout.rp;
  }
}

// dK = softmax_scale * (dS^T Q) and dV of the block, from accumulators laid out as wgmma C
// fragments: acc[i][hr * 2 + e] = key row0 + g + 8 hr, column col0 + 8 i + 2t + e. With one
// head split: staged in Element precision over sK / sV, then 16-byte row stores; otherwise fp32
// partial sums [split][batch][head_k][key][d] for the postprocess to add in order.
// kThreads threads (tid 0 .. kThreads - 1) take part, `sync` their barrier (the whole block's by
// default; sm90/bwd_ws_kernel.h: its consumer warpgroups').
struct SyncThreads {
  __device__ __forceinline__ void operator()() const { __syncthreads(); }
};
template <typename Element, typename Traits, int kColTiles, typename Work,
          int kThreads = Traits::kNThreads, typename Sync = SyncThreads>
__device__ __forceinline__ void store_dkdv(const BwdKernelParams& kp, const Work& w,
                                           char* smem, const float (&acc_dk)[kColTiles][4],
                                           const float (&acc_dv)[kColTiles][4], int row0,
                                           int col0, int tid, const Sync& sync = {}) {
  using Ops = ElementOps<Element>;
  constexpr int kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  const BwdParams& p = kp.p;
  const int g = (tid % 32) / 4, t = tid % 4;
  const float scale = p.softmax_scale;
  if (kp.kv_splits == 1) {
    sync();  // every warpgroup is done reading K and V
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = row0 + g + hr * 8;
#pragma unroll
      for (int i = 0; i < kColTiles; ++i) {
        const uint32_t off = ptx::sw128_offset<kBlockN>(row, col0 / 8 + i) + t * 4;
        *reinterpret_cast<uint32_t*>(smem + Traits::kOffK + off) =
            Ops::pack(acc_dk[i][hr * 2] * scale, acc_dk[i][hr * 2 + 1] * scale);
        *reinterpret_cast<uint32_t*>(smem + Traits::kOffV + off) =
            Ops::pack(acc_dv[i][hr * 2], acc_dv[i][hr * 2 + 1]);
      }
    }
    sync();
    const SeqInfo seq = seq_info<Work::kSeqlens>(p, w.batch);
    Element* dk = static_cast<Element*>(p.dk) + seq.k_offset(p.dk_batch_stride, p.dk_row_stride) +
                  w.head_k * p.dk_head_stride + w.n_start * p.dk_row_stride;
    Element* dv = static_cast<Element*>(p.dv) + seq.k_offset(p.dv_batch_stride, p.dv_row_stride) +
                  w.head_k * p.dv_head_stride + w.n_start * p.dv_row_stride;
    constexpr int kTotal = kBlockN * Traits::kChunks;
    static_assert(kTotal % kThreads == 0, "whole passes");
#pragma unroll
    for (int i = 0; i < kTotal / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      const int r = idx / Traits::kChunks, c = idx % Traits::kChunks;
      if (r < w.keys_valid && c * 8 < p.head_dim) {
        const uint32_t off = ptx::sw128_offset<kBlockN>(r, c);
        *reinterpret_cast<uint4*>(dk + r * p.dk_row_stride + c * 8) =
            *reinterpret_cast<const uint4*>(smem + Traits::kOffK + off);
        *reinterpret_cast<uint4*>(dv + r * p.dv_row_stride + c * 8) =
            *reinterpret_cast<const uint4*>(smem + Traits::kOffV + off);
      }
    }
  } else {
    const int64_t part_row0 =
        ((static_cast<int64_t>(w.hsplit) * p.batch + w.batch) * p.num_heads_k + w.head_k) *
            p.seqlen_k + w.n_start;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = row0 + g + hr * 8;
      if (row < w.keys_valid) {
        const int64_t off = (part_row0 + row) * kHeadDim + col0 + 2 * t;
#pragma unroll
        for (int i = 0; i < kColTiles; ++i) {
          *reinterpret_cast<float2*>(kp.dk_part + off + i * 8) =
              make_float2(acc_dk[i][hr * 2] * scale, acc_dk[i][hr * 2 + 1] * scale);
          *reinterpret_cast<float2*>(kp.dv_part + off + i * 8) =
              make_float2(acc_dv[i][hr * 2], acc_dv[i][hr * 2 + 1]);
        }
      }
    }
  }
}

}  // namespace flashattn_cu::sm90
