// Dropout on score tiles, for every kernel: the keep mask of common/philox.h evaluated one
// Philox call per 8 elements of a row-major tile (forward, dQ kernel) and of a transposed tile
// (backward main kernels: lane pairs share their calls through a shuffle), with the same element
// map, so every path drops the same elements (tests/cpp/api_checks.cpp compares both tile forms
// with dropout_keep for every lane).
//
// Where the mask enters (flash_attn's semantics, P the undropped probabilities, M the mask,
// rp = 1 / (1 - p)):
//   forward:   O = (P o M) V * rp / l: the row statistics and the LSE are of the undropped P,
//              dropped elements leave only the P V product, rp joins 1 / l in the epilogue;
//   backward:  dV = rp (P o M)^T dO (the mask on P's A operand, rp in the epilogue),
//              dP' = M o (dO V^T) * rp (the gradient reaching P), dS = P o (dP' - D) with
//              D = rowsum(dO o O) as without dropout (rowsum(dP' o P) = rowsum(dO o O)).
// Tiles are mma C fragments (problem/mask.h): s[mt][nt][hr * 2 + e] is row (row0 + mt * 16 + g +
// hr * 8), key (col0 + nt * 8 + 2t + e); transposed s[nt][hr * 2 + e] is key (key0 + g + hr * 8),
// query (query0 + nt * 8 + 2t + e); g = lane / 4, t = lane % 4; row0, col0, key0, query0 are
// multiples of 16.
#pragma once

#include <cstdint>

#include "flashattn_cu/flashattn_cu.h"

#include "../common/philox.h"

namespace flashattn_cu {

// The host-built constants of a call's dropout (FwdKernelParams::dropout,
// BwdKernelParams::dropout).
struct DropoutScale {
  uint32_t keep_threshold;  // common/philox.h; 65536 without dropout
  float rp;                 // 1 / (1 - dropout_p): the kept elements' scale
};

inline DropoutScale dropout_scale_of(const AttnParams& p) {
  DropoutScale d;
  d.keep_threshold = dropout_keep_threshold(p.dropout_p);
  d.rp = 1.f / (1.f - p.dropout_p);
  return d;
}

// The seed and offset of a call, read when the kernel runs (CUDA graphs: the pointers are the
// generator's, the values change between replays; AttnParams::philox_*).
template <typename Params>
__host__ __device__ __forceinline__ PhiloxState philox_state_of(const Params& p) {
  PhiloxState s;
  s.seed = p.philox_seed_ptr != nullptr ? *p.philox_seed_ptr : p.philox_seed;
  s.offset = (p.philox_offset_ptr != nullptr ? *p.philox_offset_ptr : 0) + p.philox_offset;
  return s;
}

// 32-bit words of keep bits for a tile of `elements` per lane.
__host__ __device__ constexpr int keep_words(int elements) { return (elements + 31) / 32; }

// The mask of one (batch entry, query head): its Philox key and counter stream.
struct Dropout {
  uint32_t seed_lo, seed_hi;
  uint32_t stream_lo, stream_hi;
  uint32_t keep_threshold;

  __host__ __device__ __forceinline__ PhiloxOut call(uint32_t key_word, uint32_t row_word) const {
    return philox4x32_10(stream_lo, stream_hi, key_word, row_word, seed_lo, seed_hi);
  }

  // f(mt, nt, i, kept) for every element [mt][nt][i] (i = hr * 2 + e) of a row-major tile of
  // kMTiles x kNTiles C fragments: one call per 16-row tile and 16 keys (8 elements of this
  // lane: word e * 2 + hr, half nt % 2).
  template <int kMTiles, int kNTiles, typename F>
  __host__ __device__ __forceinline__ void visit_rows(int row0, int col0, int lane,
                                                      const F& f) const {
    static_assert(kNTiles % 2 == 0, "whole 16-key blocks");
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int kk = 0; kk < kNTiles / 2; ++kk) {
        const PhiloxOut r = call(dropout_key_word(col0 + kk * 16 + 2 * t),
                                 dropout_row_word(row0 + mt * 16 + g));
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const uint32_t number = (r.w[e * 2 + hr] >> (16 * h)) & 0xffffu;
              f(mt, 2 * kk + h, hr * 2 + e, number < keep_threshold);
            }
      }
  }

  // Zeroes the dropped elements of a row-major tile (the forward's P). Applied as they are drawn:
  // keep bits held from before the tile's GEMM, or drawn into an array first, cost the forward
  // more registers (measured: d = 64 spills 352-480 bytes instead of 264, d = 128 72-180
  // instead of 8).
  template <int kMTiles, int kNTiles>
  __device__ __forceinline__ void drop(float (&s)[kMTiles][kNTiles][4], int row0, int col0,
                                       int lane) const {
    visit_rows<kMTiles, kNTiles>(row0, col0, lane, [&](int mt, int nt, int i, bool kept) {
      if (!kept) s[mt][nt][i] = 0.f;
    });
  }

  // Keep bits of a row-major tile: bit (mt * kNTiles + nt) * 4 + i of bits[] (32 per word).
  template <int kMTiles, int kNTiles>
  __host__ __device__ __forceinline__ void keep_bits(
      uint32_t (&bits)[keep_words(kMTiles * kNTiles * 4)], int row0, int col0, int lane) const {
#pragma unroll
    for (int i = 0; i < keep_words(kMTiles * kNTiles * 4); ++i) bits[i] = 0u;
    visit_rows<kMTiles, kNTiles>(row0, col0, lane, [&](int mt, int nt, int i, bool kept) {
      const int bit = (mt * kNTiles + nt) * 4 + i;
      if (kept) bits[bit / 32] |= 1u << (bit % 32);
    });
  }

  // Keep bits of a transposed tile: bit nt * 4 + hr * 2 + e of bits[] (32 per word). Per 16
  // queries the lane needs half of each of two calls (query parities e = 0, 1: word (g % 2) * 2 +
  // nt % 2, half hr), and its partner lane ^ 4 (g ^ 1, same key word) the other half of the
  // same two calls: each draws the call of e = g % 2 and hands the partner the half it needs,
  // one call per 8 elements as in the row-major form.
  template <int kQTiles>
  __host__ __device__ __forceinline__ void keep_bits_transposed(
      uint32_t (&bits)[keep_words(kQTiles * 4)], int key0, int query0, int lane) const {
    static_assert(kQTiles % 2 == 0, "whole 16-query blocks");
#pragma unroll
    for (int i = 0; i < keep_words(kQTiles * 4); ++i) bits[i] = 0u;
#pragma unroll
    for (int kk = 0; kk < kQTiles / 2; ++kk) {
      const PhiloxOut own = transposed_call(kk, key0, query0, lane);
      uint32_t sent[2];
      transposed_half_for_partner(own, lane, sent);
      uint32_t got[2];
#ifdef __CUDA_ARCH__
      got[0] = __shfl_xor_sync(0xffffffffu, sent[0], 4);
      got[1] = __shfl_xor_sync(0xffffffffu, sent[1], 4);
#else
      // Host (tests/cpp/api_checks.cpp): the partner's call, as the shuffle delivers it.
      transposed_half_for_partner(transposed_call(kk, key0, query0, lane ^ 4), lane ^ 4, got);
#endif
      const int g = lane / 4, e_own = g % 2;
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const uint32_t mine = (own.w[e_own * 2 + h] >> (16 * hr)) & 0xffffu;
          const uint32_t theirs = (got[h] >> (16 * hr)) & 0xffffu;
          const int mine_bit = (2 * kk + h) * 4 + hr * 2 + e_own;  // query parity e_own
          const int theirs_bit = mine_bit + 1 - 2 * e_own;          // the other parity
          if (mine < keep_threshold) bits[mine_bit / 32] |= 1u << (mine_bit % 32);
          if (theirs < keep_threshold) bits[theirs_bit / 32] |= 1u << (theirs_bit % 32);
        }
    }
  }

  // The call a lane draws for queries query0 + 16 kk .. of a transposed tile: key word of its
  // key g, row word of query parity e = g % 2.
  __host__ __device__ __forceinline__ PhiloxOut transposed_call(int kk, int key0, int query0,
                                                               int lane) const {
    const int g = lane / 4, t = lane % 4;
    return call(dropout_key_word(key0 + g), dropout_row_word(query0 + kk * 16 + 2 * t + g % 2));
  }

  // The half of a lane's call its partner (g ^ 1) needs: words (g ^ 1) % 2 * 2 + h, h = 0, 1.
  static __host__ __device__ __forceinline__ void transposed_half_for_partner(const PhiloxOut& own,
                                                                             int lane,
                                                                             uint32_t (&out)[2]) {
    const int partner_odd = ((lane / 4) % 2) ^ 1;
    out[0] = own.w[partner_odd * 2];
    out[1] = own.w[partner_odd * 2 + 1];
  }
};

// The mask of (entry `batch`, query head `head`) for a kernel (KP: FwdKernelParams or
// BwdKernelParams), its random state read now.
template <typename KP>
__host__ __device__ __forceinline__ Dropout dropout_of(const KP& kp, int batch, int head) {
  const PhiloxState st = philox_state_of(kp.p);
  const uint64_t stream = dropout_stream(st.offset, batch, kp.p.num_heads, head);
  Dropout d;
  d.seed_lo = static_cast<uint32_t>(st.seed);
  d.seed_hi = static_cast<uint32_t>(st.seed >> 32);
  d.stream_lo = static_cast<uint32_t>(stream);
  d.stream_hi = static_cast<uint32_t>(stream >> 32);
  d.keep_threshold = kp.dropout.keep_threshold;
  return d;
}

// x <- kept ? x * rp : 0 on kTiles C fragments that are tiles tile0.. of kBitTiles whose bits
// are nt * 4 + i (a transposed tile's dP^T, or the dQ kernel's one 16-row dP tile): the gradient
// reaching the undropped P. tile0 > 0: a part of a step's queries (the sm80 register path forms
// dP^T half at a time).
template <int kTiles, int kBitTiles>
__device__ __forceinline__ void apply_keep_bits_at(
    float (&x)[kTiles][4], const uint32_t (&bits)[keep_words(kBitTiles * 4)], int tile0, float rp) {
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int bit = (tile0 + nt) * 4 + i;
      x[nt][i] = (bits[bit / 32] >> (bit % 32)) & 1u ? x[nt][i] * rp : 0.f;
    }
}

// The whole tile's bits.
template <int kTiles>
__device__ __forceinline__ void apply_keep_bits(float (&x)[kTiles][4],
                                                const uint32_t (&bits)[keep_words(kTiles * 4)],
                                                float rp) {
  apply_keep_bits_at<kTiles, kTiles>(x, bits, 0, rp);
}

// A 16-bit A fragment of k-step kk (C tiles 2kk, 2kk + 1, common/bwd_math.h: pack_a_frag) with
// its dropped elements zeroed: a[j] holds tile 2kk + j / 2, row half j % 2, elements e = 0, 1.
template <int kWords>
__device__ __forceinline__ void drop_a_frag(uint32_t (&a)[4], const uint32_t (&bits)[kWords],
                                            int kk) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int bit = (2 * kk + j / 2) * 4 + (j % 2) * 2;
    const uint32_t two = (bits[bit / 32] >> (bit % 32)) & 3u;
    a[j] &= ((two & 1u) * 0x0000ffffu) | ((two >> 1) * 0xffff0000u);
  }
}

}  // namespace flashattn_cu
