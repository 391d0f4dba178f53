// flashattn_cu public C++ API. Torch-free: other C++/CUDA projects include this header and link
// the library. Tensors are described by raw pointers and int64 strides counted in elements.
//
// Layouts (flash_attn 2.x): q (batch, seqlen_q, num_heads, head_dim); k, v (batch, seqlen_k,
// num_heads_k, head_dim); o like q; lse fp32 (batch, num_heads, seqlen_q), contiguous;
// softmax_stats fp32 (batch, num_heads, seqlen_q, 2), contiguous.
// Requirements checked by fwd()/bwd(): last dim contiguous, every other stride a multiple of 8
// elements, every pointer of a tensor that has elements non-null and 16-byte aligned (a pointer
// of an empty tensor may be null, in fwd() and bwd() alike), head_dim a multiple of 8 and
// <= 256, num_heads % num_heads_k == 0, seqlen_q and seqlen_k <= kMaxSeqlen, a softmax_scale
// that is positive and finite as a float, an sm_80 or newer device.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace flashattn_cu {

enum class DType : int { kFloat16 = 0, kBFloat16 = 1 };

enum class Status : int {
  kSuccess = 0,
  kInvalidArgument = 1,     // a size, stride, pointer or alignment the kernels cannot take
  kUnsupportedDevice = 2,   // GPU older than sm_80, or an arch this build does not contain
  kUnsupportedHeadDim = 3,  // head_dim > 256, not a multiple of 8, or not compiled into this build
  kLaunchFailed = 4,        // a CUDA launch or attribute call failed; cuda_error holds why
};

// Longest sequence the kernels index (2^31 - 2^16): block counts and the causal/tail arithmetic
// stay in 32-bit integers with room to spare. Longer sequences return kInvalidArgument.
constexpr int kMaxSeqlen = 2147418112;

// Human-readable name of a status.
const char* status_string(Status status);

// What fwd() and bwd() share: the problem's sizes, the layouts of q, k, v and o, and the softmax.
// The entry points copy what the kernels need into private kernel parameters, so a new kernel
// field never changes this ABI.
struct AttnParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;

  // Strides in elements, the head dim contiguous: multiples of 8 and non-negative (0 broadcasts
  // an input); written tensors (o, and bwd()'s dq, dk, dv) must not overlap themselves.
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;

  int batch = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int num_heads = 0;
  int num_heads_k = 0;
  int head_dim = 0;

  float softmax_scale = 0.f;  // the caller resolves "None" to head_dim ** -0.5
  bool is_causal = false;     // bottom-right aligned: query i sees keys j <= i + seqlen_k - seqlen_q
  DType dtype = DType::kFloat16;
  // Sliding window (flash_attn's window_size = (window_left, window_right)): query i sees keys j
  // with d - window_left <= j <= d + window_right, d = i + seqlen_k - seqlen_q its diagonal key;
  // -1 leaves a side unbounded (other negative values are invalid). is_causal makes
  // window_right 0. A row that sees no key outputs 0 with LSE +inf.
  int window_left = -1;
  int window_right = -1;
  // ALiBi (flash_attn's definition), optional: fp32 slopes in device memory, slope of (entry b,
  // head h) at alibi_slopes[b * alibi_slopes_batch_stride + h] (stride 0: one slope per head;
  // negative strides and pointers not 4-byte aligned are refused).
  // With d = i + seqlen_k - seqlen_q the diagonal key of query i, the scaled score of key j gets
  // + slope * j when causal without a left window (the row-constant part of -slope * (d - j)
  // cancels in the softmax; the LSE is flash_attn's), else - slope * |d - j|.
  const float* alibi_slopes = nullptr;
  int64_t alibi_slopes_batch_stride = 0;
  // Softcap (flash_attn's softcap), 0: none. Otherwise > 0 and normal: the logit of score s =
  // q.k becomes softcap * tanh(s * softmax_scale / softcap) before ALiBi, the mask and the
  // softmax; the LSE is of these logits.
  float softcap = 0.f;
  // Attention dropout (flash_attn's dropout_p), in [0, 1); 0: none. Each element of the
  // probabilities P is kept with probability 1 - dropout_p (exactly keep_threshold / 65536 with
  // keep_threshold = round((1 - dropout_p) * 65536), a Philox4x32-10 draw per element; see
  // csrc/flash/common/philox.h for the map) and scaled by 1 / (1 - dropout_p); the LSE and
  // softmax_stats are of the undropped P. The mask is a pure function of (seed, offset, batch
  // entry, query head, row, key), the random state below: bwd() with fwd()'s state regenerates
  // the forward's mask on every kernel path. Combines with every other feature.
  float dropout_p = 0.f;

  // Variable-length batches (flash_attn's varlen layout); both null: the padded layout above.
  // cu_seqlens_q / cu_seqlens_k: batch + 1 int32 in device memory, starting at 0,
  // nondecreasing: entry b owns rows cu[b] .. cu[b + 1] - 1 of q and o (total_q rows) and of k
  // and v, whose tensors are then (total, heads, head_dim) (the batch strides are not used).
  // seqlen_q / seqlen_k then mean max_seqlen_q / max_seqlen_k: bounds on every entry's length. The
  // sm80 main kernels launch batch x heads x the blocks of the bound; the sm90 kernels (but the d
  // 256 backward's softcap instance: sm90/bwd_common.h bwd_compact_tiles) and the backward's pre-
  // and postprocess walk the entries' own blocks instead (total_q, and total_k where given: total /
  // block + batch blocks a head) where those are fewer, whatever the bound (which still sizes the
  // backward's dK / dV partial sums when it splits a kv head's group). An entry longer than its
  // bound, of negative length or past total_q (or total_k where given) stops the launch with a
  // device trap (the error surfaces at the next synchronization) instead of being computed clamped
  // to the bound.
  // Entries of length 0 are allowed. lse is (num_heads, total_q) and
  // softmax_stats (num_heads, total_q, 2), both contiguous.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  // Rows of q and o with cu_seqlens_q (required with it: 0 means no query row, and every entry
  // must then be empty). Rows outside every entry (past cu_seqlens_q[batch], e.g.
  // a buffer padded to a fixed token count) are written as a row that sees no key: o 0, lse
  // +inf (fwd(), fwd_kvcache()), and dq 0 (bwd()); no entry's result depends on them.
  int total_q = 0;
  // Rows of k and v with cu_seqlens_k. Optional: 0 (unknown) runs the forward on the sm80
  // kernels, whose loads need no bound on the tensor (the sm90 forward's TMA maps do); bwd()
  // writes dk / dv 0 on the rows past cu_seqlens_k[batch] when it is given.
  int total_k = 0;
  // Optional, fwd() only (batch int32 in device memory): entry b attends to its first
  // seqused_k[b] keys (at most its length), padded or varlen.
  const int* seqused_k = nullptr;

  // Dropout's random state (read only when dropout_p > 0): the Philox seed and offset, as
  // values or as pointers to device memory read when the kernels run (CUDA graphs: torch's
  // PhiloxCudaState under capture gives the generator's seed and offset pointers, so each replay
  // draws a new mask). seed = philox_seed_ptr ? *philox_seed_ptr : philox_seed;
  // offset = (philox_offset_ptr ? *philox_offset_ptr : 0) + philox_offset (under capture,
  // philox_offset is the intragraph offset). As with torch's generator, offset is a multiple
  // of 4 (fwd() / bwd() refuse philox_offset values that are not, with dropout_p > 0) and a call
  // owns the offsets offset .. offset + 4 * batch * num_heads - 1 (one Philox counter per batch
  // entry and query head, offset / 4 + batch * num_heads + head in the counter's lower half), so
  // a caller advances its offset by at least 4 * batch * num_heads between calls that must
  // differ.
  uint64_t philox_seed = 0;
  uint64_t philox_offset = 0;
  const uint64_t* philox_seed_ptr = nullptr;
  const uint64_t* philox_offset_ptr = nullptr;
};

struct FwdParams : AttnParams {
  void* o = nullptr;
  float* lse = nullptr;  // (batch, num_heads, seqlen_q), contiguous: natural-log LSE, +inf for a
                         // row that sees no key
  // Optional (null: not written). Per row (batch, num_heads, seqlen_q, 2), contiguous: the row's
  // max score before scaling and log2 of its sum of exp2((s - max) * scale * log2(e)), or
  // (+inf, 0) for a row that sees no key. bwd() recomputes the probabilities from these exactly
  // at any logit magnitude; from lse alone they carry lse's rounding (see BwdParams).
  float* softmax_stats = nullptr;
  // Optional, dropout_p > 0 only (null: not written): 2 uint64 in device memory that receive the
  // resolved (seed, offset) of this call, for bwd() to take as philox_seed_ptr /
  // philox_offset_ptr (flash_attn's rng_state).
  uint64_t* rng_state = nullptr;
  // Optional, dropout_p > 0 only (null: not written; flash_attn's S_dmask of return_softmax):
  // (batch, num_heads, round_up(seqlen_q, 128), round_up(seqlen_k, 128)) contiguous, dtype
  // elements: the softmax probabilities of every (row, key) (0 where masked), negated where the
  // element is dropped (the sign bit is set for a dropped 0), 0 past an entry's lengths and in
  // the rounding padding. With cu_seqlens, entry b's rows and keys start at 0 of its slab.
  void* s_dmask = nullptr;
  // Scratch memory in device memory, contents need not be initialised. fwd(): optional, of
  // fwd_workspace_bytes(params) bytes (16-byte aligned): the tile counter of the sm_90a forward's
  // dynamic scheduler (a CTA per SM taking the next tile as it frees up, where the tiles cost
  // unlike amounts: varlen), which the call zeroes on its stream (so one call at a time per
  // workspace); null: the static schedules (one CTA per tile there), with the same results bit
  // for bit.
  // fwd_kvcache(): see KvcacheParams.
  void* workspace = nullptr;
  // The workspace's size in bytes, optional: when nonzero, a workspace smaller than the call
  // needs is refused (kInvalidArgument) instead of written past.
  size_t workspace_bytes = 0;
};

// flash_attn_with_kvcache's attention (fwd_kvcache()): q attends to a KV cache. The FwdParams
// fields keep their meaning, with k / v the cache and these differences:
//  * seqlen_k is the cache's capacity in keys: seqlen_cache (contiguous) or
//    max_pages * page_size (paged), or any bound below it on every entry's keys; seqused_k must
//    be null (the cache's lengths are below); lse is (batch, num_heads, seqlen_q) as fwd()'s;
//    softmax_stats, dropout, rng_state and s_dmask are not supported (null / 0).
//  * Varlen queries (flash_attn_varlen_func with block_table: paged prefill; block_table is
//    required with them): cu_seqlens_q and
//    cu_seqlens_k together, with fwd()'s varlen meaning for q, o and lse (q / o (total_q,
//    num_heads, head_dim), the batch strides unused, seqlen_q = max_seqlen_q, lse (num_heads,
//    total_q)); entry b's keys are the first cu_seqlens_k[b + 1] - cu_seqlens_k[b] rows of its
//    cache (clamped to seqlen_k), in place of cache_seqlens and cache_leftpad, which must be
//    null. total_k is not used.
//  * Contiguous cache (block_table null): k, v (batch_cache, seqlen_cache, num_heads_k,
//    head_dim) with the k_/v_ strides; entry b reads cache entry cache_batch_idx[b] (b without
//    it); an index outside [0, batch_cache) is a caller's bug the host cannot see without a
//    sync: the kernels clamp it into range (wrong results, never an access outside the cache).
//  * Paged cache (block_table set): k, v (num_pages, page_size, num_heads_k, head_dim),
//    k_batch_stride / v_batch_stride the page strides; cache row r of entry b is row
//    r % page_size of page block_table[b * block_table_batch_stride + r / page_size]. Any
//    page_size >= 1. Page numbers outside [0, num_pages) are clamped into it by the kernels (a
//    device value: wrong results, never an access outside the cache). cache_batch_idx must be
//    null (flash_attn's rule).
// Keys: entry b attends to cache rows cache_leftpad[b] .. cache_seqlens[b] - 1 (leftpad 0 when
// null), as keys 0 .. cache_seqlens[b] - cache_leftpad[b] - 1 for the causal / window alignment
// and ALiBi; lengths past seqlen_k are clamped to it, a leftpad past cache_seqlens gives no key.
// cache_seqlens null (no k_new, no cache_leftpad): every entry attends to all seqlen_k keys.
// Appending (k_new / v_new below): without k_new, cache_seqlens counts every key the call
// attends to. With k_new and v_new (not with varlen queries), cache_seqlens counts the keys
// *before* the append: new row i of entry b is written in place to cache row
// cache_seqlens[b] + i (of the contiguous entry cache_batch_idx[b], or through the block table;
// rows at or past the capacity seqlen_k are not written: a caller's bug), and the entry attends
// to rows cache_leftpad[b] .. min(cache_seqlens[b] + seqlen_new, seqlen_k) - 1, the new rows
// read from k_new / v_new (so the kernels never read a cache row this call writes).
// Rotary (rotary_cos / rotary_sin, needs k_new): flash_attn's rotary embedding on the first
// rotary_dim channels, in fp32 and rounded to the dtype, of new key row i at position
// cache_seqlens[b] + i, and of query row i at cache_seqlens[b] + i when is_causal or a window
// is set, else at cache_seqlens[b] (positions clamped into [0, rotary_seqlen - 1]: a query's
// may pass seqlen_k when seqlen_q > seqlen_new, as in flash_attn); the cache
// receives the rotated keys. q itself is not modified.
// GQA packing: with num_heads > num_heads_k and no ALiBi (any seqlen_q, windows included), the
// query heads of one kv head run as the rows of one tile (each K/V tile read serves the whole
// group).
struct KvcacheParams : FwdParams {
  const int* cache_seqlens = nullptr;    // (batch) int32 in device memory; null: seqlen_k each
  const int* cache_batch_idx = nullptr;  // optional (batch) int32, contiguous cache only
  int batch_cache = 0;                   // entries of a contiguous cache (>= 1 when it has keys)
  const int* cache_leftpad = nullptr;    // optional (batch) int32
  const int* block_table = nullptr;      // optional (batch, max_pages) int32: the paged cache
  int64_t block_table_batch_stride = 0;  // elements between rows of block_table (>= max_pages)
  int page_size = 0;                     // rows per page, with block_table (>= 1)
  int num_pages = 0;                     // pages in k / v, with block_table (>= 1)
  // Splits of each query block's keys (FlashDecoding): 0 picks from the SM count, the tiles and
  // the cache length (fwd_kvcache_num_splits()); 1 .. 128 otherwise (clamped to the key
  // blocks). More than one split writes fp32 partial outputs to `workspace`, then merges them.
  int num_splits = 0;
  // workspace / workspace_bytes (FwdParams): fwd_kvcache_workspace_bytes(params) bytes (may be
  // 0: then null is fine), 256-byte aligned; contents need not be initialised. The need depends
  // on the device and on set_kernel_path() at the call, which may differ from the sizing query's.

  // Optional append of new keys / values (see above), both or neither: (batch, seqlen_new,
  // num_heads_k, head_dim) with these strides (elements; the last dim contiguous, the other
  // strides multiples of 8, 16-byte aligned starts), q's dtype. Not with cu_seqlens_q.
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  int seqlen_new = 0;
  int64_t knew_batch_stride = 0, knew_row_stride = 0, knew_head_stride = 0;
  int64_t vnew_batch_stride = 0, vnew_row_stride = 0, vnew_head_stride = 0;
  // Optional rotary embedding (see above), both or neither, with k_new: (rotary_seqlen,
  // rotary_dim / 2) contiguous, q's dtype, 16-byte aligned; rotary_dim a positive multiple of 16
  // and <= head_dim; rotary_seqlen >= seqlen_k (every position the call can reach).
  // rotary_interleaved: channel pairs (2i, 2i + 1) (GPT-J); false: (i, i + rotary_dim / 2)
  // (GPT-NeoX).
  const void* rotary_cos = nullptr;
  const void* rotary_sin = nullptr;
  int rotary_dim = 0;
  int rotary_seqlen = 0;
  bool rotary_interleaved = true;
};

struct BwdParams : AttnParams {
  // The forward's output and row statistics.
  const void* o = nullptr;
  const float* lse = nullptr;  // (batch, num_heads, seqlen_q), contiguous, as fwd() wrote it
  // Optional: fwd()'s softmax_stats for these inputs. When given, the probabilities are
  // recomputed from it and lse is not read (may be null). Without it they are recomputed from
  // lse, whose fp32 rounding then enters every exponent: a relative error of about
  // |lse| * 2^-23 per probability, below bf16's resolution while |lse| < ~2^14.
  const float* softmax_stats = nullptr;
  const void* dout = nullptr;  // like o
  // Gradients: dq like q; dk, dv like k, v (num_heads_k heads; summed over each head group).
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  // Scratch memory of bwd_workspace_bytes(params) bytes, 256-byte aligned; contents need not be
  // initialised (bwd() clears what it needs on the stream).
  void* workspace = nullptr;
  // The workspace's size in bytes, optional: when nonzero, a workspace smaller than
  // bwd_workspace_bytes(params) is refused (kInvalidArgument) instead of written past.
  size_t workspace_bytes = 0;

  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  bool deterministic = false;  // true: dq, dk, dv bitwise identical run to run (no float atomics)
};

// Last CUDA error seen by the entry points of this thread (cudaSuccess if none).
cudaError_t last_cuda_error();

// Every entry point below runs on the calling thread's current device (cudaGetDevice): its
// properties choose the kernels and the splits, and it launches there. The tensors, the
// workspace and `stream` must belong to that device (cudaSetDevice first when they do not;
// the torch binding sets it from q's device).

// Forward: writes o and lse. Asynchronous on `stream`; never synchronizes.
Status fwd(const FwdParams& params, cudaStream_t stream);
// Bytes of the optional scratch memory fwd() takes for these sizes (FwdParams::workspace; 0:
// none is used). Host only, no device query.
size_t fwd_workspace_bytes(const FwdParams& params);

// The split count fwd_kvcache() runs with on the current device (resolves num_splits = 0), and
// the bytes of scratch memory it needs for it: ask for every call, since one split needs some
// too (key counts with cache_leftpad or k_new to append; a rotated copy of q with rotary on the
// sm90a decode kernel).
int fwd_kvcache_num_splits(const KvcacheParams& params);
size_t fwd_kvcache_workspace_bytes(const KvcacheParams& params);

// flash_attn_with_kvcache's attention: writes o and lse. Asynchronous on `stream`; never
// synchronizes. On sm_90, calls of at most 16 query rows per kv head (decode: the query heads
// of a kv head packed, times seqlen_q) without cu_seqlens_q, at head dims 64 and 128, on a
// contiguous cache or pages of a multiple of 16 rows (not with cache_leftpad), run the sm90a
// decode kernel (a TMA ring); the others the sm80 (mma.sync) kernels, as on every other GPU.
Status fwd_kvcache(const KvcacheParams& params, cudaStream_t stream);

// Bytes of scratch memory bwd() needs for these sizes.
size_t bwd_workspace_bytes(const BwdParams& params);

// Backward: writes dq, dk, dv. Asynchronous on `stream`; never synchronizes.
Status bwd(const BwdParams& params, cudaStream_t stream);

// A varlen call's cu_seqlens against its bounds (seqlen_q / seqlen_k as max_seqlen_q / _k;
// total_q, and total_k where nonzero), checked on the GPU without a synchronization: a
// contradiction traps, and the CUDA error surfaces at the next synchronization. The kernels of
// fwd(), bwd() and fwd_kvcache() check the same as they start; this is for a call that
// launches none (max_seqlen_q or total_q 0: nothing to compute, yet cu_seqlens may give rows).
// Nothing to do without cu_seqlens or with batch 0. Asynchronous on `stream`.
Status check_varlen_seqlens(const AttnParams& params, cudaStream_t stream);

// Which kernel family the entry points may pick. kAuto: the fastest one built for the device
// (the sm_90a wgmma backward on compute capability 9.0 for the head dims it covers, else the
// mma.sync sm80 kernels); kSm80: always the sm80 kernels, for tests and comparisons.
// Process-wide; takes effect at the next call.
enum class KernelPath : int { kAuto = 0, kSm80 = 1 };
void set_kernel_path(KernelPath path);
KernelPath kernel_path();

// How the sm_90a forward hands out the tiles of a causal call on padded rows (varlen calls take
// kPerTile's). kAuto: by head dim and keys, as measured fastest (tiles.h
// fwd_causal_persistent_sm90); kPersistent: a CTA per SM walking its share of the tiles;
// kPerTile: the tiles in one order as SMs free up: with a workspace (FwdParams::workspace) and
// set_fwd_dynamic_tiles(true), on the kernels that have it, a CTA per SM taking the next from a
// counter, else a CTA per tile handed out by the hardware. For tests and benchmarks (every
// schedule on one shape); the results are the same. Process-wide; takes effect at the next call.
enum class FwdCausalSchedule : int { kAuto = 0, kPersistent = 1, kPerTile = 2 };
void set_fwd_causal_schedule(FwdCausalSchedule schedule);
FwdCausalSchedule fwd_causal_schedule();

// Whether the sm_90a forward may take its dynamic tile scheduler (FwdParams::workspace) where a
// call would otherwise run one CTA per tile (true, the default); false keeps the static
// schedules. For tests and benchmarks; the results are the same. Process-wide; takes effect at
// the next call.
void set_fwd_dynamic_tiles(bool enabled);
bool fwd_dynamic_tiles();

// The order of a varlen call's tiles within each entry on the sm_90a forward, which is the order
// its dynamic scheduler (or the hardware) hands them out in: kHeads, head after head, each
// head's query blocks longest first (the default); kBlocks, block after block, every head's
// longest query block first. For tests and benchmarks (its A/B); the results are the same.
// Process-wide; takes effect at the next call.
enum class FwdVarlenOrder : int { kHeads = 0, kBlocks = 1 };
void set_fwd_varlen_order(FwdVarlenOrder order);
FwdVarlenOrder fwd_varlen_order();

// Whether the sm_90a backward converts dQ streamed (true): the fp32 accumulator's blocks of rows
// go to dq as soon as every key tile that adds to them is done, under the main kernel's last
// tiles, instead of after it (non-deterministic calls on padded rows, head dims 64 and 128).
// false, the default until it measures faster: after the main kernel. For tests and benchmarks
// (its A/B); the results are the same up to the order of the fp32 additions. Process-wide;
// takes effect at the next call.
void set_bwd_streamed_dq(bool enabled);
bool bwd_streamed_dq();

// Compute capabilities this build has machine code for (e.g. 80, 90), and whether PTX for
// newer GPUs is embedded. Filled into `out` (up to `max`); returns how many.
int built_archs(int* out, int max);
// Head-dim instances compiled into this build (32, 64, ..., 256); returns how many.
int built_head_dims(int* out, int max);
// Every head-dim instance the library defines, built into this one or not (32, 64, ..., 256),
// ascending: a head_dim runs on the smallest instance >= it, which must be among
// built_head_dims() (else kUnsupportedHeadDim). Filled into `out` (up to `max`); returns how many.
int head_dim_instances(int* out, int max);

}  // namespace flashattn_cu
