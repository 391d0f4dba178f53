#!/usr/bin/env python3
"""The sm90a forward's causal schedules timed as the bench times them, in one process.

    python benchmarks/bench_schedule.py [--shapes 64:4096,128:8192,...] [--flush memset,read]
        [--rounds 5] [--reps 30] [--dtype bf16] [--out table.md]

tiles.h fwd_causal_persistent_sm90 picks, per head dim and keys, between the persistent grid (a
CTA per SM walking its share of the tiles) and one CTA per tile; the tuning harness
(benchmarks/tune/tune_fwd90) and the bench have disagreed on some of those choices (d 256 at 1k
keys: the harness had the persistent grid 2-6% faster, three bench runs 5-7% slower). This times
both through the library's own path (flashattn_cu.testing.fwd_causal_schedule), the library's
choice ("auto") and SDPA cuDNN, on bench.py's shapes (16k tokens: batch = 16384 // seqlen, hidden
2048: nheads = 2048 // d), causal, each call between CUDA events after the L2 is emptied:
"memset" writes a 256 MB buffer as triton's do_bench does (leaving dirty lines the timed call's
reads evict), "read" reads it (clean lines, as a model's preceding GEMMs leave), "none" times
calls back to back. Each round times every variant `--reps` times (after a warmup) and takes the
median; the result is the median of the rounds' medians, variants interleaved round by round.
Outputs are checked: the two schedules bitwise equal, each within 2e-2 of cuDNN's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

REPO_ROOT = Path(__file__).resolve().parents[1]
if list((REPO_ROOT / "flashattn_cu").glob("_C*.so")) and str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # an in-place build (scripts/device_run.sh's)
from flashattn_cu import flash_attn_func  # noqa: E402
from flashattn_cu.testing import fwd_causal_schedule, fwd_dynamic_tiles  # noqa: E402

from bench_timing import flushed_median_ms, geo_summary  # noqa: E402

DEFAULT_SHAPES = ("64:1024,64:2048,64:4096,64:6144,64:8192,64:12288,64:16384,"
                  "128:1024,128:2048,128:4096,128:8192,128:12288,128:16384,"
                  "256:512,256:1024,256:2048,256:4096,256:6144,256:8192")
VARIANTS = ("auto", "persistent", "per_tile", "dynamic", "cuDNN")


def make_fn(variant, q, k, v):
    if variant == "cuDNN":
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def run():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).transpose(1, 2)
        return run

    # per_tile: one CTA per tile handed out by the hardware (the dynamic scheduler off);
    # dynamic: the same tiles in the same order taken from a counter by a CTA per SM, on the
    # kernels whose producer hands out the tiles (sm90/fwd_work.h fwd_published_tiles; elsewhere
    # it is per_tile again).
    schedule = "per_tile" if variant == "dynamic" else variant

    def run():
        with fwd_causal_schedule(schedule), fwd_dynamic_tiles(variant != "per_tile"):
            return flash_attn_func(q, k, v, causal=True)
    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="d:seqlen,... (causal)")
    ap.add_argument("--flush", default="memset,read", help="memset, read and/or none")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--out", default=None, help="also write the table here (markdown)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_schedule: no CUDA device")
        return 1
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    shapes = [tuple(int(x) for x in item.split(":")) for item in args.shapes.split(",")]
    flushes = args.flush.split(",")
    for f in flushes:
        if f not in ("memset", "read", "none"):
            ap.error(f"--flush: 'memset', 'read' or 'none', got '{f}'")
    lines = [f"# Causal schedules, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
             f"{args.dtype}", "",
             f"Median of {args.rounds} rounds of the median of {args.reps} calls; TFLOP/s "
             "(2 b h s^2 d for causal). 'pers/tile' = time persistent / time one CTA per tile "
             "(< 1: the persistent grid faster); 'dyn/best' = time of the dynamic scheduler (one "
             "CTA per SM taking the per-tile order's tiles from a counter) / the faster of the "
             "two static ones; 'auto/cuDNN' = TFLOP/s ratio of the library's choice to cuDNN.", "",
             "| flush | d | seqlen | auto | persistent | per tile | dynamic | cuDNN | pers/tile | "
             "dyn/best | auto/cuDNN | check |", "|" + "---|" * 12]
    print("\n".join(lines), flush=True)
    geo = {f: [] for f in flushes}
    geo_dyn = {f: [] for f in flushes}
    for d, s in shapes:
        b, h = 16384 // s, 2048 // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3))
        fns = {name: make_fn(name, q, k, v) for name in VARIANTS}
        outs = {name: fn() for name, fn in fns.items()}
        same = (torch.equal(outs["persistent"], outs["per_tile"]) and
                torch.equal(outs["dynamic"], outs["per_tile"]))
        worst = max((outs[n].float() - outs["cuDNN"].float()).abs().max().item()
                    for n in ("auto", "persistent", "per_tile", "dynamic"))
        check = ("ok" if same and worst < 2e-2 else
                 f"{'schedules differ ' if not same else ''}max|diff| {worst:.1e}")
        del outs
        flops = 2.0 * b * h * s * s * d
        for flush in flushes:
            per_round = {name: [] for name in VARIANTS}
            for _ in range(args.rounds):
                for name, fn in fns.items():
                    per_round[name].append(flushed_median_ms(fn, flush, args.reps, args.warmup))
            ms = {name: statistics.median(vals) for name, vals in per_round.items()}
            tf = {name: flops / t * 1e-9 for name, t in ms.items()}
            ratio = ms["persistent"] / ms["per_tile"]
            dyn = ms["dynamic"] / min(ms["persistent"], ms["per_tile"])
            geo[flush].append(ratio)
            geo_dyn[flush].append(dyn)
            lines.append(f"| {flush} | {d} | {s} | {tf['auto']:.0f} | {tf['persistent']:.0f} | "
                         f"{tf['per_tile']:.0f} | {tf['dynamic']:.0f} | {tf['cuDNN']:.0f} | "
                         f"{ratio:.3f} | {dyn:.3f} | {tf['auto'] / tf['cuDNN']:.2f} | {check} |")
            print(lines[-1], flush=True)
        del q, k, v, fns
    for flush, vals in geo.items():
        if vals:
            lines += ["", geo_summary(f"{flush}: time persistent / per tile", vals)]
            print(lines[-1], flush=True)
            lines += ["", geo_summary(f"{flush}: time dynamic / the faster static", geo_dyn[flush])]
            print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
