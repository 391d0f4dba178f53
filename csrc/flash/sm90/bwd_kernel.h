// FlashAttention backward on Hopper warpgroup MMA (wgmma, sm_90a): the main kernel.
//
// Same work split and semantics as the sm80 main kernel (sm80/bwd_kernel.h): one thread block owns
// kBlockN keys of one (batch, kv head), keeps K and V in shared memory and dK, dV in fp32
// registers, and walks every (query head of its group share, query block of kBlockM rows) that
// sees those keys. The workspace, the preprocess (D, row max / log2 sum), the deterministic dQ
// kernel and the postprocess are the sm80 ones.
//
// Two consumer warpgroups, each owning 64 of the 128 keys; per query block each computes
//   S^T  = K Q^T            wgmma SS, m64 (keys) x n kBlockM (queries) x k d
//   dP^T = V dO^T           wgmma SS, issued right behind S^T, overlapping the exponentials
//   (d 64: both RS, K and V held as A fragments from the first step on: Traits::kKvRegs)
//   P^T  = exp2((S^T - M) scale_log2 - L)       (registers; the accumulator layout of S^T is the
//   dS^T = P^T (dP^T - D)                         A-operand layout, so P^T never leaves them)
//   dV  += P^T dO,  dK += dS^T Q                  wgmma RS; dS^T also to shared memory
//   (dS^T is formed from the 16-bit P^T, as on sm80, so fp32 P^T and dP^T are never both live)
//   dQ   = dS K  (both warpgroups, half of d each)  wgmma SS, MN-major A and B; staged in shared
//        memory and added into the fp32 accumulator by one bulk reduction (cp.reduce.async.bulk)
// Shared tiles are sw128 (ptx/wgmma.h): K, V [key][d], Q, dO [query][d] (three buffers), dS^T
// [key][query]. The same tile serves K-major reads (S^T: K, Q) and MN-major ones (dV/dK: dO, Q;
// dQ: dS^T, K), so nothing is stored twice.
//
// One step (query block):
//   __syncthreads; thread 0: issue the next step's loads (TMA / bulk copies, mbarrier), add the
//   last step's staged dQ (one bulk reduction) | wait for this step's buffer (mbarrier)
//   | S^T, dP^T (2 groups) | wait S^T (and the last step's dK): mask, exp2, pack P^T | wait dP^T:
//   dS^T from the packed P^T, store dS^T | dV (1 group) | fence.proxy.async; __syncthreads
//   | dQ (1 group), dK (1 group) | wait dQ: stage dQ in shared memory, fence.proxy.async
//   (dK runs on into the next step)
// Three Q / dO / row buffers: the next step's loads take the buffer of the step before this one,
// whose last reader (its dK) every warpgroup retired before this step's dS^T barrier.
// The registers of P^T and dS^T are the A operands of dV and dK, so nothing reads or writes them
// while those wgmmas are in flight (the PTX ISA leaves that undefined): dS^T is formed before dV
// is issued, and the next write to either comes after the next step's wait for S^T.
// Padding rows (>= seqlen_q) have (M, L) = (+inf, 0), D = 0 and zero Q/dO: P = 0, dS = 0 without
// a test.
#pragma once

#include <cstdint>
#include <type_traits>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/bwd_math.h"
#include "../common/numeric.h"
#include "../problem/dropout.h"
#include "../problem/mask.h"
#include "../problem/score_mod.h"
#include "../ptx/math.h"
#include "../ptx/sync.h"
#include "../ptx/wgmma.h"
#include "bwd_common.h"

namespace flashattn_cu::sm90 {

// The block shape bwd_kernel.h and bwd_ws_kernel.h share: kBlockN keys of one kv head, two
// warpgroups of 64 keys each, kBlockM queries a step; K, V, then the Q buffers in shared memory
// (each kernel's own layout from kOffQ on).
template <int kHeadDim_, int kBlockM_>
struct BwdBlockShape {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = 128;
  static constexpr int kWarpGroups = 2;  // each owns 64 keys
  static constexpr int kChunks = kHeadDim / 8;   // 16-byte chunks per row of K, V, Q, dO
  static constexpr int kQTiles = kBlockM / 8;    // 8-query tiles of S^T per warp
  static constexpr int kColTiles = kHeadDim / 8; // 8-column tiles of dK, dV per warp
  static constexpr int kDqCols = kHeadDim / kWarpGroups;  // dQ columns per warpgroup
  static constexpr int kDqMTiles = kBlockM / 64;           // m64 slabs of dQ
  static constexpr int kDqBytes = kBlockM * kHeadDim * 4;  // the staged dQ block (fp32)
  // Shared memory (bytes, every tile 1024-byte aligned).
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKVBytes;
  static constexpr int kOffQ = kOffV + kKVBytes;
  using Params = BwdTmaParams;  // bwd_common.h: the kernel parameters and the q / dout maps
  // Timing probes (benchmarks/tune/tune_bwd90.cu mode `dqprobe`, a derived traits type hides
  // this): 1 leaves out dQ's bulk reductions, 2 dQ altogether (dq then wrong); 0 in the library.
  static constexpr int kProbeDq = 0;

  static_assert(kHeadDim % 64 == 0, "d is whole 64-column atoms");
  static_assert(kBlockM % 64 == 0, "dQ is whole m64 slabs");
  static_assert(backward::kBwdRowPad % kBlockM == 0, "workspace rows are whole query blocks");
  static_assert(kKVBytes % 1024 == 0 && kQBytes % 1024 == 0, "sw128 tiles 1024-byte aligned");
};

template <int kHeadDim_, int kBlockM_, bool kDkNext_ = (kBlockM_ == 64),
          bool kKvRegs_ = (kHeadDim_ == 64 && kBlockM_ == 64), bool kDqOneWg_ = false,
          bool kEarlyDv_ = false>
struct BwdTraits : BwdBlockShape<kHeadDim_, kBlockM_> {
  using Shape = BwdBlockShape<kHeadDim_, kBlockM_>;
  using Shape::kBlockM, Shape::kBlockN, Shape::kDqBytes, Shape::kHeadDim, Shape::kOffQ,
      Shape::kQBytes, Shape::kWarpGroups;
  // dK's wgmma runs on into the next step (its A operand, dS^T, live through the next S^T /
  // dP^T) or retires within its own (128-row steps: S^T and dP^T alone take 128 registers).
  static constexpr bool kDkNext = kDkNext_;
  // S^T and dP^T as register-A wgmmas: each warp's 16 rows of K and V loaded into A fragments
  // once a block (d / 4 registers each), so that the steps read only Q / dO from shared memory
  // for them (shared memory is the backward's busiest unit, NOTES 12.25 item 3). d 64: 223
  // registers (193 without), backward 1.5-4% faster on the H200 (NOTES 12.39); d 128 has no
  // room for the 64 registers (244 without).
  static constexpr bool kKvRegs = kKvRegs_;
  // dQ by one warpgroup a step (warpgroup it % 2, all d columns) instead of half the columns by
  // each: the dQ GEMM reads dS^T once instead of twice (at d 64 with kKvRegs, 32 KB of ~112 KB
  // of a step's operand reads instead of 48), for 8 d / 64 more registers. A tuning knob
  // (benchmarks/tune/tune_bwd90.cu mode `dqone`).
  static constexpr bool kDqOneWg = kDqOneWg_;
  // dV += P^T dO issued as soon as P^T is packed, before the wait for dP^T, so that it runs on
  // the tensor cores while dS^T is formed (and stored), instead of after dS^T's store (the
  // variants without dropout: dropout's dV operand, P^T o M, comes after dS^T). A tuning knob
  // (benchmarks/tune/tune_bwd90.cu mode `earlydv`); since dS^T is formed from the fp32 P^T
  // (probs_and_grads), it keeps the 16-bit P^T beside it through the wait: 16 more registers.
  static constexpr bool kEarlyDv = kEarlyDv_;
  // Q / dO / M / L / D buffers, each loaded by one thread (TMA for Q / dO, bulk copies for the
  // rows) completing its mbarrier; three, as dK runs on into the next step (header).
  static constexpr int kStages = 3;
  static constexpr int kNThreads = kWarpGroups * 128;
  static constexpr int kOffDO = kOffQ + kStages * kQBytes;
  static constexpr int kOffDS = kOffDO + kStages * kQBytes;
  static constexpr int kOffMax = kOffDS + kBlockN * kBlockM * 2;
  static constexpr int kOffLog2Sum = kOffMax + kStages * kBlockM * 4;
  static constexpr int kOffD = kOffLog2Sum + kStages * kBlockM * 4;
  // dQ staging: the block's kBlockM x kHeadDim fp32 in fragment order (each warp's 8-byte pairs
  // of one (m slab, row half, column tile) 256 contiguous bytes: conflict-free).
  static constexpr int kOffDQ = kOffD + kStages * kBlockM * 4;
  // The buffers' mbarriers.
  static constexpr int kOffBar = kOffDQ + kDqBytes;
  static constexpr int kSmemBytes = kOffBar + 8 * kStages + 1024;  // + alignment slack

  static_assert(kOffDQ % 16 == 0, "the bulk source 16-byte aligned");
  // Each m64 slab of dQ is one block of bwd/params.h dq_frag_offset's layout; a block of kBlockM
  // rows is kDqMTiles such blocks, contiguous in the accumulator.
  static_assert(kBlockM % backward::kDqFragRows == 0 && kWarpGroups == 2 && kNThreads == 256,
                "bwd/params.h dq_frag_offset's layout");
  static_assert(!kDqOneWg || (kBlockM == 64 && kHeadDim <= 64), "one m64 slab, one atom of d");
};

// S^T = K Q^T and dP^T = V dO^T of warpgroup wg's 64 keys (A: its rows of K / V; B: Q / dO,
// both K-major, k = d), issued as two groups.
template <bool kBf16, typename Traits>
__device__ __forceinline__ void issue_s_dp(float (&acc_s)[Traits::kQTiles][4],
                                           float (&acc_dp)[Traits::kQTiles][4], uint32_t sK,
                                           uint32_t sV, uint32_t sQs, uint32_t sDOs, int wg) {
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  sK = ptx::pin_smem_addr(sK);
  sV = ptx::pin_smem_addr(sV);
  sQs = ptx::pin_smem_addr(sQs);
  sDOs = ptx::pin_smem_addr(sDOs);
  ptx::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < Traits::kHeadDim / 16; ++ks) {
    ptx::wgmma_ss<kBlockM, kBf16, 0, 0>(acc_s, ptx::sw128_desc_k_major<kBlockN>(sK, wg * 64, ks),
                                        ptx::sw128_desc_k_major<kBlockM>(sQs, 0, ks), ks > 0);
  }
  ptx::wgmma_commit();
#pragma unroll
  for (int ks = 0; ks < Traits::kHeadDim / 16; ++ks) {
    ptx::wgmma_ss<kBlockM, kBf16, 0, 0>(acc_dp, ptx::sw128_desc_k_major<kBlockN>(sV, wg * 64, ks),
                                        ptx::sw128_desc_k_major<kBlockM>(sDOs, 0, ks), ks > 0);
  }
  ptx::wgmma_commit();
}

// S^T and dP^T as issue_s_dp, with K and V from this warp's A fragments (load_a_frags_sw128).
template <bool kBf16, typename Traits>
__device__ __forceinline__ void issue_s_dp_rs(float (&acc_s)[Traits::kQTiles][4],
                                              float (&acc_dp)[Traits::kQTiles][4],
                                              const uint32_t (&k_frag)[Traits::kHeadDim / 16][4],
                                              const uint32_t (&v_frag)[Traits::kHeadDim / 16][4],
                                              uint32_t sQs, uint32_t sDOs) {
  constexpr int kBlockM = Traits::kBlockM;
  ptx::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < Traits::kHeadDim / 16; ++ks) {
    ptx::wgmma_rs<kBlockM, kBf16, 0>(acc_s, k_frag[ks],
                                     ptx::sw128_desc_k_major<kBlockM>(sQs, 0, ks), ks > 0);
  }
  ptx::wgmma_commit();
#pragma unroll
  for (int ks = 0; ks < Traits::kHeadDim / 16; ++ks) {
    ptx::wgmma_rs<kBlockM, kBf16, 0>(acc_dp, v_frag[ks],
                                     ptx::sw128_desc_k_major<kBlockM>(sDOs, 0, ks), ks > 0);
  }
  ptx::wgmma_commit();
}

// This warp's 16 rows (from row0) of a [row][d] sw128 tile of kRows rows as A fragments, one
// quadruple per 16 columns (store_a_frag_sw128's slots).
template <int kRows, int kCols>
__device__ __forceinline__ void load_a_frags_sw128(const char* tile, int row0,
                                                   uint32_t (&a)[kCols / 16][4], int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int ks = 0; ks < kCols / 16; ++ks)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int row = row0 + g + (j % 2) * 8;
      const int col = ks * 16 + (j / 2) * 8 + 2 * t;
      a[ks][j] = *reinterpret_cast<const uint32_t*>(
          tile + ptx::sw128_offset<kRows>(row, col / 8) + (col % 8) * 2);
    }
}

// acc += A B over the step's kBlockM queries: dV += P^T dO (a16 = P^T, sB = dO) or dK += dS^T Q
// (a16 = dS^T, sB = Q); A from registers, B the [query][d] tile MN-major (n = d). No commit.
template <bool kBf16, typename Traits>
__device__ __forceinline__ void issue_rs_gemm(float (&acc)[Traits::kColTiles][4],
                                              const uint32_t (&a16)[Traits::kBlockM / 16][4],
                                              uint32_t sB) {
  sB = ptx::pin_smem_addr(sB);
#pragma unroll
  for (int kk = 0; kk < Traits::kBlockM / 16; ++kk) {
    ptx::wgmma_rs<Traits::kHeadDim, kBf16, 1>(
        acc, a16[kk], ptx::sw128_desc_mn_major<Traits::kBlockM>(sB, kk, 0), 1);
  }
}

// dQ (kBlockM x d) = dS K over kCols columns from col0 (warpgroup wg's kDqCols: col0 =
// wg * kDqCols). A = dS from dS^T [key][query] (MN-major, m = query), B = K [key][d] (MN-major,
// n = d). No commit.
template <bool kBf16, typename Traits, int kCols = Traits::kDqCols>
__device__ __forceinline__ void issue_dq(float (&acc_dq)[Traits::kDqMTiles][kCols / 8][4],
                                         uint32_t sDS, uint32_t sK, int col0) {
  constexpr int kBlockN = Traits::kBlockN;
  sDS = ptx::pin_smem_addr(sDS);
  const uint32_t sKc = ptx::pin_smem_addr(sK + ptx::sw128_mn_col_offset<kBlockN>(col0));
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
    for (int mt = 0; mt < Traits::kDqMTiles; ++mt) {
      ptx::wgmma_ss<kCols, kBf16, 1, 1>(
          acc_dq[mt], ptx::sw128_desc_mn_major<kBlockN>(sDS, kk, mt * 64),
          ptx::sw128_desc_mn_major<kBlockN>(sKc, kk, 0), kk > 0);
    }
  }
}

// One step's pointwise part, S^T retired and dP^T the one group in flight: P^T from S^T (score
// modifiers, mask, exponentials) and dS^T = P^T (dP^T - D), both packed as 16-bit A operands
// (p16: dV's, with dropout P^T o M; ds16: dK's and, stored, dQ's). Retires dP^T. s_ds: the dS^T
// tile, where the softcap variants keep 1 - t^2 in the lane's own slots until dS^T is formed
// (bwd_common.h StoredSoftcapGradSw128; the dropout variant, softcap decided at run time,
// recovers t from P instead).
// `early` (if not NoEarlyGemm): issues and commits one more wgmma group once P^T is packed
// (BwdTraits kEarlyDv: dV's), before the wait for dP^T, which then leaves that group in flight.
struct NoEarlyGemm {};
template <typename Element, typename Traits, int kVariant, typename Work,
          typename Early = NoEarlyGemm>
__device__ __forceinline__ void probs_and_grads(
    const BwdKernelParams& kp, const Work& w, int head, int m,
    float (&acc_s)[Traits::kQTiles][4], float (&acc_dp)[Traits::kQTiles][4], const char* s_max,
    const char* s_log2sum, const char* s_d, char* s_ds, uint32_t (&p16)[Traits::kBlockM / 16][4],
    uint32_t (&ds16)[Traits::kBlockM / 16][4], int warp_key0, int lane,
    const Early& early = Early{}) {
  constexpr bool kEarly = !std::is_same_v<Early, NoEarlyGemm>;
  static_assert(!kEarly || !variant_dropout(kVariant), "dropout's dV operand follows dS^T");
  constexpr bool kDynamic = variant_dynamic(kVariant);
  constexpr int kBlockM = Traits::kBlockM, kQTiles = Traits::kQTiles;
  const BwdParams& p = kp.p;
  const int t = lane % 4;
  [[maybe_unused]] const StoredSoftcapGradSw128<Element, Traits::kBlockN> stored_grad{
      {s_ds, warp_key0, lane}};
  apply_score_mods_transposed<kVariant>(acc_s, kp, w.batch, head, w.n_start + warp_key0,
                                        m * kBlockM, lane, capped_hook<kVariant>(stored_grad));
  if (m < w.um_begin || (kDynamic && m >= w.um_end)) {
    block_mask(p, w).apply_transposed(acc_s, w.n_start + warp_key0, m * kBlockM, lane);
  }
  probs_from_scores(acc_s, s_max, s_log2sum, 0, kp.score.scale_log2, t);  // P^T, in place
  // Dropout (problem/dropout.h): the keep bits of this warp's elements, for the gradient
  // reaching P^T (M o dP^T / (1 - p)) and dV's operand (P^T o M). Drawn here, behind the
  // exponentials (while dP^T runs); drawn while both GEMMs are in flight they spill 208 bytes
  // instead of 56 (their accumulators are then both allocated).
  [[maybe_unused]] uint32_t keep[keep_words(kQTiles * 4)];
  if constexpr (variant_dropout(kVariant)) {
    dropout_of(kp, w.batch, head)
        .template keep_bits_transposed<kQTiles>(keep, w.n_start + warp_key0, m * kBlockM, lane);
  }
  if constexpr (kEarly) {
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) pack_a_frag<Element>(acc_s, kk, p16[kk]);
    early();
    ptx::wgmma_wait<1>();  // dP^T done, the early group in flight
  } else {
    ptx::wgmma_wait<0>();  // dP^T done
  }
  ptx::fence_operand(acc_dp);
  if constexpr (variant_dropout(kVariant)) apply_keep_bits(acc_dp, keep, kp.dropout.rp);

  // dS^T = P^T (dP^T - D), in place in acc_dp, from the fp32 P^T (common/bwd_math.h
  // ds_from_probs: one rounding of dS^T, as FlashAttention-2's). The fp32 P^T and dP^T are
  // live together here as they already were while the exponentials ran under dP^T's wgmma, so
  // the peak is unchanged; P^T is packed for dV after this (with kEarly, before the wait and
  // kept besides: 16 more registers, the knob's cost).
  const auto grad = step_ds_grad<kVariant>(stored_grad, kp, w.batch, head, s_max, s_log2sum,
                                            w.n_start + warp_key0 + lane / 4, m * kBlockM, t);
#pragma unroll
  for (int kk = 0; kk < kBlockM / 16; ++kk) ds_from_probs(acc_dp, kk, acc_s, 0, s_d, t, grad);
  if constexpr (!kEarly) {
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) pack_a_frag<Element>(acc_s, kk, p16[kk]);
  }
#pragma unroll
  for (int kk = 0; kk < kBlockM / 16; ++kk) pack_a_frag<Element>(acc_dp, kk, ds16[kk]);
  if constexpr (variant_dropout(kVariant)) {
    // dS^T used the undropped P^T; dV's operand is P^T o M (before the wgmma reads it).
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) drop_a_frag(p16[kk], keep, kk);
  }
}

template <typename Element, typename Traits, int kVariant>
__device__ __forceinline__ void bwd_block(const BwdKernelParams& kp, const void* q_map,
                                          const void* do_map, char* smem_raw) {
  constexpr bool kSeqlens = variant_seqlens(kVariant);  // problem/mask.h: sequence arrays
  constexpr bool kBf16 = std::is_same_v<Element, __nv_bfloat16>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kQTiles = Traits::kQTiles, kColTiles = Traits::kColTiles;
  const BwdParams& p = kp.p;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);  // warpgroup: keys wg * 64 .. (uniform)
  const int warp_key0 = warp * 16;  // this warp's 16 keys (rows of S^T, dK, dV)
  const auto w =
      bwd_work<kBlockM, kBlockN, kVariant, bwd_compact_tiles<Traits::kHeadDim, kVariant>()>(kp);
  // Launched programmatically after the preprocess (bwd/pipeline.h). Every block waits for the
  // preprocess before it exits (below), so that this grid never ends before it; the postprocess,
  // launched so after this kernel, may be scheduled once every block here has passed that wait
  // (launch_dependents after it): a streamed dQ convert then reads the key_done flags the
  // preprocess cleared (otherwise it waits for this grid's end).
  if (w.keys_valid <= 0) {  // varlen: a key block past this entry's length
    ptx::grid_dependency_wait();
    key_tile_done<kBlockN>(kp, w, tid);
    return;
  }

  uint32_t s_base;
  char* smem = align_smem_1024(smem_raw, s_base);
  const uint32_t sK = s_base + Traits::kOffK, sV = s_base + Traits::kOffV;
  const uint32_t sQ = s_base + Traits::kOffQ, sDO = s_base + Traits::kOffDO;
  const uint32_t sDS = s_base + Traits::kOffDS;
  // K / V by cp.async, the first step's Q / dO / rows into buffer 0; the preprocess waited for.
  begin_block<Traits, Element>(kp, w, q_map, do_map, s_base, tid);
  ptx::launch_dependents();

  float acc_dk[kColTiles][4], acc_dv[kColTiles][4];
#pragma unroll
  for (int i = 0; i < kColTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[i][e] = acc_dv[i][e] = 0.f;

  const bool compute_dq = !p.deterministic && Traits::kProbeDq != 2;
  BwdStep step{w.head_first, w.m_begin};
  // The block the staged dQ goes to (the last step's), the thread that issues it, and the issue
  // (every thread has stored and fenced the block, and passed a barrier since).
  float* dq_block = nullptr;
  const auto dq_block_of = [&](int head, int m) {  // query block m's rows of the accumulator
    return dq_accum_block<kBlockM, kHeadDim, kSeqlens>(kp, seq_info<kSeqlens>(p, w.batch), head,
                                                       m);
  };
  const bool dq_issuer = compute_dq && Traits::kProbeDq == 0 && tid == 0;
  const auto reduce_staged_dq = [&] {
    if (dq_issuer) {
      ptx::bulk_reduce_add_f32(dq_block, s_base + Traits::kOffDQ, Traits::kDqBytes);
      ptx::tma_store_commit();
    }
  };

  int stage = 0, phase = 0;  // this step's buffer and its use number's parity
  // Traits::kKvRegs: this warp's rows of K and V as A fragments (loaded on the first step); not
  // in the dropout variant, whose keep bits take those registers (ptxas: 12 bytes of spills).
  constexpr bool kKvRegs = Traits::kKvRegs && !variant_dropout(kVariant);
  constexpr bool kEarlyDv = Traits::kEarlyDv && !variant_dropout(kVariant);  // (dropout: after dS^T)
  [[maybe_unused]] uint32_t k_frag[kKvRegs ? kHeadDim / 16 : 1][4];
  [[maybe_unused]] uint32_t v_frag[kKvRegs ? kHeadDim / 16 : 1][4];
#pragma unroll 1
  for (int it = 0; it < w.total; ++it) {
    const int head = step.head, m = step.m;
    const BwdStep next = next_step(w, step);
    // The next step's loads take the buffer of the step before this one (header); below, this
    // step's Q / dO / rows landed (the buffer's mbarrier, its use number's parity).
    begin_step<Traits>(kp, w, q_map, do_map, s_base, it, next,
                       stage + 1 == Traits::kStages ? 0 : stage + 1, tid);
    // The last step's staged dQ (stored and fenced by every thread before this step's barrier)
    // added into the accumulator, under this step.
    if (it > 0) reduce_staged_dq();
    ptx::mbarrier_wait_parity(s_base + Traits::kOffBar + 8 * stage, phase);
    const uint32_t sQs = sQ + stage * Traits::kQBytes, sDOs = sDO + stage * Traits::kQBytes;
    clear_query_tail<Traits, kSeqlens>(p, w.seqlen_q - m * kBlockM, sQs, sDOs, tid);
    const char* s_max = smem + Traits::kOffMax + stage * kBlockM * 4;
    const char* s_log2sum = smem + Traits::kOffLog2Sum + stage * kBlockM * 4;
    const char* s_d = smem + Traits::kOffD + stage * kBlockM * 4;

    float acc_s[kQTiles][4], acc_dp[kQTiles][4];
    if constexpr (kKvRegs) {
      if (it == 0) {  // K / V landed and published (begin_step)
        load_a_frags_sw128<kBlockN, kHeadDim>(smem + Traits::kOffK, warp_key0, k_frag, lane);
        load_a_frags_sw128<kBlockN, kHeadDim>(smem + Traits::kOffV, warp_key0, v_frag, lane);
      }
      issue_s_dp_rs<kBf16, Traits>(acc_s, acc_dp, k_frag, v_frag, sQs, sDOs);
    } else {
      issue_s_dp<kBf16, Traits>(acc_s, acc_dp, sK, sV, sQs, sDOs, wg);
    }
    ptx::wgmma_wait<1>();
    ptx::fence_operand(acc_s);
    uint32_t p16[kBlockM / 16][4], ds16[kBlockM / 16][4];
    // dV += P^T dO and dK += dS^T Q.
    const auto issue_dv = [&] { issue_rs_gemm<kBf16, Traits>(acc_dv, p16, sDOs); };
    const auto issue_dk = [&] { issue_rs_gemm<kBf16, Traits>(acc_dk, ds16, sQs); };
    const auto early_dv = [&] {  // probs_and_grads' `early` hook: dV's group, or none
      if constexpr (kEarlyDv) {
        return [&] {
          ptx::wgmma_fence();
          issue_dv();
          ptx::wgmma_commit();
        };
      } else {
        return NoEarlyGemm{};
      }
    }();
    probs_and_grads<Element, Traits, kVariant>(kp, w, head, m, acc_s, acc_dp, s_max, s_log2sum,
                                               s_d, smem + Traits::kOffDS, p16, ds16, warp_key0,
                                               lane, early_dv);
    if (compute_dq) {
      // dS^T to shared memory [key][query] (sw128, kBlockN rows).
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        store_a_frag_sw128<kBlockN, variant_softcap(kVariant)>(smem + Traits::kOffDS, warp_key0,
                                                              kk * 16, ds16[kk], lane);
      }
      // dV under the fence's and the barrier's wait (it reads no dS^T), unless already issued.
      if constexpr (!kEarlyDv) {
        ptx::wgmma_fence();
        issue_dv();
        ptx::wgmma_commit();
      }
      // Published before dQ is issued.
      ptx::fence_proxy_async_shared();
      // The last step's staged block read by its reduction before this step's dQ stores over it
      // (after the barrier).
      if (dq_issuer) ptx::tma_store_wait<0>();
      __syncthreads();  // dS^T of both warpgroups stored
    } else {
      ptx::wgmma_fence();
      if constexpr (!kEarlyDv) issue_dv();
      issue_dk();
      ptx::wgmma_commit();
    }

    if (!compute_dq) {
      ptx::wgmma_wait<0>();
    } else if constexpr (Traits::kDqOneWg) {
      // dQ (64 x d) = dS K by warpgroup it % 2 alone (its warps' 16 rows, all d columns); the
      // choice broadcast from lane 0 so that ptxas sees a warp-uniform branch around wgmmas.
      const bool mine = __shfl_sync(0xffffffffu, static_cast<int>((it & 1) == wg), 0) != 0;
      float acc_dq[1][kHeadDim / 8][4];
      if (mine) {
        issue_dq<kBf16, Traits, kHeadDim>(acc_dq, sDS, sK, 0);
        ptx::wgmma_commit();
      }
      issue_dk();
      ptx::wgmma_commit();
      ptx::wgmma_wait<1>();  // dV (and dQ) done; dK runs on
      if (mine) {
        ptx::fence_operand(acc_dq[0]);
        // Staged in dq_frag_offset's order: column tile nt8 (8 nt8 + 2t + e) is warp
        // (warp % 4) + 4 (nt8 / tiles)'s tile nt8 % tiles of a half.
        constexpr int kTiles = Traits::kDqCols / 8;
        char* s_dq = smem + Traits::kOffDQ + (warp % 4) * 256 + lane * 8;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
#pragma unroll
          for (int nt8 = 0; nt8 < kHeadDim / 8; ++nt8) {
            *reinterpret_cast<float2*>(s_dq + (nt8 / kTiles) * 4 * 256 +
                                       (hr * kTiles + nt8 % kTiles) * 2048) =
                make_float2(acc_dq[0][nt8][hr * 2], acc_dq[0][nt8][hr * 2 + 1]);
          }
        ptx::fence_proxy_async_shared();
      }
      dq_block = dq_block_of(head, m);
    } else {
      // dQ (kBlockM x d) = dS K: this warpgroup's kDqCols columns.
      constexpr int kDqCols = Traits::kDqCols;
      float acc_dq[Traits::kDqMTiles][kDqCols / 8][4];
      issue_dq<kBf16, Traits>(acc_dq, sDS, sK, wg * kDqCols);
      ptx::wgmma_commit();
      issue_dk();
      ptx::wgmma_commit();
      if constexpr (Traits::kDkNext) {
        ptx::wgmma_wait<1>();  // dV and dQ done; dK runs under the staging below (and on)
      } else {
        ptx::wgmma_wait<0>();
      }
#pragma unroll
      for (int mt = 0; mt < Traits::kDqMTiles; ++mt) ptx::fence_operand(acc_dq[mt]);
      // Row (query) mt * 64 + (warp % 4) * 16 + g + 8 hr, column wg * kDqCols + 8 nt + 2t + e.
      // Staged in fragment order (the reduction goes out at the next step's start, or after the
      // walk): in slab mt's block (64 x d floats), pair (hr, nt) of warp w, lane l at
      // bwd/params.h dq_frag_offset's float ((hr * kDqCols / 8 + nt) * 8 + w) * 64 + 2 l.
      char* s_dq = smem + Traits::kOffDQ + warp * 256 + lane * 8;
#pragma unroll
      for (int mt = 0; mt < Traits::kDqMTiles; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
#pragma unroll
          for (int nt = 0; nt < kDqCols / 8; ++nt) {
            *reinterpret_cast<float2*>(s_dq + mt * (64 * kHeadDim * 4) +
                                       (hr * (kDqCols / 8) + nt) * 2048) =
                make_float2(acc_dq[mt][nt][hr * 2], acc_dq[mt][nt][hr * 2 + 1]);
          }
      // Published to the async proxy (the bulk reduction reads it after the next barrier).
      ptx::fence_proxy_async_shared();
      dq_block = dq_block_of(head, m);
    }
    step = next;
    if (++stage == Traits::kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
  // The last step's staged block (w.total > 0 steps ran: a block that walks none has none).
  if (compute_dq && w.total > 0) {
    __syncthreads();  // every thread's staged pairs stored and fenced
    reduce_staged_dq();
  }
  ptx::wgmma_wait<0>();  // the last step's dK
  finish_dkdv<variant_dropout(kVariant)>(kp, acc_dk, acc_dv);

  // dK = softmax_scale * dS^T Q (the scale of S was left out of dS), dV as accumulated.
  store_dkdv<Element, Traits, kColTiles>(kp, w, smem, acc_dk, acc_dv, warp_key0, 0, tid);
  // The block's reduction done (shared memory read, global memory written) before it exits,
  // then published to a streamed dQ convert.
  if (dq_issuer) ptx::bulk_wait_all<0>();
  key_tile_done<kBlockN>(kp, w, tid);
}

template <typename Element, typename Traits, int kVariant>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    bwd_kernel(const __grid_constant__ typename Traits::Params params) {
#if FLASHATTN_CU_SM90A
  extern __shared__ __align__(1024) char smem[];
  // qualified: no ADL into sm80
  sm90::bwd_block<Element, Traits, kVariant>(params.kp, &params.q_map, &params.do_map, smem);
#else
  ptx::unsupported_arch();
#endif
}

}  // namespace flashattn_cu::sm90
