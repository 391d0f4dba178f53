"""flashattn_cu.integrations.transformers' attention function and mask function called directly
(CPU, the kernels replaced by transformers_helpers' float32 stand-ins): the arguments that reach
the kernels, what raises by name, padding and cross-attention masks, the mask functions the
kernels can and cannot express. Skipped where transformers is not installed (CI)."""

import re

import pytest
import torch

from flashattn_cu.testing import max_abs_diff
from transformers_helpers import (  # noqa: F401  (fixtures: registered is autouse, standins)
    NAME, batch, fa_tf, reference, registered, standins, tiny_model, transformers)


class Layer(torch.nn.Module):
    """What attention_forward reads from the calling layer: is_causal, and a Linear's dtype."""

    def __init__(self, dtype=torch.float32, is_causal=True):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4, dtype=dtype)
        self.is_causal = is_causal


def qkv(batch_size=2, heads=4, heads_k=2, seqlen=9, seqlen_k=None, d=16, d_v=None):
    seqlen_k = seqlen if seqlen_k is None else seqlen_k
    return (torch.randn(batch_size, heads, seqlen, d),
            torch.randn(batch_size, heads_k, seqlen_k, d),
            torch.randn(batch_size, heads_k, seqlen_k, d if d_v is None else d_v))


@pytest.mark.parametrize("kwarg", ["s_aux", "position_bias", "indices", "block_indices",
                                   "head_mask", "some_new_argument"])
def test_unsupported_arguments_raise_by_name(kwarg, standins):
    q, k, v = qkv()
    with pytest.raises(NotImplementedError, match=kwarg):
        fa_tf.attention_forward(Layer(), q, k, v, None, **{kwarg: torch.zeros(4)})
    assert standins.calls == []
    # None requests nothing; the harmless arguments are ignored.
    fa_tf.attention_forward(Layer(), q, k, v, None, s_aux=None, use_cache=True,
                            output_hidden_states=False, num_items_in_batch=3)


def test_s_aux_through_a_model_raises_by_name(standins, monkeypatch):
    """A model layer passing attention sinks (as gpt-oss does) gets NotImplementedError."""
    model = tiny_model("llama", attn=NAME)
    forward = fa_tf.attention_forward

    def with_sinks(*args, **kwargs):
        return forward(*args, s_aux=torch.zeros(4), **kwargs)

    monkeypatch.setitem(transformers.AttentionInterface._global_mapping, NAME, with_sinks)
    with pytest.raises(NotImplementedError, match="s_aux"):
        model(batch(padded=False)[0])


def test_four_d_masks_and_mask_overlays_raise():
    q, k, v = qkv()
    with pytest.raises(NotImplementedError, match="4-D attention mask"):
        fa_tf.attention_forward(Layer(), q, k, v, torch.zeros(2, 1, 9, 9))
    with pytest.raises(NotImplementedError, match="or_mask_function"):
        fa_tf.padding_mask(batch_size=2, q_length=9, kv_length=9, attention_mask=None,
                           use_vmap=True)


def test_padding_mask_contract():
    full = torch.ones(2, 9, dtype=torch.bool)
    assert fa_tf.padding_mask(batch_size=2, q_length=9, kv_length=9, attention_mask=None) is None
    assert fa_tf.padding_mask(batch_size=2, q_length=9, kv_length=9, attention_mask=full) is None
    padded = full.clone()
    padded[0, :3] = False
    assert torch.equal(fa_tf.padding_mask(batch_size=2, q_length=9, kv_length=9,
                                          attention_mask=padded), padded)
    # A sliding layer's cache holds the last kv_length positions: the mask is cut to them.
    assert fa_tf.padding_mask(batch_size=2, q_length=1, kv_length=5, attention_mask=padded) is None
    assert torch.equal(fa_tf.padding_mask(batch_size=2, q_length=1, kv_length=7,
                                          attention_mask=padded), padded[:, -7:])
    # A static cache is longer than the mask: the mask is kept, all ones or not.
    assert torch.equal(fa_tf.padding_mask(batch_size=2, q_length=9, kv_length=16,
                                          attention_mask=full), full)


@pytest.mark.parametrize("seqlen_q", [1, 3, 9], ids=["decode", "shorter", "same_length"])
def test_cross_attention_padding_masks_the_keys_only(seqlen_q, standins):
    """Cross-attention (BART, Whisper, ...): the 2-D mask is the encoder's padding and describes
    the keys only. Every decoder query attends to its entry's real keys, also at positions where
    the encoder is padded and when the decoder happens to be as long as the encoder (the
    queries were unpadded by the keys' mask: those rows came back 0)."""
    q, k, v = qkv(seqlen=seqlen_q, seqlen_k=9)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 5:] = False  # entry 1's encoder is right-padded: 5 real keys
    out, _ = fa_tf.attention_forward(Layer(is_causal=False), q, k, v, mask)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    for b, n in enumerate((9, 5)):
        want = reference(qt[b:b + 1], kt[b:b + 1, :n], vt[b:b + 1, :n], 16 ** -0.5, False,
                         (-1, -1), 0.0)
        assert torch.allclose(out[b:b + 1], want, atol=1e-5), (b, max_abs_diff(out[b:b + 1],
                                                                                 want))


def test_mask_functions_the_kernels_cannot_express_raise():
    """transformers hands the mask interface its mask function even without use_vmap: causal,
    sliding-window, padding and packed-sequence parts are what the kernels do through the
    attention function's arguments; chunked attention, block overlays (or_masks) and functions
    from elsewhere were silently dropped (plain causal attention computed instead)."""
    mu = pytest.importorskip("transformers.masking_utils")
    ids = torch.tensor([[0, 0, 1, 1, 1, 2]])
    packed = torch.tensor([[1, 1, 1, 2, 2, 2]])
    expressed = [None, mu.causal_mask_function, mu.bidirectional_mask_function,
                 mu.sliding_window_causal_mask_function(4),
                 mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(packed)),
                 mu.and_masks(mu.causal_mask_function,
                              mu.padding_mask_function(torch.ones(1, 6, dtype=torch.bool)))]
    if hasattr(mu, "sliding_window_bidirectional_mask_function"):
        expressed.append(mu.sliding_window_bidirectional_mask_function(4))
    for fn in expressed:
        assert fa_tf.padding_mask(batch_size=1, q_length=6, kv_length=6, mask_function=fn,
                                  attention_mask=None) is None
    refused = [(mu.chunked_causal_mask_function(4, torch.zeros(1, dtype=torch.long)),
                "chunked attention"),
               (mu.or_masks(mu.causal_mask_function, mu.blockwise_overlay(ids)),
                "within token blocks"),
               (mu.or_masks(mu.causal_mask_function, mu.bidirectional_mask_function), "or_masks"),
               (lambda b, h, q, kv: kv <= q, re.escape(__name__))]
    for fn, fragment in refused:
        with pytest.raises(NotImplementedError, match=fragment):
            fa_tf.padding_mask(batch_size=1, q_length=6, kv_length=6, mask_function=fn,
                               attention_mask=torch.ones(1, 6, dtype=torch.bool))


def test_arguments_reach_the_kernels(standins, monkeypatch):
    q, k, v = qkv(seqlen=9)
    out, weights = fa_tf.attention_forward(Layer(is_causal=False), q, k, v, None, scaling=0.7,
                                           sliding_window=4, softcap=20.0, deterministic=True)
    assert weights is None and out.shape == (2, 9, 4, 16)
    _, args = standins.calls[-1]
    assert args["causal"] is False and args["scale"] == 0.7 and args["window"] == (3, 3)
    assert args["softcap"] == 20.0 and args["deterministic"] is True
    torch.testing.assert_close(out, reference(q.transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2), 0.7, False, (3, 3), 20.0))
    # is_causal passed wins over the module's; a window as long as the keys is no window.
    fa_tf.attention_forward(Layer(is_causal=False), q, k, v, None, is_causal=True,
                            sliding_window=9)
    _, args = standins.calls[-1]
    assert args["causal"] is True and args["window"] == (-1, -1) and args["deterministic"] is False
    monkeypatch.setenv("FLASH_ATTENTION_DETERMINISTIC", "1")
    fa_tf.attention_forward(Layer(), q, k, v, None)
    assert standins.calls[-1][1]["deterministic"] is True
    with pytest.raises(ValueError, match="sliding_window"):
        fa_tf.attention_forward(Layer(), q, k, v, None, sliding_window=0)
    layer = Layer()
    del layer.is_causal
    with pytest.raises(ValueError, match="is_causal"):
        fa_tf.attention_forward(layer, q, k, v, None)


@pytest.mark.parametrize("d_v", [8, 24])
def test_value_head_dim_unlike_the_query(d_v, standins):
    q, k, v = qkv(d=16, d_v=d_v)
    out, _ = fa_tf.attention_forward(Layer(), q, k, v, None)
    assert out.shape == (2, 9, 4, d_v)
    ref = reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 16 ** -0.5, True,
                    (-1, -1), 0.0)
    torch.testing.assert_close(out, ref)


def test_float32_activations_of_a_16_bit_layer_are_cast(standins):
    """As transformers: float32 q/k/v of a layer with bf16 weights (PEFT's float32 norms) reach
    the kernels in bf16; a float32 layer's stay float32 (the real kernels then raise)."""
    q, k, v = qkv()
    out, _ = fa_tf.attention_forward(Layer(torch.bfloat16), q, k, v, None)
    assert standins.calls[-1][1]["dtype"] == torch.bfloat16 and out.dtype == torch.bfloat16
    fa_tf.attention_forward(Layer(torch.float32), q, k, v, None)
    assert standins.calls[-1][1]["dtype"] == torch.float32


def test_decode_and_static_cache_shapes(standins):
    """One query per row against longer keys with a padding mask: the queries are the mask's
    last positions; keys past the mask (unwritten static-cache slots) are dropped."""
    q, k, v = qkv(seqlen=1, seqlen_k=16)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, :6] = False
    out, _ = fa_tf.attention_forward(Layer(), q, k, v, mask)
    _, args = standins.calls[-1]
    assert args["lens_q"] == [1, 1] and args["lens_k"] == [10, 4]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    for b, keys in ((0, slice(0, 10)), (1, slice(6, 10))):
        ref = reference(qt[b:b + 1], kt[b:b + 1, keys], vt[b:b + 1, keys], 0.25, True, (-1, -1),
                        0.0)
        torch.testing.assert_close(out[b:b + 1], ref)
    with pytest.raises(ValueError, match="covers"):
        fa_tf.attention_forward(Layer(), *qkv(seqlen=4, seqlen_k=4), mask)


def test_partial_packed_kwargs_raise(standins):
    q, k, v = qkv(batch_size=1)
    with pytest.raises(ValueError, match="max_length_k"):
        fa_tf.attention_forward(Layer(), q, k, v, None, cu_seq_lens_q=torch.tensor([0, 9]),
                                cu_seq_lens_k=torch.tensor([0, 9]), max_length_q=9)
