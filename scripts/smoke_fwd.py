"""A first look at a forward kernel on the GPU before the test suite: a few shapes against the
fp32 reference, on each kernel path, printing the errors. Run under `timeout` on the device
(a pipeline deadlock then fails fast instead of eating the whole call):

    timeout 120 python3 scripts/smoke_fwd.py [--dims 64,128,256]
"""

import argparse
import sys
import time

import torch

from flashattn_cu import _C, flash_attn_func
from flashattn_cu.testing import attention_ref, kernel_path, max_abs_diff


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,96,128,192,256")
    args = ap.parse_args()
    dims = [int(d) for d in args.dims.split(",") if int(d) in _C.built_head_dims()]
    shapes = [(2, 128, 128, False), (2, 113, 203, False), (1, 1023, 1024, True), (2, 3, 799, True),
              (1, 4096, 4096, True)]
    failed = 0
    for path in ("auto", "sm80"):
        for d in dims:
            for b, sq, sk, causal in shapes:
                q = torch.randn(b, sq, 4, d, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(b, sk, 2, d, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(b, sk, 2, d, device="cuda", dtype=torch.bfloat16)
                t0 = time.time()
                with kernel_path(path):
                    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
                torch.cuda.synchronize()
                ref, lse_ref = attention_ref(q, k, v, causal=causal)
                pt, _ = attention_ref(q, k, v, causal=causal, upcast=False)
                err, pt_err = max_abs_diff(out, ref), max_abs_diff(pt, ref)
                lse_err = max_abs_diff(lse[torch.isfinite(lse_ref)], lse_ref[torch.isfinite(lse_ref)])
                ok = err <= 2 * pt_err + 1e-5 and not torch.isnan(out).any()
                failed += not ok
                print(f"{path:5} d={d:3} b={b} sq={sq:5} sk={sk:5} causal={int(causal)}: "
                      f"err {err:.2e} (pt {pt_err:.2e}) lse {lse_err:.2e} "
                      f"{'ok' if ok else 'FAIL'} {time.time() - t0:.2f}s", flush=True)
    print(f"smoke_fwd: {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
