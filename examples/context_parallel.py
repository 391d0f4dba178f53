#!/usr/bin/env python3
"""Context parallel attention across GPUs: PyTorch's ring attention running flashattn_cu's kernels.

    torchrun --nproc-per-node 2 examples/context_parallel.py
    torchrun --nproc-per-node 2 examples/context_parallel.py --seqlens 65536 131072 \\
        --heads 16/16 32/8 --backends flashattn_cu cudnn --out cp.md

PyTorch's `context_parallel` (torch.distributed.tensor.experimental) shards one sequence over the
ranks of a device mesh and patches `F.scaled_dot_product_attention` with ring attention: each rank
keeps its query shard, the key/value shards travel around the ring, and every step calls SDPA's
aten op (`_scaled_dot_product_flash_attention`, or the cuDNN one) on one (query shard, key shard)
pair; the partial outputs are merged in fp32 through their log-sum-exps. With
`flashattn_cu.sdpa.activate()` those aten flash calls run flashattn_cu, so nothing else changes.
Causal attention uses PyTorch's head-tail load balancing: each rank holds a chunk from the start
and one from the end of the sequence, and the ring's off-diagonal steps are non-causal calls with
seqlen_q != seqlen_k, which flashattn_cu serves (only causal with seqlen_q != seqlen_k falls back).

For each (seqlen, heads) and backend the script, on every rank:
  1. makes the same full-sequence q, k, v, dout (batch 1, bf16, head dim 128, causal);
  2. runs forward + backward on the whole sequence on its own GPU (the one-GPU result and time);
  3. runs forward + backward under `context_parallel`, gathers the output and gradients with
     `context_parallel_unshard`, and compares them with flashattn_cu's one-GPU result;
  4. reports how many aten flash calls flashattn_cu served on each rank (and any fallbacks).

Tolerance ("within bf16 noise"): the ring rounds each step's partial output and gradients to bf16
before merging them in fp32, so it is not bitwise the one-GPU answer. The yardstick is measured in
the same run: the distance between two correct one-GPU bf16 kernels, flashattn_cu and PyTorch's
FlashAttention-2, on the same inputs. A result passes when its error against flashattn_cu's
one-GPU result is at most max(2 x that distance, one bf16 ulp (2^-7 relative) of the largest
reference value).

Times are medians of --reps forward + backward steps (CUDA events, ranks aligned by a barrier
before each step, the slowest rank's time). Per-GPU efficiency = one-GPU time / (world x CP
time): 1.0 means the ring scales perfectly. Exit status 0 when every flashattn_cu result passed
and flashattn_cu served every call on every rank.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

REPO_ROOT = Path(__file__).resolve().parents[1]
if list((REPO_ROOT / "flashattn_cu").glob("_C*.so")) and str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # the checkout's build, when it has one

import flashattn_cu.sdpa as fsdpa  # noqa: E402

try:
    from torch.distributed.tensor.experimental import context_parallel
except ImportError as exc:  # pragma: no cover - torch without context parallel
    raise SystemExit(f"this torch ({torch.__version__}) has no context_parallel: {exc}")
try:
    from torch.distributed.tensor.experimental import context_parallel_unshard
except ImportError:  # torch versions that keep it in the private module
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

BACKENDS = {  # name -> (SDPA backend, flashattn_cu active)
    "flashattn_cu": (SDPBackend.FLASH_ATTENTION, True),
    "flash": (SDPBackend.FLASH_ATTENTION, False),  # PyTorch's FlashAttention-2
    "cudnn": (SDPBackend.CUDNN_ATTENTION, False),
}
BF16_ULP = 2.0 ** -7  # spacing of bf16 values in [1, 2)


def log(rank, *a):
    if rank == 0:
        print(*a, flush=True)


def make_inputs(seqlen, hq, hkv, d, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)  # same tensors on every rank
    shape = lambda h: (1, h, seqlen, d)  # noqa: E731
    q = torch.randn(shape(hq), device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(shape(hkv), device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(shape(hkv), device="cuda", dtype=torch.bfloat16, generator=g)
    dout = torch.randn(shape(hq), device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v, dout


def fwd_bwd(q, k, v, dout, gqa):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    return out.detach(), dq, dk, dv


def time_steps(fn, reps, aligned=False):
    """Median seconds of fn() over reps; aligned: ranks meet at a barrier before each step and
    the slowest rank's median is returned."""
    fn()
    times = []
    for _ in range(reps):
        if aligned:
            dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    t = torch.tensor([statistics.median(times)], device="cuda")
    if aligned:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def flops_causal(seqlen, hq, d):
    fwd = 4 * seqlen * seqlen * hq * d / 2
    return fwd * 3.5  # forward + backward (2.5x), flash_attn's count


def select(name):
    backend, ours = BACKENDS[name]
    if ours:
        fsdpa.activate()
    else:
        fsdpa.deactivate()
    return sdpa_kernel(backend)


def run_cp(mesh, q, k, v, dout, gqa, reps):
    """Forward + backward under context_parallel; the gathered (out, dq, dk, dv) and the time."""
    qs, ks, vs, gs = (t.clone() for t in (q, k, v, dout))
    buffers = [qs, ks, vs, gs]
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * 4,
                          no_restore_buffers=set(buffers)):
        res = fwd_bwd(qs, ks, vs, gs, gqa)
        fsdpa.reset_call_counts()
        res = fwd_bwd(qs, ks, vs, gs, gqa)
        counts = fsdpa.call_counts()
        seconds = time_steps(lambda: fwd_bwd(qs, ks, vs, gs, gqa), reps, aligned=True)
    gathered = context_parallel_unshard(mesh, list(res), [2] * 4)
    return gathered, seconds, counts


def max_err(a, b):
    return (a.float() - b.float()).abs().max().item()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seqlens", type=int, nargs="+", default=[65536, 131072])
    p.add_argument("--heads", nargs="+", default=["16/16", "32/8"],
                   help="query heads/key-value heads, e.g. 16/16 (MHA) 32/8 (GQA)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--backends", nargs="+", default=["flashattn_cu", "cudnn"],
                   choices=sorted(BACKENDS))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="markdown table (written by rank 0)")
    args = p.parse_args()

    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    mesh = dist.device_mesh.init_device_mesh("cuda", (world,), mesh_dim_names=("cp",))
    log(rank, f"context parallel over {world} GPU(s) ({torch.cuda.get_device_name()}), "
              f"torch {torch.__version__}")

    rows, ok = [], True
    for seqlen in args.seqlens:
        for heads in args.heads:
            hq, hkv = (int(x) for x in heads.split("/"))
            gqa = hq != hkv
            q, k, v, dout = make_inputs(seqlen, hq, hkv, args.head_dim, args.seed)
            with select("flashattn_cu"):
                ref = fwd_bwd(q, k, v, dout, gqa)
            with select("flash"):
                other = fwd_bwd(q, k, v, dout, gqa)
            noise = [max_err(a, b) for a, b in zip(ref, other)]
            tol = [max(2 * n, BF16_ULP * r.abs().max().item()) for n, r in zip(noise, ref)]
            del other
            for name in args.backends:
                try:
                    with select(name):
                        t1 = time_steps(lambda: fwd_bwd(q, k, v, dout, gqa), args.reps)
                        got, tcp, counts = run_cp(mesh, q, k, v, dout, gqa, args.reps)
                except Exception as exc:  # e.g. a backend without GQA in this torch
                    log(rank, f"RESULT cp {name} s={seqlen} heads={heads}: error "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                    if name == "flashattn_cu":
                        ok = False
                    rows.append((seqlen, heads, name, None, None, None, None, None, "error"))
                    continue
                errs = [max_err(a, b) for a, b in zip(got, ref)]
                passed = all(e <= t for e, t in zip(errs, tol))
                all_counts = [None] * world
                dist.all_gather_object(all_counts, counts)
                served = None
                if name == "flashattn_cu":
                    served = all(c.get("forward", 0) > 0 and c.get("backward", 0) > 0
                                 and len(c) == 2 for c in all_counts)
                    ok = ok and passed and served
                eff = t1 / (world * tcp)
                tflops = flops_causal(seqlen, hq, args.head_dim) / tcp / world / 1e12
                log(rank, f"RESULT cp {name} s={seqlen} heads={heads} world={world}: one-GPU "
                          f"{t1 * 1e3:.1f} ms, CP {tcp * 1e3:.1f} ms, speedup {t1 / tcp:.2f}x, "
                          f"per-GPU efficiency {eff:.2f}, {tflops:.0f} TFLOP/s per GPU; "
                          f"max err out/dq/dk/dv "
                          + "/".join(f"{e:.2e}" for e in errs)
                          + " (tol " + "/".join(f"{t:.2e}" for t in tol) + ") "
                          + ("pass" if passed else "FAIL")
                          + ("" if served is None else f"; calls per rank {all_counts}"))
                rows.append((seqlen, heads, name, t1, tcp, eff, errs, tol,
                             "pass" if passed else "FAIL"))
            del q, k, v, dout, ref
            torch.cuda.empty_cache()

    if rank == 0 and args.out is not None:
        lines = [f"# Context parallel, {world} x {torch.cuda.get_device_name()}, torch "
                 f"{torch.__version__}", "",
                 "bf16, batch 1, head dim 128, causal, forward + backward; errors against "
                 "flashattn_cu on one GPU (tolerance: see examples/context_parallel.py)", "",
                 "| seqlen | heads q/kv | backend | 1 GPU ms | CP ms | speedup | per-GPU eff. "
                 "| max err out / dq / dk / dv | tol | check |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        for s, h, name, t1, tcp, eff, errs, tol, check in rows:
            if t1 is None:
                lines.append(f"| {s} | {h} | {name} | - | - | - | - | - | - | error |")
                continue
            lines.append(f"| {s} | {h} | {name} | {t1 * 1e3:.1f} | {tcp * 1e3:.1f} | "
                         f"{t1 / tcp:.2f}x | {eff:.2f} | "
                         + " / ".join(f"{e:.1e}" for e in errs) + " | "
                         + " / ".join(f"{t:.1e}" for t in tol) + f" | {check} |")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    log(rank, "RESULT cp overall: " + ("pass" if ok else "FAIL"))
    fsdpa.deactivate()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
