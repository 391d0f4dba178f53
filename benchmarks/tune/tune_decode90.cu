// Configuration sweep for the sm90a decode kernel (sm90/decode_kernel.h), torch-free: bf16
// decode steps (one query of 32 heads over 8 kv heads, every key visible; contiguous caches, and
// paged ones with the block table in order or shuffled) at
// batch 1 / 8 / 64 and 4k / 32k / 128k keys, d 64 and 128, for several (keys per block, ring stages)
// instances, each with the split count the library's rule gives it on this GPU (slots = the
// instance's CTAs per SM x SMs; or flash_attn's rule) and the split combine after it; GB/s of K and V (median of 20,
// CUDA events, L2 flushed before each) beside the device-to-device copy rate, each instance's output checked against
// the library configuration's. Build and run (device):
//   nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -DFLASHATTN_CU_HAS_SM90A=1 \
//        -gencode arch=compute_90a,code=sm_90a -Icsrc/include -Icsrc/flash \
//        benchmarks/tune/tune_decode90.cu csrc/flash/tma_host.cu csrc/flash/fwd/combine.cu \
//        -o /tmp/tune_decode90 && /tmp/tune_decode90
// `/tmp/tune_decode90 timeline` instead prints where one call's time goes, CTA by CTA (timeline()
// below; device_run.sh: STEPS=tune_decode TUNE_DECODE_ARGS=timeline); `persistent` A/Bs the
// persistent grid (DecodeTraits kPersistent) against the library's (TUNE_DECODE_ARGS=persistent);
// `producers` A/Bs several producer warps (DecodeTraits kProducerWarps) on 16-row pages.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "fwd/combine_launch.h"
#include "harness.h"
#include "library_status.h"
#include "problem/kv_cache.h"
#include "sm90/decode_launch.h"

namespace fa = flashattn_cu;

namespace {

constexpr int kHeads = 32, kHeadsK = 8, kGroup = kHeads / kHeadsK;

__global__ void fill_int(int* x, int n, int value) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = value;
}

// The contiguous copy of a paged cache: row r of entry e from its page (one block per row).
__global__ void gather_pages(const __nv_bfloat16* paged, __nv_bfloat16* out, const int* table,
                             int keys, int page, int slots, int row_elems) {
  const int e = blockIdx.x / keys, key = blockIdx.x % keys;
  const int src_row = table[e * slots + key / page] * page + key % page;
  const uint4* src = reinterpret_cast<const uint4*>(paged + static_cast<size_t>(src_row) * row_elems);
  uint4* dst = reinterpret_cast<uint4*>(out + static_cast<size_t>(blockIdx.x) * row_elems);
  for (int i = threadIdx.x; i < row_elems / 8; i += blockDim.x) dst[i] = src[i];
}

struct Buffers {
  __nv_bfloat16 *q, *k, *v, *o, *o_ref;
  __nv_bfloat16 *k2, *v2;  // paged sweeps: the cache gathered into the contiguous layout
  float *lse, *work, *diff;
  int* seqlens;
  int* table;  // paged sweeps: (batch, keys / page) page ids
};

int g_sms = 132;
size_t g_kv_elems = 0;  // elements of each of the K and V caches of the contiguous sweeps
size_t g_kv_alloc = 0;  // and of their buffers (a page per entry more: pages that cut the keys)
// Timed calls: 20, the L2 flushed before each (as triton's do_bench in bench_decode.py): 4k-key
// caches fit in the 50 MB L2 and would be read from it.
constexpr int kReps = 20;
constexpr size_t kFlushBytes = size_t{256} << 20;

// One decode call as dispatch.cu builds it (GQA packed: 4 rows per kv head), with `splits`.
// page > 0: the cache as (batch x keys / page) pages of `page` rows, b.table the block table.
fa::FwdKvcacheKernelParams make_params(const Buffers& b, int d, int batch, int keys, int splits,
                                       int page = 0) {
  fa::FwdParams p;
  p.batch = batch;
  p.seqlen_q = kGroup;  // packed: the group's query heads as rows
  p.seqlen_k = keys;
  p.num_heads = p.num_heads_k = kHeadsK;
  p.head_dim = d;
  p.q = b.q;
  p.k = b.k;
  p.v = b.v;
  p.o = b.o;
  p.lse = b.lse;
  p.q_head_stride = p.o_head_stride = d;
  p.q_row_stride = p.o_row_stride = static_cast<int64_t>(kHeads) * d;  // the call's (1 query)
  p.q_batch_stride = p.o_batch_stride = static_cast<int64_t>(kHeads) * d;
  p.k_head_stride = p.v_head_stride = d;
  p.k_row_stride = p.v_row_stride = static_cast<int64_t>(kHeadsK) * d;
  p.k_batch_stride = p.v_batch_stride = static_cast<int64_t>(kHeadsK) * d * keys;
  p.softmax_scale = 1.f / std::sqrt(static_cast<float>(d));
  p.dtype = fa::DType::kBFloat16;
  p.seqused_k = b.seqlens;
  fa::FwdKvcacheKernelParams kp;
  static_cast<fa::FwdKernelParams&>(kp) = fa::make_fwd_kernel_params(p);
  kp.kv = fa::KvcacheKernelFields{};
  kp.kv.batch_cache = batch;
  kp.kv.pack_group = kGroup;
  kp.kv.num_splits = splits;
  kp.kv.partial_rows = static_cast<int64_t>(batch) * kHeads;
  kp.kv.lse_partial = splits > 1 ? b.work : nullptr;
  kp.kv.o_partial = splits > 1 ? b.work + static_cast<size_t>(fa::kMaxSplits) * batch * kHeads : nullptr;
  if (page > 0) {
    kp.p.k_batch_stride = kp.p.v_batch_stride = static_cast<int64_t>(page) * kHeadsK * d;
    kp.kv.block_table = b.table;
    kp.kv.block_table_batch_stride = (keys + page - 1) / page;
    kp.kv.page_size = page;
    kp.kv.num_pages = batch * static_cast<int>(kp.kv.block_table_batch_stride);
  }
  return kp;
}

template <typename Traits>
int ctas_per_sm() {
  int n = 0;
  CHECK(cudaFuncSetAttribute(fa::sm90::decode_kernel<__nv_bfloat16, Traits>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &n, fa::sm90::decode_kernel<__nv_bfloat16, Traits>, Traits::kNThreads, Traits::kSmemBytes));
  return n;
}

// One call: the decode kernel, then the combine with several splits.
template <typename Traits>
fa::Status run(const fa::FwdKvcacheKernelParams& kp, int batch) {
  fa::Status st = fa::sm90::launch_decode_config<__nv_bfloat16, Traits>(kp, 0);
  if (st != fa::Status::kSuccess || kp.kv.num_splits == 1) return st;
  fa::FwdKvcacheKernelParams combine = kp;
  combine.p.seqlen_q = 1;
  combine.p.num_heads = kHeads;
  return fa::forward::launch_split_combine(combine, 0, true);
}

// The split rule: the library's (problem/kv_cache.h num_splits_one_wave), or flash_attn's
// (num_splits_heuristic, what the library used before).
enum class Rule { kOneWave, kFlashAttn };

int splits_by(Rule rule, int64_t tiles, int slots, int n_blocks) {
  return std::min(rule == Rule::kOneWave ? fa::num_splits_one_wave(tiles, slots, n_blocks)
                                         : fa::num_splits_heuristic(tiles, slots, n_blocks),
                  n_blocks);
}

// ref on LibTraits into b.o_ref and kp on Traits into b.o (both NaN-poisoned first), then the
// outputs' max|diff| and kp's median time; ok false where kp's launch failed.
struct Measured {
  bool ok;
  float diff, ms;
};

template <typename Traits, typename LibTraits>
Measured check_and_time(const Buffers& b, fa::FwdKvcacheKernelParams ref,
                        const fa::FwdKvcacheKernelParams& kp, int batch, int head_dim) {
  const size_t out_elems = size_t{1} * batch * kHeads * head_dim;
  ref.p.o = b.o_ref;
  CHECK(cudaMemset(b.o_ref, 0xff, out_elems * 2));
  if (run<LibTraits>(ref, batch) != fa::Status::kSuccess) std::printf("library launch failed\n");
  CHECK(cudaMemset(b.o, 0xff, out_elems * 2));
  if (run<Traits>(kp, batch) != fa::Status::kSuccess) return {false, 0.f, 0.f};
  const float diff = max_diff(b.o, b.o_ref, out_elems, b.diff);
  return {true, diff, median_ms([&] { run<Traits>(kp, batch); }, kReps, kFlushBytes)};
}

// split_scale: the rule's split count times this (at most the key blocks, fa::kMaxSplits).
template <int kHeadDim, typename Traits, typename LibTraits>
void sweep(const char* name, const Buffers& b, double copy_gbs, Rule rule = Rule::kOneWave,
           int split_scale = 1) {
  const int per_sm = ctas_per_sm<Traits>();
  for (int batch : {1, 8, 64}) {
    for (int keys : {4096, 32768, 131072}) {
      const double kv_bytes = 2.0 * batch * keys * kHeadsK * kHeadDim * 2;
      if (size_t{1} * batch * keys * kHeadsK * kHeadDim > g_kv_elems) continue;  // too large
      fill_int<<<(batch + 127) / 128, 128>>>(b.seqlens, batch, keys);
      const int n_blocks = (keys + Traits::kBlockN - 1) / Traits::kBlockN;
      const int one_wave = splits_by(rule, int64_t{batch} * kHeadsK, per_sm * g_sms, n_blocks);
      const int splits = std::min({one_wave * split_scale, n_blocks, fa::kMaxSplits});
      const int lib_blocks = (keys + LibTraits::kBlockN - 1) / LibTraits::kBlockN;
      const int lib_splits = splits_by(Rule::kOneWave, int64_t{batch} * kHeadsK, g_sms, lib_blocks);
      const fa::FwdKvcacheKernelParams kp = make_params(b, kHeadDim, batch, keys, splits);
      const Measured m = check_and_time<Traits, LibTraits>(
          b, make_params(b, kHeadDim, batch, keys, lib_splits), kp, batch, kHeadDim);
      if (!m.ok) {
        std::printf("%-22s launch failed\n", name);
        continue;
      }
      const float ms = m.ms, diff = m.diff;
      const double gbs = kv_bytes / (ms * 1e-3) / 1e9;
      std::printf("%-22s d=%3d batch=%2d keys=%6d ctas/sm=%d splits=%3d: %6.0f GB/s (%3.0f%% of "
                  "copy, %6.1f us)  max|diff| %.2e\n",
                  name, kHeadDim, batch, keys, per_sm, splits, gbs, 100 * gbs / copy_gbs,
                  ms * 1e3, diff);
      if (std::is_same_v<Traits, LibTraits> && rule == Rule::kOneWave && splits > 1) {
        // The decode kernel without the combine: what the combine (and its launch) costs.
        const float alone = median_ms([&] {
          CHECK(cudaGetLastError());
          fa::sm90::launch_decode_config<__nv_bfloat16, Traits>(kp, 0);
        }, kReps, kFlushBytes);
        std::printf("%-22s   the decode kernel alone: %6.1f us, the combine %5.1f us\n", "",
                    alone * 1e3, (ms - alone) * 1e3);
      }
    }
  }
}

// b.table: batch x slots page ids, in order or shuffled (a fixed permutation of the pool).
void fill_table(const Buffers& b, int batch, int slots, bool shuffled) {
  std::vector<int> ids(static_cast<size_t>(batch) * slots);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
  if (shuffled) {
    uint64_t x = 0x9e3779b97f4a7c15ull;  // a fixed xorshift sequence: the same table every run
    for (size_t i = ids.size() - 1; i > 0; --i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::swap(ids[i], ids[x % (i + 1)]);
    }
  }
  CHECK(cudaMemcpy(b.table, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
}

// Paged caches of `page`-row pages, the block table in order (the contiguous cache's bytes) or
// shuffled (pages scattered over the whole pool, as a serving engine's free list leaves them):
// each configuration's output against LibTraits on the contiguous copy of the same cache.
template <int kHeadDim, typename Traits, typename LibTraits>
void sweep_paged(const char* name, const Buffers& b, double copy_gbs, int page, bool shuffled) {
  const int per_sm = ctas_per_sm<Traits>();
  for (int batch : {1, 8, 64}) {
    for (int keys : {4096, 32768, 131072}) {
      const double kv_bytes = 2.0 * batch * keys * kHeadsK * kHeadDim * 2;
      const int slots = (keys + page - 1) / page;  // pages per entry
      if (size_t{1} * batch * slots * page * kHeadsK * kHeadDim > g_kv_alloc ||
          size_t{1} * batch * keys * kHeadsK * kHeadDim > g_kv_elems) {
        continue;  // too large
      }
      fill_table(b, batch, slots, shuffled);
      gather_pages<<<batch * keys, 128>>>(b.k, b.k2, b.table, keys, page, slots, kHeadsK * kHeadDim);
      gather_pages<<<batch * keys, 128>>>(b.v, b.v2, b.table, keys, page, slots, kHeadsK * kHeadDim);
      fill_int<<<(batch + 127) / 128, 128>>>(b.seqlens, batch, keys);
      const int n_blocks = (keys + Traits::kBlockN - 1) / Traits::kBlockN;
      const int splits = splits_by(Rule::kOneWave, int64_t{batch} * kHeadsK, per_sm * g_sms, n_blocks);
      const int lib_blocks = (keys + LibTraits::kBlockN - 1) / LibTraits::kBlockN;
      const int lib_splits = splits_by(Rule::kOneWave, int64_t{batch} * kHeadsK, g_sms, lib_blocks);
      Buffers contiguous = b;
      contiguous.k = b.k2;
      contiguous.v = b.v2;
      const Measured m = check_and_time<Traits, LibTraits>(
          b, make_params(contiguous, kHeadDim, batch, keys, lib_splits),
          make_params(b, kHeadDim, batch, keys, splits, page), batch, kHeadDim);
      if (!m.ok) {
        std::printf("%-26s launch failed\n", name);
        continue;
      }
      const float ms = m.ms, diff = m.diff;
      const double gbs = kv_bytes / (ms * 1e-3) / 1e9;
      std::printf("%-26s %s d=%3d batch=%2d keys=%6d ctas/sm=%d splits=%3d: %6.0f GB/s (%3.0f%% of "
                  "copy, %6.1f us)  max|diff| %.2e\n",
                  name, shuffled ? "shuffled" : "in order", kHeadDim, batch, keys, per_sm, splits,
                  gbs, 100 * gbs / copy_gbs, ms * 1e3, diff);
    }
  }
}

// One pass of an A/B: configuration A, then B, on the same shapes (a contiguous cache, or
// `page`-row pages in a shuffled table), each output checked against the library's.
template <int kHeadDim, typename A, typename B>
void ab(const char* name_a, const char* name_b, const Buffers& b, double copy_gbs, int page) {
  using Lib = fa::sm90::DecodeTraits<kHeadDim, fa::decode_tile_sm90(kHeadDim).block_n,
                                     fa::decode_tile_sm90(kHeadDim).stages>;
  if (page == 0) {
    sweep<kHeadDim, A, Lib>(name_a, b, copy_gbs);
    sweep<kHeadDim, B, Lib>(name_b, b, copy_gbs);
  } else {
    sweep_paged<kHeadDim, A, Lib>(name_a, b, copy_gbs, page, true);
    sweep_paged<kHeadDim, B, Lib>(name_b, b, copy_gbs, page, true);
  }
}

// The per-CTA timeline of one call (NOTES 13.13: time per CTA against its bytes is not linear):
// the library configuration built with kStamps (DecodeStamp: at entry, past the PDL wait, Q
// loaded, the first tile landed, the walk done, the stores issued; %globaltimer across SMs,
// clock64 within a CTA, whose cycles convert to us by the CTA's own clock64 / globaltimer ratio
// over its life), kReps calls each after an L2 flush. Per call: the span from the first CTA's
// entry to the last CTA's stores, the spread of the entries, and per phase the median and the
// largest over the CTAs; then the median of each over the calls, beside the event-timed call.
template <int kHeadDim, typename Traits>
void timeline(const char* name, const Buffers& b, unsigned long long* stamps, int batch, int keys,
              int page = 0) {
  static_assert(Traits::kStamps, "a configuration that records its stamps");
  if (size_t{1} * batch * keys * kHeadsK * kHeadDim > g_kv_elems) return;
  fill_int<<<(batch + 127) / 128, 128>>>(b.seqlens, batch, keys);
  if (page > 0) fill_table(b, batch, (keys + page - 1) / page, true);  // shuffled
  const int n_blocks = (keys + Traits::kBlockN - 1) / Traits::kBlockN;
  const int splits =
      splits_by(Rule::kOneWave, int64_t{batch} * kHeadsK, ctas_per_sm<Traits>() * g_sms, n_blocks);
  const fa::FwdKvcacheKernelParams kp = make_params(b, kHeadDim, batch, keys, splits, page);
  const int ctas = batch * kHeadsK * splits;
  void* const flush = flush_buffer(kFlushBytes);
  constexpr int kPhases = fa::sm90::kDecodeStamps;
  // Per call: span, entry spread, then per phase (k -> k + 1) the median and max over CTAs.
  std::vector<std::vector<double>> rows;
  std::vector<unsigned long long> host(static_cast<size_t>(ctas) * 2 * kPhases);
  auto timer = [&](int c, int k) { return host[(2 * c) * kPhases + k]; };
  auto cycles = [&](int c, int k) { return host[(2 * c + 1) * kPhases + k]; };
  std::vector<double> ghz;  // the SM clock of each CTA, per call
  for (int rep = 0; rep < kReps + 3; ++rep) {
    flush_l2(flush, kFlushBytes, rep);
    CHECK(cudaMemsetAsync(stamps, 0, host.size() * 8));  // (ctas <= 4096: batch 64 x 8 x 1)
    if (fa::sm90::launch_decode_config<__nv_bfloat16, Traits>(kp, 0, stamps) != fa::Status::kSuccess) {
      std::printf("%s: launch failed\n", name);
      return;
    }
    CHECK(cudaDeviceSynchronize());
    if (rep < 3) continue;
    CHECK(cudaMemcpy(host.data(), stamps, host.size() * 8, cudaMemcpyDeviceToHost));
    unsigned long long first = ~0ull, last_entry = 0, last = 0;
    std::vector<double> f(ctas);
    for (int c = 0; c < ctas; ++c) {
      first = std::min(first, timer(c, fa::sm90::kStampEntry));
      last_entry = std::max(last_entry, timer(c, fa::sm90::kStampEntry));
      last = std::max(last, timer(c, fa::sm90::kStampStored));
      const double ns = double(timer(c, fa::sm90::kStampStored) - timer(c, fa::sm90::kStampEntry));
      f[c] = ns > 0 ? double(cycles(c, fa::sm90::kStampStored) - cycles(c, fa::sm90::kStampEntry)) / ns
                    : 0.0;
    }
    std::sort(f.begin(), f.end());
    const double clock_ghz = f[f.size() / 2];
    ghz.push_back(clock_ghz);
    std::vector<double> row = {double(last - first) * 1e-3, double(last_entry - first) * 1e-3};
    for (int k = 0; k + 1 < kPhases; ++k) {
      std::vector<double> d(ctas);
      for (int c = 0; c < ctas; ++c) {
        d[c] = double(cycles(c, k + 1) - cycles(c, k)) / clock_ghz * 1e-3;
      }
      std::sort(d.begin(), d.end());
      row.push_back(d[d.size() / 2]);
      row.push_back(d.back());
    }
    rows.push_back(row);
  }
  auto median_of = [&](size_t col) {
    std::vector<double> v;
    for (const auto& r : rows) v.push_back(r[col]);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const float call_ms = median_ms([&] {
    fa::sm90::launch_decode_config<__nv_bfloat16, Traits>(kp, 0, stamps);
  }, kReps, kFlushBytes);
  const double kv_bytes = 2.0 * batch * keys * kHeadsK * kHeadDim * 2;
  std::sort(ghz.begin(), ghz.end());
  std::printf("%-14s d=%3d batch=%2d keys=%6d ctas=%4d (%4.0f KB each): events %6.1f us, stamps "
              "span %6.1f us, entries spread %5.1f us, SM clock %.2f GHz\n",
              name, kHeadDim, batch, keys, ctas, kv_bytes / ctas / 1024, call_ms * 1e3,
              median_of(0), median_of(1), ghz[ghz.size() / 2]);
  static const char* const kPhaseNames[] = {"PDL wait", "Q load", "first tile", "walk", "merge+stores"};
  for (int k = 0; k + 1 < kPhases; ++k) {
    std::printf("%-14s   %-13s median %6.2f us, slowest CTA %6.2f us\n", "", kPhaseNames[k],
                median_of(2 + 2 * k), median_of(3 + 2 * k));
  }
}

}  // namespace

int main(int argc, char** argv) {
  // "timeline_readflush": the timeline with the L2 emptied by a read instead of a memset
  // (harness.h g_flush_by_read; NOTES 13.16: whether the slow first megabyte of each CTA is
  // the flush's dirty lines being written back during the walk).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // line by line: a run cut by a timeout keeps its rows
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool timeline_only = mode == "timeline" || mode == "timeline_readflush";
  g_flush_by_read = mode == "timeline_readflush";
  CHECK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
  // The largest cache of the sweep: batch 64 x 32k keys x 8 heads x d 128, or batch 8 x 128k.
  const size_t kv = size_t{64} * 32768 * kHeadsK * 128;
  g_kv_elems = kv;
  g_kv_alloc = kv + size_t{64} * 256 * kHeadsK * 128;
  Buffers b;
  CHECK(cudaMalloc(&b.k, g_kv_alloc * 2));
  CHECK(cudaMalloc(&b.v, g_kv_alloc * 2));
  CHECK(cudaMalloc(&b.k2, kv * 2));
  CHECK(cudaMalloc(&b.v2, kv * 2));
  CHECK(cudaMalloc(&b.q, size_t{64} * kHeads * 128 * 2));
  CHECK(cudaMalloc(&b.o, size_t{64} * kHeads * 128 * 2));
  CHECK(cudaMalloc(&b.o_ref, size_t{64} * kHeads * 128 * 2));
  CHECK(cudaMalloc(&b.lse, size_t{64} * kHeads * 4));
  CHECK(cudaMalloc(&b.work, size_t{fa::kMaxSplits} * 64 * kHeads * (128 + 1) * 4));
  CHECK(cudaMalloc(&b.diff, 4));
  CHECK(cudaMalloc(&b.seqlens, 64 * 4));
  CHECK(cudaMalloc(&b.table, kv / (kHeadsK * 128 * 16) * 4));  // 16-row pages of the largest cache
  fill_random<<<1024, 256>>>(b.k, g_kv_alloc, 1u);
  fill_random<<<1024, 256>>>(b.v, g_kv_alloc, 2u);
  fill_random<<<64, 256>>>(b.q, size_t{64} * kHeads * 128, 3u);
  CHECK(cudaDeviceSynchronize());
  const float copy_ms = median_ms([&] {
    CHECK(cudaMemcpyAsync(b.v, b.k, kv * 2, cudaMemcpyDeviceToDevice));
  }, kReps, kFlushBytes);
  const double copy_gbs = 2.0 * kv * 2 / (copy_ms * 1e-3) / 1e9;
  fill_random<<<1024, 256>>>(b.v, g_kv_alloc, 2u);
  std::printf("device-to-device copy (read + write): %.0f GB/s; the L2 emptied before each timed call by %s\n",
              copy_gbs, g_flush_by_read ? "a read" : "a memset");
  if (timeline_only) {
    // The library's configurations with stamps: where a call's time goes, batch 1 / 8 / 64.
    unsigned long long* stamps = nullptr;
    CHECK(cudaMalloc(&stamps, size_t{4096} * 2 * fa::sm90::kDecodeStamps * 8));
    using Stamped128 = fa::sm90::DecodeTraits<128, fa::decode_tile_sm90(128).block_n,
                                              fa::decode_tile_sm90(128).stages, true, 1, true>;
    using Stamped64 = fa::sm90::DecodeTraits<64, fa::decode_tile_sm90(64).block_n,
                                             fa::decode_tile_sm90(64).stages, true, 1, true>;
    for (int batch : {1, 8, 64}) {
      for (int keys : {4096, 32768, 131072}) {
        timeline<128, Stamped128>("d128 timeline", b, stamps, batch, keys);
      }
    }
    for (int keys : {4096, 32768, 131072}) timeline<64, Stamped64>("d64 timeline", b, stamps, 1, keys);
    // The d 64 two-CTA instance on 16-row pages (shuffled), the library's choice there: batch 8
    // read 32k / 128k at 77% / 76% of the H100's copy, batch 64 at 94% (NOTES 13.18), where the
    // one-CTA instance reads a contiguous cache at 92% / 101%: where batch 8's time goes.
    using StampedTwo64 = fa::sm90::DecodeTraits<64, fa::decode_tile_sm90(64).block_n,
                                                fa::decode_tile_sm90(64).stages, true, 2, true>;
    for (int keys : {32768, 131072}) {
      timeline<64, Stamped64>("d64 contiguous", b, stamps, 8, keys);
      timeline<64, StampedTwo64>("d64 2cta p16", b, stamps, 8, keys, 16);
    }
    timeline<64, StampedTwo64>("d64 2cta p16", b, stamps, 64, 4096, 16);
    return 0;
  }

  using namespace fa::sm90;
  using Lib128 = DecodeTraits<128, fa::decode_tile_sm90(128).block_n, fa::decode_tile_sm90(128).stages>;
  using Lib64 = DecodeTraits<64, fa::decode_tile_sm90(64).block_n, fa::decode_tile_sm90(64).stages>;
  if (mode == "persistent") {
    // The persistent grid (DecodeTraits kPersistent: a CTA per SM slot walking tiles blockIdx.x,
    // + gridDim.x, ..., the ring running on across tiles) against the library's one CTA per tile,
    // interleaved, each output checked against the library's: where the tiles outnumber the
    // slots (batch 64; the splits fill one wave elsewhere, where both grids are the same).
    using Per128 = DecodeTraits<128, 32, 4, true, 1, false, true>;
    using Per64 = DecodeTraits<64, 64, 4, true, 1, false, true>;
    using Two64 = DecodeTraits<64, 64, 4, true, 2>;
    using PerTwo64 = DecodeTraits<64, 64, 4, true, 2, false, true>;
    for (int pass = 0; pass < 2; ++pass) {
      std::printf("pass %d\n", pass + 1);
      ab<128, Lib128, Per128>("d128 library contiguous", "d128 persistent contig", b, copy_gbs, 0);
      ab<128, Lib128, Per128>("d128 library p256", "d128 persistent p256", b, copy_gbs, 256);
      ab<128, Lib128, Per128>("d128 library p16", "d128 persistent p16", b, copy_gbs, 16);
      ab<64, Lib64, Per64>("d64 library contiguous", "d64 persistent contig", b, copy_gbs, 0);
      // More splits than one wave's: tiles a persistent CTA walks one after the other (batch 1
      // and 8, where the one-wave splits leave each CTA a short walk beside its fixed costs).
      sweep<64, Per64, Lib64>("d64 persistent x2 splits", b, copy_gbs, Rule::kOneWave, 2);
      sweep<64, Per64, Lib64>("d64 persistent x4 splits", b, copy_gbs, Rule::kOneWave, 4);
      sweep<128, Per128, Lib128>("d128 persistent x2 split", b, copy_gbs, Rule::kOneWave, 2);
      sweep<128, Per128, Lib128>("d128 persistent x4 split", b, copy_gbs, Rule::kOneWave, 4);
      ab<64, Two64, PerTwo64>("d64 2 ctas contiguous", "d64 2 ctas persistent", b, copy_gbs, 0);
      ab<64, Lib64, Per64>("d64 library p256", "d64 persistent p256", b, copy_gbs, 256);
      ab<64, Two64, PerTwo64>("d64 2 ctas p16", "d64 2 ctas persistent p16", b, copy_gbs, 16);
    }
    return 0;
  }
  if (mode == "producers") {
    // Several producer warps (DecodeTraits kProducerWarps: producer p issues the blocks of
    // consumer warps p, p + P, ...) against the library's one, on 16-row pages (shuffled), where
    // a tile is 2^k TMA boxes and one warp's issue rate bounds the walk (NOTES 13.8 / 13.9: d 64
    // 84% of copy against 98% contiguous at batch 8 128k, d 128 93% against 103%); the
    // contiguous d 64 cache and 256-row pages as controls. Two passes, each output checked
    // against the library's.
    using P2x128 = DecodeTraits<128, 32, 4, true, 1, false, false, 2>;
    using P4x128 = DecodeTraits<128, 32, 4, true, 1, false, false, 4>;
    using P2x64 = DecodeTraits<64, 64, 4, true, 1, false, false, 2>;
    using P4x64 = DecodeTraits<64, 64, 4, true, 1, false, false, 4>;
    using Two64 = DecodeTraits<64, 64, 4, true, 2>;
    using TwoP2x64 = DecodeTraits<64, 64, 4, true, 2, false, false, 2>;
    for (int pass = 0; pass < 2; ++pass) {
      std::printf("pass %d\n", pass + 1);
      ab<64, Lib64, P2x64>("d64 library p16", "d64 2 producers p16", b, copy_gbs, 16);
      sweep_paged<64, P4x64, Lib64>("d64 4 producers p16", b, copy_gbs, 16, true);
      ab<64, Two64, TwoP2x64>("d64 2 ctas p16", "d64 2 ctas 2 prod p16", b, copy_gbs, 16);
      ab<128, Lib128, P2x128>("d128 library p16", "d128 2 producers p16", b, copy_gbs, 16);
      sweep_paged<128, P4x128, Lib128>("d128 4 producers p16", b, copy_gbs, 16, true);
      ab<64, Lib64, P2x64>("d64 library contiguous", "d64 2 producers contig", b, copy_gbs, 0);
      ab<64, Lib64, P2x64>("d64 library p256", "d64 2 producers p256", b, copy_gbs, 256);
    }
    return 0;
  }
  // Session 20 (benchmarks/results/tune_decode90_v1-v3): 4 stages (64 KB in flight) won over 8
  // on every shape on a contiguous cache; the split rules; 16-key tiles on the contiguous cache.
  // Session 21 (tune_decode90_v4_paged_h200.txt): paged caches, the block table shuffled (pages
  // scattered over the pool, as a serving engine's free list leaves them) or in order. 16-key
  // tiles for 16-row pages (session 20's branch) lost: about 2400 GB/s at d 128 and 1450 at d 64
  // per CTA per SM whatever the stages; so the library tiles, with 16-row boxes from as many
  // pages (decode_tiles.h decode_box_rows_sm90), the table read a round early or not.
  sweep<128, Lib128, Lib128>("d128 library contiguous", b, copy_gbs);
  sweep_paged<128, Lib128, Lib128>("d128 p16", b, copy_gbs, 16, false);
  sweep_paged<128, Lib128, Lib128>("d128 p16", b, copy_gbs, 16, true);
  sweep_paged<128, DecodeTraits<128, 32, 4, false>, Lib128>("d128 p16 table late", b, copy_gbs, 16, true);
  sweep_paged<128, DecodeTraits<128, 32, 8>, Lib128>("d128 p16 32x8", b, copy_gbs, 16, true);
  sweep_paged<128, Lib128, Lib128>("d128 p48", b, copy_gbs, 48, true);
  sweep_paged<128, Lib128, Lib128>("d128 p256", b, copy_gbs, 256, true);
  sweep<64, Lib64, Lib64>("d64 library contiguous", b, copy_gbs);
  sweep_paged<64, Lib64, Lib64>("d64 p16", b, copy_gbs, 16, false);
  sweep_paged<64, Lib64, Lib64>("d64 p16", b, copy_gbs, 16, true);
  sweep_paged<64, DecodeTraits<64, 64, 4, false>, Lib64>("d64 p16 table late", b, copy_gbs, 16, true);
  sweep_paged<64, DecodeTraits<64, 64, 8>, Lib64>("d64 p16 64x8", b, copy_gbs, 16, true);
  sweep_paged<64, DecodeTraits<64, 32, 4>, Lib64>("d64 p16 32x4", b, copy_gbs, 16, true);
  sweep_paged<64, Lib64, Lib64>("d64 p48", b, copy_gbs, 48, true);
  sweep_paged<64, Lib64, Lib64>("d64 p256", b, copy_gbs, 256, true);
  // Session 22 (branch decode_issue): the d 64 tile with registers for two CTAs per SM (182 ->
  // 168; the library's is budgeted for one, and five warps of 182 do not fit twice in an SM's
  // four 16K-register sub-partitions), its splits sized for two per SM.
  using Two64 = DecodeTraits<64, 64, 4, true, 2>;
  sweep<64, Two64, Lib64>("d64 2 ctas contiguous", b, copy_gbs);
  sweep_paged<64, Two64, Lib64>("d64 2 ctas p16", b, copy_gbs, 16, true);
  sweep_paged<64, Two64, Lib64>("d64 2 ctas p256", b, copy_gbs, 256, true);
  return 0;
}
