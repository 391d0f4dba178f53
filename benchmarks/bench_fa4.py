#!/usr/bin/env python3
"""Forward (and backward) side by side with FlashAttention-4's Hopper kernels, in one process.

    python benchmarks/bench_fa4.py --out benchmarks/results/fa4_h200.md [--dtypes bf16,fp16]
        [--modes fwd,bwd]

flashattn_cu (default path: the sm90a forward on an H200), SDPA cuDNN, SDPA flash (FA2) and,
where `from flash_attn.cute import flash_attn_func` imports (../shared/tools/fa4_anchor.sh brings
it to the device; never a dependency of the project), FlashAttention-4. flash_attn's benchmark
shapes: 16k tokens (batch = 16384 // seqlen), hidden 2048 (nheads = 2048 // d), d 64/128/256,
seqlen 1k-16k, causal and not. TFLOP/s = 4 b h s^2 d (halved when causal) / the median over
--rounds interleaved rounds (each backend timed once a round, in turn, so a drift of the clocks
or the memory moves every backend alike) of triton.testing.do_bench's median. Each backend's result is checked first: up to --ref-max-seqlen (4096)
against an fp32 reference on the same inputs (math attention in fp32; the backward's gradients
with the same dout), and a backend whose largest error exceeds the test suite's rule (2x cuDNN's
own error for the forward, 3x for the gradients, + 1e-4) is marked '!'; longer rows, where the
fp32 reference does not fit, against cuDNN's result (marked past 2e-2). Prints SUMMARY lines with
geometric means of the ratios ours / cuDNN and ours / FA4, and the largest error ratio of ours to
cuDNN's against the fp32 reference. Mode `bwd` times the backward alone: each backend's forward
once with gradients on, then `torch.autograd.grad` of its output against a fixed dout (graph
retained), TFLOP/s with flash_attn's count (2.5x the forward's); its gradients are checked against
cuDNN's the same way. --clocks (on by default) samples the SM clock and the board power through
NVML while each backend is timed (benchmarks/gpu_clocks.py) and adds a table of their medians per
shape and backend: under a power limit a kernel's time depends on the clock it holds.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

REPO_ROOT = Path(__file__).resolve().parents[1]
if list((REPO_ROOT / "flashattn_cu").glob("_C*.so")) and str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

if str(Path(__file__).resolve().parent) not in sys.path:  # gpu_clocks beside this file
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from flashattn_cu import flash_attn_func  # noqa: E402
from gpu_clocks import ClockSampler  # noqa: E402
from triton.testing import do_bench  # noqa: E402

try:
    from flash_attn.cute import flash_attn_func as fa4_func
except Exception as exc:  # noqa: BLE001 - optional: any import failure means "not here"
    fa4_func, FA4_ERROR = None, f"{type(exc).__name__}: {exc}"
else:
    FA4_ERROR = None


def backends(causal):
    """name -> fn(q, k, v) returning the (batch, seqlen, heads, d) output."""
    def sdpa(backend):
        def run(q, k, v):
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
        return run

    out = {"flashattn_cu": lambda q, k, v: flash_attn_func(q, k, v, causal=causal),
           "cuDNN": sdpa(SDPBackend.CUDNN_ATTENTION),
           "FA2": sdpa(SDPBackend.FLASH_ATTENTION)}
    if fa4_func is not None:
        def fa4(q, k, v):
            res = fa4_func(q, k, v, causal=causal)
            return res[0] if isinstance(res, tuple) else res
        out["FA4"] = fa4
    return out


def reference(causal, q, k, v, dout=None):
    """fp32 math attention on the same inputs: the output, or with dout the concatenated
    gradients (dq, dk, dv) in backward_fns' order."""
    qf, kf, vf = (x.detach().float().requires_grad_(dout is not None) for x in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (qf, kf, vf)),
                                           is_causal=causal).transpose(1, 2)
    if dout is None:
        return o.detach()
    return torch.cat([g.flatten() for g in torch.autograd.grad(o, (qf, kf, vf), dout.float())])


def backward_fns(fns, q, k, v, dout):
    """For each forward fn: a function that runs its backward (the forward taken once, outside)."""
    out = {}
    for name, fn in fns.items():
        qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
        try:
            o = fn(qg, kg, vg)
        except Exception as exc:  # noqa: BLE001
            print(f"{name}: forward with gradients: {type(exc).__name__}: {exc}")
            continue

        def run(o=o, qg=qg, kg=kg, vg=vg):
            return torch.cat([g.flatten() for g in
                              torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True)])
        out[name] = run
    return out


def round_ratios(other_ms, ours_ms):
    """Each interleaved round's own ratio, the other backend's time over ours (> 1: ours
    faster), for the rounds both were timed in; [] if either is missing."""
    if not other_ms or not ours_ms or len(other_ms) != len(ours_ms):
        return []
    return [o / m for o, m in zip(other_ms, ours_ms)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--out", default=None)
    ap.add_argument("--modes", default="fwd", help="fwd and/or bwd")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds (each backend once a round, in turn); median")
    ap.add_argument("--warmup-ms", type=int, default=10, help="do_bench warmup a round")
    ap.add_argument("--rep-ms", type=int, default=40, help="do_bench rep a round")
    ap.add_argument("--ref-max-seqlen", type=int, default=4096,
                    help="longest rows checked against the fp32 reference (else against cuDNN)")
    ap.add_argument("--clocks", action=argparse.BooleanOptionalAction, default=True,
                    help="SM clock and board power (NVML) while each backend is timed")
    args = ap.parse_args()
    sampler = ClockSampler(torch.cuda.current_device()) if args.clocks else None
    if sampler is not None and not sampler.available:
        print(f"clocks: NVML not available ({sampler.error}); no clock table")
    clock_rows = []
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    names = ["flashattn_cu", "cuDNN", "FA2"] + (["FA4"] if fa4_func is not None else [])
    modes = args.modes.split(",")
    lines = [f"# Side by side ({', '.join(modes)}), {torch.cuda.get_device_name()}, torch {torch.__version__}",
             "", f"FA4: {'flash_attn.cute ' + 'imported' if fa4_func else 'not available (' + str(FA4_ERROR) + ')'}",
             "", f"Timing: the median of {args.rounds} interleaved rounds of triton.testing.do_bench "
             f"(warmup {args.warmup_ms} ms, rep {args.rep_ms} ms, L2 flushed before each call).",
             "'ours/FA4 rounds': the smallest and largest of the rounds' own ratios (FA4's time / ours "
             "in the same round), the spread a rerun may move the median ratio by.",
             "", "| mode | dtype | d | seqlen | causal | " + " | ".join(names) +
             " | ours/cuDNN | ours/FA4 | ours/FA4 rounds |",
             "|" + "---|" * (len(names) + 8)]
    ratios = {(m, key): [] for m in modes for key in ("cuDNN", "FA4")}
    err_ratios = {m: [] for m in modes}
    for mode, dname in ((m, dn) for m in modes for dn in args.dtypes.split(",")):
        dtype = dtypes[dname]
        for d in (int(x) for x in args.dims.split(",")):
            for s in (int(x) for x in args.seqlens.split(",")):
                for causal in (False, True):
                    b, h = 16384 // s, 2048 // d
                    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3))
                    fns = {n: (lambda fn=fn: fn(q, k, v)) for n, fn in backends(causal).items()}
                    dout = torch.randn_like(q) if mode == "bwd" else None
                    if mode == "bwd":
                        fns = backward_fns(backends(causal), q, k, v, dout)
                    if s <= args.ref_max_seqlen:
                        ref = reference(causal, q, k, v, dout)
                        rule = 3.0 if mode == "bwd" else 2.0
                        cudnn_err = (fns["cuDNN"]().float() - ref).abs().max().item()
                        limit = rule * cudnn_err + 1e-4
                    else:
                        ref, cudnn_err, limit = fns["cuDNN"]().float(), None, 2e-2
                    flops = 4 * b * h * s * s * d / (2 if causal else 1) * (2.5 if mode == "bwd" else 1)
                    checked = {}
                    for name, fn in fns.items():
                        try:
                            err = (fn().float() - ref).abs().max().item()
                            checked[name] = err > limit
                            if name == "flashattn_cu" and cudnn_err:
                                err_ratios[mode].append(err / cudnn_err)
                                print(f"check {mode} d={d} s={s} causal={int(causal)}: ours "
                                      f"{err:.3e}, cuDNN {cudnn_err:.3e} (fp32 reference)",
                                      flush=True)
                        except Exception as exc:  # noqa: BLE001
                            print(f"{name} d={d} s={s} causal={int(causal)}: {type(exc).__name__}: {exc}")
                    # Interleaved rounds: each round times every backend once, in turn; a
                    # backend's time is the median of its rounds' medians.
                    times = {name: [] for name in checked}
                    if sampler is not None:
                        sampler.reset()
                    for _ in range(args.rounds):
                        for name in list(times):
                            try:
                                with (sampler.tagged(name) if sampler is not None
                                      else contextlib.nullcontext()):
                                    times[name].append(do_bench(fns[name], warmup=args.warmup_ms,
                                                                rep=args.rep_ms,
                                                                return_mode="median"))
                            except Exception as exc:  # noqa: BLE001
                                print(f"{name} d={d} s={s} causal={int(causal)}: timing: "
                                      f"{type(exc).__name__}: {exc}")
                                del times[name]
                    tf = {name: (flops / statistics.median(ms) * 1e-9, checked[name])
                          for name, ms in times.items()}
                    cells = [f"{tf[n][0]:.0f}{'!' if tf[n][1] else ''}" if n in tf else "-" for n in names]
                    ours = tf.get("flashattn_cu", (math.nan, True))[0]
                    rc = ours / tf["cuDNN"][0] if "cuDNN" in tf else math.nan
                    rf = ours / tf["FA4"][0] if "FA4" in tf else math.nan
                    paired = round_ratios(times.get("FA4"), times.get("flashattn_cu"))
                    spread = f"{min(paired):.2f}-{max(paired):.2f}" if paired else "-"
                    ratios[(mode, "cuDNN")].append(rc)
                    if "FA4" in tf:
                        ratios[(mode, "FA4")].append(rf)
                    shape = f"| {mode} | {dname} | {d} | {s} | {int(causal)} | "
                    lines.append(shape + " | ".join(cells) +
                                 f" | {rc:.2f} | {rf:.2f} | {spread} |")
                    print(lines[-1], flush=True)
                    if sampler is not None and sampler.available:
                        got = {n: sampler.summary(n) for n in names}
                        row = shape + " | ".join(
                            f"{got[n][0]:.0f} / {got[n][1]:.0f}" if got[n] else "-"
                            for n in names) + " |"
                        clock_rows.append(row)
                        print("clocks " + row, flush=True)
                    del q, k, v, ref, fns, dout
    for (mode, key), vals in ratios.items():
        vals = [x for x in vals if x == x]
        if vals:
            geo = math.exp(sum(math.log(x) for x in vals) / len(vals))
            summary = (f"SUMMARY {mode} ours/{key}: geo {geo:.3f} [{min(vals):.2f}..{max(vals):.2f}] over "
                       f"{len(vals)} shapes, {sum(x >= 1.0 for x in vals)} at >= 1.0")
            lines += ["", summary]
            print(summary)
    for mode, vals in err_ratios.items():
        if vals:
            summary = (f"SUMMARY {mode} error against fp32, ours / cuDNN's: largest {max(vals):.2f}, "
                       f"median {sorted(vals)[len(vals) // 2]:.2f} over {len(vals)} shapes")
            lines += ["", summary]
            print(summary)
    if clock_rows:
        lines += ["", "SM clock (MHz) / board power (W) while each backend was timed: medians of "
                  "NVML samples every 5 ms over its rounds (benchmarks/gpu_clocks.py).", "",
                  "| mode | dtype | d | seqlen | causal | " + " | ".join(names) + " |",
                  "|" + "---|" * (len(names) + 5)] + clock_rows
    if sampler is not None:
        sampler.close()
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
