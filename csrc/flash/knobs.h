// The forward's softmax step, by instance: which knobs of its instruction order (sm90/
// fwd_traits.h, sm80/fwd_kernel.h FwdTraits) the library takes where, each with the measurements
// that chose it: the exponentials on the FMA pipe, softcap's order, the bounded reference, ALiBi's
// slope per tile, the early rescale, the lazy reference, the skipped rescale, the used sums by
// wgmma, the step's tail inside the exponentials, the max and sum trees. Build flags override
// the rules for A/Bs. The tiles and schedules are in tiles.h, which includes this file.
#pragma once

namespace flashattn_cu {

// Eighths of S's 8-key tiles the sm90a forward exponentiates on the FMA pipe (common/softmax.h
// ExpPolicy, exp2_fma), per head dim and kernel variant: 2 for softcap at d = 64, else none, as
// measured. Softcap spends two MUFU per score (tanh and exp2). ncu at 81d0a3a
// (results/ncu_fwd90_softcap_h200_81d0a3a.txt, 8k non-causal, static tiles): at d = 64 the XU
// pipe runs at 74% of its peak and MIO throttle (the SFU's queue full) is 28% of the stall
// samples, most at MUFU.EX2, while the FMA pipe is at 17%; at d = 128 XU 61%, tensor 59% (plain:
// 39% / 76%). Measured (tune_fwd90 `mods3`, results/tune_fwd90_v15_mods3_h200.txt, softcap 30,
// TFLOP/s e0 -> e2, mean of two passes, 4k / 16k non-causal, 4k / 16k causal): d = 64 static
// 192 x 128 324 -> 339, 348 -> 364, 294 -> 298, 329 -> 335 (e3 +2%, e4 -4%); d = 128 128 x 176
// within the spread (-3 to +6%), d = 256 128 x 80 mixed (+8% at 4k non-causal, -4% at 16k
// causal): none there. The plain d = 64 kernel lost 6-9% with 2 eighths (tune_fwd90_v4_mods);
// plain d = 128 / 256 are not measured yet (tune_fwd90 `plainexp`, NOTES 12.11). The dynamic
// softcap variant at d = 64 takes the same share (its 128 x 128 tile gained 2-3% with 4 eighths,
// tune_fwd90_v4/v5), and so does ALiBi + softcap there (not measured on its own).
__host__ __device__ constexpr int fwd_poly_eighths_sm90(int head_dim, bool softcap) {
  return softcap && head_dim == 64 ? 2 : 0;
}

// The softcap variants' row max over the raw scores (FwdTraits kCapAfterMax), measured on the
// H200 (tune_fwd90 `mods2`, benchmarks/results/tune_fwd90_v14_mods2_h200.txt; softcap 30,
// TFLOP/s off -> on, 4k / 16k non-causal, 4k / 16k causal): d = 128 static 128 x 176 492 -> 526,
// 491 -> 534, 439 -> 462, 502 -> 536 (dynamic 128 x 128 +1-6%); d = 64 dynamic 128 x 128 304 ->
// 281, 329 -> 293, 289 -> 255, 327 -> 291, static 192 x 128 -1-3%. With each score's tanh issued
// in the exponentials' loop (kCapInterleave, fwd_cap_interleave_sm90) the raw max measured
// otherwise (tune_fwd90 `capinterleave`, `capinterleave2`, benchmarks/results/
// tune_fwd90_v33_capinterleave_h200.txt; time with both / the library's, 4k / 16k non-causal then
// causal, two passes): d = 64 static (192 x 128) 0.951 0.942 0.952 0.955 / 0.952 0.943 0.957
// 0.955 (the raw max alone 1.001-1.040), d = 256 dynamic (128 x 64) 0.920 0.908 0.944 0.922 /
// 0.923 0.905 0.946 0.924; but d = 64 dynamic 1.099-1.112, d = 256 static (128 x 80, 32 bytes of
// spills) 1.016-1.021, d = 128 static 1.063-1.125 and dynamic 1.039-1.046 (against the raw max
// alone). `softcap`: a softcap variant's instance (the knobs do nothing in the others);
// `static_mask`: the static-mask one (problem/mask.h kStaticSoftcapVariant); d = 96 and 192 not
// measured.
__host__ __device__ constexpr bool fwd_cap_interleave_sm90(int head_dim, bool softcap,
                                                          bool static_mask) {
  return softcap && ((head_dim == 64 && static_mask) || (head_dim == 256 && !static_mask));
}
__host__ __device__ constexpr bool fwd_cap_after_max_sm90(int head_dim, bool softcap,
                                                         bool static_mask) {
  return head_dim == 128 || fwd_cap_interleave_sm90(head_dim, softcap, static_mask);
}

// Where the sm90a forward's bf16 softcap calls that problem/score_mod.h ScoreScale::bounded_ref
// admits (softcap <= 52.7) take the bounded reference (FwdTraits kBoundedRef: no row max and no O
// rescale after a row's first key block, 1 / l from mma.sync sums of the 16-bit P; an instance of
// its own beside the running max's). Measured on the H200 (tune_fwd90 `bounded`,
// benchmarks/results/tune_fwd90_v35_bounded_h200.txt; time bounded / the library's, softcap 30,
// 4k / 16k non-causal then causal, two passes): d = 128 static (128 x 176) 0.960 0.953 0.975
// 0.955 / 0.960 0.953 0.979 0.958, dynamic (128 x 128) 0.882 0.872 0.891 0.881 / 0.880 0.867
// 0.898 0.884, d = 64 static (192 x 128, 48 bytes of spills) 0.906 0.890 0.923 0.895 / 0.909
// 0.891 0.924 0.896; d = 256 static (128 x 80) 1.052-1.078 (slower). The dynamic instances
// (tune_fwd90 `bounded4`, results/tune_fwd90_v38_bounded4_h200.txt, same order): d = 64
// (128 x 128) 0.887 0.876 0.912 0.895 / 0.887 0.876 0.914 0.892; d = 256 (128 x 64) 0.995 0.999
// 0.998 1.025 / 0.997 1.000 1.000 1.025 (off). d = 96 and 192 not measured (off).
__host__ __device__ constexpr bool fwd_bounded_ref_sm90(int head_dim, bool softcap,
                                                       [[maybe_unused]] bool static_mask) {
  return softcap && (head_dim == 128 || head_dim == 64);
}

// Where a static-mask softcap call on the bounded reference takes fwd_tile_sm90_short's tile
// (its own instance: the static softcap variant, bounded, 128 x 128) instead of the static
// 128 x 176 (longer rows) or, for fwd_short_rows_sm90's calls, the dynamic variant's 128 x 128.
// Measured on the H200 (tune_fwd90 `bounded2` / `bounded3`, benchmarks/results/
// tune_fwd90_v36_bounded2_h200.txt and v37_bounded3; bf16, softcap 30, time 128 x 128 / 128 x
// 176, two passes): causal 1k 0.833 0.825, 2k 0.886 0.887, 4k 0.929 0.928, 8k 0.988 0.989, 16k
// 1.013 1.011; non-causal 4k 0.980 0.981, 16k 1.025 1.024. d = 64's bounded instance on 128 x
// 128 was slower everywhere (1.07-1.26); d = 128 only.
__host__ __device__ constexpr bool fwd_bounded_short_sm90(int head_dim, bool causal,
                                                         int seqlen_k) {
  return head_dim == 128 && (causal ? seqlen_k <= 8192 : seqlen_k <= 4096);
}

// Where the sm90a forward builds its score modifiers once a tile (FwdTraits kModsPerTile:
// ALiBi's slope load and MUFU.RCP out of the step loop) rather than at every key block. Measured
// on the H200 (tune_fwd90 `alibihoist`, benchmarks/results/tune_fwd90_v31_alibihoist_h200.txt;
// interleaved, time once a tile / every block, 4k / 16k non-causal then causal, two passes):
// static ALiBi d = 64 (192 x 128, max tree and early rescale) 1.026-1.037 (slower; why is not
// established), d = 128 0.984-1.003, d = 256 0.972-0.983, the dynamic variant at d = 64
// 0.979-0.987: everywhere but d = 64's static ALiBi instance.
__host__ __device__ constexpr bool fwd_mods_per_tile_sm90(int head_dim, bool static_alibi) {
  return !(head_dim == 64 && static_alibi);
}

// Where the sm90a forward rescales O by a step's new row max (FwdTraits kEarlyRescale): under
// the next step's S GEMM (FlashAttention-3's order) for the static variant's long-row tile at
// d = 256, whose O is 128 fp32 a thread; everywhere else after the step's own P V. Measured on
// the H200 (tune_fwd90 `early`, benchmarks/results/tune_fwd90_v19_early_h200.txt; calls
// interleaved, median time ratio early / late over 30 rounds): d = 256 128 x 80 0.980-0.987 at
// 2k-16k non-causal and 0.982-0.993 causal (1k 0.996 / 1.003); d = 256 128 x 64 (short rows)
// 1.026-1.034; d = 128 128 x 176 0.999-1.006; d = 128 128 x 128 (short rows, window) 1.016-1.031;
// softcap d = 128 1.011-1.019; d = 64 0.997-1.014, its window 1.015-1.018.
// The static ALiBi instance at d = 64 takes it with the max tree below (tune_fwd90
// `alibichain`, results/tune_fwd90_v26_alibichain_h200.txt; time with both / without, 4k /
// 16k non-causal then causal, two passes: 0.979 0.975 0.976 0.967 / 0.979 0.973 0.977 0.968;
// the early rescale alone 1.002-1.008, the max tree alone 0.970-0.988): its bias's FFMAs
// lengthen the chain S -> max -> exponentials that a step waits on (benchmarks/NOTES.md 12.29).
// Not at d = 128 (static ALiBi 128 x 176, tune_fwd90 `alibichain128`,
// results/tune_fwd90_v27_alibichain128_h200.txt: the max tree 0.995-1.005, both 1.005-1.013).
__host__ __device__ constexpr bool fwd_early_rescale_sm90(int head_dim, bool static_long_rows,
                                                          bool static_alibi = false) {
  return (head_dim == 256 && static_long_rows) || (head_dim == 64 && static_alibi);
}

// The sm90a forward's lazy reference (sm90/fwd_traits.h kLazyRescale, common/softmax.h new_max
// kLazyLog2): each row's exponents against a reference that moves only where a key block's max
// passes it by more than 2^b in P, O rescaled only by a warp with a row that moved. Why it pays
// (benchmarks/NOTES.md 12.79): O's rescale is d / 2 FMULs a thread at every key block, between
// the P V wait and the next turn: 64 of the d = 128 step's ~615 instructions a warp, 128 of
// d = 256's ~400. Measured (tune_fwd90 `lazy`, H100 at c09dfe7, bf16, the library's tiles and
// schedule, interleaved, two passes alike; benchmarks/NOTES.md 12.83, results/
// tune_fwd90_lazy_h100_c09dfe7.txt; time b = 8 / running max, 4k / 8k / 16k non-causal, then
// causal): the static variant's long rows d = 64 192 x 128 0.970-0.974, 0.973-0.982; d = 128
// 128 x 176 0.991-0.995, 0.989-0.995; d = 256 128 x 80 0.979-0.981, 0.982-0.993; the short rows
// (1k) d = 128 128 x 128 0.965 / 0.968, 0.979 / 0.980, but d = 64 128 x 128 1.003 / 1.008, 1.006 /
// 1.011; d = 64's static ALiBi instance 1.028-1.030, 1.013-1.016 (its bias moves the max along
// the row). Then (tune_fwd90 `lazydyn`, H100 at 9f4d455, the same method; NOTES 12.89,
// results/tune_fwd90_lazydyn_h100_9f4d455.txt) the instances that rule had left out: the padded
// window (1024, 0) at 8k / 16k d = 128 0.978-0.979, d = 256 0.947-0.948, d = 64 1.037-1.039; the
// dynamic variant (varlen, seqused_k) on padded rows at 4k / 16k, non-causal then causal, d = 128
// 0.974-0.977, 0.944-0.975, d = 64 1.006-1.017, 0.989-1.003; static ALiBi d = 128 1.018-1.025,
// 1.003-1.009, d = 256 0.967-0.985, 0.915-0.959. So b = 8 where it won (session 63 to 67), the
// running max elsewhere, until its accuracy cost was measured: now the running max everywhere by
// default (the dropout and dynamic-modifier instances and d 96 / 192 are not measured;
// softcap's bounded max has no use for it). The build flag FLASHATTN_CU_FWD_LAZY_RESCALE = b >= 0
// gives b to every instance but softcap's and d = 256's dynamic and dropout ones
// (`spills_at_256`: there it moved ptxas's allocation, sm_90a fp16 0 -> 8-12 bytes of spills,
// 4 / 8 -> 12 / 20), 0 none.
// FLASHATTN_CU_FWD_LAZY_TIMED=1: b = 8 on the instances where it won on time (the library's
// default from session 63 to 12.93), for A/Bs against the running max; 0 (the default) none.
#ifndef FLASHATTN_CU_FWD_LAZY_RESCALE
#define FLASHATTN_CU_FWD_LAZY_RESCALE -1
#endif
#ifndef FLASHATTN_CU_FWD_LAZY_TIMED
#define FLASHATTN_CU_FWD_LAZY_TIMED 0
#endif
// The instance kinds the rules of fwd_lazy_rescale_sm90 and fwd_skip_kept_sm90 tell apart
// (sm90/fwd_launch.h LibraryFwdTraits maps its variant).
enum class FwdLazyKind { kStatic, kStaticAlibi, kPaddedWindow, kDynamic, kOther };
__host__ __device__ constexpr int fwd_lazy_rescale_sm90(int head_dim, bool softcap,
                                                        bool spills_at_256, FwdLazyKind kind,
                                                        bool short_rows) {
  if (softcap || (head_dim > 192 && spills_at_256)) return 0;
  if (FLASHATTN_CU_FWD_LAZY_RESCALE >= 0) return FLASHATTN_CU_FWD_LAZY_RESCALE;
  // The instances where b = 8 won on time (above), kept for the A/Bs' record; the library takes
  // none of them by default: the lazy reference's accuracy cost (below: the largest error
  // 1.23-1.73x cuDNN's on non-causal rows) outweighs its 1-5%, and its fix cost more time than the
  // lazy reference saved (benchmarks/NOTES.md 12.93).
  bool won = false;
  switch (kind) {
    case FwdLazyKind::kStatic:
      won = short_rows ? head_dim == 128
                       : head_dim == 64 || head_dim == 128 || head_dim == 256;
      break;
    case FwdLazyKind::kPaddedWindow: won = head_dim == 128 || head_dim == 256; break;
    case FwdLazyKind::kDynamic: won = head_dim == 128; break;
    case FwdLazyKind::kStaticAlibi: won = head_dim == 256; break;
    case FwdLazyKind::kOther: break;
  }
  return won && FLASHATTN_CU_FWD_LAZY_TIMED != 0 ? 8 : 0;
}
// The lazy reference's accuracy cost (benchmarks/NOTES.md 12.91): on an H100 at 1144b1e
// (scripts/diag_fwd_error.py: bf16, unit normal inputs, max |out - float32 reference|) the sm_90a
// forward's error was 1.23-1.68x cuDNN's and the mma.sync path's on non-causal rows at d = 64 /
// 128 / 256 (1k, 4k; the mean error +4%), against <= 1.07x before it; the loss sits on rows whose
// weight one key holds, where the running max leaves that key's P exactly 1 and the lazy
// reference rounds it (scripts/diag_lazy_emul.py). Its fix, O's 1 / l from the sums of the 16-bit
// P (FwdTraits kLazySums, sessions 67-68), cost more than the lazy reference saved: by mma.sync
// 7-24% of the step, by wgmma still 1.04-1.07x the running max's time (benchmarks/NOTES.md 12.93,
// 12.95), and is gone; FwdTraits kSkipKept (below) keeps the running max's bits and takes the
// skip where rows settle.

// The running max with O's rescale skipped by a warp whose rows all kept their max (sm90/
// fwd_traits.h kSkipKept, common/softmax.h new_max kKeep): the output bitwise the running max's
// (tune_fwd90 `skipkept`: 0 of 2^25 outputs and 0 LSEs differ on every instance kind, causal and
// not). Measured on an H100 at e5b9f8a (benchmarks/results/tune_fwd90_skipkept_h100_e5b9f8a.txt,
// time with / without, two passes, 4k / 16k): d = 256's static ALiBi 0.91-0.98 (its bias keeps a
// row's max on the diagonal's side, so rows settle), taken; elsewhere 0.98-1.06 (the static long
// rows 0.98-1.01, d = 128's short rows 0.99, d = 64's 1.02, the windows 0.99-1.04, the dynamic
// instance 1.01-1.06, d = 128's static ALiBi 1.01-1.03): the vote costs what the skip saves.
// The build flag FLASHATTN_CU_FWD_SKIP_KEPT=1 gives it to every instance on the running max
// (softcap's included: its factors come from new_max_capped's exponentials, and the vote skips
// only where every one is exactly 1), 0 to none; unset, the rule.
#ifndef FLASHATTN_CU_FWD_SKIP_KEPT
#define FLASHATTN_CU_FWD_SKIP_KEPT -1
#endif
__host__ __device__ constexpr bool fwd_skip_kept_sm90(int head_dim, FwdLazyKind kind,
                                                      bool short_rows) {
  if (FLASHATTN_CU_FWD_SKIP_KEPT >= 0) return FLASHATTN_CU_FWD_SKIP_KEPT != 0;
  return kind == FwdLazyKind::kStaticAlibi && head_dim == 256 && !short_rows;
}

// The bounded reference's used sums (bf16 softcap at d = 64 / 128) by wgmma against a ones tile
// instead of mma.sync (sm90/fwd_traits.h kSumsWgmma). Measured on an H100 at
// e5b9f8a (benchmarks/results/tune_fwd90_sumswgmma_h100_e5b9f8a.txt, time with / without, bf16
// softcap 30, two passes, 4k / 16k): d = 128's dynamic softcap instance 0.982-0.988, taken; its
// static 128 x 176 1.03-1.06 and 1k tile 1.00, d = 64's static 1.00-1.01 and dynamic 1.01-1.03.
// The build flag FLASHATTN_CU_FWD_SUMS_WGMMA=1 gives it to every bounded instance, 0 to none;
// unset, the rule.
#ifndef FLASHATTN_CU_FWD_SUMS_WGMMA
#define FLASHATTN_CU_FWD_SUMS_WGMMA -1
#endif
__host__ __device__ constexpr bool fwd_sums_wgmma_sm90(int head_dim, bool dynamic_softcap) {
  if (FLASHATTN_CU_FWD_SUMS_WGMMA >= 0) return FLASHATTN_CU_FWD_SUMS_WGMMA != 0;
  return head_dim == 128 && dynamic_softcap;
}

// The overlapped step's tail (the wait for P V, O's rescale, P's pack) inside the exponentials'
// basic block (sm90/fwd_traits.h kTailInExp; common/softmax.h exponentiate's `after`), where
// ptxas interleaves its FMULs and F2FPs with the MUFU.EX2 stream: the outputs bitwise the
// order's without it (the same instructions on the same values). The SASS of d = 128 bf16's plain
// 128 x 176 kernel (nvcc 13.0, sm_90a): in each arm the WARPGROUP.DEPBAR.LE gsb0 0 after 7-10 of
// its 88 MUFU.EX2, all 64 O FMULs and 38 of 44 F2FPs before its last MUFU (without: after all 176
// of both arms, in the join), 168 registers, no spill (d = 128's static ALiBi instance 8 / 48
// bytes of spills -> 0); the step's loop 1,205 -> 1,315 instructions (the tail in both arms).
// Measured (tune_fwd90 `tailinexp`, H100 at 1cbbf6c, interleaved, time on / off, two passes,
// non-causal then causal; benchmarks/NOTES.md 12.97, results/tune_fwd90_tailinexp_h100_1cbbf6c.txt;
// 0 of 2^25 outputs and 0 LSEs differ on each of the 13 instance kinds checked): two consumers
// gain, d = 128 128 x 176 4k / 16k 0.962-0.975, its 1k tile 0.963-0.981, d = 64's 1k tile
// 0.957-0.980, the padded windows at 8k / 16k d = 64 0.951-0.955, d = 128 0.980-0.986, d = 256
// 0.993-0.996, the dynamic instance on padded rows d = 128 0.961-1.002, d = 64 0.945-0.964,
// d = 128's static ALiBi 0.965-0.996; three consumers (d = 64's 192 x 128) lose, 1.094-1.104
// non-causal, 1.034-1.044 causal: under the other two consumers' GEMMs the tail was already
// hidden, and the early wait for P V stalls. So the rule: on with two consumers (the tile's 128
// query rows), off with three (d = 96 and 192 take it unmeasured, as d = 128 does). Level 2 (also
// softcap's max over the raw scores and the early rescale; tune_fwd90 `tailmods`, H100 at
// e75151b, results/tune_fwd90_tailmods_h100_e75151b.txt, two passes, 0 of 2^25 outputs and 0 LSEs
// differ on all four kinds): d = 256's early rescale 0.978-0.989, with static ALiBi 0.959-0.995,
// d = 128's softcap (static and dynamic, the unbounded path) 0.995-1.005 (neutral): the library
// takes level 2 wherever it takes the tail. Dropout, the serial order and the bounded reference
// never take it. The build flag FLASHATTN_CU_FWD_TAIL_IN_EXP = 1 or 2 gives that level
// (fwd_traits.h kTailInExp_) to every instance, 0 none; unset (-1), the rule.
#ifndef FLASHATTN_CU_FWD_TAIL_IN_EXP
#define FLASHATTN_CU_FWD_TAIL_IN_EXP -1
#endif
__host__ __device__ constexpr int fwd_tail_in_exp_sm90(int block_m) {
  if (FLASHATTN_CU_FWD_TAIL_IN_EXP >= 0) return FLASHATTN_CU_FWD_TAIL_IN_EXP;
  return block_m / 64 == 2 ? 2 : 0;
}

// The bounded reference's P in two register sets (sm90/fwd_traits.h kTwoP: P's pack needs no
// wait for P V and issues among the exponentials; level 1 waits after them, level 2 not in the
// step): off until tune_fwd90 `twop` has measured it (benchmarks/NOTES.md 12.99 item 9, 12.100
// item 2); the build flag FLASHATTN_CU_FWD_TWO_P=1 or 2 (its level) gives it to the bounded
// instances whose registers hold the second set, the 128 x 128 tiles (ptxas, sm_90a, bf16:
// d = 128's static short tile and dynamic tile, d = 64's dynamic tile, no new spills; d = 128's
// 128 x 176 and d = 64's three-consumer 192 x 128 run out, their wgmmas serialized, C7512, and
// 264 / 272 bytes of spills).
#ifndef FLASHATTN_CU_FWD_TWO_P
#define FLASHATTN_CU_FWD_TWO_P 0
#endif
__host__ __device__ constexpr int fwd_two_p_sm90(int block_m, int block_n) {
  return block_m == 128 && block_n <= 128 ? FLASHATTN_CU_FWD_TWO_P : 0;
}

// The static long-row tiles of plain attention as two CTAs of a cluster that share each K / V
// block by TMA multicast (sm90/fwd_traits.h kPairKV), on the calls that allow it (padded,
// non-causal, an even count of query tiles a head: sm90/fwd_launch.h fwd_pair_kv_call): off
// until tune_fwd90 `pairkv` has measured it (benchmarks/NOTES.md 12.101); the build flag
// FLASHATTN_CU_FWD_PAIR_KV=1 gives it to every head dim's static instance, for the suite and the
// bench in one device call.
#ifndef FLASHATTN_CU_FWD_PAIR_KV
#define FLASHATTN_CU_FWD_PAIR_KV 0
#endif
__host__ __device__ constexpr bool fwd_pair_kv_sm90(int /*head_dim*/) {
  return FLASHATTN_CU_FWD_PAIR_KV != 0;
}

// The sm80 forward's lazy reference (sm80/fwd_kernel.h FwdTraits kLazyRescale): the same build
// flag for every sm80 forward instance (its kvcache ones included), off unless set, until
// tune_fwd `lazy` has measured it (on an H100 through the sm80 kernels; Ampere not measured).
// With the flag it carries the accuracy cost found on the sm90a forward (benchmarks/NOTES.md
// 12.91).
__host__ __device__ constexpr int fwd_lazy_rescale_sm80() {
  return FLASHATTN_CU_FWD_LAZY_RESCALE > 0 ? FLASHATTN_CU_FWD_LAZY_RESCALE : 0;
}

// The sm80 forward's skipped rescale on the running max (sm80/fwd_kernel.h FwdTraits kSkipKept):
// its own build flag, off. Measured (tune_fwd `skipkept`, H100 at 3518d0d through the sm80
// kernels, results/tune_fwd_skipkept_h100_3518d0d.txt; two passes, 2k / 8k, non-causal and
// causal, outputs bitwise equal): time with / without d = 64 1.033-1.036, d = 128 1.024-1.038
// (slower; presumably the warp vote and its branch cost more than the FMULs it skips; not read),
// d = 256 0.991-1.004 (neutral). Ampere not measured.
#ifndef FLASHATTN_CU_FWD_SKIP_KEPT_SM80
#define FLASHATTN_CU_FWD_SKIP_KEPT_SM80 0
#endif
__host__ __device__ constexpr bool fwd_skip_kept_sm80() {
  return FLASHATTN_CU_FWD_SKIP_KEPT_SM80 != 0;
}

// The sm90a forward's softmax reductions as trees (common/softmax.h; FwdTraits kSumTree, kMaxTree)
// instead of serial chains. The library's SASS (d = 128) fed one FADD chain per row from each
// MUFU.EX2 in turn (MUFU, FADD, MUFU, FADD: the next MUFU issues behind a FADD that waits on the
// one before), and the phase clocks had the exponentials at 1,230 cycles of a 3,618-cycle step
// for 704 of SFU work. Measured on the H200 (tune_fwd90 `maxtree`,
// benchmarks/results/tune_fwd90_v23_trees_h200.txt; interleaved A/B, time with / without, 4k /
// 16k non-causal then causal): the sum tree d = 128 0.992 0.991 0.996 0.989 (its steps 3,618 ->
// 3,560 cycles, the exponentials 1,230 -> 1,176), d = 64 0.984 0.976 0.987 0.979, d = 256 0.996
// 0.996 0.995 0.996, softcap d = 128 0.947 0.940 0.967 0.949, ALiBi d = 128 0.987 0.980 0.984
// 0.981, window (1024, 0) d = 128 0.973 at 8k and 16k; softcap d = 64 1.027-1.031 (60 bytes of
// spills against 16): everywhere but softcap at d = 64 (d = 96 / 192 by analogy, not measured).
// The max tree: d = 256 (static long-row tile) 0.988-0.991; d = 128 0.996-1.005, d = 64
// 1.007-1.010: at d = 256's static long-row tile, and on the static ALiBi instance at d = 64
// (with the early rescale: fwd_early_rescale_sm90 above).
__host__ __device__ constexpr bool fwd_sum_tree_sm90(int head_dim, bool softcap) {
  return !(softcap && head_dim == 64);
}
__host__ __device__ constexpr bool fwd_max_tree_sm90(int head_dim, bool static_long_rows,
                                                     bool static_alibi = false) {
  return (head_dim == 256 && static_long_rows) || (head_dim == 64 && static_alibi);
}

}  // namespace flashattn_cu
