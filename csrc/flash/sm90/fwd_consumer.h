// The sm90a forward's consumer warpgroups (sm90/fwd_kernel.h says how the CTA is laid out): one
// consumer's steps over one tile's key blocks, S by wgmma, the online softmax in registers, P V
// by wgmma with P from registers, two consumers taking turns (pingpong.h), then the epilogue
// (fwd_epilogue.h).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/numeric.h"
#include "../common/softmax.h"
#include "../problem/dropout.h"
#include "../problem/mask.h"
#include "../problem/params.h"
#include "../problem/score_mod.h"
#include "../problem/seqlen.h"
#include "../ptx/cluster.h"
#include "../ptx/ldmatrix.h"
#include "../ptx/mbarrier.h"
#include "../ptx/shared.h"
#include "../ptx/sync.h"
#include "../ptx/tma.h"
#include "../ptx/wgmma.h"
#include "fwd_clock.h"
#include "fwd_epilogue.h"
#include "fwd_traits.h"
#include "fwd_work.h"

namespace flashattn_cu::sm90 {

// The keys of a key block one consumer warpgroup computes (FwdTraits::kHalfBlocks).
enum class BlockHalf : int { kWhole, kLow, kHigh };

// One consumer warpgroup's work on one tile: its 64 query rows against the tile's key blocks,
// then the epilogue. `ring` / `q_tiles`: the CTA's key-block steps and tiles with key blocks
// so far (fwd_work.h RingSlot / QSlot).
// `ahead()` (called once) works out the CTA's next tile while the last P V runs on the tensor
// cores: its index arithmetic (integer divisions, MUFU-based) took ~1,100 cycles a tile between
// one tile's epilogue and the next one's first GEMM (tune_fwd90 `phases`, benchmarks/NOTES.md
// 12.9), one key-block step and more on short rows.
template <typename Element, typename Traits, int kVariant, typename Turns, typename Ahead>
__device__ __forceinline__ void consume_tile(const FwdTmaParams& tp, const FwdWork& w,
                                             uint32_t s_base, int consumer, int ring,
                                             int q_tiles, const Turns& turns,
                                             FwdClock<Traits::kStamps>& clock, Ahead&& ahead) {
  const FwdKernelParams& kp = tp.kp;
  clock.mark(kPhaseSchedule);
  constexpr bool kDynamic = variant_dynamic(kVariant);  // problem/mask.h: windows
  constexpr bool kSeqlens = variant_seqlens(kVariant);  // and sequence arrays
  constexpr bool kBf16 = std::is_same_v<Element, __nv_bfloat16>;
  using Ops = ElementOps<Element>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim, kDTiles = Traits::kDTiles;
  // Softcap alone bounds the scores by 1: the exponent may be one FFMA (common/softmax.h).
  constexpr bool kSoftcapAlone = kVariant == kSoftcapVariant || kVariant == kStaticSoftcapVariant;
  // The vote's bound (common/softmax.h kWarpFusedLog2): 2^10, or for ALiBi's large row maxima
  // the largest that keeps the row max's 16-bit P exactly 1.
  constexpr int kFusedLog2 =
      !Traits::kWarpFusedExp ? 0 : !variant_may_alibi(kVariant) ? 10 : kBf16 ? 15 : 13;
  using Exp = ExpPolicy<Traits::kPolyEighths, kSoftcapAlone, kFusedLog2, Traits::kSumTree>;
  const FwdParams& p = kp.p;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int head = w.tile.head, batch = w.tile.batch, m_start = w.m_start;
  const int warp_row0 = consumer * 64 + (warp % 4) * 16;  // this warp's 16 rows in the tile
  const uint32_t bars = s_base + Traits::kOffBarriers;
  const QSlot<Traits> qs(q_tiles);
  const uint32_t sQ = s_base + Traits::kOffQ + qs.stage * Traits::kQBytes;
  // The empty barrier of the Q part this consumer reads (FwdTraits kSplitQ: its own rows).
  const int q_empty = Traits::q_bar(Traits::kBarQEmpty, qs.stage, Traits::q_part(consumer));
  auto k_tile = [&](int stage) { return s_base + Traits::kOffK + stage * Traits::kKVBytes; };
  auto v_tile = [&](int stage) { return s_base + Traits::kOffV + stage * Traits::kKVBytes; };
  // One arrival per consumer warp releases a buffer (its warpgroup's wgmmas reading it are done);
  // with FwdTraits kPairKV on the partner CTA's barrier too (the same offset in its shared memory,
  // mapped once here), whose producer also loads into it.
  [[maybe_unused]] uint32_t partner_bars = 0;
  if constexpr (Traits::kPairKV) {
    partner_bars = ptx::map_shared_cluster(bars, ptx::cluster_ctarank() ^ 1u);
  }
  auto release = [&](int bar) {
    if (lane == 0) {
      ptx::mbarrier_arrive(bars + 8 * bar);
      if constexpr (Traits::kPairKV) ptx::mbarrier_arrive_cluster(partner_bars + 8 * bar);
    }
  };

  float acc_o[1][kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[0][dt][e] = 0.f;
  OnlineSoftmax<1> softmax;
  softmax.init();
  // FwdTraits kBoundedRef: the reference fixed at the first key block, the sums of the 16-bit P
  // read by P V (used_acc[hr * 2]: row g + 8 hr's, reduced over the quad by the MMA).
  constexpr bool kBounded = Traits::kBoundedRef && kSoftcapAlone && kBf16;
  static_assert(!kBounded || !Traits::kEarlyRescale, "kBoundedRef: no rescale to move");
  // The sums by wgmma (Traits::kSumsWgmma: in P V's commit group, pv_keys) or by mma.sync
  // (sum_used).
  constexpr bool kSumsByWgmma = kBounded && Traits::kSumsWgmma;
  constexpr bool kSumsByMma = kBounded && !kSumsByWgmma;
  // Where a step adds P_{i-1}'s sums by mma.sync: under S_i (Traits::kSumsUnderS), and with the
  // early rescale always there, after O and the sums take step i - 1's factors (at the pack they
  // would get them twice); otherwise at the pack, after step i's rescale.
  constexpr bool kSumsLate = kSumsByMma && (Traits::kSumsUnderS || Traits::kEarlyRescale);
  float used_acc[4] = {0.f, 0.f, 0.f, 0.f};
  // Softcap alone takes its row max over the raw scores (Traits::kCapAfterMax; scores_to_p).
  constexpr bool kCapAfterMax =
      Traits::kCapAfterMax && variant_softcap(kVariant) && !variant_may_alibi(kVariant);
  // Traits::kTailLevel where it applies: the overlapped steps' tail (the wait for P V, O's
  // rescale, P's pack) inside the exponentials (common/softmax.h exponentiate's `after`), at
  // level 1 on the plain scores' path with the late rescale, at level 2 also on softcap's max over
  // the raw scores' and the early rescale's (no rescale in its tail). Never with dropout (whose
  // pass over P sits between the exponentials and the pack) nor on the bounded reference: with
  // no max ahead of its exponentials, ptxas put P V's wait at their start (SASS, d = 128 bf16
  // 128 x 176 softcap: 2 instructions into the unmasked blocks' arm), ~P V's whole GEMM (~700
  // cycles) on the consumer's path, where the others' waits come after the row max.
  constexpr bool kTailOfMods = kCapAfterMax || Traits::kEarlyRescale;
  constexpr bool kTailInExp = !variant_dropout(kVariant) && !kBounded &&
                              Traits::kTailLevel >= (kTailOfMods ? 2 : 1);
  // The same registers as the m64n8 wgmma accumulator (one 8-column tile) of kSumsByWgmma.
  float(&used_tile)[1][4] = reinterpret_cast<float(&)[1][4]>(used_acc);

  if (w.num_blocks > 0) {
    const float scale_log2 = kp.score.scale_log2;
    float acc_s[1][Traits::kNTiles][4];
    // P of the previous step, the A operand of O += P V; with Traits::kTwoP two sets, step i's P
    // in set i % 2 (P0 / P1 below: a set is always a constant index, or the registers would go
    // to local memory).
    uint32_t p16s[Traits::kTwoP ? 2 : 1][kBlockN / 16][4];
    using P0 = std::integral_constant<int, 0>;
    using P1 = std::integral_constant<int, 1>;

    // S = Q K^T of this warpgroup's rows over keys key0 .. key0 + keys of the block, into S's
    // accumulator tiles of those keys.
    auto s_keys = [&](int stage, auto key0, auto keys) {
      constexpr int kKey0 = decltype(key0)::value, kKeys = decltype(keys)::value;
      // The tiles left out are -inf from here on, not stale: every path defines all of S (and
      // ptxas keeps no earlier values live for the paths that skip them: 200+ bytes of spills).
#pragma unroll
      for (int nt = 0; nt < Traits::kNTiles; ++nt) {
        if (nt < kKey0 / 8 || nt >= (kKey0 + kKeys) / 8) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[0][nt][e] = -INFINITY;
        }
      }
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        ptx::wgmma_ss<kKeys, kBf16, 0, 0, kKey0 / 8>(
            acc_s[0], ptx::sw128_desc_k_major<kBlockM>(sQ, consumer * 64, ks),
            ptx::sw128_desc_k_major<kBlockN>(k_tile(stage), kKey0, ks), ks > 0);
      }
    };
    // O += P V over keys key0 .. key0 + keys of the block, whole k16 steps (P is 0 on the others).
    auto pv_keys = [&](int stage, auto key0, auto keys, auto set) {
      auto& p16 = p16s[decltype(set)::value];
      constexpr int kKk0 = decltype(key0)::value / 16;
      constexpr int kKk1 = (decltype(key0)::value + decltype(keys)::value) / 16;
#pragma unroll
      for (int kk = kKk0; kk < kKk1; ++kk) {
        ptx::wgmma_rs<kHeadDim, kBf16, 1>(acc_o[0], p16[kk],
                                          ptx::sw128_desc_mn_major<kBlockN>(v_tile(stage), kk, 0), 1);
      }
      if constexpr (kSumsByWgmma) {  // the same P's row sums against the ones tile (N 8)
        const uint64_t ones = ptx::sw128_desc_k_major<8>(s_base + Traits::kOffOnes, 0, 0);
#pragma unroll
        for (int kk = kKk0; kk < kKk1; ++kk) {
          ptx::wgmma_rs<8, kBf16, 0>(used_tile, p16[kk], ones, 1);
        }
      }
    };
    // Calls f(key0, keys), compile-time constants, with the keys of the block `half` covers, or
    // the whole block when `split` (a std::bool_constant) is off.
    using std::integral_constant;
    constexpr int kHalf = Traits::kHalfKeys, kHigh = kBlockN - Traits::kHalfKeys;
    auto over_keys = [&](auto split, BlockHalf half, auto&& f) {
      if constexpr (decltype(split)::value) {
        if (half == BlockHalf::kLow) return f(integral_constant<int, 0>{}, integral_constant<int, kHalf>{});
        if (half == BlockHalf::kHigh) return f(integral_constant<int, kHigh>{}, integral_constant<int, kHalf>{});
      }
      f(integral_constant<int, 0>{}, integral_constant<int, kBlockN>{});
    };
    auto issue_s = [&](int stage, BlockHalf half) {  // one commit group
      over_keys(std::bool_constant<Traits::kHalfBlocks && Traits::kHalfS>{}, half,
                [&](auto key0, auto keys) { s_keys(stage, key0, keys); });
      ptx::wgmma_commit();
    };
    auto issue_pv = [&](int stage, BlockHalf half, auto set) {  // one commit group
      over_keys(std::bool_constant<Traits::kHalfBlocks>{}, half,
                [&](auto key0, auto keys) { pv_keys(stage, key0, keys, set); });
      ptx::wgmma_commit();
    };
    // Which keys of block n this warpgroup's rows can see at all: the first row's begin to the
    // last row's end (rows past seqlen_q see as far as the last real one, or further: safe).
    const int wg_row0 = m_start + consumer * 64;
    const Mask wg_mask = mask_of<kDynamic>(w.seq, p);
    const int wg_key_begin = wg_mask.key_begin(wg_row0), wg_key_end = wg_mask.key_end(wg_row0 + 63);
    // The choice is the same in every thread of the warpgroup; taken from lane 0 so ptxas sees
    // a warp-uniform branch (wgmma in a path it thinks divergent gets serialized, C7520).
    auto half_of = [&](int n) {
      if (!Traits::kHalfBlocks) return BlockHalf::kWhole;
      const int n0 = n * kBlockN;
      const int h = wg_key_end <= n0 + kHalf    ? static_cast<int>(BlockHalf::kLow)
                    : wg_key_begin >= n0 + kHigh ? static_cast<int>(BlockHalf::kHigh)
                                                 : static_cast<int>(BlockHalf::kWhole);
      return static_cast<BlockHalf>(__shfl_sync(0xffffffffu, h, 0));
    };
    // Score modifiers (built once for the tile: problem/score_mod.h ScoreMods), then the
    // element mask on the boundary blocks only (problem/mask.h).
    const ScoreMods<kVariant> mods =
        Traits::kModsPerTile ? score_mods_of<kVariant>(kp, batch, head) : ScoreMods<kVariant>{};
    // The element mask of a boundary block. In the variants with sequence arrays, from the
    // tile's sequence info (w.seq, in registers) up to d = 128: from seq_info at each such block,
    // the arrays' loads (5 LDG a step in the dynamic variants' SASS, 10 with softcap's two
    // masks) sat after the S GEMM's wait. At d = 256 w.seq held across the steps spills (ptxas:
    // dynamic 0 -> 40 bytes), so the arrays are read again there; the padded variants' seq_info
    // is the call's constants (no loads).
    auto block_mask = [&] {
      if constexpr (kSeqlens && Traits::kHeadDim <= 128) {
        return mask_of<kDynamic>(w.seq, p);
      } else {
        return mask_of<kDynamic>(seq_info<kSeqlens>(p, batch), p);
      }
    };
    auto score_tile = [&](int n) {
      if constexpr (Traits::kModsPerTile) {
        mods.apply(acc_s, kp, m_start + warp_row0, n * kBlockN, lane);
      } else {
        apply_score_mods<kVariant>(acc_s, kp, batch, head, m_start + warp_row0, n * kBlockN,
                                   lane);
      }
      if (n >= w.blocks.unmasked_end || n < w.blocks.unmasked_begin) {
        block_mask().apply(acc_s, m_start + warp_row0, n * kBlockN, lane);
      }
    };
    // S_n -> P_n: the score modifiers and the mask, the new row max, the exponentials. Softcap
    // alone on a block without an element mask takes the row max over the raw scores
    // (Traits::kCapAfterMax), so that the max reduction does not wait for the tanh stream.
    // `after` runs once, at the end of the exponentials (common/softmax.h exponentiate's, inlined
    // into each arm of the vote). Only the steps of kTailInExp pass one that does something; the
    // bounded reference's path takes none (kTailInExp never holds there).
    auto scores_to_p = [&](int n, float (&ref)[1][2], float (&rescale)[1][2],
                           const auto& after) {
      if constexpr (kBounded || kCapAfterMax) {
        // Softcap alone: the element mask of a boundary block before the tanh (-inf out of any
        // max) and again after it (tanh(-inf) = -1); `capped`, each score's tanh for the
        // exponentials' loop on the other blocks.
        const bool boundary = n >= w.blocks.unmasked_end || n < w.blocks.unmasked_begin;
        auto mask = [&] {
          if (boundary) block_mask().apply(acc_s, m_start + warp_row0, n * kBlockN, lane);
        };
        const float pre = kp.score.softcap_pre;
        const auto capped = [pre](float x) { return ptx::tanh_approx(x * pre); };
        if constexpr (kBounded) {
          // No tail with the wait for P V (kTailInExp): ptxas put that wait at the exponentials'
          // start. Traits::kTwoP's `after` is P's pack alone (no wait: its set is free).
          static_assert(Traits::kTwoP ||
                            std::is_same<std::decay_t<decltype(after)>, NoAfter>::value,
                        "the bounded reference's exponentials take no tail (kTailInExp)");
          // The reference fixed at the first block (its capped, masked scores' max, at least
          // ScoreScale::ref_floor); no max and no rescale after it.
          const bool first = n == w.blocks.end - 1;
          if (boundary || first) {
            mask();
            apply_softcap(acc_s, pre);
            mask();
            if (first) softmax.fix_reference(acc_s, kp.score.ref_floor);
            softmax.template exponentiate_fixed<Exp>(acc_s, scale_log2, after);
          } else {
            const float ones[1][2] = {{1.f, 1.f}};
            softmax.template exponentiate_mapped<Exp>(acc_s, softmax.m, ones, scale_log2, capped,
                                                      after);
          }
          return;
        } else {
          mask();
          softmax.new_max_capped(acc_s, scale_log2, ref, rescale, [pre](float m) {
            return m == -INFINITY ? -INFINITY : ptx::tanh_approx(m * pre);
          });
          if constexpr (Traits::kCapInterleave) {
            if (!boundary) {  // no -inf to keep: each score's tanh beside its exponential
              if constexpr (Traits::kStamps) clock.step(kStepMax);
              softmax.template exponentiate_mapped<Exp>(acc_s, ref, rescale, scale_log2, capped,
                                                        after);
              return;
            }
          }
          apply_softcap(acc_s, pre);
          mask();
        }
      } else {
        score_tile(n);
        softmax.template new_max<Traits::kMaxTree, Traits::kLazyRescale, Traits::kSkipKept>(
            acc_s, scale_log2, ref, rescale);
      }
      // The phase clocks' split of a step's softmax (harness builds only; steps loop only).
      if constexpr (Traits::kStamps) clock.step(kStepMax);
      softmax.template exponentiate<Exp>(acc_s, ref, rescale, scale_log2, after);
    };
    // Dropout (problem/dropout.h) after the row statistics, which are of the undropped P: the
    // dropped elements leave only the P V product; 1 / (1 - p) joins 1 / l in the epilogue.
    auto drop_p = [&](int n) {
      if constexpr (variant_dropout(kVariant)) {
        dropout_of(kp, batch, head).drop(acc_s, m_start + warp_row0, n * kBlockN, lane);
      }
    };
    // The sums of the 16-bit P in p16 (used_acc), row by row (kBounded).
    auto sum_used = [&](auto set) {
      if constexpr (kSumsByMma) {
        auto& p16 = p16s[decltype(set)::value];
        constexpr uint32_t kOnes = Ops::kOnePair;
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) Ops::mma(used_acc, p16[kk], kOnes, kOnes);
      }
    };
    auto pack_p = [&](auto set) {
      auto& p16 = p16s[decltype(set)::value];
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        p16[kk][0] = Ops::pack(acc_s[0][2 * kk][0], acc_s[0][2 * kk][1]);
        p16[kk][1] = Ops::pack(acc_s[0][2 * kk][2], acc_s[0][2 * kk][3]);
        p16[kk][2] = Ops::pack(acc_s[0][2 * kk + 1][0], acc_s[0][2 * kk + 1][1]);
        p16[kk][3] = Ops::pack(acc_s[0][2 * kk + 1][2], acc_s[0][2 * kk + 1][3]);
      }
      if constexpr (kSumsByMma && !kSumsLate) sum_used(set);
    };

    // After a wait that retired a P V group: O's registers (and the sums' with kSumsByWgmma, in
    // the same group) read only from here on.
    auto fence_o = [&] {
      ptx::fence_operand(acc_o[0]);
      if constexpr (kSumsByWgmma) ptx::fence_operand(used_tile);
    };
    float ref[1][2], rescale[1][2];
    // O *= the step's rescale factors (behind a lazy reference, Traits::kLazyRescale, or with
    // Traits::kSkipKept, skipped by a warp whose factors are all exactly 1).
    auto rescale_o = [&] {
      OnlineSoftmax<1>::rescale_output_for<Traits::kLazyRescale, Traits::kSkipKept>(acc_o,
                                                                                   rescale);
    };
    BlockHalf half;  // the keys of the step's S (the next step's P V)
    // Step i's S GEMM with nothing else in flight, from its K wait to its softmax: step 0, and
    // every step of the serial order (Traits::kSerialPV). after_wait / after_s: the phase
    // clock's marks after the K wait and once S has landed; under_s: what runs while S does.
    auto s_alone = [&](int i, auto&& after_wait, auto&& after_s, auto&& under_s) {
      const RingSlot<Traits> slot(ring + i);
      ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarKFull + slot.stage), slot.parity);
      after_wait();
      half = half_of(w.blocks.end - 1 - i);
      turns.begin();
      ptx::wgmma_fence();
      issue_s(slot.stage, half);
      turns.end();
      under_s();
      ptx::wgmma_wait<0>();
      ptx::fence_operand(acc_s[0]);
      after_s();
      release(Traits::kBarKEmpty + slot.stage);
      // The tile's last S has landed (kOInQ: Q's buffer is released by the epilogue's stores).
      if (!Traits::kOInQ && i == w.num_blocks - 1) release(q_empty);
      scores_to_p(w.blocks.end - 1 - i, ref, rescale, NoAfter{});
      drop_p(w.blocks.end - 1 - i);
    };
    // Step i's P V (block i of the walk, P from `half`) with nothing else of this consumer in
    // flight: every step of the serial order, and the tile's last. during: what runs under the
    // GEMM before its wait.
    auto pv_alone = [&](int i, auto set, auto&& during) {
      const RingSlot<Traits> slot(ring + i);
      ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarVFull + slot.stage), slot.parity);
      turns.begin();
      ptx::wgmma_fence();
      issue_pv(slot.stage, half, set);
      turns.end();
      during();
      ptx::wgmma_wait<0>();
      fence_o();
      release(Traits::kBarVEmpty + slot.stage);
    };
    ptx::mbarrier_wait_parity(
        bars + 8 * Traits::q_bar(Traits::kBarQFull, qs.stage, Traits::q_part(consumer)),
        qs.parity);
    clock.mark(kPhaseQWait);
    // The walk's first block is the tile's last key block. With sequence arrays its rows past
    // the entry's keys lie inside the tensor maps (which end at total_k, or at seqlen_k past a
    // seqused_k), so TMA loaded the next entry's rows or a cache's unused ones there, where the
    // padded layout's maps zero-fill. Their scores are masked, but P = 0 times a NaN or an
    // infinity in V is NaN in the tensor cores, and a row of this entry would be NaN for data
    // outside it: the rows are zeroed while S_0 runs (its V wait hidden under the GEMM), before
    // any consumer's P V reads the buffer. The consumers share the buffer, so each zeroes a
    // share and all meet at one barrier; every consumer reaches it after its own S_0 turn, and
    // none waits for a turn there (pingpong.h: the turn after S_0 is consumer 0's, which
    // consumer 1's S_0 hands it); before S_0 likewise (no turn taken yet in the tile). Not in
    // the padded variants.
    auto clear_v_tail = [&] {
      if constexpr (kSeqlens) {
        const int valid = w.seq.seqlen_k - (w.blocks.end - 1) * kBlockN;
        if (valid < kBlockN && (p.cu_seqlens_k != nullptr || p.seqused_k != nullptr)) {
          const RingSlot<Traits> slot(ring);
          ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarVFull + slot.stage), slot.parity);
          ptx::zero_rows_sw128<kBlockN, Traits::kAtoms * 8>(v_tile(slot.stage), valid,
                                                            consumer * 128 + threadIdx.x % 128,
                                                            128 * Traits::kConsumers);
          ptx::fence_proxy_async_shared();
          ptx::named_barrier_sync(ptx::NamedBarrier::kFwdConsumers, 128 * Traits::kConsumers);
        }
      }
    };
    // Under S_0 up to d = 128; at d = 256 before it (ptxas, sm_90a: under S_0 the ALiBi
    // variants spilled, 0 -> 4 / 28 bytes).
    constexpr bool kClearUnderS = kHeadDim <= 128;
    if constexpr (!kClearUnderS) clear_v_tail();
    // Step 0: S_0 alone (O is still 0, nothing to rescale).
    s_alone(0, [&] { clock.mark(kPhaseFirstK); }, [] {}, [&] {
      if constexpr (kClearUnderS) clear_v_tail();
    });
    pack_p(P0{});
    clock.mark(kPhaseFirstStep);
    static_assert(!Traits::kSerialPV || (!Traits::kEarlyRescale && !Traits::kSumsUnderS),
                  "kSerialPV: no next S GEMM to hide the rescale or the used sums under");
    // An overlapped step's start: K_i and V_{i-1} landed, this consumer's turn, S_i issued (its
    // commit group; P V_{i-1} is the caller's to issue, in the same turn). Returns S_i's keys.
    auto open_step = [&](int i, const RingSlot<Traits>& slot, const RingSlot<Traits>& prev) {
      clock.step_start();
      ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarKFull + slot.stage), slot.parity);
      ptx::mbarrier_wait_parity(bars + 8 * (Traits::kBarVFull + prev.stage), prev.parity);
      const BlockHalf s_half = half_of(w.blocks.end - 1 - i);
      clock.step(kStepWaitKV);
      turns.begin();
      clock.step(kStepTurn);
      ptx::wgmma_fence();
      issue_s(slot.stage, s_half);
      return s_half;
    };
    if constexpr (Traits::kSerialPV) {
#pragma unroll 1
      for (int i = 1; i < w.num_blocks; ++i) {
        // P_{i-1} V_{i-1}, retired (P's registers free), then S_i, retired, then softmax_i.
        clock.step_start();
        pv_alone(i - 1, P0{}, [] {});
        clock.step(kStepWaitPV);
        s_alone(i, [&] { clock.step(kStepWaitKV); }, [&] { clock.step(kStepS); }, [] {});
        clock.step(kStepExp);
        if constexpr (!kBounded) rescale_o();
        pack_p(P0{});
        clock.step(kStepPack);
      }
    } else if constexpr (Traits::kTwoP > 0) {
      // Step i with P_i into set `set` while P V_{i-1} reads the other (Traits::kTwoP; the
      // bounded reference: no row max, no O rescale). Level 1: P V_{i-1}'s wait and V_{i-1}'s
      // release after the exponentials (and the pack inside them). Level 2: no wait for P V in
      // the step: its wait<1> after S_i's issue retires P V_{i-2} with S_i (groups retire in
      // order), so V_{i-2}'s buffer is released there, one step later.
      constexpr bool kWaitInStep = Traits::kTwoP == 1;
      auto two_p_step = [&](int i, auto set) {
        using Prev = std::integral_constant<int, 1 - decltype(set)::value>;
        const RingSlot<Traits> slot(ring + i), prev(ring + i - 1);
        const BlockHalf s_half = open_step(i, slot, prev);
        issue_pv(prev.stage, half, Prev{});
        turns.end();
        if constexpr (kSumsLate) sum_used(Prev{});  // P_{i-1}'s
        half = s_half;
        ptx::wgmma_wait<1>();  // S_i (and P V_{i-2}) retired; P V_{i-1} may still run
        ptx::fence_operand(acc_s[0]);
        clock.step(kStepS);
        release(Traits::kBarKEmpty + slot.stage);
        if (!kWaitInStep && i >= 2) {
          release(Traits::kBarVEmpty + RingSlot<Traits>(ring + i - 2).stage);
        }
        if (!Traits::kOInQ && i == w.num_blocks - 1) release(q_empty);
        // P_i's pack (no wgmma reads this set now) inside each arm of the exponentials, where
        // ptxas may issue its F2FPs among the MUFUs (after them, in the arms' join, it did not).
        scores_to_p(w.blocks.end - 1 - i, ref, rescale, [&] { pack_p(set); });
        clock.step(kStepExp);
        if constexpr (kWaitInStep) {
          ptx::wgmma_wait<0>();  // P V_{i-1} done: its V buffer is free
          fence_o();
          release(Traits::kBarVEmpty + prev.stage);
        }
        clock.step(kStepPack);
      };
      int i = 1;
#pragma unroll 1
      for (; i + 1 < w.num_blocks; i += 2) {
        two_p_step(i, P1{});
        two_p_step(i + 1, P0{});
      }
      if (i < w.num_blocks) two_p_step(i, P1{});
    } else {
#pragma unroll 1
      for (int i = 1; i < w.num_blocks; ++i) {
        const RingSlot<Traits> slot(ring + i), prev(ring + i - 1);
        const BlockHalf s_half = open_step(i, slot, prev);
        if constexpr (Traits::kEarlyRescale) {
          // O (P V of step i - 2 has landed) to the row max of step i - 1, whose P the P V below
          // adds, while S_i runs on the tensor cores (step 0's factor is 0 on an O of 0).
          fence_o();
          rescale_o();
          fence_o();
          ptx::wgmma_fence();  // the FMULs' writes before the wgmma reads O
        }
        issue_pv(prev.stage, half, P0{});
        turns.end();
        if constexpr (kSumsLate) sum_used(P0{});  // P_{i-1}'s
        half = s_half;
        ptx::wgmma_wait<1>();  // S_i has landed; P_{i-1} V_{i-1} may still run
        ptx::fence_operand(acc_s[0]);
        clock.step(kStepS);
        release(Traits::kBarKEmpty + slot.stage);
        if (!Traits::kOInQ && i == w.num_blocks - 1) release(q_empty);
        // The step's tail, once its exponentials are done. The phase clock's marks stay in it
        // (Traits::kStamps, harness builds only): with kTailInExp their clock reads sit at the
        // end of each arm of the exponentials, where they may hold ptxas's interleave back, so
        // the `phases` split of such a build is the serial order's, not the knob's.
        auto tail = [&] {
          clock.step(kStepExp);
          ptx::wgmma_wait<0>();  // P_{i-1} V_{i-1} done: O and P's registers are free again
          fence_o();
          clock.step(kStepWaitPV);
          release(Traits::kBarVEmpty + prev.stage);
          if constexpr (!Traits::kEarlyRescale && !kBounded) {
            rescale_o();
          }
          // kTailInExp: O's rescaled registers through an empty asm in each arm, or NVVM sinks
          // the FMULs, the same in both arms, into the block after them (the PTX had the 64
          // mul.ftz.f32 after the vote's join, behind every MUFU.EX2 again); no instruction.
          if constexpr (kTailInExp) fence_o();
          pack_p(P0{});
          clock.step(kStepPack);
        };
        if constexpr (kTailInExp) {
          // Inside the exponentials (no dropout here: drop_p would do nothing).
          scores_to_p(w.blocks.end - 1 - i, ref, rescale, tail);
        } else {
          scores_to_p(w.blocks.end - 1 - i, ref, rescale, NoAfter{});
          drop_p(w.blocks.end - 1 - i);
          tail();
        }
      }
    }
    clock.mark(kPhaseSteps);
    // The last block's P V.
    if constexpr (Traits::kEarlyRescale) rescale_o();
    auto last_pv = [&](auto set) {
      pv_alone(w.num_blocks - 1, set, [&] {
        if constexpr (kSumsLate) sum_used(set);
        ahead();  // under the GEMM
      });
    };
    if constexpr (Traits::kTwoP > 0) {
      // P_{n-1} is in set (n - 1) % 2; the parity from lane 0, a branch ptxas sees warp-uniform
      // (wgmma under a branch it thinks divergent is serialized, C7520). Level 2: pv_alone's
      // wait<0> retired P V_{n-2} too: V_{n-2}'s buffer, not yet released (two_p_step), goes now.
      if (__shfl_sync(0xffffffffu, (w.num_blocks - 1) & 1, 0)) {
        last_pv(P1{});
      } else {
        last_pv(P0{});
      }
      if (Traits::kTwoP == 2 && w.num_blocks >= 2) {
        release(Traits::kBarVEmpty + RingSlot<Traits>(ring + w.num_blocks - 2).stage);
      }
    } else {
      last_pv(P0{});
    }
    clock.mark(kPhaseLastPV);
  } else {
    ahead();
  }

  store_tile_output<Element, Traits, kVariant, kBounded>(tp, w, s_base, consumer, qs, softmax,
                                                         used_acc, acc_o);
  clock.mark(kPhaseEpilogue);
  clock.count(w.num_blocks);
}

}  // namespace flashattn_cu::sm90
