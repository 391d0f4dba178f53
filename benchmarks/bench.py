#!/usr/bin/env python3
"""Time flashattn_cu against PyTorch's attention backends, all in one process.

Shapes follow flash_attn's own benchmark: 16k tokens per batch (batch = 16384 // seqlen),
hidden size 2048 (nheads = 2048 // d).  For every shape the script first checks
flashattn_cu's output (and, for short sequences, its gradients) against an fp32 reference
and then times, with the median of ``triton.testing.do_bench``:

    flashattn_cu      flashattn_cu.flash_attn_func
    SDPA flash        F.scaled_dot_product_attention under SDPBackend.FLASH_ATTENTION (FA2 in PyTorch)
    cuDNN             ... under SDPBackend.CUDNN_ATTENTION
    efficient         ... under SDPBackend.EFFICIENT_ATTENTION
    naive             matmul + fp32 softmax + matmul in PyTorch (only up to --naive-max-seqlen)

in three modes: fwd, bwd (backward alone, graph kept with retain_graph) and fwdbwd.
FLOPs are counted as flash_attn counts them: forward 4*b*h*sq*sk*d, halved when causal;
backward 2.5x and forward+backward 3.5x the forward count.

Two short sections follow: decode (seqlen_q = 1, GQA, long KV; reported as GB/s of K and V
read) and peak memory (flashattn_cu against naive attention at long sequence lengths).

Outputs, under --out-dir (default benchmarks/results): <name>.md, <name>.json and
<name>_fwd.png / <name>_bwd.png.  The markdown and JSON are rewritten after every shape, so a
run that is killed still leaves what it measured.  --dry-run fabricates numbers without a GPU
and writes only into a fresh temporary directory, to exercise the report code.

Exit status: 0 ok; 3 when a correctness check failed (numbers are still written, flagged);
4 when the CUDA context died; 143 when stopped by SIGTERM.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import math
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

from bench_report import BACKENDS, LABEL, Report, fmt, memory_sentences, short_error

REPO_ROOT = Path(__file__).resolve().parents[1]
TOKENS_PER_BATCH = 16384
HIDDEN = 2048

MODES = ("fwd", "bwd", "fwdbwd")
FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}
# flashattn_cu_sm80: our mma.sync kernels even where a faster path exists (on H100/H200 the
# default path runs the sm_90a wgmma backward); opt-in, to compare the two paths.
DEFAULT_BACKENDS = tuple(b for b in BACKENDS if b != "flashattn_cu_sm80")
DTYPE_NAMES = ("bf16", "fp16")

FULL_DEFAULTS = dict(
    dims="64,128,256",
    seqlens="512,1024,2048,4096,8192,16384",
    dtypes="bf16,fp16",
    causal="0,1",
    modes="fwd,bwd,fwdbwd",
    warmup=20,
    rep=80,
    decode_seqlens="4096,32768,131072",
    mem_naive_seqlens="8192,16384",
    mem_ours_seqlens="8192,16384,32768,65536,131072",
)
SMOKE_DEFAULTS = dict(  # --cpu-smoke: the real code path on the host, tiny shapes
    dims="32,64",
    seqlens="64,128",
    dtypes="bf16",
    causal="0,1",
    modes="fwd,bwd,fwdbwd",
    warmup=1,
    rep=3,
    decode_seqlens="256",
    mem_naive_seqlens="128",
    mem_ours_seqlens="128,512",
)
QUICK_DEFAULTS = dict(
    dims="128",
    seqlens="1024,4096,16384",
    dtypes="bf16",
    causal="0,1",
    modes="fwd,bwd",
    warmup=10,
    rep=30,
    decode_seqlens="32768",
    mem_naive_seqlens="8192",
    mem_ours_seqlens="8192,32768",
)


# --------------------------------------------------------------------------------------------
# arguments


def parse_int_list(text: str) -> list[int]:
    return [int(tok) for tok in text.replace(" ", "").split(",") if tok]


def parse_causal(text: str) -> list[bool]:
    words = {"0": False, "false": False, "no": False, "1": True, "true": True, "yes": True}
    text = text.strip().lower()
    if text in ("both", "all"):
        return [False, True]
    out = []
    for tok in text.replace(" ", "").split(","):
        if tok not in words:
            raise argparse.ArgumentTypeError(f"--causal: expected 0/1/true/false/both, got {tok!r}")
        if words[tok] not in out:
            out.append(words[tok])
    return out


def parse_choice_list(text: str, allowed, flag: str) -> list[str]:
    out = [tok for tok in text.replace(" ", "").split(",") if tok]
    for tok in out:
        if tok not in allowed:
            raise SystemExit(f"{flag}: unknown value {tok!r}; choose from {', '.join(allowed)}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Benchmark flashattn_cu against SDPA (flash, cuDNN, efficient) and naive attention.")
    p.add_argument("--dims", help=f"head dims (default {FULL_DEFAULTS['dims']})")
    p.add_argument("--seqlens", help=f"sequence lengths (default {FULL_DEFAULTS['seqlens']})")
    p.add_argument("--dtypes", help=f"bf16 and/or fp16 (default {FULL_DEFAULTS['dtypes']})")
    p.add_argument("--causal", help="0, 1, or 0,1 / both (default both)")
    p.add_argument("--modes", help=f"any of fwd,bwd,fwdbwd (default {FULL_DEFAULTS['modes']})")
    p.add_argument("--backends", default=",".join(DEFAULT_BACKENDS),
                   help=f"backends to time (default all but flashattn_cu_sm80; choices {','.join(BACKENDS)})")
    p.add_argument("--tokens", type=int, default=TOKENS_PER_BATCH, help="tokens per batch: batch = tokens // seqlen (default 16384)")
    p.add_argument("--hidden", type=int, default=HIDDEN, help="hidden size: nheads = hidden // d (default 2048)")
    p.add_argument("--quick", action="store_true",
                   help="small sweep: d=128, seqlens 1k/4k/16k, bf16, fwd+bwd, short timing (~1 min)")
    p.add_argument("--warmup", type=int, help="do_bench warmup in ms (default 20; quick 10)")
    p.add_argument("--rep", type=int, help="do_bench repetition time in ms (default 80; quick 30)")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds per (shape, mode): each backend timed once a round, "
                        "in turn; its time is the median over the rounds (default 3)")
    p.add_argument("--naive-max-seqlen", type=int, default=4096,
                   help="time naive attention only up to this seqlen (default 4096)")
    p.add_argument("--check-grad-max-seqlen", type=int, default=4096,
                   help="check gradients against the fp32 reference up to this seqlen (default 4096)")
    p.add_argument("--no-check", action="store_true", help="skip the correctness checks (not advised)")
    p.add_argument("--no-decode", action="store_true", help="skip the decode section")
    p.add_argument("--decode-seqlens", help="seqlen_k values of the decode section")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory section")
    p.add_argument("--mem-naive-seqlens", help="naive seqlens of the memory section")
    p.add_argument("--mem-ours-seqlens", help="flashattn_cu seqlens of the memory section")
    p.add_argument("--no-ceilings", action="store_true",
                   help="skip measuring the bf16 matmul rate and copy bandwidth")
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="seconds; past this, untimed shapes are skipped and what was measured is written (default 0 = none)")
    p.add_argument("--out-dir", default=None, help="where results go (default benchmarks/results)")
    p.add_argument("--name", default=None, help="base name of the outputs (default <gpu>_<commit>[_quick])")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plot", action="store_true", help="skip the PNG charts")
    p.add_argument("--dry-run", action="store_true",
                   help="no GPU: fabricate numbers, write only into a new temporary directory")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="no GPU: run the real measuring code on the CPU with tiny shapes (a stand-in plays "
                        "flashattn_cu when it is not importable); writes only into a new temporary directory")
    return p


def resolve_args(argv=None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    defaults = SMOKE_DEFAULTS if args.cpu_smoke else QUICK_DEFAULTS if args.quick else FULL_DEFAULTS
    if args.cpu_smoke:
        if args.tokens == TOKENS_PER_BATCH:
            args.tokens = 256
        if args.hidden == HIDDEN:
            args.hidden = 128
        args.no_ceilings = True
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.dims = parse_int_list(args.dims)
    args.seqlens = parse_int_list(args.seqlens)
    args.dtypes = parse_choice_list(args.dtypes, DTYPE_NAMES, "--dtypes")
    try:
        args.causal = parse_causal(args.causal)
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(str(exc))
    args.modes = parse_choice_list(args.modes, MODES, "--modes")
    args.backends = parse_choice_list(args.backends, BACKENDS, "--backends")
    args.decode_seqlens = parse_int_list(args.decode_seqlens)
    args.mem_naive_seqlens = parse_int_list(args.mem_naive_seqlens)
    args.mem_ours_seqlens = parse_int_list(args.mem_ours_seqlens)
    for d in args.dims:
        if d <= 0 or args.hidden % d:
            raise SystemExit(f"--dims: {d} does not divide the hidden size {args.hidden}")
    for s in args.seqlens:
        if s <= 0 or s > args.tokens or args.tokens % s:
            raise SystemExit(f"--seqlens: {s} must divide --tokens {args.tokens} (batch = tokens // seqlen)")
    return args


# --------------------------------------------------------------------------------------------
# small helpers


def attention_flops(batch, nheads, seqlen_q, seqlen_k, headdim, causal, mode="fwd") -> float:
    """flash_attn's count: 4*b*h*sq*sk*d for the forward pass, halved when causal."""
    flops = 4.0 * batch * nheads * seqlen_q * seqlen_k * headdim
    if causal:
        flops /= 2
    return flops * FLOP_FACTOR[mode]


def tflops_of(flops: float, ms):
    if ms is None or ms <= 0:
        return None
    return flops / (ms * 1e-3) / 1e12


def git_commit() -> tuple[str, str]:
    """(commit, source): $FLASHATTN_CU_COMMIT when set (the device tool's copy of the tree carries
    the .git of the last landed commit, so git there names the wrong one), else git in the repo,
    else 'unknown'."""
    env = os.environ.get("FLASHATTN_CU_COMMIT", "").strip()
    if env:
        return env, "FLASHATTN_CU_COMMIT"
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            commit = out.stdout.strip()
            dirty = subprocess.run(["git", "status", "--porcelain", "--", "csrc", "flashattn_cu", "setup.py"],
                                   cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
            if dirty.returncode == 0 and dirty.stdout.strip():
                commit += "+dirty"
            return commit, "git"
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown", "none"


def nvidia_smi_query(fields: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0:
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    return None


def import_flashattn_cu():
    """The checkout's package when it has a built extension (the commit in the header is this
    checkout's), else whatever `import flashattn_cu` finds."""
    if list((REPO_ROOT / "flashattn_cu").glob("_C*.so")) and str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    import flashattn_cu
    return flashattn_cu


class Stop(Exception):
    """Raised by the SIGTERM handler so partial results still get written."""


def _on_sigterm(signum, frame):
    raise Stop(f"signal {signum}")


# --------------------------------------------------------------------------------------------
# the report: one dict that is written as JSON, markdown and PNG


# --------------------------------------------------------------------------------------------
# the GPU side


class HostEvent:
    """Stand-in for torch.cuda.Event on the host (cpu smoke mode)."""

    def __init__(self):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) * 1e3


class Bench:
    def __init__(self, args, report: Report):
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        self.torch = torch
        self.F = F
        self.sdpa_kernel = sdpa_kernel
        self.SDPA = {
            "sdpa_flash": SDPBackend.FLASH_ATTENTION,
            "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
            "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
        }
        self.REF_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        self.args = args
        self.report = report
        self.dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
        # every device-specific call goes through these, so --cpu-smoke can run the same code on the host
        self.device = "cpu" if args.cpu_smoke else "cuda"
        if self.device == "cuda":
            self.sync = torch.cuda.synchronize
            self.empty_cache = torch.cuda.empty_cache
            self.Event = lambda: torch.cuda.Event(enable_timing=True)
            self.memory_allocated = torch.cuda.memory_allocated
            self.max_memory_allocated = torch.cuda.max_memory_allocated
            self.reset_peak = torch.cuda.reset_peak_memory_stats
        else:
            self.sync = self.empty_cache = self.reset_peak = lambda: None
            self.Event = HostEvent
            self.memory_allocated = self.max_memory_allocated = lambda: 0
        self.t0 = time.monotonic()
        self.budget_hit = False
        self.ours = None
        self.ours_error = None
        if args.cpu_smoke:  # flashattn_cu runs on CUDA only; exercise the harness with a stand-in
            self.ours = self._stand_in
            report.note("cpu smoke: an fp32 SDPA stand-in plays flashattn_cu")
        else:
            try:
                flashattn_cu = import_flashattn_cu()
                self.ours = flashattn_cu.flash_attn_func
                report.data["meta"]["flashattn_cu_file"] = getattr(flashattn_cu, "__file__", None)
            except Exception as exc:  # recorded; the baselines still run
                self.ours_error = short_error(exc)
                report.note(f"import flashattn_cu failed: {self.ours_error}")
        self._do_bench = None
        report.data["meta"]["timer"] = "the script's own event loop (same method as do_bench)"
        if self.device == "cuda":
            try:
                from triton.testing import do_bench
                self._do_bench = do_bench
                report.data["meta"]["timer"] = "triton.testing.do_bench"
            except Exception:
                report.note("triton is not importable: timing with the script's own CUDA-event loop instead")
        self._mask_cache = {}
        self._noted = set()

    def _stand_in(self, q, k, v, causal=False, **_):
        """cpu smoke only: what flashattn_cu computes, via SDPA in fp32 (bottom-right causal for sq == sk)."""
        out = self.F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(),
                                                  v.transpose(1, 2).float(), is_causal=causal, enable_gqa=True)
        return out.transpose(1, 2).to(q.dtype)

    # ---- timing
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def over_budget(self) -> bool:
        if self.args.time_budget and self.elapsed() > self.args.time_budget:
            if not self.budget_hit:
                self.budget_hit = True
                self.report.note(f"time budget of {self.args.time_budget:.0f} s reached: later shapes were not timed")
            return True
        return False

    def time_ms(self, fn, grad_to_none=None) -> float:
        if self._do_bench is not None:
            return float(self._do_bench(fn, warmup=self.args.warmup, rep=self.args.rep,
                                        grad_to_none=grad_to_none, return_mode="median"))
        return self._event_bench(fn, grad_to_none)

    def _event_bench(self, fn, grad_to_none):
        torch = self.torch
        flush = torch.empty((256 if self.device == "cuda" else 1) * 2**20, dtype=torch.int8, device=self.device)
        fn()
        self.sync()
        start, end = self.Event(), self.Event()
        start.record()
        for _ in range(5):
            fn()
        end.record()
        self.sync()
        est = max(start.elapsed_time(end) / 5, 1e-3)
        for _ in range(max(1, int(self.args.warmup / est))):
            fn()
        times = []
        for _ in range(max(1, int(self.args.rep / est))):
            if grad_to_none:
                for t in grad_to_none:
                    t.grad = None
            flush.zero_()
            s, e = self.Event(), self.Event()
            s.record()
            fn()
            e.record()
            times.append((s, e))
        self.sync()
        values = sorted(s.elapsed_time(e) for s, e in times)
        return values[len(values) // 2]

    def context_alive(self) -> bool:
        try:
            self.sync()
            return True
        except Exception:
            return False

    # ---- attention implementations, all taking (batch, seq, heads, d)
    def backend_context(self, backend):
        if backend in self.SDPA:
            return self.sdpa_kernel(self.SDPA[backend])
        if backend == "flashattn_cu_sm80":
            from flashattn_cu.testing import kernel_path
            return kernel_path("sm80")
        return contextlib.nullcontext()

    def attn_fn(self, backend, causal):
        F = self.F
        if backend in ("flashattn_cu", "flashattn_cu_sm80"):
            ours = self.ours

            def run(q, k, v):
                return ours(q, k, v, causal=causal)
        elif backend in self.SDPA:
            def run(q, k, v):
                return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      is_causal=causal)
        elif backend == "naive":
            def run(q, k, v):
                return self.naive_attention(q, k, v, causal)
        else:
            raise ValueError(backend)
        return run

    def causal_mask(self, seqlen_q, seqlen_k, device):
        key = (seqlen_q, seqlen_k)
        if key not in self._mask_cache:
            # bottom-right aligned, as flash_attn: query i sees keys j <= i + seqlen_k - seqlen_q
            self._mask_cache.clear()
            i = self.torch.arange(seqlen_q, device=device)[:, None]
            j = self.torch.arange(seqlen_k, device=device)[None, :]
            self._mask_cache[key] = j > i + (seqlen_k - seqlen_q)
        return self._mask_cache[key]

    def naive_attention(self, q, k, v, causal):
        torch = self.torch
        scale = q.shape[-1] ** -0.5
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        scores = torch.matmul(qt, kt.transpose(-2, -1)).mul_(scale)
        if causal:
            scores = scores.masked_fill_(self.causal_mask(q.shape[1], k.shape[1], q.device), float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, vt)

    def sdpa_in(self, q, k, v, causal, backends, enable_gqa=False):
        with self.sdpa_kernel(backends):
            out = self.F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      is_causal=causal, enable_gqa=enable_gqa)
        return out.transpose(1, 2)

    # ---- ceilings
    def measure_ceilings(self):
        torch = self.torch
        n = 8192
        a = torch.randn(n, n, device=self.device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=self.device, dtype=torch.bfloat16)
        ms = self.time_ms(lambda: torch.matmul(a, b))
        self.report.data["ceilings"]["matmul_tflops"] = 2 * n ** 3 / (ms * 1e-3) / 1e12
        a = b = None  # free before the copy test
        x = torch.empty(2**30, device=self.device, dtype=torch.bfloat16).normal_()
        y = torch.empty_like(x)
        ms = self.time_ms(lambda: y.copy_(x))
        self.report.data["ceilings"]["copy_tbps"] = 2 * x.numel() * x.element_size() / (ms * 1e-3) / 1e12
        x = y = None
        self.empty_cache()
        c = self.report.data["ceilings"]
        print(f"ceilings: bf16 matmul {c['matmul_tflops']:.0f} TFLOP/s, copy {c['copy_tbps']:.2f} TB/s")

    # ---- correctness
    def check_shape(self, dtype_name, d, seqlen, causal, q, k, v, want_grads):
        torch = self.torch
        rec = {"dtype": dtype_name, "d": d, "seqlen": seqlen, "causal": causal, "ok": True, "failures": []}
        if self.ours is None:  # nothing ran, so nothing is wrong: the table shows '-' and 'raised'
            rec["raised"] = f"import failed: {self.ours_error}"
            return rec

        def fail(what, err, tol):
            rec["ok"] = False
            rec["failures"].append({"what": what, "err": err, "tol": tol})

        leaves_ref = [x.detach().float().requires_grad_(want_grads) for x in (q, k, v)]
        with torch.set_grad_enabled(want_grads):
            out_ref = self.sdpa_in(*leaves_ref, causal, self.REF_BACKENDS)
        leaves_ours = [x.detach().clone().requires_grad_(want_grads) for x in (q, k, v)]
        try:
            with torch.set_grad_enabled(want_grads):
                out_ours = self.ours(*leaves_ours, causal=causal)
        except Exception as exc:
            rec["raised"] = short_error(exc)
            return rec
        rec["err_out"] = (out_ours.float() - out_ref).abs().max().item()
        pt = {}
        for name in ("sdpa_flash", "sdpa_efficient"):
            leaves = [x.detach().clone().requires_grad_(want_grads) for x in (q, k, v)]
            try:
                with torch.set_grad_enabled(want_grads):
                    pt[name] = (leaves, self.sdpa_in(*leaves, causal, self.SDPA[name]))
            except Exception:
                continue
        errs = [(o.float() - out_ref).abs().max().item() for _, o in pt.values()]
        rec["err_out_pt"] = max(errs) if errs else None
        if "sdpa_flash" in pt:
            rec["diff_vs_flash"] = (out_ours.float() - pt["sdpa_flash"][1].float()).abs().max().item()
        ref_scale = out_ref.abs().max().item()
        tol = 2 * rec["err_out_pt"] + 1e-5 if rec["err_out_pt"] is not None else 1e-2 * max(1.0, ref_scale)
        if not math.isfinite(rec["err_out"]) or rec["err_out"] > tol:
            fail("out", rec["err_out"], tol)

        if want_grads:
            dout = torch.randn_like(out_ours)
            grads_ref = torch.autograd.grad(out_ref, leaves_ref, dout.float())
            try:
                grads_ours = torch.autograd.grad(out_ours, leaves_ours, dout)
            except (NotImplementedError, RuntimeError) as exc:
                rec["grads"] = "bwd unavailable"
                rec["grad_error"] = short_error(exc)
                return rec
            grads_pt = []
            for leaves, o in pt.values():
                try:
                    grads_pt.append(torch.autograd.grad(o, leaves, dout))
                except Exception:
                    continue
            for idx, what in enumerate(("dq", "dk", "dv")):
                err = (grads_ours[idx].float() - grads_ref[idx]).abs().max().item()
                errs = [(g[idx].float() - grads_ref[idx]).abs().max().item() for g in grads_pt]
                tol = 3 * max(errs) + 1e-5 if errs else 2e-2 * max(1.0, grads_ref[idx].abs().max().item())
                rec[f"err_{what}"] = err
                rec[f"err_{what}_pt"] = max(errs) if errs else None
                if not math.isfinite(err) or err > tol:
                    fail(what, err, tol)
            rec["grads"] = "yes"
        else:
            rec["grads"] = "no"
        return rec

    # ---- one (shape, mode, backend)
    def time_one(self, backend, mode, q, k, v, causal):
        torch = self.torch
        fn = self.attn_fn(backend, causal)
        with self.backend_context(backend):
            if mode == "fwd":
                with torch.no_grad():
                    fn(q, k, v)  # probe: unsupported shapes raise here, outside the timer
                    return self.time_ms(lambda: fn(q, k, v))
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            out = fn(*leaves)
            dout = torch.randn_like(out)
            if mode == "bwd":
                out.backward(dout, retain_graph=True)
                return self.time_ms(lambda: out.backward(dout, retain_graph=True), grad_to_none=leaves)
            out = None  # only its shape was needed
            return self.time_ms(lambda: fn(*leaves).backward(dout), grad_to_none=leaves)

    def run_sweep(self):
        torch = self.torch
        args = self.args
        shapes = [(dn, d, s, c) for dn in args.dtypes for d in args.dims for s in args.seqlens for c in args.causal]
        for n, (dtype_name, d, seqlen, causal) in enumerate(shapes, 1):
            if self.over_budget():
                break
            dtype = self.dtypes[dtype_name]
            batch, nheads = args.tokens // seqlen, args.hidden // d
            gen = torch.Generator(device=self.device).manual_seed(args.seed + n)
            q, k, v = (torch.randn(batch, seqlen, nheads, d, device=self.device, dtype=dtype, generator=gen)
                       for _ in range(3))
            head = f"[{n}/{len(shapes)} {self.elapsed():4.0f}s] {dtype_name} d={d} s={seqlen} b={batch} h={nheads} " \
                   f"causal={int(causal)}"
            if not args.no_check:
                want_grads = seqlen <= args.check_grad_max_seqlen and any(m in args.modes for m in ("bwd", "fwdbwd"))
                try:
                    ck = self.check_shape(dtype_name, d, seqlen, causal, q, k, v, want_grads)
                except torch.cuda.OutOfMemoryError as exc:
                    ck = {"dtype": dtype_name, "d": d, "seqlen": seqlen, "causal": causal, "ok": True,
                          "failures": [], "grads": "skipped (OOM in check)", "error": short_error(exc)}
                self.report.data["checks"].append(ck)
                gc.collect()
                self.empty_cache()
                if ck.get("raised"):
                    print(f"{head} check: flashattn_cu raised: {ck['raised'][:200]}")
                elif not ck["ok"]:
                    print(f"{head} !!! WARNING: flashattn_cu is OFF for this shape: "
                          + "; ".join(f"{f['what']} err {f['err']:.3g} > tol {f['tol']:.3g}" for f in ck["failures"])
                          + (f" ({ck['error']})" if ck.get("error") else "")
                          + " -- its timings below are flagged '!'")
                else:
                    print(f"{head} check ok: out err {ck.get('err_out', float('nan')):.2e} "
                          f"(PyTorch {ck.get('err_out_pt') or float('nan'):.2e}), grads {ck.get('grads')}")
                if not self.context_alive():
                    raise RuntimeError("CUDA context died during the correctness check")
            for mode in args.modes:
                self.time_mode(dtype_name, d, seqlen, batch, nheads, causal, mode, q, k, v)
            del q, k, v
            gc.collect()
            self.empty_cache()
            self.report.write()

    def time_mode(self, dtype_name, d, seqlen, batch, nheads, causal, mode, q, k, v):
        """Times every backend on one (shape, mode) in --rounds interleaved rounds (A B C A B C
        ...), so that a drift of the GPU's clocks or power state during the sweep reaches all
        backends alike; each backend's time is the median of its rounds' medians."""
        torch = self.torch
        args = self.args
        rows, times = {}, {}
        for backend in args.backends:
            rows[backend] = dict(dtype=dtype_name, d=d, seqlen=seqlen, batch=batch, nheads=nheads,
                                 causal=causal, mode=mode, backend=backend, ms=None, tflops=None,
                                 error=None)
            times[backend] = []
            if backend == "naive" and seqlen > args.naive_max_seqlen:
                rows[backend]["error"] = f"skipped: seqlen > --naive-max-seqlen {args.naive_max_seqlen}"
            elif backend.startswith("flashattn_cu") and self.ours is None:
                rows[backend]["error"] = f"import failed: {self.ours_error}"
        timed = []
        for _ in range(max(1, args.rounds)):
            for backend in args.backends:
                row = rows[backend]
                if row["error"] is not None or self.over_budget():
                    continue
                if backend not in timed:
                    timed.append(backend)
                try:
                    times[backend].append(self.time_one(backend, mode, q, k, v, causal))
                except torch.cuda.OutOfMemoryError as exc:
                    row["error"] = "OOM: " + short_error(exc)
                except Exception as exc:
                    row["error"] = short_error(exc)
                    if backend == "flashattn_cu" and (mode, type(exc).__name__) not in self._noted:
                        self._noted.add((mode, type(exc).__name__))
                        kind = "not implemented" if isinstance(exc, NotImplementedError) else "raised"
                        self.report.note(f"flashattn_cu {mode} {kind} (first seen {dtype_name} d={d} "
                                         f"s={seqlen}): {row['error'][:160]}")
                    if not self.context_alive():
                        self.report.add_attn(**row)
                        raise RuntimeError(f"CUDA context died in {backend} {mode}: {row['error']}")
                gc.collect()
                self.empty_cache()
        parts = []
        for backend in timed:
            row = rows[backend]
            if row["error"] is None and times[backend]:
                row["ms"] = statistics.median(times[backend])
                row["ms_rounds"] = times[backend]
                row["tflops"] = tflops_of(attention_flops(batch, nheads, seqlen, seqlen, d, causal, mode),
                                          row["ms"])
            self.report.add_attn(**row)
            parts.append(f"{LABEL[backend]} {fmt(row['tflops'])}")
        for backend in args.backends:  # skipped or not importable (not: cut by the budget)
            if backend not in timed and rows[backend]["error"] is not None:
                self.report.add_attn(**rows[backend])
                parts.append(f"{LABEL[backend]} -")
        if parts:
            print(f"    {mode:6} TFLOP/s: " + ", ".join(parts))

    # ---- decode
    def run_decode(self):
        torch = self.torch
        batch, hq, hk, d = 8, 32, 8, 128
        group = hq // hk
        dtype = torch.bfloat16
        for seqlen_k in self.args.decode_seqlens:
            if self.over_budget():
                return
            gen = torch.Generator(device=self.device).manual_seed(self.args.seed + 1000 + seqlen_k)
            q = torch.randn(batch, 1, hq, d, device=self.device, dtype=dtype, generator=gen)
            k = torch.randn(batch, seqlen_k, hk, d, device=self.device, dtype=dtype, generator=gen)
            v = torch.randn(batch, seqlen_k, hk, d, device=self.device, dtype=dtype, generator=gen)
            bytes_kv = 2 * k.numel() * k.element_size()
            row = {"seqlen_k": seqlen_k, "batch": batch, "hq": hq, "hk": hk, "d": d, "bytes_kv": bytes_kv,
                   "results": {}}
            # fp32 reference: query head i uses kv head i // group
            qf = q[:, 0].float().view(batch, hk, group, d)
            scores = torch.einsum("bhgd,bshd->bhgs", qf, k.float()) * d ** -0.5
            ref = torch.einsum("bhgs,bshd->bhgd", scores.softmax(-1), v.float()).reshape(batch, 1, hq, d)
            del scores, qf
            outs = {}
            with torch.no_grad():
                if self.ours is not None:
                    try:
                        outs["flashattn_cu"] = self.ours(q, k, v)
                        row["results"]["flashattn_cu"] = {"ms": self.time_ms(lambda: self.ours(q, k, v))}
                    except Exception as exc:
                        row["results"]["flashattn_cu"] = {"ms": None, "error": short_error(exc)}
                for name in ("sdpa_flash", "sdpa_cudnn"):
                    res = {"ms": None}
                    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
                    with self.sdpa_kernel(self.SDPA[name]):
                        fn = None
                        try:
                            outs[name] = self.F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
                            fn = lambda: self.F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)  # noqa: E731
                            res["expanded"] = False
                        except Exception as exc:
                            res["gqa_error"] = short_error(exc)
                            try:
                                ke = kt.repeat_interleave(group, dim=1)
                                ve = vt.repeat_interleave(group, dim=1)
                                outs[name] = self.F.scaled_dot_product_attention(qt, ke, ve)
                                fn = lambda: self.F.scaled_dot_product_attention(qt, ke, ve)  # noqa: E731
                                res["expanded"] = True
                            except Exception as exc2:
                                res["error"] = short_error(exc2)
                        if fn is not None:
                            res["ms"] = self.time_ms(fn)
                        if name in outs:
                            outs[name] = outs[name].transpose(1, 2)
                    row["results"][name] = res
                    fn = None
                    gc.collect()
                    self.empty_cache()
            for r in row["results"].values():
                if r.get("ms"):
                    r["gbps"] = bytes_kv / (r["ms"] * 1e-3) / 1e9
            if "flashattn_cu" in outs:
                err = (outs["flashattn_cu"].float() - ref).abs().max().item()
                errs = [(o.float() - ref).abs().max().item() for n_, o in outs.items() if n_ != "flashattn_cu"]
                tol = 2 * max(errs) + 1e-5 if errs else 1e-2
                row["err"], row["err_pt"] = err, (max(errs) if errs else None)
                row["check"] = "ok" if math.isfinite(err) and err <= tol else f"OFF ({err:.2e} > {tol:.2e})"
                if row["check"] != "ok":
                    print(f"!!! WARNING: decode seqlen_k={seqlen_k}: flashattn_cu output is {row['check']}")
            self.report.data["decode"].append(row)
            text = ", ".join(f"{LABEL[n_]} {r['ms'] * 1e3:.0f} us {r['gbps']:.0f} GB/s" + (" (exp)" if r.get("expanded") else "")
                             for n_, r in row["results"].items() if r.get("ms"))
            print(f"decode seqlen_k={seqlen_k}: {text} check {row.get('check', '-')}")
            q = k = v = ref = outs = None
            gc.collect()
            self.empty_cache()
            self.report.write()

    # ---- memory
    def measure_peak(self, fn, q, k, v, with_backward):
        """Run fn once; return (extra MiB or 'OOM', ms). Inputs (and dout) count in the baseline."""
        torch = self.torch
        leaves = [x.detach().requires_grad_(with_backward) for x in (q, k, v)]
        dout = torch.randn_like(q) if with_backward else None
        self._mask_cache.clear()  # naive's causal mask is part of what it costs
        gc.collect()
        self.sync()
        self.empty_cache()
        base = self.memory_allocated()
        self.reset_peak()
        start, end = self.Event(), self.Event()
        oom = None
        try:
            start.record()
            if with_backward:
                out = fn(*leaves)
                if out.shape != dout.shape:  # naive returns (b, h, s, d)
                    out = out.transpose(1, 2)
                out.backward(dout)
            else:
                with torch.no_grad():
                    out = fn(*leaves)
            end.record()
            self.sync()
            del out
        except torch.cuda.OutOfMemoryError as exc:
            oom = short_error(exc)
        peak = self.max_memory_allocated() - base
        for t in leaves:
            t.grad = None
        del leaves, dout
        gc.collect()
        self.empty_cache()
        if oom:
            return f"OOM (>{peak / 2**20:,.0f} MiB allocated before failing)", "-", None
        ms = start.elapsed_time(end)
        return f"{peak / 2**20:,.0f}", f"{ms:.1f}", peak

    def run_memory(self):
        torch = self.torch
        nheads, d, dtype = 16, 128, torch.bfloat16
        mem = self.report.data["memory"]
        peaks = {}
        plan = [("naive", s) for s in self.args.mem_naive_seqlens]
        if self.ours is not None:
            plan += [("flashattn_cu", s) for s in self.args.mem_ours_seqlens]
        fns = {"naive": self.attn_fn("naive", True)}
        if self.ours is not None:
            fns["flashattn_cu"] = self.attn_fn("flashattn_cu", True)
            small = torch.randn(1, 256, nheads, d, device=self.device, dtype=dtype)
            try:
                self.ours(small, small, small, causal=True)  # module load outside the measurement
            except Exception:
                pass
            del small
        for impl, seqlen in plan:
            if self.over_budget():
                break
            gen = torch.Generator(device=self.device).manual_seed(self.args.seed + 2000 + seqlen)
            q, k, v = (torch.randn(1, seqlen, nheads, d, device=self.device, dtype=dtype, generator=gen) for _ in range(3))
            row = {"impl": impl, "seqlen": seqlen}
            for label, with_bwd in (("fwd", False), ("fwdbwd", True)):
                try:
                    text, ms, peak = self.measure_peak(fns[impl], q, k, v, with_bwd)
                except Exception as exc:
                    text, ms, peak = "error: " + short_error(exc)[:80], "-", None
                    if not self.context_alive():
                        raise
                row[f"{label}_mib"], row[f"{label}_ms"] = text, ms
                peaks[(impl, seqlen, label)] = peak
            mem["rows"].append(row)
            print(f"memory {impl:12} s={seqlen:6}: fwd extra MiB {row['fwd_mib']} (ms {row['fwd_ms']}), "
                  f"fwd+bwd extra MiB {row['fwdbwd_mib']} (ms {row['fwdbwd_ms']})")
            del q, k, v
            gc.collect()
            self.empty_cache()
            self.report.write()
        mem["sentences"] = memory_sentences(peaks)


# --------------------------------------------------------------------------------------------
# metadata and dry run


def collect_meta(args, dry: bool) -> dict:
    commit, source = git_commit()
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "commit": commit,
        "commit_source": source,
        "python": platform.python_version(),
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "host": platform.node(),
        "dry_run": args.dry_run,
        "cpu_smoke": args.cpu_smoke,
    }
    import torch
    meta["torch"] = torch.__version__
    meta["cuda"] = torch.version.cuda
    try:
        meta["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        meta["cudnn"] = None
    try:
        import triton
        meta["triton"] = triton.__version__
    except Exception:
        meta["triton"] = "not installed"
    if dry:
        what = "CPU smoke run" if args.cpu_smoke else "dry run"
        meta.update(gpu=f"none ({what})", sm_count="-", capability="-", driver="-", clocks="-")
        return meta
    props = torch.cuda.get_device_properties(0)
    meta["gpu"] = props.name
    meta["sm_count"] = props.multi_processor_count
    meta["capability"] = f"{props.major}.{props.minor}"
    meta["gpu_mem_gib"] = round(props.total_memory / 2**30, 1)
    meta["driver"] = nvidia_smi_query("driver_version")
    meta["clocks"] = nvidia_smi_query("clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw")
    return meta


def default_name(meta: dict, args) -> str:
    gpu = str(meta.get("gpu", "gpu")).lower().replace("nvidia", "").strip()
    gpu = "".join(ch if ch.isalnum() else "-" for ch in gpu).strip("-") or "gpu"
    commit = "".join(ch if ch.isalnum() or ch in "-+" else "-" for ch in str(meta.get("commit")))
    name = f"{gpu}_{commit}".replace("+", "-")
    if args.dry_run:
        name = "dryrun_" + commit.replace("+", "-")
    elif args.cpu_smoke:
        name = "cpusmoke_" + commit.replace("+", "-")
    if args.quick:
        name += "_quick"
    return name


def fabricate(report: Report, args):
    """Fill the report with made-up numbers of the right magnitude (dry run only)."""
    rng = random.Random(args.seed)
    report.data["ceilings"] = {"matmul_tflops": 700.0 + rng.uniform(-20, 20), "copy_tbps": 4.3}
    base = {"flashattn_cu": 300, "sdpa_flash": 320, "sdpa_cudnn": 550, "sdpa_efficient": 160, "naive": 40}
    for dtype in args.dtypes:
        for d in args.dims:
            for seqlen in args.seqlens:
                for causal in args.causal:
                    batch, nheads = args.tokens // seqlen, args.hidden // d
                    ck = {"dtype": dtype, "d": d, "seqlen": seqlen, "causal": causal, "ok": True, "failures": [],
                          "err_out": rng.uniform(1e-3, 4e-3), "err_out_pt": 2e-3, "diff_vs_flash": 3e-3,
                          "grads": "yes" if seqlen <= args.check_grad_max_seqlen else "no"}
                    if (d, seqlen, causal) == (args.dims[-1], args.seqlens[0], args.causal[-1]) and dtype == args.dtypes[-1]:
                        ck["ok"] = False  # show what a failed check looks like
                        ck["failures"] = [{"what": "out", "err": 0.5, "tol": 4e-3}]
                    report.data["checks"].append(ck)
                    for mode in args.modes:
                        for b in args.backends:
                            tf = None
                            err = None
                            if b == "naive" and seqlen > args.naive_max_seqlen:
                                err = "skipped"
                            elif b == "flashattn_cu" and mode != "fwd" and d == 256:
                                err = "NotImplementedError: fabricated"
                            else:
                                tf = base[b] * rng.uniform(0.7, 1.1) * (0.8 if causal else 1.0) * (0.85 if mode != "fwd" else 1)
                            flops = attention_flops(batch, nheads, seqlen, seqlen, d, causal, mode)
                            report.add_attn(dtype=dtype, d=d, seqlen=seqlen, batch=batch, nheads=nheads, causal=causal,
                                            mode=mode, backend=b, ms=(flops / tf / 1e9 if tf else None), tflops=tf,
                                            error=err)
    for seqlen_k in args.decode_seqlens:
        bytes_kv = 2 * 8 * seqlen_k * 8 * 128 * 2
        results = {}
        for b, gbps in (("flashattn_cu", 3500), ("sdpa_flash", 4000), ("sdpa_cudnn", 4100)):
            g = gbps * rng.uniform(0.6, 1.0)
            results[b] = {"ms": bytes_kv / g / 1e6, "gbps": g, "expanded": False}
        report.data["decode"].append({"seqlen_k": seqlen_k, "bytes_kv": bytes_kv, "results": results, "check": "ok"})
    peaks = {}
    for s in args.mem_naive_seqlens:
        n = 16 * s * s
        peaks[("naive", s, "fwd")] = 8 * n
        peaks[("naive", s, "fwdbwd")] = 16 * n if s <= 8192 else None
        report.data["memory"]["rows"].append({"impl": "naive", "seqlen": s, "fwd_mib": f"{8 * n / 2**20:,.0f}",
                                              "fwd_ms": "12.0", "fwdbwd_mib": f"{16 * n / 2**20:,.0f}" if s <= 8192 else "OOM",
                                              "fwdbwd_ms": "40.0" if s <= 8192 else "-"})
    for s in args.mem_ours_seqlens:
        per = s * 16 * 128 * 2
        peaks[("flashattn_cu", s, "fwd")] = per + s * 16 * 4
        peaks[("flashattn_cu", s, "fwdbwd")] = 5 * per
        report.data["memory"]["rows"].append({"impl": "flashattn_cu", "seqlen": s, "fwd_mib": f"{per / 2**20:,.0f}",
                                              "fwd_ms": "1.0", "fwdbwd_mib": f"{5 * per / 2**20:,.0f}", "fwdbwd_ms": "3.0"})
    report.data["memory"]["sentences"] = memory_sentences(peaks)
    report.note("dry run: every number in this report is fabricated")


# --------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = resolve_args(argv)
    warnings.filterwarnings("ignore", category=UserWarning)
    if args.dry_run or args.cpu_smoke:
        what = "dryrun" if args.dry_run else "cpusmoke"
        out_dir = Path(tempfile.mkdtemp(prefix=f"flashattn_cu_bench_{what}_"))
        if args.out_dir:
            print(f"{'--dry-run' if args.dry_run else '--cpu-smoke'} ignores --out-dir {args.out_dir}; "
                  f"writing to {out_dir}")
    else:
        out_dir = Path(args.out_dir) if args.out_dir else REPO_ROOT / "benchmarks" / "results"
        import torch
        if not torch.cuda.is_available():
            print("error: no CUDA device; use --dry-run to exercise the report code without a GPU")
            return 2
    meta = collect_meta(args, args.dry_run or args.cpu_smoke)
    name = args.name or default_name(meta, args)
    report = Report(args, out_dir, name, meta)
    print(f"flashattn_cu bench -> {out_dir}/{name}.{{md,json,png}}; commit {meta['commit']}; gpu {meta.get('gpu')}; "
          f"torch {meta['torch']}")
    print(f"shapes: dtypes {args.dtypes}, dims {args.dims}, seqlens {args.seqlens}, causal {args.causal}, "
          f"modes {args.modes}, backends {args.backends}; warmup {args.warmup} ms, rep {args.rep} ms")

    if args.dry_run:
        fabricate(report, args)
        report.data["status"] = "complete (dry run)"
        report.write(final=True)
        for line in report.summary_lines():
            print(line)
        print(f"dry run outputs in {out_dir}: {', '.join(sorted(p.name for p in out_dir.iterdir()))}")
        return 0

    signal.signal(signal.SIGTERM, _on_sigterm)
    rc = 0
    bench = None
    try:
        import torch
        torch.manual_seed(args.seed)
        bench = Bench(args, report)
        if not args.no_ceilings:
            bench.measure_ceilings()
        bench.run_sweep()
        if not args.no_decode:
            bench.run_decode()
        if not args.no_memory:
            bench.run_memory()
        report.data["status"] = "partial (time budget)" if bench.budget_hit else "complete"
    except Stop as exc:
        report.data["status"] = f"interrupted ({exc})"
        rc = 143
    except KeyboardInterrupt:
        report.data["status"] = "interrupted (keyboard)"
        rc = 130
    except Exception as exc:
        report.data["status"] = f"aborted: {short_error(exc)}"
        traceback.print_exc()
        print(f"error: {short_error(exc)}")
        alive = bench.context_alive() if bench is not None else True
        rc = 1 if alive else 4
    elapsed = time.monotonic() - bench.t0 if bench is not None else 0.0
    report.data["meta"]["elapsed_s"] = round(elapsed, 1)
    report.write(final=True)
    print()
    for line in report.summary_lines():
        print(line)
    print(f"SUMMARY wall time {elapsed:.0f} s; results in {report.path('.md')}")
    if rc == 0 and any(not ck["ok"] for ck in report.data["checks"]):
        rc = 3
    if rc == 0 and any(row.get("check", "ok") != "ok" for row in report.data["decode"]):
        rc = 3
    return rc


if __name__ == "__main__":
    sys.exit(main())
