#!/usr/bin/env python3
"""Forward + backward attention at long context: flashattn_cu against naive PyTorch attention.

    python examples/long_context.py                       # seqlen 32768 and 65536
    python examples/long_context.py --seqlens 131072 --no-naive

Batch 1, 16 heads, head dim 128, bf16, causal. For each length the script reports, for
flashattn_cu: forward and backward time (median of --reps runs, CUDA events), TFLOP/s (flash_attn's
FLOP count: forward 4*b*h*s*s*d / 2 when causal, backward 2.5x), the peak memory beyond the inputs
during forward + backward, and the output's max error against an fp32 SDPA reference next to SDPA
flash's own error. Naive attention (matmul, fp32 softmax, matmul) is attempted at the same sizes;
it needs the (heads x s x s) score matrices, so it runs out of memory: the table gives where it
failed and the bytes its forward alone would need.

Exit status: 0 when flashattn_cu ran at every length and its output passed the check; 1 otherwise.
"""
from __future__ import annotations

import argparse
import gc
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[1]


def import_flash_attn_func():
    if list((REPO_ROOT / "flashattn_cu").glob("_C*.so")) and str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))  # the checkout's build, when it has one
    from flashattn_cu import flash_attn_func
    return flash_attn_func


def naive_attention(q, k, v, causal):
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    scores = torch.matmul(qt, kt.transpose(-2, -1)).mul_(q.shape[-1] ** -0.5)
    if causal:
        s_q, s_k = q.shape[1], k.shape[1]
        mask = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).triu(s_k - s_q + 1)
        scores = scores.masked_fill_(mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, vt).transpose(1, 2)


def sdpa(q, k, v, causal, backends):
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel(backends):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
    return out.transpose(1, 2)


def mib(nbytes) -> str:
    return f"{nbytes / 2**20:,.0f}"


def run_one(fn, q, k, v, dout, reps):
    """Peak extra memory of one forward+backward, then median forward and backward times."""
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    stage, status = "forward", "ok"
    try:
        out = fn(*leaves)
        torch.cuda.synchronize()
        stage = "backward"
        try:
            out.backward(dout)
            torch.cuda.synchronize()
        except NotImplementedError as exc:  # forward-only builds: still report the forward
            status = f"backward not implemented ({str(exc).splitlines()[0][:80]})"
    except torch.cuda.OutOfMemoryError as exc:
        peak = torch.cuda.max_memory_allocated() - base
        msg = str(exc).splitlines()[0][:120]
        return {"status": f"OOM in {stage} after {mib(peak)} MiB", "peak": peak, "oom": msg}
    peak = torch.cuda.max_memory_allocated() - base
    with_bwd = status == "ok"
    fwd_ms, bwd_ms = [], []
    for _ in range(reps):
        for t in leaves:
            t.grad = None
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        e0.record()
        out = fn(*leaves)
        e1.record()
        if with_bwd:
            out.backward(dout)
        e2.record()
        torch.cuda.synchronize()
        fwd_ms.append(e0.elapsed_time(e1))
        bwd_ms.append(e1.elapsed_time(e2))
    return {"status": status, "peak": peak, "fwd_ms": sorted(fwd_ms)[reps // 2],
            "bwd_ms": sorted(bwd_ms)[reps // 2] if with_bwd else None, "out": out.detach()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seqlens", default="32768,65536")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--no-causal", action="store_true")
    p.add_argument("--reps", type=int, default=3, help="timed runs per length (after one untimed)")
    p.add_argument("--no-naive", action="store_true", help="skip the naive attempt")
    p.add_argument("--no-check", action="store_true", help="skip the fp32 reference check")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    causal = not args.no_causal
    seqlens = [int(s) for s in args.seqlens.split(",") if s]

    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU")
        return 1
    try:
        flash_attn_func = import_flash_attn_func()
    except Exception as exc:
        print(f"error: cannot import flashattn_cu: {type(exc).__name__}: {exc}")
        return 1
    from torch.nn.attention import SDPBackend

    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, {props.total_memory / 2**30:.0f} GiB; torch {torch.__version__}; batch {args.batch}, "
          f"{args.heads} heads, d {args.dim}, bf16, causal={causal}")

    def ours(q, k, v):
        return flash_attn_func(q, k, v, causal=causal)

    def naive(q, k, v):
        return naive_attention(q, k, v, causal)

    # load the module and pick kernels outside the measurements
    small = torch.randn(1, 256, args.heads, args.dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    try:
        ours(small, small, small).sum().backward()
    except Exception as exc:
        print(f"warm-up raised {type(exc).__name__}: {exc}")
    del small

    rows, failed = [], False
    for seqlen in seqlens:
        gen = torch.Generator(device="cuda").manual_seed(args.seed + seqlen)
        shape = (args.batch, seqlen, args.heads, args.dim)
        q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
        flops_fwd = 4.0 * args.batch * args.heads * seqlen * seqlen * args.dim / (2 if causal else 1)
        score_elems = args.batch * args.heads * seqlen * seqlen
        # naive's forward keeps bf16 scores (2 B), fp32 probabilities (4 B) and bf16 probabilities (2 B)
        naive_need = 8 * score_elems

        try:
            r = run_one(ours, q, k, v, dout, max(1, args.reps))
        except Exception as exc:
            r = {"status": f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:100]}", "peak": None}
        check = "-"
        if "out" in r and not args.no_check:
            try:
                with torch.no_grad():
                    ref = sdpa(q.float(), k.float(), v.float(), causal,
                               [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
                    pt = sdpa(q, k, v, causal, [SDPBackend.FLASH_ATTENTION])
                    err = (r["out"].float() - ref).abs().max().item()
                    err_pt = (pt.float() - ref).abs().max().item()
                ok = math.isfinite(err) and err <= 2 * err_pt + 1e-5
                check = f"{err:.1e} (FA2 {err_pt:.1e}) {'ok' if ok else 'OFF'}"
                failed |= not ok
                del ref, pt
            except Exception as exc:  # the reference itself failed: say so, it is not flashattn_cu's fault
                check = f"not checked ({type(exc).__name__})"
            gc.collect()
            torch.cuda.empty_cache()
        if r["status"] != "ok":  # a missing backward counts as a failure too: this example is fwd+bwd
            failed = True
        rows.append({"impl": "flashattn_cu", "seqlen": seqlen, **r, "check": check,
                     "fwd_tflops": flops_fwd / (r["fwd_ms"] * 1e-3) / 1e12 if r.get("fwd_ms") else None,
                     "bwd_tflops": 2.5 * flops_fwd / (r["bwd_ms"] * 1e-3) / 1e12 if r.get("bwd_ms") else None})
        r.pop("out", None)
        print(f"flashattn_cu s={seqlen}: {r['status']}, peak extra "
              f"{mib(r['peak']) if r.get('peak') is not None else '-'} MiB, check {check}")

        if not args.no_naive:
            try:
                n = run_one(naive, q, k, v, dout, 1)
            except Exception as exc:
                n = {"status": f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:100]}", "peak": None}
            n.pop("out", None)
            n["status"] += f"; forward alone needs >= {naive_need / 2**30:,.1f} GiB for the score matrices"
            rows.append({"impl": "naive", "seqlen": seqlen, **n, "check": "-",
                         "fwd_tflops": flops_fwd / (n["fwd_ms"] * 1e-3) / 1e12 if n.get("fwd_ms") else None,
                         "bwd_tflops": 2.5 * flops_fwd / (n["bwd_ms"] * 1e-3) / 1e12 if n.get("bwd_ms") else None})
            print(f"naive        s={seqlen}: {n['status']}")
        del q, k, v, dout
        gc.collect()
        torch.cuda.empty_cache()

    print()
    head = ("impl", "seqlen", "fwd ms", "bwd ms", "fwd TFLOP/s", "bwd TFLOP/s", "peak extra MiB", "max err (fp32 ref)", "status")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        def f(key, digits):
            return "-" if row.get(key) is None else f"{row[key]:.{digits}f}"
        print(f"| {row['impl']} | {row['seqlen']} | {f('fwd_ms', 1)} | {f('bwd_ms', 1)} | {f('fwd_tflops', 0)} | "
              f"{f('bwd_tflops', 0)} | {mib(row['peak']) if row.get('peak') is not None else '-'} | {row['check']} | "
              f"{row['status']} |")
    ours_rows = [r for r in rows if r["impl"] == "flashattn_cu"]
    def brief(r):
        text = f"s={r['seqlen']} {r['status']}"
        if r.get("fwd_ms") is not None:
            text += f" fwd {r['fwd_ms']:.1f} ms"
        if r.get("bwd_ms") is not None:
            text += f" bwd {r['bwd_ms']:.1f} ms"
        if r.get("peak") is not None:
            text += f" peak {mib(r['peak'])} MiB"
        return text

    text = "; ".join(brief(r) for r in ours_rows)
    print(f"RESULT long_context: {text}: {'FAIL' if failed else 'ok'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
