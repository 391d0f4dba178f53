"""One decode step of flashattn_cu and of SDPA's cuDNN backend inside a profiler range, for ncu
(benchmarks/NOTES.md 13.12: where the batch-1 decode kernel's time goes). Run under ncu with
the range on, e.g. (device):

  ncu --profile-from-start off --set full -o /tmp/decode python3 scripts/ncu_decode.py --batch 1

Each backend is called a few times first (plans, launch attributes), then once inside
cudaProfilerStart / Stop, so ncu sees exactly one call of each: our decode kernel (and the split
combine), then cuDNN's kernels. bf16, 32 / 8 heads, one query, every cached key visible.
"""

import argparse

import torch
import torch.nn.functional as F

from flashattn_cu import flash_attn_with_kvcache


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--keys", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page", type=int, default=0, help="page size (0: contiguous cache)")
    ap.add_argument("--no-cudnn", action="store_true")
    args = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, n, d = args.batch, args.keys, args.head_dim
    q = torch.randn(b, 1, 32, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, n, 8, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    seqlens = torch.full((b,), n, dtype=torch.int32, device="cuda")
    kc, vc, table = k, v, None
    if args.page > 0:
        kc = k.view(b * n // args.page, args.page, 8, d)
        vc = v.view(b * n // args.page, args.page, 8, d)
        table = torch.randperm(kc.shape[0], device="cuda", dtype=torch.int32).view(b, -1)

    def ours():
        return flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table,
                                       causal=True)

    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

    fns = [ours] + ([] if args.no_cudnn else [cudnn])
    for fn in fns:
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled: batch {b}, {n} keys, d {d}, page {args.page or 'contiguous'}, "
          f"{', '.join(f.__name__ for f in fns)}")


if __name__ == "__main__":
    main()
