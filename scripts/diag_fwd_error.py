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
from flashattn_cu.testing import kernel_path


def reference(q, k, v, causal):
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    s = qf @ kf.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return (s.softmax(-1) @ vf).transpose(1, 2)


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
    for qs, d in ((float(a), int(x)) for a in args.qscales.split(",") for x in args.dims.split(",")):
        for s in (int(x) for x in args.seqlens.split(",")):
            for causal in (False, True):
                b, h = max(1, 4096 // s), 2048 // d // 4
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3))
                q = (q.float() * qs).to(q.dtype)
                ref = reference(q, k, v, causal)
                errs = {}
                errs["auto"] = (flashattn_cu.flash_attn_func(q, k, v, causal=causal).float() - ref).abs()
                with kernel_path("sm80"):
                    errs["sm80"] = (flashattn_cu.flash_attn_func(q, k, v, causal=causal).float() - ref).abs()
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                                       is_causal=causal).transpose(1, 2)
                errs["cudnn"] = (o.float() - ref).abs()
                c = errs["cudnn"]
                a, m = errs["auto"], errs["sm80"]
                ratios.append((a.max().item() / m.max().item(), a.mean().item() / m.mean().item()))
                print(f"q x{qs:g} d={d} s={s} causal={int(causal)}: max " +
                      " ".join(f"{n} {e.max().item():.3e}" for n, e in errs.items()) +
                      " | mean " + " ".join(f"{n} {e.mean().item():.3e}" for n, e in errs.items()) +
                      f" | max/cudnn auto {errs['auto'].max().item() / c.max().item():.2f}"
                      f" sm80 {errs['sm80'].max().item() / c.max().item():.2f}"
                      f" | auto/sm80 max {ratios[-1][0]:.2f} mean {ratios[-1][1]:.3f}", flush=True)
    print(f"SUMMARY {args.dtype}: auto / sm80 (the mma.sync path, running max) over {len(ratios)} "
          f"shapes: largest error {min(r[0] for r in ratios):.2f}..{max(r[0] for r in ratios):.2f}, "
          f"mean error {min(r[1] for r in ratios):.3f}..{max(r[1] for r in ratios):.3f}")


if __name__ == "__main__":
    main()
