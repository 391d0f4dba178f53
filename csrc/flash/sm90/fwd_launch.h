// Host side of the sm90a forward: the TMA maps of q, k and v, the grid, the launch.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include <cuda.h>

#include "../fwd/attn_probs.h"
#include "../launch.h"
#include "../problem/params.h"
#include "../problem/scheduler.h"
#include "../switches.h"
#include "../tiles.h"
#include "../tma_host.h"
#include "fwd_kernel.h"
#include "launch.h"

namespace flashattn_cu::sm90 {

// How a call's tiles are spread (fwd_kernel.h walks tiles blockIdx.x, + gridDim.x, ...).
struct FwdSchedule {
  int64_t grid;     // CTAs
  int group_heads;  // query_tile_at's order (problem/scheduler.h)
  int defer_m = 0;  // and its light leading query blocks, walked last
};

// query_tile_at's deferred light blocks for a call (problem/mask.h deferred_query_blocks).
inline int fwd_defer_m(const FwdParams& p, int block_m) { return deferred_query_blocks(p, block_m); }

// Persistent (one CTA per SM: the next tile's loads run behind this one's last steps and
// epilogue) when every tile costs the same. Causal tiles cost from one key block to all of them:
// a persistent grid walks them longest first in groups of heads whose K and V fit half the L2
// (problem/scheduler.h), which wins where tiles are short and the per-CTA start is a large part
// of each (measured, tune_fwd90_v3_snake_h200.txt, TFLOP/s persistent / one CTA per tile: d = 128
// at 1k 363 / 330, 4k 543 / 514, 8k 554 / 564, 16k 545 / 620; d = 64 at 1k 254 / 209, 4k 413 /
// 370, 8k 418 / 437; d = 256 at 1k 324 / 364), and loses to the hardware's greedy hand-out of one
// CTA per tile on long rows, where a static walk leaves some CTAs the heavier tiles. Varlen tiles
// get one CTA each too. What counts is the keys a row can see: a left window bounds them whatever
// seqlen_k (window (1024, 0) at 16k: every tile but the first few walks the same 9-10 blocks, so
// the tiles are short and alike, the case the persistent grid wins).
// A causal call without a window follows tiles.h fwd_causal_persistent_sm90 (up to 16k keys at
// d 64, 12k at d 96 / 128 and above 1k to 4k at d 256, with fwd_walk_group's balanced groups:
// past that one CTA per tile in a tiles.h order won); a window keeps the 4k rule. The API's
// set_fwd_causal_schedule (switches.h) overrides the rule, for tests and benchmarks.
inline bool causal_persistent(const FwdParams& p) {
  const int forced = detail::g_fwd_causal_schedule.load(std::memory_order_relaxed);
  if (forced != static_cast<int>(FwdCausalSchedule::kAuto)) {
    return forced == static_cast<int>(FwdCausalSchedule::kPersistent);
  }
  if (p.window_left >= 0 && p.window_left < p.seqlen_k) {
    return p.head_dim <= 128 && p.window_left + 1 <= 4096;
  }
  return fwd_causal_persistent_sm90(p.head_dim, p.seqlen_k);
}

// The library's causal_order (fwd_schedule) for a call: tiles.h fwd_causal_order_sm90 for a
// causal call on padded rows without a window (problem/seqlen.h plain_causal), else 0.
inline int causal_order(const FwdParams& p) {
  return plain_causal(p) ? fwd_causal_order_sm90(p.head_dim, p.seqlen_k) : 0;
}

// Heads a group of a causal schedule walks together: those whose K and V (4 bytes per key and
// column, shared by a kv head's query heads) fit half the L2; 1 to batch x heads.
inline int l2_head_group(const FwdParams& p, int64_t l2_bytes) {
  const int64_t kv_bytes = static_cast<int64_t>(p.seqlen_k) * p.head_dim * 4;
  int64_t heads = kv_bytes > 0 ? l2_bytes / 2 / kv_bytes * (p.num_heads / p.num_heads_k) : 1;
  const int64_t total = static_cast<int64_t>(p.batch) * p.num_heads;
  heads = heads < 1 ? 1 : heads > total ? total : heads;
  return static_cast<int>(heads);
}

// causal_order: the tile order of a causal call's grid of one CTA per tile (the hardware hands
// the tiles out in index order as SMs free up): 0 query_tile's (each head's query blocks longest
// first, head after head, so a late head's longest tiles start near the end), -1 longest first
// over all tiles (every head's block m before any head's m - 1), kFwdCausalL2Groups groups of
// l2_head_group heads, > 0 groups of that many heads, longest first within each. The library
// passes causal_order(p) (tiles.h fwd_causal_order_sm90); tune_fwd90 `lpt` sweeps it.
inline FwdSchedule fwd_schedule(const FwdParams& p, int64_t tiles, int sms, int64_t l2_bytes,
                                bool causal_persistent, int defer_m = 0, int causal_order = 0) {
  // defer_m on the persistent grid only. Window (1024, 0), 4k-16k, time with / without it
  // (tune_fwd90 `defer`, benchmarks/NOTES.md 12.14): persistent d = 128 0.94-0.98, d = 64
  // 0.98-0.996; one CTA per tile (the hardware's hand-out, d = 256) 0.987-1.015.
  if (dynamic_seqlens(p) || (p.is_causal && !causal_persistent) || tiles <= sms) {
    const int64_t total = static_cast<int64_t>(p.batch) * p.num_heads;
    const bool ordered = p.is_causal && !causal_persistent && !dynamic_seqlens(p) &&
                         causal_order != 0 && total <= INT_MAX;
    const int group = !ordered                           ? 0
                      : causal_order == kFwdCausalL2Groups ? l2_head_group(p, l2_bytes)
                      : causal_order < 0 || causal_order > total ? static_cast<int>(total)
                                                                  : causal_order;
    return FwdSchedule{tiles, group, 0};
  }
  if (!p.is_causal) return FwdSchedule{sms, 0, defer_m};
  return FwdSchedule{sms, l2_head_group(p, l2_bytes), defer_m};
}

// Whether a call on the static variant's walk lets two CTAs of a cluster share K / V (FwdTraits
// kPairKV): adjacent query tiles of a head see the same key blocks (no causal mask) and pair up
// within the head (an even count of query tiles of block_m rows).
inline bool fwd_pair_kv_call(const FwdParams& p, int block_m) {
  return !p.is_causal && ceil_div(p.seqlen_q, block_m) % 2 == 0;
}

// FwdTmaParams::m_shift of configuration (Traits, kVariant) for a call (problem/mask.h
// Mask::query_block_shift): a padded call's one shift (all entries have seqlen_q rows; dropout's
// rounded down to a multiple of 16 rows, where its Philox map wants its tiles), a varlen call's
// kFwdEntryShift where the kernel works out each entry's own (fwd_work.h fwd_entry_shift), else 0.
// o_tma: the call stores O through o's TMA map (FwdTmaParams::o_tma), whose stores at a negative
// row stopped the kernel with an illegal instruction on the H100 (loads there zero-fill): those
// calls keep their blocks at multiples of the tile, unless shift_tma and the instance stores a
// shifted first block from the registers (fwd_work.h fwd_shifted_tma; a predicate on every
// instance's epilogue spilled at d = 256: ptxas, sm_90a, the dynamic instance 0 -> 8 / 16 bytes).
template <typename Traits, int kVariant>
inline int fwd_m_shift(const FwdParams& p, bool o_tma,
                       bool shift_tma = fwd_shift_tma_store_sm90(Traits::kHeadDim)) {
  if (p.cu_seqlens_q != nullptr) return fwd_entry_shift<Traits, kVariant>() ? kFwdEntryShift : 0;
  if (o_tma && !(shift_tma && fwd_shifted_tma<Traits, kVariant>())) return 0;
  const int shift = mask_of<variant_dynamic(kVariant)>(seq_info<false>(p, 0), p)
                        .template query_block_shift<Traits::kBlockM>();
  return variant_dropout(kVariant) ? shift & ~15 : shift;
}

// A tile's cost outside its key-block steps (its start, last P V and epilogue), in steps: the
// phase clocks (benchmarks/NOTES.md 12.14, results/tune_fwd90_v13_phases_ahead_h200.txt) have
// 1.2 at d = 64 (128 x 128 and 192 x 128) and 1.7 at d = 128 (128 x 128), causal; the walk's
// balanced group (fwd_walk_group) is the same over 1.2-1.8 at the bench's shapes.
constexpr double kFwdTileFixedSteps = 1.5;

// query_tile_at's group_heads for a causal call without a window on padded rows walked by a
// persistent grid of `ctas` CTAs (problem/scheduler.h balanced_group_heads over the call's key
// blocks per query block, with the instance's tile and the call's m_shift): l2_group (the L2's
// bound) or, where no size up to it balances the walk, one of at most max_group; any other call
// keeps l2_group. The last 8 answers are kept per host thread and per instance (Traits, kVariant:
// the cache is the template's own), so a repeated shape (a training loop's) costs a lookup; a
// new one walks its groups x query blocks for each candidate size balanced_group_heads tries.
// Any group size is correct (query_tile_at covers every tile for each); this one only sets the
// balance.
template <typename Traits, int kVariant>
int fwd_walk_group(const FwdParams& p, int ctas, int l2_group, int max_group, int m_shift) {
  if (!plain_causal(p)) return l2_group;
  struct Entry {
    int seqlen_q = -1, seqlen_k, m_shift, total_heads, l2_group, max_group, ctas, group;
  };
  static thread_local Entry cache[8];
  static thread_local int next = 0;
  const int64_t heads64 = static_cast<int64_t>(p.batch) * p.num_heads;
  if (heads64 > INT_MAX) return max_group;
  const int total_heads = static_cast<int>(heads64);
  for (const Entry& e : cache) {
    if (e.seqlen_q == p.seqlen_q && e.seqlen_k == p.seqlen_k && e.m_shift == m_shift &&
        e.total_heads == total_heads && e.l2_group == l2_group && e.max_group == max_group &&
        e.ctas == ctas) {
      return e.group;
    }
  }
  const int num_m = ceil_div(p.seqlen_q, Traits::kBlockM);
  std::vector<int> blocks(static_cast<size_t>(num_m));
  const Mask mask = mask_of<variant_dynamic(kVariant)>(seq_info<false>(p, 0), p);
  for (int m = 0; m < num_m; ++m) {
    const int m_start = m * Traits::kBlockM - m_shift;
    const KeyBlocks kb = mask.template key_blocks<Traits::kBlockM, Traits::kBlockN>(m_start);
    blocks[m] = m_start >= p.seqlen_q ? 0 : std::max(0, kb.end - kb.begin);
  }
  const int group = balanced_group_heads(blocks.data(), num_m, total_heads, l2_group, ctas,
                                         kFwdTileFixedSteps, max_group);
  cache[next] = Entry{p.seqlen_q, p.seqlen_k, m_shift, total_heads, l2_group, max_group, ctas,
                      group};
  next = (next + 1) % 8;
  return group;
}

// The group a persistent causal walk of `ctas` CTAs takes (launch_fwd_config's, and what the
// harness prints): the L2's (l2_group) when not `balanced`, else fwd_walk_group's with sizes up
// to group_cap x the L2's (the library's: problem/scheduler.h kWalkGroupCap).
template <typename Traits, int kVariant>
int fwd_walk_group_of(const FwdParams& p, int ctas, int l2_group, int m_shift, bool balanced,
                      double group_cap) {
  if (!balanced) return l2_group;
  const double cap = group_cap * l2_group;
  const int max_group = cap < l2_group ? l2_group : cap > INT_MAX ? INT_MAX : static_cast<int>(cap);
  return fwd_walk_group<Traits, kVariant>(p, ctas, l2_group, max_group, m_shift);
}

// The launch of one compiled configuration (Traits, kernel variant kVariant of problem/mask.h)
// for a call: its TMA maps, its schedule (fwd_schedule, with the causal choice given), the grid.
// sms / l2_bytes: the device's. benchmarks/tune/tune_fwd90.cu sweeps configurations through it.
// stamps: Traits::kStamps configurations only (the harness's phase clocks, fwd_clock.h).
// defer_light: fwd_defer_m's tile order (off: the order without it, for the harness's A/B).
// last_aligned: fwd_m_shift's query blocks (off: blocks at multiples of the tile, likewise);
// shift_tma: fwd_m_shift's, for the harness's A/B of tiles.h fwd_shift_tma_store_sm90.
// balanced_groups: fwd_walk_group's groups for a persistent causal walk (off: the L2's);
// group_cap: their wider bound as a multiple of the L2's group (the harness's `groupcap` A/B).
template <typename Element, typename Traits, int kVariant>
Status launch_fwd_config(const FwdParams& p, int sms, int l2_bytes, bool causal_persistent,
                         cudaStream_t stream, unsigned long long* stamps = nullptr,
                         bool defer_light = true, int causal_order = 0,
                         bool last_aligned = true,
                         bool shift_tma = fwd_shift_tma_store_sm90(Traits::kHeadDim),
                         bool balanced_groups = true,
                         double group_cap = kWalkGroupCap) {
  if (Traits::kStamps != (stamps != nullptr)) return Status::kInvalidArgument;
  const TmaExtents e = tma_extents(p);
  FwdTmaParams tp;
  tp.kp = make_fwd_kernel_params(p);
  tp.stamps = stamps;
  // The bounded reference's instances hold only for the calls ScoreScale::bounded_ref admits.
  if (Traits::kBoundedRef && variant_softcap(kVariant) && !tp.kp.score.bounded_ref) {
    return Status::kInvalidArgument;
  }
  Status st = encode_rows_map(&tp.q_map, p.dtype, p.q, p.head_dim, e.q_rows, p.num_heads,
                              e.batch, p.q_row_stride, p.q_head_stride, p.q_batch_stride,
                              Traits::kQPartRows);
  if (st == Status::kSuccess) {
    st = encode_rows_map(&tp.k_map, p.dtype, p.k, p.head_dim, e.k_rows, p.num_heads_k, e.batch,
                         p.k_row_stride, p.k_head_stride, p.k_batch_stride, Traits::kKVBoxRows);
  }
  if (st == Status::kSuccess) {
    st = encode_rows_map(&tp.v_map, p.dtype, p.v, p.head_dim, e.k_rows, p.num_heads_k, e.batch,
                         p.v_row_stride, p.v_head_stride, p.v_batch_stride, Traits::kKVBoxRows);
  }
  if constexpr (Traits::kTmaStoreO != 0) {
    // Padded calls (FwdTraits::kTmaStoreO) whose o a TMA map can describe: a 16-byte aligned
    // base and strides (the binding's layouts always are); any other call's kernel (varlen,
    // seqused_k) stores O from the registers (o_tma false).
    auto stride_ok = [](int64_t extent, int64_t stride) {
      return tma_stride_ok(extent, stride) && (extent == 1 || stride % 8 == 0);
    };
    const bool aligned = reinterpret_cast<uintptr_t>(p.o) % 16 == 0;
    tp.o_tma = st == Status::kSuccess && !dynamic_seqlens(p) && aligned &&
               stride_ok(e.q_rows, p.o_row_stride) && stride_ok(p.num_heads, p.o_head_stride) &&
               stride_ok(e.batch, p.o_batch_stride) &&
               encode_rows_map(&tp.o_map, p.dtype, p.o, p.head_dim, e.q_rows, p.num_heads, e.batch,
                               p.o_row_stride, p.o_head_stride, p.o_batch_stride, 64) ==
                   Status::kSuccess;
  }
  if (st != Status::kSuccess) return st;
  tp.m_shift = last_aligned ? fwd_m_shift<Traits, kVariant>(p, tp.o_tma, shift_tma) : 0;
  // Compact for a varlen call (fwd_work.h fwd_compact_tiles), on the kernel instance that
  // decodes them (fwd_compact_in_walk: the walk's own, else the kCompactOnly one).
  constexpr bool kCompactTiles = fwd_compact_tiles<Traits, kVariant>();
  const bool compact = kCompactTiles && compact_query_tiles(p, Traits::kBlockM);
  const int64_t tiles = fwd_tile_count<Traits, kVariant, kCompactTiles>(p);
  if (tiles == 0) return Status::kSuccess;
  FwdSchedule schedule = fwd_schedule(p, tiles, sms, l2_bytes, causal_persistent,
                                      defer_light ? fwd_defer_m(p, Traits::kBlockM) : 0,
                                      causal_order);
  // The ring counter (fwd_work.h RingSlot, an int) counts a CTA's key-block steps over its whole
  // walk: a persistent walk that could pass 2^31 - 1 of them (non-causal rows of ~84M keys at
  // batch x heads 1) takes one CTA per tile instead, whose count is one tile's key blocks.
  if (schedule.grid < tiles &&
      ceil_div<int64_t>(tiles, schedule.grid) * ceil_div<int64_t>(p.seqlen_k, Traits::kBlockN) >
          INT_MAX) {
    schedule = FwdSchedule{tiles, 0, 0};
  }
  // Every CTA's next tile index (cta_tile_index, in int) stays below tiles + 2 x grid: with a
  // grid of one CTA per tile that is 3 x tiles, so past ~7 x 10^8 tiles the call is refused.
  if (tiles + 2 * schedule.grid > INT_MAX) return Status::kInvalidArgument;
  // Compact varlen tiles are decoded once, at a CTA's start (fwd_work.h fwd_tile_seq): one CTA
  // per tile, whose walk ends after it, or the kernel would decode its next tiles as padded ones;
  // unless its producer hands out every tile (fwd_work.h fwd_published_tiles).
  // (The kCompactOnly kernel below, for a compact call on an instance that does not decode them
  // in its walk, never publishes.)
  const bool compact_only = kCompactTiles && !fwd_compact_in_walk<Traits, kVariant>() && compact;
  const bool published = fwd_published_tiles<Traits, kVariant>() && !compact_only;
  if (compact && !published && schedule.grid != tiles) return Status::kInvalidArgument;
  // A persistent causal walk's groups sized for its balance (fwd_walk_group_of; off: the
  // L2's, for the harness's A/B).
  if (schedule.grid < tiles && schedule.group_heads > 0 && schedule.defer_m == 0) {
    schedule.group_heads = fwd_walk_group_of<Traits, kVariant>(
        p, static_cast<int>(schedule.grid), schedule.group_heads, tp.m_shift, balanced_groups,
        group_cap);
  }
  tp.varlen_block_major =
      detail::g_fwd_varlen_order.load(std::memory_order_relaxed) ==
      static_cast<int>(FwdVarlenOrder::kBlocks);
  tp.group_heads = schedule.group_heads;
  tp.defer_m = schedule.defer_m;  // the kernels that walk it: fwd_work.h kernel_defer_m
  // The dynamic scheduler (FwdTmaParams::tile_counter): where the call would run one CTA per
  // tile on more tiles than SMs on a kernel that publishes its tiles (varlen, and padded calls
  // of the variants with sequence arrays: dropout, mixed score modifiers, a window with one),
  // a CTA per SM taking the tiles in the same order as each frees up, as the hardware hands out
  // CTAs, without a CTA's start and end between tiles, and the next tile's first loads under
  // this one's last steps. Needs the call's workspace (flashattn_cu.h FwdParams::workspace) and
  // the ring counter's bound over every tile (a CTA may walk them all).
  if (published && p.workspace != nullptr &&
      detail::g_fwd_dynamic_tiles.load(std::memory_order_relaxed) && schedule.grid == tiles &&
      tiles > sms &&
      tiles * ceil_div<int64_t>(p.seqlen_k, Traits::kBlockN) <= INT_MAX) {
    tp.tile_counter = static_cast<int*>(p.workspace);
    const cudaError_t err = cudaMemsetAsync(p.workspace, 0, sizeof(int), stream);
    if (err != cudaSuccess) return cuda_status(err);
    schedule.grid = sms;
  }
  if constexpr (Traits::kPairKV) {
    // FwdTraits kPairKV (a tuning knob, tune_fwd90 `pairkv`): clusters of two CTAs on adjacent
    // query tiles of one head, which see the same key blocks only on a padded call without a
    // causal mask whose heads have an even count of query tiles, on the static walk (fwd_kernel.h
    // asserts the static variant, which neither publishes its tiles nor has compact ones; a
    // non-causal call's schedule has no head groups) in the tile order of query_tile_at without
    // deferred blocks; an even grid (a pair per cluster).
    static_assert(kVariant == kStaticVariant && !kCompactTiles, "kPairKV: the static variant");
    const int64_t grid = schedule.grid & ~int64_t{1};
    if (!fwd_pair_kv_call(p, Traits::kBlockM) || schedule.defer_m != 0 || grid < 2) {
      return Status::kInvalidArgument;
    }
    return launch_kernel_clustered<fwd_kernel<Element, Traits, kVariant>>(
        StreamOrder::kWhole, 2, dim3(static_cast<unsigned>(grid)), dim3(Traits::kNThreads),
        Traits::kSmemBytes, stream, tp);
  }
  if constexpr (kCompactTiles && !fwd_compact_in_walk<Traits, kVariant>()) {
    if (compact) {
      return launch_kernel<fwd_kernel<Element, Traits, kVariant, true>>(
          dim3(static_cast<unsigned>(schedule.grid)), dim3(Traits::kNThreads),
          Traits::kSmemBytes, stream, tp);
    }
  }
  return launch_kernel<fwd_kernel<Element, Traits, kVariant>>(
      dim3(static_cast<unsigned>(schedule.grid)), dim3(Traits::kNThreads), Traits::kSmemBytes,
      stream, tp);
}

// The configuration tiles.h picks for kernel variant kVariant (kShort: fwd_tile_sm90_short's;
// kBounded: the bounded reference's instance, FwdTraits kBoundedRef; kDoubleQ / kSplitQ /
// kPrefetchMaps / kPublishTiles: those FwdTraits knobs, kOStore >= 0 its kTmaStoreO in place of
// the tile's, kLazy >= 0 its kLazyRescale in place of knobs.h fwd_lazy_rescale_sm90's,
// kSkip >= 0 its kSkipKept in place of fwd_skip_kept_sm90's, kSumsW >= 0 its kSumsWgmma in
// place of fwd_sums_wgmma_sm90's, kTail >= 0 its kTailInExp level in place of
// fwd_tail_in_exp_sm90's, kTwoP >= 0 its kTwoP level in place of fwd_two_p_sm90's and kPairKV
// FwdTraits kPairKV, the harness's A/Bs only).
template <int kHeadDim, int kVariant, bool kShort, bool kBounded, bool kDoubleQ = false,
          bool kSplitQ = false, bool kPrefetchMaps = false, int kOStore = -1,
          bool kPublishTiles = false, int kLazy = -1, int kSkip = -1, int kSumsW = -1,
          int kTail = -1, int kTwoP = -1, bool kPairKV = false>
struct LibraryFwdTraits {
  static constexpr FwdTileSm90 kTile =
      fwd_serial_sm90(kHeadDim, kVariant == kStaticVariant && !kShort)
          ? FwdTileSm90{true, 192, 128, 2, 0, true}
      : kShort ? fwd_tile_sm90_short(kHeadDim)
               : fwd_tile_sm90(kHeadDim, variant_dynamic(kVariant), kVariant == kAlibiVariant);
  static constexpr bool kStaticAlibi = kVariant == kStaticAlibiVariant && !kShort;
  static constexpr bool kStaticSoftcap = kVariant == kStaticSoftcapVariant;
  static constexpr bool kCapVariant = kVariant == kSoftcapVariant || kStaticSoftcap;
  static constexpr FwdLazyKind kLazyKind =  // knobs.h fwd_lazy_rescale_sm90's instance kinds
      kVariant == kStaticVariant         ? FwdLazyKind::kStatic
      : kVariant == kStaticAlibiVariant  ? FwdLazyKind::kStaticAlibi
      : kVariant == kPaddedWindowVariant ? FwdLazyKind::kPaddedWindow
      : kVariant == kDynamicVariant      ? FwdLazyKind::kDynamic
                                         : FwdLazyKind::kOther;
  static constexpr bool kLongRows =  // the static long-row tiles
      (kVariant == kStaticVariant || kVariant == kStaticAlibiVariant) && !kShort;
  // The warp-uniform fused exponent on (common/softmax.h ExpPolicy kWarpFused): +3.5% geo over
  // the tune shapes on the H200 (benchmarks/results/tune_fwd90_v9_fastexp_h200.txt); no half
  // blocks (NOTES 12.2).
  template <bool kTwoQ>
  using With = FwdTraits<kHeadDim, kTile.block_m, kTile.block_n, kTile.stages, true,
                         fwd_poly_eighths_sm90(kHeadDim, variant_softcap(kVariant)), 0, true,
                         false, kOStore < 0 ? kTile.o_store : kOStore,
                         fwd_cap_after_max_sm90(kHeadDim, kCapVariant, kStaticSoftcap),
                         fwd_early_rescale_sm90(kHeadDim, kLongRows, kStaticAlibi),
                         fwd_max_tree_sm90(kHeadDim, kLongRows, kStaticAlibi),
                         fwd_sum_tree_sm90(kHeadDim, variant_softcap(kVariant)),
                         fwd_mods_per_tile_sm90(kHeadDim, kStaticAlibi),
                         fwd_cap_interleave_sm90(kHeadDim, kCapVariant, kStaticSoftcap), kBounded,
                         false, kTile.serial, kTwoQ, kSplitQ || fwd_split_q_sm90(),
                         kPrefetchMaps, kPublishTiles,
                         kLazy >= 0 ? kLazy
                                    : fwd_lazy_rescale_sm90(kHeadDim, variant_softcap(kVariant),
                                                            kVariant == kDynamicVariant ||
                                                                kVariant == kDropoutVariant,
                                                            kLazyKind, kShort),
                         kSkip >= 0 ? kSkip != 0 : fwd_skip_kept_sm90(kHeadDim, kLazyKind, kShort),
                         kSumsW >= 0 ? kSumsW != 0
                                     : fwd_sums_wgmma_sm90(kHeadDim, kVariant == kSoftcapVariant),
                         kTail >= 0 ? kTail : fwd_tail_in_exp_sm90(kTile.block_m),
                         kTwoP >= 0 ? kTwoP : fwd_two_p_sm90(kTile.block_m, kTile.block_n),
                         kPairKV>;
  using Single = With<false>;
  // tiles.h fwd_double_q_sm90 (a build flag, off by default): the static variant's tiles, a
  // second Q where the shared memory holds it (with the barriers' and the O
  // boxes' alignment) and O is not staged in Q's buffer.
  static constexpr bool kRoomForQ =
      !Single::kOInQ && Single::kSmemBytes + Single::kQBytes + 1024 <= 227 * 1024;
  static constexpr bool kStatic = kVariant == kStaticVariant && !kBounded;
  using Type = With<kDoubleQ || (kStatic && kRoomForQ && fwd_double_q_sm90())>;
};

template <typename Element, int kHeadDim, int kVariant, bool kShort = false>
Status launch_fwd(const FwdParams& p, int sms, int l2_bytes, cudaStream_t stream) {
  using Lib = LibraryFwdTraits<kHeadDim, kVariant, kShort, false>;
  // knobs.h fwd_pair_kv_sm90 (a build flag, off): the static long-row tile as CTA pairs sharing
  // K / V, on the calls that allow it.
  if constexpr (kVariant == kStaticVariant && !kShort && fwd_pair_kv_sm90(kHeadDim)) {
    if (fwd_pair_kv_call(p, Lib::Type::kBlockM)) {
      using Pair = typename LibraryFwdTraits<kHeadDim, kVariant, false, false, false, false, false,
                                             -1, false, -1, -1, -1, -1, -1, true>::Type;
      return launch_fwd_config<Element, Pair, kVariant>(p, sms, l2_bytes, causal_persistent(p),
                                                        stream, nullptr, true, causal_order(p));
    }
  }
  // bf16 softcap calls that ScoreScale::bounded_ref admits take the bounded reference's
  // instance where knobs.h fwd_bounded_ref_sm90 says so.
  if constexpr (std::is_same_v<Element, __nv_bfloat16> &&
                fwd_bounded_ref_sm90(kHeadDim, Lib::kCapVariant, Lib::kStaticSoftcap)) {
    if (score_scale_of(p).bounded_ref) {
      using Bounded = typename LibraryFwdTraits<kHeadDim, kVariant, kShort, true>::Type;
      return launch_fwd_config<Element, Bounded, kVariant>(
          p, sms, l2_bytes, causal_persistent(p), stream, nullptr, true, causal_order(p));
    }
  }
  return launch_fwd_config<Element, typename Lib::Type, kVariant>(
      p, sms, l2_bytes, causal_persistent(p), stream, nullptr, true, causal_order(p));
}

template <typename Element, int kHeadDim>
Status run_fwd(const FwdParams& p, cudaStream_t stream) {
  static_assert(fwd_tile_sm90(kHeadDim, false).supported, "no sm90 forward tile for this head dim");
  int device = 0, sms = 0, l2_bytes = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device);
  if (err != cudaSuccess) return cuda_status(err);
  // Softcap alone on a padded call without a window: the static mask's softcap instance
  // (problem/mask.h), on the static variant's tile, unless the call has short rows, whose tile the
  // dynamic softcap variant has already (tiles.h). Measured on the H200 (tune_fwd90 `mods2`,
  // benchmarks/NOTES.md 12.10): +6% at d = 64, +1-5% at d = 128, +8-11% at d = 256.
  constexpr bool kHasShort = fwd_tile_sm90_short(kHeadDim).supported;
  const bool short_rows =
      kHasShort && fwd_short_rows_sm90(kHeadDim, p.is_causal, p.seqlen_q, p.seqlen_k);
  // bf16 softcap alone on the bounded reference, where knobs.h fwd_bounded_short_sm90 says so:
  // the static softcap variant's bounded instance on the short tile, short rows or not.
  if constexpr (std::is_same_v<Element, __nv_bfloat16> &&
                fwd_bounded_short_sm90(kHeadDim, true, 0)) {
    if (static_softcap_call(p) && score_scale_of(p).bounded_ref &&
        fwd_bounded_short_sm90(kHeadDim, p.is_causal, p.seqlen_k)) {
      using Short = typename LibraryFwdTraits<kHeadDim, kStaticSoftcapVariant, true, true>::Type;
      return launch_fwd_config<Element, Short, kStaticSoftcapVariant>(
          p, sms, l2_bytes, causal_persistent(p), stream, nullptr, true, causal_order(p));
    }
  }
  if (static_softcap_call(p) && !short_rows) {
    return launch_fwd<Element, kHeadDim, kStaticSoftcapVariant>(p, sms, l2_bytes, stream);
  }
  // ALiBi alone on a padded call without a window, likewise: the static mask's ALiBi instance
  // (problem/mask.h kStaticAlibiVariant) on the static variant's tile, unless short rows.
  if (static_alibi_call(p) && !short_rows) {
    return launch_fwd<Element, kHeadDim, kStaticAlibiVariant>(p, sms, l2_bytes, stream);
  }
  // A window alone on a padded call: the dynamic variant's mask and tile without its sequence
  // arrays (problem/mask.h kPaddedWindowVariant), at the head dims tiles.h gives it.
  if constexpr (fwd_padded_window_sm90(kHeadDim)) {
    if (padded_window_call(p)) {
      return launch_fwd<Element, kHeadDim, kPaddedWindowVariant>(p, sms, l2_bytes, stream);
    }
  }
  const Status st = with_variant(kernel_variant(p), [&](auto variant) {
    constexpr int kVariant = decltype(variant)::value;
    if constexpr (kVariant == kStaticVariant && kHasShort) {
      if (fwd_short_rows_sm90(kHeadDim, p.is_causal, p.seqlen_q, p.seqlen_k, true)) {
        return launch_fwd<Element, kHeadDim, kVariant, true>(p, sms, l2_bytes, stream);
      }
    }
    return launch_fwd<Element, kHeadDim, kVariant>(p, sms, l2_bytes, stream);
  });
  if (st != Status::kSuccess || p.s_dmask == nullptr || !(p.dropout_p > 0.f)) return st;
  // S_dmask (return_attn_probs with dropout): the arch-neutral kernel, from the lse just written.
  return forward::launch_attn_probs<Element>(make_fwd_kernel_params(p), stream);
}

}  // namespace flashattn_cu::sm90
