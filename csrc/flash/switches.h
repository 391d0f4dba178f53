// The process-wide switches of the public API (flashattn_cu.h set_kernel_path,
// set_fwd_causal_schedule, set_fwd_dynamic_tiles, set_fwd_varlen_order, set_bwd_streamed_dq), for
// tests and benchmarks: set by dispatch.cu, read where a launch decides (dispatch_common.h
// use_sm90a, sm90/fwd_launch.h causal_persistent, sm90/bwd_launch.h). Inline variables:
// one object in the whole library. Torch-free.
#pragma once

#include <atomic>

#include "flashattn_cu/flashattn_cu.h"

namespace flashattn_cu::detail {

inline std::atomic<int> g_kernel_path{static_cast<int>(KernelPath::kAuto)};
inline std::atomic<int> g_fwd_causal_schedule{static_cast<int>(FwdCausalSchedule::kAuto)};
inline std::atomic<bool> g_fwd_dynamic_tiles{true};
inline std::atomic<int> g_fwd_varlen_order{static_cast<int>(FwdVarlenOrder::kHeads)};
inline std::atomic<bool> g_bwd_streamed_dq{false};

}  // namespace flashattn_cu::detail
