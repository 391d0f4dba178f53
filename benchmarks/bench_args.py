"""What a benchmarks/bench.py run measures: its command line (the defaults of the full, quick
and CPU-smoke sweeps, the checks on the values) and flash_attn's FLOP count of a shape."""
from __future__ import annotations

import argparse

from bench_report import BACKENDS

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
# FLOP count


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
