"""flashattn_cu.modules: FlashSelfAttention, FlashCrossAttention, MultiheadAttention and the rotary
helper.

CPU (no GPU needed): signatures, constructor and argument checks, shapes on fake CUDA tensors
(FakeTensorMode on a pretend sm_90 GPU with every head-dim instance built, as test_api.py), the
arguments the modules hand to the interface, the varlen functions they call for cu_seqlens and a
key_padding_mask with padding, the module math in float64 with the attention functions
replaced by flashattn_cu.testing.attention_ref (padded and, through a stand-in varlen function,
key_padding_mask), and the rotary embedding against a complex-number reference.
GPU: the attention modules are bitwise the packed functions; MultiheadAttention against a plain
PyTorch module (scaled_dot_product_attention, float32) on the same weights, and its backward.
"""

import inspect
import math
import os
import subprocess
import sys
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import attn_helpers
import flashattn_cu
from api_helpers import pretend_gpu
from flashattn_cu import _C
from flashattn_cu import flash_attn_interface as fai
from flashattn_cu.modules import (FlashCrossAttention, FlashSelfAttention, MultiheadAttention,
                                  RotaryEmbedding)
from flashattn_cu.testing import attention_ref, max_abs_diff

F16, F64 = torch.float16, torch.float64
VARLEN_NAMES = ("flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
                "flash_attn_varlen_kvpacked_func")
EMPTY = inspect.Parameter.empty


def _params(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


# --------------------------------------------------------------------------------------------
# Signatures and exports


def test_signatures():
    # flash_attn 2.x flash_attn/modules/mha.py, parameter for parameter.
    init = [("causal", False), ("softmax_scale", None), ("attention_dropout", 0.0),
            ("window_size", (-1, -1)), ("alibi_slopes", None), ("deterministic", False)]
    assert _params(FlashSelfAttention.__init__)[1:] == init
    # FlashCrossAttention takes alibi_slopes before window_size there.
    assert _params(FlashCrossAttention.__init__)[1:] == [init[i] for i in (0, 1, 2, 4, 3, 5)]
    assert _params(FlashSelfAttention.forward) == [
        ("self", EMPTY), ("qkv", EMPTY), ("causal", None), ("cu_seqlens", None),
        ("max_seqlen", None)]
    assert _params(FlashCrossAttention.forward) == [
        ("self", EMPTY), ("q", EMPTY), ("kv", EMPTY), ("causal", None), ("cu_seqlens", None),
        ("max_seqlen", None), ("cu_seqlens_k", None), ("max_seqlen_k", None)]
    assert _params(MultiheadAttention.__init__)[1:] == [
        ("embed_dim", EMPTY), ("num_heads", EMPTY), ("num_heads_kv", None), ("causal", False),
        ("softmax_scale", None), ("dropout", 0.0), ("bias", True), ("rotary_emb_dim", 0),
        ("rotary_base", 10000.0), ("device", None), ("dtype", None)]
    assert _params(MultiheadAttention.forward) == [
        ("self", EMPTY), ("x", EMPTY), ("key_padding_mask", None)]


def test_exports_and_lazy_import():
    import flashattn_cu.modules as modules

    assert sorted(modules.__all__) == sorted(["FlashSelfAttention", "FlashCrossAttention",
                                              "MultiheadAttention", "RotaryEmbedding"])
    # `import flashattn_cu` alone does not import (or pay for) the modules.
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(flashattn_cu.__file__)))
    code = "import sys, flashattn_cu; print('flashattn_cu.modules' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd="/", env=env)
    assert res.returncode == 0 and res.stdout.strip() == "False", res.stdout + res.stderr


def test_attributes_and_state_dict_names():
    """flash_attn's attribute names; the state dict holds the projections only (Wqkv / out_proj,
    as flash_attn's MHA names them), no rotary or ALiBi entries."""
    slopes = torch.rand(4)
    m = FlashSelfAttention(causal=True, softmax_scale=0.5, attention_dropout=0.25,
                           alibi_slopes=slopes, deterministic=True)
    assert m.causal is True and m.softmax_scale == 0.5 and m.drop.p == 0.25
    assert m.window_size == (-1, -1) and m.deterministic is True
    assert m.alibi_slopes is not None and torch.equal(m.alibi_slopes, slopes)
    assert list(m.state_dict()) == []
    mha = MultiheadAttention(64, 4, 2, causal=True, rotary_emb_dim=8)
    assert (mha.num_heads, mha.num_heads_kv, mha.head_dim) == (4, 2, 16)
    assert mha.Wqkv.weight.shape == ((4 + 2 * 2) * 16, 64)
    assert mha.out_proj.weight.shape == (64, 64)
    assert sorted(mha.state_dict()) == ["Wqkv.bias", "Wqkv.weight", "out_proj.bias",
                                        "out_proj.weight"]
    no_bias = MultiheadAttention(64, 4, bias=False)
    assert no_bias.Wqkv.bias is None and no_bias.out_proj.bias is None
    assert no_bias.num_heads_kv == 4 and no_bias.rotary_emb is None


# --------------------------------------------------------------------------------------------
# Constructor and argument checks


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(embed_dim=100, num_heads=3), ValueError,
     r"embed_dim \(100\) must be divisible by num_heads \(3\)"),
    (dict(embed_dim=64, num_heads=8, num_heads_kv=3), ValueError,
     r"num_heads \(8\) must be divisible by num_heads_kv \(3\)"),
    (dict(embed_dim=64, num_heads=4, rotary_emb_dim=7), ValueError,
     r"rotary_emb_dim \(7\) must be even"),
    (dict(embed_dim=64, num_heads=4, rotary_emb_dim=18), ValueError,
     r"rotary_emb_dim \(18\) must be <= head_dim \(16 = embed_dim 64 // num_heads 4\)"),
    (dict(embed_dim=64, num_heads=4, rotary_emb_dim=-2), ValueError,
     r"rotary_emb_dim must be a non-negative int"),
    (dict(embed_dim=0, num_heads=4), ValueError, r"embed_dim must be a positive int, got 0"),
    (dict(embed_dim=64, num_heads=0), ValueError, r"num_heads must be a positive int, got 0"),
    (dict(embed_dim=64.0, num_heads=4), ValueError, r"embed_dim must be a positive int"),
    (dict(embed_dim=64, num_heads=4, num_heads_kv=0), ValueError,
     r"num_heads_kv must be a positive int, got 0"),
    (dict(embed_dim=64, num_heads=4, dropout=1.5), ValueError,
     r"dropout must be a probability in \[0, 1\], got 1.5"),
])
def test_mha_constructor_errors(kwargs, exc, message):
    with pytest.raises(exc, match="MultiheadAttention: " + message):
        MultiheadAttention(**kwargs)


def test_mha_constructor_accepts_limits():
    MultiheadAttention(64, 4, rotary_emb_dim=16)  # rotary on the whole head
    MultiheadAttention(64, 4, num_heads_kv=1)  # MQA
    MultiheadAttention(48, 3)  # head_dim 16 from an odd head count


@pytest.mark.parametrize("dim, base, message", [
    (7, 10000.0, "dim must be a positive even int, got 7"),
    (0, 10000.0, "dim must be a positive even int, got 0"),
    (8, 0.0, "base must be a positive number, got 0.0"),
])
def test_rotary_constructor_errors(dim, base, message):
    with pytest.raises(ValueError, match="RotaryEmbedding: " + message):
        RotaryEmbedding(dim, base)


def test_mha_forward_argument_errors():
    mha = MultiheadAttention(32, 2)
    x = torch.randn(2, 5, 32)
    with pytest.raises(ValueError, match=r"x must be \(batch, seqlen, embed_dim=32\), got shape "
                       r"\(2, 5, 16\)"):
        mha(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match=r"x must be \(batch, seqlen, embed_dim=32\)"):
        mha(torch.randn(10, 32))
    with pytest.raises(ValueError, match=r"key_padding_mask must be \(batch, seqlen\) = \(2, 5\), "
                       r"got \(2, 4\)"):
        mha(x, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="key_padding_mask must be a bool tensor"):
        mha(x, torch.ones(2, 5))  # a float (additive?) mask is ambiguous
    with pytest.raises(TypeError, match="key_padding_mask must be a bool tensor"):
        mha(x, [[True] * 5] * 2)


@pytest.mark.parametrize("module, args, exc, message", [
    ("self", dict(cu_seqlens=torch.tensor([0, 3, 7])), TypeError,
     r"FlashSelfAttention: cu_seqlens must be a 1-d torch.int32 tensor .* got a 1-d torch.int64"),
    ("self", dict(cu_seqlens=torch.tensor([0, 3, 7], dtype=torch.int32)), TypeError,
     r"FlashSelfAttention: max_seqlen must be a Python int .* got None"),
    ("self", dict(cu_seqlens=torch.tensor([0, 3, 7], dtype=torch.int32),
                  max_seqlen=torch.tensor(4)), TypeError, r"max_seqlen must be a Python int"),
    ("cross", dict(cu_seqlens=torch.tensor([0, 3, 7], dtype=torch.int32), max_seqlen=4),
     TypeError, r"FlashCrossAttention: cu_seqlens_k must be a 1-d torch.int32 tensor .* got "
     "NoneType"),
    ("cross", dict(cu_seqlens=torch.tensor([0, 3, 7], dtype=torch.int32), max_seqlen=4,
                   cu_seqlens_k=torch.tensor([0, 2, 6], dtype=torch.int32)), TypeError,
     r"FlashCrossAttention: max_seqlen_k must be a Python int"),
])
def test_cu_seqlens_argument_errors(module, args, exc, message):
    with pytest.raises(exc, match=message):
        if module == "self":
            FlashSelfAttention()(torch.zeros(7, 3, 2, 64, dtype=F16), **args)
        else:
            FlashCrossAttention()(torch.zeros(7, 2, 64, dtype=F16),
                                  torch.zeros(6, 2, 2, 64, dtype=F16), **args)


# --------------------------------------------------------------------------------------------
# Shapes on fake CUDA tensors (pretend sm_90 GPU)


def test_fake_shapes_self_and_cross():
    with pretend_gpu():
        qkv = torch.empty(2, 9, 3, 4, 64, dtype=F16, device="cuda")
        for attn in (FlashSelfAttention(), FlashSelfAttention(causal=True)):
            out = attn(qkv)
            assert out.shape == (2, 9, 4, 64) and out.dtype == F16 and out.device.type == "cuda"
            assert attn(qkv, causal=not attn.causal).shape == (2, 9, 4, 64)
        q = torch.empty(2, 9, 6, 40, dtype=torch.bfloat16, device="cuda")  # padded head dim
        kv = torch.empty(2, 13, 2, 2, 40, dtype=torch.bfloat16, device="cuda")  # GQA
        out = FlashCrossAttention(causal=True)(q, kv)
        assert out.shape == (2, 9, 6, 40) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("heads, rotary, causal", [((4, 4), 0, False), ((8, 2), 16, True),
                                                   ((8, 1), 64, False), ((4, 4), 32, True)])
def test_fake_shapes_mha(heads, rotary, causal):
    h, hk = heads
    with pretend_gpu():
        mha = MultiheadAttention(h * 64, h, hk, causal=causal, rotary_emb_dim=rotary,
                                 device="cuda", dtype=torch.bfloat16)
        x = torch.empty(3, 17, h * 64, dtype=torch.bfloat16, device="cuda")
        y = mha(x)  # (the autograd engine cannot run a fake CUDA backward without a GPU)
        assert y.shape == x.shape and y.dtype == x.dtype and y.device.type == "cuda"
        all_true = torch.ones(3, 17, dtype=torch.bool, device="cuda")
        with mock.patch.object(MultiheadAttention, "_check_mask", return_value=False) as check:
            # bool() of a fake tensor is data-dependent; the all-True case is tested on the CPU.
            assert mha(x, all_true).shape == x.shape
        check.assert_called_once()


# --------------------------------------------------------------------------------------------
# What the modules hand to the interface


def _spy(name):
    """A mock of flash_attn_interface.<name> that records the call and returns a tensor shaped
    like the first argument without its packing dim (CPU tensors, no kernel)."""
    def fake(first, *args, **kwargs):
        if name == "flash_attn_qkvpacked_func":
            return first[:, :, 0]
        if name == "flash_attn_varlen_qkvpacked_func":
            return first[:, 0]
        return torch.zeros_like(first)
    return mock.patch.object(fai, name, side_effect=fake)


def test_arguments_reach_the_functions():
    slopes = torch.rand(4, dtype=F16)
    attn = FlashSelfAttention(causal=True, softmax_scale=0.3, attention_dropout=0.1,
                              window_size=(-1, 0), alibi_slopes=slopes, deterministic=True)
    qkv = torch.zeros(2, 5, 3, 4, 16, dtype=F16)
    with _spy("flash_attn_qkvpacked_func") as fn:
        attn.eval()
        attn(qkv)
        attn.train()
        attn(qkv, causal=False)
    (args0, kw0), (args1, kw1) = fn.call_args_list
    assert args0[0] is qkv and args0[1] == 0.0 and args1[1] == 0.1  # dropout in training only
    assert kw0["causal"] is True and kw1["causal"] is False
    for kw in (kw0, kw1):
        assert kw["softmax_scale"] == 0.3 and kw["window_size"] == (-1, 0)
        assert kw["deterministic"] is True
        assert kw["alibi_slopes"].dtype == torch.float32
        assert torch.equal(kw["alibi_slopes"], slopes.float())

    cross = FlashCrossAttention(softmax_scale=0.2)
    q, kv = torch.zeros(2, 5, 4, 16, dtype=F16), torch.zeros(2, 7, 2, 2, 16, dtype=F16)
    with _spy("flash_attn_kvpacked_func") as fn:
        cross(q, kv, causal=True)
    (args, kw), = fn.call_args_list
    assert args[0] is q and args[1] is kv and args[2] == 0.0
    assert kw == dict(softmax_scale=0.2, causal=True, window_size=(-1, -1), alibi_slopes=None,
                      deterministic=False)


def test_positional_constructor_arguments_as_flash_attn():
    """Positional constructor calls written for flash_attn mean the same here: FlashSelfAttention
    (causal, softmax_scale, attention_dropout, window_size, alibi_slopes, deterministic),
    FlashCrossAttention (..., alibi_slopes, window_size, deterministic)."""
    slopes = torch.tensor([0.5, 0.25])
    self_attn = FlashSelfAttention(True, 0.3, 0.1, (64, 0), slopes, True)
    cross = FlashCrossAttention(True, 0.3, 0.1, slopes, (64, 0), True)
    for m in (self_attn, cross):
        assert m.causal is True and m.softmax_scale == 0.3 and m.drop.p == 0.1
        assert m.window_size == (64, 0) and m.deterministic is True
        assert torch.equal(m.alibi_slopes, slopes)
    q, kv = torch.zeros(2, 5, 2, 16, dtype=F16), torch.zeros(2, 7, 2, 2, 16, dtype=F16)
    with _spy("flash_attn_kvpacked_func") as fn:
        cross.eval()(q, kv)
    (_, kw), = fn.call_args_list
    assert kw["window_size"] == (64, 0) and torch.equal(kw["alibi_slopes"], slopes)


def test_varlen_arguments_reach_the_functions():
    """With the varlen functions present (stand-ins here; the real ones once flashattn_cu has
    them), cu_seqlens selects them with flash_attn's positional order."""
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 6], dtype=torch.int32)
    qkv = torch.zeros(7, 3, 4, 16, dtype=F16)
    with _spy("flash_attn_varlen_qkvpacked_func") as fn:
        out = FlashSelfAttention(causal=True).train()(qkv, cu_seqlens=cu, max_seqlen=4)
    (args, kw), = fn.call_args_list
    assert out.shape == (7, 4, 16)
    assert args[0] is qkv and args[1] is cu and args[2] == 4 and args[3] == 0.0
    assert kw["causal"] is True
    q, kv = torch.zeros(7, 4, 16, dtype=F16), torch.zeros(6, 2, 2, 16, dtype=F16)
    with _spy("flash_attn_varlen_kvpacked_func") as fn:
        FlashCrossAttention(attention_dropout=0.5).eval()(
            q, kv, cu_seqlens=cu, max_seqlen=4, cu_seqlens_k=cu_k, max_seqlen_k=5)
    (args, kw), = fn.call_args_list
    assert args[0] is q and args[1] is kv and args[2] is cu and args[3] is cu_k
    assert args[4:] == (4, 5, 0.0)


def test_dropout_runs_in_training_only():
    """attention_dropout > 0 reaches the kernels in training mode (through the fake ops here);
    eval mode passes 0.0."""
    with pretend_gpu():
        qkv = torch.empty(2, 9, 3, 4, 64, dtype=F16, device="cuda")
        attn = FlashSelfAttention(attention_dropout=0.1)
        assert attn.eval()(qkv).shape == (2, 9, 4, 64)
        with mock.patch.object(fai.FlashAttnFunc, "apply", wraps=fai.FlashAttnFunc.apply) as fn:
            assert attn.train()(qkv).shape == (2, 9, 4, 64)
        assert fn.call_args[0][10] == 0.1  # dropout_p
        mha = MultiheadAttention(128, 2, dropout=0.1, device="cuda", dtype=F16)
        x = torch.empty(2, 9, 128, dtype=F16, device="cuda")
        assert mha.eval()(x).shape == x.shape
        assert mha.train()(x).shape == x.shape


def test_window_and_alibi_reach_the_interface():
    """Sliding windows and ALiBi are the interface's (tested there): the module hands them on."""
    with pretend_gpu():
        qkv = torch.empty(2, 9, 3, 4, 64, dtype=F16, device="cuda")
        slopes = torch.ones(4, device="cuda")
        with _spy("flash_attn_qkvpacked_func") as fn:
            FlashSelfAttention(window_size=(3, 3), alibi_slopes=slopes)(qkv)
        kwargs = fn.call_args.kwargs
        assert tuple(kwargs["window_size"]) == (3, 3)
        assert tuple(kwargs["alibi_slopes"].shape) == (4,)


# --------------------------------------------------------------------------------------------
# Varlen: cu_seqlens and a key_padding_mask with padding tokens reach the varlen functions


def test_cu_seqlens_calls_varlen():
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    qkv = torch.zeros(7, 3, 2, 64, dtype=F16)
    with _spy("flash_attn_varlen_qkvpacked_func") as fn:
        out = FlashSelfAttention()(qkv, cu_seqlens=cu, max_seqlen=4)
    fn.assert_called_once()
    assert fn.call_args.args[1] is cu and fn.call_args.args[2] == 4
    assert tuple(out.shape) == (7, 2, 64)
    q, kv = torch.zeros(7, 2, 64, dtype=F16), torch.zeros(7, 2, 2, 64, dtype=F16)
    with _spy("flash_attn_varlen_kvpacked_func") as fn:
        FlashCrossAttention()(q, kv, cu_seqlens=cu, max_seqlen=4, cu_seqlens_k=cu,
                              max_seqlen_k=4)
    fn.assert_called_once()
    assert fn.call_args.args[2] is cu and fn.call_args.args[3] is cu


def test_key_padding_mask_calls_varlen():
    mha = MultiheadAttention(32, 2)
    x = torch.randn(2, 5, 32)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    with _spy("flash_attn_varlen_func") as fn, _spy("flash_attn_func") as padded:
        out = mha(x, mask)
    fn.assert_called_once()
    padded.assert_not_called()
    assert fn.call_args.args[3].tolist() == [0, 5, 8]  # cu_seqlens of the kept tokens
    assert tuple(out.shape) == (2, 5, 32)


# --------------------------------------------------------------------------------------------
# The module math in float64 on the CPU: the attention functions replaced by attention_ref


def _ref_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, **kwargs):
    assert dropout_p == 0.0
    return attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale)[0]


def _ref_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     dropout_p=0.0, softmax_scale=None, causal=False, **kwargs):
    """flash_attn_varlen_func's contract, one sequence at a time through attention_ref."""
    assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    assert bounds_q[-1] == q.shape[0] and bounds_k[-1] == k.shape[0] == v.shape[0]
    outs = []
    for b in range(len(bounds_q) - 1):
        sq, sk = slice(bounds_q[b], bounds_q[b + 1]), slice(bounds_k[b], bounds_k[b + 1])
        assert sq.stop - sq.start <= max_seqlen_q and sk.stop - sk.start <= max_seqlen_k
        outs.append(_ref_flash_attn_func(q[None, sq], k[None, sk], v[None, sk], dropout_p,
                                         softmax_scale, causal)[0])
    return torch.cat(outs)


def rotary_reference(x, rotary_dim, base):
    """The first rotary_dim dims of each head as rotary_dim / 2 complex numbers
    x[i] + 1j * x[i + rotary_dim / 2], multiplied by exp(1j * position * base^(-2i/rotary_dim)),
    angles in float64; x (batch, seqlen, nheads, headdim)."""
    if rotary_dim == 0:
        return x
    half, seqlen = rotary_dim // 2, x.shape[1]
    inv_freq = torch.tensor([base ** (-2.0 * i / rotary_dim) for i in range(half)], dtype=F64)
    angles = torch.arange(seqlen, dtype=F64)[:, None] * inv_freq
    phase = torch.polar(torch.ones_like(angles), angles).to(x.device)[:, None, :]
    z = torch.complex(x[..., :half].to(F64), x[..., half:rotary_dim].to(F64)) * phase
    rotated = torch.cat((z.real, z.imag), dim=-1).to(x.dtype)
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


class ReferenceMHA(torch.nn.Module):
    """The same math as MultiheadAttention in plain PyTorch, in one dtype throughout: projections
    by F.linear from mha's weights, rotary_reference, attention by
    torch.nn.functional.scaled_dot_product_attention (kv heads repeated for GQA; a boolean mask
    for causal and the key padding), the rows of dropped tokens zeroed before out_proj."""

    def __init__(self, mha, dtype):
        super().__init__()
        self.mha, self.dtype = mha, dtype

    def forward(self, x, key_padding_mask=None):
        m, dt = self.mha, self.dtype
        bias = (lambda lin: None if lin.bias is None else lin.bias.to(dt))
        qkv = F.linear(x.to(dt), m.Wqkv.weight.to(dt), bias(m.Wqkv))
        batch, seqlen = x.shape[:2]
        h, hk, d = m.num_heads, m.num_heads_kv, m.head_dim
        q, k, v = qkv.split([h * d, hk * d, hk * d], dim=-1)
        q, k, v = (t.reshape(batch, seqlen, -1, d) for t in (q, k, v))
        base = m.rotary_emb.base if m.rotary_emb is not None else 0.0
        q, k = (rotary_reference(t, m.rotary_emb_dim, base) for t in (q, k))
        k, v = (t.repeat_interleave(h // hk, dim=2) for t in (k, v))
        visible = torch.ones(batch, 1, seqlen, seqlen, dtype=torch.bool, device=x.device)
        if m.causal:
            visible = visible & torch.ones(seqlen, seqlen, dtype=torch.bool,
                                           device=x.device).tril()
        if key_padding_mask is not None:
            visible = visible & key_padding_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), attn_mask=visible,
                                             scale=m.softmax_scale).transpose(1, 2)
        if key_padding_mask is not None:  # rows that see no key are NaN in SDPA; they are dropped
            out = torch.where(key_padding_mask[:, :, None, None], out, torch.zeros_like(out))
        return F.linear(out.reshape(batch, seqlen, h * d), m.out_proj.weight.to(dt),
                        bias(m.out_proj))


def _cpu_mha(h, hk, d, causal, rotary, bias=True, softmax_scale=None):
    return MultiheadAttention(h * d, h, hk, causal=causal, rotary_emb_dim=rotary, bias=bias,
                              softmax_scale=softmax_scale, dtype=F64)


@pytest.mark.parametrize("h, hk, rotary, causal, bias, scale", [
    (4, 4, 0, False, True, None), (4, 2, 8, True, True, None), (6, 1, 16, False, False, 0.2),
    (2, 2, 6, True, True, None),
])
def test_mha_math_float64(h, hk, rotary, causal, bias, scale):
    mha = _cpu_mha(h, hk, 16, causal, rotary, bias, scale)
    x = torch.randn(3, 11, h * 16, dtype=F64)
    with mock.patch.object(fai, "flash_attn_func", side_effect=_ref_flash_attn_func):
        out = mha(x)
        all_true = mha(x, torch.ones(3, 11, dtype=torch.bool))  # the padded path, no varlen
    ref = ReferenceMHA(mha, F64)(x)
    assert max_abs_diff(out, ref) < 1e-12
    assert torch.equal(all_true, out)


@pytest.mark.parametrize("h, hk, rotary, causal", [(4, 4, 0, False), (4, 2, 8, True),
                                                   (6, 3, 16, True)])
def test_mha_key_padding_mask_float64(h, hk, rotary, causal):
    """Through a stand-in flash_attn_varlen_func (flash_attn's contract, one sequence at a time):
    the kept tokens attend to the kept tokens of their sequence (causal in their order in x),
    rotary at their positions in x; the rows of dropped tokens are out_proj.bias. Gradients
    reach x at the kept tokens only."""
    mha = _cpu_mha(h, hk, 16, causal, rotary)
    batch, seqlen = 4, 9
    x = torch.randn(batch, seqlen, h * 16, dtype=F64, requires_grad=True)
    mask = torch.ones(batch, seqlen, dtype=torch.bool)
    mask[0, 6:] = False             # right padding
    mask[1, :4] = False             # left padding
    mask[2, [1, 4, 5, 8]] = False   # holes
    mask[3, :] = False              # nothing kept
    with mock.patch.object(fai, "flash_attn_varlen_func",
                           side_effect=_ref_varlen_func) as varlen:
        out = mha(x, mask)
        assert torch.equal(mha(x, mask.to(torch.int64)), out)  # 0/1 integers work as False/True
    (args, kwargs) = varlen.call_args_list[0]
    cu_seqlens, max_seqlen = args[3], args[5]
    assert cu_seqlens.tolist() == [0, 6, 11, 16, 16] and args[4] is cu_seqlens
    assert max_seqlen == 6 and args[6] == 6 and args[7] == 0.0
    assert kwargs == dict(softmax_scale=None, causal=causal)
    ref = ReferenceMHA(mha, F64)(x, mask)
    assert max_abs_diff(out, ref) < 1e-12
    assert torch.equal(out[~mask], mha.out_proj.bias.detach().expand(int((~mask).sum()), -1))
    (grad,) = torch.autograd.grad(out.sum(), (x,))
    assert torch.equal(grad[~mask], torch.zeros_like(grad[~mask]))
    assert grad[mask].abs().sum() > 0


# --------------------------------------------------------------------------------------------
# Rotary embedding (CPU, float64)


@pytest.mark.parametrize("dim, headdim, base", [(8, 8, 10000.0), (6, 16, 10000.0),
                                                (32, 40, 500.0)])
def test_rotary_against_reference(dim, headdim, base):
    x = torch.randn(2, 23, 3, headdim, dtype=F64)
    rot = RotaryEmbedding(dim, base)
    out = rot(x)
    assert out.dtype == F64 and out.shape == x.shape
    assert max_abs_diff(out, rotary_reference(x, dim, base)) < 1e-12
    assert torch.equal(out[..., dim:], x[..., dim:])  # dims past rotary_dim pass through
    assert torch.equal(rot(x[:, 5:], offset=5), out[:, 5:])  # offset = later positions


def test_rotary_properties():
    dim, seqlen = 16, 64
    rot = RotaryEmbedding(dim)
    q = torch.randn(1, 1, 1, dim, dtype=F64).expand(1, seqlen, 1, dim)  # one vector everywhere
    k = torch.randn(1, 1, 1, dim, dtype=F64).expand(1, seqlen, 1, dim)
    rq, rk = rot(q)[0, :, 0], rot(k)[0, :, 0]  # rq[m] = rot(q, m)
    # A rotation: norms preserved; position 0 is the identity.
    assert torch.allclose(rq.norm(dim=-1), q[0, :, 0].norm(dim=-1), rtol=0, atol=1e-12)
    assert max_abs_diff(rq[0], q[0, 0, 0]) < 1e-15
    # <rot(q, m), rot(k, n)> depends on m - n only.
    dots = rq @ rk.T  # dots[m, n]
    for delta in (-40, -7, 0, 3, 25):
        diag = torch.diagonal(dots, offset=-delta)  # entries with m - n = delta
        assert diag.numel() > 1 and max_abs_diff(diag, diag[:1].expand_as(diag)) < 1e-12
    # ... and does depend on it.
    assert max_abs_diff(dots[5, 0], dots[0, 0]) > 1e-3


def test_rotary_computes_in_float32_and_rounds_once():
    """A 16-bit input is rotated in float32 and rounded once (not with 16-bit cos/sin); .half()
    on the module changes nothing (it has no buffers)."""
    x = torch.randn(2, 300, 2, 64, dtype=torch.bfloat16)
    rot = RotaryEmbedding(32)
    expected = rot(x.float()).bfloat16()
    assert torch.equal(rot(x), expected)
    assert list(rot.half().state_dict()) == [] and torch.equal(rot(x), expected)
    # cos / sin cached for the longest sequence: a shorter one reuses it, a longer one extends it.
    cos300, _ = rot.cos_sin(300, "cpu")
    cos10, _ = rot.cos_sin(10, "cpu")
    assert cos300.dtype == torch.float32 and torch.equal(cos10, cos300[:10])
    assert rot.cos_sin(400, "cpu")[0].shape == (400, 16)


def test_rotary_input_checks():
    with pytest.raises(ValueError, match=r"x must be \(batch, seqlen, nheads, headdim\) with "
                       r"headdim >= 16, got shape \(2, 3, 8\)"):
        RotaryEmbedding(16)(torch.zeros(2, 3, 8))
    with pytest.raises(ValueError, match="headdim >= 16"):
        RotaryEmbedding(16)(torch.zeros(2, 3, 1, 8))


# --------------------------------------------------------------------------------------------
# GPU


def _skip_unless_built(head_dim):
    if attn_helpers.instance_for(head_dim) not in _C.built_head_dims():
        pytest.skip(f"head dim {head_dim} not in this build")


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_flash_self_attention_is_qkvpacked_func(causal):
    _skip_unless_built(64)
    qkv = torch.randn(2, 77, 3, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(2, 77, 4, 64, device="cuda", dtype=torch.bfloat16)
    attn = FlashSelfAttention(causal=causal, deterministic=True)
    out = attn(qkv)
    (dqkv,) = torch.autograd.grad(out, (qkv,), dout)
    qkv2 = qkv.detach().clone().requires_grad_()
    ref = fai.flash_attn_qkvpacked_func(qkv2, causal=causal, deterministic=True)
    (ref_dqkv,) = torch.autograd.grad(ref, (qkv2,), dout)
    assert torch.equal(out, ref) and torch.equal(dqkv, ref_dqkv)
    assert torch.equal(attn(qkv, causal=not causal),
                       fai.flash_attn_qkvpacked_func(qkv, causal=not causal))


@pytest.mark.gpu
def test_flash_cross_attention_is_kvpacked_func():
    _skip_unless_built(64)
    q = torch.randn(2, 50, 6, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    kv = torch.randn(2, 90, 2, 2, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    dout = torch.randn_like(q)
    out = FlashCrossAttention(causal=True, softmax_scale=0.1, deterministic=True)(q, kv)
    grads = torch.autograd.grad(out, (q, kv), dout)
    q2, kv2 = (t.detach().clone().requires_grad_() for t in (q, kv))
    ref = fai.flash_attn_kvpacked_func(q2, kv2, softmax_scale=0.1, causal=True,
                                       deterministic=True)
    ref_grads = torch.autograd.grad(ref, (q2, kv2), dout)
    assert torch.equal(out, ref)
    assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads, rotary, causal, masked", [
    ((4, 4), 0, False, False), ((8, 2), 32, True, False), ((8, 1), 64, False, False),
    ((4, 2), 16, True, True), ((4, 4), 64, False, True),
])
def test_mha_against_sdpa_reference(dtype, heads, rotary, causal, masked):
    """MultiheadAttention in `dtype` against ReferenceMHA in float32 on the same weights.

    Tolerance: flash_attn's rule as in the rest of tests/, max|ours - ref| <= 2 * max|pt - ref|
    + 1e-4, with pt = ReferenceMHA run in `dtype` (same weights, same input). Both round at the
    same points (the Wqkv output, q and k after rotary, the attention output, the out_proj
    output), which alone costs a few units of the 16-bit epsilon of each value; pt's error is
    what that rounding costs here, and a module whose math differs (wrong head split, rotary
    angle or position, GQA mapping, mask) is off by O(1) instead. The projections are the same
    cuBLAS calls in both and the rotary of both rounds once from float32 / float64, so what
    differs is the attention (flashattn_cu's kernel against SDPA's in the 16-bit dtype); factor
    2 is the margin flash_attn's rule gives such kernels. The 1e-4 only matters if pt happened
    to be exact.

    `masked`: a key_padding_mask with padding, through flash_attn_varlen_func.
    """
    _skip_unless_built(64)
    h, hk = heads
    mha = MultiheadAttention(h * 64, h, hk, causal=causal, rotary_emb_dim=rotary,
                             device="cuda", dtype=dtype)
    batch, seqlen = 3, 133
    x = torch.randn(batch, seqlen, h * 64, device="cuda", dtype=dtype, requires_grad=True)
    mask = None
    if masked:
        mask = torch.ones(batch, seqlen, dtype=torch.bool, device="cuda")
        mask[0, 100:] = False
        mask[1, :17] = False
        mask[2, ::3] = False
    out = mha(x, mask)
    assert out.shape == x.shape and out.dtype == dtype
    with torch.no_grad():
        ref = ReferenceMHA(mha, torch.float32)(x, mask)
        pt = ReferenceMHA(mha, dtype)(x, mask)
    attn_helpers.assert_rule(out, ref, pt, 2, 1e-4, "MultiheadAttention output")
    if mask is not None:
        assert torch.equal(out[~mask], mha.out_proj.bias.expand(int((~mask).sum()), -1))

    # The backward runs (through flash_attn_func's kernels) and every gradient is finite.
    out.backward(torch.randn_like(out))
    grads = [x.grad] + [p.grad for p in mha.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert x.grad.abs().sum() > 0
    if mask is not None:  # dropped tokens reach nothing
        assert torch.equal(x.grad[~mask], torch.zeros_like(x.grad[~mask]))


@pytest.mark.gpu
def test_mha_all_true_mask_is_the_padded_path():
    _skip_unless_built(64)
    mha = MultiheadAttention(256, 4, 2, causal=True, rotary_emb_dim=32, device="cuda",
                             dtype=torch.bfloat16)
    x = torch.randn(2, 70, 256, device="cuda", dtype=torch.bfloat16)
    mask = torch.ones(2, 70, dtype=torch.bool, device="cuda")
    assert torch.equal(mha(x, mask), mha(x))
    assert math.isfinite(mha(x).float().abs().max().item())
