// Brute-force checks of the problem layer's host-callable math (no GPU, no API call): Philox and
// the dropout tile map, the causal limit and the mask policy's block ranges, the sm90 backward's
// dQ accumulator layout (the tile scheduler: scheduler_checks.cpp; the KV-cache side:
// kvcache_checks.cpp). Run by api_checks (api_checks.cpp's main: run_problem_checks), built by
// CMake's ctest (.ci/run).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "flashattn_cu/flashattn_cu.h"

#include "bwd/params.h"  // the sm90 backward's dQ accumulator layout (dq_frag_offset)
#include "checks.h"
#include "problem/dropout.h"    // Philox and the dropout tile map (host/device)
#include "problem/mask.h"       // the mask policy (host/device), near INT_MAX too

namespace {

using flashattn_cu::FwdParams;
using flashattn_cu_checks::expect;

// The sm90 backward's dQ accumulator layouts (bwd/params.h), the contract between the main
// kernels' staging (one bulk reduction or a few add the staged block) and the postprocess (reads
// columns 8c .. 8c + 7 of a row as one 32-byte chunk): dq_frag_offset (sm90/bwd_kernel.h: warp
// w, lane l stores its pair (hr, nt) at float ((hr * d / 16 + nt) * 8 + w) * 64 + 2 l of the
// block) and dq_frag_ws_offset (sm90/bwd_ws_kernel.h and the split kernel at d 256: at
// ((w * 2 + hr) * d / 16 + nt) * 64 + 2 l, each warp's pairs one run): a permutation of the
// block, 8-column chunks contiguous, and the kernels' pairs where the layout puts their elements.
void check_dq_frag_layout() {
  namespace bw = flashattn_cu::backward;
  for (const bool ws : {false, true}) {
    const auto offset = [ws](int r, int col, int d) {
      return ws ? bw::dq_frag_ws_offset(r, col, d) : bw::dq_frag_offset(r, col, d);
    };
    bool perm = true, chunks = true, kernel = true, pieces = true;
    for (int d : {64, 96, 128, 256}) {
      const int rows = bw::kDqFragRows, half = d / 2;
      std::vector<int> seen(static_cast<size_t>(rows) * d, 0);
      for (int r = 0; r < rows; ++r) {
        for (int col = 0; col < d; ++col) {
          const int64_t o = offset(r, col, d);
          if (o < 0 || o >= static_cast<int64_t>(rows) * d) {
            perm = false;
            continue;
          }
          ++seen[static_cast<size_t>(o)];
          chunks = chunks && o == offset(r, col - col % 8, d) + col % 8;
        }
      }
      perm = perm && std::all_of(seen.begin(), seen.end(), [](int x) { return x == 1; });
      // The postprocess's inverse by 8-float pieces (bw::dq_frag_piece, convert_frag_blocks).
      for (int piece = 0; piece < rows * d / 8; ++piece) {
        int r = -1, col = -1;
        if (ws) {
          bw::dq_frag_piece<true>(piece, d, r, col);
        } else {
          bw::dq_frag_piece<false>(piece, d, r, col);
        }
        pieces = pieces && r >= 0 && r < rows && col >= 0 && col < d && col % 8 == 0 &&
                 offset(r, col, d) == static_cast<int64_t>(piece) * 8;
      }
      for (int w = 0; w < 8; ++w) {
        for (int l = 0; l < 32; ++l) {
          for (int hr = 0; hr < 2; ++hr) {
            for (int nt = 0; nt < half / 8; ++nt) {
              const int row = (w % 4) * 16 + l / 4 + 8 * hr;
              const int col = (w / 4) * half + 8 * nt + 2 * (l % 4);
              const int64_t at = ws ? ((w * 2 + hr) * (half / 8) + nt) * 64 + 2 * l
                                    : ((hr * (half / 8) + nt) * 8 + w) * 64 + 2 * l;
              kernel = kernel && offset(row, col, d) == at && offset(row, col + 1, d) == at + 1;
            }
          }
        }
      }
    }
    const std::string name = ws ? "dq_frag_ws_offset" : "dq_frag_offset";
    expect(perm, (name + ": a permutation of each 64-row block (d 64, 96, 128, 256)").c_str());
    expect(chunks, (name + ": columns 8c .. 8c + 7 of a row contiguous").c_str());
    expect(kernel, (name + ": the sm90 kernels' staged pairs where the layout puts them").c_str());
    expect(pieces, (name + ": dq_frag_piece gives each 8-float piece's row and columns").c_str());
  }
}

// Which dQ jobs the postprocess converts a block at a time through shared memory
// (bwd/params.h make_bwd_convert_params' frag_blocks): the fragment layout at d 64 / 128 / 256
// (its staging swizzles whole groups of 8 chunks a row), padded or varlen without compact tiles,
// not streamed; never plain rows, d 96, a compact varlen dQ or a streamed one.
void check_convert_frag_blocks() {
  namespace bw = flashattn_cu::backward;
  float dummy[4] = {};
  int flags[4] = {};
  const int cu[3] = {0, 100, 100};  // two entries, one long: max_seqlen 100, no compact tiles
  const int cu_compact[5] = {0, 1, 2, 3, 500};  // compact tiles: 4 slots < 4 x 4 blocks
  struct Case {
    int head_dim;
    bool dq_frag, varlen, compact, streamed, want;
  };
  const Case cases[] = {
      {64, true, false, false, false, true},   {128, true, false, false, false, true},
      {256, true, false, false, false, true},  {96, true, false, false, false, false},
      {128, false, false, false, false, false}, {128, true, true, false, false, true},
      {128, true, true, true, false, false},   {128, true, false, false, true, false},
  };
  bool ok = true;
  for (const Case& c : cases) {
    bw::BwdKernelParams kp{};
    kp.p.head_dim = c.head_dim;
    kp.p.batch = c.varlen ? (c.compact ? 4 : 2) : 2;
    kp.p.num_heads = kp.p.num_heads_k = 2;
    kp.p.seqlen_q = kp.p.seqlen_k = c.compact ? 497 : 100;
    kp.dq_accum = dummy;
    kp.rows = 512;
    kp.kv_splits = 1;
    if (c.varlen) {
      kp.p.cu_seqlens_q = kp.p.cu_seqlens_k = c.compact ? cu_compact : cu;
      kp.p.total_q = kp.p.total_k = c.compact ? 500 : 100;
      kp.ws_plane = 1024;
    }
    if (c.streamed) kp.key_done = flags;
    const bw::BwdConvertParams cp = bw::make_bwd_convert_params(kp, c.dq_frag);
    ok = ok && cp.num_jobs == 1 && cp.jobs[0].frag_blocks == c.want;
  }
  expect(ok, "postprocess: the dQ jobs converted by blocks (frag layout d 64 / 128 / 256 only)");
}

}  // namespace

namespace flashattn_cu_checks {

// Every check of this file (api_checks.cpp's main calls it).
// The streamed dQ convert's waits (bwd/params.h dq_stream_key_tiles, dq_stream_block) against
// the sm90 main kernel's walks (sm90/bwd_common.h bwd_work: key tile n of a slice walks the query
// blocks problem/mask.h query_blocks gives, m_end num_m without a window): a key tile that adds a
// nonzero term to query block m (some row of the block sees some key of the tile, brute force)
// is among the tiles the block waits for; every tile it waits for exists (a flag some main-kernel
// block sets); each block of every (batch, head) is converted once in both orders; and the slice
// a head's flags are read from is the slice whose tile walks that head (head_first ..
// + heads_per_split). Shapes: short, long, ragged, sq != sk both ways; causal, none, windows on
// either side or both, a window wider than the keys.
void check_dq_stream_waits() {
  namespace bw = flashattn_cu::backward;
  bool covers = true, exists = true, once = true, slices = true;
  int cases = 0;
  const int lens[] = {1, 63, 64, 65, 128, 129, 200, 513, 1152, 1300};
  const int windows[][2] = {{-1, -1}, {-1, 0}, {1024, 0}, {100, 0}, {5, 3},
                            {0, -1},  {-1, 7}, {0, 0},    {2000, 2000}};
  for (int sq : lens) {
    for (int sk : lens) {
      for (int c = 0; c < 2; ++c) {
        for (const auto& wnd : windows) {
          flashattn_cu::BwdParams p;
          p.batch = 2;
          p.num_heads = 6;
          p.num_heads_k = (sq + sk) % 2 == 0 ? 2 : 6;
          p.head_dim = 128;
          p.seqlen_q = sq;
          p.seqlen_k = sk;
          p.is_causal = c == 1;
          p.window_left = wnd[0];
          p.window_right = c == 1 ? 0 : wnd[1];
          p.workspace = reinterpret_cast<void*>(uintptr_t{4096});  // carved, never read here
          const bw::BwdWorkspaceLayout ws = bw::bwd_workspace_layout(p);
          bw::BwdKernelParams kp = bw::make_bwd_kernel_params(p, ws);
          kp.key_done = reinterpret_cast<int*>(uintptr_t{8192});
          const bw::BwdConvertParams cp = bw::make_bwd_convert_params(kp, true);
          const bw::BwdConvertJob& job = cp.jobs[0];
          if (job.key_done == nullptr) {
            covers = false;
            continue;
          }
          ++cases;
          const int num_m = (sq + 63) / 64, num_n = (sk + 127) / 128;
          const flashattn_cu::SeqInfo seq{0, sq, sk, -1, -1};
          const flashattn_cu::Mask mask(seq, p);
          for (int n = 0; n < num_n; ++n) {
            const int n_start = n * 128, keys_valid = std::min(128, sk - n_start);
            const flashattn_cu::QueryBlocks qb = mask.query_blocks<64, 128>(n_start, keys_valid, num_m);
            for (int m = 0; m < num_m; ++m) {
              bool adds = false;
              for (int r = m * 64; r < std::min(sq, m * 64 + 64) && !adds; ++r) {
                const int b = std::max(mask.key_begin(r), n_start);
                const int e = std::min(mask.key_end(r), n_start + keys_valid);
                adds = b < e;
              }
              if (adds && (m < qb.begin || m >= qb.end)) covers = false;  // the walk itself
              const flashattn_cu::KeyBlocks kb = bw::dq_stream_key_tiles(job, 0, m);
              if (adds && (n < kb.begin || n >= kb.end)) covers = false;
              if (kb.begin < 0 || (kb.end > kb.begin && kb.end > num_n)) exists = false;
            }
          }
          for (const bool block_major : {false, true}) {
            bw::BwdConvertJob j = job;
            j.block_major = block_major;
            std::vector<int> seen(static_cast<size_t>(p.batch) * p.num_heads * num_m, 0);
            for (int64_t i = 0; i < static_cast<int64_t>(seen.size()); ++i) {
              const bw::DqStreamBlock blk = bw::dq_stream_block(j, p.batch, i);
              if (blk.batch < 0 || blk.batch >= p.batch || blk.head < 0 ||
                  blk.head >= p.num_heads || blk.m < 0 || blk.m >= num_m) {
                once = false;
                continue;
              }
              ++seen[(static_cast<size_t>(blk.batch) * p.num_heads + blk.head) * num_m + blk.m];
            }
            once = once && std::all_of(seen.begin(), seen.end(), [](int x) { return x == 1; });
          }
          const int group = p.num_heads / p.num_heads_k;
          for (int hk = 0; hk < p.num_heads_k; ++hk) {
            for (int split = 0; split < kp.kv_splits; ++split) {
              const int head_first = hk * group + split * kp.heads_per_split;
              for (int h = head_first; h < head_first + kp.heads_per_split; ++h) {
                slices = slices && h / group == hk && (h % group) / job.heads_per_split == split;
              }
            }
          }
        }
      }
    }
  }
  expect(cases > 1000 && covers,
         "dq_stream_key_tiles: a streamed dQ block waits for every key tile that adds to it");
  expect(exists, "dq_stream_key_tiles: only key tiles that exist (and set their flags)");
  expect(once, "dq_stream_block: every (batch, head, query block) once, both orders");
  expect(slices, "streamed dQ: a head's flags are those of the slice whose tiles walk it");
}

void run_problem_checks() {
  // Philox4x32-10 against the Random123 known-answer vectors (also torch's philox_engine).
  {
    const flashattn_cu::PhiloxOut z = flashattn_cu::philox4x32_10(0, 0, 0, 0, 0, 0);
    const flashattn_cu::PhiloxOut f = flashattn_cu::philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
    expect(z.w[0] == 0x6627e8d5u && z.w[1] == 0xe169c58du && z.w[2] == 0xbc57ac4cu &&
               z.w[3] == 0x9b00dbd8u && f.w[0] == 0x408f276du && f.w[1] == 0x41c83b0eu &&
               f.w[2] == 0xa20bc7c6u && f.w[3] == 0x6d5451fdu,
           "philox4x32_10: Random123 known answers");
    expect(flashattn_cu::dropout_keep_threshold(0.f) == 65536u &&
               flashattn_cu::dropout_keep_threshold(0.5f) == 32768u &&
               flashattn_cu::dropout_keep_threshold(0.9999999f) == 1u,
           "dropout_keep_threshold: round((1 - p) * 65536) in [1, 65536]");
  }

  // The dropout tile map: the row-major tile (forward, dQ kernel) and the transposed tile (the
  // backward main kernels) give every lane's element the decision of dropout_keep, at small and
  // near-kMaxSeqlen rows and keys and with a counter stream past 2^32; and the kept fraction of
  // p = 0.3 is 0.7 (to 4 standard deviations over 2^18 elements).
  {
    struct Case { int row0, col0; uint64_t seed, offset; int batch, head; };
    const Case cases[] = {{0, 0, 42, 0, 0, 0}, {16, 48, 0x123456789abcdefull, 12, 1, 3},
                          {flashattn_cu::kMaxSeqlen - 128, flashattn_cu::kMaxSeqlen - 64,
                           ~0ull, (1ull << 34) - 8, 3, 7}};
    const uint32_t threshold = flashattn_cu::dropout_keep_threshold(0.3f);
    bool rows_ok = true, transposed_ok = true;
    int64_t kept = 0, total = 0;
    for (const Case& c : cases) {
      struct { FwdParams p; flashattn_cu::DropoutScale dropout; } kp;
      kp.p.num_heads = 8;
      kp.p.philox_seed = c.seed;
      kp.p.philox_offset = c.offset;
      kp.dropout.keep_threshold = threshold;
      const flashattn_cu::Dropout d = flashattn_cu::dropout_of(kp, c.batch, c.head);
      const uint64_t stream = c.offset / 4 + static_cast<uint64_t>(c.batch) * 8 + c.head;
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        uint32_t row_bits[2];  // 32 rows x 64 keys
        d.keep_bits<2, 8>(row_bits, c.row0, c.col0, lane);
        for (int mt = 0; mt < 2; ++mt)
          for (int nt = 0; nt < 8; ++nt)
            for (int i = 0; i < 4; ++i) {
              const int row = c.row0 + mt * 16 + g + (i / 2) * 8;
              const int key = c.col0 + nt * 8 + 2 * t + i % 2;
              const int bit = (mt * 8 + nt) * 4 + i;
              const bool got = (row_bits[bit / 32] >> (bit % 32)) & 1u;
              rows_ok = rows_ok &&
                        got == flashattn_cu::dropout_keep(c.seed, stream, row, key, threshold);
            }
        uint32_t bits[2];  // 16 keys x 128 queries
        d.keep_bits_transposed<16>(bits, c.col0, c.row0, lane);
        for (int nt = 0; nt < 16; ++nt)
          for (int i = 0; i < 4; ++i) {
            const int key = c.col0 + g + (i / 2) * 8, query = c.row0 + nt * 8 + 2 * t + i % 2;
            const int bit = nt * 4 + i;
            const bool got = (bits[bit / 32] >> (bit % 32)) & 1u;
            transposed_ok = transposed_ok &&
                            got == flashattn_cu::dropout_keep(c.seed, stream, query, key, threshold);
          }
      }
    }
    for (int row = 0; row < 512; ++row)
      for (int key = 0; key < 512; ++key) {
        kept += flashattn_cu::dropout_keep(7, 1000, row, key, threshold);
        ++total;
      }
    const double frac = static_cast<double>(kept) / total, sd = std::sqrt(0.21 / total);
    expect(rows_ok, "dropout: row-major tile map == dropout_keep for every lane");
    expect(transposed_ok, "dropout: transposed tile map == dropout_keep for every lane");
    expect(std::fabs(frac - threshold / 65536.0) < 4 * sd, "dropout: kept fraction of p = 0.3");
  }

  // The causal key limit at the largest supported sequence lengths (no int overflow).
  {
    const int kMax = flashattn_cu::kMaxSeqlen;
    expect(flashattn_cu::visible_key_limit(0, 1, kMax, true) == kMax,
           "causal limit: 1 query over kMaxSeqlen keys sees them all");
    expect(flashattn_cu::visible_key_limit(kMax - 1, kMax, kMax, true) == kMax,
           "causal limit: last row of kMaxSeqlen x kMaxSeqlen");
    expect(flashattn_cu::visible_key_limit(0, kMax, kMax, true) == 1,
           "causal limit: first row of kMaxSeqlen x kMaxSeqlen");
    expect(flashattn_cu::visible_key_limit(5, kMax, 10, true) <= 0,
           "causal limit: a row that sees no key is <= 0 (kMaxSeqlen queries over 10 keys)");
  }

  // The mask policy's block ranges against the element rule, brute force over small shapes,
  // causal and sliding windows: key_blocks(m_start) must visit every key block holding a key some
  // row of the query block sees and skip the element mask only on blocks every row sees whole;
  // query_blocks(n_start) likewise from the key block's side.
  {
    constexpr int kBM = 16, kBN = 8;
    const int windows[][3] = {{0, -1, -1}, {1, -1, -1}, {0, 0, -1}, {0, 3, 5}, {0, -1, 0},
                              {0, 17, 0},  {1, 9, -1},  {0, 0, 0},  {0, 40, 2}, {0, 2, 40}};
    bool ok = true, tight = true;
    for (int sq = 1; sq <= 40 && ok; sq += 3) {
      for (int sk = 1; sk <= 40 && ok; sk += 5) {
        for (const auto& w : windows) {
          if (!ok) break;
          flashattn_cu::SeqInfo si{0, sq, sk, -1, -1};
          const flashattn_cu::Mask mask(si, w[0] != 0, w[1], w[2]);
          const int num_m = (sq + kBM - 1) / kBM, num_n = (sk + kBN - 1) / kBN;
          // The rule itself, from flash_attn's definition (not from Mask).
          auto sees = [&](int row, int key) {
            const int d = row + sk - sq;
            const int right = w[0] != 0 ? 0 : w[2];
            return key >= 0 && key < sk && (w[1] < 0 || key >= d - w[1]) &&
                   (right < 0 || key <= d + right);
          };
          // Whether some row of query block m sees a key of key block n (any), and every row
          // every key (all, and-ed into its argument).
          auto block_sees = [&](int m, int n, bool& any, bool& all) {
            for (int r = m * kBM; r < (m + 1) * kBM && r < sq; ++r) {
              for (int j = n * kBN; j < (n + 1) * kBN; ++j) {
                const bool v = sees(r, j);
                any = any || v;
                all = all && v;
              }
            }
          };
          for (int m = 0; m < num_m; ++m) {
            const flashattn_cu::KeyBlocks kb = mask.key_blocks<kBM, kBN>(m * kBM);
            for (int n = 0; n < num_n; ++n) {
              bool any = false, all = true;
              block_sees(m, n, any, all);
              const bool visited = n >= kb.begin && n < kb.end;
              const bool unmasked = n >= kb.unmasked_begin && n < kb.unmasked_end;
              if (any && !visited) ok = false;        // a visible key skipped
              if (unmasked && (!all || !visited)) ok = false;  // mask skipped where needed
              // Tight: a whole query block visits no key block it sees nothing of (the cost
              // of a window is the blocks it covers).
              if (visited && !any && (m + 1) * kBM <= sq) tight = false;
            }
            for (int r = m * kBM; r < (m + 1) * kBM && r < sq; ++r) {  // the element rule
              for (int j = 0; j < sk; ++j) {
                if (sees(r, j) != (j >= mask.key_begin(r) && j < mask.key_end(r))) ok = false;
              }
            }
          }
          for (int n = 0; n < num_n; ++n) {
            const int keys_valid = sk - n * kBN < kBN ? sk - n * kBN : kBN;
            const flashattn_cu::QueryBlocks qb =
                mask.query_blocks<kBM, kBN>(n * kBN, keys_valid, num_m);
            for (int m = 0; m < num_m; ++m) {
              bool any = false, all = keys_valid == kBN;
              block_sees(m, n, any, all);
              const bool visited = m >= qb.begin && m < qb.end;
              const bool unmasked = m >= qb.unmasked_begin && m < qb.unmasked_end;
              if (any && !visited) ok = false;
              if (unmasked && (!all || !visited)) ok = false;
              if (visited && !any && (m + 1) * kBM <= sq) tight = false;
            }
          }
          if (!ok) {
            std::printf("mask block ranges wrong at sq=%d sk=%d causal=%d window=(%d, %d)\n", sq,
                        sk, w[0], w[1], w[2]);
          }
        }
      }
    }
    expect(ok, "mask policy: key_blocks / query_blocks agree with the element rule");
    expect(tight, "mask policy: whole query blocks visit only blocks they see a key of");
    const int kMax = flashattn_cu::kMaxSeqlen;
    const flashattn_cu::Mask big(flashattn_cu::SeqInfo{0, kMax, kMax, -1, -1}, true);
    const flashattn_cu::KeyBlocks last = big.key_blocks<128, 128>(kMax - 128);
    expect(last.begin == 0 && last.end == kMax / 128 && last.unmasked_begin == 0 &&
               last.unmasked_end == (kMax - 127) / 128,
           "mask policy: key blocks of the last query block at kMaxSeqlen");
    const flashattn_cu::QueryBlocks first = big.query_blocks<128, 128>(0, 128, kMax / 128);
    expect(first.begin == 0 && first.end == kMax / 128 && first.unmasked_begin == 1 &&
               first.unmasked_end == kMax / 128,
           "mask policy: query blocks of the first key block at kMaxSeqlen");
    const flashattn_cu::Mask wide(flashattn_cu::SeqInfo{0, kMax, kMax, -1, -1}, false,
                                  kMax - 1, kMax - 1);
    const flashattn_cu::KeyBlocks wb = wide.key_blocks<128, 128>(kMax - 128);
    expect(wb.begin == 0 && wb.end == kMax / 128 && wide.key_end(0) == kMax &&
               wide.key_begin(kMax - 1) == 0,
           "mask policy: windows as wide as kMaxSeqlen do not overflow");
  }

  // The forward's query blocks aligned to the last row (Mask::query_block_shift, sm90/fwd_work.h:
  // block m's first row m x kBM - shift), brute force over small shapes: every row stored by
  // exactly one block (rows [max(0, m_start), min(m_start + kBM, sq))), its visible keys inside
  // that block's key-block walk, the element mask skipped only on blocks its stored rows see
  // whole, the shift only where every row's keys run from key 0 to an end growing with the row
  // (and never kBM), and no more key-block steps in all than blocks at multiples of kBM.
  {
    constexpr int kBM = 16, kBN = 8;
    const int windows[][3] = {{0, -1, -1}, {1, -1, -1}, {0, -1, 0}, {0, -1, 5}, {0, 3, 5},
                              {1, 9, -1},  {0, 0, 0},   {0, -1, 40}};
    bool ok = true, fewer = true;
    for (int sq = 1; sq <= 70 && ok; sq += 3) {
      for (int sk = 1; sk <= 70 && ok; sk += 7) {
        for (const auto& w : windows) {
          flashattn_cu::SeqInfo si{0, sq, sk, -1, -1};
          const flashattn_cu::Mask mask(si, w[0] != 0, w[1], w[2]);
          const int shift = mask.query_block_shift<kBM>();
          const bool grows = mask.right >= 0 && mask.left < 0;
          if (shift < 0 || shift >= kBM || (!grows && shift != 0) ||
              (grows && (sq + shift) % kBM != 0)) {
            ok = false;
          }
          const int num_m = (sq + kBM - 1) / kBM;
          std::vector<int> stored(sq, 0);
          long steps = 0, steps_unshifted = 0;
          for (int m = 0; m < num_m; ++m) {
            const flashattn_cu::KeyBlocks unshifted = mask.key_blocks<kBM, kBN>(m * kBM);
            steps_unshifted += unshifted.end - unshifted.begin;
            const int m_start = m * kBM - shift;
            if (m_start >= sq) continue;
            const flashattn_cu::KeyBlocks kb = mask.key_blocks<kBM, kBN>(m_start);
            steps += kb.end - kb.begin;
            for (int r = m_start < 0 ? 0 : m_start; r < m_start + kBM && r < sq; ++r) {
              ++stored[r];
              const int lo = mask.key_begin(r), hi = mask.key_end(r);
              if (lo < hi && (lo < kb.begin * kBN || hi > kb.end * kBN)) ok = false;
              for (int n = kb.unmasked_begin; n < kb.unmasked_end; ++n) {
                if (n * kBN < lo || (n + 1) * kBN > hi) ok = false;  // a masked key unmasked
              }
            }
          }
          for (int r = 0; r < sq; ++r) ok = ok && stored[r] == 1;
          if (steps > steps_unshifted) fewer = false;
          if (!ok) {
            std::printf("last-aligned blocks wrong at sq=%d sk=%d causal=%d window=(%d, %d) "
                        "shift=%d\n", sq, sk, w[0], w[1], w[2], shift);
            break;
          }
        }
      }
    }
    expect(ok, "last-aligned query blocks: every row stored once, its keys inside its walk");
    expect(fewer, "last-aligned query blocks: never more key-block steps than unshifted");
  }

  check_dq_frag_layout();
  check_dq_stream_waits();
  check_convert_frag_blocks();
}

}  // namespace flashattn_cu_checks
