"""flashattn_cu.integrations.transformers: attn_implementation="flashattn_cu" in transformers.

Skipped where transformers is not installed (CI). Tiny models are built from configs (no
downloads): Llama (GQA 4/2), Mistral (sliding window 5 on every layer), Qwen2 (a full and a
sliding layer), Gemma2 (sliding and full layers, attention softcap 50, scale 256 ** -0.5); 12
tokens, so the windows cut.

CPU tests run the whole glue (registration, transformers' mask and model plumbing, our mask
function, unpadding, packing, the arguments) with flashattn_cu's kernels replaced by float32
PyTorch stand-ins that honour causal, window_size, softmax_scale, softcap and GQA, and compare
with attn_implementation="eager" on the same weights (float32: within 1e-4), forward, gradients
and greedy generation; they also check which kernel entry each call reached and with what.
GPU tests (written, not yet run on a GPU) run the same models in bf16 with the real kernels
against attn_implementation="sdpa", both measured against the float32 eager model.
"""

import contextlib
import copy
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import flashattn_cu.integrations.transformers as fa_tf  # noqa: E402
from attn_helpers import instance_for  # noqa: E402
from flashattn_cu import _C, flash_attn_func  # noqa: E402
from flashattn_cu.testing import attention_ref, max_abs_diff  # noqa: E402

NAME = fa_tf.NAME
SEQLEN = 12
WINDOW = 5
PAD = 4  # left padding of row 0 in the padded batches
MODELS = ["llama", "mistral", "qwen2", "gemma2"]
GPU = "cuda"


@pytest.fixture(autouse=True, scope="module")
def _registered():
    fa_tf.register()
    yield
    fa_tf.unregister()


# --------------------------------------------------------------------------------------------
# Tiny models


def tiny_config(kind, **overrides):
    common = dict(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    common.update(overrides)
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "mistral":
        return transformers.MistralConfig(sliding_window=WINDOW, **common)
    if kind == "qwen2":  # layer 0 full, layer 1 sliding
        return transformers.Qwen2Config(use_sliding_window=True, sliding_window=WINDOW,
                                        max_window_layers=1, **common)
    if kind == "gemma2":  # layer 0 sliding, layer 1 full; softcap 50, scaling 256 ** -0.5
        return transformers.Gemma2Config(sliding_window=WINDOW, attn_logit_softcapping=50.0,
                                         **common)
    raise ValueError(kind)


def tiny_model(kind, attn="eager", **overrides):
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(kind, **overrides),
                                                          attn_implementation=attn)
    return model.eval()


@contextlib.contextmanager
def attn(model, implementation):
    previous = model.config._attn_implementation
    model.set_attn_implementation(implementation)
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)


def batch(device="cpu", padded=True, size=2, seqlen=SEQLEN):
    ids = torch.randint(3, 128, (size, seqlen), device=device)
    mask = torch.ones(size, seqlen, dtype=torch.long, device=device)
    if padded:
        mask[0, :PAD] = 0
        ids[0, :PAD] = 0
    return ids, mask


def training_labels(ids, mask):
    """Labels that no padded position predicts: -100 at the padding and at each row's first real
    token (the model predicts label t from position t - 1, here a padded one, whose output
    differs between implementations: ours gives zeros, eager attends to masked keys)."""
    first_real = torch.cumsum(mask, dim=1) == 1
    return ids.masked_fill((mask == 0) | first_real, -100)


# --------------------------------------------------------------------------------------------
# Stand-ins for the kernels (float32 PyTorch), with flashattn_cu's argument contract


def reference(q, k, v, softmax_scale, causal, window_size, softcap):
    """Attention on (batch, seqlen, heads, d) tensors in float32: scores * scale, softcap *
    tanh(scores / softcap) when softcap > 0, the bottom-right aligned causal / window mask
    (query i sees keys d - left <= j <= d + right, d = i + seqlen_k - seqlen_q; causal sets right
    = 0), GQA by repeating kv heads; a query that sees no key gives 0. Returns q's dtype."""
    group = q.shape[2] // k.shape[2]
    kf = k.float().repeat_interleave(group, dim=2)
    vf = v.float().repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), kf) * softmax_scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    left, right = window_size
    if causal:
        right = 0
    diag = torch.arange(seqlen_q).unsqueeze(1) + (seqlen_k - seqlen_q)
    cols = torch.arange(seqlen_k).unsqueeze(0)
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    if right >= 0:
        visible &= cols <= diag + right
    if left >= 0:
        visible &= cols >= diag - left
    scores = scores.masked_fill(~visible.to(scores.device), float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", probs, vf).to(q.dtype)


class StandIns:
    """flash_attn_func / flash_attn_varlen_func in PyTorch; `calls` records (entry, arguments)."""

    def __init__(self):
        self.calls = []

    @staticmethod
    def _features(dropout_p, alibi_slopes, head_dim, softmax_scale):
        if dropout_p != 0.0:
            raise NotImplementedError("stand-in: dropout")
        assert alibi_slopes is None
        return head_dim ** -0.5 if softmax_scale is None else softmax_scale

    def func(self, q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
             window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
             return_attn_probs=False):
        assert q.dim() == 4 and k.shape == v.shape and q.shape[2] % k.shape[2] == 0
        assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
        scale = self._features(dropout_p, alibi_slopes, q.shape[-1], softmax_scale)
        self.calls.append(("func", dict(shape_q=tuple(q.shape), shape_k=tuple(k.shape),
                                        dtype=q.dtype, scale=scale, causal=causal,
                                        window=tuple(window_size), softcap=softcap,
                                        deterministic=deterministic)))
        out = reference(q, k, v, scale, causal, window_size, softcap)
        return (out, None, None) if return_attn_probs else out

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
               dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
               softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
               block_table=None):
        assert q.dim() == 3 and k.shape == v.shape and q.shape[1] % k.shape[1] == 0
        for cu in (cu_seqlens_q, cu_seqlens_k):
            assert cu.dtype == torch.int32 and cu.dim() == 1 and int(cu[0]) == 0
        assert cu_seqlens_q.numel() == cu_seqlens_k.numel()
        assert int(cu_seqlens_q[-1]) == q.shape[0] and int(cu_seqlens_k[-1]) == k.shape[0]
        lens_q, lens_k = cu_seqlens_q.diff().tolist(), cu_seqlens_k.diff().tolist()
        assert int(max_seqlen_q) == max(lens_q) and int(max_seqlen_k) == max(lens_k)
        scale = self._features(dropout_p, alibi_slopes, q.shape[-1], softmax_scale)
        self.calls.append(("varlen", dict(lens_q=lens_q, lens_k=lens_k, dtype=q.dtype,
                                          scale=scale, causal=causal, window=tuple(window_size),
                                          softcap=softcap, deterministic=deterministic)))
        pieces = []
        for b in range(len(lens_q)):
            sq = slice(int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]))
            sk = slice(int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1]))
            pieces.append(reference(q[None, sq], k[None, sk], v[None, sk], scale, causal,
                                    window_size, softcap)[0])
        out = torch.cat(pieces)
        return (out, None, None) if return_attn_probs else out

    def entries(self):
        return [entry for entry, _ in self.calls]


@pytest.fixture
def standins(monkeypatch):
    """Replaces the kernels as the integration module sees them."""
    stand = StandIns()
    monkeypatch.setattr(fa_tf, "flash_attn_func", stand.func)
    monkeypatch.setattr(fa_tf, "flash_attn_varlen_func", stand.varlen)
    return stand


def test_reference_matches_attention_ref():
    """The stand-ins' reference is flashattn_cu.testing.attention_ref where both apply."""
    q, k, v = torch.randn(2, 7, 4, 16), torch.randn(2, 11, 2, 16), torch.randn(2, 11, 2, 16)
    for causal, window in [(False, (-1, -1)), (True, (-1, -1)), (True, (3, 3)), (False, (2, 5))]:
        ours = reference(q, k, v, 0.3, causal, window, 0.0)
        ref, _ = attention_ref(q, k, v, causal=causal, softmax_scale=0.3, window_size=window)
        torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-6)


# --------------------------------------------------------------------------------------------
# CPU: registration and model construction


def test_register_is_idempotent_and_returns_the_name():
    assert fa_tf.register() == NAME and fa_tf.register() == NAME
    assert fa_tf.is_registered()
    assert transformers.AttentionInterface()[NAME] is fa_tf.attention_forward
    assert transformers.AttentionMaskInterface()[NAME] is fa_tf.padding_mask


def test_register_refuses_taken_and_malformed_names():
    with pytest.raises(ValueError, match="'sdpa'"):
        fa_tf.register("sdpa")
    for bad in ("", "paged|flashattn_cu", "org/repo", None):
        with pytest.raises(ValueError, match="name"):
            fa_tf.register(bad)


def test_register_without_transformers_names_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match="transformers"):
        fa_tf.register("flashattn_cu_other")


@pytest.mark.parametrize("kind", MODELS)
def test_from_config_from_pretrained_and_set_attn_implementation(kind, tmp_path):
    model = tiny_model(kind, attn=NAME)
    assert model.config._attn_implementation == NAME
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=NAME)
    assert loaded.config._attn_implementation == NAME
    other = tiny_model(kind, attn="eager")  # Gemma 2 has no sdpa in transformers 5.25
    other.set_attn_implementation(NAME)
    assert other.config._attn_implementation == NAME


def test_flash_loader_knows_the_name_and_unregister_restores_it():
    """transformers calls lazy_import_flash_attention(name) for names containing "flash"; it
    returns flashattn_cu's functions for ours while registered; unregister removes the entries
    and the wrapper, after which the name is refused."""
    from transformers import modeling_flash_attention_utils as fa_utils

    (func, varlen, _, pad, unpad), _ = fa_utils.lazy_import_flash_attention(NAME)
    assert func is fa_tf.flash_attn_func and varlen is fa_tf.flash_attn_varlen_func
    assert pad is fa_tf.pad_input and unpad is fa_tf.unpad_input
    wrapper = fa_utils._lazy_imports
    assert fa_tf.unregister() and not fa_tf.unregister()
    try:
        assert fa_utils._lazy_imports is wrapper._flashattn_cu_wraps
        assert NAME not in transformers.AttentionInterface()
        assert NAME not in transformers.AttentionMaskInterface()
        with pytest.raises(ValueError, match=NAME):
            tiny_model("llama", attn=NAME)
    finally:
        fa_tf.register()


def test_other_names_register_too(standins):
    """A second name (with "flash": the loader wrapper serves it too) and one without."""
    for name in ("my_flash_cu", "fa_cu"):
        assert fa_tf.register(name) == name
        try:
            model = tiny_model("llama", attn=name)
            ids, mask = batch(padded=False)
            with torch.no_grad():
                model(ids)
            assert standins.entries() == ["func", "func"]
            standins.calls.clear()
        finally:
            fa_tf.unregister(name)
    assert fa_tf.is_registered(NAME)


# --------------------------------------------------------------------------------------------
# CPU: the glue against eager, with the stand-in kernels


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("padded", [False, True], ids=["full", "left_padded"])
def test_logits_match_eager(kind, padded, standins):
    model = tiny_model(kind)
    ids, mask = batch(padded=padded)
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).logits
        with attn(model, NAME):
            ours = model(ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(ours[keep], ref[keep], atol=1e-4, rtol=1e-4)

    layers = model.config.num_hidden_layers
    assert standins.entries() == ["varlen" if padded else "func"] * layers
    for (entry, args), layer in zip(standins.calls, model.model.layers):
        attn_module = layer.self_attn
        assert args["causal"] is True
        assert args["scale"] == pytest.approx(attn_module.scaling)
        sliding = getattr(attn_module, "sliding_window", None)
        if kind == "mistral":
            sliding = model.config.sliding_window
        # transformers' flash convention: (sliding_window - 1, sliding_window - 1), right side
        # made 0 by causal; none when the window covers all keys.
        expected = (WINDOW - 1, WINDOW - 1) if sliding else (-1, -1)
        assert args["window"] == expected
        assert args["softcap"] == (50.0 if kind == "gemma2" else 0.0)
        if padded:
            assert args["lens_q"] == [SEQLEN - PAD, SEQLEN] == args["lens_k"]
        else:
            assert args["shape_q"] == (2, SEQLEN, 4, 64) and args["shape_k"] == (2, SEQLEN, 2, 64)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma2"])
def test_gradients_match_eager(kind, standins):
    """One training step's gradients on a left-padded batch (varlen path)."""
    model = tiny_model(kind).train()
    ids, mask = batch()
    labels = training_labels(ids, mask)

    def grads():
        model.zero_grad(set_to_none=True)
        model(ids, attention_mask=mask, labels=labels).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref = grads()
    with attn(model, NAME):
        ours = grads()
    assert standins.entries() == ["varlen"] * model.config.num_hidden_layers
    assert ours.keys() == ref.keys()
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("kind,cache", [("llama", "dynamic"), ("llama", "static"),
                                        ("mistral", "dynamic"), ("qwen2", "dynamic"),
                                        ("gemma2", "dynamic")])
def test_left_padded_greedy_generation_matches_eager(kind, cache, standins):
    """Prefill through varlen, then decoding: one query per row against the cached keys (with a
    static cache, keys past the mask are dropped), sliding-window caches included."""
    model = tiny_model(kind)
    ids, mask = batch()
    options = dict(attention_mask=mask, max_new_tokens=5, min_new_tokens=5, do_sample=False,
                   pad_token_id=0)
    if cache == "static":
        options["cache_implementation"] = "static"
    ref = model.generate(ids, **options)
    with attn(model, NAME):
        ours = model.generate(ids, **options)
    assert torch.equal(ours, ref)
    assert "varlen" in standins.entries()
    decode = [args for entry, args in standins.calls if entry == "varlen" and
              args["lens_q"] == [1, 1]]
    if kind == "mistral":
        # Every layer slides: a decoding step's cache holds the last 5 tokens, all real, so the
        # mask function returns None and the padded-batch kernel runs, without a window (it
        # would cover all 5 keys).
        assert not decode
        steps = [a for e, a in standins.calls if e == "func"]
        assert steps and all(a["shape_q"][1] == 1 and a["shape_k"][1] == WINDOW and
                             a["window"] == (-1, -1) for a in steps)
    else:
        assert decode, "decoding steps with padding should run varlen with one query per row"


def test_packed_sequences_from_position_ids(standins):
    """A batch of one holding three sequences (position_ids restart): varlen over them, as
    eager's packed-sequence mask (eager detects packing only without a cache: use_cache=False)."""
    model = tiny_model("mistral")
    lens = [5, 4, 3]
    ids = torch.randint(3, 128, (1, sum(lens)))
    position_ids = torch.cat([torch.arange(n) for n in lens]).unsqueeze(0)
    with torch.no_grad():
        ref = model(ids, position_ids=position_ids, use_cache=False).logits
        with attn(model, NAME):
            ours = model(ids, position_ids=position_ids, use_cache=False).logits
            cu = torch.tensor([0, 5, 9, 12])
            explicit = model(ids, position_ids=position_ids, use_cache=False, cu_seq_lens_q=cu,
                             cu_seq_lens_k=cu, max_length_q=5, max_length_k=5).logits
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(explicit, ref, atol=1e-4, rtol=1e-4)
    assert standins.entries() == ["varlen"] * 4
    assert all(args["lens_q"] == lens for _, args in standins.calls)


def test_position_ids_of_one_sequence_are_not_packing(standins):
    model = tiny_model("llama")
    ids = torch.randint(3, 128, (1, SEQLEN))
    with torch.no_grad(), attn(model, NAME):
        model(ids, position_ids=torch.arange(7, 7 + SEQLEN).unsqueeze(0), use_cache=False)
    assert standins.entries() == ["func", "func"]


# --------------------------------------------------------------------------------------------
# CPU: the attention function's arguments, called directly


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
               (lambda b, h, q, kv: kv <= q, "test_transformers_integration")]
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


# --------------------------------------------------------------------------------------------
# CPU: with the real functions, what the kernels do not implement raises by name


def test_training_dropout_reaches_the_real_kernels():
    """Dropout is no longer refused: on CPU the call gets past the feature checks to the device
    check, which names the CPU tensor."""
    model = tiny_model("llama", attn=NAME, attention_dropout=0.1).train()
    # Without a GPU the device check names the CPU tensor; with one, the dtype check (float32)
    # comes first. Either comes after the feature checks that used to refuse dropout.
    with pytest.raises((ValueError, TypeError),
                       match="runs on CUDA GPUs only|has dtype torch.float32"):
        model(batch(padded=False)[0])


# --------------------------------------------------------------------------------------------
# GPU: the real kernels in bf16 against sdpa, both measured against the float32 eager model


def need_built(head_dim=64):
    if instance_for(head_dim) not in _C.built_head_dims():
        pytest.skip(f"head dim {head_dim} not in this build")


def gpu_models(kind, **overrides):
    """(bf16 model, float32 eager copy with the same weights) on CUDA."""
    model = tiny_model(kind, attn="sdpa", **overrides).to(GPU, torch.bfloat16)
    ref = copy.deepcopy(model).float()
    ref.set_attn_implementation("eager")
    return model, ref


def max_diff_rows(a, b, keep):
    return max_abs_diff(a[keep], b[keep])


@pytest.mark.gpu
@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("padded", [False, True], ids=["full", "left_padded"])
def test_gpu_logits_against_sdpa(kind, padded):
    """Logits within max|ours - ref| <= 2 * max|sdpa - ref| + 1e-3 * max|ref|, ref being the
    float32 eager model on the same weights: flash_attn's rule (our error at most twice that of
    another correct bf16 implementation, measured in the same run) applied to the whole model."""
    need_built()
    model, ref_model = gpu_models(kind)
    ids, mask = batch(GPU, padded=padded)
    with torch.no_grad():
        ref = ref_model(ids, attention_mask=mask).logits
        sdpa = model(ids, attention_mask=mask).logits
        with attn(model, NAME):
            ours = model(ids, attention_mask=mask).logits
    keep = mask.bool()
    err, sdpa_err = max_diff_rows(ours, ref, keep), max_diff_rows(sdpa, ref, keep)
    bound = 2 * sdpa_err + 1e-3 * ref[keep].abs().max().item()
    assert torch.isfinite(ours[keep]).all()
    assert err <= bound, f"max|ours - ref| {err:.3e} > {bound:.3e} (sdpa {sdpa_err:.3e})"


@pytest.mark.gpu
@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("padded", [False, True], ids=["full", "left_padded"])
def test_gpu_training_step_gradients_against_sdpa(kind, padded):
    """One training step's parameter gradients: finite, and per parameter max|ours - ref| <= 3 *
    max|sdpa - ref| + 1e-2 * max|ref| (flash_attn's gradient factor; the relative floor covers
    parameters whose sdpa error happens to be tiny)."""
    need_built()
    model, ref_model = gpu_models(kind)
    ids, mask = batch(GPU, padded=padded)
    labels = training_labels(ids, mask)

    def grads(m):
        m.train()
        m.zero_grad(set_to_none=True)
        m(ids, attention_mask=mask, labels=labels).loss.backward()
        return {n: p.grad.float() for n, p in m.named_parameters() if p.grad is not None}

    ref = grads(ref_model)
    sdpa = grads(model)
    with attn(model, NAME):
        ours = grads(model)
    assert ours.keys() == ref.keys() == sdpa.keys()
    for name in ref:
        assert torch.isfinite(ours[name]).all(), name
        err, sdpa_err = max_abs_diff(ours[name], ref[name]), max_abs_diff(sdpa[name], ref[name])
        bound = 3 * sdpa_err + 1e-2 * ref[name].abs().max().item() + 1e-6
        assert err <= bound, f"{name}: {err:.3e} > {bound:.3e} (sdpa {sdpa_err:.3e})"


@pytest.mark.gpu
@pytest.mark.parametrize("kind", MODELS)
def test_gpu_left_padded_greedy_generation_matches_sdpa(kind):
    """Five greedy tokens per row of a left-padded batch (varlen prefill, then one query per row
    against the cache) are sdpa's tokens. Two correct bf16 runs can pick different tokens only at
    a near-tie, so where they differ the test requires one: at the first differing step the
    float32 eager model (scoring our sequence, whose prefix sdpa shares up to there) rates the two
    tokens within the logits tolerance of test_gpu_logits_against_sdpa. Every token we pick must
    also be the float32 model's best up to that tolerance."""
    need_built()
    model, ref_model = gpu_models(kind)
    ids, mask = batch(GPU)
    new = 5
    options = dict(attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                   pad_token_id=0)
    sdpa = model.generate(ids, **options)
    with attn(model, NAME):
        ours = model.generate(ids, **options)
    if torch.equal(ours, sdpa):
        return
    # The tolerance, measured on the prompt as in the logits test.
    keep = mask.bool()
    with torch.no_grad():
        prompt_ref = ref_model(ids, attention_mask=mask).logits
        prompt_sdpa = model(ids, attention_mask=mask).logits
        tol = (2 * max_diff_rows(prompt_sdpa, prompt_ref, keep)
               + 1e-3 * prompt_ref[keep].abs().max().item())
        full_mask = torch.cat([mask, mask.new_ones(mask.shape[0], new)], dim=1)
        # generate counts positions from each row's first real token; so does this scoring.
        position_ids = (full_mask.cumsum(dim=1) - 1).clamp(min=0)
        scores = ref_model(ours, attention_mask=full_mask, position_ids=position_ids).logits
        scores = scores[:, SEQLEN - 1:-1].float()
    scores[..., model.config.eos_token_id] = float("-inf")  # min_new_tokens bans it
    picked = ours[:, SEQLEN:]
    regret = scores.max(dim=-1).values - scores.gather(-1, picked.unsqueeze(-1)).squeeze(-1)
    worst = regret.max().item()
    assert worst <= tol, (f"a token we picked is {worst:.3e} below the float32 model's best "
                          f"(tolerance {tol:.3e}): {picked.tolist()}")
    for row in range(ours.shape[0]):
        differ = (ours[row, SEQLEN:] != sdpa[row, SEQLEN:]).nonzero()
        if differ.numel() == 0:
            continue
        step = int(differ[0])
        a, b = int(ours[row, SEQLEN + step]), int(sdpa[row, SEQLEN + step])
        gap = (scores[row, step, a] - scores[row, step, b]).abs().item()
        assert gap <= tol, (f"row {row} step {step}: ours {a}, sdpa {b}, float32 logits "
                            f"{gap:.3e} apart (tolerance {tol:.3e}): not a near-tie; ours "
                            f"{ours[:, SEQLEN:].tolist()}, sdpa {sdpa[:, SEQLEN:].tolist()}")
