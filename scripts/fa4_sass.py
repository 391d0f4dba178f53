"""FlashAttention-4's sm90 forward compiled without a GPU, for a side-by-side read of its SASS
with ours (scripts/sass_loops.py). FA4 (../shared/tools/fa4_anchor.sh's parts, unpacked into
/tmp/fa4 with `cat .fa4a/part_aa .fa4b/part_ab | xz -d | tar -x -C /tmp/fa4`) is CuTe DSL code
for CPython 3.12; its interface compiles under torch's FakeTensorMode when FLASH_ATTENTION_ARCH /
CUTE_DSL_ARCH name the target, and CUTE_DSL_KEEP=cubin,ptx leaves the cubin in CUTE_DSL_DUMP_DIR
(which must exist). On this machine (no GPU):
    /root/.pyenv/versions/3.12.1/bin/python3 -m pip install torch==2.14.1 einops numpy
    PYTHONPATH=/tmp/fa4/nvidia_cutlass_dsl/dsl_packages:/tmp/fa4 \
        /root/.pyenv/versions/3.12.1/bin/python3 scripts/fa4_sass.py --dim 128 --out /tmp/fa4sass
    cuobjdump -sass /tmp/fa4sass/fa4_d128_c0.cubin > /tmp/fa4sass/fa4_d128_c0.sass
    python3 scripts/sass_loops.py /tmp/fa4sass/fa4_d128_c0.sass
Nothing of FA4 enters the repository: this only drives its compiler on fake tensors.
"""
import argparse
import glob
import os
import shutil
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--causal", type=int, default=0)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--out", default="/tmp/fa4sass")
    args = ap.parse_args()
    dump = tempfile.mkdtemp(prefix="fa4dump")
    os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90a")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")
    os.environ["CUTE_DSL_KEEP"] = "cubin,ptx"
    os.environ["CUTE_DSL_DUMP_DIR"] = dump
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from flash_attn.cute.interface import _flash_attn_fwd

    with FakeTensorMode():
        shape = (2, args.seqlen, args.heads, args.dim)
        q, k, v = (torch.empty(shape, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        _flash_attn_fwd(q, k, v, causal=bool(args.causal))
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"fa4_d{args.dim}_c{args.causal}")
    for ext in ("cubin", "ptx"):
        found = sorted(glob.glob(os.path.join(dump, f"*FlashAttentionForwardSm90*.{ext}")))
        if not found:
            raise SystemExit(f"no .{ext} in {dump}: did the compile run (CUTE_DSL_KEEP)?")
        shutil.copy(found[-1], f"{stem}.{ext}")
        print(f"{stem}.{ext}")
    shutil.rmtree(dump, ignore_errors=True)


if __name__ == "__main__":
    main()
