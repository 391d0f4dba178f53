// The backward's workspace layout and the parameter block every backward kernel receives (the
// arch-neutral pipeline of bwd/pipeline.h and the main kernels of sm80/ and sm90/). Torch-free
// and kernel-free: dispatch.cu includes it for bwd_workspace_bytes().
//
// Workspace (fp32, every section 256-byte aligned):
//   row_max, row_log2sum [batch * num_heads][rows]  (M, L) of P = exp2((S - M) * scale_log2 - L):
//                        the forward's RowStats when the caller passes softmax_stats, else
//                        (0, lse * log2(e)); (+inf, 0) on padding rows
//   dpsum     [batch * num_heads][rows]           D = rowsum(dO * O); 0 on padding rows
//   dq_accum  [batch * num_heads][rows][d]        fp32 dQ (unscaled), non-deterministic only
//   dk_part, dv_part [kv_splits][batch * num_heads_k][seqlen_k][d]   only when kv_splits > 1
//   key_done  int32 [batch * num_heads_k * kv_splits][ceil(seqlen_k / kDqStreamBlockN)]
//             one flag per key tile of the sm90 main kernel: its dQ additions are in memory
//             (the streamed dQ convert, bwd/pipeline.h); non-deterministic padded calls only
// rows = seqlen_q rounded up to kBwdRowPad and d = round_head_dim(head_dim), so the kernels read
// whole query blocks of M/L/D (and add whole blocks into dq_accum) without bounds checks: a
// padding row has P = exp2((s - inf) * scale_log2) = 0 and contributes nothing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashattn_cu/flashattn_cu.h"

#include "../problem/dropout.h"
#include "../problem/mask.h"
#include "../problem/scheduler.h"
#include "../problem/score_mod.h"
#include "../problem/seqlen.h"
#include "../tiles.h"

namespace flashattn_cu::backward {

constexpr int kBwdRowPad = 128;  // every block_m of bwd_tile_sm80 divides it

// GQA/MQA: the query heads of one kv head are summed into dK/dV by a single thread block (in a
// fixed order, in registers) unless that leaves too few blocks to fill the GPU; then the group
// is cut into kv_splits parts whose fp32 partial sums are added in split order by the
// postprocess kernel. Decided from the sizes alone (not the device) so that
// bwd_workspace_bytes() needs no device query: the smallest divisor of the group size that
// gives >= kBwdMinBlocks blocks of 128 keys, capped so the partials stay bounded.
constexpr int64_t kBwdMinBlocks = 256;
constexpr int64_t kBwdMaxSplitBlocks = 1024;

inline int bwd_kv_splits(const BwdParams& p) {
  const int group = p.num_heads / p.num_heads_k;
  const int64_t base = static_cast<int64_t>(p.batch) * p.num_heads_k *
                       ((static_cast<int64_t>(p.seqlen_k) + 127) / 128);
  if (group <= 1 || base <= 0 || base >= kBwdMinBlocks) return 1;
  int chosen = 1;
  for (int s = 2; s <= group; ++s) {
    if (group % s != 0) continue;
    if (base * s > kBwdMaxSplitBlocks) break;
    chosen = s;
    if (base * s >= kBwdMinBlocks) break;
  }
  return chosen;
}

// Rows of the per-row planes (M, L, D) and of dq_accum, per query head:
//  * padded layout: batch * num_heads slots of `rows` = max_seqlen_q rounded up to kBwdRowPad;
//    (entry b, head h) starts at row (b * num_heads + h) * rows;
//  * varlen: one plane of `ws_plane` = total_q + batch * kVarlenSlack rows (rounded up to a
//    multiple of 4) per head; entry b of
//    head h starts at h * ws_plane + b * kVarlenSlack + round_up(start_q, 4): each entry gets
//    room for its rows rounded up to whole kBwdRowPad blocks, and 16-byte aligned starts (the
//    main kernels copy M/L/D in 16-byte chunks) without a prefix sum over rounded lengths.
constexpr int kVarlenSlack = kBwdRowPad + 4;

// The key tile of the sm90 main kernel (sm90/bwd_kernel.h kBlockN), the unit of key_done.
constexpr int kDqStreamBlockN = 128;

// Whether a call's workspace has the key_done flags (the calls whose dQ the sm90 path may
// convert streamed: an accumulator in the padded layout).
inline bool bwd_has_key_done(const BwdParams& p) {
  return !p.deterministic && p.cu_seqlens_q == nullptr && p.seqused_k == nullptr;
}

// The key_done flags: key_done_blocks(seqlen_k) of them per (batch, kv head, split) slice, the
// slices in that order; key_done_slice is a slice's first flag (batch = the call's batch: the
// flag count). Written by the main kernel (sm90/bwd_common.h key_tile_done), read by the
// streamed convert (bwd/preprocess.h), sized here (bwd_workspace_layout).
__host__ __device__ __forceinline__ int key_done_blocks(int seqlen_k) {
  return (seqlen_k + kDqStreamBlockN - 1) / kDqStreamBlockN;
}
__host__ __device__ __forceinline__ int64_t key_done_slice(int batch, int head_k, int split,
                                                           int num_heads_k, int kv_splits,
                                                           int seqlen_k) {
  return ((static_cast<int64_t>(batch) * num_heads_k + head_k) * kv_splits + split) *
         key_done_blocks(seqlen_k);
}

struct BwdWorkspaceLayout {
  int64_t rows = 0;      // padded layout: rows per (entry, head) slot (max_seqlen_q rounded up)
  int64_t ws_plane = 0;  // varlen: rows per head (0 in the padded layout)
  int kv_splits = 1;
  size_t row_max = 0, row_log2sum = 0, dpsum = 0, dq_accum = 0, dk_part = 0, dv_part = 0;  // bytes
  size_t key_done = 0;        // bytes
  int64_t key_done_count = 0;  // flags (0: none)
  size_t bytes = 0;
};

inline BwdWorkspaceLayout bwd_workspace_layout(const BwdParams& p) {
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  BwdWorkspaceLayout w;
  w.rows = (static_cast<int64_t>(p.seqlen_q) + kBwdRowPad - 1) / kBwdRowPad * kBwdRowPad;
  w.kv_splits = bwd_kv_splits(p);
  const size_t d = static_cast<size_t>(round_head_dim(p.head_dim));
  size_t total_rows = static_cast<size_t>(p.batch) * p.num_heads * static_cast<size_t>(w.rows);
  if (p.cu_seqlens_q != nullptr) {
    // Rounded up to 4 rows so that every head's plane starts 16-byte aligned too.
    w.ws_plane =
        (static_cast<int64_t>(p.total_q) + static_cast<int64_t>(p.batch) * kVarlenSlack + 3) / 4 * 4;
    total_rows = static_cast<size_t>(p.num_heads) * static_cast<size_t>(w.ws_plane);
  }
  const size_t row_bytes = total_rows * sizeof(float);
  size_t off = 0;
  w.row_max = off;
  off = align(off + row_bytes);
  w.row_log2sum = off;
  off = align(off + row_bytes);
  w.dpsum = off;
  off = align(off + row_bytes);
  w.dq_accum = off;
  if (!p.deterministic) off = align(off + row_bytes * d);
  w.dk_part = w.dv_part = off;
  if (w.kv_splits > 1) {
    const size_t part = static_cast<size_t>(w.kv_splits) * p.batch * p.num_heads_k *
                        static_cast<size_t>(p.seqlen_k) * d * sizeof(float);
    w.dv_part = align(off + part);
    off = align(w.dv_part + part);
  }
  w.key_done = off;
  if (bwd_has_key_done(p)) {
    w.key_done_count = key_done_slice(p.batch, 0, 0, p.num_heads_k, w.kv_splits, p.seqlen_k);
    off = align(off + static_cast<size_t>(w.key_done_count) * sizeof(int));
  }
  w.bytes = off;
  return w;
}

// The sm90 main kernel's dQ accumulator layout (sm90/bwd_kernel.h's staged dQ): each block
// of kDqFragRows query rows (from its slot's row 0) holds its kDqFragRows x d floats in the order
// of the kernel's wgmma fragments, so that its shared-memory staging is conflict-free and one
// bulk reduction adds it: element (r, col) of a block sits at float dq_frag_offset(r, col, d),
// the 8 columns 8c .. 8c + 7 of a row contiguous (what the postprocess reads as one chunk).
// Warp w = r / 16 + 4 (col / (d / 2)) holds rows 16 (w % 4) + g + 8 hr and columns
// (w / 4) d / 2 + 8 nt + 2 t + e at lane 4 g + t.
constexpr int kDqFragRows = 64;
// Element (r, col)'s place in the fragments: warp w, row half hr, 8-column tile nt of its
// warpgroup's half (half / 8 of them), and within the 64 floats of (w, hr, nt) the float
// lane_float = 2 (4 g + t) + e.
struct DqFragPos {
  int w, hr, nt, tiles, lane_float;
};
__host__ __device__ __forceinline__ DqFragPos dq_frag_pos(int r, int col, int d) {
  const int half = d / 2;  // columns per warpgroup
  const int g = r % 8, t = (col % 8) / 2, e = col % 2;
  return {r / 16 + 4 * (col / half), (r % 16) / 8, (col % half) / 8, half / 8,
          (g * 4 + t) * 2 + e};
}
__host__ __device__ __forceinline__ int64_t dq_frag_offset(int r, int col, int d) {
  const DqFragPos f = dq_frag_pos(r, col, d);
  return ((static_cast<int64_t>(f.hr) * f.tiles + f.nt) * 8 + f.w) * 64 + f.lane_float;
}

// The same blocks in the warp-specialized main kernel's order (sm90/bwd_ws_kernel.h): warp w's
// pairs first by warp, so that each warpgroup's half of the columns (warps 4 c .. 4 c + 3) is one
// contiguous half of the block, which one bulk reduction adds; within a warp the same (hr, nt)
// runs of 64 floats, the 8 columns 8c .. 8c + 7 of a row again contiguous.
__host__ __device__ __forceinline__ int64_t dq_frag_ws_offset(int r, int col, int d) {
  const DqFragPos f = dq_frag_pos(r, col, d);
  return ((static_cast<int64_t>(f.w) * 2 + f.hr) * f.tiles + f.nt) * 64 + f.lane_float;
}

// The inverse of both layouts by pieces: the floats 8 piece .. 8 piece + 7 of a block are the 8
// columns col .. col + 7 of one row (the lane_float run of a g), g the fastest of the indices in
// either order; returns (row, col) of piece `piece` (0 <= piece < kDqFragRows d / 8).
template <bool kFragWs>
__host__ __device__ __forceinline__ void dq_frag_piece(int piece, int d, int& row, int& col) {
  const int tiles = d / 16;  // 8-column tiles of a warpgroup's half
  const int g = piece % 8;
  int w, hr, nt;
  if constexpr (kFragWs) {  // ((w 2 + hr) tiles + nt) 8 + g
    nt = (piece / 8) % tiles;
    hr = (piece / (8 * tiles)) % 2;
    w = piece / (16 * tiles);
  } else {  // ((hr tiles + nt) 8 + w) 8 + g
    w = (piece / 8) % 8;
    nt = (piece / 64) % tiles;
    hr = piece / (64 * tiles);
  }
  row = 16 * (w % 4) + 8 * hr + g;
  col = (w / 4) * (d / 2) + 8 * nt;
}

// What every backward kernel receives (as a __grid_constant__ parameter).
struct BwdKernelParams {
  BwdParams p;
  float* row_max;
  float* row_log2sum;
  float* dpsum;
  float* dq_accum;  // null when deterministic
  float* dk_part;   // null unless kv_splits > 1
  float* dv_part;
  int64_t rows;      // padded layout: rows per (entry, head) slot of M/L/D and dq_accum
  int64_t ws_plane;  // varlen: rows per head of M/L/D and dq_accum (0: padded layout)
  int kv_splits;        // thread blocks sharing one kv head's query-head group
  int heads_per_split;  // query heads each of them loops over
  ScoreScale score;     // problem/score_mod.h: the score units (scale_log2, softcap)
  DropoutScale dropout;  // problem/dropout.h: keep threshold and 1 / (1 - p)
  // The light trailing key blocks of a window that the sm90 main kernels' tile order walks last
  // (problem/scheduler.h key_tile_at; set by sm90/bwd_launch.h; 0: key_tile's order).
  int defer_n = 0;
  // The streamed dQ convert (bwd/pipeline.h; null: off): the main kernel sets its key tile's
  // flag (key_done_slice + n_block) once its dQ additions are complete; the preprocess clears
  // them.
  int* key_done = nullptr;
  // The order in which the main kernel's tiles complete query blocks: block after block over all
  // heads (a causal call's tiles longest first: every key block deferred) or head after head.
  bool key_done_block_major = false;
};

// Kernel parameters over the workspace carved as `ws` describes.
inline BwdKernelParams make_bwd_kernel_params(const BwdParams& p, const BwdWorkspaceLayout& ws) {
  char* base = static_cast<char*>(p.workspace);
  BwdKernelParams kp;
  kp.p = p;
  kp.row_max = reinterpret_cast<float*>(base + ws.row_max);
  kp.row_log2sum = reinterpret_cast<float*>(base + ws.row_log2sum);
  kp.dpsum = reinterpret_cast<float*>(base + ws.dpsum);
  kp.dq_accum = p.deterministic ? nullptr : reinterpret_cast<float*>(base + ws.dq_accum);
  kp.dk_part = ws.kv_splits > 1 ? reinterpret_cast<float*>(base + ws.dk_part) : nullptr;
  kp.dv_part = ws.kv_splits > 1 ? reinterpret_cast<float*>(base + ws.dv_part) : nullptr;
  kp.rows = ws.rows;
  kp.ws_plane = ws.ws_plane;
  kp.kv_splits = ws.kv_splits;
  kp.heads_per_split = p.num_heads / p.num_heads_k / ws.kv_splits;
  kp.score = score_scale_of(p);
  kp.dropout = dropout_scale_of(p);
  return kp;
}

// The varlen layout's row of (entry batch starting at row start_q of q, query head `head`).
__host__ __device__ __forceinline__ int64_t varlen_ws_row0(int64_t ws_plane, int batch,
                                                           int start_q, int head) {
  return head * ws_plane + static_cast<int64_t>(batch) * kVarlenSlack + ((start_q + 3) & ~3);
}

// Row of (entry seq.batch, query head `head`, the entry's row 0) in M/L/D and dq_accum (the
// layout above). Rows past the entry's length up to its rounded-up slot are padding the
// preprocess fills with P = 0 rows.
template <bool kDynamic>
__host__ __device__ __forceinline__ int64_t ws_row0(const BwdKernelParams& kp,
                                                    const SeqInfo& seq, int head) {
  if (!kDynamic || kp.ws_plane == 0) {
    return (static_cast<int64_t>(seq.batch) * kp.p.num_heads + head) * kp.rows;
  }
  return varlen_ws_row0(kp.ws_plane, seq.batch, seq.start_q, head);
}

// One output of the postprocess: dst[entry b, row, head, :head_dim] (Element) =
// scale * sum over s < splits of src[s * split_stride + src_row(b, head, row) * row_stride +
// :head_dim] (fp32), the splits added in order, for the rows of each entry (all `rows` in the
// padded layout; with cu_seqlens, entry b's length clamped to `rows`, its rows starting at
// cu_seqlens[b] in dst). src_row is (b * heads + head) * bh_stride / row_stride + row, or with
// src_plane (dq_accum of a varlen batch, ws_row0's layout) head * src_plane + b * kVarlenSlack +
// round_up(cu_seqlens[b], 4) + row. frag_d > 0: the rows of src are in dq_frag_offset's layout
// of head dim frag_d (blocks of kDqFragRows from each slot's row 0).
struct BwdConvertJob {
  const float* src = nullptr;
  int64_t split_stride = 0, bh_stride = 0, row_stride = 0;
  int64_t src_plane = 0;
  const int* cu_seqlens = nullptr;
  int splits = 1;
  int heads = 0;
  int rows = 0;
  void* dst = nullptr;
  int64_t dst_batch_stride = 0, dst_row_stride = 0, dst_head_stride = 0;
  float scale = 1.f;
  int frag_d = 0;
  // A frag_d job converted a kDqFragRows-row block at a time through shared memory (padded, or
  // varlen without compact tiles; one split, frag_d 64, 128 or 256, not streamed):
  // bwd/preprocess.h convert_frag_blocks, set by make_bwd_convert_params. false: 16-byte chunks
  // (convert_chunk), which read this layout 32 bytes at a time at 2 KB strides.
  bool frag_blocks = false;
  // A varlen dQ job (src_plane, cu_seqlens_q): the rows cu_seqlens index (total_q), so the
  // postprocess walks the compact tiles (bwd_convert_kernel); 0: every entry's `rows`.
  int total = 0;
  // Streamed (a padded dQ job of the sm90 path; key_done null: off): the postprocess converts
  // each kDqFragRows-row block as soon as every key tile that may add to it has set its flag
  // (BwdKernelParams key_done), instead of after the whole main kernel. The mask and the tiles'
  // shape it needs for that: which key tiles (problem/mask.h key_blocks_of_queries) of which
  // (kv head, split) slice.
  const int* key_done = nullptr;
  bool block_major = false;  // the blocks' order (BwdKernelParams key_done_block_major)
  int seqlen_k = 0;
  int heads_k = 0, key_splits = 1, heads_per_split = 1;
  bool causal = false;
  int window_left = -1, window_right = -1;
};

// A streamed or frag_blocks job's blocks of kDqFragRows rows per (batch, head); for the
// streamed dQ job (BwdConvertJob key_done), block `index` of them in the order the main kernel
// completes them, (batch, head, m) with m fastest, or m slowest (block_major).
__host__ __device__ __forceinline__ int dq_block_num_m(const BwdConvertJob& job) {
  return (job.rows + kDqFragRows - 1) / kDqFragRows;
}
struct DqStreamBlock {
  int batch, head, m;
};
__host__ __device__ __forceinline__ DqStreamBlock dq_stream_block(const BwdConvertJob& job,
                                                                  int batch, int64_t index) {
  const int num_m = dq_block_num_m(job);
  const int64_t slices = static_cast<int64_t>(batch) * job.heads;
  DqStreamBlock b;
  int64_t bh;
  if (job.block_major) {
    b.m = static_cast<int>(index / slices);
    bh = index % slices;
  } else {
    b.m = static_cast<int>(index % num_m);
    bh = index / num_m;
  }
  b.batch = static_cast<int>(bh / job.heads);
  b.head = static_cast<int>(bh % job.heads);
  return b;
}

// The key tiles [begin, end) (blocks of kDqStreamBlockN) whose flags query block m of `batch`
// waits for: those with a key some row of the block sees (problem/mask.h, the main kernel's own
// mask; rows past seqlen_q only widen the range). A key tile outside it adds only zeros to the
// block (every score of it masked), which may land after the conversion without changing it.
__host__ __device__ __forceinline__ KeyBlocks dq_stream_key_tiles(const BwdConvertJob& job,
                                                                  int batch, int m) {
  const SeqInfo seq{batch, job.rows, job.seqlen_k, -1, -1};
  const Mask mask(seq, job.causal, job.window_left, job.window_right);
  return mask.key_blocks_of_queries<kDqStreamBlockN>(m * kDqFragRows,
                                                     m * kDqFragRows + kDqFragRows - 1);
}

// The preprocess's blocks (bwd/preprocess.h): kPrepRowsPerBlock rows of one (entry, head) each,
// kPrepBlocksPerSlot of them a workspace slot of kBwdRowPad rows. Grid (prep_blocks):
// batch * num_heads * rows / kPrepRowsPerBlock (rows = max_seqlen_q padded to kBwdRowPad), or a
// varlen call's compact tiles of kBwdRowPad rows (problem/scheduler.h compact_query_tiles),
// kPrepBlocksPerSlot blocks each. Block `index` covers rows row0 .. row0 + kPrepRowsPerBlock - 1
// of (batch, head), of which it writes those below the entry's rows rounded up to kBwdRowPad;
// tests/cpp checks that the blocks cover each such row once.
constexpr int kPrepRowsPerBlock = 32;
constexpr int kPrepBlocksPerSlot = kBwdRowPad / kPrepRowsPerBlock;

template <typename Params>
__host__ __device__ __forceinline__ int64_t prep_blocks(const Params& p, int64_t rows) {
  return compact_query_tiles(p, kBwdRowPad)
             ? p.num_heads * kPrepBlocksPerSlot * varlen_slot_count(p.total_q, p.batch, kBwdRowPad)
             : static_cast<int64_t>(p.batch) * p.num_heads * rows / kPrepRowsPerBlock;
}

struct PrepBlock {
  int batch, head, row0;
  bool valid;  // false: a compact tile that holds no slot of any entry
};

// kDynamic: the kernel instance that reads sequence arrays (the others never see cu_seqlens).
template <bool kDynamic, typename Params>
__host__ __device__ __forceinline__ PrepBlock prep_block_at(const Params& p, int64_t rows,
                                                            int64_t index) {
  PrepBlock b{0, 0, 0, true};
  if (kDynamic && compact_query_tiles(p, kBwdRowPad)) {
    // Slot `slot` of kBwdRowPad rows of (entry, head), quarter slice % kPrepBlocksPerSlot.
    const VarlenTile v = varlen_tile_at(p.cu_seqlens_q, p.batch, kBwdRowPad,
                                        p.num_heads * kPrepBlocksPerSlot, index);
    b.valid = v.valid;
    b.batch = v.entry;
    b.head = v.slice / kPrepBlocksPerSlot;
    b.row0 = v.slot * kBwdRowPad + (v.slice % kPrepBlocksPerSlot) * kPrepRowsPerBlock;
  } else {
    const int64_t blocks_per_bh = rows / kPrepRowsPerBlock;
    const int64_t bh = index / blocks_per_bh;
    b.row0 = static_cast<int>(index % blocks_per_bh) * kPrepRowsPerBlock;
    b.batch = static_cast<int>(bh / p.num_heads);
    b.head = static_cast<int>(bh % p.num_heads);
  }
  return b;
}

constexpr int kConvertThreads = 256;  // the postprocess's block (bwd/preprocess.h)
constexpr int kConvertFragMaxD = 256;  // convert_frag_blocks' staging tile: kDqFragRows x this
// Blocks of the postprocess an SM holds at least (its registers bounded to 64 a thread: the
// chunk path's loads in flight need the threads; the block path loads 16 floats a round).
constexpr int kConvertBlocksPerSm = 4;

struct BwdConvertParams {
  BwdConvertJob jobs[3];
  int num_jobs = 0;
  int batch = 0;
  int head_dim = 0;
  int64_t max_chunks = 0;  // 16-byte output chunks of the largest job
};

// The postprocess work: dQ accumulator -> dq (non-deterministic), dK/dV partials -> dk, dv
// (kv_splits > 1). num_jobs = 0: nothing to launch. dq_frag: dq_accum is in dq_frag_offset's
// block layout (the sm90 main kernel's, bwd/pipeline.h) instead of plain rows (or in
// dq_frag_ws_offset's: bwd_convert_kernel's kFragWs).
inline BwdConvertParams make_bwd_convert_params(const BwdKernelParams& kp, bool dq_frag) {
  const BwdParams& p = kp.p;
  const int64_t d = round_head_dim(p.head_dim);
  BwdConvertParams cp;
  cp.batch = p.batch;
  cp.head_dim = p.head_dim;
  auto add = [&](const BwdConvertJob& job) {
    cp.jobs[cp.num_jobs++] = job;
    // A compact job takes a block per tile (a grid of tiles x kConvertThreads "chunks"), a
    // streamed or frag_blocks one a block per kDqFragRows rows.
    const int64_t chunks =
        job.total > 0
            ? job.heads * varlen_slot_count(job.total, p.batch, kBwdRowPad) * kConvertThreads
        : job.key_done != nullptr || job.frag_blocks
            ? static_cast<int64_t>(p.batch) * job.heads * dq_block_num_m(job) * kConvertThreads
            : static_cast<int64_t>(p.batch) * job.heads * job.rows * (p.head_dim / 8);
    if (chunks > cp.max_chunks) cp.max_chunks = chunks;
  };
  if (kp.dq_accum != nullptr && p.seqlen_q > 0) {
    BwdConvertJob job;
    job.src = kp.dq_accum;
    job.bh_stride = kp.rows * d;
    job.row_stride = d;
    job.src_plane = kp.ws_plane;
    job.cu_seqlens = p.cu_seqlens_q;
    job.heads = p.num_heads;
    job.rows = p.seqlen_q;
    job.dst = p.dq;
    job.dst_batch_stride = p.dq_batch_stride;
    job.dst_row_stride = p.dq_row_stride;
    job.dst_head_stride = p.dq_head_stride;
    job.scale = p.softmax_scale;  // the main kernel accumulates dS K without it
    job.frag_d = dq_frag ? static_cast<int>(d) : 0;
    job.total = kp.ws_plane != 0 && compact_query_tiles(p, kBwdRowPad) ? p.total_q : 0;
    if (kp.key_done != nullptr) {
      job.key_done = kp.key_done;
      job.block_major = kp.key_done_block_major;
      job.seqlen_k = p.seqlen_k;
      job.heads_k = p.num_heads_k;
      job.key_splits = kp.kv_splits;
      job.heads_per_split = kp.heads_per_split;
      job.causal = p.is_causal;
      job.window_left = p.window_left;
      job.window_right = p.window_right;
    }
    // (frag_d a multiple of 64: whole groups of 8 chunks a row for the staging's swizzle.)
    job.frag_blocks = job.frag_d > 0 && job.frag_d % 64 == 0 && job.frag_d <= kConvertFragMaxD &&
                      job.total == 0 && job.key_done == nullptr;
    add(job);
  }
  if (kp.kv_splits > 1 && p.seqlen_k > 0) {
    BwdConvertJob job;
    job.splits = kp.kv_splits;
    job.split_stride = static_cast<int64_t>(p.batch) * p.num_heads_k * p.seqlen_k * d;
    job.bh_stride = static_cast<int64_t>(p.seqlen_k) * d;
    job.row_stride = d;
    job.heads = p.num_heads_k;
    job.rows = p.seqlen_k;
    job.cu_seqlens = p.cu_seqlens_k;  // the partials themselves are padded to seqlen_k rows
    job.scale = 1.f;  // the main kernel already scaled dK
    job.src = kp.dk_part;
    job.dst = p.dk;
    job.dst_batch_stride = p.dk_batch_stride;
    job.dst_row_stride = p.dk_row_stride;
    job.dst_head_stride = p.dk_head_stride;
    add(job);
    job.src = kp.dv_part;
    job.dst = p.dv;
    job.dst_batch_stride = p.dv_batch_stride;
    job.dst_row_stride = p.dv_row_stride;
    job.dst_head_stride = p.dv_head_stride;
    add(job);
  }
  if (cp.max_chunks == 0) cp.num_jobs = 0;
  return cp;
}

}  // namespace flashattn_cu::backward
