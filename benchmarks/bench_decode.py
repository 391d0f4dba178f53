#!/usr/bin/env python3
"""Decode benchmark of issue 10 (item 6): flash_attn_with_kvcache against SDPA and the copy rate.

    python benchmarks/bench_decode.py --out benchmarks/results/decode_h200.md

bf16, 32 query heads over 8 kv heads, one new query per sequence (seqlen_q 1; --seqlen-q 4 or 8
for speculative decoding), batch 1 / 8 / 64, d 64 and 128, 4k to 128k cached keys; contiguous
and paged caches (page sizes 16 and 256). GB/s counts the K and V bytes of the cache read once
(2 x batch x keys x 8 x d x 2), the bytes of benchmarks/NOTES.md section 12; the device-to-device
copy rate is measured in the same run (a 2 GiB tensor copy, counted as read + write). SDPA runs
the same attention on (batch, heads, 1, keys) views with enable_gqa (flash and cuDNN backends,
skipped where the backend refuses the shape). Medians of triton.testing.do_bench over replays of
a CUDA graph holding one call (each backend's), as a serving loop runs its decode step: a direct
call of a small shape waits on the host (the Python wrapper and the dispatcher, 30-50 us a call
on the H200 machine, more than the kernels of batch 1 at 4k keys: benchmarks/decode_overhead.py
measures both); --direct times direct calls instead.

The L2 is emptied before each timed call. `--l2-flush memset` is do_bench's own (it zeroes a
256 MB buffer, which leaves ~50 MB of dirty lines in the L2 that the timed call's first reads
write back to memory: ~7 us of every call, measured on the H200 with the decode kernel's per-CTA
timeline, benchmarks/NOTES.md 13.16); `--l2-flush read` (the default) reads the buffer instead,
leaving clean lines, as a decode step finds the L2 after the projections that read their weights;
then each call is timed between CUDA events after its flush and the median kept. Every backend is
timed the same way in the same run.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[1]
if list((REPO_ROOT / "flashattn_cu").glob("_C*.so")) and str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from flashattn_cu import flash_attn_with_kvcache  # noqa: E402

from bench_timing import flushed_median_ms  # noqa: E402

from triton.testing import do_bench  # noqa: E402

HEADS, HEADS_K, DTYPE = 32, 8, torch.bfloat16


def copy_rate_gbs():
    src = torch.empty(2 ** 30, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src))
    return 2 * src.numel() * 2 / (ms * 1e-3) / 1e9


def graph_of(fn):
    """A CUDA graph capturing one call of fn (warmed up on a side stream first, as torch asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


_FLUSH = {"mode": "read"}


def time_ms(fn, direct):
    """Median ms of fn: of direct calls, or of replays of a CUDA graph capturing one call."""
    fn()  # the first call of a configuration (launch attributes, plans) outside timing
    torch.cuda.synchronize()
    timed = fn if direct else graph_of(fn).replay
    return flushed_median_ms(timed, "read") if _FLUSH["mode"] == "read" else do_bench(timed)


def sdpa_ms(backend, q, k, v, direct):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def fn():
        with sdpa_kernel(which):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

    try:
        return time_ms(fn, direct)
    except RuntimeError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--seqlen-q", type=int, default=1)
    ap.add_argument("--append", action="store_true",
                    help="each call also appends seqlen_q new rows (k, v) with rotary, as a "
                         "serving loop does (the cache lengths stay fixed between calls, so "
                         "every call overwrites the same rows); SDPA reads the same cache")
    ap.add_argument("--direct", action="store_true",
                    help="time direct calls (host overhead included where it is longer than the "
                         "kernels) instead of CUDA-graph replays")
    ap.add_argument("--l2-flush", choices=("read", "memset"), default="read",
                    help="how the L2 is emptied before each timed call: read a 256 MB buffer "
                         "(clean lines; the default) or do_bench's memset of one (dirty lines "
                         "the timed call writes back)")
    args = ap.parse_args()
    _FLUSH["mode"] = args.l2_flush
    copy = copy_rate_gbs()
    mode = ", with append + rotary" if args.append else ""
    timing = ("direct calls" if args.direct else "CUDA-graph replays") + (
        ", L2 emptied by a read" if args.l2_flush == "read" else ", L2 emptied by a memset")
    lines = [f"# Decode{mode}, {torch.cuda.get_device_name()}, seqlen_q {args.seqlen_q}, bf16, "
             f"{HEADS}/{HEADS_K} heads; GB/s of K + V ({timing}); copy rate {copy:.0f} GB/s", "",
             "| d | batch | keys | cache | ours GB/s | % copy | SDPA flash | SDPA cuDNN |",
             "|---|---|---|---|---|---|---|---|"]
    for d in (64, 128):
        for batch in (1, 8, 64):
            for keys in (4096, 32768, 131072):
                kv_bytes = 2 * batch * keys * HEADS_K * d * 2
                if 2 * kv_bytes > 40 * 2 ** 30:
                    continue
                q = torch.randn(batch, args.seqlen_q, HEADS, d, device="cuda", dtype=DTYPE)
                k = torch.randn(batch, keys, HEADS_K, d, device="cuda", dtype=DTYPE)
                v = torch.randn_like(k)
                # With --append the call attends to keys - seqlen_q cached rows plus its own.
                new = args.seqlen_q if args.append else 0
                seqlens = torch.full((batch,), keys - new, dtype=torch.int32, device="cuda")
                extra = {}
                if args.append:
                    kn = torch.randn(batch, new, HEADS_K, d, device="cuda", dtype=DTYPE)
                    cos = torch.rand(keys, d // 2, device="cuda", dtype=DTYPE)
                    extra = dict(k=kn, v=torch.randn_like(kn), rotary_cos=cos,
                                 rotary_sin=torch.rand_like(cos))
                sdpa = {b: sdpa_ms(b, q, k, v, args.direct) for b in ("flash", "cudnn")}
                for page in (None, 16, 256):
                    if page is None:
                        kc, vc, table = k, v, None
                    else:
                        kc = k.view(batch * keys // page, page, HEADS_K, d)
                        vc = v.view(batch * keys // page, page, HEADS_K, d)
                        table = torch.randperm(kc.shape[0], device="cuda",
                                               dtype=torch.int32).view(batch, -1)

                    def ours():
                        return flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens,
                                                       block_table=table, causal=True, **extra)

                    ms = time_ms(ours, args.direct)
                    gbs = kv_bytes / (ms * 1e-3) / 1e9
                    ref = " | ".join(f"{kv_bytes / (sdpa[b] * 1e-3) / 1e9:.0f}"
                                     if sdpa[b] else "-" for b in ("flash", "cudnn"))
                    lines.append(f"| {d} | {batch} | {keys // 1024}k | "
                                 f"{'contiguous' if page is None else f'paged {page}'} | "
                                 f"{gbs:.0f} | {100 * gbs / copy:.0f}% | {ref} |")
                    print(lines[-1], flush=True)
                del q, k, v
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
