// Harness-only phase clocks of the sm90 forward's consumer warpgroups (FwdTraits kStamps; off in
// the library, where FwdClock<false> compiles to nothing). Where a tile's time goes on short
// rows (benchmarks/NOTES.md 13.14 / 12.8: at 1k keys our per-tile cost is ~0.7 key-block steps
// above the steps themselves): each consumer thread reads clock64 at the phase boundaries of
// every tile and adds the cycles since its previous mark to that phase's sum; at the end the
// warpgroup's first thread writes the sums (benchmarks/tune/tune_fwd90.cu `phases` prints them).
// Every thread of the warpgroup keeps the sums (no divergent branch among the wgmmas, which
// ptxas would serialize: C7520); the marks sit next to waits, outside any wgmma sequence.
#pragma once

#include <cstdint>

namespace flashattn_cu::sm90 {

// A tile's phases, in the order a consumer passes them (each ends at its mark):
enum FwdPhase : int {
  kPhaseSchedule,   // from the previous tile's end: the next tile's work (fwd_work)
  kPhaseQWait,      // Q's full barrier
  kPhaseFirstK,     // the first key block's K landed
  kPhaseFirstStep,  // S_0 issued (ping-pong turn), landed; its softmax and P
  kPhaseSteps,      // the steps 1 .. n - 1: S_i with P_{i-1} V_{i-1}
  kPhaseLastPV,     // the last block's P V (its turn, V's wait, the GEMM)
  kPhaseEpilogue,   // 1 / l, O and LSE stores
  kFwdPhases
};
// Per consumer warpgroup: the phase sums (cycles), its tiles, its key blocks, its whole walk.
constexpr int kFwdClockSlots = kFwdPhases + 3;

template <bool kOn>
struct FwdClock {
  __device__ __forceinline__ void start() {}
  __device__ __forceinline__ void mark(FwdPhase) {}
  __device__ __forceinline__ void count(int) {}
  __device__ __forceinline__ void write(unsigned long long*, int, int) const {}
};

template <>
struct FwdClock<true> {
  uint32_t sums[kFwdPhases];
  uint32_t tiles, blocks;
  long long t0, last;
  __device__ __forceinline__ void start() {
#pragma unroll
    for (int i = 0; i < kFwdPhases; ++i) sums[i] = 0;
    tiles = blocks = 0;
    t0 = last = clock64();
  }
  // `phase` is a constant at every call site, so the sums stay in registers.
  __device__ __forceinline__ void mark(FwdPhase phase) {
    const long long now = clock64();
    sums[phase] += static_cast<uint32_t>(now - last);
    last = now;
  }
  __device__ __forceinline__ void count(int num_blocks) {
    ++tiles;
    blocks += static_cast<uint32_t>(num_blocks);
  }
  // out[(blockIdx.x * consumers + consumer) * kFwdClockSlots + slot].
  __device__ __forceinline__ void write(unsigned long long* out, int consumer, int consumers) const {
    if (threadIdx.x % 128 != 0) return;
    unsigned long long* const at =
        out + (static_cast<size_t>(blockIdx.x) * consumers + consumer) * kFwdClockSlots;
#pragma unroll
    for (int i = 0; i < kFwdPhases; ++i) at[i] = sums[i];
    at[kFwdPhases] = tiles;
    at[kFwdPhases + 1] = blocks;
    at[kFwdPhases + 2] = static_cast<unsigned long long>(clock64() - t0);
  }
};

}  // namespace flashattn_cu::sm90
