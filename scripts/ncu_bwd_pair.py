"""One backward (or, with --mode fwd, one forward) of flashattn_cu or of FlashAttention-4
(flash_attn.cute, brought by ../shared/tools/fa4_anchor.sh) inside a CUDA profiler range, for ncu
with --profile-from-start off (scripts/ncu_bwd_pair.sh runs both and writes ncu's details side by
side). The shapes are the benchmark's: batch 16384 // seqlen, heads 2048 // d, bf16; the forward
(for --mode bwd) and three warm-up calls run outside the range (FA4 compiles its kernels at the
first call)."""

import argparse

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["flashattn_cu", "fa4"], required=True)
    ap.add_argument("--mode", choices=["fwd", "bwd"], default="bwd")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--causal", type=int, default=1)
    args = ap.parse_args()
    if args.backend == "fa4":
        from flash_attn.cute import flash_attn_func as fn
    else:
        from flashattn_cu import flash_attn_func as fn
    batch, heads = 16384 // args.seqlen, 2048 // args.dim
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(batch, args.seqlen, heads, args.dim, device="cuda",
                                 dtype=torch.bfloat16, generator=gen) for _ in range(4))
    if args.mode == "fwd":
        def call():
            with torch.no_grad():
                fn(q, k, v, causal=bool(args.causal))
    else:
        q, k, v = (x.requires_grad_(True) for x in (q, k, v))
        res = fn(q, k, v, causal=bool(args.causal))
        out = res[0] if isinstance(res, tuple) else res

        def call():
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled {args.backend} {args.mode} d={args.dim} s={args.seqlen} causal={args.causal}")


if __name__ == "__main__":
    main()
