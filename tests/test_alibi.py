"""ALiBi (flash_attn's alibi_slopes): forward and backward against the fp32 reference by the rule
(forward 2x, gradients 3x), slopes per head and per (batch, head), causal and not, with windows,
seqlen_q != seqlen_k, GQA, fp16/bf16, padded and varlen, every kernel path."""

import pytest
import torch

from attn_helpers import (HEADS, assert_lse_rule, assert_rule, attention_fp32_scores,
                          check_both_paths, cu_seqlens, instance_for, kernel_paths,
                          make_qkv)
from flashattn_cu import _C, flash_attn_func, flash_attn_varlen_func
from flashattn_cu.testing import attention_ref, kernel_path


def skip_unless_built(head_dim):
    if instance_for(head_dim) not in _C.built_head_dims():
        pytest.skip(f"head dim {head_dim} not in this build")


def slopes_for(batch, nheads, per_batch):
    """ALiBi's geometric slopes 2^(-8 i / nheads), per batch entry perturbed."""
    base = torch.tensor([2.0 ** (-8.0 * (i + 1) / nheads) for i in range(nheads)], device="cuda")
    if not per_batch:
        return base
    return base.unsqueeze(0) * torch.linspace(0.5, 1.5, batch, device="cuda").unsqueeze(1)


@pytest.mark.gpu
@pytest.mark.parametrize("per_batch", [False, True])
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (True, (64, 0)),
                                            (False, (50, 17))])
@pytest.mark.parametrize("seqlens", [(113, 203), (512, 256), (1, 239)])
@pytest.mark.parametrize("heads", ["mha", "gqa"])
@pytest.mark.parametrize("dtype, d", [(torch.float16, 64), (torch.bfloat16, 128)],
                         ids=["fp16-d64", "bf16-d128"])
def test_alibi_against_reference(per_batch, causal, window, seqlens, heads, dtype, d):
    skip_unless_built(d)
    sq, sk = seqlens
    nheads, nheads_k = HEADS[heads]
    q, k, v = make_qkv(2, sq, sk, nheads, nheads_k, d, dtype, requires_grad=True)
    slopes = slopes_for(2, nheads, per_batch)
    dout = torch.randn_like(q)
    check_both_paths(q, k, v, dout, "alibi", causal=causal, window_size=window,
                     alibi_slopes=slopes)


@pytest.mark.gpu
@pytest.mark.parametrize("causal, seqlens", [(False, (1234, 2317)), (True, (2317, 2317)),
                                             (True, (1500, 2300))],
                         ids=["noncausal-1234x2317", "causal-2317", "causal-1500x2300"])
@pytest.mark.parametrize("dtype, d", [(torch.bfloat16, 64), (torch.float16, 64),
                                      (torch.float16, 128), (torch.bfloat16, 128),
                                      (torch.bfloat16, 256)],
                         ids=["bf16-d64", "fp16-d64", "fp16-d128", "bf16-d128", "bf16-d256"])
def test_alibi_long_rows(causal, seqlens, dtype, d):
    """Long rows past the short-row rule (tiles.h fwd_short_rows_sm90): padded ALiBi calls
    without a window take the static mask's ALiBi instance on Hopper (problem/mask.h
    kStaticAlibiVariant, the static variant's tiles), forward and backward: many unmasked blocks
    between the masked ones (the key tail, the causal diagonal), seqlen_q < seqlen_k. bf16: two
    batch entries with slopes per (batch, head); fp16: the deterministic backward."""
    skip_unless_built(d)
    sq, sk = seqlens
    nheads, nheads_k = HEADS["gqa"]
    per_batch = dtype == torch.bfloat16
    batch = 2 if per_batch else 1
    q, k, v = make_qkv(batch, sq, sk, nheads, nheads_k, d, dtype, requires_grad=True)
    slopes = slopes_for(batch, nheads, per_batch)
    dout = torch.randn_like(q)
    check_both_paths(q, k, v, dout, "alibi", deterministic=not per_batch, causal=causal,
                     alibi_slopes=slopes)
    check_forward_fp64(q.detach(), k.detach(), v.detach(), "alibi long rows", causal, slopes)


def check_forward_fp64(q, k, v, what, causal, slopes):
    """Output and LSE on every kernel path against the float64 reference, the rule's baseline
    the kernels' own precision points (attention_fp32_scores: float32 scores plus bias, 16-bit
    probabilities): the causal form's bias slope * j grows with the key, past what the 16-bit
    scores of the usual pt baseline hold (its error would make any answer pass)."""
    ref, ref_lse = attention_ref(q.double(), k.double(), v.double(), causal=causal,
                                 alibi_slopes=slopes.double())
    base, base_lse = attention_fp32_scores(q, k, v, causal=causal, alibi_slopes=slopes,
                                           return_lse=True)
    for path in kernel_paths():
        with kernel_path(path):
            out, lse, _ = flash_attn_func(q, k, v, causal=causal, alibi_slopes=slopes,
                                          return_attn_probs=True)
        assert_rule(out, ref, base, 2, 1e-5, f"{what}: out ({path})")
        assert_lse_rule(lse, ref_lse, base_lse, f"{what}: lse ({path})", fp32_ulps=8)


@pytest.mark.gpu
@pytest.mark.parametrize("causal, seqlens", [(False, (1000, 1000)), (False, (1234, 2317)),
                                             (True, (2317, 2317))],
                         ids=["noncausal-1000", "noncausal-1234x2317", "causal-2317"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_alibi_steep_slopes(causal, seqlens, dtype):
    """Slopes from 2^-8 to 1000 (d = 64, scale 1/8: 2^-5 .. 8000 in score units), forward on
    every kernel path against float64: biases far past the scores' range (the causal form's
    up to 2.3e6), rows the bias alone makes one-hot, the diagonal at a block boundary (1000)
    and inside one (1083)."""
    skip_unless_built(64)
    sq, sk = seqlens
    slopes = torch.tensor([2.0 ** -8, 0.03, 0.5, 3.0, 20.0, 90.0, 150.0, 1000.0],
                          device="cuda")
    q, k, v = make_qkv(1, sq, sk, 8, 2, 64, dtype)
    check_forward_fp64(q, k, v, "alibi steep", causal, slopes)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("d", [64, 128])
def test_alibi_one_hot_rows_across_the_fused_bound(dtype, d):
    """Causal ALiBi steep enough that each row's last key dominates (adjacent keys 8-30 logits
    apart: one-hot rows) over 1041 keys, so that |row max * log2(e)| runs from 0 to ~45,000
    down the rows: across the Hopper forward's bound for the fused exponent (common/softmax.h
    kWarpFusedLog2: 2^13 for fp16, 2^15 for bf16; slope 8 crosses 2^13 near row 710, 16 near
    row 355, 22 crosses 2^15 near row 1032, 30 near row 757). The row max's 16-bit P must stay
    exactly 1 on both sides: a bound past 2^13 flipped fp16 outputs' last bit in such rows
    (benchmarks/NOTES.md 12.27 item 6). d 64 takes the static ALiBi instance, d 128 (short rows
    there) the dynamic one."""
    skip_unless_built(d)
    slopes = torch.tensor([8.0, 16.0, 22.0, 30.0], device="cuda")
    q, k, v = make_qkv(1, 1041, 1041, 4, 4, d, dtype)
    check_forward_fp64(q, k, v, "alibi one-hot rows", True, slopes)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
def test_alibi_varlen(deterministic):
    skip_unless_built(64)
    lens = [130, 0, 1, 77]
    cu = cu_seqlens(lens)
    q = torch.randn(sum(lens), 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn_like(q, requires_grad=True)
    v = torch.randn_like(q, requires_grad=True)
    slopes = slopes_for(len(lens), 4, True)
    out = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True,
                                 alibi_slopes=slopes, deterministic=deterministic)
    start = 0
    for b, n in enumerate(lens):
        sl = slice(start, start + n)
        qb, kb, vb = (t.detach()[sl].unsqueeze(0) for t in (q, k, v))
        ref, _ = attention_ref(qb, kb, vb, causal=True, alibi_slopes=slopes[b:b + 1])
        pt, _ = attention_ref(qb, kb, vb, causal=True, alibi_slopes=slopes[b:b + 1], upcast=False)
        assert_rule(out[sl].unsqueeze(0), ref, pt, 2, 1e-5, f"out, sequence {b}")
        start += n
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.gpu
def test_alibi_shifts_by_a_row_constant_when_causal():
    """flash_attn's causal ALiBi adds slope * j, not -slope * (d - j): the same probabilities
    (the difference is constant along a row), an LSE larger by slope * d."""
    skip_unless_built(64)
    q, k, v = make_qkv(1, 64, 64, 2, 2, 64, torch.float16)
    slopes = torch.tensor([0.25, 0.5], device="cuda")
    out, lse, _ = flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes,
                                  return_attn_probs=True)
    ref, ref_lse = attention_ref(q, k, v, window_size=(-1, 0), alibi_slopes=slopes)  # abs form
    d = torch.arange(64, device="cuda", dtype=torch.float32)
    torch.testing.assert_close(out.float(), ref, atol=2e-3, rtol=0)
    torch.testing.assert_close(lse, ref_lse + slopes.view(1, 2, 1) * d, atol=2e-3,
                               rtol=1e-5)
