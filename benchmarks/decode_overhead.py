"""Where a small decode call's time goes (H200 diagnostics, benchmarks/NOTES.md 13.6): for
flash_attn_with_kvcache and SDPA's cuDNN backend on the same shapes (bf16, 32/8 heads, one query,
contiguous cache), the host time of one call (enqueued back to back, no sync), the device time
of a direct call (triton's do_bench: L2 flushed, CUDA events around the call) and of the same
call replayed from a CUDA graph (no host work between its kernels). A direct call slower than its
graph replay waits on the host; both slower than the KV bytes at the copy rate is the kernels'.

    python3 benchmarks/decode_overhead.py [--out FILE]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_decode import graph_of  # noqa: E402  (benchmarks/, this script's folder)
from flashattn_cu import flash_attn_with_kvcache  # noqa: E402
from triton.testing import do_bench  # noqa: E402

HEADS, HEADS_K, DTYPE = 32, 8, torch.bfloat16


def host_us(fn, n=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    lines = [f"# Decode call overhead, {torch.cuda.get_device_name()}, bf16, {HEADS}/{HEADS_K} "
             "heads, seqlen_q 1, contiguous cache; microseconds", "",
             "| d | batch | keys | KV MB | ours host | ours direct | ours graph | "
             "cuDNN host | cuDNN direct | cuDNN graph |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for d in (64, 128):
        for batch, keys in ((1, 4096), (1, 32768), (8, 4096), (8, 32768)):
            q = torch.randn(batch, 1, HEADS, d, device="cuda", dtype=DTYPE)
            k = torch.randn(batch, keys, HEADS_K, d, device="cuda", dtype=DTYPE)
            v = torch.randn_like(k)
            seqlens = torch.full((batch,), keys, dtype=torch.int32, device="cuda")

            def ours():
                return flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=True)

            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

            row = []
            for fn in (ours, cudnn):
                try:
                    h = host_us(fn)
                    direct = do_bench(fn) * 1e3
                    g = graph_of(fn)
                    replay = do_bench(g.replay) * 1e3
                    row += [f"{h:.1f}", f"{direct:.1f}", f"{replay:.1f}"]
                except Exception as e:  # the backend refuses the shape
                    print(f"{fn.__name__} d {d} batch {batch} keys {keys}: {e!r}"[:300])
                    row += ["-", "-", "-"]
            mb = 2 * batch * keys * HEADS_K * d * 2 / 1e6
            lines.append(f"| {d} | {batch} | {keys // 1024}k | {mb:.0f} | " + " | ".join(row) + " |")
            print(lines[-1], flush=True)
            del q, k, v
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
