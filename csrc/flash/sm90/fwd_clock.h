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
// The parts of one step of kPhaseSteps (each ends at its mark), summed apart from the phases:
enum FwdStepPart : int {
  kStepWaitKV,   // K_i's and V_{i-1}'s full barriers
  kStepTurn,     // the ping-pong turn (the other consumer's issue)
  kStepS,        // S_i and P_{i-1} V_{i-1} issued, S_i landed
  kStepMax,      // S_i's modifiers, mask and row max (and the K buffer's release)
  kStepExp,      // S_i's exponentials (and dropout); P V still running
  kStepWaitPV,   // P_{i-1} V_{i-1} landed
  kStepPack,     // O's rescale (unless kEarlyRescale) and P_i packed
  kFwdStepParts
};
// Per consumer warpgroup: the phase sums (cycles), its tiles, its key blocks, its whole walk,
// then the step parts' sums.
constexpr int kFwdClockSlots = kFwdPhases + 3 + kFwdStepParts;

template <bool kOn>
struct FwdClock {
  __device__ __forceinline__ void start() {}
  __device__ __forceinline__ void mark(FwdPhase) {}
  __device__ __forceinline__ void step_start() {}
  __device__ __forceinline__ void step(FwdStepPart) {}
  __device__ __forceinline__ void count(int) {}
  __device__ __forceinline__ void write(unsigned long long*, int, int) const {}
};

template <>
struct FwdClock<true> {
  uint32_t sums[kFwdPhases];
  uint32_t parts[kFwdStepParts];
  uint32_t tiles, blocks;
  long long t0, last, step_last;
  bool in_step;  // between step_start and the step's last part: step() counts only then
  __device__ __forceinline__ void start() {
#pragma unroll
    for (int i = 0; i < kFwdPhases; ++i) sums[i] = 0;
#pragma unroll
    for (int i = 0; i < kFwdStepParts; ++i) parts[i] = 0;
    tiles = blocks = 0;
    in_step = false;
    t0 = last = step_last = clock64();
  }
  // A step's parts: step_start at its top, step(part) at each part's end (constants, as mark);
  // outside a step (the first step's softmax shares the code) step() counts nothing.
  __device__ __forceinline__ void step_start() {
    step_last = clock64();
    in_step = true;
  }
  __device__ __forceinline__ void step(FwdStepPart part) {
    if (!in_step) return;
    const long long now = clock64();
    parts[part] += static_cast<uint32_t>(now - step_last);
    step_last = now;
    if (part == kStepPack) in_step = false;  // the last part
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
#pragma unroll
    for (int i = 0; i < kFwdStepParts; ++i) at[kFwdPhases + 3 + i] = parts[i];
  }
};

}  // namespace flashattn_cu::sm90
