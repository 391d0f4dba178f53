"""The report of benchmarks/bench.py: its tables (markdown), data (JSON) and charts (PNG), the
number formatting they share, and the memory section's sentences. bench.py measures and fills a
Report; `bench.py --dry-run` fills one with fabricated numbers, which exercises this module
without a GPU."""
from __future__ import annotations

import json
import math
from pathlib import Path

BACKENDS = ("flashattn_cu", "flashattn_cu_sm80", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "naive")
LABEL = {
    "flashattn_cu": "flashattn_cu",
    "flashattn_cu_sm80": "ours (sm80 path)",
    "sdpa_flash": "SDPA flash",
    "sdpa_cudnn": "cuDNN",
    "sdpa_efficient": "efficient",
    "naive": "naive",
}
COLOR = {
    "flashattn_cu": "#d62728",
    "flashattn_cu_sm80": "#ff9896",
    "sdpa_flash": "#1f77b4",
    "sdpa_cudnn": "#2ca02c",
    "sdpa_efficient": "#9467bd",
    "naive": "#7f7f7f",
}


def fmt(value, digits=0, missing="-"):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return missing
    return f"{value:.{digits}f}"


def sci(value):
    return "-" if value is None else f"{value:.2e}"


def fmt_ratio(value):
    return "-" if value is None else f"{value:.2f}"


def fmt_seqlen(s: int) -> str:
    if s >= 2**20:
        return f"{s / 2**20:.1f}M"
    return f"{s // 1024}k" if s >= 1024 and s % 1024 == 0 else str(s)


def geomean(values):
    values = [v for v in values if v is not None and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text[:300]


class Report:
    def __init__(self, args, out_dir: Path, name: str, meta: dict):
        self.args = args
        self.out_dir = out_dir
        self.name = name
        self.data = {
            "meta": meta,
            "ceilings": {},
            "checks": [],
            "attn": [],
            "decode": [],
            "memory": {"rows": [], "sentences": []},
            "notes": [],
            "status": "running",
        }

    # ---- recording
    def add_attn(self, **row):
        self.data["attn"].append(row)

    def note(self, text: str):
        if text not in self.data["notes"]:
            self.data["notes"].append(text)
            print(f"  note: {text}")

    def attn_value(self, dtype, d, seqlen, causal, mode, backend):
        for row in self.data["attn"]:
            if (row["dtype"], row["d"], row["seqlen"], row["causal"], row["mode"], row["backend"]) == (
                    dtype, d, seqlen, causal, mode, backend):
                return row
        return None

    def check_for(self, dtype, d, seqlen, causal):
        for c in self.data["checks"]:
            if (c["dtype"], c["d"], c["seqlen"], c["causal"]) == (dtype, d, seqlen, causal):
                return c
        return None

    # ---- paths
    def path(self, suffix: str) -> Path:
        return self.out_dir / f"{self.name}{suffix}"

    # ---- writers
    def write(self, final=False):
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path(".json"))
        tmp = self.path(".md.tmp")
        tmp.write_text(self.markdown())
        tmp.replace(self.path(".md"))
        if final and not self.args.no_plot:
            try:
                self.plots()
            except Exception as exc:  # a chart must never cost the numbers
                print(f"warning: could not draw charts: {short_error(exc)}")

    def ratios(self, dtype, mode, versus):
        """flashattn_cu / versus TFLOP/s over shapes, leaving out shapes whose check failed."""
        out = []
        for row in self.data["attn"]:
            if row["dtype"] != dtype or row["mode"] != mode or row["backend"] != "flashattn_cu":
                continue
            ck = self.check_for(dtype, row["d"], row["seqlen"], row["causal"])
            if ck is not None and not ck["ok"]:
                continue
            other = self.attn_value(dtype, row["d"], row["seqlen"], row["causal"], mode, versus)
            if row["tflops"] and other and other["tflops"]:
                out.append(row["tflops"] / other["tflops"])
        return out

    def markdown(self) -> str:
        m = self.data["meta"]
        c = self.data["ceilings"]
        lines = []
        title = "flashattn_cu benchmark" + (" (DRY RUN: fabricated numbers)" if m.get("dry_run") else "") + (
            " (CPU SMOKE RUN: host timings of tiny shapes, not GPU numbers)" if m.get("cpu_smoke") else "")
        lines.append(f"# {title}: {self.name}")
        lines.append("")
        lines.append(f"- GPU: {m.get('gpu')} ({m.get('sm_count')} SMs, compute capability {m.get('capability')})"
                     f"; driver {m.get('driver')}; clocks at start: {m.get('clocks')}")
        lines.append(f"- torch {m.get('torch')}, CUDA {m.get('cuda')}, cuDNN {m.get('cudnn')}, "
                     f"triton {m.get('triton')}, Python {m.get('python')}")
        lines.append(f"- flashattn_cu commit: {m.get('commit')} (from {m.get('commit_source')})")
        lines.append(f"- date: {m.get('date')}")
        lines.append(f"- command: `{m.get('command')}`")
        lines.append(f"- timing: median of {m.get('timer', 'triton.testing.do_bench')} (warmup {self.args.warmup} ms, "
                     f"rep {self.args.rep} ms, L2 flushed before each call), then the median of "
                     f"{getattr(self.args, 'rounds', 1)} interleaved rounds (each backend once a round, in turn); TFLOP/s with flash_attn's FLOP count "
                     f"(fwd 4*b*h*s*s*d, halved when causal; bwd 2.5x, fwd+bwd 3.5x)")
        if c:
            lines.append(f"- ceilings measured in this run: bf16 matmul 8192^3 {fmt(c.get('matmul_tflops'))} TFLOP/s; "
                         f"device-to-device copy {fmt(c.get('copy_tbps'), 2)} TB/s (read + write)")
        lines.append(f"- status: {self.data['status']}")
        lines.append("")
        lines.append(f"Shapes: batch = {self.args.tokens} // seqlen, nheads = {self.args.hidden} // d; SDPA gets (batch, heads, seq, d) views "
                     "of the same (batch, seq, heads, d) tensors. '-' = backend raised (unsupported, OOM, not "
                     "implemented) or not run; the JSON keeps the error text. 'ours/FA2' = flashattn_cu / SDPA flash, "
                     "'ours/cuDNN' = flashattn_cu / SDPA cuDNN (TFLOP/s ratios, >1 means flashattn_cu is faster).")
        lines.append("")

        bad = [ck for ck in self.data["checks"] if not ck.get("ok", True)]
        if bad:
            lines.append("## WARNING: correctness checks failed")
            lines.append("")
            lines.append("Numbers for these shapes are flagged `!` below. Do not quote them.")
            lines.append("")
            lines.append("| dtype | d | seqlen | causal | what | err flashattn_cu | tolerance |")
            lines.append("|---|---|---|---|---|---|---|")
            for ck in bad:
                for item in ck.get("failures", []):
                    lines.append(f"| {ck['dtype']} | {ck['d']} | {ck['seqlen']} | {int(ck['causal'])} | "
                                 f"{item['what']} | {item['err']:.3g} | {item['tol']:.3g} |")
            lines.append("")

        backends = [b for b in BACKENDS if b in self.args.backends]
        for dtype in self.args.dtypes:
            for mode in self.args.modes:
                rows = [r for r in self.data["attn"] if r["dtype"] == dtype and r["mode"] == mode]
                if not rows:
                    continue
                lines.append(f"## {dtype} {mode}: TFLOP/s")
                lines.append("")
                head = ["d", "seqlen", "causal"] + [LABEL[b] for b in backends] + ["ours/FA2", "ours/cuDNN", "check"]
                lines.append("| " + " | ".join(head) + " |")
                lines.append("|" + "---|" * len(head))
                for d in self.args.dims:
                    for seqlen in self.args.seqlens:
                        for causal in self.args.causal:
                            cells = []
                            found = False
                            for b in backends:
                                row = self.attn_value(dtype, d, seqlen, causal, mode, b)
                                found |= row is not None
                                cells.append(fmt(row["tflops"]) if row else "-")
                            if not found:
                                continue
                            ck = self.check_for(dtype, d, seqlen, causal)
                            flag = ck is not None and not ck.get("ok", True)
                            if flag and "flashattn_cu" in backends:
                                i = backends.index("flashattn_cu")
                                cells[i] = cells[i] + " !"
                            ours = self.attn_value(dtype, d, seqlen, causal, mode, "flashattn_cu")
                            ratios = []
                            for versus in ("sdpa_flash", "sdpa_cudnn"):
                                other = self.attn_value(dtype, d, seqlen, causal, mode, versus)
                                if ours and ours["tflops"] and other and other["tflops"]:
                                    ratios.append(fmt_ratio(ours["tflops"] / other["tflops"]))
                                else:
                                    ratios.append("-")
                            check_text = ("-" if ck is None else "OFF" if not ck["ok"]
                                          else "raised" if ck.get("raised") else "ok")
                            lines.append("| " + " | ".join([str(d), str(seqlen), str(int(causal))] + cells
                                                           + ratios + [check_text]) + " |")
                gf = geomean(self.ratios(dtype, mode, "sdpa_flash"))
                gc_ = geomean(self.ratios(dtype, mode, "sdpa_cudnn"))
                lines.append("")
                lines.append(f"Geometric mean over shapes (failed checks left out): ours/FA2 {fmt_ratio(gf)}, "
                             f"ours/cuDNN {fmt_ratio(gc_)}.")
                lines.append("")

        if self.data["checks"]:
            lines.append("## Correctness checks (max abs error against an fp32 SDPA reference)")
            lines.append("")
            lines.append("Rule (as in the tests): err(flashattn_cu) <= 2 x err(PyTorch kernel in the same dtype) "
                         "+ 1e-5 for the output, 3x for gradients; the PyTorch error is the larger of SDPA flash "
                         "and SDPA efficient. 'vs FA2' is max|flashattn_cu - SDPA flash| on the same inputs.")
            lines.append("")
            lines.append("| dtype | d | seqlen | causal | out err | PyTorch err | vs FA2 | grads checked | result |")
            lines.append("|---|---|---|---|---|---|---|---|---|")
            for ck in self.data["checks"]:
                lines.append(f"| {ck['dtype']} | {ck['d']} | {ck['seqlen']} | {int(ck['causal'])} | "
                             f"{sci(ck.get('err_out'))} | {sci(ck.get('err_out_pt'))} | {sci(ck.get('diff_vs_flash'))} | "
                             f"{ck.get('grads', '-')} | {'ok' if ck['ok'] else 'OFF'} |")
            lines.append("")

        if self.data["decode"]:
            lines.append("## Decode: seqlen_q = 1, batch 8, 32 query heads, 8 kv heads, d = 128, bf16")
            lines.append("")
            lines.append("GB/s = bytes of K and V (the 8 kv heads, read once) / median time. '(expanded)' marks SDPA "
                         "runs that needed K and V repeated to 32 heads, which reads 4x those bytes.")
            lines.append("")
            lines.append("| seqlen_k | KV MiB | flashattn_cu | SDPA flash | cuDNN | ours/FA2 | ours/cuDNN | check |")
            lines.append("|---|---|---|---|---|---|---|---|")
            for row in self.data["decode"]:
                cells = []
                for b in ("flashattn_cu", "sdpa_flash", "sdpa_cudnn"):
                    r = row["results"].get(b, {})
                    if r.get("ms") is None:
                        cells.append("-")
                    else:
                        tag = " (expanded)" if r.get("expanded") else ""
                        cells.append(f"{r['ms'] * 1e3:.0f} us, {r['gbps']:.0f} GB/s{tag}")
                ours = row["results"].get("flashattn_cu", {}).get("ms")
                ratios = []
                for b in ("sdpa_flash", "sdpa_cudnn"):
                    other = row["results"].get(b, {}).get("ms")
                    ratios.append(fmt_ratio(other / ours) if ours and other else "-")
                lines.append(f"| {row['seqlen_k']} | {row['bytes_kv'] / 2**20:.0f} | " + " | ".join(cells) + " | "
                             + " | ".join(ratios) + f" | {row.get('check', '-')} |")
            lines.append("")

        mem = self.data["memory"]
        if mem["rows"]:
            lines.append("## Peak memory: batch 1, 16 heads, d = 128, causal, bf16")
            lines.append("")
            lines.append("Extra memory = torch.cuda.max_memory_allocated() during the call minus the memory "
                         "allocated before it (q, k, v and, for fwd+bwd, dout already counted in the baseline). "
                         "The forward runs under no_grad; fwd+bwd includes the three gradients.")
            lines.append("")
            lines.append("| impl | seqlen | fwd extra MiB | fwd ms | fwd+bwd extra MiB | fwd+bwd ms |")
            lines.append("|---|---|---|---|---|---|")
            for row in mem["rows"]:
                lines.append(f"| {row['impl']} | {row['seqlen']} | {row['fwd_mib']} | {row['fwd_ms']} | "
                             f"{row['fwdbwd_mib']} | {row['fwdbwd_ms']} |")
            lines.append("")
            for sentence in mem["sentences"]:
                lines.append(f"- {sentence}")
            lines.append("")

        if self.data["notes"]:
            lines.append("## Notes")
            lines.append("")
            for n in self.data["notes"]:
                lines.append(f"- {n}")
            lines.append("")
        return "\n".join(lines)

    def plots(self):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        backends = [b for b in BACKENDS if b in self.args.backends]
        ceiling = self.data["ceilings"].get("matmul_tflops")
        written = []
        for mode in ("fwd", "bwd"):
            if mode not in self.args.modes:
                continue
            panels = [(dtype, d) for dtype in self.args.dtypes for d in self.args.dims
                      if any(r["dtype"] == dtype and r["d"] == d and r["mode"] == mode for r in self.data["attn"])]
            if not panels:
                continue
            ncols = len(self.args.causal)
            fig, axes = plt.subplots(len(panels), ncols, figsize=(6.5 * ncols, 3.4 * len(panels)), squeeze=False)
            width = 0.8 / max(1, len(backends))
            for i, (dtype, d) in enumerate(panels):
                for j, causal in enumerate(self.args.causal):
                    ax = axes[i][j]
                    for k, b in enumerate(backends):
                        xs, ys = [], []
                        for x, seqlen in enumerate(self.args.seqlens):
                            row = self.attn_value(dtype, d, seqlen, causal, mode, b)
                            if row and row["tflops"]:
                                xs.append(x + (k - (len(backends) - 1) / 2) * width)
                                ys.append(row["tflops"])
                        bars = ax.bar(xs, ys, width=width, color=COLOR[b], label=LABEL[b])
                        if b == "flashattn_cu":  # hatch the bars of shapes whose correctness check failed
                            kept = [s for s in self.args.seqlens
                                    if (self.attn_value(dtype, d, s, causal, mode, b) or {}).get("tflops")]
                            for bar, seqlen in zip(bars, kept):
                                ck = self.check_for(dtype, d, seqlen, causal)
                                if ck is not None and not ck["ok"]:
                                    bar.set_hatch("xx")
                                    bar.set_edgecolor("black")
                    if ceiling:
                        ax.axhline(ceiling, color="black", linestyle="--", linewidth=0.8,
                                   label=f"bf16 matmul ({ceiling:.0f})")
                    ax.set_xticks(range(len(self.args.seqlens)))
                    ax.set_xticklabels([fmt_seqlen(s) for s in self.args.seqlens])
                    ax.set_title(f"{mode} {dtype} d={d} {'causal' if causal else 'non-causal'}", fontsize=10)
                    ax.set_ylabel("TFLOP/s")
                    ax.grid(axis="y", alpha=0.3)
                    if i == 0 and j == 0:
                        ax.legend(fontsize=7, ncol=2)
            gpu = self.data["meta"].get("gpu")
            dry = " (DRY RUN: fabricated)" if self.data["meta"].get("dry_run") else ""
            dry += " (CPU SMOKE RUN)" if self.data["meta"].get("cpu_smoke") else ""
            fig.suptitle(f"{mode} TFLOP/s on {gpu}, flashattn_cu {self.data['meta'].get('commit')}{dry}", fontsize=12)
            fig.tight_layout(rect=(0, 0, 1, 0.98))
            path = self.path(f"_{mode}.png")
            fig.savefig(path, dpi=100)
            plt.close(fig)
            written.append(path)
        return written

    def summary_lines(self) -> list[str]:
        """Compact stdout summary; every line starts with SUMMARY so scripts can grep it."""
        out = []
        out.append(f"SUMMARY {self.name}: {self.data['meta'].get('gpu')}, commit {self.data['meta'].get('commit')}, "
                   f"status {self.data['status']}")
        c = self.data["ceilings"]
        if c:
            out.append(f"SUMMARY ceilings: matmul {fmt(c.get('matmul_tflops'))} TFLOP/s, "
                       f"copy {fmt(c.get('copy_tbps'), 2)} TB/s")
        out.append(f"SUMMARY {'dtype':5} {'mode':7} {'shapes':>6} {'ours/FA2 geo [min..max]':>26} "
                   f"{'ours/cuDNN geo [min..max]':>27} {'best ours TFLOP/s':>18}")
        for dtype in self.args.dtypes:
            for mode in self.args.modes:
                ours = [r for r in self.data["attn"] if r["dtype"] == dtype and r["mode"] == mode
                        and r["backend"] == "flashattn_cu"]
                if not ours:
                    continue
                parts = []
                for versus in ("sdpa_flash", "sdpa_cudnn"):
                    rs = self.ratios(dtype, mode, versus)
                    if rs:
                        parts.append(f"{geomean(rs):.2f} [{min(rs):.2f}..{max(rs):.2f}]")
                    else:
                        parts.append("-")
                best = max((r["tflops"] for r in ours if r["tflops"]), default=None)
                timed = sum(1 for r in ours if r["tflops"])
                out.append(f"SUMMARY {dtype:5} {mode:7} {timed:>3}/{len(ours):<2} {parts[0]:>26} {parts[1]:>27} "
                           f"{fmt(best):>18}")
        dtype = self.args.dtypes[0] if self.args.dtypes else "bf16"
        key_d = 128 if 128 in self.args.dims else (self.args.dims[0] if self.args.dims else None)
        key_s = [s for s in (8192, 16384) if s in self.args.seqlens] or self.args.seqlens[-1:]
        for mode in self.args.modes:
            for seqlen in key_s:
                for causal in self.args.causal:
                    vals = {b: self.attn_value(dtype, key_d, seqlen, causal, mode, b) for b in BACKENDS}
                    if not vals["flashattn_cu"]:
                        continue
                    text = ", ".join(f"{LABEL[b]} {fmt(v['tflops'])}" for b, v in vals.items()
                                     if v and b != "naive")
                    out.append(f"SUMMARY key {dtype} {mode} d={key_d} s={fmt_seqlen(seqlen)} causal={int(causal)}: "
                               f"{text}")
        n_bad = sum(1 for ck in self.data["checks"] if not ck["ok"])
        out.append(f"SUMMARY checks: {len(self.data['checks'])} shapes checked, {n_bad} OFF")
        for row in self.data["decode"]:
            r = row["results"]
            text = ", ".join(f"{LABEL[b]} {r[b]['gbps']:.0f} GB/s" for b in ("flashattn_cu", "sdpa_flash", "sdpa_cudnn")
                             if r.get(b, {}).get("gbps"))
            out.append(f"SUMMARY decode seqlen_k={row['seqlen_k']}: {text or '-'}")
        for sentence in self.data["memory"]["sentences"]:
            out.append(f"SUMMARY memory: {sentence}")
        return out


def memory_sentences(peaks: dict) -> list[str]:
    """peaks: (impl, seqlen, 'fwd'|'fwdbwd') -> bytes or None (OOM)."""
    out = []
    for label, words in (("fwd", "forward"), ("fwdbwd", "forward+backward")):
        naive = sorted((s, p) for (impl, s, lab), p in peaks.items() if impl == "naive" and lab == label)
        ours = sorted((s, p) for (impl, s, lab), p in peaks.items()
                      if impl == "flashattn_cu" and lab == label and p is not None)
        for s, p in naive:
            if p is None:
                out.append(f"{words}: naive at {fmt_seqlen(s)} ran out of memory.")
                continue
            fits = [(s2, p2) for s2, p2 in ours if p2 <= p]
            if not fits:
                if ours:
                    out.append(f"{words}: naive at {fmt_seqlen(s)} used {p / 2**20:,.0f} MiB; every measured "
                               f"flashattn_cu size used more.")
                continue
            s2, p2 = max(fits)
            text = (f"{words}: naive at {fmt_seqlen(s)} used {p / 2**20:,.0f} MiB; flashattn_cu at "
                    f"{fmt_seqlen(s2)} used {p2 / 2**20:,.0f} MiB")
            if s2 == ours[-1][0] and p2 > 0:
                # the longest size measured still fits; flashattn_cu's memory is linear in seqlen, so extrapolate
                estimate = int(s2 * p / p2)
                estimate = estimate // 1024 * 1024 if estimate >= 4096 else estimate
                text += (f" (the longest measured; linear scaling puts about "
                         f"{fmt_seqlen(estimate)} tokens in naive's {fmt_seqlen(s)} memory)")
            out.append(text + ".")
    return out
