"""The two short sections of a benchmarks/bench.py run after the sweep: decode (seqlen_q 1, GQA,
a long KV cache; GB/s of K and V read) and peak memory (flashattn_cu against naive attention at
long sequences). A mixin of bench.Bench, whose timers, backends and report they use."""
from __future__ import annotations

import gc
import math

from bench_report import LABEL, memory_sentences, short_error


class DecodeAndMemory:
    """Bench's decode and memory sections (run_decode, run_memory)."""

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
