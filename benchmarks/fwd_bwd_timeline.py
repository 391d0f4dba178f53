#!/usr/bin/env python3
"""Where a training step's attention time goes between the kernels: one forward + backward of
flash_attn_func timed eagerly (autograd, as bench_features.py times it), as the sum of its parts
(forward alone, backward alone through torch.ops), replayed from a CUDA graph (no host work), and
its kernels' timeline from the profiler (each kernel's start, duration and the idle gap before
it) and its host-side operators (self CPU time), with the host's time to issue each part while
the GPU is kept busy.

    python benchmarks/fwd_bwd_timeline.py [--shapes 128:16384:w1024,128:16384:1] [--flush memset]

If the eager step is slower than its graph replay by more than the kernels' sum explains, the
GPU waited on the host between the forward and the backward (the autograd engine and the
backward's launch path ran longer than the forward's kernel).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if list((REPO_ROOT / "flashattn_cu").glob("_C*.so")) and str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # an in-place build (scripts/device_run.sh's)
from flashattn_cu import flash_attn_func  # noqa: E402

from bench_bwd_stream import parse_shape  # noqa: E402  (its d:seqlen:mask shapes)
from bench_timing import flushed_median_ms  # noqa: E402

HEADS = 16


def host_us(fn, reps=20):
    """Median host time of fn() in us while the GPU is kept busy (so no launch blocks)."""
    times = []
    for _ in range(reps):
        torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time ahead of the calls
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def graph_ms(step, flush, reps=50):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return flushed_median_ms(graph.replay, flush=flush, reps=reps)


def timeline(step, host_rows):
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        torch.cuda._sleep(20_000_000)
        step()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    events.sort(key=lambda e: e.time_range.start)
    events = [e for e in events if "sleep" not in e.name.lower()]
    lines, prev_end, t0 = [], None, events[0].time_range.start if events else 0
    for e in events:
        start, end = e.time_range.start, e.time_range.end
        gap = "" if prev_end is None else f"{start - prev_end:8.1f}"
        lines.append(f"  {start - t0:9.1f} {end - start:9.1f} {gap:>8}  {e.name[:90]}")
        prev_end = end if prev_end is None else max(prev_end, end)
    if host_rows > 0:
        host = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=host_rows)
        lines += ["  host-side operators of the step (profiler, self CPU time first):"]
        lines += ["  " + line for line in host.splitlines()]
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="128:16384:w1024,128:16384:1,128:4096:w1024")
    parser.add_argument("--flush", default="memset", choices=("read", "memset", "none"))
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--host-rows", type=int, default=20,
                        help="rows of the step's host-side operator table (0: none)")
    args = parser.parse_args(argv)
    dt = torch.bfloat16
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, flush {args.flush}")
    for item in args.shapes.split(","):
        d, s, causal, window = parse_shape(item)
        batch = max(1, 16384 // s)
        q, k, v = (torch.randn(batch, s, HEADS, d, device="cuda", dtype=dt, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn_like(q)

        def fwd():
            return flash_attn_func(q, k, v, causal=causal, window_size=window)

        def step():
            torch.autograd.grad(fwd(), (q, k, v), dout)

        # The ops on detached inputs: an op called on leaves that require grad records an
        # autograd node holding their AccumulateGrad nodes, which breaks the graph capture.
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        o, lse, stats = torch.ops.flashattn_cu.fwd(qd, kd, vd, d ** -0.5, causal, window[0],
                                                   window[1], None, 0.0, 0.0, False)[:3]

        def bwd():
            torch.ops.flashattn_cu.bwd(dout, qd, kd, vd, o, lse, d ** -0.5, causal, False, stats,
                                       window[0], window[1], None, 0.0, 0.0, None)

        t_fwd = flushed_median_ms(fwd, flush=args.flush, reps=args.reps)
        t_bwd = flushed_median_ms(bwd, flush=args.flush, reps=args.reps)
        t_step = flushed_median_ms(step, flush=args.flush, reps=args.reps)
        t_graph = graph_ms(step, args.flush, reps=args.reps)
        h_fwd = host_us(fwd)
        h_grad = host_us(lambda: torch.autograd.grad(fwd(), (q, k, v), dout)) - h_fwd
        h_bwd = host_us(bwd)
        sdpa = ""
        if window == (-1, -1):
            # The same step's host time through PyTorch's SDPA flash backend (FlashAttention-2), as
            # the host cost a user has today; (batch, heads, seqlen, d) views, no copies.
            from torch.nn.attention import SDPBackend, sdpa_kernel
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

            def sdpa_fwd():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return torch.nn.functional.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=causal)
            hs_fwd = host_us(sdpa_fwd)
            hs_grad = host_us(lambda: torch.autograd.grad(
                sdpa_fwd(), (q, k, v), dout.transpose(1, 2))) - hs_fwd
            sdpa = f"; SDPA flash host us: fwd {hs_fwd:.0f}, autograd.grad {hs_grad:.0f}"
        print(f"RESULT d={d} s={s} causal={int(causal)} window={window}: step {t_step:.3f} ms, "
              f"graph {t_graph:.3f} ms, fwd {t_fwd:.3f} + bwd {t_bwd:.3f} = {t_fwd + t_bwd:.3f} "
              f"ms; host us: fwd {h_fwd:.0f}, autograd.grad {h_grad:.0f}, bwd op {h_bwd:.0f}{sdpa}",
              flush=True)
        print("  start_us   dur_us   gap_us  kernel")
        for line in timeline(step, args.host_rows):
            print(line)
        del q, k, v, qd, kd, vd, dout, o, lse, stats
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
