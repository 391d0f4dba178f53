// Counter-based random numbers for dropout: Philox4x32-10 (Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3", SC 2011; the generator behind curand's and torch's CUDA
// dropout), and the keep decision of one attention element derived from it.
//
// Why counter-based: the backward of every path (sm80, sm90, the deterministic dQ kernel) must
// regenerate exactly the forward's mask without storing it. Philox is a pure function of a
// 128-bit counter and a 64-bit key, so each element's decision is a pure function of
// (seed, offset, batch, head, row, key) and any kernel with any tile shape recomputes it.
//
// The element -> random number map. One Philox call gives 4 x 32 bits = 8 x 16-bit numbers and
// serves 8 elements: rows {r, r + 8} x keys {k, k + 1, k + 8, k + 9} of a 16 x 16 block
// (r = row % 8, k = key % 8 rounded down to even). That is exactly the 8 elements one thread
// holds in a row-major mma C fragment pair (forward, dQ kernel): rows g, g + 8, keys 2t, 2t + 1
// of two 8-key tiles. A transposed fragment (the backward main kernels: rows are keys) holds rows
// {2t, 2t + 1, 2t + 8, 2t + 9} x keys {g, g + 8} and uses half of each of two calls.
//   counter = (lo, hi of offset / 4 + batch * num_heads + head,  16-key block * 4 + (key % 8) / 2,
//              16-row block * 8 + row % 8)
//   key     = (lo, hi of seed)
//   number  = 16-bit half (key / 8) % 2 of word (key % 2) * 2 + (row / 8) % 2
// The counter's lower half gives every (batch, head) of a call its own stream, inside the offsets
// the call reserved: torch's CUDA generator hands out offsets in multiples of 4, and a consumer
// that reserves [offset, offset + increment) owns every counter whose lower 64 bits lie in
// [offset / 4, (offset + increment) / 4), whatever its upper half (torch's own kernels: curand's
// offset / 4 + draw there, their thread in the upper half). A call reserves 4 * batch * num_heads
// (the binding asks the generator for that many), so its counters meet no other consumer's of
// the same generator. (Before, the stream sat in the upper half and the element in the lower:
// an attention mask shared random words with torch kernels run soon after a manual_seed.)
// Element kept iff number < keep_threshold (= round((1 - p) * 65536)): keep probability
// keep_threshold / 65536, within 2^-17 of 1 - p.
#pragma once

#include <cstdint>

namespace flashattn_cu {

struct PhiloxOut {
  uint32_t w[4];
};

// Philox4x32 with 10 rounds (the Random123 reference constants). Host-callable for the tests.
__host__ __device__ __forceinline__ PhiloxOut philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2,
                                                            uint32_t c3, uint32_t k0,
                                                            uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
#ifdef __CUDA_ARCH__
    const uint32_t hi0 = __umulhi(kMul0, c0), hi1 = __umulhi(kMul1, c2);
#else
    const uint32_t hi0 = static_cast<uint32_t>((static_cast<uint64_t>(kMul0) * c0) >> 32);
    const uint32_t hi1 = static_cast<uint32_t>((static_cast<uint64_t>(kMul1) * c2) >> 32);
#endif
    const uint32_t lo0 = kMul0 * c0, lo1 = kMul1 * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return PhiloxOut{{c0, c1, c2, c3}};
}

// The resolved random state of one call (the public fields, read at run time: AttnParams).
struct PhiloxState {
  uint64_t seed;
  uint64_t offset;
};

// Counter words of an element's call (see the map above): row-block word and key-block word.
__host__ __device__ __forceinline__ uint32_t dropout_key_word(int key) {
  return (static_cast<uint32_t>(key) >> 4) * 4u + ((static_cast<uint32_t>(key) & 7u) >> 1);
}
__host__ __device__ __forceinline__ uint32_t dropout_row_word(int row) {
  return (static_cast<uint32_t>(row) >> 4) * 8u + (static_cast<uint32_t>(row) & 7u);
}

// The 16-bit number of element (row, key) in a call's output (see the map above).
__host__ __device__ __forceinline__ uint32_t dropout_number(const PhiloxOut& r, int row, int key) {
  const uint32_t word = r.w[(key & 1) * 2 + ((row >> 3) & 1)];
  return (word >> (16 * ((key >> 3) & 1))) & 0xffffu;
}

// The counter's lower half of (batch, head) for a call at `offset` (a multiple of 4: torch's
// offsets are, and the API refuses others with dropout).
__host__ __device__ __forceinline__ uint64_t dropout_stream(uint64_t offset, int batch,
                                                           int num_heads, int head) {
  return offset / 4 + static_cast<uint64_t>(batch) * static_cast<uint64_t>(num_heads) +
         static_cast<uint64_t>(head);
}

// The reference keep decision of one element, from first principles (one call per element):
// the S_dmask kernel and the host checks use it; the attention kernels evaluate the same map
// one call per 8 elements (problem/dropout.h). stream = dropout_stream(offset, batch, ...).
__host__ __device__ __forceinline__ bool dropout_keep(uint64_t seed, uint64_t stream, int row,
                                                      int key, uint32_t keep_threshold) {
  const PhiloxOut r = philox4x32_10(static_cast<uint32_t>(stream),
                                    static_cast<uint32_t>(stream >> 32), dropout_key_word(key),
                                    dropout_row_word(row), static_cast<uint32_t>(seed),
                                    static_cast<uint32_t>(seed >> 32));
  return dropout_number(r, row, key) < keep_threshold;
}

// keep_threshold of dropout probability p in [0, 1): round((1 - p) * 65536), in [1, 65536].
inline uint32_t dropout_keep_threshold(float p) {
  const double t = (1.0 - static_cast<double>(p)) * 65536.0 + 0.5;
  const uint32_t r = static_cast<uint32_t>(t);
  return r < 1u ? 1u : r > 65536u ? 65536u : r;
}

}  // namespace flashattn_cu
