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
GPU tests run the same models in bf16 with the real kernels against attn_implementation="sdpa",
both measured against the float32 eager model. The attention and mask functions called directly:
test_transformers_attention.py; the models, registration and stand-ins: transformers_helpers.py.
"""

import copy
import sys

import pytest
import torch

from attn_helpers import instance_for
from flashattn_cu import _C
from flashattn_cu.testing import attention_ref, max_abs_diff
from transformers_helpers import (  # noqa: F401  (fixtures: registered is autouse, standins)
    MODELS, NAME, PAD, SEQLEN, WINDOW, attn, batch, fa_tf, reference, registered, standins,
    tiny_model, training_labels, transformers)

GPU = "cuda"




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
