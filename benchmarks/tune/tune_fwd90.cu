// Configuration sweep for the sm90a forward kernel (sm90/fwd_kernel.h), torch-free: times
// several (kBlockM, kBlockN, stages, ping-pong) instances on flash_attn's benchmark shapes (bf16,
// 16k tokens, hidden 2048) with CUDA events (median of 20) and prints TFLOP/s, each instance's
// output first checked against the sm80 kernel's on the same inputs (the measuring parts:
// fwd90_harness.h; this file, fwd90_chain_modes.h, fwd90_serial_modes.h, fwd90_lazy_modes.h and
// fwd90_dynamic_modes.h: the modes, which configurations each
// measures). Build and run (device):
//   nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -DFLASHATTN_CU_HAS_SM90A=1 \
//        -gencode arch=compute_90a,code=sm_90a -Icsrc/include -Icsrc/flash \
//        benchmarks/tune/tune_fwd90.cu csrc/flash/tma_host.cu -o /tmp/tune_fwd90 && /tmp/tune_fwd90
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifndef TUNE_FWD90_SERIAL_ONLY  // -DTUNE_FWD90_SERIAL_ONLY: the "serial3" and "lpt" modes alone
#include "fwd90_chain_modes.h"
#endif
#include "fwd90_harness.h"
#include "fwd90_dynamic_modes.h"
#include "fwd90_lazy_modes.h"
#include "fwd90_serial_modes.h"
#include "library_status.h"

int main(int argc, char** argv) {
  // A mode name ending in "_flushed" (the walk modes: balance, groupcap, groupcap2, persist4k,
  // persist8k, persist256, ...) times its A/B one call at a time after emptying the L2, as the
  // bench does (fwd90_harness.h g_ab_flush).
  std::string mode_arg = argc > 1 ? argv[1] : "";
  const std::string kFlushed = "_flushed";
  if (mode_arg.size() > kFlushed.size() &&
      mode_arg.compare(mode_arg.size() - kFlushed.size(), kFlushed.size(), kFlushed) == 0) {
    mode_arg.resize(mode_arg.size() - kFlushed.size());
    g_ab_flush = size_t(256) << 20;
  }
  const char* only = mode_arg.c_str();
  const size_t n = 16384ull * 2048;
  Buffers b;
  CHECK(cudaMalloc(&b.q, n * 2));
  CHECK(cudaMalloc(&b.k, n * 2));
  CHECK(cudaMalloc(&b.v, n * 2));
  CHECK(cudaMalloc(&b.o, n * 2));
  CHECK(cudaMalloc(&b.o_ref, n * 2));
  CHECK(cudaMalloc(&b.lse, 16384ull * 64 * 4));
  CHECK(cudaMalloc(&b.diff, 4));
  {
    std::vector<float> slopes(64);
    for (int h = 0; h < 64; ++h) slopes[h] = std::exp2(-8.f * (h + 1) / 64.f);
    CHECK(cudaMalloc(&b.slopes, 64 * 4));
    CHECK(cudaMemcpy(b.slopes, slopes.data(), 64 * 4, cudaMemcpyHostToDevice));
  }
  fill_random<<<1024, 256>>>(b.q, n, 1);
  fill_random<<<1024, 256>>>(b.k, n, 2);
  fill_random<<<1024, 256>>>(b.v, n, 3);
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaDeviceGetAttribute(&g_l2, cudaDevAttrL2CacheSize, 0));
  {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs, L2 %d bytes (the persistent walk's L2 group: half of it)\n",
                prop.name, g_sms, g_l2);
  }
  using fa::sm90::FwdTraits;
  // Three consumers with a consumer's GEMMs one after the other, and the causal tile orders
  // (fwd90_serial_modes.h).
  if (run_serial_mode(only, b) || run_order_mode(only, b)) return 0;
  // The lazy row reference's A/Bs (fwd90_lazy_modes.h).
  if (run_lazy_mode(only, b)) return 0;
  // d 256's causal calls on the dynamic tile scheduler (fwd90_dynamic_modes.h).
  if (run_dynamic_mode(only, b)) return 0;
#ifndef TUNE_FWD90_SERIAL_ONLY
  // The modifier instances' softmax chain (fwd90_chain_modes.h); -DTUNE_FWD90_ALIBI_ONLY
  // builds those modes alone.
  if (run_chain_mode(only, b)) return 0;
#ifndef TUNE_FWD90_ALIBI_ONLY
  if (std::string(only) == "window") {
    // Window (1024, 0), causal, on the dynamic variant's instance (the library's until this
    // mode) against the padded window instance (problem/mask.h kPaddedWindowVariant: the same
    // mask and tile without the sequence arrays), the tiles tiles.h gives the dynamic variant,
    // 4k / 8k / 16k, back to back, twice. The features bench at aef5ecb: window (1024, 0) at 16k
    // 5.86x faster than full causal on this path (bar 6x).
    const std::vector<int> sl = {4096, 8192, 16384};
    g_library_schedule = true;
    using W64 = FwdTraits<64, 128, 128, 2, true, 0, 0, true>;
    using W128 = FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1>;
    using W256 = FwdTraits<256, 128, 64, 2, true, 0, 0, true, false, 2>;
    for (int rep = 0; rep < 2; ++rep) {
      sweep<128, W128, kWindow1k>("d128 window dyn", b, false, sl);
      sweep<128, W128, kWindow1k | kStaticMask>("d128 window padded", b, false, sl);
      sweep<64, W64, kWindow1k>("d64 window dyn", b, false, sl);
      sweep<64, W64, kWindow1k | kStaticMask>("d64 window padded", b, false, sl);
      sweep<256, W256, kWindow1k>("d256 window dyn", b, false, sl);
      sweep<256, W256, kWindow1k | kStaticMask>("d256 window padded", b, false, sl);
    }
    return 0;
  }
  if (std::string(only) == "maxtree") {
    // The softmax's two reductions as trees, each A/B against the library's static tiles
    // (interleaved): FwdTraits kMaxTree (the row max as a pairwise tree instead of a serial
    // chain), kSumTree (the row sums as pairwise trees over the finished exponentials instead of
    // a FADD chain fed by each MUFU), both; then the phase clocks with each at d 128.
    const std::vector<int> sl = {4096, 16384};
    g_library_schedule = true;
    using Lib128 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, false>;
    using Max128 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, true, false>;
    using Sum128 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, true>;
    using Both128 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, true, true>;
    using Lib256 = FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2, false, true, false, false>;
    using Max256 = FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2, false, true, true, false>;
    using Sum256 = FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2, false, true, false, true>;
    using Lib64 = FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, false, false, false>;
    using Max64 = FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, false, true, false>;
    using Sum64 = FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, false, false, true>;
    ab_sweep<128, Lib128, Max128>("d128 max tree", b, true, sl);
    ab_sweep<128, Lib128, Sum128>("d128 sum tree", b, true, sl);
    ab_sweep<128, Lib128, Both128>("d128 both trees", b, true, sl);
    ab_sweep<256, Lib256, Max256>("d256 max tree", b, true, sl);
    ab_sweep<256, Lib256, Sum256>("d256 sum tree", b, true, sl);
    ab_sweep<64, Lib64, Max64>("d64 max tree", b, true, sl);
    ab_sweep<64, Lib64, Sum64>("d64 sum tree", b, true, sl);
    // The sum tree on the library's softcap (static mask), ALiBi and padded window instances.
    ab_sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, false>,
             FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, true>,
             kSoftcap | kStaticMask>("d128 softcap sum tree", b, true, sl);
    ab_sweep<64, FwdTraits<64, 192, 128, 2, true, 2, 0, true, false, 0, false, false, false, false>,
             FwdTraits<64, 192, 128, 2, true, 2, 0, true, false, 0, false, false, false, true>,
             kSoftcap | kStaticMask>("d64 softcap sum tree", b, true, sl);
    ab_sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, false>,
             FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, true>,
             kAlibi>("d128 alibi sum tree", b, true, sl);
    ab_sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1, true, false, false, false>,
             FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1, true, false, false, true>,
             kWindow1k | kStaticMask>("d128 window sum tree", b, false, {8192, 16384});
    const size_t stamp_slots = size_t{16384} * 3 * fa::sm90::kFwdClockSlots;
    unsigned long long* stamps = nullptr;
    CHECK(cudaMalloc(&stamps, stamp_slots * 8));
    phases<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true, true, 0, true, false, false, false>>(
        "d128 128x176 library", b, stamps, stamp_slots, 8192, false);
    phases<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true, true, 0, true, false, true, false>>(
        "d128 128x176 max tree", b, stamps, stamp_slots, 8192, false);
    phases<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true, true, 0, true, false, false, true>>(
        "d128 128x176 sum tree", b, stamps, stamp_slots, 8192, false);
    return 0;
  }
  if (std::string(only) == "capexp") {
    // Softcap (static mask) at d 128 with the row-sum tree (the library's since v23): a share of
    // the exponentials on the FMA pipe (kPolyEighths 1 / 2 / 3 of 8) against none, interleaved.
    // Softcap's two MUFU a score equal its tensor work at d 128; with the sum tree the MUFUs issue
    // in pairs, so the SFU may now be the limit the polynomial relieves.
    const std::vector<int> sl = {4096, 16384};
    g_library_schedule = true;
    using Cap0 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false, false, true>;
    using Cap1 = FwdTraits<128, 128, 176, 2, true, 1, 0, true, false, 0, true, false, false, true>;
    using Cap2 = FwdTraits<128, 128, 176, 2, true, 2, 0, true, false, 0, true, false, false, true>;
    using Cap3 = FwdTraits<128, 128, 176, 2, true, 3, 0, true, false, 0, true, false, false, true>;
    ab_sweep<128, Cap0, Cap1, kSoftcap | kStaticMask>("d128 softcap poly 1/8", b, true, sl);
    ab_sweep<128, Cap0, Cap2, kSoftcap | kStaticMask>("d128 softcap poly 2/8", b, true, sl);
    ab_sweep<128, Cap0, Cap3, kSoftcap | kStaticMask>("d128 softcap poly 3/8", b, true, sl);
    return 0;
  }
#ifndef TUNE_FWD90_MAXTREE_ONLY  // -DTUNE_FWD90_MAXTREE_ONLY: the "maxtree" and "capexp" modes alone
  if (std::string(only) == "steps") {
    // The library's long-row tiles with the phase clocks and a step's parts (sm90/fwd_clock.h
    // FwdStepPart): where a step's cycles go at d = 128 (FlashAttention-4 leads by 5-9% at
    // 4k-16k), d = 256 (with the early rescale) and d = 64. Non-causal 8k / 16k, causal 16k.
    const size_t stamp_slots = size_t{16384} * 3 * fa::sm90::kFwdClockSlots;
    unsigned long long* stamps = nullptr;
    CHECK(cudaMalloc(&stamps, stamp_slots * 8));
    using Long128 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, true, 0, true>;
    using Long256 = FwdTraits<256, 128, 80, 2, true, 0, 0, true, true, 2, false, true>;
    using Long64 = FwdTraits<64, 192, 128, 2, true, 0, 0, true, true, 0, false>;
    for (int seqlen : {8192, 16384}) phases<128, Long128>("d128 128x176", b, stamps, stamp_slots, seqlen, false);
    phases<128, Long128>("d128 128x176", b, stamps, stamp_slots, 16384, true);
    for (int seqlen : {8192, 16384}) phases<256, Long256>("d256 128x80 early", b, stamps, stamp_slots, seqlen, false);
    phases<256, Long256>("d256 128x80 early", b, stamps, stamp_slots, 8192, true);
    for (int seqlen : {8192, 16384}) phases<64, Long64>("d64 192x128", b, stamps, stamp_slots, seqlen, false);
    return 0;
  }
  if (std::string(only) == "wide") {
    // d = 128 key blocks of 192 (B) against the library's 176 (A), interleaved: 128 x 176 won
    // +7% over 128 x 128 (fewer steps a tile, the per-step costs spread over more keys); 192
    // fits 2 stages in 225 KB and S (96) + P (48) + O (64) registers in the 240 of a consumer.
    // Plain, 2k-16k, non-causal and causal (the static variant; the library's causal schedule).
    const std::vector<int> sl = {2048, 4096, 8192, 16384};
    g_library_schedule = true;
    ab_sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true>,
             FwdTraits<128, 128, 192, 2, true, 0, 0, true, false, 0, true>>("d128 176 vs 192", b, true, sl);
    ab_sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true>,
             FwdTraits<128, 128, 192, 2, true, 0, 0, true, false, 0, true>>("d128 176 vs 192", b, true, sl);
    return 0;
  }
  if (std::string(only) == "defer") {
    // fwd_defer_m's tile order off (A) / on (B) for window (1024, 0), causal, on the library's
    // window instances and schedule: a static walk of 2048 equal tiles but the 8 light leading
    // ones of each head on 132 CTAs (16k, 16 heads of 128) was 5.8% over the mean load in the
    // grouped order, 1.1% with the light tiles last (a model: 2.25 steps a tile of fixed cost);
    // d = 256 (one CTA per tile, the hardware's hand-out) too. Twice. Measured (session 27,
    // results/tune_fwd90_v20_defer_h200.txt): d = 128 0.94-0.98, d = 64 0.98-0.996, d = 256
    // 0.987-1.015, so fwd_schedule defers on the persistent grid only (d = 256's A/B now runs
    // the same order twice).
    const std::vector<int> wl = {4096, 8192, 16384};
    g_library_schedule = true;
    using W64 = FwdTraits<64, 128, 128, 2, true, 0, 0, true>;
    using W128 = FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1>;
    using W256 = FwdTraits<256, 128, 64, 2, true, 0, 0, true, false, 2>;
    for (int rep = 0; rep < 2; ++rep) {
      ab_sweep<128, W128, W128, kWindow1k | kStaticMask>("d128 window defer", b, false, wl, true);
      ab_sweep<64, W64, W64, kWindow1k | kStaticMask>("d64 window defer", b, false, wl, true);
      ab_sweep<256, W256, W256, kWindow1k>("d256 window defer", b, false, wl, true);
    }
    return 0;
  }
  if (std::string(only) == "early") {
    // FwdTraits kEarlyRescale off (A) / on (B): the O rescale after the step's P V, or between
    // the next S GEMM and P V issue as FlashAttention-3 orders it, on the library's tiles,
    // interleaved (ab_sweep): plain d = 128 / 64 / 256 at 1k-16k, non-causal and causal; the
    // window (1024, 0) padded instance at 4k-16k; softcap 30 on the static mask at d = 128;
    // the short-row tiles at 1k / 2k causal.
    const std::vector<int> sl = {1024, 2048, 4096, 8192, 16384}, wl = {4096, 8192, 16384},
                           cl = {4096, 16384}, shorts = {1024, 2048};
    g_library_schedule = true;
    ab_sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false>,
             FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, true>>("d128 128x176", b, true, sl);
    ab_sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1, true, false>,
             FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1, true, true>>("d128 128x128 short", b, false, shorts);
    ab_sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1, true, false>,
             FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1, true, true>, kWindow1k | kStaticMask>("d128 window", b, false, wl);
    ab_sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, false>,
             FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true, true>, kSoftcap | kStaticMask>("d128 softcap", b, true, cl);
    ab_sweep<64, FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, false>,
             FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, true>>("d64 192x128", b, true, sl);
    ab_sweep<64, FwdTraits<64, 128, 128, 2, true, 0, 0, true, false, 0, false, false>,
             FwdTraits<64, 128, 128, 2, true, 0, 0, true, false, 0, false, true>, kWindow1k | kStaticMask>("d64 window", b, false, wl);
    ab_sweep<256, FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2, false, false>,
             FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2, false, true>>("d256 128x80", b, true, sl);
    ab_sweep<256, FwdTraits<256, 128, 64, 2, true, 0, 0, true, false, 2, false, false>,
             FwdTraits<256, 128, 64, 2, true, 0, 0, true, false, 2, false, true>>("d256 128x64 short", b, false, shorts);
    return 0;
  }
  if (std::string(only) == "longmods") {
    // The static long-row tile's extras (FwdTraits kEarlyRescale + kMaxTree, on for the static
    // variant at d = 256: tiles.h) off (A) / on (B) for the static-mask modifier instances on the
    // same 128 x 80 tile: ALiBi (the library takes B since 19287dd, not measured alone) and
    // softcap 30 (the library takes A), 4k / 16k, non-causal and causal, interleaved.
    const std::vector<int> sl = {4096, 16384};
    g_library_schedule = true;
    using A256 = FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2, false, false, false, true>;
    using B256 = FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2, false, true, true, true>;
    for (int rep = 0; rep < 2; ++rep) {
      ab_sweep<256, A256, B256, kAlibi | kStaticMask>("d256 alibi static long", b, true, sl);
      ab_sweep<256, A256, B256, kSoftcap | kStaticMask>("d256 softcap static long", b, true, sl);
    }
    return 0;
  }
  if (std::string(only) == "cap3") {
    // d = 128 on three consumer warpgroups (192-row tiles, 160 registers each, no ping-pong
    // turns: each consumer's softmax runs behind the other two's GEMMs) against the library's
    // two (128 x 176, ping-pong), plain and softcap 30 on the static mask: softcap's SFU work
    // per score equals its tensor work at d = 128 (two MUFU, 8 cycles a warp each, against
    // 4 d FLOP a score), and ncu at 81d0a3a had both pipes ~60% busy with two consumers: a
    // third consumer to hide behind, as at d = 64 (benchmarks/NOTES.md 12.12). 4k and 16k,
    // non-causal and causal, twice.
    const std::vector<int> sl = {4096, 16384};
    g_library_schedule = true;
    for (int rep = 0; rep < 2; ++rep) {
      sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true>>("d128 plain 128x176", b, true, sl);
      sweep<128, FwdTraits<128, 192, 80, 3, true, 0, 0, true>>("d128 plain 192x80 s3", b, true, sl);
      sweep<128, FwdTraits<128, 192, 64, 3, true, 0, 0, true>>("d128 plain 192x64 s3", b, true, sl);
      sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true>, kSoftcap | kStaticMask>("d128 cap 128x176 mf", b, true, sl);
      sweep<128, FwdTraits<128, 192, 80, 3, true, 0, 0, true, false, 0, true>, kSoftcap | kStaticMask>("d128 cap 192x80 s3 mf", b, true, sl);
      sweep<128, FwdTraits<128, 192, 64, 3, true, 0, 0, true, false, 0, true>, kSoftcap | kStaticMask>("d128 cap 192x64 s3 mf", b, true, sl);
      sweep<128, FwdTraits<128, 192, 64, 4, true, 0, 0, true, false, 0, true>, kSoftcap | kStaticMask>("d128 cap 192x64 s4 mf", b, true, sl);
    }
    return 0;
  }
  if (std::string(only) == "plainexp") {
    // Plain attention with 1 or 2 eighths of the exponentials on the FMA pipe (kPolyEighths) on
    // the library's static tiles, back to back, twice: ncu at 81d0a3a had MUFU.EX2 as the most
    // sampled instruction of plain d = 128 (18.6% of the samples, 80% of them its fixed issue
    // wait) with the tensor pipe at 76%; d = 64 plain lost 6-9% with 2 eighths on 192 x 128
    // (tune_fwd90_v4_mods), d = 128 and 256 were never measured.
    const std::vector<int> sl = {1024, 4096, 16384};
    g_library_schedule = true;
    for (int rep = 0; rep < 2; ++rep) {
      sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true>>("d128 plain e0", b, true, sl);
      sweep<128, FwdTraits<128, 128, 176, 2, true, 1, 0, true>>("d128 plain e1", b, true, sl);
      sweep<128, FwdTraits<128, 128, 176, 2, true, 2, 0, true>>("d128 plain e2", b, true, sl);
      sweep<256, FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2>>("d256 plain e0", b, true, sl);
      sweep<256, FwdTraits<256, 128, 80, 2, true, 1, 0, true, false, 2>>("d256 plain e1", b, true, sl);
      sweep<64, FwdTraits<64, 192, 128, 2, true, 0, 0, true>>("d64 plain e0", b, true, sl);
      sweep<64, FwdTraits<64, 192, 128, 2, true, 1, 0, true>>("d64 plain e1", b, true, sl);
    }
    return 0;
  }
#ifndef TUNE_FWD90_CAP3_ONLY  // -DTUNE_FWD90_CAP3_ONLY: "maxtree", "steps", "wide", "defer", "early", "window", "cap3" and "plainexp" alone
  if (std::string(only) == "mods2") {
    // The modifier variants against plain attention on the library's tiles (softcap 30, ALiBi):
    // the dynamic variants' instances (the library's before the static-mask instances), the
    // static-mask ones (kStaticMask), and softcap's row max over the raw scores (FwdTraits
    // kCapAfterMax, last parameter) off / on. 4k and 16k, non-causal and causal, twice.
    const std::vector<int> sl = {4096, 16384};
    g_library_schedule = true;
    for (int rep = 0; rep < 2; ++rep) {
      sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true>>("d128 plain 128x176", b, true, sl);
      sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1, false>, kSoftcap>("d128 cap dyn 128x128", b, true, sl);
      sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1, true>, kSoftcap>("d128 cap dyn 128x128 mf", b, true, sl);
      sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, false>, kSoftcap | kStaticMask>("d128 cap st 128x176", b, true, sl);
      sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true>, kSoftcap | kStaticMask>("d128 cap st 128x176 mf", b, true, sl);
      sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true>, kAlibi>("d128 alibi dyn 128x176", b, true, sl);
      sweep<64, FwdTraits<64, 192, 128, 2, true, 0, 0, true>>("d64 plain 192x128", b, true, sl);
      sweep<64, FwdTraits<64, 128, 128, 2, true, 0, 0, true, false, 0, false>, kSoftcap>("d64 cap dyn 128x128", b, true, sl);
      sweep<64, FwdTraits<64, 128, 128, 2, true, 0, 0, true, false, 0, true>, kSoftcap>("d64 cap dyn 128x128 mf", b, true, sl);
      sweep<64, FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false>, kSoftcap | kStaticMask>("d64 cap st 192x128", b, true, sl);
      sweep<64, FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, true>, kSoftcap | kStaticMask>("d64 cap st 192x128 mf", b, true, sl);
      sweep<64, FwdTraits<64, 128, 128, 2, true, 0, 0, true, false, 0, true>, kSoftcap | kStaticMask>("d64 cap st 128x128 mf", b, true, sl);
      sweep<64, FwdTraits<64, 192, 128, 2, true, 0, 0, true>, kAlibi>("d64 alibi dyn 192x128", b, true, sl);
      sweep<256, FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2>>("d256 plain 128x80", b, true, sl);
      sweep<256, FwdTraits<256, 128, 64, 2, true, 0, 0, true, false, 2, false>, kSoftcap>("d256 cap dyn 128x64", b, true, sl);
      sweep<256, FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2, false>, kSoftcap | kStaticMask>("d256 cap st 128x80", b, true, sl);
    }
    return 0;
  }
  if (std::string(only) == "mods3") {
    // Softcap 30 on the static-mask instances with a share of the exponentials on the FMA pipe
    // (FwdTraits kPolyEighths, common/softmax.h exp2_fma): ncu at 81d0a3a had the SFU queue full
    // at d = 64 (XU 74% of its peak, MIO throttle 28% of the stall samples, most at MUFU.EX2)
    // while the FMA pipe sat at 17%. 4k and 16k, non-causal and causal, twice.
    const std::vector<int> sl = {4096, 16384};
    g_library_schedule = true;
    for (int rep = 0; rep < 2; ++rep) {
      sweep<64, FwdTraits<64, 192, 128, 2, true, 0, 0, true>>("d64 plain 192x128", b, true, sl);
      sweep<64, FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false>, kSoftcap | kStaticMask>("d64 cap st e0", b, true, sl);
      sweep<64, FwdTraits<64, 192, 128, 2, true, 2, 0, true, false, 0, false>, kSoftcap | kStaticMask>("d64 cap st e2", b, true, sl);
      sweep<64, FwdTraits<64, 192, 128, 2, true, 3, 0, true, false, 0, false>, kSoftcap | kStaticMask>("d64 cap st e3", b, true, sl);
      sweep<64, FwdTraits<64, 192, 128, 2, true, 4, 0, true, false, 0, false>, kSoftcap | kStaticMask>("d64 cap st e4", b, true, sl);
      sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true>>("d128 plain 128x176", b, true, sl);
      sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true>, kSoftcap | kStaticMask>("d128 cap st mf e0", b, true, sl);
      sweep<128, FwdTraits<128, 128, 176, 2, true, 1, 0, true, false, 0, true>, kSoftcap | kStaticMask>("d128 cap st mf e1", b, true, sl);
      sweep<128, FwdTraits<128, 128, 176, 2, true, 2, 0, true, false, 0, true>, kSoftcap | kStaticMask>("d128 cap st mf e2", b, true, sl);
      sweep<256, FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2>>("d256 plain 128x80", b, true, sl);
      sweep<256, FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2, false>, kSoftcap | kStaticMask>("d256 cap st e0", b, true, sl);
      sweep<256, FwdTraits<256, 128, 80, 2, true, 2, 0, true, false, 2, false>, kSoftcap | kStaticMask>("d256 cap st e2", b, true, sl);
    }
    return 0;
  }
  if (std::string(only) == "profile2") {
    // One checked launch of each, for ncu (scripts/ncu_fwd90.sh): plain against softcap 30 on
    // the library's static tiles, d = 128 and 64, 8k non-causal.
    const std::vector<int> s8 = {8192};
    g_library_schedule = true;
    g_reps = 0;
    sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true>>("d128 plain 128x176", b, true, s8);
    sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 0, true>, kSoftcap | kStaticMask>("d128 cap st 128x176 mf", b, true, s8);
    sweep<64, FwdTraits<64, 192, 128, 2, true, 0, 0, true>>("d64 plain 192x128", b, true, s8);
    sweep<64, FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false>, kSoftcap | kStaticMask>("d64 cap st 192x128", b, true, s8);
    return 0;
  }
  if (std::string(only) == "profile3") {
    // One checked launch of each, for ncu (scripts/ncu_fwd90.sh profile3): plain against the
    // static-mask ALiBi instance on the library's d = 64 tile (192 x 128, sum tree), 8k,
    // non-causal and causal: ALiBi runs 0.83-0.87 of plain there, and taking its per-score FFMA
    // off (the bias of the blocks off the diagonal as a k16 step of the S GEMM, branch
    // alibigemm) gained nothing (benchmarks/NOTES.md 12.27).
    const std::vector<int> s8 = {8192};
    g_library_schedule = true;
    g_reps = 0;
    using L64 = FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 0, false, false, false, true>;
    sweep<64, L64>("d64 plain 192x128", b, true, s8);
    sweep<64, L64, kAlibi | kStaticMask>("d64 alibi st 192x128", b, true, s8);
    return 0;
  }
#ifndef TUNE_FWD90_MODS2_ONLY  // -DTUNE_FWD90_MODS2_ONLY: the "mods2", "profile2" and "profile3" modes alone
  if (std::string(only) == "phases") {
    // The library's tiles (fwd_launch.h: ping-pong, fused exponent; tiles.h fwd_tile_sm90 and
    // fwd_tile_sm90_short) with the phase clocks, on the shapes each serves.
    const size_t stamp_slots = size_t{16384} * 3 * fa::sm90::kFwdClockSlots;
    unsigned long long* stamps = nullptr;
    CHECK(cudaMalloc(&stamps, stamp_slots * 8));
    using Long128 = FwdTraits<128, 128, 176, 2, true, 0, 0, true, true>;
    using Short128 = FwdTraits<128, 128, 128, 2, true, 0, 0, true, true>;
    using Long64 = FwdTraits<64, 192, 128, 2, true, 0, 0, true, true>;
    using Short64 = FwdTraits<64, 128, 128, 2, true, 0, 0, true, true>;
    using Long256 = FwdTraits<256, 128, 80, 2, true, 0, 0, true, true>;
    using Short256 = FwdTraits<256, 128, 64, 2, true, 0, 0, true, true>;
    for (int seqlen : {1024, 2048, 4096, 16384}) {
      phases<128, Long128>("d128 128x176", b, stamps, stamp_slots, seqlen, false);
    }
    for (int seqlen : {4096, 16384}) phases<128, Long128>("d128 128x176", b, stamps, stamp_slots, seqlen, true);
    for (int seqlen : {1024, 2048}) phases<128, Short128>("d128 128x128", b, stamps, stamp_slots, seqlen, true);
    phases<64, Short64>("d64 128x128", b, stamps, stamp_slots, 1024, false);
    phases<64, Short64>("d64 128x128", b, stamps, stamp_slots, 1024, true);
    for (int seqlen : {2048, 16384}) {
      phases<64, Long64>("d64 192x128", b, stamps, stamp_slots, seqlen, false);
      phases<64, Long64>("d64 192x128", b, stamps, stamp_slots, seqlen, true);
    }
    for (int seqlen : {1024, 4096, 16384}) phases<256, Long256>("d256 128x80", b, stamps, stamp_slots, seqlen, false);
    for (int seqlen : {1024, 2048}) phases<256, Short256>("d256 128x64", b, stamps, stamp_slots, seqlen, true);
    // The TMA-store epilogues (kTmaStoreO 1: own boxes, 2: staged in Q's buffer).
    using Short128Box = FwdTraits<128, 128, 128, 2, true, 0, 0, true, true, 1>;
    using Long128InQ = FwdTraits<128, 128, 176, 2, true, 0, 0, true, true, 2>;
    using Long256InQ = FwdTraits<256, 128, 80, 2, true, 0, 0, true, true, 2>;
    using Short256InQ = FwdTraits<256, 128, 64, 2, true, 0, 0, true, true, 2>;
    for (int seqlen : {1024, 2048}) phases<128, Short128Box>("d128 128x128 box", b, stamps, stamp_slots, seqlen, true);
    phases<128, Long128InQ>("d128 128x176 inq", b, stamps, stamp_slots, 1024, false);
    phases<128, Long128InQ>("d128 128x176 inq", b, stamps, stamp_slots, 16384, true);
    phases<256, Long256InQ>("d256 128x80 inq", b, stamps, stamp_slots, 1024, false);
    phases<256, Short256InQ>("d256 128x64 inq", b, stamps, stamp_slots, 1024, true);
    return 0;
  }
  if (std::string(only) == "tmastore") {
    // The epilogue (FwdTraits kTmaStoreO; issue 9 item 2) on each library tile: 4-byte stores
    // from the registers (regs), a TMA store from boxes of its own (box: the tiles with shared
    // memory to spare) and a TMA store staged in Q's buffer (inq: every tile; Q's next load
    // waits for the store). Back to back, twice; each output checked against the sm80 kernel's.
    g_library_schedule = true;
    const std::vector<int> sl = {1024, 2048, 4096, 16384}, shorts = {1024, 2048};
    for (int rep = 0; rep < 2; ++rep) {
      sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true>>("d128 128x176 regs", b, true, sl);
      sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true, false, 2>>("d128 128x176 inq", b, true, sl);
      sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 0, true>>("d128 128x128 regs", b, true, shorts);
      sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 1>>("d128 128x128 box", b, true, shorts);
      sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 0, true, false, 2>>("d128 128x128 inq", b, true, shorts);
      sweep<64, FwdTraits<64, 192, 128, 2, true, 0, 0, true>>("d64 192x128 regs", b, true, sl);
      sweep<64, FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 1>>("d64 192x128 box", b, true, sl);
      sweep<64, FwdTraits<64, 192, 128, 2, true, 0, 0, true, false, 2>>("d64 192x128 inq", b, true, sl);
      sweep<64, FwdTraits<64, 128, 128, 2, true, 0, 0, true>>("d64 128x128 regs", b, true, {1024});
      sweep<64, FwdTraits<64, 128, 128, 2, true, 0, 0, true, false, 1>>("d64 128x128 box", b, true, {1024});
      sweep<64, FwdTraits<64, 128, 128, 2, true, 0, 0, true, false, 2>>("d64 128x128 inq", b, true, {1024});
      sweep<256, FwdTraits<256, 128, 80, 2, true, 0, 0, true>>("d256 128x80 regs", b, true, sl);
      sweep<256, FwdTraits<256, 128, 80, 2, true, 0, 0, true, false, 2>>("d256 128x80 inq", b, true, sl);
      sweep<256, FwdTraits<256, 128, 64, 2, true, 0, 0, true>>("d256 128x64 regs", b, false, shorts);
      sweep<256, FwdTraits<256, 128, 64, 2, true, 0, 0, true, false, 2>>("d256 128x64 inq", b, false, shorts);
    }
    return 0;
  }
#ifndef TUNE_FWD90_PHASES_ONLY  // -DTUNE_FWD90_PHASES_ONLY: the "phases" and "tmastore" modes alone
#ifndef TUNE_FWD90_HALVES_ONLY  // -DTUNE_FWD90_HALVES_ONLY (with SHORT_ONLY): short_halves alone
  if (std::string(only) == "short") {
    // Short rows (512 - 4096 keys), the shapes where the library's widest tiles lose most to
    // cuDNN: a causal tile of 128 (192) query rows over key blocks of 176 (128) computes keys
    // past the diagonal that narrower blocks skip (d = 128 1k causal: 30 blocks of 128 x 176,
    // 1.29x the triangle's entries, against 36 of 128 x 128, 1.12x). Each head dim's library
    // tile against narrower ones, the library's schedule, fast exponent on as in the library;
    // each configuration twice back to back (run-to-run spread).
    const std::vector<int> sl = {512, 1024, 2048, 4096};
    g_library_schedule = true;
    for (int rep = 0; rep < 2; ++rep) {
      sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true>>("d128 128x176", b, true, sl);
      sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 0, true>>("d128 128x128", b, true, sl);
      sweep<128, FwdTraits<128, 128, 96, 2, true, 0, 0, true>>("d128 128x96", b, true, sl);
      sweep<64, FwdTraits<64, 192, 128, 2, false, 0, 0, true>>("d64 192x128", b, true, sl);
      sweep<64, FwdTraits<64, 128, 128, 2, true, 0, 0, true>>("d64 128x128", b, true, sl);
      sweep<64, FwdTraits<64, 128, 96, 2, true, 0, 0, true>>("d64 128x96", b, true, sl);
      sweep<256, FwdTraits<256, 128, 80, 2, true, 0, 0, true>>("d256 128x80", b, true, sl);
      sweep<256, FwdTraits<256, 128, 64, 2, true, 0, 0, true>>("d256 128x64", b, true, sl);
      // The dynamic variant's instances on the same plain calls (no new instance to compile if
      // a short call takes those).
      sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 0, true>, kDynamicPlain>("d128 128x128 dyn", b, true, sl);
      sweep<64, FwdTraits<64, 128, 128, 2, true, 0, 0, true>, kDynamicPlain>("d64 128x128 dyn", b, true, sl);
      sweep<256, FwdTraits<256, 128, 64, 2, true, 0, 0, true>, kDynamicPlain>("d256 128x64 dyn", b, true, sl);
    }
    // The causal schedule the other way round from the library's at these lengths (persistent
    // for d <= 128, one CTA per tile for d = 256).
    g_library_schedule = false;
    for (int pass = 0; pass < 2; ++pass) {
      g_causal_persistent = pass == 0;
      std::printf("--- causal schedule: %s\n", pass == 0 ? "persistent" : "one CTA per tile");
      sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 0, true>>("d128 128x128", b, false, sl);
      sweep<64, FwdTraits<64, 128, 128, 2, true, 0, 0, true>>("d64 128x128", b, false, sl);
      sweep<256, FwdTraits<256, 128, 80, 2, true, 0, 0, true>>("d256 128x80", b, false, sl);
      sweep<256, FwdTraits<256, 128, 64, 2, true, 0, 0, true>>("d256 128x64", b, false, sl);
    }
    return 0;
  }
#endif  // TUNE_FWD90_HALVES_ONLY
  if (std::string(only) == "short_halves") {
    // The short-row tiles (tiles.h fwd_tile_sm90_short) with half blocks on (FwdTraits kHalves
    // 1: a boundary block's P V over the keys a consumer's rows see; NOTES 12.2): every causal
    // tile of 128 x 128 has a diagonal block of which consumer 0's rows see the first half, so
    // at 1k keys about 1 / 18 of the P V work is skipped (12.2 measured 3% lost to the per-step
    // choice where nothing is skipped, which the short instances, causal mostly, rarely have).
    // Off / on back to back, twice.
    const std::vector<int> sl = {512, 1024, 2048};
    g_library_schedule = true;
    for (int rep = 0; rep < 2; ++rep) {
      sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 0, true>>("d128 128x128 h0", b, true, sl);
      sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 1, true>>("d128 128x128 h1", b, true, sl);
      sweep<64, FwdTraits<64, 128, 128, 2, true, 0, 0, true>>("d64 128x128 h0", b, true, sl);
      sweep<64, FwdTraits<64, 128, 128, 2, true, 0, 1, true>>("d64 128x128 h1", b, true, sl);
      sweep<256, FwdTraits<256, 128, 64, 2, true, 0, 0, true>>("d256 128x64 h0", b, false, sl);
      sweep<256, FwdTraits<256, 128, 64, 2, true, 0, 1, true>>("d256 128x64 h1", b, false, sl);
    }
    return 0;
  }
#ifndef TUNE_FWD90_SHORT_ONLY  // -DTUNE_FWD90_SHORT_ONLY: the "short" modes' instances alone
  if (std::string(only) == "mods") {
    // The score-modifier variants at 4k and 16k (batch 16k / seqlen, 2048 / d heads), against
    // the static variant's tile: tiles, and the exponentials' share on the FMA pipe (eighths).
    const std::vector<int> sl = {4096, 16384};
    g_library_schedule = true;
    sweep<128, FwdTraits<128, 128, 176, 2, true>>("d128 plain 128x176", b, true, sl);
    sweep<128, FwdTraits<128, 128, 128, 2, true>>("d128 plain 128x128", b, true, sl);
    sweep<128, FwdTraits<128, 128, 128, 2, true, 0>, kSoftcap>("d128 softcap 128x128 e0", b, true, sl);
    sweep<128, FwdTraits<128, 128, 128, 2, true, 4>, kSoftcap>("d128 softcap 128x128 e4", b, true, sl);
    sweep<128, FwdTraits<128, 128, 176, 2, true, 0>, kSoftcap>("d128 softcap 128x176 e0", b, true, sl);
    sweep<128, FwdTraits<128, 128, 176, 2, true, 4>, kSoftcap>("d128 softcap 128x176 e4", b, true, sl);
    sweep<128, FwdTraits<128, 128, 128, 2, true>, kAlibi>("d128 alibi 128x128", b, true, sl);
    sweep<128, FwdTraits<128, 128, 176, 2, true>, kAlibi>("d128 alibi 128x176", b, true, sl);
    sweep<128, FwdTraits<128, 128, 128, 2, true, 4>, kBoth>("d128 both 128x128 e4", b, true, sl);
    sweep<128, FwdTraits<128, 128, 176, 2, true, 4>, kBoth>("d128 both 128x176 e4", b, true, sl);
    sweep<64, FwdTraits<64, 192, 128, 2, false>>("d64 plain 192x128", b, true, sl);
    sweep<64, FwdTraits<64, 192, 128, 2, false, 2>>("d64 plain 192x128 e2", b, true, sl);
    sweep<64, FwdTraits<64, 128, 128, 2, true, 0>, kSoftcap>("d64 softcap 128x128 e0", b, true, sl);
    sweep<64, FwdTraits<64, 128, 128, 2, true, 4>, kSoftcap>("d64 softcap 128x128 e4", b, true, sl);
    sweep<64, FwdTraits<64, 128, 128, 2, true, 6>, kSoftcap>("d64 softcap 128x128 e6", b, true, sl);
    sweep<64, FwdTraits<64, 128, 128, 2, true>, kAlibi>("d64 alibi 128x128", b, true, sl);
    sweep<64, FwdTraits<64, 192, 128, 2, false>, kAlibi>("d64 alibi 192x128", b, true, sl);
    // Window (1024, 0), causal 16k (the features benchmark's shape): persistent, then one CTA
    // per tile (fwd_launch.h causal_persistent).
    g_library_schedule = false;
    for (int pass = 0; pass < 2; ++pass) {
      g_causal_persistent = pass == 0;
      std::printf("--- window (1024, 0), causal schedule: %s\n",
                  pass == 0 ? "persistent" : "one CTA per tile");
      sweep<128, FwdTraits<128, 128, 128, 2, true>, kWindow1k>("d128 window1k 128x128", b, false,
                                                               {16384});
      sweep<64, FwdTraits<64, 128, 128, 2, true>, kWindow1k>("d64 window1k 128x128", b, false,
                                                             {16384});
    }
    return 0;
  }
  if (std::string(only) == "softcap2") {
    // Softcap 30 (4k / 16k) on the sm80 kernel: the bounded reference (problem/score_mod.h)
    // against the running max (kRunningMax) on the same data, in the sm80 column (the sm90
    // column runs the library's sm90 softcap instance in both). Measured on the H200 in session
    // 17 (tune_fwd90_v6_softcap2_h200.txt): on the sm90 kernel the bounded reference gained
    // ~3% on average (within the run-to-run spread), so sm90 keeps the running max; key blocks of
    // 64 / 96 / 160 / 176, 3 stages, no ping-pong and 3 consumers all lost to 128 x 128 there.
    const std::vector<int> sl = {4096, 16384};
    g_library_schedule = true;
    sweep<128, FwdTraits<128, 128, 176, 2, true>>("d128 plain", b, true, sl);
    sweep<128, FwdTraits<128, 128, 128, 2, true>, kSoftcap | kRunningMax>("d128 softcap runmax", b, true, sl);
    sweep<128, FwdTraits<128, 128, 128, 2, true>, kSoftcap>("d128 softcap bounded", b, true, sl);
    sweep<64, FwdTraits<64, 192, 128, 2, false>>("d64 plain", b, true, sl);
    sweep<64, FwdTraits<64, 128, 128, 2, true>, kSoftcap | kRunningMax>("d64 softcap runmax", b, true, sl);
    sweep<64, FwdTraits<64, 128, 128, 2, true>, kSoftcap>("d64 softcap bounded", b, true, sl);
    return 0;
  }
  if (std::string(only) == "halves") {
    // FwdTraits kHalves 0 / 1 / 2 (off, P V only, S and P V) back to back: boundary blocks of
    // which a consumer's rows see only one half get the GEMMs over that half alone (the causal
    // diagonal, a window's left edge, the key tail). Window (1024, 0) at 16k persistent, twice,
    // then key blocks of 64 / 96 there; causal and non-causal on the library tiles.
    const std::vector<int> sl = {1024, 4096, 16384};
    g_library_schedule = true;
    for (int rep = 0; rep < 2; ++rep) {
      sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 0>, kWindow1k>("d128 window1k h0", b, false, {16384});
      sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 1>, kWindow1k>("d128 window1k h1", b, false, {16384});
      sweep<64, FwdTraits<64, 128, 128, 2, true, 0, 0>, kWindow1k>("d64 window1k h0", b, false, {16384});
      sweep<64, FwdTraits<64, 128, 128, 2, true, 0, 1>, kWindow1k>("d64 window1k h1", b, false, {16384});
    }
    sweep<128, FwdTraits<128, 128, 64, 2, true, 0, 0>, kWindow1k>("d128 window1k 128x64", b, false, {16384});
    sweep<128, FwdTraits<128, 128, 64, 3, true, 0, 0>, kWindow1k>("d128 window1k 128x64 s3", b, false, {16384});
    sweep<128, FwdTraits<128, 128, 96, 2, true, 0, 0>, kWindow1k>("d128 window1k 128x96", b, false, {16384});
    sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0>>("d128 128x176 h0", b, true, sl);
    sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 1>>("d128 128x176 h1", b, true, sl);
    sweep<64, FwdTraits<64, 192, 128, 2, false, 0, 0>>("d64 192x128 h0", b, false, sl);
    sweep<64, FwdTraits<64, 192, 128, 2, false, 0, 1>>("d64 192x128 h1", b, false, sl);
    return 0;
  }
  if (std::string(only) == "fastexp") {
    // FwdTraits kWarpFusedExp off / on back to back (the plain exponent as one FFMA where a
    // warp's row maxima allow, common/softmax.h): library tiles and schedule.
    const std::vector<int> sl = {1024, 4096, 16384};
    g_library_schedule = true;
    for (int rep = 0; rep < 2; ++rep) {
      sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, false>>("d128 128x176 exp off", b, true, sl);
      sweep<128, FwdTraits<128, 128, 176, 2, true, 0, 0, true>>("d128 128x176 exp on", b, true, sl);
    }
    sweep<64, FwdTraits<64, 192, 128, 2, false, 0, 0, false>>("d64 192x128 exp off", b, true, sl);
    sweep<64, FwdTraits<64, 192, 128, 2, false, 0, 0, true>>("d64 192x128 exp on", b, true, sl);
    sweep<256, FwdTraits<256, 128, 80, 2, true, 0, 0, false>>("d256 128x80 exp off", b, true, sl);
    sweep<256, FwdTraits<256, 128, 80, 2, true, 0, 0, true>>("d256 128x80 exp on", b, true, sl);
    sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 0, false>, kWindow1k>("d128 window1k exp off", b, false, {16384});
    sweep<128, FwdTraits<128, 128, 128, 2, true, 0, 0, true>, kWindow1k>("d128 window1k exp on", b, false, {16384});
    return 0;
  }
  if (std::string(only) == "profile") {
    // One launch of each kernel for ncu (run under `ncu -k regex:fwd_kernel ...`): d = 128 at 8k
    // non-causal, plain on the static tile and on 128 x 128, softcap 30, ALiBi; window
    // (1024, 0) causal at 16k on the persistent grid.
    const std::vector<int> s8 = {8192};
    g_library_schedule = true;
    g_reps = 0;
    sweep<128, FwdTraits<128, 128, 176, 2, true>>("d128 plain 128x176", b, true, s8);
    sweep<128, FwdTraits<128, 128, 128, 2, true>>("d128 plain 128x128", b, true, s8);
    sweep<128, FwdTraits<128, 128, 128, 2, true>, kSoftcap>("d128 softcap 128x128", b, true, s8);
    sweep<128, FwdTraits<128, 128, 176, 2, true>, kAlibi>("d128 alibi 128x176", b, true, s8);
    sweep<128, FwdTraits<128, 128, 128, 2, true>, kWindow1k>("d128 window1k 128x128", b, false,
                                                             {16384});
    return 0;
  }
  auto want = [&](int d) { return only[0] == 0 || std::atoi(only) == d; };
  // Non-causal rows are independent of the causal schedule: the second pass (one CTA per causal
  // tile) shows its causal rows only.
  for (int pass = 0; pass < 2; ++pass) {
    g_causal_persistent = pass == 0;
    std::printf("--- causal schedule: %s\n", pass == 0 ? "persistent, longest first in L2 groups"
                                                       : "one CTA per tile");
    if (want(128)) {
      sweep<128, FwdTraits<128, 128, 176, 2, true>>("128x176 s2 pingpong", b, pass == 0);
      sweep<128, FwdTraits<128, 128, 128, 2, true>>("128x128 s2 pingpong", b, pass == 0);
    }
    if (want(64)) {
      sweep<64, FwdTraits<64, 192, 128, 2, false>>("192x128 s2 (3 consumers)", b, pass == 0);
      sweep<64, FwdTraits<64, 128, 128, 2, true>>("128x128 s2 pingpong", b, pass == 0);
    }
    if (want(256)) {
      sweep<256, FwdTraits<256, 128, 80, 2, true>>("128x80 s2 pingpong", b, pass == 0);
      sweep<256, FwdTraits<256, 128, 64, 2, true>>("128x64 s2 pingpong", b, pass == 0);
    }
  }
#endif  // TUNE_FWD90_SHORT_ONLY
#endif  // TUNE_FWD90_PHASES_ONLY
#endif  // TUNE_FWD90_MODS2_ONLY
#endif  // TUNE_FWD90_CAP3_ONLY
#endif  // TUNE_FWD90_MAXTREE_ONLY
#endif  // TUNE_FWD90_ALIBI_ONLY
#endif  // TUNE_FWD90_SERIAL_ONLY
  return 0;
}
