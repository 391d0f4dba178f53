"""CPU tests of flashattn_cu.testing.attention_ref, the reference every GPU test trusts."""

import math

import pytest
import torch

from flashattn_cu.testing import attention_ref, max_abs_diff


def naive_attention(q, k, v, causal, scale):
    """Loop-per-(batch, head, query) float64 attention straight from the definition."""
    q, k, v = q.double(), k.double(), v.double()
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    group = nheads // nheads_k
    out = torch.zeros(batch, seqlen_q, nheads, head_dim, dtype=torch.float64)
    lse = torch.full((batch, nheads, seqlen_q), math.inf, dtype=torch.float64)
    for b in range(batch):
        for h in range(nheads):
            kh = h // group
            for i in range(seqlen_q):
                last = i + seqlen_k - seqlen_q if causal else seqlen_k - 1
                if last < 0:
                    continue  # sees no key: output 0, lse +inf
                keys = slice(0, min(last, seqlen_k - 1) + 1)
                s = (k[b, keys, kh] @ q[b, i, h]) * scale
                m = s.max()
                p = torch.exp(s - m)
                lse[b, h, i] = m + torch.log(p.sum())
                out[b, i, h] = (p / p.sum()) @ v[b, keys, kh]
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1, 9), (5, 5), (7, 3), (3, 7), (6, 1), (1, 1)])
@pytest.mark.parametrize("nheads, nheads_k", [(4, 4), (4, 2), (4, 1)])
def test_reference_matches_naive(causal, seqlen_q, seqlen_k, nheads, nheads_k):
    q = torch.randn(2, seqlen_q, nheads, 16, dtype=torch.float64)
    k = torch.randn(2, seqlen_k, nheads_k, 16, dtype=torch.float64)
    v = torch.randn(2, seqlen_k, nheads_k, 16, dtype=torch.float64)
    out, lse = attention_ref(q, k, v, causal=causal, softmax_scale=0.37)
    out_n, lse_n = naive_attention(q, k, v, causal, 0.37)
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    torch.testing.assert_close(out, out_n, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, lse_n, rtol=1e-10, atol=1e-10)


def test_default_scale_is_inverse_sqrt_head_dim():
    q, k, v = (torch.randn(1, 4, 2, 24, dtype=torch.float64) for _ in range(3))
    out, lse = attention_ref(q, k, v)
    out_n, lse_n = naive_attention(q, k, v, False, 24 ** -0.5)
    torch.testing.assert_close(out, out_n)
    torch.testing.assert_close(lse, lse_n)


def test_causal_is_bottom_right_aligned():
    # seqlen_q=2, seqlen_k=5: query 0 sees keys 0..3, query 1 sees keys 0..4.
    q = torch.zeros(1, 2, 1, 8)
    k = torch.zeros(1, 5, 1, 8)
    v = torch.arange(5.0).view(1, 5, 1, 1).expand(1, 5, 1, 8).contiguous()
    out, lse = attention_ref(q, k, v, causal=True)
    assert torch.allclose(out[0, :, 0, 0], torch.tensor([1.5, 2.0]))  # mean of 0..3, of 0..4
    assert torch.allclose(lse[0, 0], torch.log(torch.tensor([4.0, 5.0])))


def test_rows_that_see_no_key():
    # seqlen_q=5 > seqlen_k=2, causal: queries 0..2 see nothing -> 0 output, lse +inf, no NaN.
    q, k, v = torch.randn(1, 5, 2, 8), torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8)
    for upcast in (True, False):
        out, lse = attention_ref(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=True,
                                 upcast=upcast)
        assert not out.isnan().any() and not lse.isnan().any()
        assert (out[0, :3] == 0).all()
        assert torch.isinf(lse[0, :, :3]).all() and (lse[0, :, :3] > 0).all()
        assert torch.isfinite(lse[0, :, 3:]).all()


def test_empty_key_sequence():
    q = torch.randn(2, 3, 4, 8)
    k = v = torch.randn(2, 0, 4, 8)
    out, lse = attention_ref(q, k, v)
    assert out.shape == q.shape and (out == 0).all()
    assert lse.shape == (2, 4, 3) and (lse == math.inf).all()


def test_gqa_equals_repeated_heads():
    q = torch.randn(2, 6, 8, 16)
    k, v = torch.randn(2, 9, 2, 16), torch.randn(2, 9, 2, 16)
    out, lse = attention_ref(q, k, v, causal=True)
    k_rep, v_rep = k.repeat_interleave(4, dim=2), v.repeat_interleave(4, dim=2)
    out_rep, lse_rep = attention_ref(q, k_rep, v_rep, causal=True)
    torch.testing.assert_close(out, out_rep)
    torch.testing.assert_close(lse, lse_rep)
    # query head 5 uses kv head 5 // 4 = 1
    out_h5, _ = attention_ref(q[:, :, 5:6], k[:, :, 1:2], v[:, :, 1:2], causal=True)
    torch.testing.assert_close(out[:, :, 5:6], out_h5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_upcast_dtypes_and_pt_error(dtype):
    q, k, v = (torch.randn(1, 33, 2, 32).to(dtype) for _ in range(3))
    out, lse = attention_ref(q, k, v)
    pt, lse_pt = attention_ref(q, k, v, upcast=False)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert pt.dtype == dtype and lse_pt.dtype == torch.float32
    exact, _ = naive_attention(q, k, v, False, 32 ** -0.5)
    # fp32 reference is far closer to exact than the low-precision computation
    assert max_abs_diff(out, exact) < 1e-5
    assert 0 < max_abs_diff(pt, exact) < 5e-2


def test_max_abs_diff_handles_inf_and_nan():
    a = torch.tensor([1.0, math.inf, 2.0])
    assert max_abs_diff(a, torch.tensor([1.5, math.inf, 2.0])) == 0.5
    assert math.isnan(max_abs_diff(torch.tensor([math.nan]), torch.tensor([0.0])))
    assert max_abs_diff(torch.empty(0), torch.empty(0)) == 0.0


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(9, 4), (4, 9), (6, 6), (12, 3)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(-1, -1), (2, 1), (0, 0), (-1, 0), (4, 0), (9, 0), (1, 9),
                                    (-1, 4), (5, -1), (2, 30), (40, 40), (3, 6)])
def test_window_seqlen_k_is_flash_attn_window(seqlen_q, seqlen_k, causal, window):
    """attention_ref's window_seqlen_k and the interface's _flash_attn_window (_arguments.py) are
    two writings of flash_attn's rules: the normalized window through the one equals the other's
    output given to the raw reference, ALiBi's bias form (so the lse) included."""
    from flashattn_cu import _arguments

    gen = torch.Generator().manual_seed(seqlen_q * 100 + seqlen_k)
    q = torch.randn(2, seqlen_q, 4, 16, dtype=torch.float64, generator=gen)
    k = torch.randn(2, seqlen_k, 2, 16, dtype=torch.float64, generator=gen)
    v = torch.randn(2, seqlen_k, 2, 16, dtype=torch.float64, generator=gen)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float32)
    out, lse = attention_ref(q, k, v, causal=causal, window_size=window, alibi_slopes=slopes,
                             window_seqlen_k=seqlen_k)
    norm_causal, left, right = _arguments._flash_attn_window(causal, *window, seqlen_k)
    out2, lse2 = attention_ref(q, k, v, causal=norm_causal, window_size=(left, right),
                               alibi_slopes=slopes)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    if seqlen_q <= seqlen_k + 1:
        # Up to the bias form, the normalized mask is the raw one when no row sits above the
        # first key (a side >= seqlen_k reaches past every key there).
        raw, _ = attention_ref(q, k, v, causal=causal, window_size=window)
        normed, _ = attention_ref(q, k, v, causal=causal, window_size=window,
                                  window_seqlen_k=seqlen_k)
        assert torch.allclose(raw, normed, atol=1e-12, rtol=0)
