#!/usr/bin/env python3
"""Quick backward diagnosis on the GPU: per-gradient error against the fp32 reference, next to
PyTorch's own error in the input dtype, for both kernel paths. Prints one line per case.

    python3 scripts/bwd_check.py [--dims 64,128] [--paths auto,sm80]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from flashattn_cu import flash_attn_func  # noqa: E402
from flashattn_cu.testing import attention_ref, kernel_path  # noqa: E402


def case(path, dtype, d, sq, sk, h, hk, causal, deterministic=False):
    g = torch.Generator(device="cuda").manual_seed(sq * 7 + sk + d)
    q, k, v = (torch.randn(2, s, n, d, device="cuda", dtype=dtype, generator=g).requires_grad_()
               for s, n in ((sq, h), (sk, hk), (sk, hk)))
    with kernel_path(path):
        out = flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
        dout = torch.randn_like(out)
        ours = torch.autograd.grad(out, (q, k, v), dout)
    ref, _ = attention_ref(q, k, v, causal=causal)
    pt, _ = attention_ref(q, k, v, causal=causal, upcast=False)
    refs = torch.autograd.grad(ref, (q, k, v), dout.float())
    pts = torch.autograd.grad(pt, (q, k, v), dout)
    parts, ok = [], True
    for name, a, r, p in zip(("dq", "dk", "dv"), ours, refs, pts):
        err = (a.float() - r).abs().max().item()
        err_pt = (p.float() - r).abs().max().item()
        good = err <= 3 * err_pt + 1e-4 and torch.isfinite(a).all().item()
        ok &= good
        parts.append(f"{name} {err:.2e}/{err_pt:.2e}{'' if good else ' BAD'}")
    print(f"{'ok ' if ok else 'BAD'} {path:4s} {str(dtype)[6:]:8s} d={d:3d} sq={sq:5d} sk={sk:5d} "
          f"h={h}/{hk} causal={int(causal)} det={int(deterministic)}: " + ", ".join(parts), flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--paths", default="auto,sm80")
    args = ap.parse_args()
    bad = 0
    for d in [int(x) for x in args.dims.split(",")]:
        for path in args.paths.split(","):
            for dtype in (torch.bfloat16, torch.float16):
                for (sq, sk, h, hk, causal, det) in [(128, 128, 2, 2, False, False),
                                                     (256, 256, 2, 2, True, False),
                                                     (113, 203, 4, 2, False, False),
                                                     (203, 113, 4, 1, True, False),
                                                     (1024, 1024, 4, 4, True, True),
                                                     (1, 239, 2, 2, True, False)]:
                    bad += not case(path, dtype, d, sq, sk, h, hk, causal, det)
    print(f"bwd_check: {bad} bad case(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
