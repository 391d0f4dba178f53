// The sm90a forward's compile-time configuration (FwdTraits: tile, ring, roles, register
// budgets, shared-memory layout, tuning knobs) and its kernel parameters (FwdTmaParams), apart
// from the kernel (fwd_kernel.h) that both describe.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "../problem/params.h"

namespace flashattn_cu::sm90 {

// The forward's kernel parameters on this path: the arch-neutral ones and the TMA maps of q, k
// and v (encoded per call on the host, fwd_launch.h).
struct FwdTmaParams {
  CUtensorMap q_map;  // boxes of 64 columns x kQPartRows rows (kBlockM unless kSplitQ)
  CUtensorMap k_map;  // 64 columns x Traits::kKVBoxRows rows
  CUtensorMap v_map;
  FwdKernelParams kp;
  int group_heads;  // the tile order (problem/scheduler.h: query_tile_at); 0: query_tile's
  int defer_m = 0;  // query_tile_at's light leading query blocks, walked last (fwd_schedule;
                    // fwd_work.h kernel_defer_m: which kernels read it)
  // The rows by which the query blocks sit above multiples of kBlockM (problem/mask.h
  // Mask::query_block_shift; fwd_launch.h fwd_m_shift): a padded call's, from the launch, or
  // fwd_work.h kFwdEntryShift: each varlen entry's own, worked out in fwd_work.
  int m_shift = 0;
  // Traits::kStamps kernels only (benchmarks/tune/tune_fwd90.cu `phases`): fwd_clock.h's sums.
  unsigned long long* stamps = nullptr;
  CUtensorMap o_map;  // Traits::kTmaStoreO only: boxes of 64 columns x 64 rows (one consumer's)
  // Traits::kTmaStoreO: o_map describes o (fwd_launch.h: a padded call whose o TMA can write);
  // otherwise the kernel stores O from the registers.
  bool o_tma = false;
  // The kernels whose producer hands out the tiles (fwd_work.h fwd_published_tiles): non-null,
  // the dynamic scheduler's counter (zeroed before the launch; a CTA's first tile is its index,
  // each next one gridDim.x + the counter's next value); null, cta_tile_index's static walk.
  int* tile_counter = nullptr;
  // A varlen call's compact tiles within an entry block after block (problem/scheduler.h
  // query_tile_of block_major) instead of head after head (fwd_launch.h: set_fwd_varlen_order).
  bool varlen_block_major = false;
};

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, bool kPingPong_ = true,
          int kPolyEighths_ = 0, int kHalves_ = 0, bool kWarpFusedExp_ = false,
          bool kStamps_ = false, int kTmaStoreO_ = 0, bool kCapAfterMax_ = true,
          bool kEarlyRescale_ = false, bool kMaxTree_ = false, bool kSumTree_ = false,
          bool kModsPerTile_ = true, bool kCapInterleave_ = false,
          bool kBoundedRef_ = false, bool kSumsUnderS_ = false, bool kSerialPV_ = false,
          bool kDoubleQ_ = false, bool kSplitQ_ = false, bool kPrefetchMaps_ = false,
          bool kPublishTiles_ = false, int kLazyRescale_ = 0, bool kSkipKept_ = false,
          bool kSumsWgmma_ = false, int kTailInExp_ = 0, int kTwoP_ = 0, bool kPairKV_ = false>
struct FwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  // The overlapped step's tail (the wait for P_{i-1} V_{i-1}, O's fence, V's release, O's
  // rescale and P_i's pack) inlined at the end of each arm of the exponentials (common/softmax.h
  // exponentiate's `after`: the two arms of the kWarpFused vote) instead of after them: the
  // vote's branch put the tail in a basic block of its own, so ptxas ran its d / 2 FMULs and
  // kBlockN / 4 F2FPs a thread after the MUFU.EX2 stream rather than among them (FlashAttention-4's
  // sm90 kernel, from the same PTX order, gets its O rescale interleaved with the MUFUs). The
  // same instructions on the same values, so the outputs are bitwise the order's without it.
  // A level: 0 off; 1 on the plain scores' path (running max, late rescale) of a step without
  // dropout (fwd_consumer.h kTailInExp); 2 also on softcap's max over the raw scores and with the
  // early rescale (there the tail is the wait, V's release and the pack). Never with the serial
  // order (no P V in flight) nor the bounded reference (fwd_consumer.h says why). The library
  // takes level 2 on every two-consumer tile (knobs.h fwd_tail_in_exp_sm90: level 1 0.95-0.99x
  // the time, three consumers 1.03-1.10x, tune_fwd90 `tailinexp`, benchmarks/NOTES.md 12.97;
  // level 2 over level 1 0.96-0.99x with d = 256's early rescale, softcap neutral, `tailmods`).
  static constexpr int kTailLevel = kSerialPV_ ? 0 : kTailInExp_;
  // The bounded reference's P in two register sets, alternating by step (fwd_consumer.h kTwoP):
  // step i packs P_i into the set P V_{i-1} does not read, so the pack needs no wait for P V and
  // issues inside the exponentials' arms, among the MUFUs. Level 1: the wait for P V_{i-1}
  // (wgmma wait<0>) and V_{i-1}'s release after the exponentials' join, where P V_{i-1}, issued
  // before them, has long finished (the one-set order's wait, minus the pack behind it); level 2:
  // no wait in the step at all (the next step's wait<1> retires P V_{i-1}, groups retiring in
  // order), V_{i-1}'s buffer released one step later (and the producer, which loads K_{j+1}
  // after V_j, with it). The bounded reference only (it has no O rescale, the one other reason
  // for the wait); the steady loop is unrolled by two (each set's registers by constant index).
  // A tuning knob (knobs.h fwd_two_p_sm90), off until measured.
  static constexpr int kTwoP = kBoundedRef_ && !kSerialPV_ ? kTwoP_ : 0;
  // Two CTAs of a thread-block cluster on adjacent query tiles of one head share each K / V
  // block: each loads half its rows (kKVBoxRows) by TMA multicast into both CTAs' shared memory,
  // so L2 serves every block once per pair instead of once per tile (ncu, d = 128 8k on an H100:
  // our L2 read sectors 1.4x FlashAttention-4's, whose requests the L2's coalescer merged 1.71x
  // against our 1.23x, benchmarks/NOTES.md 12.101). A stage is free for either producer once
  // both CTAs' consumers released it: every consumer warp arrives on its own CTA's empty barrier
  // and on the partner's (kKVEmptyArrivals). The static walk on padded, non-causal calls with an
  // even count of query tiles (fwd_launch.h refuses the rest); a tuning knob, off in the library
  // until tune_fwd90 `pairkv` has measured it.
  static constexpr bool kPairKV = kPairKV_;
  // The bounded reference's used sums by wgmma instead of mma.sync: one m64n8k16 per P fragment
  // against a tile of ones in shared memory (kOffOnes), issued right after the step's P V wgmmas
  // in their commit group, so the tensor cores' async queue runs them beside P V (N = 8: 1/16 of
  // d = 128's P V work) where an mma.sync issued among in-flight wgmmas waits for the tensor
  // pipe. The accumulator fragment of m64n8 is mma.sync m16n8's, so used_acc and the epilogue are
  // the same; the sums then enter at P V's issue, exactly when P enters O. A tuning knob (knobs.h
  // fwd_sums_wgmma_sm90, which says where it won; tune_fwd90 `sumswgmma`), on only with the
  // bounded reference, so that the others neither fill nor hold the ones tile.
  static constexpr bool kSumsWgmma = kSumsWgmma_ && kBoundedRef_;
  // With the running max (kLazyRescale 0): a row whose max a key block did not raise takes the
  // factor 1 without its exponential, and a warp whose 16 rows all kept theirs skips O's rescale
  // (common/softmax.h new_max kKeep; the d / 2 FMULs a thread of kLazyRescale's skip), every
  // output bitwise the running max's: what the lazy reference gained on rows whose max settles,
  // without its accuracy cost (benchmarks/NOTES.md 12.93). A tuning knob (knobs.h
  // fwd_skip_kept_sm90, which says where it won; tune_fwd90 `skipkept`).
  static constexpr bool kSkipKept = kSkipKept_ && kLazyRescale_ == 0;
  // b > 0: each row's exponents against a lazy reference (common/softmax.h new_max kLazyLog2),
  // which moves, rescaling O, only where a key block's max passes it by more than 2^b in P; a
  // warp whose rows all keep theirs skips O's rescale (d / 2 FMULs a thread on a consumer's path
  // between its P V landing and its next turn, benchmarks/NOTES.md 12.79). 0: the running max,
  // O rescaled at every step. A tuning knob (tune_fwd90 `lazy`; knobs.h fwd_lazy_rescale_sm90).
  static constexpr int kLazyRescale = kLazyRescale_;
  // (The lazy reference with O's 1 / l from the used sums of the 16-bit P, FwdTraits kLazySums of
  // sessions 67-68, is gone: its largest error was the running max's, but by mma.sync it cost
  // 7-24% of the step and by wgmma 4-7% against the running max, benchmarks/NOTES.md 12.93 /
  // 12.95.)
  // The producer hands out the walk's tiles through shared memory (fwd_work.h
  // fwd_published_tiles, which also takes them for the varlen-decoding instances), so the call
  // may run on the dynamic scheduler: a tuning knob (tune_fwd90 `dyn256`).
  static constexpr bool kPublishTiles = kPublishTiles_;
  // The CTA's first thread prefetches the TMA maps' descriptors (prefetch.tensormap) before
  // the barriers' init, so the producer's first loads do not wait for them: a CTA that runs one
  // tile (the grid of one CTA per tile: long causal rows, varlen, d = 256 short causal rows)
  // pays that fetch once per tile. A tuning knob (tune_fwd90 `prefetch`); the decode kernel's
  // timeline had no gain from it (benchmarks/NOTES.md 12.9 item 3).
  static constexpr bool kPrefetchMaps = kPrefetchMaps_;
  // Q in one part per consumer (its 64 rows), each with its own full and empty barriers: the
  // producer loads a consumer's part of the next tile's Q as soon as that consumer is done with
  // its part of this one (its last S GEMM, or with kOInQ its O store), so the consumer a
  // ping-pong turn ahead starts its next tile without waiting for the other's epilogue. The
  // phase clocks (benchmarks/NOTES.md 12.9) had a tile's first GEMM wait 2,000-3,700 cycles
  // for its Q where O is staged in Q's buffer (d = 256), 250-480 elsewhere. A tuning knob
  // (tune_fwd90 `splitq`; tiles.h fwd_split_q_sm90, a build flag, off by default).
  static constexpr bool kSplitQ = kSplitQ_;
  // Two Q buffers, which the CTA's tiles with key blocks take in turn (fwd_work.h QSlot), so the
  // producer loads the next tile's Q while this one runs instead of once its last S GEMMs are
  // done: the phase clocks (benchmarks/NOTES.md 12.9) had a tile's first GEMM wait 250-480
  // cycles for its Q on the persistent grid. A tuning knob (tune_fwd90 `doubleq`); not with O
  // staged in Q's buffer (kOInQ).
  static constexpr bool kDoubleQ = kDoubleQ_;
  // A consumer's step with its two GEMMs one after the other: O += P_{i-1} V_{i-1} issued and
  // retired, then S_i issued and retired, then softmax_i (false: S_i and P_{i-1} V_{i-1} issued
  // together, softmax_i under the P V). Without the overlap a consumer never holds S and P at
  // once (O + S registers instead of O + S + P), which lets three consumers (192-row tiles,
  // 160 registers) run at d = 128, each one's softmax hidden under the other two's GEMMs
  // instead of under one's. A tuning knob (tune_fwd90 `serial3`).
  static constexpr bool kSerialPV = kSerialPV_;
  // Softcap alone in bf16 (problem/score_mod.h ScoreScale::bounded_ref, which the launch must
  // hold): each row's exponents against a reference fixed at its first key block
  // (common/softmax.h fix_reference), so no step after it takes a row max or rescales O; 1 / l
  // from the sums of the 16-bit P the P V product read (one mma.sync per P fragment against a
  // ones column, as the sm80 kernel); inert in the other variants. knobs.h
  // fwd_bounded_ref_sm90 says where (tune_fwd90 `bounded`, benchmarks/NOTES.md 12.33).
  static constexpr bool kBoundedRef = kBoundedRef_;
  // With kBoundedRef: the used sums' 11 dependent mma.sync of a step issued right after the next
  // step's GEMMs (under the S GEMM's wait) instead of after the pack, where their chain sits
  // between the pack and the next turn. A tuning knob (tune_fwd90 `bounded3`).
  static constexpr bool kSumsUnderS = kSumsUnderS_;
  // With kCapAfterMax, on key blocks without an element mask: each score's tanh issued in the
  // exponentials' loop (common/softmax.h exponentiate_mapped) instead of as a pass over the tile
  // before them (the library's SASS: MUFU.TANH x 88, then MUFU.EX2 x 88 a lane at d = 128).
  // knobs.h fwd_cap_interleave_sm90 says where (tune_fwd90 `capinterleave`, benchmarks/NOTES.md
  // 12.33).
  static constexpr bool kCapInterleave = kCapInterleave_;
  // The score modifiers built once a tile (problem/score_mod.h ScoreMods: ALiBi's slope load and
  // division out of the step loop); false builds them at every key block (apply_score_mods).
  // knobs.h fwd_mods_per_tile_sm90 says where (tune_fwd90 `alibihoist`).
  static constexpr bool kModsPerTile = kModsPerTile_;
  // A step's row sums as pairwise trees over the finished exponentials (common/softmax.h
  // ExpPolicy kSumTree) instead of a serial FADD chain per row fed by each MUFU.EX2 in turn
  // (the library's SASS at d = 128: MUFU, FADD, MUFU, FADD, each FADD waiting on its MUFU and on
  // the one before it): a tuning knob (the phase clocks had the exponentials at 1,229 cycles of
  // a d = 128 step for 704 of SFU work).
  static constexpr bool kSumTree = kSumTree_;
  // A step's row max as a pairwise tree (common/softmax.h new_max kTree) instead of a serial
  // chain: a tuning knob (the phase clocks had the max at 674 of a d = 128 step's 3,618 cycles).
  static constexpr bool kMaxTree = kMaxTree_;
  // Where a step rescales O by the new row max: false, after its P V has landed (the step's
  // softmax, then the wait, then d / 2 FMULs a thread before P is packed: on the consumer's
  // path to its next turn); true, one step later, between the next step's S GEMM and its P V
  // issue (FlashAttention-3's order), where the FMULs run under the S GEMM on the tensor cores.
  static constexpr bool kEarlyRescale = kEarlyRescale_;
  // Softcap without ALiBi, on key blocks with no element mask: the row max over the raw scores
  // (tanh is monotone), so the max reduction runs beside the tiles' MUFU.TANH stream instead of
  // after it (common/softmax.h new_max_capped); off: the tanh of every score, then the max.
  static constexpr bool kCapAfterMax = kCapAfterMax_;
  // Harness only: the consumers' phase clocks (fwd_clock.h) to FwdTmaParams::stamps.
  static constexpr bool kStamps = kStamps_;
  // The epilogue through shared memory and one TMA store per consumer (sw128 boxes of 64 rows),
  // instead of 4-byte stores from the registers (0): 1 stages O in boxes of its own after the
  // barriers (for the tiles with shared memory to spare); 2 stages each consumer's rows in its
  // own rows of Q's buffer, which then holds the next tile's Q only once the store has read
  // them (Q's empty barrier completes on the stores instead of the last S GEMMs, and the
  // producer issues a tile's first K / V block before its Q). tiles.h fwd_tile_sm90* say which
  // tiles take which (benchmarks/tune/tune_fwd90.cu `tmastore`). Padded calls only (the map
  // clips rows past seqlen_q, but a varlen tile's rows past its entry are the next entry's):
  // a varlen call's kernel stores from the registers (FwdTmaParams::o_tma).
  static constexpr int kTmaStoreO = kTmaStoreO_;
  static constexpr bool kOInQ = kTmaStoreO_ == 2;
  // kPolyEighths / 8 of S's 8-key tiles exponentiated on the FMA pipe (common/softmax.h
  // ExpPolicy, exp2_fma) instead of MUFU.EX2; knobs.h fwd_poly_eighths_sm90 says where.
  static constexpr int kPolyEighths = kPolyEighths_;
  // The plain exponent as one FFMA where a warp's row maxima allow (common/softmax.h ExpPolicy
  // kWarpFused); on in the library (fwd_launch.h), measured in benchmarks/NOTES.md 12.5.
  static constexpr bool kWarpFusedExp = kWarpFusedExp_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kConsumers = kBlockM / 64;  // consumer warpgroups, 64 query rows each
  // Q's parts (kSplitQ: one per consumer, its rows; else the whole tile) and their rows.
  static constexpr int kQParts = kSplitQ ? kConsumers : 1;
  static constexpr int kQPartRows = kBlockM / kQParts;
  // Arrivals that complete a Q part's empty barrier: every warp of the consumers reading it after
  // their last S GEMM, or (kOInQ) each such consumer's one storing thread once its store has
  // read the staged rows.
  static constexpr int kQEmptyArrivals = (kOInQ ? 1 : 4) * kConsumers / kQParts;
  // Two consumers take turns issuing their GEMMs (named barriers kPingPong0/1), so one
  // warpgroup's softmax runs while the other's GEMMs keep the tensor cores busy.
  static constexpr bool kPingPong = kPingPong_ && kConsumers == 2;
  static constexpr int kNThreads = 128 * (kConsumers + 1);
  static constexpr int kAtoms = (kHeadDim + 63) / 64;  // 64-column sw128 atoms of a row
  static constexpr int kChunks = kHeadDim / 8;         // 16-byte chunks of a row in global memory
  static constexpr int kNTiles = kBlockN / 8;          // 8-key accumulator tiles of S
  // Half blocks: a boundary key block of which a consumer's 64 rows see only the first or only
  // the last kHalfKeys keys (the causal diagonal, a window's left edge, the sequence tail).
  // kHalves_ 1: its P V runs over those keys alone (P is 0 on the others, so this is exact
  // whatever S did); 2: its S too, which ptxas compiles with every wgmma serialized ("insufficient
  // register resources for the wgmma pipeline", C7511; 25-35% slower on the H200); 0: off, the
  // library's (1 measured 3% slower over the benchmark's forward shapes, the window no faster:
  // benchmarks/NOTES.md 12.2). A tuning knob. 2 needs wgmma N = kHalfKeys generated
  // (scripts/gen_wgmma.py NS; its dispatcher's static_assert says so otherwise).
  static constexpr int kHalfKeys = (kBlockN / 2 + 15) / 16 * 16;
  static constexpr bool kHalfBlocks = kHalves_ > 0 && kHalfKeys < kBlockN;
  static constexpr bool kHalfS = kHalves_ >= 2;
  static constexpr int kDTiles = kHeadDim / 8;         // 8-column accumulator tiles of O
  static constexpr uint32_t kQBytes = kAtoms * kBlockM * 128;
  static constexpr uint32_t kKVBytes = kAtoms * kBlockN * 128;
  // The rows of a K / V box (the TMA maps' box height): the whole block, or with kPairKV the half
  // each CTA of the pair loads (rank r: rows r * kKVBoxRows ..).
  static constexpr int kKVBoxRows = kPairKV ? kBlockN / 2 : kBlockN;
  // Arrivals that complete a K / V stage's empty barrier: every consumer warp's, of both CTAs
  // with kPairKV.
  static constexpr int kKVEmptyArrivals = 4 * kConsumers * (kPairKV ? 2 : 1);
  static constexpr int kQStages = kDoubleQ ? 2 : 1;  // Q buffers
  // Shared memory: kQStages Q tiles, kStages K tiles, kStages V tiles (each atom 1024-byte
  // aligned: kBlockM and kBlockN are multiples of 8), then the barriers.
  static constexpr uint32_t kOffQ = 0;
  static constexpr uint32_t kOffK = kOffQ + kQStages * kQBytes;
  static constexpr uint32_t kOffV = kOffK + kStages * kKVBytes;
  static constexpr uint32_t kOffBarriers = kOffV + kStages * kKVBytes;
  // Barrier indices: Q full and Q empty per Q buffer and part (q_bar), then per stage K full,
  // V full, K empty, V empty.
  static constexpr int kBarQFull = 0;
  static constexpr int kBarQEmpty = kQStages * kQParts;
  static constexpr int kBarKFull = 2 * kQStages * kQParts;
  static constexpr int kBarVFull = kBarKFull + kStages;
  static constexpr int kBarKEmpty = kBarKFull + 2 * kStages;
  static constexpr int kBarVEmpty = kBarKFull + 3 * kStages;
  static constexpr int kNumBarriers = 2 * kQStages * kQParts + 4 * kStages;
  // The index of Q buffer `stage`'s part `part` barrier of kind `base` (kBarQFull / kBarQEmpty).
  static constexpr int q_bar(int base, int stage, int part) {
    return base + stage * kQParts + part;
  }
  // The Q part consumer `consumer` reads.
  static constexpr int q_part(int consumer) { return kSplitQ ? consumer : 0; }
  // The producer's published tiles (fwd_work.h fwd_published_tiles; fwd_producer.h): a ring of
  // kTileSlots slots of kTileSlotBytes (the tile's index, QueryTile, then SeqInfo's lengths and
  // starts: 8 ints) after the barriers, then each slot's full and empty barrier.
  static constexpr int kTileSlots = 2;
  static constexpr uint32_t kTileSlotBytes = 32;
  static constexpr uint32_t kOffTileSlots = (kOffBarriers + 8 * kNumBarriers + 15) / 16 * 16;
  static constexpr uint32_t kOffTileBars = kOffTileSlots + kTileSlots * kTileSlotBytes;
  static constexpr uint32_t kTileEnd = kOffTileBars + 8 * 2 * kTileSlots;
  // kTmaStoreO 1: each consumer's O staging, kAtoms boxes of 64 rows x 128 bytes, after the
  // barriers and the tile slots (1024-byte aligned: sw128).
  static constexpr uint32_t kOBoxBytes = 64 * 128;
  static constexpr uint32_t kOffO = (kTileEnd + 1023) / 1024 * 1024;
  static constexpr uint32_t kOEnd =
      kTmaStoreO == 1 ? kOffO + kConsumers * kAtoms * kOBoxBytes : kTileEnd;
  // kSumsWgmma: the ones tile, one sw128 atom of 8 rows (1024 bytes, 1024-byte aligned), read as
  // the B operand (N 8 x K 16) of every k-step's sums (its contents are all ones, so which of its
  // addresses the swizzle picks does not matter).
  static constexpr uint32_t kOnesBytes = 1024;
  static constexpr uint32_t kOffOnes = (kOEnd + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes =
      (kSumsWgmma ? kOffOnes + kOnesBytes : kOEnd) + 1024;  // + alignment slack
  // Register budgets (setmaxnreg): the producer needs few; the consumers take the rest of the
  // 64K registers (2 consumers: 128 x 24 + 256 x 240; 3: 128 x 32 + 384 x 160).
  static constexpr int kProducerRegs = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;

  static_assert(kConsumers == 2 || kConsumers == 3, "2 or 3 consumer warpgroups");
  static_assert(!kDoubleQ || !kOInQ, "kDoubleQ: not with O staged in Q's buffer");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "key blocks of whole k16 steps, wgmma N <= 256");
  static_assert(kHeadDim % 16 == 0, "head dims of whole k16 steps");
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= 65536, "register file");
  static_assert(kSmemBytes <= 227 * 1024, "fits the sm_90 shared memory");
  static_assert(!kPairKV || kBlockN % 16 == 0,
                "kPairKV: half blocks of whole 8-row swizzle atoms (1024-byte aligned)");
  static_assert(!kPairKV || !kPublishTiles_, "kPairKV: the static walk only");
};

}  // namespace flashattn_cu::sm90
