"""What the transformers integration's tests share (test_transformers_integration.py: models
end to end; test_transformers_attention.py: the attention and mask functions called directly):
the tiny models built from configs, the registration, and the float32 PyTorch stand-ins for the
kernels. Importing it skips the importing module where transformers is not installed (CI)."""

import contextlib

import pytest
import torch

transformers = pytest.importorskip("transformers")

import flashattn_cu.integrations.transformers as fa_tf  # noqa: E402

NAME = fa_tf.NAME
SEQLEN = 12
WINDOW = 5
PAD = 4  # left padding of row 0 in the padded batches
MODELS = ["llama", "mistral", "qwen2", "gemma2"]


@pytest.fixture(autouse=True, scope="module")
def registered():
    """flashattn_cu registered with transformers for the importing module's tests."""
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
