// The sm90a backward's tile order for windows (sm90/bwd_launch.h run_bwd_ordered, problem/
// scheduler.h key_tile_at), torch-free: window (1024, 0), causal, bf16, d 128, 16 heads, batch
// = 16k / seqlen (the features bench's shapes), the whole backward (preprocess, main kernel,
// convert) with key_tile's order (A) and with the light trailing key blocks last (B), timed
// interleaved (harness.h ab_ms); B's dk / dv checked bitwise equal to A's (the order moves no
// arithmetic of a tile) and its dq within the atomics' reordering. The causal backward of the
// same shape is timed for the window's speedup (mode `defer`, the default).
// Mode `pdl`: the same pipeline with each kernel launched whole (A) and with the main kernel and
// the convert launched programmatically (B; bwd/pipeline.h), on windows (128, 0) and (1024, 0) at
// 16k and causal at 1k, 2k and 16k (batch 16k / seqlen), timed interleaved; B's dk / dv bitwise
// equal to A's, dq within the atomics' reordering. Mode `profile`: one programmatic backward of
// window (1024, 0) and one of causal, at 16k, for ncu (scripts/ncu_bwd90.sh). Mode `ws`: the
// library's backward (A) against the warp-specialized main kernel (B; sm90/bwd_ws_kernel.h,
// compiled here through FLASHATTN_CU_BWD_WS), on the `pdl` shapes and non-causal 1k / 4k, dk /
// dv bitwise equal (the same wgmma sequence), dq within the atomics' reordering. These three
// modes take the head dims as a second argument ("64,128"; default 128; d 256 has no warp-
// specialized kernel). Modes `bm128` and `kvregs` (d 64 only, the `ws` shapes): the library's
// backward against its main kernel on 128-row query blocks (B; BwdTraits<64, 128>, dK retired
// within its step), and the main kernel with K / V read from shared memory by S^T / dP^T (A)
// against the library's, which holds them as register A fragments (B); kvregs also times
// softcap 30 and ALiBi (their static-mask instances) causal at 16k and non-causal at 4k. Mode
// `dqone` (d 64, kvregs' shapes): the library against its main kernel with each step's dQ GEMM
// by one warpgroup (B; BwdTraits kDqOneWg). Modes `dqprobe`, `stagger`, `residual` (d 256: P^T's
// residual in e4m3 and none) and `earlydv` (dV issued before the wait for dP^T;
// -DTUNE_BWD90_EARLYDV_ONLY builds it alone): variant_cases below.
// Mode `lpt` (head dims as the second argument, default 64,128,256; 64,128 in the
// -DTUNE_BWD90_EARLYDV_ONLY build, 256 in the -DTUNE_BWD90_D256_ONLY one): causal key tiles
// head after head against longest first over all tiles (lpt_cases below).
// Build and run (device):
//   nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -DFLASHATTN_CU_HAS_SM90A=1 \
//        -gencode arch=compute_90a,code=sm_90a -Icsrc/include -Icsrc/flash \
//        benchmarks/tune/tune_bwd90.cu csrc/flash/tma_host.cu -o /tmp/tune_bwd90 && /tmp/tune_bwd90 [mode [dims]]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#define FLASHATTN_CU_BWD_WS 1
#include "fwd90_harness.h"
#include "library_status.h"
#include "sm90/bwd_launch.h"

namespace {

constexpr int kD = 128;

struct BwdBuffers {
  __nv_bfloat16 *dout, *dq, *dk, *dv, *dq_a, *dk_a, *dv_a;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// The backward of the forward call fp (whose o and lse b holds once run_sm80 ran it).
fa::BwdParams bwd_params(const fa::FwdParams& fp, BwdBuffers& g) {
  fa::BwdParams p;
  static_cast<fa::AttnParams&>(p) = fp;
  p.o = fp.o;
  p.lse = fp.lse;
  p.dout = g.dout;
  p.dq = g.dq;
  p.dk = g.dk;
  p.dv = g.dv;
  p.do_batch_stride = p.dq_batch_stride = p.dk_batch_stride = p.dv_batch_stride = fp.q_batch_stride;
  p.do_row_stride = p.dq_row_stride = p.dk_row_stride = p.dv_row_stride = fp.q_row_stride;
  p.do_head_stride = p.dq_head_stride = p.dk_head_stride = p.dv_head_stride = fp.q_head_stride;
  const size_t bytes = fa::backward::bwd_workspace_layout(p).bytes;
  if (bytes > g.workspace_bytes) {
    if (g.workspace != nullptr) CHECK(cudaFree(g.workspace));
    CHECK(cudaMalloc(&g.workspace, bytes));
    g.workspace_bytes = bytes;
  }
  p.workspace = g.workspace;
  return p;
}

// A timing probe of a main kernel's traits (modes dqprobe): bwd_kernel.h / bwd_split_kernel.h
// kProbeDq.
template <typename Lib, int kProbe>
struct DqProbe : Lib {
  static constexpr int kProbeDq = kProbe;
};

}  // namespace

// Two backwards of the same call (whose forward ran): A's gradients kept, B's (into NaN-poisoned
// outputs) compared with them, then both timed interleaved (harness.h ab_ms).
struct AbCompare {
  AbTimes t;
  float ddk, ddv, ddq;
  bool same() const { return ddk == 0.f && ddv == 0.f && ddq < 2e-2f; }
};
template <typename RunA, typename RunB>
AbCompare ab_compare(const RunA& run_a, const RunB& run_b, const Buffers& b, BwdBuffers& g,
                     size_t n) {
  run_a();
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(g.dq_a, g.dq, n * 2, cudaMemcpyDeviceToDevice));
  CHECK(cudaMemcpy(g.dk_a, g.dk, n * 2, cudaMemcpyDeviceToDevice));
  CHECK(cudaMemcpy(g.dv_a, g.dv, n * 2, cudaMemcpyDeviceToDevice));
  for (__nv_bfloat16* x : {g.dq, g.dk, g.dv}) CHECK(cudaMemset(x, 0xff, n * 2));  // NaN poison
  run_b();
  CHECK(cudaDeviceSynchronize());
  AbCompare r;
  r.ddk = max_diff(g.dk, g.dk_a, n, b.diff);
  r.ddv = max_diff(g.dv, g.dv_a, n, b.diff);
  r.ddq = max_diff(g.dq, g.dq_a, n, b.diff);
  r.t = ab_ms(run_a, run_b, 30, 4);
  return r;
}

// Modes pdl / profile / ws / bm128 / kvregs / dqone at head dim D (2048 / D heads).
template <int D>
void ab_cases(const char* mode, const Buffers& b, BwdBuffers& g, size_t n) {
  namespace sm90 = fa::sm90;
  const bool profile = std::strcmp(mode, "profile") == 0;
  const bool ws = std::strcmp(mode, "ws") == 0;
  const bool bm128 = std::strcmp(mode, "bm128") == 0;
  const bool kvregs = std::strcmp(mode, "kvregs") == 0;
  const bool dqone = std::strcmp(mode, "dqone") == 0;
  const bool d64_b = bm128 || kvregs || dqone;  // a BwdTraits variant of the library's, at d 64
  struct Case {
    const char* name;
    int seqlen, left;  // left -1: causal, -2: neither causal nor a window
    int mods = kNoMods;  // fwd90_harness.h Mods: softcap 30 or ALiBi (modes kvregs, dqone)
  };
  const Case cases[] = {{"window (128, 0)", 16384, 128}, {"window (1024, 0)", 16384, 1024},
                        {"causal", 1024, -1},          {"causal", 2048, -1},
                        {"causal", 16384, -1},         {"full", 1024, -2},
                        {"full", 4096, -2},            {"softcap causal", 16384, -1, kSoftcap},
                        {"softcap full", 4096, -2, kSoftcap},
                        {"alibi causal", 16384, -1, kAlibi},
                        {"alibi full", 4096, -2, kAlibi}};
  for (const Case& c : cases) {
    if (profile && !(c.seqlen == 16384 && c.left != 128)) continue;
    if (!ws && !d64_b && c.left == -2) continue;
    if (!kvregs && !dqone && c.mods != kNoMods) continue;
    fa::FwdParams fp;
    if (c.mods != kNoMods) {
      mods_params(b, D, c.seqlen, c.left == -1, c.mods, &fp);
    } else if (c.left >= 0) {
      mods_params(b, D, c.seqlen, true, kWindow1k, &fp);
      fp.window_left = c.left;
    } else {
      fp = make_params(b, D, c.seqlen, c.left == -1);
    }
    const fa::BwdParams p = bwd_params(fp, g);
    // A / B: the library's backward with each kernel launched whole / programmatically; ws: the
    // library's (programmatic) / the warp-specialized main kernel's; bm128 / dqone: the
    // library's / a BwdTraits variant of its main kernel; kvregs: the variant (K / V from shared
    // memory) / the library's.
    auto run = [&](bool b_side) {
      fa::Status st = fa::Status::kSuccess;
      const bool variant = d64_b && (kvregs ? !b_side : b_side);
      if (!variant) {
        st = ws ? sm90::run_bwd_ordered<__nv_bfloat16, D>(p, 0, true, true, b_side)
                : sm90::run_bwd_ordered<__nv_bfloat16, D>(p, 0, true, d64_b || b_side);
      } else if constexpr (D == 64) {
        if (bm128) {
          st = sm90::run_bwd_with<__nv_bfloat16, D, sm90::BwdTraits<D, 128>, false>(p, 0, true,
                                                                                  true);
        } else if (dqone) {  // dQ by one warpgroup a step
          st = sm90::run_bwd_with<__nv_bfloat16, D, sm90::BwdTraits<D, 64, true, true, true>,
                                  false>(p, 0, true, true);
        } else {  // kvregs: S^T / dP^T with K / V read from shared memory
          st = sm90::run_bwd_with<__nv_bfloat16, D, sm90::BwdTraits<D, 64, true, false>, false>(
              p, 0, true, true);
        }
      }
      if (st != fa::Status::kSuccess) {
        std::printf("backward launch failed (%d)\n", static_cast<int>(st));
      }
    };
    if (run_sm80<D>(fp) != fa::Status::kSuccess) std::printf("forward launch failed\n");
    if (profile) {
      run(true);
      CHECK(cudaDeviceSynchronize());
      std::printf("profiled %s d=%d s=%d\n", c.name, D, c.seqlen);
      continue;
    }
    const AbCompare r = ab_compare([&] { run(false); }, [&] { run(true); }, b, g, n);
    std::printf("bwd %s d=%d s=%5d: %s %.4f ms, %s %.4f ms, time ratio %.4f; "
                "max|diff| dk %.1e dv %.1e dq %.1e%s\n",
                c.name, D, c.seqlen,
                kvregs ? "K / V from shared memory" : ws || bm128 || dqone ? "library" : "whole",
                r.t.a_ms,
                bm128    ? "128-row query blocks"
                : dqone  ? "dQ by one warpgroup"
                : kvregs ? "library (K / V in registers)"
                : ws     ? "warp-specialized"
                         : "programmatic",
                r.t.b_ms, r.t.b_over_a, r.ddk, r.ddv,
                r.ddq,
                r.same() ? "" : "  DIFFERS");
    if constexpr (D != 256) {  // d 256: the split kernel, no warp-specialized one
      if (ws) {
        // The warp-specialized kernel with two Q buffers (C: the producer's loads of step it + 1
        // wait for step it's S^T, as in d668326's ring) against the library.
        auto run_c = [&] {
          using TwoQ = sm90::BwdWsTraits<D, 64, true, 2, 2>;
          const fa::Status st =
              sm90::run_bwd_with<__nv_bfloat16, D, TwoQ, true>(p, 0, true, true);
          if (st != fa::Status::kSuccess) {
            std::printf("backward launch failed (%d)\n", static_cast<int>(st));
          }
        };
        const AbCompare rc = ab_compare([&] { run(false); }, run_c, b, g, n);
        std::printf("bwd %s d=%d s=%5d: library %.4f ms, warp-specialized, two Q buffers "
                    "%.4f ms, time ratio %.4f; max|diff| dk %.1e dv %.1e dq %.1e%s\n",
                    c.name, D, c.seqlen, rc.t.a_ms, rc.t.b_ms, rc.t.b_over_a, rc.ddk, rc.ddv,
                    rc.ddq, rc.same() ? "" : "  DIFFERS");
      }
    }
    std::fflush(stdout);
  }
}

// Modes dqprobe (head dims 64 / 128 / 256) and stagger (d 256): the library's backward (A)
// against its main kernel with another traits type, B and C: dqprobe without dQ's reductions into
// the accumulator (B) and without dQ at all (C), to time what dQ costs (dq then wrong; dk / dv
// bitwise equal); stagger: the split kernel's warpgroup 1 issuing dP^T once warpgroup 0's S^T has
// retired (B) or been issued (C), everything bitwise equal but dq (the reductions' order);
// bulkdq (d 256): the split kernel's dQ by red.adds (B; BwdSplitTraits kBulkDq off, the library
// before NOTES 12.41), and the library with stagger 1 (C); issuer (d 256): the red.adds (B) and
// the library with the reductions and loads issued by warpgroup 1 (C; BwdSplitTraits kIssuerWg;
// the library's since b46f65f, so A and C are the same kernel now); earlydv (d 64 / 128): the
// library's main kernel with dV issued before the wait for dP^T (B; BwdTraits kEarlyDv), and the
// library again (C: an A / A pair, the noise). (Modes rotate and pair, the split kernel's rotated
// walk and two-CTA dQ exchange, were dropped unrun after benchmarks/tune/reduce_rate.cu measured
// the exchange slower than the adds it saves, NOTES 12.43; in the history before this note.)
// residual (d 256): the split kernel with what P^T's 16 bits leave out passed in e4m3 (B;
// BwdSplitTraits kPLowBits 8: 4 KB a step instead of 8) and not at all (C; 0: dS^T from the
// 16-bit P^T, the library before f057217); dk / dq differ from A's by the residual's rounding
// (B) or by the second rounding of dS^T (C), dv bitwise equal.
template <int D>
void variant_cases(const char* mode, const Buffers& b, BwdBuffers& g, size_t n) {
  namespace sm90 = fa::sm90;
  constexpr bool kSplit = fa::bwd_tile_sm90(D).split;
  constexpr int kBlockM = fa::bwd_tile_sm90(D).block_m;
  using Lib = std::conditional_t<kSplit, sm90::BwdSplitTraits<D, kBlockM>,
                                 sm90::BwdTraits<D, kBlockM>>;
  const bool stagger = std::strcmp(mode, "stagger") == 0;
  const bool bulkdq = std::strcmp(mode, "bulkdq") == 0;
  const bool issuer = std::strcmp(mode, "issuer") == 0;
  const bool earlydv = std::strcmp(mode, "earlydv") == 0;
  const bool residual = std::strcmp(mode, "residual") == 0;
  struct Case {
    const char* name;
    int seqlen, left;  // left -1: causal, -2: neither
  };
  const Case cases[] = {{"window (1024, 0)", 16384, 1024}, {"causal", 1024, -1},
                        {"causal", 16384, -1}, {"full", 4096, -2}, {"full", 16384, -2}};
  for (const Case& c : cases) {
    fa::FwdParams fp;
    if (c.left >= 0) {
      mods_params(b, D, c.seqlen, true, kWindow1k, &fp);
      fp.window_left = c.left;
    } else {
      fp = make_params(b, D, c.seqlen, c.left == -1);
    }
    const fa::BwdParams p = bwd_params(fp, g);
    const auto check = [](fa::Status st) {
      if (st != fa::Status::kSuccess) {
        std::printf("backward launch failed (%d)\n", static_cast<int>(st));
      }
    };
    const auto run_a = [&] { check(sm90::run_bwd_ordered<__nv_bfloat16, D>(p, 0, true)); };
    // B and C: split-kernel traits of modes stagger / bulkdq, or the probes.
    const auto run_split = [&](auto traits) {
      check(sm90::run_bwd_with<__nv_bfloat16, D, decltype(traits), false>(p, 0, true, true));
    };
    const auto run_b = [&] {
      if constexpr (kSplit) {
        if (stagger) return run_split(sm90::BwdSplitTraits<D, kBlockM, 1>{});
        if (bulkdq || issuer) return run_split(sm90::BwdSplitTraits<D, kBlockM, 0, false>{});
        if (residual) return run_split(sm90::BwdSplitTraits<D, kBlockM, 0, true, 1, 8>{});
      } else {
        if (earlydv) {
          using Early = sm90::BwdTraits<D, kBlockM, Lib::kDkNext, Lib::kKvRegs, Lib::kDqOneWg, true>;
          return check(sm90::run_bwd_with<__nv_bfloat16, D, Early, false>(p, 0, true, true));
        }
      }
      check(sm90::run_bwd_with<__nv_bfloat16, D, DqProbe<Lib, 1>, false>(p, 0, true, true));
    };
    const auto run_c = [&] {
      if constexpr (kSplit) {
        if (stagger) return run_split(sm90::BwdSplitTraits<D, kBlockM, 2>{});
        if (bulkdq) return run_split(sm90::BwdSplitTraits<D, kBlockM, 1, true>{});
        if (issuer) return run_split(sm90::BwdSplitTraits<D, kBlockM, 0, true, 1>{});
        if (residual) return run_split(sm90::BwdSplitTraits<D, kBlockM, 0, true, 1, 0>{});
      } else {
        if (earlydv) return check(sm90::run_bwd_with<__nv_bfloat16, D, Lib, false>(p, 0, true, true));
      }
      check(sm90::run_bwd_with<__nv_bfloat16, D, DqProbe<Lib, 2>, false>(p, 0, true, true));
    };
    if (run_sm80<D>(fp) != fa::Status::kSuccess) std::printf("forward launch failed\n");
    const AbCompare rb = ab_compare(run_a, run_b, b, g, n);
    const AbCompare rc = ab_compare(run_a, run_c, b, g, n);
    std::printf("bwd %s d=%d s=%5d: library %.4f ms; %s %.4f ms (ratio %.4f, max|diff| dk %.1e "
                "dv %.1e dq %.1e); %s %.4f ms (ratio %.4f, max|diff| dk %.1e dv %.1e dq %.1e)\n",
                c.name, D, c.seqlen, rb.t.a_ms,
                stagger  ? "dP^T after S^T retired"
                : bulkdq || issuer ? "dQ by red.adds"
                : earlydv          ? "dV before dP^T's wait"
                : residual         ? "P's residual in e4m3"
                         : "no dQ reductions",
                rb.t.b_ms, rb.t.b_over_a, rb.ddk, rb.ddv, rb.ddq,
                stagger  ? "dP^T after S^T issued"
                : bulkdq ? "bulk, dP^T after S^T retired"
                : issuer ? "bulk, issued by warpgroup 1"
                : earlydv ? "library again"
                : residual ? "no residual (dS rounded twice)"
                         : "no dQ",
                rc.t.b_ms, rc.t.b_over_a, rc.ddk,
                rc.ddv, rc.ddq);
    std::fflush(stdout);
  }
}

// Mode lpt: causal backwards (bf16, 1k-16k, the benchmark's shapes) with the key tiles head after
// head (the library's, A) against longest first over all tiles (B: run_bwd_with causal_lpt,
// every key block deferred), interleaved; dk / dv bitwise equal expected (each tile's own), dq
// within the reductions' order. A list-scheduling model of the hardware's hand-out (NOTES 12.45)
// puts A 3-7% over the mean load at 1k-8k and B within 1%; B reads each head's Q / dO from
// tiles further apart in time (L2).
template <int D>
void lpt_cases(const Buffers& b, BwdBuffers& g, size_t n) {
  namespace sm90 = fa::sm90;
  for (int seqlen : {1024, 2048, 4096, 8192, 16384}) {
    const fa::FwdParams fp = make_params(b, D, seqlen, true);
    const fa::BwdParams p = bwd_params(fp, g);
    const auto run = [&](bool lpt) {
      const fa::Status st = sm90::run_bwd_ordered<__nv_bfloat16, D>(p, 0, true, true, false, lpt);
      if (st != fa::Status::kSuccess) {
        std::printf("backward launch failed (%d)\n", static_cast<int>(st));
      }
    };
    if (run_sm80<D>(fp) != fa::Status::kSuccess) std::printf("forward launch failed\n");
    const AbCompare r = ab_compare([&] { run(false); }, [&] { run(true); }, b, g, n);
    std::printf("bwd causal d=%d s=%5d: head after head %.4f ms, longest first over all %.4f ms, "
                "time ratio %.4f; max|diff| dk %.1e dv %.1e dq %.1e\n",
                D, seqlen, r.t.a_ms, r.t.b_ms, r.t.b_over_a, r.ddk, r.ddv, r.ddq);
    std::fflush(stdout);
  }
}

int lpt_modes(int argc, char** argv, const Buffers& b, BwdBuffers& g, size_t n,
              const char* default_dims) {
  const std::string dims = argc > 2 ? argv[2] : default_dims;
#ifndef TUNE_BWD90_D256_ONLY
  if (dims.find("64") != std::string::npos) lpt_cases<64>(b, g, n);
  if (dims.find("128") != std::string::npos) lpt_cases<128>(b, g, n);
#endif
#ifndef TUNE_BWD90_EARLYDV_ONLY
  if (dims.find("256") != std::string::npos) lpt_cases<256>(b, g, n);
#endif
  return 0;
}

// Mode earlydv at head dims argv[2] (default "64,128").
#ifndef TUNE_BWD90_D256_ONLY  // (its d 64 / 128 kernels)
int earlydv_cases(int argc, char** argv, const Buffers& b, BwdBuffers& g, size_t n) {
  const std::string dims = argc > 2 ? argv[2] : "64,128";
  if (dims.find("64") != std::string::npos) variant_cases<64>("earlydv", b, g, n);
  if (dims.find("128") != std::string::npos) variant_cases<128>("earlydv", b, g, n);
  return 0;
}
#endif

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "defer";
  const size_t n = 16384ull * 2048;
  Buffers b;
  BwdBuffers g;
  for (__nv_bfloat16** x : {&b.q, &b.k, &b.v, &b.o, &b.o_ref, &g.dout, &g.dq, &g.dk, &g.dv,
                            &g.dq_a, &g.dk_a, &g.dv_a}) {
    CHECK(cudaMalloc(x, n * 2));
  }
  CHECK(cudaMalloc(&b.lse, 16384ull * 64 * 4));
  {  // ALiBi slopes 2^(-8 (h + 1) / heads) (mode kvregs)
    std::vector<float> slopes(64);
    for (int h = 0; h < 64; ++h) slopes[h] = std::exp2(-8.f * (h + 1) / 64.f);
    CHECK(cudaMalloc(&b.slopes, 64 * 4));
    CHECK(cudaMemcpy(b.slopes, slopes.data(), 64 * 4, cudaMemcpyHostToDevice));
  }
  CHECK(cudaMalloc(&b.diff, 4));
  fill_random<<<1024, 256>>>(b.q, n, 1);
  fill_random<<<1024, 256>>>(b.k, n, 2);
  fill_random<<<1024, 256>>>(b.v, n, 3);
  fill_random<<<1024, 256>>>(g.dout, n, 4);
  CHECK(cudaDeviceSynchronize());
  namespace sm90 = fa::sm90;
#ifdef TUNE_BWD90_EARLYDV_ONLY
  // A build of mode earlydv alone (the d 64 / 128 main kernels: device_run.sh
  // TUNE_BWD_NVCC_FLAGS=-DTUNE_BWD90_EARLYDV_ONLY).
  if (std::strcmp(mode, "earlydv") == 0) return earlydv_cases(argc, argv, b, g, n);
  if (std::strcmp(mode, "lpt") == 0) return lpt_modes(argc, argv, b, g, n, "64,128");
  std::printf("mode %s: not in this build (TUNE_BWD90_EARLYDV_ONLY)\n", mode);
  return 1;
#else
  if (std::strcmp(mode, "stagger") == 0 || std::strcmp(mode, "bulkdq") == 0 ||
      std::strcmp(mode, "issuer") == 0 || std::strcmp(mode, "residual") == 0) {
    variant_cases<256>(mode, b, g, n);
    return 0;
  }
#ifdef TUNE_BWD90_D256_ONLY
  // A build of the d 256 modes alone (stagger, bulkdq, issuer, lpt at d 256; the d 256 kernels
  // only: device_run.sh TUNE_BWD_NVCC_FLAGS=-DTUNE_BWD90_D256_ONLY). Nothing in it may
  // instantiate a d 64 / 128 kernel (earlydv_cases and lpt_modes' other dims are left out).
  if (std::strcmp(mode, "lpt") == 0) return lpt_modes(argc, argv, b, g, n, "256");
  std::printf("mode %s: not in this build (TUNE_BWD90_D256_ONLY)\n", mode);
  return 1;
#else
  if (std::strcmp(mode, "bm128") == 0 || std::strcmp(mode, "kvregs") == 0 ||
      std::strcmp(mode, "dqone") == 0) {
    // d 64 only (at d 128 neither the 128-row step nor K / V's fragments fit the registers)
    ab_cases<64>(mode, b, g, n);
    return 0;
  }
  if (std::strcmp(mode, "earlydv") == 0) return earlydv_cases(argc, argv, b, g, n);
  if (std::strcmp(mode, "lpt") == 0) return lpt_modes(argc, argv, b, g, n, "64,128,256");
  if (std::strcmp(mode, "dqprobe") == 0) {
    const std::string dims = argc > 2 ? argv[2] : "64,128,256";
    if (dims.find("64") != std::string::npos) variant_cases<64>(mode, b, g, n);
    if (dims.find("128") != std::string::npos) variant_cases<128>(mode, b, g, n);
    if (dims.find("256") != std::string::npos) variant_cases<256>(mode, b, g, n);
    return 0;
  }
  if (std::strcmp(mode, "pdl") == 0 || std::strcmp(mode, "profile") == 0 ||
      std::strcmp(mode, "ws") == 0) {
    // Head dims: argv[2] (e.g. "64,256"; default 128).
    const std::string dims = argc > 2 ? argv[2] : "128";
    if (dims.find("64") != std::string::npos) ab_cases<64>(mode, b, g, n);
    if (dims.find("128") != std::string::npos) ab_cases<128>(mode, b, g, n);
    if (dims.find("256") != std::string::npos && std::strcmp(mode, "ws") != 0) {
      ab_cases<256>(mode, b, g, n);
    }
    return 0;
  }
  for (int seqlen : {4096, 8192, 16384}) {
    fa::FwdParams fw, fc;
    mods_params(b, kD, seqlen, true, kWindow1k, &fw);
    fc = make_params(b, kD, seqlen, true);
    const fa::BwdParams pw = bwd_params(fw, g);
    const fa::BwdParams pc = bwd_params(fc, g);
    // Key blocks the window's tile order defers (128-key blocks at d 128).
    const int defer = fa::deferred_key_blocks(pw, sm90::BwdTraits<kD, 64>::kBlockN);
    auto run = [](const fa::BwdParams& p, bool defer_light) {
      const fa::Status st = sm90::run_bwd_ordered<__nv_bfloat16, kD>(p, 0, defer_light);
      if (st != fa::Status::kSuccess) std::printf("backward launch failed (%d)\n", static_cast<int>(st));
    };
    // The window's forward, then A's gradients kept, then B's compared.
    if (run_sm80<kD>(fw) != fa::Status::kSuccess) std::printf("forward launch failed\n");
    const AbCompare r = ab_compare([&] { run(pw, false); }, [&] { run(pw, true); }, b, g, n);
    const AbTimes& t = r.t;
    // The pipeline's fixed part (preprocess with the dq accumulator's clear, the convert of dq),
    // the same for the window and causal calls: the pipeline with no main kernel.
    const float fixed_ms = median_ms(
        [&] {
          // As the library runs it: programmatic, the convert reading the fragment layout.
          fa::backward::run_bwd_pipeline<__nv_bfloat16, kD>(
              pw, 0,
              [](const fa::backward::BwdKernelParams&, fa::StreamOrder) {
                return fa::Status::kSuccess;
              },
              /*pdl=*/true, /*dq_frag=*/true);
        },
        20);
    // The causal backward (its own forward's o and lse first; no window, nothing deferred).
    if (run_sm80<kD>(fc) != fa::Status::kSuccess) std::printf("forward launch failed\n");
    const float causal_ms = median_ms([&] { run(pc, true); }, 20);
    std::printf("bwd window (1024, 0) d=%d s=%5d: defer %d blocks; key_tile order %.3f ms, light "
                "last %.3f ms, time ratio %.4f; causal %.3f ms (speedup %.2fx -> %.2fx); "
                "preprocess + convert alone %.3f ms; max|diff| dk %.1e dv %.1e dq %.1e%s\n",
                kD, seqlen, defer, t.a_ms, t.b_ms, t.b_over_a, causal_ms, causal_ms / t.a_ms,
                causal_ms / t.b_ms, fixed_ms, r.ddk, r.ddv, r.ddq, r.same() ? "" : "  DIFFERS");
    std::fflush(stdout);
  }
  return 0;
#endif
#endif  // TUNE_BWD90_EARLYDV_ONLY
}
