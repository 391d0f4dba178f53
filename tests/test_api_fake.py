"""CPU tests of the Python API's fake implementations (FakeTensorMode on a pretend GPU, and meta
tensors): output shapes and layouts, the arguments that reach the op (scale, window), and
torch.compile tracing of the training and inference routes. None of these needs a GPU."""

from unittest import mock

import pytest
import torch

from api_helpers import F16, capture_apply, cpu_qkv, fake_cuda_qkv, no_device_check, pretend_gpu
from attn_helpers import layouts
from flashattn_cu import _arguments, flash_attn_func
from flashattn_cu import flash_attn_interface as fai


@pytest.mark.parametrize("d", [32, 59, 111, 256])
def test_fake_cuda_shapes_and_padding(d):
    with pretend_gpu((9, 0)):
        q, k, v = fake_cuda_qkv(d=d)
        out, lse, s_dmask = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
        assert lse.shape == (2, 4, 5) and lse.dtype == torch.float32
        assert s_dmask is None
        assert flash_attn_func(q, k, v).shape == q.shape


@pytest.mark.parametrize("d, scale", [(64, None), (59, None), (64, 0.3)])
def test_default_scale_uses_original_head_dim(d, scale):
    calls, spy = capture_apply()
    with pretend_gpu((8, 0)), mock.patch.object(fai.FlashAttnFunc, "apply", side_effect=spy):
        q, k, v = fake_cuda_qkv(d=d)
        flash_attn_func(q, k, v, softmax_scale=scale)
    (q_arg, _, _, scale_arg, causal_arg, det_arg, *_), = calls
    assert q_arg.shape[-1] == -(-d // 8) * 8  # padded to a multiple of 8
    assert scale_arg == pytest.approx(d ** -0.5 if scale is None else scale)
    assert causal_arg is False and det_arg is False


@pytest.mark.parametrize("window, causal, passed", [
    ((-1, 0), True, (-1, 0)), ([-1, -1], False, (-1, -1)), ((-7, -2), False, (-1, -1)),
    ((3, 5), False, (3, 5)), ((0, 0), False, (0, 0)), ((6, 0), False, (6, 0)),
    # seqlen_k is 7 here: flash_attn's normalization (_arguments._flash_attn_window).
    ((128, 0), True, (-1, 0)), ((7, 0), True, (-1, 0)), ((-1, 16), False, (-1, -1)),
    ((2**40, 7), False, (-1, -1)), ((3, -1), False, (3, 7)), ((3, 2**40), False, (3, 7)),
])
def test_window_sizes_reach_the_kernel(window, causal, passed):
    """flash_attn's window_size: negative sides are unbounded, (-1, 0) is causal; a side >=
    seqlen_k is unbounded, and a bounded left with an unbounded right takes right = seqlen_k
    (flash_attn's flash_api.cpp); the rest reach the op as (window_left, window_right)."""
    calls, spy = capture_apply()
    with pretend_gpu((8, 0)), mock.patch.object(fai.FlashAttnFunc, "apply", side_effect=spy):
        q, k, v = fake_cuda_qkv()
        flash_attn_func(q, k, v, window_size=window, deterministic=True)
    assert calls[0][4] is causal and calls[0][5] is True
    assert tuple(calls[0][6:8]) == passed


@pytest.mark.parametrize("causal, window, seqlen_k, expected", [
    (False, (-1, -1), 100, (False, -1, -1)), (True, (-1, -1), 100, (True, -1, 0)),
    (True, (50, 7), 100, (True, 50, 0)), (False, (50, 7), 100, (False, 50, 7)),
    (False, (99, 99), 100, (False, 99, 99)), (False, (100, 99), 100, (False, -1, 99)),
    (False, (100, 0), 100, (True, -1, 0)), (True, (100, 30), 100, (True, -1, 0)),
    (False, (100, 100), 100, (False, -1, -1)), (False, (-1, 100), 100, (False, -1, -1)),
    (False, (20, -1), 100, (False, 20, 100)), (False, (20, 500), 100, (False, 20, 100)),
    (False, (0, -1), 0, (False, -1, -1)), (True, (5, 5), 0, (True, -1, 0)),
])
def test_flash_attn_window_normalization(causal, window, seqlen_k, expected):
    """flash_api.cpp's rules: sides >= seqlen_k unbounded, then causal (or (-1, 0)) with right
    0, then a bounded left with an unbounded right at right = seqlen_k."""
    assert _arguments._flash_attn_window(causal, *window, seqlen_k) == expected


def test_inference_route_passes_the_same_arguments():
    """Without autograd the call takes fwd_splitkv (flash_attn_interface._split_kv_route) with
    the scale, causal flag, window, ALiBi slopes and softcap the autograd path passes on; the
    output is cut back to the caller's head dim."""
    calls = []
    real = fai._fwd_splitkv

    def spy(*args):
        calls.append(args)
        return real(*args)
    with pretend_gpu((9, 0)), mock.patch.object(fai, "_fwd_splitkv", spy):
        q, k, v = fake_cuda_qkv(d=59, grad=False)
        slopes = torch.ones(4, device="cuda:0")
        out, lse, probs = flash_attn_func(q, k, v, causal=True, window_size=(5, 4), softcap=5.0,
                                          alibi_slopes=slopes, return_attn_probs=True)
    (q_arg, k_arg, _, scale, causal, left, right, alibi, softcap), = calls
    assert q_arg.shape[-1] == k_arg.shape[-1] == 64  # padded to a multiple of 8
    assert scale == pytest.approx(59 ** -0.5) and causal is True and (left, right) == (5, 0)
    assert alibi is not None and softcap == 5.0
    assert out.shape == q.shape and lse.shape == (2, 4, 5) and probs is None


def test_causal_sets_the_window_right_side_to_zero():
    calls, spy = capture_apply()
    with pretend_gpu((8, 0)), mock.patch.object(fai.FlashAttnFunc, "apply", side_effect=spy):
        q, k, v = fake_cuda_qkv()
        flash_attn_func(q, k, v, window_size=(5, 4), causal=True)  # seqlen_k 7
    assert calls[0][4] is True and tuple(calls[0][6:8]) == (5, 0)


@pytest.mark.parametrize("window", [(1.5, 0), ("a", 1), (True, 0)])
def test_window_size_must_be_ints(window):
    q, k, v = cpu_qkv()
    with pytest.raises(ValueError, match="window_size must be a pair of ints"):
        flash_attn_func(q, k, v, window_size=window)


def test_fake_impls_on_meta():
    q = torch.empty(3, 9, 8, 128, device="meta", dtype=torch.bfloat16)
    k = torch.empty(3, 17, 2, 128, device="meta", dtype=torch.bfloat16)
    out, lse, stats, *_ = torch.ops.flashattn_cu.fwd(q, k, k, 0.1, False)
    assert out.shape == q.shape and out.is_contiguous() and out.dtype == q.dtype
    assert lse.shape == (3, 8, 9) and lse.dtype == torch.float32 and lse.is_contiguous()
    assert stats.shape == (3, 8, 9, 2) and stats.dtype == torch.float32 and stats.is_contiguous()
    for extra in ((), (stats,)):
        dq, dk, dv = torch.ops.flashattn_cu.bwd(out, q, k, k, out, lse, 0.1, False, True, *extra)
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == k.shape
        assert all(t.is_contiguous() and t.dtype == q.dtype for t in (dq, dk, dv))


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "packed"])
def test_fake_output_layout_follows_q(layout):
    """Outputs and gradients take q's (k's, v's) strides where the input is dense, as
    flash_attn's torch.empty_like(q) does (and SDPA's meta functions); fresh contiguous
    otherwise."""
    q = layouts("meta")[layout]
    out, lse, *_ = torch.ops.flashattn_cu.fwd(q, q, q, 0.1, False)
    dense = layout != "packed"
    expected = q.stride() if dense else q.contiguous().stride()
    assert out.stride() == expected
    dq, dk, dv = torch.ops.flashattn_cu.bwd(out, q, q, q, out, lse, 0.1, False, False)
    assert dq.stride() == dk.stride() == dv.stride() == expected


@pytest.mark.parametrize("d", [64, 59])
def test_compile_fullgraph_traces_forward_and_backward(d):
    """torch.compile(fullgraph=True) traces validation, padding, the autograd Function and both
    ops with no graph break. Run on meta tensors (fake impls), device check patched out."""
    torch._dynamo.reset()
    q = torch.randn(2, 5, 4, d, device="meta", dtype=F16, requires_grad=True)
    k = torch.randn(2, 7, 2, d, device="meta", dtype=F16, requires_grad=True)
    v = torch.randn(2, 7, 2, d, device="meta", dtype=F16, requires_grad=True)

    def step(q, k, v):
        out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        return out.float().sum() + lse.sum() * 0

    with mock.patch.object(fai, "_check_devices", no_device_check):
        loss = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v)
        loss.backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_compile_fullgraph_traces_the_inference_route():
    """Without autograd (a decode step) the traced graph holds fwd_splitkv, no graph break."""
    torch._dynamo.reset()
    q = torch.randn(2, 1, 8, 64, device="meta", dtype=F16)
    k = torch.randn(2, 300, 2, 64, device="meta", dtype=F16)
    ops = []

    def backend(gm, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    with mock.patch.object(fai, "_check_devices", no_device_check), torch.no_grad():
        out = torch.compile(lambda q, k, v: flash_attn_func(q, k, v, causal=True),
                            fullgraph=True, backend=backend)(q, k, k)
    assert out.shape == q.shape
    assert any("fwd_splitkv" in name for name in ops) and not any(
        "flashattn_cu.fwd." in name or name.endswith("flashattn_cu.fwd") for name in ops), ops
