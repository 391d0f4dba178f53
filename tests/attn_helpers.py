"""Helpers shared by the GPU tests: input construction and the error rule."""

import torch

from flashattn_cu.testing import max_abs_diff

# (nheads, nheads_k)
HEADS = {"mha": (6, 6), "gqa": (6, 2), "mqa": (6, 1)}
HEAD_DIMS = [32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256]
SEQLEN_PAIRS = [(1, 239), (113, 203), (128, 217), (512, 256), (1023, 1024), (2048, 2048),
                (3, 799), (239, 1), (799, 3)]
DTYPES = [torch.float16, torch.bfloat16]
DEVICE = "cuda"


def instance_for(head_dim):
    """The compiled head-dim instance that runs `head_dim`."""
    return next(d for d in (32, 64, 96, 128, 160, 192, 224, 256) if d >= head_dim)


def make_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, *,
             requires_grad=False, scale=1.0, device=None):
    device = DEVICE if device is None else device

    def rand(*shape):
        t = torch.randn(*shape, device=device, dtype=dtype) * scale
        return t.requires_grad_(requires_grad)
    return (rand(batch, seqlen_q, nheads, head_dim), rand(batch, seqlen_k, nheads_k, head_dim),
            rand(batch, seqlen_k, nheads_k, head_dim))


def assert_rule(ours, ref, pt, factor, atol, what):
    """flash_attn's rule: max|ours - ref| <= factor * max|pt - ref| + atol, where ref is the
    fp32 computation and pt the same math in the input dtype. NaN anywhere fails."""
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    err, pt_err = max_abs_diff(ours, ref), max_abs_diff(pt, ref)
    assert err <= factor * pt_err + atol, (
        f"{what}: max|ours - ref| = {err:.3e} > {factor} * max|pt - ref| ({pt_err:.3e}) + {atol}"
    )


def assert_lse_close(lse, lse_ref):
    """softmax_lse vs the fp32 reference: +inf where the row sees no key, else close."""
    assert lse.dtype == torch.float32
    torch.testing.assert_close(lse, lse_ref.float(), atol=1e-3, rtol=1e-3)
