// Checks of the torch-free C++ API that need no GPU: argument validation (every bad input returns
// its Status before anything touches the device), workspace sizing, build information, and, on
// a machine without a GPU, the "no device" path; then problem_checks.cpp's, scheduler_checks.cpp's
// and kvcache_checks.cpp's brute-force checks of the problem layer's math. Built and run by
// CMake's ctest (.ci/run).
// Pointers here are fake but 16-byte aligned: no case below reaches a kernel on a GPU machine,
// and the one case that would (valid arguments) runs only when no GPU is present.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>
#include <algorithm>

#include "flashattn_cu/flashattn_cu.h"

#include "checks.h"

#include "head_dims.h"      // round_head_dim(), checked against head_dim_instances()
#include "bwd/params.h"     // the varlen workspace layout, checked here
#include "problem/kv_cache.h"  // kMaxSplits

namespace {

using flashattn_cu::BwdParams;
using flashattn_cu::FwdParams;
using flashattn_cu::KvcacheParams;
using flashattn_cu::Status;

int g_failures = 0;

}  // namespace

namespace flashattn_cu_checks {
void expect(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++g_failures;
}
}  // namespace flashattn_cu_checks

namespace {

using flashattn_cu_checks::expect;

void* fake(uintptr_t i) { return reinterpret_cast<void*>(0x100000 + i * 0x1000); }

// A valid-looking contiguous problem: batch 2, seqlen 128 x 256, 8 heads over 2, d 64, fp16.
template <typename Params>
void fill_common(Params& p) {
  p.q = fake(1), p.k = fake(2), p.v = fake(3);
  p.batch = 2, p.seqlen_q = 128, p.seqlen_k = 256, p.num_heads = 8, p.num_heads_k = 2;
  p.head_dim = 64;
  p.softmax_scale = 0.125f;
  p.q_row_stride = p.o_row_stride = 8 * 64, p.q_head_stride = p.o_head_stride = 64;
  p.q_batch_stride = p.o_batch_stride = 128 * 8 * 64;
  p.k_row_stride = p.v_row_stride = 2 * 64, p.k_head_stride = p.v_head_stride = 64;
  p.k_batch_stride = p.v_batch_stride = 256 * 2 * 64;
}

FwdParams valid_fwd() {
  FwdParams p;
  fill_common(p);
  p.o = fake(4);
  p.lse = static_cast<float*>(fake(5));
  return p;
}

BwdParams valid_bwd() {
  BwdParams p;
  fill_common(p);
  p.o = fake(4), p.lse = static_cast<const float*>(fake(5)), p.dout = fake(6);
  p.dq = fake(7), p.dk = fake(8), p.dv = fake(9), p.workspace = fake(10);
  p.do_row_stride = p.dq_row_stride = 8 * 64, p.do_head_stride = p.dq_head_stride = 64;
  p.do_batch_stride = p.dq_batch_stride = 128 * 8 * 64;
  p.dk_row_stride = p.dv_row_stride = 2 * 64, p.dk_head_stride = p.dv_head_stride = 64;
  p.dk_batch_stride = p.dv_batch_stride = 256 * 2 * 64;
  return p;
}

template <typename Params, typename Edit>
void expect_status(const char* what, Edit edit, Status want) {
  Params p;
  if constexpr (std::is_same_v<Params, FwdParams>) {
    p = valid_fwd();
  } else {
    p = valid_bwd();
  }
  edit(p);
  Status got;
  if constexpr (std::is_same_v<Params, FwdParams>) {
    got = flashattn_cu::fwd(p, nullptr);
  } else {
    got = flashattn_cu::bwd(p, nullptr);
  }
  char line[256];
  std::snprintf(line, sizeof line, "%s -> '%s' (want '%s')", what, flashattn_cu::status_string(got),
                flashattn_cu::status_string(want));
  expect(got == want, line);
}

// A valid-looking kvcache call: fill_common's sizes, one query per entry, cache of 256 keys.
KvcacheParams valid_kvcache() {
  KvcacheParams p;
  fill_common(p);
  p.seqlen_q = 1;
  p.o = fake(4);
  p.lse = static_cast<float*>(fake(5));
  p.cache_seqlens = static_cast<const int*>(fake(6));
  p.batch_cache = 2;
  return p;
}

template <typename Edit>
void expect_kvcache_status(const char* what, Edit edit, Status want) {
  KvcacheParams p = valid_kvcache();
  edit(p);
  const Status got = flashattn_cu::fwd_kvcache(p, nullptr);
  char line[256];
  std::snprintf(line, sizeof line, "%s -> '%s' (want '%s')", what, flashattn_cu::status_string(got),
                flashattn_cu::status_string(want));
  expect(got == want, line);
}

}  // namespace

int main() {
  using S = Status;
  for (S s : {S::kSuccess, S::kInvalidArgument, S::kUnsupportedDevice, S::kUnsupportedHeadDim,
              S::kLaunchFailed}) {
    expect(std::strlen(flashattn_cu::status_string(s)) > 0, "status_string names every status");
  }
  int buf[16];
  expect(flashattn_cu::built_archs(buf, 16) > 0 && buf[0] >= 80, "built_archs: sm_80 or newer");
  expect(flashattn_cu::built_head_dims(buf, 16) > 0, "built_head_dims: at least one");
  int instances[16];
  const int n_instances = flashattn_cu::head_dim_instances(instances, 16);
  expect(n_instances > 0 && n_instances <= 16 && instances[n_instances - 1] == 256,
         "head_dim_instances: up to 256");
  bool built_are_instances = true;
  for (int i = 0, n = flashattn_cu::built_head_dims(buf, 16); i < n && i < 16; ++i) {
    bool found = false;
    for (int j = 0; j < n_instances && j < 16; ++j) found = found || buf[i] == instances[j];
    built_are_instances = built_are_instances && found;
  }
  expect(built_are_instances, "built_head_dims: among head_dim_instances");
  bool rounds = true;
  for (int d = 1, j = 0; d <= 256 && j < n_instances && j < 16; ++d) {
    if (d > instances[j]) ++j;
    rounds = rounds && j < n_instances && flashattn_cu::round_head_dim(d) == instances[j];
  }
  expect(rounds, "round_head_dim: the smallest instance >= head_dim, for 1..256");

  // Forward argument checks.
  expect_status<FwdParams>("fwd: nheads % nheads_k != 0", [](FwdParams& p) { p.num_heads = 7; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: nheads_k = 0", [](FwdParams& p) { p.num_heads_k = 0; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: negative seqlen", [](FwdParams& p) { p.seqlen_k = -1; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: head_dim 300", [](FwdParams& p) { p.head_dim = 300; }, S::kUnsupportedHeadDim);
  expect_status<FwdParams>("fwd: head_dim 60", [](FwdParams& p) { p.head_dim = 60; }, S::kUnsupportedHeadDim);
  expect_status<FwdParams>("fwd: softmax_scale 0", [](FwdParams& p) { p.softmax_scale = 0.f; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: softmax_scale NaN", [](FwdParams& p) { p.softmax_scale = NAN; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: softmax_scale inf", [](FwdParams& p) { p.softmax_scale = INFINITY; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: softmax_scale subnormal", [](FwdParams& p) { p.softmax_scale = 1e-40f; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: softmax_scale * log2(e) inf", [](FwdParams& p) { p.softmax_scale = 2.4e38f; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: seqlen_k > kMaxSeqlen", [](FwdParams& p) { p.seqlen_k = flashattn_cu::kMaxSeqlen + 1; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: seqlen_q > kMaxSeqlen", [](FwdParams& p) { p.seqlen_q = flashattn_cu::kMaxSeqlen + 1; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: misaligned softmax_stats", [](FwdParams& p) { p.softmax_stats = p.lse + 2; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: row stride 12", [](FwdParams& p) { p.k_row_stride = 12; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: misaligned v", [](FwdParams& p) { p.v = static_cast<const char*>(p.v) + 8; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: null lse", [](FwdParams& p) { p.lse = nullptr; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: null q", [](FwdParams& p) { p.q = nullptr; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: null o", [](FwdParams& p) { p.o = nullptr; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: null k", [](FwdParams& p) { p.k = nullptr; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: batch 0 is a no-op", [](FwdParams& p) { p.batch = 0; }, S::kSuccess);
  // Varlen rows past kMaxSeqlen: the kernels' int32 row indices (and the backward's workspace
  // slots, rounded up past an entry's start) would wrap.
  expect_status<FwdParams>("fwd: varlen total_q > kMaxSeqlen", [](FwdParams& p) {
    p.cu_seqlens_q = p.cu_seqlens_k = static_cast<const int*>(fake(9));
    p.total_q = flashattn_cu::kMaxSeqlen + 1;
  }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: varlen total_k > kMaxSeqlen", [](FwdParams& p) {
    p.cu_seqlens_q = p.cu_seqlens_k = static_cast<const int*>(fake(9));
    p.total_q = 4;
    p.total_k = flashattn_cu::kMaxSeqlen + 1;
  }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: seqlen_q 0 is a no-op", [](FwdParams& p) { p.seqlen_q = 0; }, S::kSuccess);
  // The one pointer rule of fwd() and bwd(): null is allowed exactly for a tensor without elements.
  expect_status<FwdParams>("fwd: seqlen_q 0 with null q, o, lse",
                           [](FwdParams& p) { p.seqlen_q = 0; p.q = nullptr; p.o = nullptr; p.lse = nullptr; }, S::kSuccess);
  expect_status<FwdParams>("fwd: batch 0 with every pointer null",
                           [](FwdParams& p) { p.batch = 0; p.q = p.k = p.v = nullptr; p.o = nullptr; p.lse = nullptr; }, S::kSuccess);

  // Backward argument checks.
  expect_status<BwdParams>("bwd: head_dim 264", [](BwdParams& p) { p.head_dim = 264; }, S::kUnsupportedHeadDim);
  expect_status<BwdParams>("bwd: null dout", [](BwdParams& p) { p.dout = nullptr; }, S::kInvalidArgument);
  expect_status<BwdParams>("bwd: null dk", [](BwdParams& p) { p.dk = nullptr; }, S::kInvalidArgument);
  expect_status<BwdParams>("bwd: null workspace", [](BwdParams& p) { p.workspace = nullptr; }, S::kInvalidArgument);
  expect_status<BwdParams>("bwd: dq head stride 4", [](BwdParams& p) { p.dq_head_stride = 4; }, S::kInvalidArgument);
  expect_status<BwdParams>("bwd: misaligned lse", [](BwdParams& p) { p.lse = p.lse + 1; }, S::kInvalidArgument);
  expect_status<BwdParams>("bwd: batch 0 is a no-op", [](BwdParams& p) { p.batch = 0; }, S::kSuccess);
  expect_status<BwdParams>("bwd: null lse and no softmax_stats", [](BwdParams& p) { p.lse = nullptr; }, S::kInvalidArgument);
  expect_status<BwdParams>("bwd: misaligned softmax_stats", [](BwdParams& p) { p.softmax_stats = p.lse + 2; }, S::kInvalidArgument);
  expect_status<BwdParams>("bwd: seqlen_k > kMaxSeqlen", [](BwdParams& p) { p.seqlen_k = flashattn_cu::kMaxSeqlen + 1; }, S::kInvalidArgument);
  expect_status<BwdParams>("bwd: softmax_scale subnormal", [](BwdParams& p) { p.softmax_scale = 1e-40f; }, S::kInvalidArgument);
  // Empty inputs: the same pointer rule as fwd().
  expect_status<BwdParams>("bwd: batch 0 with every pointer null", [](BwdParams& p) {
    p.batch = 0; p.q = p.k = p.v = p.o = p.dout = nullptr; p.lse = nullptr;
    p.dq = p.dk = p.dv = nullptr; p.workspace = nullptr;
  }, S::kSuccess);
  expect_status<BwdParams>("bwd: seqlen 0 x 0 with every pointer null", [](BwdParams& p) {
    p.seqlen_q = p.seqlen_k = 0; p.q = p.k = p.v = p.o = p.dout = nullptr; p.lse = nullptr;
    p.dq = p.dk = p.dv = nullptr; p.workspace = nullptr;
  }, S::kSuccess);
  expect_status<BwdParams>("bwd: seqlen_q 0 but null dk (dk has elements)", [](BwdParams& p) {
    p.seqlen_q = 0; p.q = p.o = p.dout = nullptr; p.lse = nullptr; p.dq = nullptr; p.dk = nullptr;
  }, S::kInvalidArgument);
  expect_status<BwdParams>("bwd: seqlen_k 0 but null dq (dq has elements)", [](BwdParams& p) {
    p.seqlen_k = 0; p.k = p.v = nullptr; p.dk = p.dv = nullptr; p.dq = nullptr;
  }, S::kInvalidArgument);

  // Dropout arguments: 0 <= dropout_p < 1; the random-state pointers 8-byte aligned; S_dmask
  // 16-byte aligned.
  expect_status<FwdParams>("fwd: dropout_p -0.1", [](FwdParams& p) { p.dropout_p = -0.1f; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: dropout_p 1", [](FwdParams& p) { p.dropout_p = 1.f; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: dropout_p NaN", [](FwdParams& p) { p.dropout_p = NAN; }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: misaligned rng_state", [](FwdParams& p) {
    p.dropout_p = 0.1f; p.rng_state = reinterpret_cast<uint64_t*>(static_cast<char*>(fake(11)) + 4);
  }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: misaligned s_dmask", [](FwdParams& p) {
    p.dropout_p = 0.1f; p.s_dmask = static_cast<char*>(fake(12)) + 2;
  }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: misaligned philox_seed_ptr", [](FwdParams& p) {
    p.dropout_p = 0.1f;
    p.philox_seed_ptr = reinterpret_cast<const uint64_t*>(static_cast<char*>(fake(13)) + 4);
  }, S::kInvalidArgument);
  expect_status<BwdParams>("bwd: dropout_p 1", [](BwdParams& p) { p.dropout_p = 1.f; }, S::kInvalidArgument);
  // Fields the kernels would have read as given: a dtype that is neither, ALiBi slopes off a
  // float's alignment or at a negative batch stride, a head dim this build did not compile (64
  // and 128 are built wherever these run; 256 may not be: checked against built_head_dims()).
  expect_status<FwdParams>("fwd: dtype 7", [](FwdParams& p) {
    p.dtype = static_cast<flashattn_cu::DType>(7);
  }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: misaligned alibi_slopes", [](FwdParams& p) {
    p.alibi_slopes = reinterpret_cast<const float*>(static_cast<char*>(fake(14)) + 1);
  }, S::kInvalidArgument);
  expect_status<BwdParams>("bwd: negative alibi_slopes_batch_stride", [](BwdParams& p) {
    p.alibi_slopes = static_cast<const float*>(fake(14));
    p.alibi_slopes_batch_stride = -8;
  }, S::kInvalidArgument);
  {
    int built[16];
    const int n = flashattn_cu::built_head_dims(built, 16);
    int missing = 0;
    for (int d : {64, 96, 128, 192, 256}) {
      if (std::find(built, built + n, d) == built + n) missing = d;
    }
    if (missing > 0) {
      FwdParams p = valid_fwd();
      p.head_dim = missing;
      expect(flashattn_cu::fwd(p, nullptr) == S::kUnsupportedHeadDim,
             "fwd: a head dim not built is refused before anything runs");
      KvcacheParams kv = valid_kvcache();
      kv.head_dim = missing;
      expect(flashattn_cu::fwd_kvcache(kv, nullptr) == S::kUnsupportedHeadDim,
             "fwd_kvcache: a head dim not built is refused before the append");
    }
  }
  // Strides: negative ones refused, written tensors that overlap themselves refused (two rows or
  // heads stored to one place race), broadcast inputs (stride 0) kept.
  expect_status<FwdParams>("fwd: negative q_row_stride", [](FwdParams& p) {
    p.q_row_stride = -8 * 64;
  }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: o_row_stride 0", [](FwdParams& p) { p.o_row_stride = 0; },
                           S::kInvalidArgument);
  expect_status<FwdParams>("fwd: o heads overlapping (o_head_stride 8 < head_dim)",
                           [](FwdParams& p) { p.o_head_stride = 8; }, S::kInvalidArgument);
  expect_status<BwdParams>("bwd: dk_head_stride 0", [](BwdParams& p) { p.dk_head_stride = 0; },
                           S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: negative knew_row_stride", [](KvcacheParams& p) {
    p.k_new = fake(10), p.v_new = fake(11), p.seqlen_new = 1;
    p.knew_row_stride = -128, p.vnew_row_stride = 128;
    p.knew_head_stride = p.vnew_head_stride = 64;
  }, S::kInvalidArgument);
  // A workspace size given and below the need: refused instead of written past.
  expect_status<BwdParams>("bwd: workspace_bytes below bwd_workspace_bytes", [](BwdParams& p) {
    p.workspace_bytes = flashattn_cu::bwd_workspace_bytes(p) - 256;
  }, S::kInvalidArgument);
  // fwd()'s optional workspace (the sm90a forward's tile counter): its size by call, and one
  // given too small or misaligned refused; null stays valid (the static schedules).
  {
    FwdParams f = valid_fwd();
    f.is_causal = false;
    f.window_left = f.window_right = -1;
    expect(flashattn_cu::fwd_workspace_bytes(f) == 0, "fwd workspace: 0 padded, not causal");
    f.is_causal = true;
    expect(flashattn_cu::fwd_workspace_bytes(f) == 16, "fwd workspace: 16 bytes causal");
    f.is_causal = false;
    f.window_left = 8;
    expect(flashattn_cu::fwd_workspace_bytes(f) == 16, "fwd workspace: 16 bytes with a window");
    f.batch = 0;
    expect(flashattn_cu::fwd_workspace_bytes(f) == 0, "fwd workspace: 0 without query rows");
  }
  expect_status<FwdParams>("fwd: workspace_bytes below fwd_workspace_bytes", [](FwdParams& p) {
    p.is_causal = true, p.workspace = fake(12), p.workspace_bytes = 8;
  }, S::kInvalidArgument);
  expect_status<FwdParams>("fwd: misaligned workspace", [](FwdParams& p) {
    p.is_causal = true, p.workspace = static_cast<char*>(fake(12)) + 4;
  }, S::kInvalidArgument);
  // Offsets are torch's, multiples of 4: a call owns offset / 4 + batch * num_heads + head as
  // its counters' lower half (common/philox.h), so offsets 0 .. 3 would share one mask.
  expect_status<FwdParams>("fwd: philox_offset 6", [](FwdParams& p) {
    p.dropout_p = 0.1f; p.philox_offset = 6;
  }, S::kInvalidArgument);
  expect_status<BwdParams>("bwd: philox_offset 1", [](BwdParams& p) {
    p.dropout_p = 0.1f; p.philox_offset = 1;
  }, S::kInvalidArgument);
  expect_status<BwdParams>("bwd: misaligned philox_offset_ptr", [](BwdParams& p) {
    p.dropout_p = 0.5f;
    p.philox_offset_ptr = reinterpret_cast<const uint64_t*>(static_cast<char*>(fake(13)) + 2);
  }, S::kInvalidArgument);

  // Varlen sequence info from host arrays (seq_info is host-callable), and the varlen workspace
  // layout: every (entry, head) slot, rounded up to whole kBwdRowPad blocks, 16-byte aligned,
  // disjoint from every other and inside num_heads * ws_plane rows.
  {
    const int lens[] = {37, 0, 1, 200, 129, 64, 3, 128, 127};
    const int batch = static_cast<int>(sizeof(lens) / sizeof(lens[0]));
    int cu[16] = {0};
    for (int b = 0; b < batch; ++b) cu[b + 1] = cu[b] + lens[b];
    BwdParams p = valid_bwd();
    p.batch = batch;
    p.num_heads = 3;
    p.seqlen_q = 200;
    p.cu_seqlens_q = cu;
    p.cu_seqlens_k = cu;
    p.total_q = cu[batch];
    bool seq_ok = true;
    for (int b = 0; b < batch; ++b) {
      const flashattn_cu::SeqInfo si = flashattn_cu::seq_info<true>(p, b);
      seq_ok = seq_ok && si.start_q == cu[b] && si.seqlen_q == lens[b] &&
               si.q_offset(999, 7) == static_cast<int64_t>(cu[b]) * 7 &&
               si.lse_row0(2, 3, 200, p.total_q) == 2LL * p.total_q + cu[b];
    }
    p.seqlen_q = 100;  // a max_seqlen below some lengths clamps them
    seq_ok = seq_ok && flashattn_cu::seq_info<true>(p, 3).seqlen_q == 100 &&
             flashattn_cu::seq_info<false>(p, 3).start_q == -1;
    expect(seq_ok, "varlen: seq_info from cu_seqlens (starts, lengths, offsets, clamp)");
    p.seqlen_q = 200;

    const flashattn_cu::backward::BwdWorkspaceLayout ws =
        flashattn_cu::backward::bwd_workspace_layout(p);
    flashattn_cu::backward::BwdKernelParams kp{};
    kp.p = p;
    kp.rows = ws.rows;
    kp.ws_plane = ws.ws_plane;
    bool ws_ok = ws.ws_plane >= p.total_q + batch * flashattn_cu::backward::kVarlenSlack &&
                 ws.ws_plane % 4 == 0;
    std::vector<std::pair<int64_t, int64_t>> slots;
    for (int b = 0; b < batch; ++b) {
      const flashattn_cu::SeqInfo si = flashattn_cu::seq_info<true>(p, b);
      for (int h = 0; h < p.num_heads; ++h) {
        const int64_t r0 = flashattn_cu::backward::ws_row0<true>(kp, si, h);
        const int64_t n = (lens[b] + 127) / 128 * 128;
        ws_ok = ws_ok && r0 % 4 == 0 && r0 >= 0 && r0 + n <= p.num_heads * ws.ws_plane;
        if (n > 0) slots.emplace_back(r0, r0 + n);
      }
    }
    std::sort(slots.begin(), slots.end());
    for (size_t i = 1; i < slots.size(); ++i) ws_ok = ws_ok && slots[i - 1].second <= slots[i].first;
    expect(ws_ok, "varlen: workspace slots aligned, disjoint, inside the planes");
  }

  flashattn_cu_checks::run_problem_checks();    // problem_checks.cpp
  flashattn_cu_checks::run_scheduler_checks();  // scheduler_checks.cpp
  flashattn_cu_checks::run_kvcache_checks();    // kvcache_checks.cpp
  // fwd_kvcache's arguments (flashattn_cu.h: KvcacheParams), each rejected before the device.
  // cache_seqlens null means every entry holds seqlen_k keys: not with cache_leftpad (below, with
  // an append too); the no-GPU block at the end has the positive control.
  expect_kvcache_status("fwd_kvcache: no cache_seqlens with cache_leftpad",
                        [](KvcacheParams& p) {
                          p.cache_seqlens = nullptr;
                          p.cache_leftpad = static_cast<const int*>(fake(9));
                        },
                        S::kInvalidArgument);
  // Varlen (paged prefill): cu_seqlens_q and cu_seqlens_k together, keys from cu_seqlens_k
  // (cache_seqlens and cache_leftpad must be null).
  expect_kvcache_status("fwd_kvcache: cu_seqlens with cache_seqlens",
                        [](KvcacheParams& p) {
                          p.cu_seqlens_q = static_cast<const int*>(fake(7));
                          p.cu_seqlens_k = static_cast<const int*>(fake(8));
                          p.total_q = 4;
                        },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: cu_seqlens_q without cu_seqlens_k",
                        [](KvcacheParams& p) {
                          p.cu_seqlens_q = static_cast<const int*>(fake(7));
                          p.cache_seqlens = nullptr;
                          p.total_q = 4;
                        },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: varlen with cache_leftpad",
                        [](KvcacheParams& p) {
                          p.cu_seqlens_q = static_cast<const int*>(fake(7));
                          p.cu_seqlens_k = static_cast<const int*>(fake(8));
                          p.cache_seqlens = nullptr;
                          p.cache_leftpad = static_cast<const int*>(fake(9));
                          p.total_q = 4;
                        },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: varlen, paged, block_table rows shorter than seqlen_k",
                        [](KvcacheParams& p) {
                          p.cu_seqlens_q = static_cast<const int*>(fake(7));
                          p.cu_seqlens_k = static_cast<const int*>(fake(8));
                          p.cache_seqlens = nullptr;
                          p.total_q = 4;
                          p.block_table = static_cast<const int*>(fake(9));
                          p.page_size = 100, p.num_pages = 32, p.block_table_batch_stride = 2;
                        },
                        S::kInvalidArgument);
  // Varlen queries locate their keys through the block table only: a contiguous cache's entries
  // are not at cu_seqlens_k (its entries would all have been read from row 0).
  expect_kvcache_status("fwd_kvcache: varlen on a contiguous cache",
                        [](KvcacheParams& p) {
                          p.cu_seqlens_q = static_cast<const int*>(fake(7));
                          p.cu_seqlens_k = static_cast<const int*>(fake(8));
                          p.cache_seqlens = nullptr;
                          p.total_q = 4;
                        },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: seqused_k",
                        [](KvcacheParams& p) { p.seqused_k = static_cast<const int*>(fake(7)); },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: dropout", [](KvcacheParams& p) { p.dropout_p = 0.1f; },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: num_splits 129", [](KvcacheParams& p) { p.num_splits = 129; },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: num_splits -1", [](KvcacheParams& p) { p.num_splits = -1; },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: paged, page_size 0",
                        [](KvcacheParams& p) {
                          p.block_table = static_cast<const int*>(fake(7));
                          p.block_table_batch_stride = 256, p.num_pages = 4, p.page_size = 0;
                        },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: paged, block_table rows shorter than the cache",
                        [](KvcacheParams& p) {
                          p.block_table = static_cast<const int*>(fake(7));
                          p.page_size = 16, p.num_pages = 32, p.block_table_batch_stride = 15;
                        },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: paged with cache_batch_idx",
                        [](KvcacheParams& p) {
                          p.block_table = static_cast<const int*>(fake(7));
                          p.page_size = 16, p.num_pages = 32, p.block_table_batch_stride = 16;
                          p.cache_batch_idx = static_cast<const int*>(fake(8));
                        },
                        S::kInvalidArgument);
  // Entry b of a contiguous cache for query batch b: fewer entries than the batch would be read
  // (and appended to) past the cache.
  expect_kvcache_status("fwd_kvcache: batch_cache below batch without cache_batch_idx",
                        [](KvcacheParams& p) { p.batch_cache = 1; }, S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: batch_cache unset without cache_batch_idx",
                        [](KvcacheParams& p) { p.batch_cache = 0; }, S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: cache_batch_idx without batch_cache",
                        [](KvcacheParams& p) {
                          p.cache_batch_idx = static_cast<const int*>(fake(8));
                          p.batch_cache = 0;
                        },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: misaligned cache_leftpad",
                        [](KvcacheParams& p) {
                          p.cache_leftpad = reinterpret_cast<const int*>(
                              static_cast<const char*>(fake(8)) + 2);
                        },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: head_dim 260", [](KvcacheParams& p) { p.head_dim = 260; },
                        S::kUnsupportedHeadDim);
  // The fused append + rotary (KvcacheParams::k_new, rotary_cos; dispatch.cu
  // check_kvcache_append): k_new with v_new, rotary with both tables and k_new, 16-byte rows.
  auto with_append = [](KvcacheParams& p) {
    p.k_new = fake(10);
    p.v_new = fake(11);
    p.seqlen_new = 2;
    p.knew_batch_stride = 2 * 2 * 64, p.knew_row_stride = 2 * 64, p.knew_head_stride = 64;
    p.vnew_batch_stride = 2 * 2 * 64, p.vnew_row_stride = 2 * 64, p.vnew_head_stride = 64;
  };
  auto with_rotary = [&](KvcacheParams& p) {
    with_append(p);
    p.rotary_cos = fake(12);
    p.rotary_sin = fake(13);
    p.rotary_dim = 32;
    p.rotary_seqlen = p.seqlen_k;
  };
  expect_kvcache_status("fwd_kvcache: k_new without v_new",
                        [&](KvcacheParams& p) { with_append(p); p.v_new = nullptr; },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: k_new with seqlen_new 0",
                        [&](KvcacheParams& p) { with_append(p); p.seqlen_new = 0; },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: seqlen_new without k_new",
                        [](KvcacheParams& p) { p.seqlen_new = 3; }, S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: k_new without cache_seqlens",
                        [&](KvcacheParams& p) { with_append(p); p.cache_seqlens = nullptr; },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: k_new row stride not a multiple of 8",
                        [&](KvcacheParams& p) { with_append(p); p.knew_row_stride = 68; },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: misaligned v_new",
                        [&](KvcacheParams& p) {
                          with_append(p);
                          p.v_new = static_cast<const char*>(fake(11)) + 8;
                        },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: k_new with varlen queries",
                        [&](KvcacheParams& p) {
                          with_append(p);
                          p.cu_seqlens_q = static_cast<const int*>(fake(7));
                          p.cu_seqlens_k = static_cast<const int*>(fake(8));
                          p.cache_seqlens = nullptr;
                          p.total_q = 4;
                        },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: rotary without k_new",
                        [&](KvcacheParams& p) {
                          with_rotary(p);
                          p.k_new = p.v_new = nullptr;
                          p.seqlen_new = 0;
                        },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: rotary_cos without rotary_sin",
                        [&](KvcacheParams& p) { with_rotary(p); p.rotary_sin = nullptr; },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: rotary_dim 40 (not a multiple of 16)",
                        [&](KvcacheParams& p) { with_rotary(p); p.rotary_dim = 40; },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: rotary_dim above head_dim",
                        [&](KvcacheParams& p) { with_rotary(p); p.rotary_dim = 80; },
                        S::kInvalidArgument);
  expect_kvcache_status("fwd_kvcache: rotary tables shorter than the cache",
                        [&](KvcacheParams& p) { with_rotary(p); p.rotary_seqlen = 255; },
                        S::kInvalidArgument);
  {
    // Workspace: none for one split; the splits' LSEs and outputs for more (explicit counts
    // need no device to size); the key counts with cache_leftpad.
    KvcacheParams k = valid_kvcache();
    k.num_splits = 1;
    expect(flashattn_cu::fwd_kvcache_workspace_bytes(k) == 0, "kvcache workspace: 0 for one split");
    k.num_splits = 4;
    k.seqlen_k = 4096;  // enough key blocks for 4 splits at any tile
    // GQA packing: 8 query heads over 2 kv heads, one query: 2 x 2 x 4 rows of 64 + 1 floats.
    const size_t want = static_cast<size_t>(4) * 2 * 8 * (64 + 1) * 4;
    expect(flashattn_cu::fwd_kvcache_workspace_bytes(k) >= want &&
               flashattn_cu::fwd_kvcache_num_splits(k) == 4,
           "kvcache workspace: splits x rows x (head_dim + 1) floats for 4 splits");
    k.num_splits = 200;  // clamped by the sizing, rejected by fwd_kvcache
    expect(flashattn_cu::fwd_kvcache_num_splits(k) == flashattn_cu::kMaxSplits ||
               flashattn_cu::fwd_kvcache_num_splits(k) == 4096 / 128,
           "kvcache splits: at most 128 and at most the key blocks");
    // Varlen: the partials have a row per lse element, heads x total_q.
    KvcacheParams vk = k;
    vk.num_splits = 4;
    vk.cu_seqlens_q = static_cast<const int*>(fake(7));
    vk.cu_seqlens_k = static_cast<const int*>(fake(8));
    vk.cache_seqlens = nullptr;
    vk.seqlen_q = 64, vk.total_q = 301;
    const size_t lse_bytes = (static_cast<size_t>(4) * 8 * 301 * 4 + 255) / 256 * 256;
    const size_t o_bytes = (static_cast<size_t>(4) * 8 * 301 * 64 * 4 + 255) / 256 * 256;
    expect(flashattn_cu::fwd_kvcache_workspace_bytes(vk) == lse_bytes + o_bytes,
           "kvcache varlen workspace: splits x heads x total_q x (head_dim + 1) floats");
    k.num_splits = 1;
    k.cache_leftpad = static_cast<const int*>(fake(9));
    expect(flashattn_cu::fwd_kvcache_workspace_bytes(k) >= 2 * sizeof(int),
           "kvcache workspace: the key counts with cache_leftpad");
  }

  // Workspace sizing: the lse/D rows, plus the fp32 dQ accumulator unless deterministic.
  BwdParams b = valid_bwd();
  const size_t atomic = flashattn_cu::bwd_workspace_bytes(b);
  b.deterministic = true;
  const size_t det = flashattn_cu::bwd_workspace_bytes(b);
  expect(atomic >= static_cast<size_t>(2) * 8 * 128 * 64 * 4, "workspace holds the fp32 dQ accumulator");
  expect(det > 0 && det < atomic, "deterministic workspace is smaller (no dQ accumulator)");
  b.num_heads = 7;
  expect(flashattn_cu::bwd_workspace_bytes(b) == 0, "workspace of invalid sizes is 0");

  // Valid arguments on a machine without a GPU: the device query fails, nothing launches.
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    BwdParams sized = valid_bwd();
    sized.workspace_bytes = flashattn_cu::bwd_workspace_bytes(sized);
    const Status sst = flashattn_cu::bwd(sized, nullptr);
    expect(sst == S::kLaunchFailed || sst == S::kUnsupportedDevice,
           "bwd with workspace_bytes exactly the need: valid on the host");
    const Status st = flashattn_cu::fwd(valid_fwd(), nullptr);
    expect(st == S::kLaunchFailed || st == S::kUnsupportedDevice, "fwd without a GPU fails cleanly");
    expect(flashattn_cu::last_cuda_error() != cudaSuccess || st == S::kUnsupportedDevice,
           "last_cuda_error() says why");
    // The append + rotary fields of a valid call pass the host checks (the positive control of
    // the rejections above): only the device query fails.
    KvcacheParams kv = valid_kvcache();
    kv.k_new = fake(10), kv.v_new = fake(11), kv.seqlen_new = 2;
    kv.knew_row_stride = kv.vnew_row_stride = 2 * 64;
    kv.knew_head_stride = kv.vnew_head_stride = 64;
    kv.rotary_cos = fake(12), kv.rotary_sin = fake(13), kv.rotary_dim = 64;
    kv.rotary_seqlen = kv.seqlen_k;
    const Status kst = flashattn_cu::fwd_kvcache(kv, nullptr);
    expect(kst == S::kLaunchFailed || kst == S::kUnsupportedDevice,
           "fwd_kvcache with k_new and rotary: valid on the host, fails only at the device");
    // A varlen call with total_q 0 (no query row) still has its cu_seqlens checked on the
    // device (every entry must be empty): it reaches the check's launch, where it returned
    // success before without reading them.
    const auto without_query_rows = [](auto& p) {
      p.cu_seqlens_q = static_cast<const int*>(fake(7));
      p.cu_seqlens_k = static_cast<const int*>(fake(8));
      p.total_q = 0, p.total_k = 256;
      p.q = p.o = nullptr;
      p.lse = nullptr;
    };
    FwdParams none = valid_fwd();
    without_query_rows(none);
    const Status nst = flashattn_cu::fwd(none, nullptr);
    expect(nst == S::kLaunchFailed || nst == S::kUnsupportedDevice,
           "fwd varlen with total_q 0: its cu_seqlens checked on the device");
    BwdParams bnone = valid_bwd();
    without_query_rows(bnone);
    bnone.dout = bnone.dq = nullptr;
    const Status bst = flashattn_cu::bwd(bnone, nullptr);
    expect(bst == S::kLaunchFailed || bst == S::kUnsupportedDevice,
           "bwd varlen with total_q 0: its cu_seqlens checked on the device");
    KvcacheParams whole = valid_kvcache();
    whole.cache_seqlens = nullptr;  // every entry holds seqlen_k keys
    const Status wst = flashattn_cu::fwd_kvcache(whole, nullptr);
    expect(wst == S::kLaunchFailed || wst == S::kUnsupportedDevice,
           "fwd_kvcache without cache_seqlens: valid on the host, fails only at the device");
  } else {
    std::printf("skip the no-GPU case: %d GPU(s) present\n", devices);
  }

  std::printf(g_failures ? "api_checks: %d FAILED\n" : "api_checks: all passed\n", g_failures);
  return g_failures ? 1 : 0;
}
