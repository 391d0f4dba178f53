"""flashattn_cu as SDPA's flash backend (flashattn_cu/sdpa.py).

CPU tests (CI): activation and restoration in the dispatcher and in torch's registry of flash
implementations, the fallback decisions, and the forward's output tuple on fake CUDA tensors.
GPU tests: F.scaled_dot_product_attention with the backend active against flashattn_cu's ops
called directly (bitwise) and the reference (the rule), every fallback against PyTorch's own
kernel (bitwise), torch.compile and CUDA graphs, deactivation, a tiny transformers model, and a
one-GPU emulation of ring attention (key shards merged through their LSEs).
"""

import math
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn_cu.sdpa as fsdpa
from flashattn_cu import _C
from flashattn_cu.testing import attention_ref, max_abs_diff

FWD = torch.ops.aten._scaled_dot_product_flash_attention.default
CUDA_LINE = "CUDA: registered at"


def cuda_kernel_line():
    dump = torch._C._dispatch_dump("aten::_scaled_dot_product_flash_attention")
    return next(line for line in dump.splitlines() if line.startswith(CUDA_LINE))


def full_build():
    """The CPU tests decide as a build with every head-dim instance would."""
    return mock.patch.object(fsdpa, "_built_head_dims",
                             return_value=tuple(_C.head_dim_instances()))


def need_built(*dims):
    """GPU tests that must run flashattn_cu's kernel at these head dims skip on a build without
    them (FLASHATTN_CU_HEAD_DIMS); the fallback decision itself is tested on CPU."""
    missing = [d for d in dims if d not in fsdpa._built_head_dims()]
    if missing:
        pytest.skip(f"head dim instances {missing} not in this build")


@pytest.fixture
def active():
    fsdpa.reset_call_counts()
    fsdpa.activate()
    try:
        yield
    finally:
        fsdpa.deactivate()


# --------------------------------------------------------------------------------------------
# CPU: registration


def test_registered_by_name_in_torch_registry():
    """Importing flashattn_cu.sdpa names it in torch's registry (where torch has one; without it
    the direct override below serves) and activates nothing."""
    registry = fsdpa._torch_registry()
    assert registry is None or fsdpa.NAME in registry.list_flash_attention_impls()
    assert not fsdpa.is_active()


def test_activate_and_deactivate_swap_the_cuda_kernel():
    original = cuda_kernel_line()
    assert "sdpa.py" not in original
    fsdpa.activate()
    try:
        assert fsdpa.is_active()
        assert "flashattn_cu/sdpa.py" in cuda_kernel_line()
        fsdpa.activate()  # idempotent
        assert fsdpa.is_active() and "flashattn_cu/sdpa.py" in cuda_kernel_line()
        registry = fsdpa._torch_registry()
        if registry is not None:
            assert registry.current_flash_attention_impl() == fsdpa.NAME
    finally:
        fsdpa.deactivate()
    assert not fsdpa.is_active()
    assert cuda_kernel_line() == original
    fsdpa.deactivate()  # a no-op when inactive
    assert cuda_kernel_line() == original


def test_direct_override_without_torch_registry():
    original = cuda_kernel_line()
    with mock.patch.object(fsdpa, "_torch_registry", return_value=None):
        fsdpa.activate()
        try:
            assert fsdpa.is_active() and "flashattn_cu/sdpa.py" in cuda_kernel_line()
        finally:
            fsdpa.deactivate()
        assert not fsdpa.is_active()
    assert cuda_kernel_line() == original


# --------------------------------------------------------------------------------------------
# CPU: fallback decisions and the output tuple, on fake CUDA tensors (pretend sm_90)


def fake_bhsd(b=2, h=4, hk=None, sq=64, sk=64, d=64, dtype=torch.bfloat16):
    hk = h if hk is None else hk
    return (torch.empty(b, h, sq, d, dtype=dtype, device="cuda"),
            torch.empty(b, hk, sk, d, dtype=dtype, device="cuda"),
            torch.empty(b, hk, sk, d, dtype=dtype, device="cuda"))


@pytest.mark.parametrize("change, reason", [
    (dict(dropout_p=0.1), "dropout_p > 0"),
    (dict(sk=80, causal=True), "causal with seqlen_q != seqlen_k"),
    (dict(dtype=torch.float32), "dtype"),
    (dict(d=60), "head dim not a multiple of 8"),
    (dict(d=264), "head dim not a multiple of 8"),
    (dict(h=6, hk=4), "heads"),
    # Scales the kernels refuse (the binding raises on them): PyTorch's kernel computes them.
    (dict(scale=0.0), "scale"),
    (dict(scale=-0.125), "scale"),
    (dict(scale=1e-40), "scale"),
    (dict(scale=2.4e38), "scale"),
    (dict(scale=float("nan")), "scale"),
])
def test_fallback_reasons(change, reason):
    change = dict(change)
    dropout_p, causal = change.pop("dropout_p", 0.0), change.pop("causal", False)
    scale = change.pop("scale", None)
    with FakeTensorMode(), mock.patch.object(fsdpa, "_device_capability", return_value=(9, 0)), \
            full_build():
        q, k, v = fake_bhsd(**change)
        got = fsdpa._unsupported(q, k, v, dropout_p, causal, scale=scale)
    assert got is not None and got.startswith(reason), got


def test_head_dim_not_built_falls_back():
    with FakeTensorMode(), mock.patch.object(fsdpa, "_device_capability", return_value=(9, 0)), \
            mock.patch.object(fsdpa, "_built_head_dims", return_value=(128,)):
        assert fsdpa._unsupported(*fake_bhsd(d=64), 0.0, False) == "head dim not in this build"
        assert fsdpa._unsupported(*fake_bhsd(d=120), 0.0, False) is None  # runs on 128


def test_served_cases():
    with FakeTensorMode(), mock.patch.object(fsdpa, "_device_capability", return_value=(9, 0)), \
            full_build():
        for args, causal in ((dict(), True), (dict(h=8, hk=2), True), (dict(sk=80), False),
                             (dict(d=128, sq=33, sk=33), True)):
            q, k, v = fake_bhsd(**args)
            assert fsdpa._unsupported(q, k, v, 0.0, causal) is None, args
        assert fsdpa._unsupported(*fake_bhsd(), 0.0, False, scale=3.0) is None
        q, k, v = fake_bhsd()
        q_strided = torch.empty(2, 4, 64, 128, dtype=torch.bfloat16, device="cuda")[..., ::2]
        assert fsdpa._unsupported(q_strided, k, v, 0.0, False) == "head dim not contiguous"
    with FakeTensorMode(), mock.patch.object(fsdpa, "_device_capability", return_value=(7, 5)):
        assert fsdpa._unsupported(*fake_bhsd(), 0.0, False) == "GPU older than sm_80"


def test_forward_tuple_on_fake_tensors():
    fsdpa.reset_call_counts()
    with FakeTensorMode(), mock.patch.object(fsdpa, "_device_capability", return_value=(9, 0)):
        q, k, v = fake_bhsd(b=2, h=8, hk=2, sq=33, sk=70, d=64)
        res = fsdpa._forward(None, None, q, k, v, 0.0, False, False)
        out, lse, cum_q, cum_k, max_q, max_k, rng_state, unused, debug = res
        assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
        assert lse.shape == (2, 8, 33) and lse.dtype == torch.float32
        assert cum_q is None and cum_k is None and (max_q, max_k) == (33, 70)
        assert rng_state.dtype == torch.uint64 and debug.numel() == 0
    assert fsdpa.call_counts() == {"forward": 1}


def test_fallback_calls_the_original_kernel():
    fsdpa.reset_call_counts()
    original = mock.Mock()
    with FakeTensorMode(), mock.patch.object(fsdpa, "_device_capability", return_value=(9, 0)):
        q, k, v = fake_bhsd()
        fsdpa._forward(original, "keyset", q, k, v, 0.25, True, False, scale=0.5)
    original.call_boxed.assert_called_once()
    args, kwargs = original.call_boxed.call_args
    assert args[0] == "keyset" and args[4:] == (0.25, True, False) and kwargs == {"scale": 0.5}
    assert fsdpa.call_counts() == {"forward fallback: dropout_p > 0": 1}


# --------------------------------------------------------------------------------------------
# GPU


def bhsd(b, h, hk, sq, sk, d, dtype, requires_grad=False):
    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_(requires_grad)
    return rand(b, h, sq, d), rand(b, hk, sk, d), rand(b, hk, sk, d)


def direct(q, k, v, causal, dout, scale=None, deterministic=False):
    """flashattn_cu's ops called directly on the same (b, h, s, d) tensors, backward from the
    LSE alone: what the SDPA path must reproduce bit for bit."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    out, lse, *_ = torch.ops.flashattn_cu.fwd(t(q), t(k), t(v), scale, causal)
    dq, dk, dv = torch.ops.flashattn_cu.bwd(t(dout), t(q), t(k), t(v), out, lse, scale, causal,
                                            deterministic)
    return t(out), lse, (t(dq), t(dk), t(dv))


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("d", [64, 128])
def test_sdpa_flash_runs_flashattn_cu(active, d, dtype, causal, deterministic):
    """Bitwise what flashattn_cu's ops give when called directly (dq too in deterministic mode;
    otherwise its fp32 atomics add in a run-dependent order), and the reference by the rule."""
    need_built(d)
    q, k, v = bhsd(2, 4, 4, 300, 300, d, dtype, requires_grad=True)
    dout = torch.randn_like(q)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert fsdpa.call_counts() == {"forward": 1, "backward": 1}
    with torch.no_grad():
        out_d, _, grads_d = direct(q, k, v, causal, dout, deterministic=deterministic)
    assert torch.equal(out, out_d)
    for name, g, gd in zip(("dq", "dk", "dv"), grads, grads_d):
        if name == "dq" and not deterministic:
            # fp32 atomics in another order: the sums differ by fp32 rounding of their terms,
            # which can flip the final fp16/bf16 rounding (one ulp) or, where terms cancel to
            # near zero, leave a tiny absolute difference.
            atol = 2.0 ** -16 * gd.abs().max().item()
            torch.testing.assert_close(g, gd, atol=atol, rtol=2.0 ** -7)
        else:
            assert torch.equal(g, gd), name
    # And the reference, by the rule (flash layout for attention_ref).
    t = lambda x: x.detach().transpose(1, 2).requires_grad_()  # noqa: E731
    qr, kr, vr = t(q), t(k), t(v)
    ref, _ = attention_ref(qr, kr, vr, causal=causal)
    pt, _ = attention_ref(qr, kr, vr, causal=causal, upcast=False)
    err, pt_err = max_abs_diff(out.transpose(1, 2), ref), max_abs_diff(pt, ref)
    assert err <= 2 * pt_err + 1e-5
    refs = torch.autograd.grad(ref, (qr, kr, vr), dout.transpose(1, 2).float())
    pts = torch.autograd.grad(pt, (qr, kr, vr), dout.transpose(1, 2))
    for name, g, r, p in zip(("dq", "dk", "dv"), grads, refs, pts):
        assert max_abs_diff(g.transpose(1, 2), r) <= 3 * max_abs_diff(p, r) + 1e-4, name


def layout_qkv(layout, b=2, h=8, s=100, d=64, dtype=torch.bfloat16):
    """(b, h, s, d) q, k, v in the layouts SDPA callers hand over: contiguous (b, h, s, d),
    transposed from (b, s, h, d) (Hugging Face, torchtitan), sliced from a packed (b, s, 3, h, d)
    projection (not dense: aten's meta gives its output fresh strides)."""
    if layout == "bhsd":
        return tuple(torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
    if layout == "bshd":
        return tuple(torch.randn(b, s, h, d, device="cuda", dtype=dtype).transpose(1, 2)
                     for _ in range(3))
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=dtype)
    return tuple(qkv[:, :, i].transpose(1, 2) for i in range(3))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bhsd", "bshd", "packed"])
def test_output_tuple_matches_pytorchs_kernel(layout):
    """The 9-tuple, the output's strides and the gradients' strides as PyTorch's own kernel
    gives them (torch.compile'd graphs assert the strides of aten's meta functions)."""
    need_built(64)
    q, k, v = layout_qkv(layout)
    dout = torch.randn_like(q)
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_backward.default

    def both(fn):
        theirs = fn()
        fsdpa.activate()
        try:
            ours = fn()
        finally:
            fsdpa.deactivate()
        return ours, theirs

    ours, theirs = both(lambda: FWD(q, k, v, 0.0, True, False))
    assert len(ours) == len(theirs) == 9
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, i
            assert a.device == b.device, i
        else:
            assert a == b, i
    assert ours[0].stride() == theirs[0].stride()
    assert ours[0].stride() == torch.empty_like(q, device="meta").stride()
    torch.testing.assert_close(ours[1], theirs[1], atol=1e-4, rtol=0)

    out, lse = theirs[0], theirs[1]
    g_ours, g_theirs = both(lambda: bwd(dout, q, k, v, out, lse, None, None, 100, 100, 0.0, True,
                                        theirs[6], theirs[7]))
    for a, b, x in zip(g_ours, g_theirs, (q, k, v)):
        assert a.shape == b.shape and a.stride() == b.stride(), (a.stride(), b.stride())
        assert a.stride() == torch.empty_like(x, device="meta").stride()


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["dropout", "causal_sq_ne_sk", "debug_mask"])
def test_fallbacks_give_pytorchs_answer(case):
    q, k, v = bhsd(2, 4, 4, 96, 160, 64, torch.float16)
    kwargs = dict(dropout_p=0.0, is_causal=False, return_debug_mask=False)
    if case == "dropout":
        kwargs["dropout_p"] = 0.2
    elif case == "causal_sq_ne_sk":
        kwargs["is_causal"] = True
    else:
        kwargs["dropout_p"], kwargs["return_debug_mask"] = 0.1, True

    def call():
        torch.manual_seed(1234)
        return FWD(q, k, v, **kwargs)
    theirs = call()
    fsdpa.reset_call_counts()
    fsdpa.activate()
    try:
        ours = call()
    finally:
        fsdpa.deactivate()
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    assert list(fsdpa.call_counts()) and all("fallback" in key for key in fsdpa.call_counts())


@pytest.mark.gpu
def test_deactivate_restores_pytorchs_kernel():
    need_built(64)
    q, k, v = bhsd(1, 2, 2, 128, 128, 64, torch.bfloat16)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        theirs = F.scaled_dot_product_attention(q, k, v)
        fsdpa.activate()
        fsdpa.deactivate()
        fsdpa.reset_call_counts()
        again = F.scaled_dot_product_attention(q, k, v)
    assert fsdpa.call_counts() == {} and torch.equal(again, theirs)


@pytest.mark.gpu
def test_compile_and_cuda_graph(active):
    need_built(64)
    q, k, v = bhsd(2, 4, 4, 256, 256, 64, torch.bfloat16)

    def attn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch._dynamo.reset()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        eager = attn(q, k, v)
        compiled = torch.compile(attn, fullgraph=True)(q, k, v)
        assert torch.equal(compiled, eager)
        assert fsdpa.call_counts()["forward"] >= 2
        # CUDA graph: capture, then replay on new data.
        static_q = q.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            attn(static_q, k, v)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = attn(static_q, k, v)
        static_q.copy_(torch.randn_like(q))
        graph.replay()
        assert torch.equal(static_out, attn(static_q, k, v))


@pytest.mark.gpu
def test_one_gpu_ring_emulation():
    """Ring attention on one GPU: the keys of one sequence in 4 shards, each attended to with
    flashattn_cu's forward (causal on the diagonal shard, full before it, skipped after), the
    partial outputs merged in fp32 through their LSEs; against the whole sequence at once."""
    need_built(128)
    b, h, s, d, shards = 1, 4, 4096, 128, 4
    q, k, v = bhsd(b, h, h, s, s, d, torch.bfloat16)
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    scale = d ** -0.5
    full, lse_full, *_ = torch.ops.flashattn_cu.fwd(t(q), t(k), t(v), scale, True)
    n = s // shards
    merged = []
    for i in range(shards):  # query shard i (what rank i holds)
        qi = t(q)[:, i * n:(i + 1) * n]
        outs, lses = [], []
        for j in range(i + 1):  # key shards that reach it around the ring
            kj, vj = t(k)[:, j * n:(j + 1) * n], t(v)[:, j * n:(j + 1) * n]
            o, lse, *_ = torch.ops.flashattn_cu.fwd(qi, kj, vj, scale, i == j)
            outs.append(o.float())
            lses.append(lse)
        lse_all = torch.logsumexp(torch.stack(lses), dim=0)  # (b, h, n)
        o = sum(oj * torch.exp(lj - lse_all).transpose(1, 2).unsqueeze(-1)
                for oj, lj in zip(outs, lses))
        merged.append(o)
        assert max_abs_diff(lse_all, lse_full[:, :, i * n:(i + 1) * n]) <= 1e-4
    merged = torch.cat(merged, dim=1)
    # One extra bf16 rounding per shard output: within a couple of bf16 ulps of the whole.
    assert max_abs_diff(merged, full.float()) <= 2 * 2.0 ** -8 * full.abs().max().item()


@pytest.mark.gpu
def test_transformers_model_runs_flashattn_cu(active):
    need_built(32)
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=4, max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model = model.cuda().to(torch.bfloat16).eval()
    ids = torch.randint(0, 256, (2, 96), device="cuda")
    with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        ours = model(ids).logits.float()
        counted = fsdpa.call_counts().get("forward", 0)
        fsdpa.deactivate()
        theirs = model(ids).logits.float()
    assert counted >= config.num_hidden_layers, fsdpa.call_counts()
    # Two bf16 FlashAttention implementations through two layers: logits agree to bf16 noise.
    assert max_abs_diff(ours, theirs) <= 0.05 * max(1.0, theirs.abs().max().item())
    assert math.isfinite(ours.sum().item())
