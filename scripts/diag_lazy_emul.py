"""The forward's error with the running max and with the lazy reference, emulated in PyTorch on
the CPU (no build, no GPU): key block by key block as the kernels walk them (from the row's last
block), P in fp32 rounded to bf16 / fp16 for P V, O and l in fp32, the output rounded. Against
float64, three ways of one row reference:

  running   the running max (a block that raises the max rescales O and l);
  lazy      the lazy reference (sm90/fwd_traits.h kLazyRescale = 8: it moves only where a block
            passes it by more than 2^8 in P), O / l with l of the fp32 P;
  lazy+sums the same with O's l the sums of the 16-bit P that P V used (kLazySums).

Two inputs: unit-spread logits scaled by --qscales (peakier rows as it grows), and rows whose
weight one key holds past the first block (tests/test_numerics.py one_key_inputs' shape).
Prints the largest and the mean error of each, and their ratio to the running max's.

    python3 scripts/diag_lazy_emul.py [--dim 128] [--keys 4096] [--block 176]
"""
import argparse
import math

import torch


def rounded(x, dtype):
    return x.to(dtype).to(torch.float32)


def forward(q, k, v, block, mode, dtype, lazy_log2=8.0):
    """One head's rows (q: rows x d, k / v: keys x d, float32 holding 16-bit values)."""
    c = q.shape[1] ** -0.5 * math.log2(math.e)  # scores -> log2 units
    rows = q.shape[0]
    m = torch.full((rows,), -math.inf)
    l = torch.zeros(rows)
    used = torch.zeros(rows)
    o = torch.zeros(rows, q.shape[1])
    starts = list(range(0, k.shape[0], block))[::-1]  # the walk starts at the last block
    for j0 in starts:
        s = q @ k[j0:j0 + block].T
        bmax = s.max(1).values
        if mode == "running":
            m_new = torch.maximum(m, bmax)
        else:
            m_new = torch.where((bmax - m) * c > lazy_log2, bmax, m)
        m_new = torch.where(torch.isinf(m), bmax, m_new)
        f = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp2((m - m_new) * c))
        p = torch.exp2(s * c - (m_new * c)[:, None])
        p16 = rounded(p, dtype)
        l = l * f + p.sum(1)
        used = used * f + p16.sum(1)
        o = o * f[:, None] + p16 @ v[j0:j0 + block]
        m = m_new
    return rounded(o / (used if mode == "lazy+sums" else l)[:, None], dtype)


def reference(q, k, v):
    s = (q.double() @ k.double().T) * q.shape[1] ** -0.5
    return s.softmax(1) @ v.double()


def report(name, cases, dtype, block):
    errs = {mode: [] for mode in ("running", "lazy", "lazy+sums")}
    for q, k, v in cases:
        ref = reference(q, k, v)
        for mode in errs:
            errs[mode].append((forward(q, k, v, block, mode, dtype).double() - ref).abs())
    base = torch.cat(errs["running"])
    line = f"{name}:"
    for mode, e in errs.items():
        e = torch.cat(e)
        line += (f"  {mode} max {e.max():.3e} ({e.max() / base.max():.2f}x) mean {e.mean():.3e}"
                 f" ({e.mean() / base.mean():.2f}x)")
    print(line, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--keys", type=int, default=4096)
    ap.add_argument("--block", type=int, default=176, help="keys a block (d 128's long tile)")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--qscales", default="1,2.5,4,6")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    args = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    torch.manual_seed(0)
    d, n = args.dim, args.keys
    for qs in (float(x) for x in args.qscales.split(",")):
        cases = [(rounded(torch.randn(args.rows, d) * qs, dtype), rounded(torch.randn(n, d), dtype),
                  rounded(torch.randn(n, d), dtype)) for _ in range(args.heads)]
        report(f"unit logits x{qs:g}", cases, dtype, args.block)
    # One key holds each row: logits 0 at the last key (the walk's first block), delta at key 0
    # (its last), -30 elsewhere; delta 3.0-5.3 nats, under the lazy bound of 8 log2.
    cases = []
    for h in range(16):
        delta = 3.0 + 2.3 * h / 15
        logits = torch.full((n,), -30.0)
        logits[-1], logits[0] = 0.0, delta
        q = torch.zeros(4, d)
        q[:, 0] = 8.0
        k = torch.zeros(n, d)
        k[:, 0] = logits * d ** 0.5 / 8.0
        cases.append((rounded(q, dtype), rounded(k, dtype), rounded(torch.randn(n, d), dtype)))
    report("one key past the first block", cases, dtype, args.block)


if __name__ == "__main__":
    main()
