// FlashAttention forward on Hopper (sm_90a): TMA loads into an mbarrier ring, warp
// specialization, warpgroup MMA.
//
// One thread block owns kBlockM query rows of one (batch, head), in kConsumers + 1 warpgroups:
//  * the producer (warpgroup 0) gives its registers back (setmaxnreg) and one elected thread
//    issues every load: Q once, then the K and V tiles of each visited key block, last block
//    first (the masked boundary blocks come first, then the unmasked bulk), into a ring of
//    kStages buffers; a buffer's "full" mbarrier completes when its bytes have landed, its
//    "empty" one when every consumer warp is done reading it;
//  * each consumer warpgroup owns 64 query rows and keeps their O (64 x d fp32) and their online
//    softmax state in registers:
//      S_i = Q K_i^T            wgmma SS (Q and K K-major in sw128 tiles)
//      O  += P_{i-1} V_{i-1}     wgmma RS, issued right behind S_i: P_{i-1} (16-bit) is the A
//                                operand straight from registers, V MN-major
//      softmax of S_i            while the P V product runs on the tensor cores
//      wait for P V, rescale O by the new row max, pack P_i for the next step.
//    The accumulator layout of S is the A-fragment layout of P (ptx/wgmma.h), so P never
//    leaves the registers, and every score tile of a warp is the mma.sync layout of its 16
//    rows: the mask, the score modifiers and the online softmax are the problem layer's and
//    common/softmax.h's, as in the sm80 kernel.
//  * epilogue: O / l in 16-bit into the warpgroup's own rows of the Q tile (its last S GEMM has
//    completed; the other warpgroup reads only its own rows), then coalesced 16-byte stores;
//    LSE and the row statistics as the sm80 kernel writes them.
// Loads address the tensors through TMA maps (d, rows, heads, batch) (fwd_launch.h): rows past
// the tensor are zero-filled; rows past a varlen entry belong to the next entry and are masked
// like the padded tail (keys) or never stored (queries).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/numeric.h"
#include "../common/softmax.h"
#include "../problem/mask.h"
#include "../problem/params.h"
#include "../problem/scheduler.h"
#include "../problem/score_mod.h"
#include "../problem/seqlen.h"
#include "../ptx/ldmatrix.h"
#include "../ptx/mbarrier.h"
#include "../ptx/sync.h"
#include "../ptx/tma.h"
#include "../ptx/wgmma.h"

namespace flashattn_cu::sm90 {

// The forward's kernel parameters on this path: the arch-neutral ones and the TMA maps of q, k
// and v (encoded per call on the host, fwd_launch.h).
struct FwdTmaParams {
  CUtensorMap q_map;  // boxes of 64 columns x kBlockM rows
  CUtensorMap k_map;  // 64 columns x kBlockN rows
  CUtensorMap v_map;
  FwdKernelParams kp;
};

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, bool kPingPong_ = true>
struct FwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kConsumers = kBlockM / 64;  // consumer warpgroups, 64 query rows each
  // Two consumers take turns issuing their GEMMs (named barriers kPingPong0/1), so one
  // warpgroup's softmax runs while the other's GEMMs keep the tensor cores busy.
  static constexpr bool kPingPong = kPingPong_ && kConsumers == 2;
  static constexpr int kNThreads = 128 * (kConsumers + 1);
  static constexpr int kAtoms = (kHeadDim + 63) / 64;  // 64-column sw128 atoms of a row
  static constexpr int kChunks = kHeadDim / 8;         // 16-byte chunks of a row in global memory
  static constexpr int kNTiles = kBlockN / 8;          // 8-key accumulator tiles of S
  static constexpr int kDTiles = kHeadDim / 8;         // 8-column accumulator tiles of O
  static constexpr uint32_t kQBytes = kAtoms * kBlockM * 128;
  static constexpr uint32_t kKVBytes = kAtoms * kBlockN * 128;
  // Shared memory: Q, kStages K tiles, kStages V tiles (each atom 1024-byte aligned: kBlockM and
  // kBlockN are multiples of 8), then the barriers.
  static constexpr uint32_t kOffQ = 0;
  static constexpr uint32_t kOffK = kOffQ + kQBytes;
  static constexpr uint32_t kOffV = kOffK + kStages * kKVBytes;
  static constexpr uint32_t kOffBarriers = kOffV + kStages * kKVBytes;
  // Barrier indices: Q full, then per stage K full, V full, K empty, V empty.
  static constexpr int kBarQFull = 0;
  static constexpr int kBarKFull = 1;
  static constexpr int kBarVFull = 1 + kStages;
  static constexpr int kBarKEmpty = 1 + 2 * kStages;
  static constexpr int kBarVEmpty = 1 + 3 * kStages;
  static constexpr int kNumBarriers = 1 + 4 * kStages;
  static constexpr int kSmemBytes = kOffBarriers + 8 * kNumBarriers + 1024;  // + alignment slack
  // Register budgets (setmaxnreg): the producer needs few; the consumers take the rest of the
  // 64K registers (2 consumers: 128 x 24 + 256 x 240; 3: 128 x 32 + 384 x 160).
  static constexpr int kProducerRegs = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;

  static_assert(kConsumers == 2 || kConsumers == 3, "2 or 3 consumer warpgroups");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "key blocks of whole k16 steps, wgmma N <= 256");
  static_assert(kHeadDim % 16 == 0, "head dims of whole k16 steps");
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= 65536, "register file");
  static_assert(kSmemBytes <= 227 * 1024, "fits the sm_90 shared memory");
};

// The producer: one thread issues Q's load, then K and V of each visited key block, last first.
template <typename Traits>
__device__ __forceinline__ void produce_tiles(const FwdTmaParams& tp, const SeqInfo& seq,
                                              int head, int head_k, int m_start,
                                              const KeyBlocks& blocks, uint32_t s_base) {
  constexpr int kBlockN = Traits::kBlockN, kStages = Traits::kStages;
  const uint32_t bars = s_base + Traits::kOffBarriers;
  // Varlen maps have one batch entry whose rows are all of the entries'.
  const int q_row0 = (seq.start_q >= 0 ? seq.start_q : 0) + m_start;
  const int q_batch = seq.start_q >= 0 ? 0 : seq.batch;
  const int k_row0 = seq.start_k >= 0 ? seq.start_k : 0;
  const int k_batch = seq.start_k >= 0 ? 0 : seq.batch;

  ptx::mbarrier_arrive_expect_tx(bars + 8 * Traits::kBarQFull, Traits::kQBytes);
#pragma unroll
  for (int a = 0; a < Traits::kAtoms; ++a) {
    const int32_t c[4] = {a * 64, q_row0, head, q_batch};
    ptx::tma_load<4>(s_base + Traits::kOffQ + a * Traits::kBlockM * 128, &tp.q_map,
                     bars + 8 * Traits::kBarQFull, c);
  }
#pragma unroll 1
  for (int i = 0; i < blocks.end - blocks.begin; ++i) {
    const int n = blocks.end - 1 - i, stage = i % kStages;
    const uint32_t parity = ((i / kStages) & 1) ^ 1;  // a fresh barrier's previous phase is done
    const uint32_t k_full = bars + 8 * (Traits::kBarKFull + stage);
    const uint32_t v_full = bars + 8 * (Traits::kBarVFull + stage);
    ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarKEmpty + stage), parity);
    ptx::mbarrier_arrive_expect_tx(k_full, Traits::kKVBytes);
#pragma unroll
    for (int a = 0; a < Traits::kAtoms; ++a) {
      const int32_t c[4] = {a * 64, k_row0 + n * kBlockN, head_k, k_batch};
      ptx::tma_load<4>(s_base + Traits::kOffK + stage * Traits::kKVBytes + a * kBlockN * 128,
                       &tp.k_map, k_full, c);
    }
    ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarVEmpty + stage), parity);
    ptx::mbarrier_arrive_expect_tx(v_full, Traits::kKVBytes);
#pragma unroll
    for (int a = 0; a < Traits::kAtoms; ++a) {
      const int32_t c[4] = {a * 64, k_row0 + n * kBlockN, head_k, k_batch};
      ptx::tma_load<4>(s_base + Traits::kOffV + stage * Traits::kKVBytes + a * kBlockN * 128,
                       &tp.v_map, v_full, c);
    }
  }
}

// Where step i of the key-block walk reads its K/V buffer, and the phase parity it waits for.
template <typename Traits>
struct RingSlot {
  int stage;
  uint32_t parity;
  __device__ __forceinline__ explicit RingSlot(int i)
      : stage(i % Traits::kStages), parity((i / Traits::kStages) & 1) {}
};

template <typename Element, typename Traits, int kVariant>
__device__ __forceinline__ void fwd_block(const FwdTmaParams& tp, char* smem_raw) {
  constexpr bool kDynamic = variant_dynamic(kVariant);  // problem/mask.h
  constexpr bool kBf16 = std::is_same_v<Element, __nv_bfloat16>;
  using Ops = ElementOps<Element>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim, kDTiles = Traits::kDTiles;
  const FwdKernelParams& kp = tp.kp;
  const FwdParams& p = kp.p;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wg = warp / 4;
  const QueryTile tile = query_tile(ceil_div(p.seqlen_q, kBlockM), p.num_heads);
  const SeqInfo seq = seq_info<kDynamic>(p, tile.batch);
  const int head = tile.head;
  const int m_start = tile.m_block * kBlockM;
  if (m_start >= seq.seqlen_q) return;  // varlen: a query block past this entry's length
  const KeyBlocks blocks =
      mask_of<kDynamic>(seq, p).template key_blocks<kBlockM, kBlockN>(m_start);
  const int num_blocks = blocks.end - blocks.begin;

  const uint32_t s_base = (ptx::smem_u32(smem_raw) + 1023u) & ~1023u;  // sw128 atoms
  char* smem = smem_raw + (s_base - ptx::smem_u32(smem_raw));
  const uint32_t bars = s_base + Traits::kOffBarriers;
  if (tid == 0) {
    ptx::mbarrier_init(bars + 8 * Traits::kBarQFull, 1);
#pragma unroll
    for (int s = 0; s < Traits::kStages; ++s) {
      ptx::mbarrier_init(bars + 8 * (Traits::kBarKFull + s), 1);
      ptx::mbarrier_init(bars + 8 * (Traits::kBarVFull + s), 1);
      ptx::mbarrier_init(bars + 8 * (Traits::kBarKEmpty + s), 4 * Traits::kConsumers);
      ptx::mbarrier_init(bars + 8 * (Traits::kBarVEmpty + s), 4 * Traits::kConsumers);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();  // the last barrier of all warpgroups: the roles split here

  if (wg == 0) {
    ptx::setmaxnreg_dec<Traits::kProducerRegs>();
    if (warp == 0 && num_blocks > 0 && ptx::elect_one_sync()) {
      produce_tiles<Traits>(tp, seq, head, head / (p.num_heads / p.num_heads_k), m_start, blocks,
                            s_base);
    }
    return;
  }
  ptx::setmaxnreg_inc<Traits::kConsumerRegs>();

  const int consumer = wg - 1;                          // query rows consumer * 64 .. of the block
  const int warp_row0 = consumer * 64 + (warp % 4) * 16;  // this warp's 16 rows
  const uint32_t sQ = s_base + Traits::kOffQ;
  auto k_tile = [&](int stage) { return s_base + Traits::kOffK + stage * Traits::kKVBytes; };
  auto v_tile = [&](int stage) { return s_base + Traits::kOffV + stage * Traits::kKVBytes; };
  // One arrival per consumer warp releases a buffer (its warpgroup's wgmmas reading it are done).
  auto release = [&](int bar) {
    if (lane == 0) ptx::mbarrier_arrive(bars + 8 * bar);
  };
  // Ping-pong turns (Traits::kPingPong): a consumer waits for its turn before issuing a step's
  // GEMMs and hands the turn to the other one right after. Consumer 0 starts; both walk the
  // same key blocks, so they take the same number of turns; consumer 1's last hand-over is
  // left out (nobody waits for it).
  auto turn_begin = [&]() {
    if constexpr (Traits::kPingPong) {
      ptx::named_barrier_sync(consumer == 0 ? ptx::NamedBarrier::kPingPong0
                                            : ptx::NamedBarrier::kPingPong1, 256);
    }
  };
  auto turn_end = [&](bool last) {
    if constexpr (Traits::kPingPong) {
      if (consumer == 0) {
        ptx::named_barrier_arrive(ptx::NamedBarrier::kPingPong1, 256);
      } else if (!last) {
        ptx::named_barrier_arrive(ptx::NamedBarrier::kPingPong0, 256);
      }
    }
  };

  float acc_o[1][kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[0][dt][e] = 0.f;
  OnlineSoftmax<1> softmax;
  softmax.init();

  if (num_blocks > 0) {
    const float scale_log2 = kp.score.scale_log2;
    float acc_s[1][Traits::kNTiles][4];
    uint32_t p16[kBlockN / 16][4];  // P of the previous step, the A operand of O += P V

    auto issue_s = [&](int stage) {  // S = Q K^T of this warpgroup's rows (one commit group)
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        ptx::wgmma_ss<kBlockN, kBf16, 0, 0>(
            acc_s[0], ptx::sw128_desc_k_major<kBlockM>(sQ, consumer * 64, ks),
            ptx::sw128_desc_k_major<kBlockN>(k_tile(stage), 0, ks), ks > 0);
      }
      ptx::wgmma_commit();
    };
    auto issue_pv = [&](int stage) {  // O += P V (one commit group)
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        ptx::wgmma_rs<kHeadDim, kBf16, 1>(acc_o[0], p16[kk],
                                          ptx::sw128_desc_mn_major<kBlockN>(v_tile(stage), kk, 0), 1);
      }
      ptx::wgmma_commit();
    };
    // Score modifiers, then the element mask on the boundary blocks only (problem/mask.h).
    auto score_tile = [&](int n) {
      apply_score_mods<kVariant>(acc_s, kp, tile.batch, head, m_start + warp_row0, n * kBlockN,
                                 lane);
      if (n >= blocks.unmasked_end || n < blocks.unmasked_begin) {
        mask_of<kDynamic>(seq_info<kDynamic>(p, tile.batch), p)
            .apply(acc_s, m_start + warp_row0, n * kBlockN, lane);
      }
    };
    auto pack_p = [&]() {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        p16[kk][0] = Ops::pack(acc_s[0][2 * kk][0], acc_s[0][2 * kk][1]);
        p16[kk][1] = Ops::pack(acc_s[0][2 * kk][2], acc_s[0][2 * kk][3]);
        p16[kk][2] = Ops::pack(acc_s[0][2 * kk + 1][0], acc_s[0][2 * kk + 1][1]);
        p16[kk][3] = Ops::pack(acc_s[0][2 * kk + 1][2], acc_s[0][2 * kk + 1][3]);
      }
    };

    float ref[1][2], rescale[1][2];
    if (Traits::kPingPong && consumer == 1) {
      ptx::named_barrier_arrive(ptx::NamedBarrier::kPingPong0, 256);  // consumer 0 goes first
    }
    ptx::mbarrier_wait_parity(bars + 8 * Traits::kBarQFull, 0);
    {  // Step 0: S_0 alone (O is still 0, nothing to rescale).
      const RingSlot<Traits> slot(0);
      ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarKFull + slot.stage), slot.parity);
      turn_begin();
      ptx::wgmma_fence();
      issue_s(slot.stage);
      turn_end(false);
      ptx::wgmma_wait<0>();
      ptx::fence_operand(acc_s[0]);
      release(Traits::kBarKEmpty + slot.stage);
      score_tile(blocks.end - 1);
      softmax.new_max(acc_s, scale_log2, ref, rescale);
      softmax.exponentiate(acc_s, ref, rescale, scale_log2);
      pack_p();
    }
#pragma unroll 1
    for (int i = 1; i < num_blocks; ++i) {
      const RingSlot<Traits> slot(i), prev(i - 1);
      ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarKFull + slot.stage), slot.parity);
      ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarVFull + prev.stage), prev.parity);
      turn_begin();
      ptx::wgmma_fence();
      issue_s(slot.stage);
      issue_pv(prev.stage);
      turn_end(false);
      ptx::wgmma_wait<1>();  // S_i has landed; P_{i-1} V_{i-1} may still run
      ptx::fence_operand(acc_s[0]);
      release(Traits::kBarKEmpty + slot.stage);
      score_tile(blocks.end - 1 - i);
      softmax.new_max(acc_s, scale_log2, ref, rescale);
      softmax.exponentiate(acc_s, ref, rescale, scale_log2);
      ptx::wgmma_wait<0>();  // P_{i-1} V_{i-1} done: O and P's registers are free again
      ptx::fence_operand(acc_o[0]);
      release(Traits::kBarVEmpty + prev.stage);
      OnlineSoftmax<1>::rescale_output(acc_o, rescale);
      pack_p();
    }
    {  // The last block's P V.
      const RingSlot<Traits> last(num_blocks - 1);
      ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarVFull + last.stage), last.parity);
      turn_begin();
      ptx::wgmma_fence();
      issue_pv(last.stage);
      turn_end(true);
      ptx::wgmma_wait<0>();
      ptx::fence_operand(acc_o[0]);
      release(Traits::kBarVEmpty + last.stage);
    }
  }

  // Epilogue.
  const int g = lane / 4, t = lane % 4;
  const int rows_q = min(kBlockM, seq.seqlen_q - m_start);
  const int64_t row0 = seq.lse_row0(head, p.num_heads, p.seqlen_q, p.total_q) + m_start;
  float inv_l[1][2], row_lse[1][2];
  RowStats row_stats[1][2];
  softmax.finalize(kp.score.score_scale, inv_l, row_lse, row_stats);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int row = warp_row0 + g + hr * 8;
    if (t == 0 && row < rows_q) {
      p.lse[row0 + row] = row_lse[0][hr];
      if (p.softmax_stats != nullptr) {
        reinterpret_cast<float2*>(p.softmax_stats)[row0 + row] =
            make_float2(row_stats[0][hr].row_max, row_stats[0][hr].log2_sum);
      }
    }
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      const uint32_t packed = Ops::pack(acc_o[0][dt][hr * 2] * inv_l[0][hr],
                                        acc_o[0][dt][hr * 2 + 1] * inv_l[0][hr]);
      *reinterpret_cast<uint32_t*>(smem + Traits::kOffQ + ptx::sw128_offset<kBlockM>(row, dt) +
                                   t * 4) = packed;
    }
  }
  ptx::named_barrier_sync(
      static_cast<ptx::NamedBarrier>(static_cast<int>(ptx::NamedBarrier::kWarpgroup0) + consumer),
      128);
  Element* o = static_cast<Element*>(p.o) + seq.q_offset(p.o_batch_stride, p.o_row_stride) +
               head * p.o_head_stride + m_start * p.o_row_stride;
  constexpr int kChunks = Traits::kChunks;
#pragma unroll
  for (int i = 0; i < ceil_div(64 * kChunks, 128); ++i) {
    const int idx = tid % 128 + i * 128;
    if ((64 * kChunks) % 128 != 0 && idx >= 64 * kChunks) break;
    const int r = consumer * 64 + idx / kChunks, c = idx % kChunks;
    if (r < rows_q && c * 8 < p.head_dim) {
      *reinterpret_cast<uint4*>(o + r * p.o_row_stride + c * 8) =
          *reinterpret_cast<const uint4*>(smem + Traits::kOffQ + ptx::sw128_offset<kBlockM>(r, c));
    }
  }
}

template <typename Element, typename Traits, int kVariant>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    fwd_kernel(const __grid_constant__ FwdTmaParams params) {
#if FLASHATTN_CU_SM90A
  extern __shared__ __align__(1024) char smem[];
  sm90::fwd_block<Element, Traits, kVariant>(params, smem);
#else
  ptx::unsupported_arch();
#endif
}

}  // namespace flashattn_cu::sm90
