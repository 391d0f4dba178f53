#!/usr/bin/env python3
"""A few tiny flashattn_cu calls for compute-sanitizer (memcheck, racecheck, synccheck).

    compute-sanitizer --tool memcheck --error-exitcode 97 python scripts/sanitize_case.py
    python scripts/sanitize_case.py --dims 128 --quiet    # plain run, no sanitizer

Forward and backward of every kernel instance in the build (each head dim, dtype, and on an
sm_90 GPU both kernel paths), causal and not, deterministic and not, on odd lengths that leave
partial tiles on both axes, with GQA/MQA head splits and with seqlen_q > seqlen_k (causal rows
that see no key); then varlen batches with lengths 0 and 1, spare rows past the last sequence
and sliding windows (the dynamic kernel instances, the per-entry workspace slots, the on-chip
zeroing of rows past an entry and the clearing of rows outside every entry). The shapes are small so that the whole script finishes in well under a minute under the
sanitizer, which makes every kernel launch much slower. The reference runs on the CPU in fp32, so
the sanitizer instruments no cuBLAS kernels; the comparison here only catches gross errors (the
test suite owns accuracy). Every call is followed by a synchronize so an error is attributed to
the call that caused it. Exit 1 on a non-finite or grossly wrong result or an unexpected exception.

Set PYTORCH_NO_CUDA_MEMORY_CACHING=1 for memcheck: each tensor then gets its own allocation and
out-of-bounds accesses past a tensor's end are reported instead of landing in the cache's slack.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]

# (batch, seqlen_q, seqlen_k, nheads, nheads_k): partial tiles, GQA, sq > sk (empty causal rows), sq = 1
CASES = [(1, 77, 133, 4, 2), (2, 129, 65, 2, 2), (1, 1, 97, 4, 1)]


def reference(q, k, v, causal, window=(-1, -1), softcap=0.0, alibi_slopes=None):
    """fp32 attention on the CPU with flash_attn's semantics (softcap on the scaled scores, then
    ALiBi's -slope * |i + s_k - s_q - j| (slopes (nheads,)), bottom-right causal and windows;
    rows that see no key give 0)."""
    q, k, v = (x.detach().float().cpu() for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    left, right = window[0], 0 if causal else window[1]
    s_q, s_k = q.shape[1], k.shape[1]
    diagonal = torch.arange(s_q)[:, None] + (s_k - s_q)
    j = torch.arange(s_k)[None, :]
    if alibi_slopes is not None:  # the -slope * |d - j| form, causal too (same softmax)
        from flashattn_cu.testing import alibi_bias  # imported by main() first (sys.path)

        scores = scores + alibi_bias(alibi_slopes.float().cpu(), q.shape[0], s_q, s_k, False,
                                     torch.float32)
    if right >= 0:
        scores = scores.masked_fill(j > diagonal + right, float("-inf"))
    if left >= 0:
        scores = scores.masked_fill(j < diagonal - left, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", default="all",
                   help="head dims, or 'all' (default): every instance in the build")
    p.add_argument("--dtypes", default="bf16,fp16")
    p.add_argument("--no-bwd", action="store_true", help="forward only")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--only-dynamic", action="store_true",
                   help="only the varlen forwards on more tiles than SMs (the sm90 forward's "
                        "dynamic tile scheduler: CTAs claiming tiles from a ring counter)")
    args = p.parse_args(argv)

    if not torch.cuda.is_available():
        print("sanitize_case: no CUDA device")
        return 1
    if list((REPO_ROOT / "flashattn_cu").glob("_C*.so")) and str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    import flashattn_cu
    from flashattn_cu import flash_attn_func
    from flashattn_cu.testing import kernel_path

    built = list(flashattn_cu._C.built_head_dims())
    dims = built if args.dims == "all" else [int(x) for x in args.dims.split(",") if x]
    # The sm80 kernels on an sm_90 GPU are a second set of instances (the default path runs the
    # sm_90a backward where it has one).
    paths = ["auto"]
    if torch.cuda.get_device_capability() == (9, 0) and 90 in flashattn_cu._C.built_archs():
        paths.append("sm80")
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    dtype_list = [dtypes[x] for x in args.dtypes.split(",") if x]
    # The paths of every case but the dynamic scheduler's (--only-dynamic: none).
    full_paths = [] if args.only_dynamic else paths

    torch.manual_seed(0)
    problems, calls = [], 0

    def run(tag, dtype, d, causal, deterministic, b, s_q, s_k, h, h_k, alibi=False, softcap=0.0,
            window=(-1, -1)):
        nonlocal calls
        slopes = torch.rand(h, device="cuda") if alibi else None
        q = torch.randn(b, s_q, h, d, device="cuda", dtype=dtype)
        k = torch.randn(b, s_k, h_k, d, device="cuda", dtype=dtype)
        v = torch.randn(b, s_k, h_k, d, device="cuda", dtype=dtype)
        for t in (q, k, v):
            t.requires_grad_(not args.no_bwd)
        try:
            out = flash_attn_func(q, k, v, causal=causal, deterministic=deterministic,
                                  alibi_slopes=slopes, softcap=softcap, window_size=window)
            torch.cuda.synchronize()
            calls += 1
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{tag}: forward raised {type(exc).__name__}: {exc}")
            return
        ref = reference(q, k, v, causal, window, softcap=softcap, alibi_slopes=slopes)
        err = (out.detach().float().cpu() - ref).abs().max().item()
        if not torch.isfinite(out).all().item() or err > 0.1:
            problems.append(f"{tag}: forward wrong (max err {err:.3g})")
        line = f"{tag}: fwd err {err:.2e}"
        if not args.no_bwd:
            try:
                out.backward(torch.randn_like(out))
                torch.cuda.synchronize()
                calls += 1
                if not all(torch.isfinite(t.grad).all().item() for t in (q, k, v)):
                    problems.append(f"{tag}: non-finite gradients")
                line += ", bwd ran"
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{tag}: backward raised {type(exc).__name__}: {exc}")
        if not args.quiet:
            print(line)

    # Every (path, dtype, head dim) instance, each case once, causal and deterministic mixed
    # over the cases so each kernel (main, dQ, preprocess, convert) runs on partial tiles.
    modes = [(True, False), (False, True), (True, True)]
    for path in full_paths:
        with kernel_path(path):
            for dtype in dtype_list:
                for d in dims:
                    for (b, s_q, s_k, h, h_k), (causal, det) in zip(CASES, modes):
                        tag = (f"{path} {str(dtype).split('.')[-1]} d={d} causal={int(causal)} "
                               f"det={int(det)} b={b} sq={s_q} sk={s_k} h={h}/{h_k}")
                        run(tag, dtype, d, causal, det, b, s_q, s_k, h, h_k)
            # One block summing two query heads of a split group (kv_splits 2 of group 4): a
            # long key sequence keeps the block count high enough for that choice.
            d = 128 if 128 in dims else dims[0]
            run(f"{path} head-split d={d}", torch.bfloat16, d, True, False, 1, 9, 16384, 4, 1)
            # One modifier or a window alone on a padded call: on the sm90 path the backward's
            # static-mask ALiBi and softcap instances and its padded window instance
            # (problem/mask.h kStaticAlibiVariant, kStaticSoftcapVariant, kPaddedWindowVariant)
            # at every length, and the forward's short-row variants, partial tiles, GQA.
            shape = (2, 77, 133, 4, 2)
            for d in dims:
                for causal in (False, True):
                    window = (20, -1 if causal else 9)
                    for what, mod in (("alibi", {"alibi": True}), ("softcap", {"softcap": 5.0}),
                                      (f"window={window}", {"window": window})):
                        run(f"{path} {what} d={d} causal={int(causal)} b=2 sq=77 sk=133 h=4/2",
                            torch.bfloat16, d, causal, False, *shape, **mod)

    # Forward-only calls: their backward kernels are the cases above.
    def forward_only(tag, q, k, v, causal, softcap=0.0, window=(-1, -1), alibi_slopes=None):
        nonlocal calls
        try:
            out = flash_attn_func(q, k, v, causal=causal, softcap=softcap, window_size=window,
                                  alibi_slopes=alibi_slopes)
            torch.cuda.synchronize()
            calls += 1
            ref = reference(q, k, v, causal, window, softcap=softcap, alibi_slopes=alibi_slopes)
            err = (out.float().cpu() - ref).abs().max().item()
            if not torch.isfinite(out).all().item() or err > 0.1:
                problems.append(f"{tag}: forward wrong (max err {err:.3g})")
            if not args.quiet:
                print(f"{tag}: fwd err {err:.2e}")
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{tag}: forward raised {type(exc).__name__}: {exc}")

    def bf16(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * scale

    for d in [x for x in (64, 128, 256) if x in dims]:
        for causal in (False, True):
            # Softcap on a padded call without a window past the short-row rule (tiles.h): the
            # sm90 forward's static-mask softcap instance (problem/mask.h kStaticSoftcapVariant)
            # and its row max over the raw scores (d = 128), key tail and causal diagonal.
            forward_only(f"auto softcap d={d} causal={int(causal)} b=1 sq=1100 sk=2200 h=2/1",
                         bf16(1, 1100, 2, d, scale=3.0), bf16(1, 2200, 1, d, scale=3.0),
                         bf16(1, 2200, 1, d), causal, softcap=30.0)
            if d == 128 and not causal:
                # Past 4k keys: d = 128's long-row bounded softcap instance (128 x 176; up to 4k
                # keys the 128 x 128 one above runs, knobs.h fwd_bounded_short_sm90).
                forward_only(f"auto softcap d={d} causal=0 b=1 sq=1100 sk=4300 h=2/1",
                             bf16(1, 1100, 2, d, scale=3.0), bf16(1, 4300, 1, d, scale=3.0),
                             bf16(1, 4300, 1, d), causal, softcap=30.0)
            # ALiBi alone on a padded call without a window past the short-row rule: the sm90
            # forward's static-mask ALiBi instance (problem/mask.h kStaticAlibiVariant) on the
            # static tiles, key tail and causal diagonal. (Its backward, at every length of a
            # padded call without a window: the ALiBi case below.)
            forward_only(f"auto alibi d={d} causal={int(causal)} b=1 sq=1100 sk=2200 h=2/1",
                         bf16(1, 1100, 2, d), bf16(1, 2200, 1, d), bf16(1, 2200, 1, d), causal,
                         alibi_slopes=torch.tensor([0.5, 0.0625], device="cuda"))
            # The sm90 forward's persistent grid (more tiles than SMs, so each CTA walks several
            # and the K/V ring and Q's buffer run on across tiles), non-causal and short causal
            # (longest first); its backward is the cases above.
            forward_only(f"auto persistent d={d} causal={int(causal)} b=2 sq=sk=200 h=80/16",
                         bf16(2, 200, 80, d), bf16(2, 200, 16, d), bf16(2, 200, 16, d), causal)
            # A window alone on a padded call (the sm90 forward's padded window instance,
            # problem/mask.h kPaddedWindowVariant, at the head dims tiles.h gives it), on the
            # persistent grid, both window edges inside the tiles, sq != sk.
            forward_only(f"auto padded window d={d} causal={int(causal)} b=2 sq=300 sk=330 h=40/8",
                         bf16(2, 300, 40, d), bf16(2, 330, 8, d), bf16(2, 330, 8, d), causal,
                         window=(45, -1 if causal else 20))
    from flashattn_cu import flash_attn_varlen_func

    def varlen_forward_check(tag, q, k, v, cu_q, cu_k, lens_q, lens_k, causal, window, det):
        """One varlen forward against the CPU reference entry by entry; returns the output."""
        nonlocal calls
        out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                     causal=causal, deterministic=det, window_size=window)
        torch.cuda.synchronize()
        calls += 1
        err = 0.0
        for i in range(len(lens_q)):
            sq = slice(int(cu_q[i]), int(cu_q[i + 1]))
            sk = slice(int(cu_k[i]), int(cu_k[i + 1]))
            ref = reference(q[sq].unsqueeze(0), k[sk].unsqueeze(0), v[sk].unsqueeze(0), causal,
                            window)
            if ref.numel():
                err = max(err, (out[sq].detach().float().cpu() - ref[0]).abs().max().item())
        if not torch.isfinite(out).all().item() or err > 0.1:
            problems.append(f"{tag}: forward wrong (max err {err:.3g})")
        if not args.quiet:
            print(f"{tag}: fwd err {err:.2e}")
        return out

    def cumulative(lens):
        return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                            device="cuda")

    # Varlen on more tiles than the GPU has SMs: the sm90 forward's dynamic scheduler (one CTA
    # per SM claiming tiles from the workspace's ring counter, the next tile's first loads under
    # this one's last steps; sm90/fwd_launch.h), causal and not, with a window, GQA 6:1, lengths
    # 0 and 1 and partial tiles: 48 heads x 10 query tiles of 128 rows = 480 tiles.
    dyn_q, dyn_k = [37, 0, 1, 130, 300, 260], [50, 3, 0, 129, 300, 301]
    for path in paths[:1]:
        with kernel_path(path):
            for d in dims:
                for causal, window in ((True, (-1, -1)), (False, (-1, -1)), (True, (70, -1))):
                    q = torch.randn(sum(dyn_q), 48, d, device="cuda", dtype=torch.bfloat16)
                    k = torch.randn(sum(dyn_k), 8, d, device="cuda", dtype=torch.bfloat16)
                    v = torch.randn_like(k)
                    tag = f"{path} varlen dynamic d={d} causal={int(causal)} window={window}"
                    try:
                        varlen_forward_check(tag, q, k, v, cumulative(dyn_q), cumulative(dyn_k),
                                             dyn_q, dyn_k, causal, window, False)
                    except Exception as exc:  # noqa: BLE001
                        problems.append(f"{tag}: raised {type(exc).__name__}: {exc}")

    # Varlen (the dynamic kernel instances, the per-entry workspace slots) and sliding windows:
    # lengths 0, 1 and partial tiles, a window on each side.

    lens_q, lens_k = [37, 0, 1, 130], [50, 3, 0, 129]
    cu_q, cu_k = cumulative(lens_q), cumulative(lens_k)
    for path in full_paths:
        with kernel_path(path):
            for d in dims:
                for causal, det, window in ((True, False, (-1, -1)), (False, True, (9, 4)),
                                            (True, True, (17, -1))):
                    tag = (f"{path} varlen d={d} causal={int(causal)} det={int(det)} "
                           f"window={window}")
                    # Spare rows past the last sequence (a padded buffer): cleared as rows
                    # that see no key by the first CTA (problem/seqlen.h), and read into the
                    # last sequences' tail tiles, where the sm90 kernels zero them on chip.
                    q = torch.randn(sum(lens_q) + 5, 4, d, device="cuda", dtype=torch.bfloat16)
                    k = torch.randn(sum(lens_k) + 7, 2, d, device="cuda", dtype=torch.bfloat16)
                    v = torch.randn_like(k)
                    for t in (q, k, v):
                        t.requires_grad_(not args.no_bwd)
                    try:
                        out = varlen_forward_check(tag, q, k, v, cu_q, cu_k, lens_q, lens_k,
                                                   causal, window, det)
                        if not args.no_bwd:
                            out.backward(torch.randn_like(out))
                            torch.cuda.synchronize()
                            calls += 1
                            if not all(torch.isfinite(t.grad).all().item() for t in (q, k, v)):
                                problems.append(f"{tag}: non-finite gradients")
                    except Exception as exc:  # noqa: BLE001
                        problems.append(f"{tag}: raised {type(exc).__name__}: {exc}")
    print(f"sanitize_case: {calls} kernel calls, paths {paths}, head dims {dims}; "
          f"{len(problems)} problem(s)")
    for line in problems:
        print(f"  PROBLEM {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
