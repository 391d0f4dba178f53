"""`python -m flashattn_cu check` : GPU, build contents, max errors vs the fp32 reference.
`python -m flashattn_cu bench` : short TFLOP/s table against PyTorch SDPA's flash / cuDNN backends."""

import argparse
import sys

import torch


def _require_gpu(command):
    if not torch.cuda.is_available():
        print(f"flashattn_cu {command}: no CUDA device available (torch {torch.__version__})")
        sys.exit(1)


def _describe_build():
    from flashattn_cu import _C, __version__

    archs = ", ".join(f"sm_{a}" for a in _C.built_archs())
    dims = ", ".join(str(d) for d in _C.built_head_dims())
    major, minor = torch.cuda.get_device_capability()
    print(f"flashattn_cu {__version__}, torch {torch.__version__} (CUDA {torch.version.cuda})")
    print(f"GPU: {torch.cuda.get_device_name()} (sm_{major}{minor})")
    print(f"built archs: {archs}; head dims: {dims}")
    return _C.built_head_dims()


def _check(args):
    _require_gpu("check")
    from flashattn_cu import flash_attn_func
    from flashattn_cu.flash_attn_interface import _head_dim_instance
    from flashattn_cu.testing import attention_ref, max_abs_diff, poison_outputs

    built = _describe_build()
    # One odd head dim (zero-padded to 64 and run by the d=64 instance) and native ones.
    head_dims = [d for d in (59, 64, 128, 256) if _head_dim_instance(d) in built]
    shapes = [(2, 1024, 1024, 8, 2), (1, 113, 203, 4, 4), (3, 799, 3, 6, 1)]  # b, sq, sk, h, hk
    torch.manual_seed(0)
    failures = 0
    bwd_available = True
    print(f"{'dtype':>8} {'d':>4} {'sq':>5} {'sk':>5} {'h/hk':>5} {'causal':>6}  "
          f"{'fwd err':>9} {'pt err':>9}  {'bwd err':>9} {'pt err':>9}  result")
    for dtype in (torch.bfloat16, torch.float16):
        for d in head_dims:
            for b, sq, sk, h, hk in shapes:
                for causal in (False, True):
                    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, requires_grad=True)
                    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
                    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, requires_grad=True)
                    with poison_outputs():
                        out = flash_attn_func(q, k, v, causal=causal)
                    ref, _ = attention_ref(q, k, v, causal=causal)
                    pt, _ = attention_ref(q, k, v, causal=causal, upcast=False)
                    err, pt_err = max_abs_diff(out, ref), max_abs_diff(pt, ref)
                    ok = err <= 2 * pt_err + 1e-5
                    bwd_cols = f"{'-':>9} {'-':>9}"
                    if bwd_available:
                        dout = torch.randn_like(out)
                        try:
                            with poison_outputs():
                                grads = torch.autograd.grad(out, (q, k, v), dout)
                        except RuntimeError as e:
                            if "unsupported" not in str(e):
                                raise
                            bwd_available = False
                            print(f"backward: not available in this build ({e})")
                        else:
                            refs = torch.autograd.grad(ref, (q, k, v), dout.float())
                            pts = torch.autograd.grad(pt, (q, k, v), dout)
                            errs = [max_abs_diff(g, r) for g, r in zip(grads, refs)]
                            pt_errs = [max_abs_diff(p, r) for p, r in zip(pts, refs)]
                            ok = ok and all(e <= 3 * p + 1e-4 for e, p in zip(errs, pt_errs))
                            b_worst, b_pt = max(errs), max(pt_errs)
                            bwd_cols = f"{b_worst:9.2e} {b_pt:9.2e}"
                    failures += not ok
                    print(f"{str(dtype)[6:]:>8} {d:>4} {sq:>5} {sk:>5} {f'{h}/{hk}':>5} "
                          f"{str(causal):>6}  {err:9.2e} {pt_err:9.2e}  {bwd_cols}  "
                          f"{'ok' if ok else 'FAIL'}")
    print("all checks passed" if failures == 0 else f"{failures} check(s) FAILED")
    sys.exit(1 if failures else 0)


def _bench(args):
    _require_gpu("bench")
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from flashattn_cu import flash_attn_func

    built = _describe_build()
    dtype = torch.bfloat16
    total_tokens, hidden = 16384, 2048

    def timed(fn):
        try:
            return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        except RuntimeError:
            return None

    def rate(flops, ms):
        return f"{flops / (ms * 1e-3) / 1e12:8.1f}" if ms else f"{'n/a':>8}"

    print(f"forward TFLOP/s, bf16, {total_tokens} tokens, hidden {hidden} "
          "(median of triton.testing.do_bench)")
    print(f"{'d':>4} {'seqlen':>6} {'causal':>6} {'ours':>8} {'sdpa-fa2':>8} {'cudnn':>8}")
    for d in (64, 128):
        if d not in built:
            print(f"{d:>4} (not in this build)")
            continue
        for seqlen in (2048, 8192):
            batch, nheads = total_tokens // seqlen, hidden // d
            q, k, v = (torch.randn(batch, seqlen, nheads, d, device="cuda", dtype=dtype)
                       for _ in range(3))
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # SDPA's (b, h, s, d) view
            for causal in (False, True):
                flops = 4 * batch * nheads * seqlen * seqlen * d / (2 if causal else 1)
                ours = timed(lambda: flash_attn_func(q, k, v, causal=causal))
                results = [ours]
                for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
                    def run(backend=backend):
                        with sdpa_kernel(backend):
                            return sdpa(qt, kt, vt, is_causal=causal)
                    results.append(timed(run))
                print(f"{d:>4} {seqlen:>6} {str(causal):>6} " +
                      " ".join(rate(flops, ms) for ms in results))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flashattn_cu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="correctness check against the fp32 reference")
    sub.add_parser("bench", help="short forward TFLOP/s table vs SDPA backends")
    args = parser.parse_args(argv)
    {"check": _check, "bench": _bench}[args.command](args)


if __name__ == "__main__":
    main()
