#!/usr/bin/env python3
"""Benchmarks of the features of issue 8 (item 10): varlen batches, sliding windows, score modifiers.

    python benchmarks/bench_features.py --out benchmarks/results/features_h200.md

bf16, head dim 128 (--dim), 16 heads; medians of triton.testing.do_bench (CUDA events when triton is
missing); every row takes each time as the median over --rounds interleaved rounds (varlen,
padded, torch's varlen; causal, then each window; plain, then each modifier), so that drift
during the run does not fall on one side of a ratio; times in ms, TFLOP/s with flash_attn's count (causal halves it;
a window counts the score entries it covers).

* varlen: 6 causal sequences of 64 to 4096 tokens, 16k in all (the batch FlashAttention-4's
  Hopper kernels were measured on: varlen 1.54x faster than the same batch padded), through
  flash_attn_varlen_func, against the same batch padded to 4096 (flash_attn_func) and against
  torch.nn.attention.varlen.varlen_attn where this torch has it. Bar: varlen >= 1.5x padded.
* varlen, skewed: a document-masked pretraining pack, 16 contexts of 8192 tokens cut into
  documents of heavy-tailed lengths (one whole 8192-token context, the others ~290 documents
  of 1 to ~5000 tokens, seeded), causal, forward and forward + backward, against torch's
  varlen_attn where this torch has it: many entries under a long max_seqlen, the case where a
  grid of batch x heads x the blocks of max_seqlen is mostly empty CTAs.
* window: window_size (1024, 0) and (4096, 0) at 4k, 8k and 16k tokens (batch = 16k / seqlen)
  against full causal. Bar: (1024, 0) at 16k >= 6x faster than causal (FA4: 6.1x).
* modifiers: softcap 30, ALiBi and both against plain attention at 4k and 16k tokens (batch =
  16k / seqlen), causal and not, d 64 and 128. Bar: softcap and ALiBi within 10% of plain
  (FA4's Hopper kernel: softcap 30 costs it 55%).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if list((REPO_ROOT / "flashattn_cu").glob("_C*.so")) and str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from flashattn_cu import flash_attn_func, flash_attn_varlen_func  # noqa: E402
from flashattn_cu.testing import (bwd_streamed_dq, fwd_dynamic_tiles, fwd_varlen_order,  # noqa: E402
                                  kernel_path)

try:
    from triton.testing import do_bench
except ImportError:  # pragma: no cover
    do_bench = None

HEADS, D, DTYPE = 16, 128, torch.bfloat16
VARLEN_LENGTHS = [4096, 4096, 4096, 2048, 1984, 64]


def time_ms(fn, reps=30):
    if do_bench is not None:
        return do_bench(fn, warmup=20, rep=80)
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


# Rounds of interleaved_ms (main: --rounds).
ROUNDS = 3


def interleaved_ms(fns):
    """Each function's time as the median over ROUNDS rounds, each round timing every function
    once in turn (A B C A B C ...), so that clock and thermal drift during the run fall on all of
    them alike instead of on whichever ran last."""
    times = [[] for _ in fns]
    for _ in range(ROUNDS):
        for i, fn in enumerate(fns):
            times[i].append(time_ms(fn))
    return [statistics.median(t) for t in times]


def fwd_bwd(fn, inputs, dout):
    def run():
        out = fn()
        torch.autograd.grad(out, inputs, dout)
    return run


def covered_entries(sq, sk, causal, window):
    """Score entries a row-wise mask leaves visible (for TFLOP/s)."""
    left, right = window
    if causal:
        right = 0
    total = 0
    for i in range(sq):
        d = i + sk - sq
        lo = 0 if left < 0 else max(0, d - left)
        hi = sk if right < 0 else min(sk, d + right + 1)
        total += max(0, hi - lo)
    return total


def tflops(entries, batch, ms, mode):
    flops = 4 * entries * batch * HEADS * D * (1.0 if mode == "fwd" else 3.5)
    return flops / (ms * 1e-3) / 1e12


def varlen_batch(lengths):
    """cu_seqlens and q, k, v (total, HEADS, D) of a batch of these sequence lengths."""
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device="cuda")
    cu[1:] = torch.tensor(lengths, device="cuda").cumsum(0)
    q, k, v = (torch.randn(sum(lengths), HEADS, D, device="cuda", dtype=DTYPE,
                           requires_grad=True) for _ in range(3))
    return cu, q, k, v


def varlen_calls(q, k, v, cu, longest, mode):
    """(ours, ours on the static schedule, ours in block order, torch's varlen_attn, why not)
    for a causal varlen batch in `mode`: torch's is None where this torch lacks it or refuses
    the shapes, with the reason. The static schedule: the sm90a forward without its dynamic tile
    scheduler (flashattn_cu.testing.fwd_dynamic_tiles(False): one CTA per tile); block order: the
    tiles within an entry block after block (testing.fwd_varlen_order("blocks")); their A/Bs."""
    def wrap(fn):
        return fn if mode == "fwd" else fwd_bwd(fn, (q, k, v), torch.randn_like(q))

    def ours():
        return flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True)

    def ours_static():
        with fwd_dynamic_tiles(False):
            return ours()

    def ours_blocks():
        with fwd_varlen_order("blocks"):
            return ours()
    try:
        from torch.nn.attention.varlen import varlen_attn

        def theirs():
            return varlen_attn(q, k, v, cu, cu, longest, longest, window_size=(-1, 0))
        fn = wrap(theirs)
        fn()  # raises here if this torch refuses the shapes
        torch.cuda.synchronize()
        return wrap(ours), wrap(ours_static), wrap(ours_blocks), fn, None
    except Exception as exc:  # not in this torch, or it refuses the shapes
        return (wrap(ours), wrap(ours_static), wrap(ours_blocks), None,
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}")


def bench_varlen(lines):
    lengths = VARLEN_LENGTHS
    total, longest = sum(lengths), max(lengths)
    cu, q, k, v = varlen_batch(lengths)
    qp, kp, vp = (torch.randn(len(lengths), longest, HEADS, D, device="cuda", dtype=DTYPE,
                              requires_grad=True) for _ in range(3))
    entries = sum(covered_entries(n, n, True, (-1, -1)) for n in lengths)
    rows = []
    for mode in ("fwd", "fwd+bwd"):
        def padded():
            return flash_attn_func(qp, kp, vp, causal=True)
        ours, ours_static, ours_blocks, theirs, torch_error = varlen_calls(q, k, v, cu, longest,
                                                                           mode)
        fns = [ours, padded if mode == "fwd" else
               fwd_bwd(padded, (qp, kp, vp), torch.randn_like(qp)), ours_static, ours_blocks]
        times = interleaved_ms(fns + ([theirs] if theirs else []))
        t_var, t_pad, t_static, t_blocks = times[:4]
        t_torch = times[4] if len(times) > 4 else None
        rows.append((mode, t_var, t_pad, t_static, t_blocks, t_torch))
        print(f"RESULT varlen {mode}: ours {t_var:.3f} ms ({tflops(entries, 1, t_var, mode):.0f} "
              f"TFLOP/s), padded {t_pad:.3f} ms -> {t_pad / t_var:.2f}x, static schedule "
              f"{t_static:.3f} ms -> {t_static / t_var:.3f}x, block order {t_blocks:.3f} ms -> "
              f"{t_blocks / t_var:.3f}x"
              + (f", torch varlen_attn {t_torch:.3f} ms -> {t_torch / t_var:.2f}x"
                 if t_torch else f", torch varlen_attn n/a ({torch_error})"), flush=True)
    lines += ["## Variable-length batch", "",
              f"6 causal sequences {lengths} ({total} tokens), bf16, d {D}, {HEADS} heads. "
              "'padded' = the same batch padded to the longest sequence through "
              "flash_attn_func (bar: varlen >= 1.5x padded; FlashAttention-4: 1.54x). 'static' = "
              "our varlen call without the sm90a forward's dynamic tile scheduler; 'blocks' = "
              "with the tiles within an entry block after block.", "",
              "| mode | varlen ms | padded ms | padded / varlen | static ms | static / varlen | "
              "blocks ms | blocks / varlen | torch varlen_attn ms | torch / ours |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for mode, t_var, t_pad, t_static, t_blocks, t_torch in rows:
        lines.append(f"| {mode} | {t_var:.3f} | {t_pad:.3f} | {t_pad / t_var:.2f}x | "
                     f"{t_static:.3f} | {t_static / t_var:.3f}x | "
                     f"{t_blocks:.3f} | {t_blocks / t_var:.3f}x | "
                     + (f"{t_torch:.3f} | {t_torch / t_var:.2f}x |" if t_torch else "- | - |"))
    lines.append("")


def skewed_lengths(contexts=16, context=8192, seed=0):
    """Document lengths of a packed pretraining batch: `contexts` rows of `context` tokens, the
    first one a single document, each other cut at geometric-ish document boundaries (lognormal
    lengths, median ~250 tokens, clipped to the row)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [context]
    for _ in range(contexts - 1):
        left = context
        while left > 0:
            n = int(torch.empty(1).log_normal_(5.5, 1.2, generator=gen).item()) + 1
            n = min(n, left)
            lengths.append(n)
            left -= n
    return lengths


def bench_varlen_skewed(lines):
    lengths = skewed_lengths()
    total, longest = sum(lengths), max(lengths)
    cu, q, k, v = varlen_batch(lengths)
    entries = sum(n * (n + 1) // 2 for n in lengths)  # causal: covered_entries(n, n, True, ..)
    rows = []
    for mode in ("fwd", "fwd+bwd"):
        ours, ours_static, ours_blocks, theirs, torch_error = varlen_calls(q, k, v, cu, longest,
                                                                           mode)
        times = interleaved_ms([ours, ours_static, ours_blocks] + ([theirs] if theirs else []))
        t_ours, t_static, t_blocks = times[:3]
        t_torch = times[3] if len(times) > 3 else None
        rows.append((mode, t_ours, t_static, t_blocks, t_torch))
        print(f"RESULT varlen_skewed {mode}: {len(lengths)} entries, ours {t_ours:.3f} ms "
              f"({tflops(entries, 1, t_ours, mode):.0f} TFLOP/s), static schedule "
              f"{t_static:.3f} ms -> {t_static / t_ours:.3f}x, block order {t_blocks:.3f} ms -> "
              f"{t_blocks / t_ours:.3f}x"
              + (f", torch varlen_attn {t_torch:.3f} ms -> {t_torch / t_ours:.2f}x" if t_torch
                 else f", torch varlen_attn n/a ({torch_error})"), flush=True)
    lines += ["## Variable-length batch, skewed (a document-masked pretraining pack)", "",
              f"{len(lengths)} causal documents in 16 contexts of 8192 tokens ({total} tokens, "
              f"the longest {longest}), bf16, d {D}, {HEADS} heads.", "",
              "| mode | ours ms | ours TFLOP/s | static ms | static / ours | blocks ms | "
              "blocks / ours | torch varlen_attn ms | torch / ours |",
              "|---|---|---|---|---|---|---|---|---|"]
    for mode, t_ours, t_static, t_blocks, t_torch in rows:
        lines.append(f"| {mode} | {t_ours:.3f} | {tflops(entries, 1, t_ours, mode):.0f} | "
                     f"{t_static:.3f} | {t_static / t_ours:.3f}x | "
                     f"{t_blocks:.3f} | {t_blocks / t_ours:.3f}x | "
                     + (f"{t_torch:.3f} | {t_torch / t_ours:.2f}x |" if t_torch else "- | - |"))
    lines.append("")


def bench_window(lines, seqlens):
    from flashattn_cu import _C

    # The library's default for the sm90a backward's dQ convert, and the other setting, timed
    # beside it (flashattn_cu.testing.bwd_streamed_dq) for the A/B.
    default_streamed = _C._bwd_streamed_dq()
    other = "dQ after main" if default_streamed else "dQ streamed"
    lines += ["## Sliding window", "",
              f"bf16, d {D}, {HEADS} heads, batch = 16k / seqlen; speedup = causal time / window "
              f"time (bar: (1024, 0) at 16k >= 6x; FlashAttention-4: 6.1x). '{other}': fwd+bwd "
              "with the sm90a backward's dQ converted "
              + ("after its main kernel instead of streamed" if default_streamed else
                 "streamed, block by block as its main kernel's key tiles finish, instead of "
                 "after it")
              + f" (flashattn_cu.testing.bwd_streamed_dq({not default_streamed})), window and "
              "causal alike.", "",
              f"| seqlen | window | mode | ms | TFLOP/s | causal ms | speedup | {other}: ms "
              "| causal ms | speedup |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for s in seqlens:
        batch = max(1, 16384 // s)
        q, k, v = (torch.randn(batch, s, HEADS, D, device="cuda", dtype=DTYPE, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn_like(q)
        for mode in ("fwd", "fwd+bwd"):
            def call(window, switched=False):
                fn = lambda: flash_attn_func(q, k, v, causal=True, window_size=window)  # noqa
                if mode == "fwd":
                    return fn
                run = fwd_bwd(fn, (q, k, v), dout)
                if not switched:
                    return run

                def with_other():
                    with bwd_streamed_dq(not default_streamed):
                        run()
                return with_other
            windows = [w for w in ((1024, 0), (4096, 0)) if w[0] < s]
            calls = [call(w) for w in [(-1, -1)] + windows]
            if mode == "fwd+bwd":
                calls += [call(w, switched=True) for w in [(-1, -1)] + windows]
            times = interleaved_ms(calls)
            t_causal = times[0]
            n = 1 + len(windows)
            for i, window in enumerate(windows):
                t = times[1 + i]
                entries = covered_entries(s, s, True, window)
                after = ""
                if mode == "fwd+bwd":
                    a_causal, a = times[n], times[n + 1 + i]
                    after = f" ({other}: {a:.3f} ms, causal {a_causal:.3f} -> {a_causal / a:.2f}x)"
                    cols = f"{a:.3f} | {a_causal:.3f} | {a_causal / a:.2f}x"
                else:
                    cols = "- | - | -"
                print(f"RESULT window {window} s={s} {mode}: {t:.3f} ms, causal {t_causal:.3f} ms "
                      f"-> {t_causal / t:.2f}x{after}", flush=True)
                lines.append(f"| {s} | {window} | {mode} | {t:.3f} | "
                             f"{tflops(entries, batch, t, mode):.0f} | {t_causal:.3f} | "
                             f"{t_causal / t:.2f}x | {cols} |")
        del q, k, v, dout
        torch.cuda.empty_cache()
    lines.append("")


def bench_modifiers(lines, seqlens, dims):
    lines += ["## Score modifiers", "",
              f"bf16, {HEADS} heads, batch = 16k / seqlen; ratio = plain time / modified time "
              "(1.0 = free; bar: >= 0.9 for softcap and ALiBi).", "",
              "| d | seqlen | causal | mode | plain ms | softcap 30 | ALiBi | both |",
              "|---|---|---|---|---|---|---|---|"]
    for d in dims:
        for s in seqlens:
            batch = max(1, 16384 // s)
            q, k, v = (torch.randn(batch, s, HEADS, d, device="cuda", dtype=DTYPE,
                                   requires_grad=True) for _ in range(3))
            dout = torch.randn_like(q)
            slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / HEADS) for i in range(HEADS)],
                                  device="cuda")
            for causal in (False, True):
                for mode in ("fwd", "fwd+bwd"):
                    def call(**kw):
                        fn = lambda: flash_attn_func(q, k, v, causal=causal, **kw)  # noqa
                        return fn if mode == "fwd" else fwd_bwd(fn, (q, k, v), dout)
                    times = interleaved_ms([call(), call(softcap=30.0), call(alibi_slopes=slopes),
                                            call(softcap=30.0, alibi_slopes=slopes)])
                    t_plain = times[0]
                    ratios = [t_plain / t for t in times[1:]]
                    print(f"RESULT modifiers d={d} s={s} causal={causal} {mode}: plain "
                          f"{t_plain:.3f} ms, softcap {ratios[0]:.3f}, alibi {ratios[1]:.3f}, "
                          f"both {ratios[2]:.3f}", flush=True)
                    lines.append(f"| {d} | {s} | {causal} | {mode} | {t_plain:.3f} | "
                                 + " | ".join(f"{r:.3f}" for r in ratios) + " |")
            del q, k, v, dout
            torch.cuda.empty_cache()
    lines.append("")


def main():
    global ROUNDS, D
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--seqlens", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--skip", nargs="*", default=[],
                   choices=["varlen", "varlen_skewed", "window", "modifiers"])
    p.add_argument("--modifier-seqlens", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--modifier-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--dim", type=int, default=D,
                   help="head dim of the varlen and window rows (modifiers: --modifier-dims)")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds for every ratio (median of each time)")
    p.add_argument("--paths", nargs="+", default=["auto", "sm80"], choices=["auto", "sm80"],
                   help="kernel paths to measure: auto (on sm_90: the wgmma forward and "
                        "backward) and sm80 (the mma.sync kernels, forced); bars hold on each")
    args = p.parse_args()
    ROUNDS = max(1, args.rounds)
    D = args.dim
    lines = [f"# Features benchmark, {torch.cuda.get_device_name()}, torch {torch.__version__}",
             "", f"Times: medians over {ROUNDS} interleaved rounds (each round times every "
             "variant of a row once, in turn).", ""]
    for path in args.paths:
        print(f"RESULT path {path}", flush=True)
        lines += [f"# Kernel path: {path}", ""]
        with kernel_path(path):
            if "varlen" not in args.skip:
                bench_varlen(lines)
            if "varlen_skewed" not in args.skip:
                bench_varlen_skewed(lines)
            if "window" not in args.skip:
                bench_window(lines, args.seqlens)
            if "modifiers" not in args.skip:
                bench_modifiers(lines, args.modifier_seqlens, args.modifier_dims)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
