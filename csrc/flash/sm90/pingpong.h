// Ping-pong turns between the two consumer warpgroups of an sm90a kernel (the forward's
// Traits::kPingPong): named barriers kPingPong0 / 1 over the 256 consumer threads (ptx/sync.h).
#pragma once

#include "../ptx/sync.h"

namespace flashattn_cu::sm90 {

// A consumer waits for its turn before issuing a step's GEMMs and hands the turn to the other
// right after. Consumer 1 hands consumer 0 the first turn at the start; both walk the same work,
// so they take the same number of turns, and consumer 0 takes consumer 1's last hand-over at the
// end (finish), which leaves no barrier arrival pending.
template <bool kEnabled>
struct PingPong {
  int consumer;
  __device__ __forceinline__ void start() const {
    if (kEnabled && consumer == 1) ptx::named_barrier_arrive(ptx::NamedBarrier::kPingPong0, 256);
  }
  __device__ __forceinline__ void begin() const {
    if constexpr (kEnabled) {
      ptx::named_barrier_sync(consumer == 0 ? ptx::NamedBarrier::kPingPong0
                                            : ptx::NamedBarrier::kPingPong1, 256);
    }
  }
  __device__ __forceinline__ void end() const {
    if constexpr (kEnabled) {
      ptx::named_barrier_arrive(consumer == 0 ? ptx::NamedBarrier::kPingPong1
                                              : ptx::NamedBarrier::kPingPong0, 256);
    }
  }
  __device__ __forceinline__ void finish() const {
    if (kEnabled && consumer == 0) ptx::named_barrier_sync(ptx::NamedBarrier::kPingPong0, 256);
  }
};

}  // namespace flashattn_cu::sm90
