"""nn.Module wrappers over the attention functions, as flash_attn.modules.mha defines them.

    from flashattn_cu.modules import FlashSelfAttention, FlashCrossAttention, MultiheadAttention
    attn = FlashSelfAttention(causal=True)
    out = attn(qkv)                        # qkv (batch, seqlen, 3, nheads, headdim)
    mha = MultiheadAttention(1024, 16, num_heads_kv=4, causal=True, rotary_emb_dim=64,
                             device="cuda", dtype=torch.bfloat16)
    y = mha(x)                             # x (batch, seqlen, 1024)

The modules call the attention functions of flashattn_cu.flash_attn_interface, looked up at call
time: the packed functions for padded inputs, the varlen ones for cu_seqlens given to
FlashSelfAttention / FlashCrossAttention (as in flash_attn) and for a key_padding_mask with
padding tokens given to MultiheadAttention. Dropout (in training mode), window_size, alibi_slopes
and deterministic are passed on as the functions take them. Inputs are validated by the functions
(dtype, device, shapes); the modules check only their own arguments.
"""

import torch
import torch.nn as nn

from flashattn_cu import flash_attn_interface as _fai
from flashattn_cu.bert_padding import index_first_axis, pad_input, unpad_input

__all__ = ["FlashSelfAttention", "FlashCrossAttention", "MultiheadAttention", "RotaryEmbedding"]


def _check_cu_seqlens(owner, name, cu_seqlens, max_name, max_seqlen):
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or \
            cu_seqlens.dtype != torch.int32:
        got = (f"a {cu_seqlens.dim()}-d {cu_seqlens.dtype} tensor"
               if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens).__name__)
        raise TypeError(f"{owner}: {name} must be a 1-d torch.int32 tensor (batch + 1,) of "
                        f"cumulative sequence lengths, got {got}")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int):
        got = "None" if max_seqlen is None else type(max_seqlen).__name__
        raise TypeError(f"{owner}: {max_name} must be a Python int (the longest sequence) when "
                        f"{name} is given, got {got}")


class _FlashAttentionModule(nn.Module):
    """The constructor and the per-call arguments FlashSelfAttention and FlashCrossAttention
    share (flash_attn.modules.mha's attributes: causal, softmax_scale, drop, alibi_slopes,
    window_size, deterministic)."""

    def __init__(self, causal=False, softmax_scale=None, attention_dropout=0.0,
                 window_size=(-1, -1), alibi_slopes=None, deterministic=False):
        super().__init__()
        self.causal = causal
        self.softmax_scale = softmax_scale
        self.drop = nn.Dropout(attention_dropout)
        self.register_buffer("alibi_slopes", alibi_slopes, persistent=False)
        self.window_size = window_size
        self.deterministic = deterministic

    def _call_args(self, causal):
        """(dropout_p, keyword arguments) for this call: dropout only in training mode."""
        slopes = self.alibi_slopes
        return self.drop.p if self.training else 0.0, dict(
            softmax_scale=self.softmax_scale,
            causal=self.causal if causal is None else causal,
            window_size=self.window_size,
            alibi_slopes=None if slopes is None else slopes.to(torch.float32),
            deterministic=self.deterministic,
        )


class FlashSelfAttention(_FlashAttentionModule):
    """softmax(q k^T * softmax_scale) v on a packed qkv, as flash_attn.modules.mha defines it.

    Arguments:
        causal: the default for forward's `causal` (bottom-right aligned, as flash_attn_func).
        softmax_scale: None means headdim ** -0.5.
        attention_dropout: dropout on the attention probabilities, applied in training mode only
            (`self.drop.p if self.training else 0.0`), in the kernels (flash_attn_func's
            dropout_p: torch's CUDA generator, so torch.cuda.manual_seed reproduces it).
        window_size, alibi_slopes, deterministic: passed to the function on every call
            (alibi_slopes as float32; it is kept as a non-persistent buffer).
    """

    def forward(self, qkv, causal=None, cu_seqlens=None, max_seqlen=None):
        """Arguments:
            qkv: (B, S, 3, H, D) when cu_seqlens is None, else (total, 3, H, D) with the
                sequences one after the other (total = cu_seqlens[-1]).
            causal: overrides self.causal for this call when not None.
            cu_seqlens: (B + 1,) int32, the cumulative sequence lengths (varlen), or None.
            max_seqlen: int, the longest sequence; required with cu_seqlens, else ignored.
        Returns:
            (B, S, H, D), or (total, H, D) with cu_seqlens (flash_attn_varlen_qkvpacked_func).
        """
        dropout_p, kwargs = self._call_args(causal)
        if cu_seqlens is None:
            return _fai.flash_attn_qkvpacked_func(qkv, dropout_p, **kwargs)
        _check_cu_seqlens("FlashSelfAttention", "cu_seqlens", cu_seqlens, "max_seqlen",
                          max_seqlen)
        return _fai.flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p,
                                                     **kwargs)


class FlashCrossAttention(_FlashAttentionModule):
    """softmax(q k^T * softmax_scale) v with k and v packed, as flash_attn.modules.mha defines
    it; nheads % nheads_k == 0 (GQA/MQA). The constructor arguments are FlashSelfAttention's, in
    flash_attn's order for this class: alibi_slopes before window_size (FlashSelfAttention takes
    window_size first), so positional calls written for flash_attn mean the same here."""

    def __init__(self, causal=False, softmax_scale=None, attention_dropout=0.0,
                 alibi_slopes=None, window_size=(-1, -1), deterministic=False):
        super().__init__(causal, softmax_scale, attention_dropout, window_size=window_size,
                         alibi_slopes=alibi_slopes, deterministic=deterministic)

    def forward(self, q, kv, causal=None, cu_seqlens=None, max_seqlen=None, cu_seqlens_k=None,
                max_seqlen_k=None):
        """Arguments:
            q: (B, Sq, H, D), or (total_q, H, D) with cu_seqlens.
            kv: (B, Sk, 2, H_k, D), or (total_k, 2, H_k, D) with cu_seqlens.
            causal: overrides self.causal for this call when not None.
            cu_seqlens, max_seqlen: (B + 1,) int32 cumulative lengths of the q sequences and the
                longest one (varlen), or None.
            cu_seqlens_k, max_seqlen_k: the same for kv; required with cu_seqlens.
        Returns:
            (B, Sq, H, D), or (total_q, H, D) with cu_seqlens (flash_attn_varlen_kvpacked_func).
        """
        dropout_p, kwargs = self._call_args(causal)
        if cu_seqlens is None:
            return _fai.flash_attn_kvpacked_func(q, kv, dropout_p, **kwargs)
        _check_cu_seqlens("FlashCrossAttention", "cu_seqlens", cu_seqlens, "max_seqlen",
                          max_seqlen)
        _check_cu_seqlens("FlashCrossAttention", "cu_seqlens_k", cu_seqlens_k, "max_seqlen_k",
                          max_seqlen_k)
        return _fai.flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens, cu_seqlens_k, max_seqlen,
                                                    max_seqlen_k, dropout_p, **kwargs)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding, non-interleaved (GPT-NeoX "rotate half") on the first `dim`
    dims of each head: with x1 = x[..., :dim/2], x2 = x[..., dim/2:dim] and the angles
    a_i = position * base ** (-2i / dim), i < dim/2,
        out[..., :dim/2]    = x1 * cos(a) - x2 * sin(a)
        out[..., dim/2:dim] = x2 * cos(a) + x1 * sin(a)
    and out[..., dim:] = x[..., dim:]. The positions are offset .. offset + seqlen - 1 along
    dim 1 of a (batch, seqlen, nheads, headdim) tensor.

    The frequencies, cos, sin and the rotation are computed in float32 (float64 for float64
    inputs) whatever the module or input dtype, and the result is rounded to the input's dtype
    once; positions are exact in float32 up to 2^24. cos and sin are cached per device and
    dtype for the longest sequence seen (not while torch.compile traces); the module has no
    parameters or buffers, so `.half()` cannot degrade them and the state dict stays empty.
    """

    def __init__(self, dim, base=10000.0):
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0 or dim % 2:
            raise ValueError(f"RotaryEmbedding: dim must be a positive even int, got {dim!r}")
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 0:
            raise ValueError(f"RotaryEmbedding: base must be a positive number, got {base!r}")
        self.dim = dim
        self.base = float(base)
        self._cache = {}

    def _angles(self, length, device, dtype):
        exponents = torch.arange(0, self.dim, 2, dtype=dtype, device=device) / self.dim
        inv_freq = 1.0 / (self.base ** exponents)
        return torch.outer(torch.arange(length, dtype=dtype, device=device), inv_freq)

    def cos_sin(self, seqlen, device, dtype=torch.float32):
        """(cos, sin), each (seqlen, dim / 2), for positions 0 .. seqlen - 1, in `dtype`
        (float32 or float64) on `device`."""
        if torch.compiler.is_compiling():
            angles = self._angles(seqlen, device, dtype)
            return angles.cos(), angles.sin()
        key = (torch.device(device), dtype)
        cached = self._cache.get(key)
        if cached is None or cached[0].shape[0] < seqlen:
            angles = self._angles(seqlen, device, dtype)
            cached = self._cache[key] = (angles.cos(), angles.sin())
        return cached[0][:seqlen], cached[1][:seqlen]

    def forward(self, x, offset=0):
        """x: (batch, seqlen, nheads, headdim) with headdim >= dim. Returns a new tensor of x's
        shape and dtype with the first `dim` dims of each head rotated by their position."""
        if x.dim() != 4 or x.shape[-1] < self.dim:
            raise ValueError(f"RotaryEmbedding: x must be (batch, seqlen, nheads, headdim) with "
                             f"headdim >= {self.dim}, got shape {tuple(x.shape)}")
        seqlen, half = x.shape[1], self.dim // 2
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = self.cos_sin(offset + seqlen, x.device, compute)
        cos, sin = cos[offset:, None, :], sin[offset:, None, :]  # (seqlen, 1, dim / 2)
        x1 = x[..., :half].to(compute)
        x2 = x[..., half:self.dim].to(compute)
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
        if self.dim == x.shape[-1]:
            return rotated
        return torch.cat((rotated, x[..., self.dim:]), dim=-1)

    def extra_repr(self):
        return f"dim={self.dim}, base={self.base}"


def _positive_int(owner, name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")


class MultiheadAttention(nn.Module):
    """Self-attention: x -> Wqkv -> (rotary on q, k) -> attention -> out_proj.

    Arguments:
        embed_dim: E, the model width; head_dim = embed_dim // num_heads.
        num_heads: query heads; embed_dim must be divisible by num_heads.
        num_heads_kv: key/value heads (GQA/MQA), default num_heads; must divide num_heads.
        causal: causal self-attention (query i sees keys j <= i).
        softmax_scale: None means head_dim ** -0.5.
        dropout: attention dropout in training mode, in the kernels (flash_attn_func's
            dropout_p; eval mode passes 0.0). Must be below 1 when used.
        bias: bias in Wqkv and out_proj.
        rotary_emb_dim: 0 (no rotary) or an even number <= head_dim: rotary embedding
            (RotaryEmbedding, GPT-NeoX style) on the first rotary_emb_dim dims of each q and k
            head, positions 0 .. seqlen - 1.
        rotary_base: the rotary frequency base.
        device, dtype: of the parameters (the attention needs float16 or bfloat16 on a GPU).

    Wqkv is Linear(embed_dim, (num_heads + 2 * num_heads_kv) * head_dim); its output holds the
    q heads, then the k heads, then the v heads, each head_dim wide (flash_attn's MHA layout, and
    the names Wqkv / out_proj are its names too). out_proj is Linear(embed_dim, embed_dim).
    """

    def __init__(self, embed_dim, num_heads, num_heads_kv=None, causal=False, softmax_scale=None,
                 dropout=0.0, bias=True, rotary_emb_dim=0, rotary_base=10000.0, device=None,
                 dtype=None):
        super().__init__()
        owner = "MultiheadAttention"
        _positive_int(owner, "embed_dim", embed_dim)
        _positive_int(owner, "num_heads", num_heads)
        if num_heads_kv is None:
            num_heads_kv = num_heads
        _positive_int(owner, "num_heads_kv", num_heads_kv)
        if embed_dim % num_heads:
            raise ValueError(f"{owner}: embed_dim ({embed_dim}) must be divisible by num_heads "
                             f"({num_heads})")
        if num_heads % num_heads_kv:
            raise ValueError(f"{owner}: num_heads ({num_heads}) must be divisible by "
                             f"num_heads_kv ({num_heads_kv}) (each kv head serves "
                             "num_heads // num_heads_kv query heads)")
        head_dim = embed_dim // num_heads
        if isinstance(rotary_emb_dim, bool) or not isinstance(rotary_emb_dim, int) or \
                rotary_emb_dim < 0:
            raise ValueError(f"{owner}: rotary_emb_dim must be a non-negative int (0: no rotary), "
                             f"got {rotary_emb_dim!r}")
        if rotary_emb_dim % 2:
            raise ValueError(f"{owner}: rotary_emb_dim ({rotary_emb_dim}) must be even (it "
                             "rotates pairs of dims)")
        if rotary_emb_dim > head_dim:
            raise ValueError(f"{owner}: rotary_emb_dim ({rotary_emb_dim}) must be <= head_dim "
                             f"({head_dim} = embed_dim {embed_dim} // num_heads {num_heads})")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or \
                not 0.0 <= dropout <= 1.0:
            raise ValueError(f"{owner}: dropout must be a probability in [0, 1], got "
                             f"{dropout!r}")

        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_heads_kv = num_heads_kv
        self.head_dim = head_dim
        self.causal = causal
        self.softmax_scale = softmax_scale
        self.dropout = dropout
        self.rotary_emb_dim = rotary_emb_dim
        factory = dict(device=device, dtype=dtype)
        qkv_dim = (num_heads + 2 * num_heads_kv) * head_dim
        self.Wqkv = nn.Linear(embed_dim, qkv_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.rotary_emb = RotaryEmbedding(rotary_emb_dim, rotary_base) if rotary_emb_dim else None

    def _check_mask(self, x, key_padding_mask):
        """True when the mask drops a token (the varlen path), False for None or all True."""
        if key_padding_mask is None:
            return False
        if not isinstance(key_padding_mask, torch.Tensor) or \
                key_padding_mask.dtype.is_floating_point or key_padding_mask.is_complex():
            got = (key_padding_mask.dtype if isinstance(key_padding_mask, torch.Tensor)
                   else type(key_padding_mask).__name__)
            raise TypeError(f"MultiheadAttention: key_padding_mask must be a bool tensor "
                            f"(True = keep; integer 0/1 is taken as False/True), got {got}")
        if tuple(key_padding_mask.shape) != tuple(x.shape[:2]):
            raise ValueError(f"MultiheadAttention: key_padding_mask must be (batch, seqlen) = "
                             f"{tuple(x.shape[:2])}, got {tuple(key_padding_mask.shape)}")
        if key_padding_mask.device != x.device:
            raise ValueError(f"MultiheadAttention: key_padding_mask is on "
                             f"{key_padding_mask.device} but x is on {x.device}")
        return not bool(key_padding_mask.all())  # one host sync

    def forward(self, x, key_padding_mask=None):
        """Arguments:
            x: (B, S, embed_dim).
            key_padding_mask: None, or (B, S) bool, True for the tokens to keep. With a False
                anywhere, q, k and v are unpadded (flashattn_cu.bert_padding.unpad_input) and
                attention runs on each sequence's kept tokens only (flash_attn_varlen_func; causal
                then orders the kept tokens as in x); the rows of dropped tokens come back as
                out_proj(0), i.e. out_proj.bias (0 without bias). An all-True mask (checked with
                one host sync) takes the padded path, as None does.
        Returns:
            (B, S, embed_dim).
        """
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"MultiheadAttention: x must be (batch, seqlen, embed_dim="
                             f"{self.embed_dim}), got shape {tuple(x.shape)}")
        has_padding = self._check_mask(x, key_padding_mask)
        batch, seqlen = x.shape[:2]
        h, hk, d = self.num_heads, self.num_heads_kv, self.head_dim
        qkv = self.Wqkv(x)
        q = qkv[..., :h * d].unflatten(-1, (h, d))
        k = qkv[..., h * d:(h + hk) * d].unflatten(-1, (hk, d))
        v = qkv[..., (h + hk) * d:].unflatten(-1, (hk, d))
        if self.rotary_emb is not None:
            q, k = self.rotary_emb(q), self.rotary_emb(k)
        dropout_p = self.dropout if self.training else 0.0
        if not has_padding:
            out = _fai.flash_attn_func(q, k, v, dropout_p, softmax_scale=self.softmax_scale,
                                       causal=self.causal)
        else:
            q, indices, cu_seqlens, max_seqlen, _ = unpad_input(q, key_padding_mask.bool())
            k, v = (index_first_axis(t.reshape((batch * seqlen,) + t.shape[2:]), indices)
                    for t in (k, v))
            out = _fai.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen,
                                              max_seqlen, dropout_p,
                                              softmax_scale=self.softmax_scale, causal=self.causal)
            out = pad_input(out, indices, batch, seqlen)
        return self.out_proj(out.reshape(batch, seqlen, h * d))

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"num_heads_kv={self.num_heads_kv}, causal={self.causal}, "
                f"rotary_emb_dim={self.rotary_emb_dim}")
