"""Torch-only companion of scripts/diag_climb.py (no build needed): on the climbing test's own
inputs (seeded as tests/conftest.py seeds a test), the dk error of emulations of the backward's
precision points against float64, at the element where ours was worst, to tell which rounding
the kernels' error comes from. python3 scripts/diag_climb_emul.py NODE_ID..."""
import math
import re
import sys
import zlib

import torch
import torch.nn.functional as F


def inputs(nid):
    """The test's q, k, v, dout under node id nid: tests/test_numerics.py climbing_inputs
    written again here, because importing it imports the extension and this script needs none."""
    m = re.search(r"\[(\w+)-(\w+)-(\d+)-(True|False)\]", nid)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[m.group(2)]
    hd = int(m.group(3))
    torch.manual_seed(zlib.crc32(nid.encode()))
    q = torch.randn(1, 1088, 4, hd, device="cuda", dtype=dtype)
    k = torch.randn(1, 2048, 4, hd, device="cuda", dtype=dtype)
    v = torch.randn(1, 2048, 4, hd, device="cuda", dtype=dtype)
    q, k = q * 0.5, k * 0.5
    keys = torch.arange(2048, device="cuda", dtype=torch.float64)
    l2 = torch.stack([0.045 * keys, 0.2 * keys, 40.0 * (keys >= 1000), -0.05 * keys])
    q[..., 0] = 8.0
    k[0, :, :, 0] = (l2.T * math.log(2) / (8.0 * hd ** -0.5)).to(dtype)
    return q, k, v, torch.randn_like(q)


def dk_of(q, k, v, dout, out, *, f, p16, ds16, out_dtype):
    """dk with scores, P and dP in float type f; P rounded to the input dtype before dS (p16);
    dS rounded (ds16); the result rounded to out_dtype."""
    dt = q.dtype
    scale = q.shape[-1] ** -0.5
    qf, kf, vf, dof = (t.to(f) for t in (q, k, v, dout))
    s = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * scale
    p = torch.softmax(s, -1)
    if p16:
        p = p.to(dt).to(f)
    dp = torch.einsum("bqhd,bkhd->bhqk", dof, vf)
    dsum = (dof * out.to(f)).sum(-1).transpose(1, 2).unsqueeze(-1)
    ds = p * (dp - dsum)
    if ds16:
        ds = ds.to(dt).to(f)
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, qf) * scale
    return dk.to(out_dtype).double()


def main():
    for nid in sys.argv[1:]:
        q, k, v, dout = inputs(nid)
        qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            o2 = F.scaled_dot_product_attention(qt, kt, vt)
        dk2 = torch.autograd.grad(o2, (qt, kt, vt), dout.transpose(1, 2))[1].transpose(1, 2)
        out = o2.detach().transpose(1, 2)
        qd, kd, vd = (t.double() for t in (q, k, v))
        out64 = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(
            torch.einsum("bqhd,bkhd->bhqk", qd, kd) * q.shape[-1] ** -0.5, -1), vd)
        ref = dk_of(q, k, v, dout, out64, f=torch.float64, p16=False, ds16=False,
                    out_dtype=torch.float64)
        cases = {"FA2 (sdpa flash)": dk2.double()}
        for name, kw in [("fp32 P, dS16", dict(p16=False, ds16=True)),
                         ("P16 then dS16", dict(p16=True, ds16=True)),
                         ("P16, fp32 dS", dict(p16=True, ds16=False)),
                         ("fp32 P, fp32 dS", dict(p16=False, ds16=False))]:
            cases[name] = dk_of(q, k, v, dout, out, f=torch.float32, out_dtype=q.dtype, **kw)
            cases[name + " (f64)"] = dk_of(q, k, v, dout, out, f=torch.float64,
                                           out_dtype=torch.float64, **kw)
        key = 2047 if "bf16-128" in nid else 2046
        print(nid.split("[")[1])
        for name, g in cases.items():
            e = (g - ref).abs()
            print(f"  {name:24s} err at ({key}, 1, 0) {e[0, key, 1, 0].item():.3e}  max {e.max().item():.3e}",
                  flush=True)


if __name__ == "__main__":
    main()
