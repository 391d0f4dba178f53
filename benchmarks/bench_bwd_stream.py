#!/usr/bin/env python3
"""The sm90a backward with its dQ converted streamed against after the main kernel, in one process.

    python benchmarks/bench_bwd_stream.py [--shapes 64:1024:1,128:16384:w1024,...] [--flush read]
        [--rounds 5] [--reps 20] [--dtype bf16] [--out table.md]

flashattn_cu.testing.bwd_streamed_dq switches the postprocess between converting each 64-row
block of the fp32 dQ accumulator as soon as the main kernel's key tiles that add to it are done
(streamed, on the SMs the main kernel's last tiles leave idle) and converting after the whole
main kernel (the default until this A/B says otherwise; benchmarks/NOTES.md 12.73). This times
the backward alone (torch.ops.flashattn_cu.bwd on a forward's saved outputs, so the forward is not
in the time) both ways on bench.py's shapes (16k tokens: batch = 16384 // seqlen, hidden 2048:
nheads = 2048 // d) and the window rows of bench_features.py, each call between CUDA events after
the L2 is emptied (benchmarks/bench_timing.py flushed_median_ms), the two variants interleaved
round by round, the result the median of the rounds' medians. Shapes are d:seqlen:mask with mask
0 (none), 1 (causal) or wN (causal with window (N, 0)). Checked: dK / dV bitwise equal both
ways, dQ within 1e-2 of each other (the fp32 additions' order differs from run to run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if list((REPO_ROOT / "flashattn_cu").glob("_C*.so")) and str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # an in-place build (scripts/device_run.sh's)
import flashattn_cu  # noqa: E402,F401  (registers torch.ops.flashattn_cu)
from flashattn_cu.testing import bwd_streamed_dq  # noqa: E402

from bench_timing import flushed_median_ms, geo_summary  # noqa: E402

DEFAULT_SHAPES = ("64:1024:0,64:1024:1,64:4096:1,64:16384:0,64:16384:1,"
                  "128:1024:0,128:1024:1,128:2048:1,128:4096:0,128:4096:1,128:8192:1,"
                  "128:16384:0,128:16384:1,128:4096:w1024,128:16384:w1024,128:16384:w4096,"
                  "128:16384:w128")


def parse_shape(item):
    d, s, mask = item.split(":")
    if mask.startswith("w"):
        return int(d), int(s), True, (int(mask[1:]), 0)
    return int(d), int(s), mask == "1", (-1, -1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="d:seqlen:mask,... (mask 0, 1, wN)")
    ap.add_argument("--flush", default="read", choices=("read", "memset", "none"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--out", default=None, help="also write the table here (markdown)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_bwd_stream: no CUDA device")
        return 1
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    lines = [f"# Backward, dQ streamed / after the main kernel, {torch.cuda.get_device_name()}, "
             f"torch {torch.__version__}, {args.dtype}", "",
             f"Backward alone (torch.ops.flashattn_cu.bwd), flush '{args.flush}', median of "
             f"{args.rounds} rounds of the median of {args.reps} calls. 'ratio' = time streamed / "
             "time after the main kernel (< 1: streamed faster).", "",
             "| d | seqlen | causal | window | after main ms | streamed ms | ratio | check |",
             "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    ratios = []
    for item in args.shapes.split(","):
        d, s, causal, window = parse_shape(item)
        b, h = 16384 // s, 2048 // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3))
        scale = d ** -0.5
        out, lse, stats, *_ = torch.ops.flashattn_cu.fwd(q, k, v, scale, causal,
                                                         window_left=window[0],
                                                         window_right=window[1])
        dout = torch.randn_like(out)

        def call(streamed):
            def run():
                with bwd_streamed_dq(streamed):
                    # deterministic=False: the dQ accumulator (the deterministic backward has
                    # none to convert)
                    return torch.ops.flashattn_cu.bwd(dout, q, k, v, out, lse, scale, causal,
                                                      False, stats, window_left=window[0],
                                                      window_right=window[1])
            return run
        fns = {"after": call(False), "streamed": call(True)}
        a, st = fns["after"](), fns["streamed"]()
        same = torch.equal(a[1], st[1]) and torch.equal(a[2], st[2])
        dq_diff = (a[0].float() - st[0].float()).abs().max().item()
        check = "ok" if same and dq_diff < 1e-2 else (
            f"{'dK/dV differ ' if not same else ''}max|ddq| {dq_diff:.1e}")
        del a, st
        per = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                per[name].append(flushed_median_ms(fn, args.flush, args.reps, args.warmup))
        ms = {name: statistics.median(v) for name, v in per.items()}
        ratio = ms["streamed"] / ms["after"]
        ratios.append(ratio)
        lines.append(f"| {d} | {s} | {int(causal)} | {window if window[0] >= 0 else '-'} | "
                     f"{ms['after']:.3f} | {ms['streamed']:.3f} | {ratio:.3f} | {check} |")
        print(lines[-1], flush=True)
        del q, k, v, out, lse, stats, dout, fns
        torch.cuda.empty_cache()
    if ratios:
        lines += ["", geo_summary("time streamed / after main:", ratios)]
        print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
