#!/usr/bin/env python3
"""Forward side by side with FlashAttention-4's Hopper kernels, in one process.

    python benchmarks/bench_fa4.py --out benchmarks/results/fa4_h200.md [--dtypes bf16,fp16]

flashattn_cu (default path: the sm90a forward on an H200), SDPA cuDNN, SDPA flash (FA2) and,
where `from flash_attn.cute import flash_attn_func` imports (../shared/tools/fa4_anchor.sh brings
it to the device; never a dependency of the project), FlashAttention-4. flash_attn's benchmark
shapes: 16k tokens (batch = 16384 // seqlen), hidden 2048 (nheads = 2048 // d), d 64/128/256,
seqlen 1k-16k, causal and not. TFLOP/s = 4 b h s^2 d (halved when causal) / median time of
triton.testing.do_bench. Each backend's output is checked against cuDNN's first (a backend that
disagrees by more than 2e-2 is marked '!'). Prints SUMMARY lines with geometric means of the
ratios ours / cuDNN and ours / FA4.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

REPO_ROOT = Path(__file__).resolve().parents[1]
if list((REPO_ROOT / "flashattn_cu").glob("_C*.so")) and str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from flashattn_cu import flash_attn_func  # noqa: E402
from triton.testing import do_bench  # noqa: E402

try:
    from flash_attn.cute import flash_attn_func as fa4_func
except Exception as exc:  # noqa: BLE001 - optional: any import failure means "not here"
    fa4_func, FA4_ERROR = None, f"{type(exc).__name__}: {exc}"
else:
    FA4_ERROR = None


def backends(q, k, v, causal):
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
        return run

    out = {"flashattn_cu": lambda: flash_attn_func(q, k, v, causal=causal),
           "cuDNN": sdpa(SDPBackend.CUDNN_ATTENTION),
           "FA2": sdpa(SDPBackend.FLASH_ATTENTION)}
    if fa4_func is not None:
        def fa4():
            res = fa4_func(q, k, v, causal=causal)
            return res[0] if isinstance(res, tuple) else res
        out["FA4"] = fa4
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    names = ["flashattn_cu", "cuDNN", "FA2"] + (["FA4"] if fa4_func is not None else [])
    lines = [f"# Forward side by side, {torch.cuda.get_device_name()}, torch {torch.__version__}",
             "", f"FA4: {'flash_attn.cute ' + 'imported' if fa4_func else 'not available (' + str(FA4_ERROR) + ')'}",
             "", "| dtype | d | seqlen | causal | " + " | ".join(names) + " | ours/cuDNN | ours/FA4 |",
             "|" + "---|" * (len(names) + 6)]
    ratios = {"cuDNN": [], "FA4": []}
    for dname in args.dtypes.split(","):
        dtype = dtypes[dname]
        for d in (int(x) for x in args.dims.split(",")):
            for s in (int(x) for x in args.seqlens.split(",")):
                for causal in (False, True):
                    b, h = 16384 // s, 2048 // d
                    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3))
                    fns = backends(q, k, v, causal)
                    ref = fns["cuDNN"]()
                    flops = 4 * b * h * s * s * d / (2 if causal else 1)
                    tf = {}
                    for name, fn in fns.items():
                        try:
                            bad = (fn().float() - ref.float()).abs().max().item() > 2e-2
                            ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                            tf[name] = (flops / ms * 1e-9, bad)
                        except Exception as exc:  # noqa: BLE001
                            print(f"{name} d={d} s={s} causal={int(causal)}: {type(exc).__name__}: {exc}")
                    cells = [f"{tf[n][0]:.0f}{'!' if tf[n][1] else ''}" if n in tf else "-" for n in names]
                    ours = tf.get("flashattn_cu", (math.nan, True))[0]
                    rc = ours / tf["cuDNN"][0] if "cuDNN" in tf else math.nan
                    rf = ours / tf["FA4"][0] if "FA4" in tf else math.nan
                    ratios["cuDNN"].append(rc)
                    if "FA4" in tf:
                        ratios["FA4"].append(rf)
                    lines.append(f"| {dname} | {d} | {s} | {int(causal)} | " + " | ".join(cells) +
                                 f" | {rc:.2f} | {rf:.2f} |")
                    print(lines[-1], flush=True)
                    del q, k, v, ref
    for key, vals in ratios.items():
        vals = [x for x in vals if x == x]
        if vals:
            geo = math.exp(sum(math.log(x) for x in vals) / len(vals))
            summary = (f"SUMMARY fwd ours/{key}: geo {geo:.3f} [{min(vals):.2f}..{max(vals):.2f}] over "
                       f"{len(vals)} shapes, {sum(x >= 1.0 for x in vals)} at >= 1.0")
            lines += ["", summary]
            print(summary)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
