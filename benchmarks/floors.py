#!/usr/bin/env python3
"""Print the two floors (arithmetic and memory) for the benchmark shapes as markdown.

    python benchmarks/floors.py                      # H200 figures from shared/ANCHORS.md
    python benchmarks/floors.py --matmul 682 --bandwidth 4.3 --dims 128

Arithmetic floor = FLOPs / rate. FLOPs as flash_attn counts them: forward 4*b*h*sq*sk*d (halved when
causal), backward 2.5x forward. Two rates: the measured bf16 matmul rate (what a wgmma kernel can
approach) and a fraction of it for the mma.sync (sm80-style) path, which cannot issue Hopper's
warpgroup MMAs and in practice tops out near two thirds of the wgmma rate.

Memory floor = the fewest bytes that must cross HBM / measured copy bandwidth:
  forward   read q, k, v; write o (and the fp32 LSE)
  backward  read q, k, v, o, do, LSE; write dq, dk, dv (dq accumulated in fp32 would add more)
"""
from __future__ import annotations

import argparse

TOKENS = 16384
HIDDEN = 2048


def shape_floors(d, seqlen, causal, matmul_tflops, mma_sync_fraction, bandwidth_tbps, elem_bytes=2):
    batch, nheads = TOKENS // seqlen, HIDDEN // d
    fwd_flops = 4.0 * batch * nheads * seqlen * seqlen * d / (2 if causal else 1)
    bwd_flops = 2.5 * fwd_flops
    tensor = batch * seqlen * nheads * d * elem_bytes  # one of q, k, v, o, ...
    lse = batch * nheads * seqlen * 4
    fwd_bytes = 4 * tensor + lse
    bwd_bytes = 8 * tensor + lse
    rate = matmul_tflops * 1e12
    return {
        "batch": batch,
        "nheads": nheads,
        "fwd_gflop": fwd_flops / 1e9,
        "fwd_us_wgmma": fwd_flops / rate * 1e6,
        "fwd_us_mma": fwd_flops / (rate * mma_sync_fraction) * 1e6,
        "fwd_us_mem": fwd_bytes / (bandwidth_tbps * 1e12) * 1e6,
        "bwd_us_wgmma": bwd_flops / rate * 1e6,
        "bwd_us_mma": bwd_flops / (rate * mma_sync_fraction) * 1e6,
        "bwd_us_mem": bwd_bytes / (bandwidth_tbps * 1e12) * 1e6,
        "intensity": fwd_flops / fwd_bytes,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--matmul", type=float, default=790.0, help="measured bf16 matmul TFLOP/s")
    p.add_argument("--mma-sync-fraction", type=float, default=2 / 3,
                   help="share of the matmul rate an mma.sync kernel can reach")
    p.add_argument("--bandwidth", type=float, default=4.3, help="measured copy bandwidth, TB/s")
    p.add_argument("--dims", default="64,128,256")
    p.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    args = p.parse_args()
    dims = [int(x) for x in args.dims.split(",")]
    seqlens = [int(x) for x in args.seqlens.split(",")]
    mma = args.matmul * args.mma_sync_fraction
    print(f"Rates: matmul {args.matmul:.0f} TFLOP/s (wgmma path), mma.sync path {mma:.0f} TFLOP/s "
          f"({args.mma_sync_fraction:.2f} of it), copy {args.bandwidth} TB/s; ridge point "
          f"{args.matmul / args.bandwidth:.0f} FLOP/byte.")
    print()
    print("| d | seqlen | causal | b x h | fwd GFLOP | FLOP/byte | fwd floor us: wgmma / mma.sync / memory "
          "| bwd floor us: wgmma / mma.sync / memory |")
    print("|---|---|---|---|---|---|---|---|")
    for d in dims:
        for s in seqlens:
            for causal in (False, True):
                f = shape_floors(d, s, causal, args.matmul, args.mma_sync_fraction, args.bandwidth)
                print(f"| {d} | {s} | {int(causal)} | {f['batch']} x {f['nheads']} | {f['fwd_gflop']:.0f} | "
                      f"{f['intensity']:.0f} | {f['fwd_us_wgmma']:.0f} / {f['fwd_us_mma']:.0f} / {f['fwd_us_mem']:.0f} | "
                      f"{f['bwd_us_wgmma']:.0f} / {f['bwd_us_mma']:.0f} / {f['bwd_us_mem']:.0f} |")


if __name__ == "__main__":
    main()
