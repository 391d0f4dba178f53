"""The forward's error against a float32 reference, per kernel path, beside cuDNN's.

Smaller shapes than bench_fa4.py (batch = max(1, 4096 // seqlen), nheads = 512 // d, unit normal):
max and mean |out - ref| for the library's auto path (the sm_90a forward on Hopper), the mma.sync
path forced (flashattn_cu.testing.kernel_path("sm80"): the running max) and SDPA's cuDNN backend,
each path's ratio to cuDNN's and auto's to sm80's, and a SUMMARY of the last over the shapes. A
diagnosis, not a test (benchmarks/NOTES.md 12.91): run on the device,
`python3 scripts/diag_fwd_error.py [--qscales 1,4] [--dtype fp16]`.
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn_cu
from flashattn_cu.testing import attention_ref, kernel_path


def span(values):
    values = list(values)
    return f"{min(values):.3f}..{max(values):.3f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqlens", default="1024,4096")
    ap.add_argument("--qscales", default="1",
                    help="q multiplied by each (logits' spread: peakier rows as it grows)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    args = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    torch.manual_seed(0)
    ratios = []  # (auto / sm80 largest, auto / sm80 mean) per shape
    shapes = [(float(a), int(d), int(s)) for a in args.qscales.split(",")
              for d in args.dims.split(",") for s in args.seqlens.split(",")]
    for qs, d, s in shapes:
        for causal in (False, True):
            b, h = max(1, 4096 // s), 2048 // d // 4
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3))
            q = (q.float() * qs).to(q.dtype)
            ref = attention_ref(q, k, v, causal=causal)[0]  # float32

            def err(out):
                return (out.float() - ref).abs()

            errs = {"auto": err(flashattn_cu.flash_attn_func(q, k, v, causal=causal))}
            with kernel_path("sm80"):
                errs["sm80"] = err(flashattn_cu.flash_attn_func(q, k, v, causal=causal))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                errs["cudnn"] = err(F.scaled_dot_product_attention(
                    *(t.transpose(1, 2) for t in (q, k, v)), is_causal=causal).transpose(1, 2))
            top = {n: e.max().item() for n, e in errs.items()}
            mean = {n: e.mean().item() for n, e in errs.items()}
            ratios.append((top["auto"] / top["sm80"], mean["auto"] / mean["sm80"]))
            print(f"q x{qs:g} d={d} s={s} causal={int(causal)}: max "
                  + " ".join(f"{n} {x:.3e}" for n, x in top.items())
                  + " | mean " + " ".join(f"{n} {x:.3e}" for n, x in mean.items())
                  + f" | max/cudnn auto {top['auto'] / top['cudnn']:.2f}"
                  f" sm80 {top['sm80'] / top['cudnn']:.2f}"
                  f" | auto/sm80 max {ratios[-1][0]:.2f} mean {ratios[-1][1]:.3f}", flush=True)
    print(f"SUMMARY {args.dtype}: auto / sm80 (the mma.sync path, running max) over {len(ratios)} "
          f"shapes: largest error {span(r[0] for r in ratios)}, "
          f"mean error {span(r[1] for r in ratios)}")


if __name__ == "__main__":
    main()
