"""The metadata of a benchmarks/bench.py run (commit, GPU, library versions, its outputs' default
name) and the dry run's fabricated numbers, which exercise the report code without a GPU."""
from __future__ import annotations

import datetime as dt
import os
import platform
import random
import subprocess
import sys
from pathlib import Path

from bench_args import attention_flops
from bench_report import Report, memory_sentences

REPO_ROOT = Path(__file__).resolve().parents[1]


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
