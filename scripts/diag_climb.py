"""Diagnosis of tests/test_numerics.py::test_row_max_that_climbs_along_the_keys's dk error: on the
test's inputs, for several seeds, paths, dtypes and head dims, the max |dk - float64| per head of
ours (stats path and LSE-only path), of FlashAttention-2 (torch SDPA's flash backend), of the
fp32-scores baseline and of an fp32 emulation of the FlashAttention backward's precision points
(P from the LSE in fp32, D from the 16-bit output, dS rounded to the input dtype, dK in fp32
then rounded). Run on a GPU: python3 scripts/diag_climb.py"""
import re
import sys
import zlib

import torch
import torch.nn.functional as F

sys.path.insert(0, "tests")
import attn_helpers  # noqa: E402
from flashattn_cu import flash_attn_func  # noqa: E402
from flashattn_cu.testing import attention_ref, kernel_path  # noqa: E402
from test_numerics import climbing_inputs  # noqa: E402


def inputs(seed, dtype, hd):
    """The climbing test's q, k, v (test_numerics.climbing_inputs) and dout, drawn after seed."""
    torch.manual_seed(seed)
    q, k, v = climbing_inputs(dtype, hd)
    return q, k, v, torch.randn_like(q)


def emulate(q, k, v, dout, out, lse):
    d = q.shape[-1]
    scale, l2e = d ** -0.5, 1.4426950408889634
    qf, kf, vf, dof = (t.float() for t in (q, k, v, dout))
    s = torch.einsum("bqhd,bkhd->bhqk", qf, kf)
    p = torch.exp2(s * (scale * l2e) - (lse.float() * l2e).unsqueeze(-1))
    dp = torch.einsum("bqhd,bkhd->bhqk", dof, vf)
    dsum = (dof * out.float()).sum(-1).transpose(1, 2).unsqueeze(-1)
    ds = (p * (dp - dsum)).to(q.dtype).float()
    return (torch.einsum("bhqk,bqhd->bkhd", ds, qf) * scale).to(q.dtype)


def per_head(g, r):
    return " ".join("%.2e" % (g[:, :, h].double() - r[:, :, h]).abs().max().item()
                    for h in range(g.shape[2]))


def at_worst(name, g, r, others):
    """Where g is farthest from r: the error, |r| there, and each other's error there and max."""
    d = (g.double() - r).abs()
    i = torch.unravel_index(d.argmax(), d.shape)
    parts = [f"{name} {d.max().item():.3e} at {tuple(int(x) for x in i)} |ref| {r[i].abs().item():.3e}"]
    for oname, o in others:
        od = (o.double() - r).abs()
        parts.append(f"{oname} there {od[i].item():.3e} max {od.max().item():.3e}")
    return " | ".join(parts)


def exact_cases(node_ids):
    """The test's own inputs (conftest seeds each test with crc32 of its node id)."""
    for nid in node_ids:
        m = re.search(r"\[(\w+)-(\w+)-(\d+)-(True|False)\]", nid)
        path, dt, hd, causal = m.group(1), m.group(2), int(m.group(3)), m.group(4) == "True"
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
        q, k, v, dout = inputs(zlib.crc32(nid.encode()), dtype, hd)
        qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
        out64, _ = attention_ref(qd, kd, vd, causal=causal)
        g64 = torch.autograd.grad(out64, (qd, kd, vd), dout.double())
        with kernel_path(path):
            qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
            out = flash_attn_func(qr, kr, vr, causal=causal)
            g = torch.autograd.grad(out, (qr, kr, vr), dout)
        qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            o2 = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        g2 = [t.transpose(1, 2) for t in torch.autograd.grad(o2, (qt, kt, vt), dout.transpose(1, 2))]
        qb, kb, vb = (t.detach().requires_grad_() for t in (q, k, v))
        ob = attn_helpers.attention_fp32_scores(qb, kb, vb, causal=causal)
        gb = torch.autograd.grad(ob, (qb, kb, vb), dout)
        for j, n in enumerate(("dq", "dk", "dv")):
            print(nid.split("[")[1], at_worst(n, g[j], g64[j], [("FA2", g2[j]), ("fp32b", gb[j])]),
                  flush=True)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "blame":
        return [blame(nid) for nid in sys.argv[2:]]
    if len(sys.argv) > 1:
        return exact_cases(sys.argv[1:])
    for dtype, hd in [(torch.bfloat16, 128), (torch.bfloat16, 64), (torch.float16, 64),
                      (torch.float16, 128)]:
        for seed in range(3):
            q, k, v, dout = inputs(seed, dtype, hd)
            qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
            out64, lse64 = attention_ref(qd, kd, vd)
            g64 = torch.autograd.grad(out64, (qd, kd, vd), dout.double())[1]
            tag = f"{str(dtype)[6:]} d{hd} seed {seed}"
            for path in ("auto", "sm80"):
                with kernel_path(path):
                    qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
                    out, lse, _ = flash_attn_func(qr, kr, vr, return_attn_probs=True)
                    dk = torch.autograd.grad(out, (qr, kr, vr), dout)[1]
                    scale = hd ** -0.5
                    dk_lse = torch.ops.flashattn_cu.bwd(dout, q, k, v, out.detach(), lse,
                                                        scale, False, False)[1]
                print(f"{tag} {path:4s} ours(stats) {per_head(dk, g64)} | ours(lse) "
                      f"{per_head(dk_lse, g64)} | emul {per_head(emulate(q, k, v, dout, out, lse), g64)}"
                      f" | lse err {(lse.double() - lse64).abs().max().item():.1e}", flush=True)
            qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                o2 = F.scaled_dot_product_attention(qt, kt, vt)
            dk2 = torch.autograd.grad(o2, (qt, kt, vt), dout.transpose(1, 2))[1].transpose(1, 2)
            qb, kb, vb = (t.detach().requires_grad_() for t in (q, k, v))
            ob = attn_helpers.attention_fp32_scores(qb, kb, vb)
            dkb = torch.autograd.grad(ob, (qb, kb, vb), dout)[1]
            print(f"{tag} FA2 (sdpa flash) {per_head(dk2, g64)} | fp32-scores {per_head(dkb, g64)}"
                  f" | max|dk| {per_head(g64 * 0, g64)}", flush=True)


def blame(node_id, repeats=5):
    """The test's inputs: whether our dk moves between identical runs, and which query rows'
    float64 contributions to the worst dk element best explain its error (a lost or doubled row
    shows as one contribution equal to the error)."""
    node_id, _, other_path = node_id.partition("@")  # "id@sm80": the id's inputs on that path
    m = re.search(r"\[(\w+)-(\w+)-(\d+)-(True|False)\]", node_id)
    path, dt, hd, causal = m.group(1), m.group(2), int(m.group(3)), m.group(4) == "True"
    path = other_path or path
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
    q, k, v, dout = inputs(zlib.crc32(node_id.encode()), dtype, hd)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    out64, _ = attention_ref(qd, kd, vd, causal=causal)
    g64 = torch.autograd.grad(out64, (qd, kd, vd), dout.double())
    runs = []
    with kernel_path(path):
        for _ in range(repeats):
            qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
            out = flash_attn_func(qr, kr, vr, causal=causal)
            runs.append(torch.autograd.grad(out, (qr, kr, vr), dout))
    for j, n in enumerate(("dq", "dk", "dv")):
        moved = max((r[j].float() - runs[0][j].float()).abs().max().item() for r in runs)
        print(f"{path} {n}: max change between {repeats} runs {moved:.3e}")
    dk = runs[0][1].double()
    err = dk - g64[1]
    i = torch.unravel_index(err.abs().argmax(), err.shape)
    b, key, h, c = (int(x) for x in i)
    # float64 dS of (query, key) for this head, each query's share of dk[key, c]
    s = (qd[b, :, h].detach() @ kd[b, key, h].detach()) * hd ** -0.5
    lse = torch.logsumexp((qd[b, :, h].detach() @ kd[b, :, h].detach().T) * hd ** -0.5, -1)
    p = torch.exp(s - lse)
    dp = dout[b, :, h].double() @ vd[b, key, h].detach()
    dsum = (dout[b, :, h].double() * out64[b, :, h].detach()).sum(-1)
    share = p * (dp - dsum) * qd[b, :, h, c].detach() * hd ** -0.5
    e = err[i].item()
    near = (share - e).abs().argsort()[:5].tolist() + (share + e).abs().argsort()[:3].tolist()
    print(f"worst dk {tuple(i)}: err {e:+.4e}, ref {g64[1][i].item():+.4e}; the rows whose share "
          f"is closest to +-err: " + ", ".join(f"q{r}: {share[r].item():+.4e}" for r in near))
    blocks = [share[r0:r0 + 64].sum().item() for r0 in range(0, share.shape[0], 64)]
    print("64-row blocks' shares: " + " ".join(f"{x:+.3f}" for x in blocks))
    # the error of dk[:, key-range, h, c] near the worst key
    print("errors of keys around it: " + " ".join(
        f"{kk}:{err[b, kk, h, c].item():+.3e}" for kk in range(max(0, key - 8), min(err.shape[1], key + 3))))


if __name__ == "__main__":
    main()
