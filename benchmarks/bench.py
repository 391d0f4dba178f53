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

Two short sections follow (bench_sections.py): decode (seqlen_q = 1, GQA, long KV; reported as
GB/s of K and V read) and peak memory (flashattn_cu against naive attention at long sequence
lengths). The command line and the FLOP count are bench_args.py's, the run's metadata and the dry
run's numbers bench_meta.py's, the tables and charts bench_report.py's.

Outputs, under --out-dir (default benchmarks/results): <name>.md, <name>.json and
<name>_fwd.png / <name>_bwd.png.  The markdown and JSON are rewritten after every shape, so a
run that is killed still leaves what it measured.  --dry-run fabricates numbers without a GPU
and writes only into a fresh temporary directory, to exercise the report code.

Exit status: 0 ok; 3 when a correctness check failed (numbers are still written, flagged);
4 when the CUDA context died; 143 when stopped by SIGTERM.
"""
from __future__ import annotations

import contextlib
import gc
import math
import signal
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

from bench_args import attention_flops, resolve_args, tflops_of
from bench_meta import collect_meta, default_name, fabricate
from bench_report import LABEL, Report, fmt, short_error
from bench_sections import DecodeAndMemory

REPO_ROOT = Path(__file__).resolve().parents[1]


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


class Bench(DecodeAndMemory):
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
