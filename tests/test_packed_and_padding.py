"""flashattn_cu.bert_padding (CPU: pure PyTorch) and the packed entry points
flash_attn_qkvpacked_func / flash_attn_kvpacked_func (argument checks on CPU, results on the GPU).
"""

import pytest
import torch

import attn_helpers
from api_helpers import pretend_gpu
from flashattn_cu import (_C, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                          flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func)
from flashattn_cu.bert_padding import (index_first_axis, index_first_axis_residual,
                                       index_put_first_axis, pad_input, unpad_input,
                                       unpad_input_for_concatenated_sequences)

# --------------------------------------------------------------------------------------------
# bert_padding (CPU)


def random_mask(batch, seqlen, gen, lengths=None):
    """A (batch, seqlen) bool mask whose row b keeps lengths[b] tokens at random places."""
    if lengths is None:
        lengths = torch.randint(0, seqlen + 1, (batch,), generator=gen).tolist()
    mask = torch.zeros(batch, seqlen, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, torch.randperm(seqlen, generator=gen)[:n]] = True
    return mask


@pytest.mark.parametrize("lengths", [[5, 0, 7, 1], [7, 7, 7, 7], [0, 0, 0, 0], [3, 6, 2, 7]])
def test_unpad_input_against_a_loop(lengths):
    gen = torch.Generator().manual_seed(len(lengths) + sum(lengths))
    batch, seqlen = len(lengths), 7
    x = torch.randn(batch, seqlen, 3, 2, generator=gen)
    mask = random_mask(batch, seqlen, gen, lengths)
    x_unpad, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, mask)
    # The tokens of each row, in order, one row after the other.
    expected = torch.cat([x[b][mask[b]] for b in range(batch)])
    assert torch.equal(x_unpad, expected)
    assert indices.dtype == torch.int64 and torch.equal(x.reshape(-1, 3, 2)[indices], expected)
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == \
        [sum(lengths[:b]) for b in range(batch + 1)]
    assert isinstance(max_seqlen, int) and max_seqlen == max(lengths)
    assert seqused.dtype == torch.int32 and seqused.tolist() == lengths
    back = pad_input(x_unpad, indices, batch, seqlen)
    assert torch.equal(back, torch.where(mask[..., None, None], x, torch.zeros_like(x)))


def test_unpad_input_with_unused_mask():
    """Tokens in unused_mask are kept in the output and in cu_seqlens, not in seqused
    (flash_attn 2.7's contract)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 4, generator=gen)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]], dtype=torch.int32)
    unused = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 0, 1, 0, 0, 0]], dtype=torch.int32)
    x_unpad, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, mask, unused)
    assert indices.tolist() == [0, 1, 2, 3, 4, 6, 7, 8]
    assert cu_seqlens.tolist() == [0, 5, 8] and max_seqlen == 5 and seqused.tolist() == [3, 2]
    assert torch.equal(x_unpad, x.reshape(12, 4)[indices])


def test_index_first_axis_and_pad_input_gradients():
    """The custom backward passes gradcheck in float64."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(12, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    indices = torch.tensor([0, 4, 5, 11])
    torch.autograd.gradcheck(lambda t: index_first_axis(t, indices), (x,))
    y = torch.randn(4, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    torch.autograd.gradcheck(lambda t: pad_input(t, indices, 3, 4), (y,))


def test_index_put_first_axis_takes_flash_attns_keywords():
    values = torch.arange(6.0).view(3, 2)
    out = index_put_first_axis(values=values, indices=torch.tensor([4, 0, 2]), first_axis_dim=5)
    assert out.tolist() == [[2.0, 3.0], [0.0, 0.0], [4.0, 5.0], [0.0, 0.0], [0.0, 1.0]]


def test_padding_helpers_reject_bad_arguments():
    x = torch.zeros(2, 5, 3)
    with pytest.raises(ValueError, match=r"attention_mask must be \(batch, seqlen\) = \(2, 5\)"):
        unpad_input(x, torch.ones(2, 4))
    with pytest.raises(ValueError, match="unused_mask must have attention_mask's shape"):
        unpad_input(x, torch.ones(2, 5), torch.ones(5, 2))
    with pytest.raises(ValueError, match="indices must be a 1-d int64 or int32 tensor"):
        index_first_axis(x.reshape(10, 3), torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="values has 3 rows but indices has 2"):
        pad_input(torch.zeros(3, 4), torch.tensor([0, 1]), 2, 2)


def test_unpad_input_for_concatenated_sequences_against_a_loop():
    """Each row's samples (the nonzero lengths, in order) become sequences of their own; the
    first sum(row) tokens of each row are kept (flash_attn's docstring example, plus a row with
    a zero between samples, which flash_attn also skips, and an empty row)."""
    gen = torch.Generator().manual_seed(3)
    lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [3, 2, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0],
                            [1, 0, 4, 0, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.int32)
    x = torch.randn(5, 6, 2, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    x_unpad, indices, cu_seqlens, max_seqlen = unpad_input_for_concatenated_sequences(x, lengths)
    samples = [n for row in lengths.tolist() for n in row if n]
    assert samples == [2, 3, 3, 2, 6, 1, 4]
    assert cu_seqlens.dtype == torch.int32
    assert cu_seqlens.tolist() == [sum(samples[:i]) for i in range(len(samples) + 1)]
    assert isinstance(max_seqlen, int) and max_seqlen == 6
    expected = torch.cat([x[b, :int(lengths[b].sum())] for b in range(5)])
    assert indices.dtype == torch.int64 and torch.equal(x_unpad, expected)
    torch.autograd.gradcheck(
        lambda t: unpad_input_for_concatenated_sequences(t, lengths)[0], (x,))
    with pytest.raises(ValueError, match=r"summing to at most seqlen=6"):
        unpad_input_for_concatenated_sequences(x, torch.tensor([[4, 3, 0, 0, 0, 0]] * 5))
    with pytest.raises(ValueError, match="non-negative sample lengths"):
        unpad_input_for_concatenated_sequences(x, torch.tensor([[2, -1, 0, 0, 0, 0]] * 5))
    with pytest.raises(ValueError, match="integer sample lengths"):
        unpad_input_for_concatenated_sequences(x, lengths.float())
    with pytest.raises(ValueError, match=r"must be \(batch, seqlen\) = \(5, 6\)"):
        unpad_input_for_concatenated_sequences(x, lengths[:4])


def test_index_first_axis_residual():
    """(input[indices], input): both outputs' gradients reach input."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(7, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    indices = torch.tensor([1, 4, 6])
    picked, residual = index_first_axis_residual(x, indices)
    assert torch.equal(picked, x[indices]) and torch.equal(residual, x)
    torch.autograd.gradcheck(
        lambda t: tuple(index_first_axis_residual(t, indices)), (x,))
    (picked * 2).sum().backward()  # the residual unused: its gradient counts as zero
    assert x.grad[indices].eq(2).all() and x.grad[[0, 2, 3, 5]].eq(0).all()
    with pytest.raises(ValueError, match="at least two dimensions"):
        index_first_axis_residual(torch.zeros(5), indices)


# --------------------------------------------------------------------------------------------
# Packed entry points: argument checks (fake CUDA tensors, no GPU needed)


def test_packed_shapes_on_fake_tensors():
    with pretend_gpu():
        qkv = torch.empty(2, 9, 3, 4, 64, dtype=torch.float16, device="cuda")
        out, lse, _ = flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
        assert out.shape == (2, 9, 4, 64) and lse.shape == (2, 4, 9)
        q = torch.empty(2, 9, 4, 64, dtype=torch.float16, device="cuda")
        kv = torch.empty(2, 13, 2, 2, 64, dtype=torch.float16, device="cuda")
        assert flash_attn_kvpacked_func(q, kv).shape == (2, 9, 4, 64)


@pytest.mark.parametrize("fn, args, message", [
    (flash_attn_qkvpacked_func, ((2, 9, 4, 64),),
     r"^flash_attn_qkvpacked_func: qkv must be \(batch, seqlen, 3, nheads, headdim\), got shape "
     r"\(2, 9, 4, 64\)"),
    (flash_attn_qkvpacked_func, ((2, 9, 2, 4, 64),), r"qkv must be \(batch, seqlen, 3, nheads"),
    (flash_attn_kvpacked_func, ((2, 9, 4, 64), (2, 9, 3, 4, 64)),
     r"^flash_attn_kvpacked_func: kv must be \(batch, seqlen_k, 2, nheads_k"),
    (flash_attn_varlen_qkvpacked_func, ((9, 2, 4, 64), (3,), 5),
     r"^flash_attn_varlen_qkvpacked_func: qkv must be \(total, 3, nheads, headdim\), got shape "
     r"\(9, 2, 4, 64\)"),
    (flash_attn_varlen_qkvpacked_func, ((9, 3, 4, 64, 1), (3,), 5), r"qkv must be \(total, 3"),
    (flash_attn_varlen_kvpacked_func, ((9, 4, 64), (9, 3, 4, 64), (3,), (3,), 5, 5),
     r"^flash_attn_varlen_kvpacked_func: kv must be \(total_k, 2, nheads_k, headdim\)"),
])
def test_packed_shape_errors(fn, args, message):
    tensors = [torch.empty(a, dtype=torch.float16) if isinstance(a, tuple) else a for a in args]
    with pytest.raises(ValueError, match=message):
        fn(*tensors)


@pytest.mark.parametrize("fn, args", [
    (flash_attn_qkvpacked_func, ([1, 2, 3],)),
    (flash_attn_varlen_kvpacked_func, (torch.empty(9, 4, 64), "kv", None, None, 5, 5)),
])
def test_packed_type_errors(fn, args):
    with pytest.raises(TypeError, match=rf"^{fn.__name__}: q?kv must be a torch.Tensor, got "):
        fn(*args)


# --------------------------------------------------------------------------------------------
# Packed entry points on the GPU: exactly flash_attn_func on the unpacked tensors


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_qkvpacked_is_flash_attn_func(causal):
    if attn_helpers.instance_for(64) not in _C.built_head_dims():
        pytest.skip("head dim 64 not in this build")
    qkv = torch.randn(2, 77, 3, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(2, 77, 4, 64, device="cuda", dtype=torch.bfloat16)
    out = flash_attn_qkvpacked_func(qkv, causal=causal, deterministic=True)
    (dqkv,) = torch.autograd.grad(out, (qkv,), dout)
    q, k, v = (t.detach().clone().requires_grad_() for t in qkv.unbind(2))
    ref = flash_attn_func(q, k, v, causal=causal, deterministic=True)
    grads = torch.autograd.grad(ref, (q, k, v), dout)
    assert torch.equal(out, ref)
    assert dqkv.shape == qkv.shape and torch.equal(dqkv, torch.stack(grads, dim=2))


@pytest.mark.gpu
def test_kvpacked_is_flash_attn_func():
    if attn_helpers.instance_for(128) not in _C.built_head_dims():
        pytest.skip("head dim 128 not in this build")
    q = torch.randn(2, 50, 6, 128, device="cuda", dtype=torch.float16, requires_grad=True)
    kv = torch.randn(2, 90, 2, 2, 128, device="cuda", dtype=torch.float16, requires_grad=True)
    dout = torch.randn_like(q)
    out, lse, _ = flash_attn_kvpacked_func(q, kv, causal=True, deterministic=True,
                                           return_attn_probs=True)
    dq, dkv = torch.autograd.grad(out, (q, kv), dout)
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, *kv.unbind(2)))
    ref, ref_lse, _ = flash_attn_func(q2, k2, v2, causal=True, deterministic=True,
                                      return_attn_probs=True)
    rq, rk, rv = torch.autograd.grad(ref, (q2, k2, v2), dout)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    assert torch.equal(dq, rq) and torch.equal(dkv, torch.stack((rk, rv), dim=2))
