"""flashattn_cu as an attention implementation of Hugging Face transformers (opt-in).

    import flashattn_cu.integrations.transformers as fa_transformers
    fa_transformers.register()                      # returns "flashattn_cu"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                                 attn_implementation="flashattn_cu")
    model.set_attn_implementation("flashattn_cu")   # or switch a model already built
    fa_transformers.unregister()

`register()` adds one entry under the name to each of transformers' own registries; nothing is
installed as, or pretends to be, the flash-attn distribution:
- `transformers.AttentionInterface`: `attention_forward`, which a model's attention layers call
  with (batch, heads, seqlen, head_dim) tensors and which returns ((batch, seqlen, heads,
  head_dim) output, None), the contract of transformers' "flash_attention_2" function;
- `transformers.AttentionMaskInterface`: `padding_mask`, which gives the attention layers the 2-D
  padding mask (or None when no token is padded) instead of a 4-D mask, as transformers' flash
  mask function does, so that a padded batch runs the varlen kernels on its real tokens only.

What `attention_forward` serves (transformers 5.17's flash path, integrations/flash_attention.py
and modeling_flash_attention_utils.py, is the contract it mirrors):
- no mask -> `flash_attn_func` on the padded batch (k/v with fewer heads passed as they are: GQA);
- a 2-D padding mask -> `unpad_input` + `flash_attn_varlen_func` + `pad_input`; queries are the
  last seqlen_q positions of the mask (a KV cache holds the earlier ones), keys past the mask's
  length (a static cache's unused slots) are dropped; padded query rows come back as zeros;
- packed sequences -> `flash_attn_varlen_func`: from the `cu_seq_lens_q/k`, `max_length_q/k`
  kwargs when a model passes them, else from `position_ids` of a batch of one that restart;
- `is_causal` (the kwarg, else `module.is_causal`), `scaling` -> `softmax_scale`, `sliding_window`
  -> `window_size`, `softcap`, `dropout` -> `dropout_p`, `deterministic` (kwarg, else the
  FLASH_ATTENTION_DETERMINISTIC=1 environment variable transformers reads, else
  `torch.are_deterministic_algorithms_enabled()`); a value head dim unlike the query's is padded
  with zeros and the output cut back (as transformers does for MLA).
- float32 activations in a 16-bit model (PEFT's float32 norms, autocast) are cast to the model's
  dtype first, as transformers does; a float32 model stays float32 and the kernels raise
  `TypeError` naming the dtype.

Dropout (training mode) runs in the kernels (flash_attn_func's dropout_p). What raises (nothing
is silently dropped): attention sinks (`s_aux`), additive
biases (`position_bias`), sparse selections (`indices`, `block_indices`), `head_mask` and any
other argument not listed in `_IGNORED_KWARGS` raise `NotImplementedError` naming the argument; a
4-D or custom attention mask and transformers' mask overlays (`or_mask_function` /
`and_mask_function`, e.g. bidirectional image tokens) raise `NotImplementedError` too.

Why `register()` also touches transformers' flash-attention loader: transformers 5.x treats every
attn_implementation whose name contains "flash" as a flash-attention flavour
(`utils.generic.is_flash_attention_requested`), which is right for this one (models then hand it
2-D masks, cu_seq_lens, ...), and on building or switching a model it calls
`modeling_flash_attention_utils.lazy_import_flash_attention(name)`, which only knows the
flash_attn packages and hub kernels and raises ValueError for any other name. For names of ours
that contain "flash", `register()` wraps that module's `_lazy_imports` so that it returns
flashattn_cu's flash_attn 2.x-compatible functions for them and calls the original for every
other name; `unregister()` puts the original back. A name without "flash" needs no wrapper, but
models with flash-specific code (e.g. vision towers that pass cu_seq_lens only to flash
implementations) then take their other branch, whose 4-D masks `attention_forward` rejects.

GPU status: this module's GPU tests (tests/test_transformers_integration.py: tiny Llama, Mistral,
Qwen2 and Gemma 2 models in bf16 against `"sdpa"`, logits, one training step's gradients,
left-padded greedy generation) pass on the H200 (benchmarks/NOTES.md 12.37's suite).
"""

import logging
import os
import sys

import torch
import torch.nn.functional as F

from flashattn_cu._arguments import _is_int
from flashattn_cu.bert_padding import index_first_axis, pad_input, unpad_input
from flashattn_cu.flash_attn_interface import flash_attn_func, flash_attn_varlen_func

__all__ = ["NAME", "register", "unregister", "is_registered", "attention_forward", "padding_mask"]

NAME = "flashattn_cu"
logger = logging.getLogger(__name__)

_where = "flashattn_cu (transformers integration)"
_registered = set()  # names registered by this module and not unregistered since
_warned_output_attentions = False

# Arguments the attention layers pass on that do not change the attention, ignored on purpose.
_IGNORED_KWARGS = frozenset({
    "use_cache",             # the layer has already updated its cache when it calls us
    "cache_position",        # positions of the new tokens in the cache (masks are built from it)
    "output_hidden_states",  # model-level output switches
    "output_router_logits",
    "return_dict",
    "num_items_in_batch",    # loss normalisation
    "seq_idx",               # sequence index per token, for the Mamba mixers of hybrid models;
                             # attention takes packing from position_ids / cu_seq_lens instead
})

# Arguments used here (the mask, the scale, the window, softcap, dropout and is_causal are named
# parameters of attention_forward).
_CONSUMED_KWARGS = frozenset({
    "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
    "deterministic", "output_attentions",
})

# Known arguments that change the attention and that flashattn_cu cannot serve.
_UNSUPPORTED_KWARGS = {
    "s_aux": "attention sinks (s_aux: a learned logit per head that joins every softmax)",
    "position_bias": "an additive attention bias (position_bias, e.g. T5's relative positions)",
    "indices": "sparse attention (indices: the keys each query attends to)",
    "block_indices": "block-sparse attention (block_indices)",
    "head_mask": "head masking (head_mask)",
}

_VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


# ---------------------------------------------------------------------------------------------
# The attention function


def _check_kwargs(kwargs):
    """Raises NotImplementedError for an argument that would change the attention and that is not
    served here. An argument set to None requests nothing and passes."""
    for key, value in kwargs.items():
        if value is None or key in _IGNORED_KWARGS or key in _CONSUMED_KWARGS:
            continue
        what = _UNSUPPORTED_KWARGS.get(key)
        if what is not None:
            raise NotImplementedError(
                f"{_where}: {what} is not supported (got {key}={_describe(value)}); load the "
                "model with attn_implementation='eager' or 'sdpa'"
            )
        raise NotImplementedError(
            f"{_where}: unknown argument {key}={_describe(value)}; it may change the attention, "
            "which flashattn_cu would silently ignore, so it is refused. Use "
            "attn_implementation='eager' or 'sdpa' for this model"
        )


def _describe(value):
    if isinstance(value, torch.Tensor):
        return f"<tensor {tuple(value.shape)} {value.dtype}>"
    return repr(value)


def _kernel_dtype(module, query):
    """The 16-bit dtype that float32 q/k/v are cast to before the kernels, or None to leave them.
    As transformers' flash path: autocast's dtype when autocast is on; for a quantized model the
    config's dtype; else the dtype of the module's first Linear weight (PEFT keeps norms in
    float32, so a 16-bit model can hand float32 activations to its attention)."""
    if query.dtype != torch.float32:
        return None
    device_type = query.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    config = getattr(module, "config", None)
    if config is not None and hasattr(config, "_is_quantized"):
        return getattr(config, "dtype", None)
    for sub in module.modules():
        if isinstance(sub, torch.nn.Linear):
            return sub.weight.dtype
    return None


def _window(sliding_window, key_length):
    """flash_attn's window_size for transformers' `sliding_window`. transformers' flash path
    (modeling_flash_attention_utils._process_flash_attention_kwargs, 5.17) passes
    (sliding_window - 1, sliding_window - 1), and only when key_length > sliding_window; with
    causal=True the kernels set the right side to 0, so a query sees itself and the
    sliding_window - 1 keys before it, as the eager mask's `kv_idx > q_idx - sliding_window`
    (masking_utils.sliding_window_overlay). Encoders with a bidirectional window adjust the value
    they pass to this convention (e.g. ModernBERT passes its half-window + 1)."""
    if sliding_window is None:
        return (-1, -1)
    if not _is_int(sliding_window) or sliding_window < 1:
        raise ValueError(f"{_where}: sliding_window must be None or a positive int, got "
                         f"{sliding_window!r}")
    if key_length <= sliding_window:
        return (-1, -1)  # the window covers every key; the unwindowed kernels are cheaper
    return (int(sliding_window) - 1, int(sliding_window) - 1)


def _deterministic(kwargs):
    value = kwargs.get("deterministic")
    if value is not None:
        return bool(value)
    if os.environ.get("FLASH_ATTENTION_DETERMINISTIC", "0") == "1":
        return True
    return torch.are_deterministic_algorithms_enabled()


def _explicit_varlen(kwargs, device):
    """(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) when the model passed transformers'
    packed-sequence kwargs (all four together), else None."""
    given = [kwargs.get(n) for n in _VARLEN_KWARGS]
    if all(g is None for g in given):
        return None
    if any(g is None for g in given):
        missing = [n for n, g in zip(_VARLEN_KWARGS, given) if g is None]
        raise ValueError(f"{_where}: cu_seq_lens_q, cu_seq_lens_k, max_length_q and max_length_k "
                         f"describe packed sequences together; missing: {', '.join(missing)}")
    cu_q, cu_k, max_q, max_k = given
    return (cu_q.to(device=device, dtype=torch.int32), cu_k.to(device=device, dtype=torch.int32),
            max_q, max_k)


def _packed_from_position_ids(position_ids, q, k):
    """cu_seqlens for a batch of one whose position_ids restart (several sequences packed into one
    row), else None. A sequence starts wherever a position is not the previous one + 1: the rule
    of transformers' masks for eager/sdpa (masking_utils.find_packed_sequence_indices), so this
    attends as those do. (transformers' flash path starts sequences at the row's smallest
    position id instead; both agree when every sequence starts at the same position.)"""
    batch, seqlen_q = q.shape[0], q.shape[1]
    if position_ids is None or batch != 1 or seqlen_q < 2 or position_ids.numel() != seqlen_q:
        return None  # also multi-axis (mrope) position ids, which do not describe packing
    pos = position_ids.reshape(-1)
    starts = torch.nonzero(pos[1:] != pos[:-1] + 1).flatten()
    if starts.numel() == 0:
        return None
    if k.shape[1] != seqlen_q:
        raise NotImplementedError(
            f"{_where}: packed sequences (position_ids that restart within the row) with "
            f"{k.shape[1]} keys for {seqlen_q} queries (a KV cache) are not supported"
        )
    bounds = torch.cat([starts.new_zeros(1), starts + 1, starts.new_full((1,), seqlen_q)])
    bounds = bounds.to(torch.int32)
    max_len = int((bounds[1:] - bounds[:-1]).max())
    return bounds, bounds, max_len, max_len


def _attend_padded(q, k, v, mask, options):
    """Attention of a padded batch through the varlen kernel on the kept tokens. q: (batch,
    seqlen_q, heads, d); k, v: (batch, seqlen_k, heads_k, d); mask: (batch, mask_len), nonzero
    for real tokens, covering the keys. With causal masking or a window the queries are the
    mask's last seqlen_q positions (self-attention: their alignment to the keys needs their
    own padding removed); without either they stay dense (the mask may be another sequence's:
    cross-attention)."""
    if mask.dim() != 2:
        raise NotImplementedError(
            f"{_where}: a {mask.dim()}-D attention mask of shape {tuple(mask.shape)} is not "
            "supported; flashattn_cu takes 2-D (batch, seqlen) padding masks, which its own mask "
            "function builds. Custom 4-D masks need attn_implementation='eager' or 'sdpa'"
        )
    batch, seqlen_q, nheads, head_dim = q.shape
    mask_len = mask.shape[1]
    if mask.shape[0] != batch:
        raise ValueError(f"{_where}: attention_mask has batch {mask.shape[0]}, query {batch}")
    if k.shape[1] > mask_len:
        # A static cache: slots past the mask have not been written yet.
        k, v = k[:, :mask_len], v[:, :mask_len]
    elif k.shape[1] < mask_len:
        raise ValueError(f"{_where}: attention_mask covers {mask_len} positions but there are "
                         f"only {k.shape[1]} keys")
    if seqlen_q > mask_len:
        raise ValueError(f"{_where}: {seqlen_q} queries but the attention_mask covers "
                         f"{mask_len} positions")
    seqlen_k = k.shape[1]
    k_unpad, indices_k, cu_k, max_k, _ = unpad_input(k, mask)
    v_unpad = index_first_axis(v.reshape(batch * seqlen_k, *v.shape[2:]), indices_k)
    if not options["causal"] and options["window_size"] == (-1, -1):
        # Every query sees every real key of its entry: the queries stay dense, since the mask
        # may describe the keys only (cross-attention: an encoder's padding, against decoder
        # queries of any length, equal to the encoder's by chance too). Unpadding them by it
        # returned zeros for decoder rows at the encoder's padded positions. A padded query row
        # then attends to its entry's real keys, as with the eager and sdpa masks.
        q_unpad = q.reshape(batch * seqlen_q, nheads, head_dim)
        cu_q = torch.arange(0, (batch + 1) * seqlen_q, seqlen_q, dtype=torch.int32,
                            device=q.device)
        out = flash_attn_varlen_func(q_unpad, k_unpad, v_unpad, cu_q, cu_k, seqlen_q, max_k,
                                     **options)
        return out.reshape(batch, seqlen_q, *out.shape[1:])
    if seqlen_q == seqlen_k:
        q_unpad = index_first_axis(q.reshape(batch * seqlen_q, nheads, head_dim), indices_k)
        indices_q, cu_q, max_q = indices_k, cu_k, max_k
    else:
        q_unpad, indices_q, cu_q, max_q, _ = unpad_input(q, mask[:, -seqlen_q:])
    out = flash_attn_varlen_func(q_unpad, k_unpad, v_unpad, cu_q, cu_k, max_q, max_k, **options)
    return pad_input(out, indices_q, batch, seqlen_q)


def _attend_packed(q, k, v, lengths, options):
    cu_q, cu_k, max_q, max_k = lengths
    batch, seqlen_q = q.shape[:2]
    out = flash_attn_varlen_func(q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]),
                                 v.reshape(-1, *v.shape[2:]), cu_q, cu_k, max_q, max_k, **options)
    return out.reshape(batch, seqlen_q, *out.shape[1:])


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, **kwargs):
    """The attention function registered in transformers' AttentionInterface.

    Arguments (transformers' contract for attention functions):
        module: the calling attention layer (its `is_causal`, `config`, weights' dtype are read).
        query: (batch, heads, seqlen_q, head_dim); key, value: (batch, heads_k, seqlen_k, head_dim
            / v_head_dim), heads % heads_k == 0.
        attention_mask: None, or the 2-D (batch, seqlen_k) padding mask `padding_mask` built,
            nonzero for real tokens.
        dropout, scaling, sliding_window, softcap, is_causal: as the model passes them (None:
            not used; scaling None means head_dim ** -0.5; is_causal None means module.is_causal).
        kwargs: position_ids, cu_seq_lens_q/k + max_length_q/k (packed sequences), deterministic,
            output_attentions (no weights are returned) and the harmless `_IGNORED_KWARGS`; any
            other argument raises NotImplementedError naming it.
    Returns:
        (attn_output (batch, seqlen_q, heads, v_head_dim), None).
    """
    _check_kwargs(kwargs)
    global _warned_output_attentions
    if kwargs.get("output_attentions") and not _warned_output_attentions:
        _warned_output_attentions = True
        logger.warning("%s: output_attentions=True returns no attention weights (None); use "
                       "attn_implementation='eager' to get them", _where)
    if is_causal is None:
        is_causal = getattr(module, "is_causal", None)
        if is_causal is None:
            raise ValueError(f"{_where}: is_causal was not passed and the module "
                             f"{type(module).__name__} has no is_causal attribute")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{_where}: {name} must be (batch, heads, seqlen, head_dim), got "
                             f"{got}")
    qk_dim, v_dim = query.shape[-1], value.shape[-1]
    if key.shape[-1] != qk_dim:
        raise ValueError(f"{_where}: key has head dim {key.shape[-1]} but query {qk_dim}")
    softmax_scale = qk_dim ** -0.5 if scaling is None else scaling  # before any padding below

    # flash_attn's (batch, seqlen, heads, head_dim): views, no copy (the kernels take any strides
    # with a contiguous head dim).
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    target = _kernel_dtype(module, q)
    if target is not None and target != q.dtype:
        q, k, v = q.to(target), k.to(target), v.to(target)
    # One head dim for q, k and v: zero columns change neither q.k nor the output's first v_dim.
    if v_dim < qk_dim:
        v = F.pad(v, (0, qk_dim - v_dim))
    elif v_dim > qk_dim:
        q, k = F.pad(q, (0, v_dim - qk_dim)), F.pad(k, (0, v_dim - qk_dim))

    options = dict(
        dropout_p=float(dropout),
        softmax_scale=softmax_scale,
        causal=bool(is_causal),
        window_size=_window(sliding_window, k.shape[1]),
        softcap=0.0 if softcap is None else float(softcap),
        deterministic=_deterministic(kwargs),
    )
    if attention_mask is not None:
        out = _attend_padded(q, k, v, attention_mask, options)
    else:
        lengths = _explicit_varlen(kwargs, q.device)
        if lengths is None:
            lengths = _packed_from_position_ids(kwargs.get("position_ids"), q, k)
        if lengths is not None:
            out = _attend_packed(q, k, v, lengths, options)
        else:
            out = flash_attn_func(q, k, v, **options)
    if out.shape[-1] != v_dim:
        out = out[..., :v_dim]
    return out, None


# ---------------------------------------------------------------------------------------------
# The mask function


# transformers.masking_utils' mask functions by qualified name: what the kernels express through
# is_causal, sliding_window, the padding mask and packed-sequence lengths (leaves), what only
# combines or re-indexes others (recursed into), and overlays that change which keys a query sees
# in ways they cannot (named in the error). Anything else, or_masks included (an overlay that adds
# keys), is refused: transformers builds these masks without use_vmap too (e.g. bidirectional
# image-token blocks since 5.2x, Llama 4's chunks under a name without "flash").
_MASKS_EXPRESSED = {
    "causal_mask_function", "bidirectional_mask_function",
    "sliding_window_overlay.<locals>.inner_mask",
    "sliding_window_bidirectional_overlay.<locals>.inner_mask",
    "padding_mask_function.<locals>.inner_mask",
    "packed_sequence_mask_function.<locals>.inner_mask",
}
_MASKS_COMBINING = {
    "and_masks.<locals>.and_mask",
    "remap_positions_for_packed_sequence.<locals>.inner_mask",
    "add_offsets_to_mask_function.<locals>.inner_mask",
}
_MASKS_NAMED = {
    "chunked_overlay.<locals>.inner_mask": "chunked attention (e.g. Llama 4's attention_chunk_size)",
    "blockwise_overlay.<locals>.inner_mask":
        "bidirectional attention within token blocks (e.g. image tokens)",
    "or_masks.<locals>.or_mask": "a mask overlay that adds keys (or_masks)",
}


def _mask_functions_inside(fn):
    """The mask functions a combining mask function of transformers' closes over (and_masks' and
    or_masks' tuples, a wrapper's one)."""
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        for sub in value if isinstance(value, (tuple, list)) else (value,):
            if callable(sub) and not isinstance(sub, torch.Tensor):
                yield sub


def _mask_parts_not_expressed(fn):
    """What of transformers' mask function `fn` the kernels cannot express (descriptions)."""
    if fn is None:
        return []
    name = getattr(fn, "__qualname__", type(fn).__name__)
    if getattr(fn, "__module__", None) == "transformers.masking_utils":
        if name in _MASKS_EXPRESSED:
            return []
        if name in _MASKS_COMBINING:
            return [part for sub in _mask_functions_inside(fn)
                    for part in _mask_parts_not_expressed(sub)]
        if name in _MASKS_NAMED:
            found = [_MASKS_NAMED[name]]
            if name == "or_masks.<locals>.or_mask":  # name what it adds where it is known
                found += [_MASKS_NAMED[sub.__qualname__] for sub in _mask_functions_inside(fn)
                          if getattr(sub, "__qualname__", "") in _MASKS_NAMED]
            return found
    return [f"the mask function {getattr(fn, '__module__', '?')}.{name}"]


def padding_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                 attention_mask=None, use_vmap=False, **kwargs):
    """The mask function registered in transformers' AttentionMaskInterface: what the attention
    layers get as `attention_mask`. As transformers' flash mask function
    (masking_utils.flash_attention_mask): the 2-D (batch, kv_length) padding mask, bool, cut to
    the last kv_length positions (a sliding-window layer's cache holds only those), or None when
    it has no padding and covers exactly kv_length positions (a static cache's mask is shorter
    and is kept: it says which cache slots are written). The causal / sliding-window pattern
    itself reaches the attention function as is_causal and sliding_window.

    `use_vmap=True` means the model combined its mask with an overlay (or_mask_function /
    and_mask_function: e.g. bidirectional attention among image tokens), which the kernels
    cannot express: NotImplementedError, rather than the overlay being ignored. So does a
    mask_function with parts the kernels cannot express (_mask_parts_not_expressed: chunked
    attention, block overlays, functions from outside transformers.masking_utils)."""
    if use_vmap:
        raise NotImplementedError(
            f"{_where}: this model modifies its attention mask with a mask overlay "
            "(or_mask_function / and_mask_function, e.g. bidirectional attention among image "
            "tokens), which flashattn_cu cannot express; use attn_implementation='sdpa' or 'eager'"
        )
    unsupported = _mask_parts_not_expressed(mask_function)
    if unsupported:
        raise NotImplementedError(
            f"{_where}: this model's attention mask uses {'; '.join(unsupported)}, which "
            "flashattn_cu cannot express (its kernels take causal masking, a sliding window, "
            "padding and packed sequences); use attn_implementation='sdpa' or 'eager'"
        )
    if attention_mask is None:
        return None
    mask = attention_mask[:, -kv_length:]
    if mask.shape[1] == kv_length and bool(mask.all()):
        return None
    return mask


# ---------------------------------------------------------------------------------------------
# Registration


def _import_transformers():
    try:
        import transformers
        from transformers import AttentionInterface, AttentionMaskInterface
    except ImportError as exc:
        raise ImportError(
            "flashattn_cu.integrations.transformers needs Hugging Face transformers with "
            "AttentionInterface and AttentionMaskInterface (tested with 5.17.0), an optional "
            f"dependency of flashattn_cu: pip install transformers ({exc})"
        ) from exc
    return transformers, AttentionInterface, AttentionMaskInterface


def _check_name(name):
    if not isinstance(name, str) or not name:
        raise ValueError(f"{_where}: the name must be a non-empty str, got {name!r}")
    if "|" in name or "/" in name or ":" in name:
        raise ValueError(f"{_where}: name {name!r} must not contain '|', '/' or ':' (transformers "
                         "reads those as a 'paged|' prefix or a hub kernel repository)")


def _treated_as_flash(name):
    """Whether transformers treats the name as a flash-attention flavour (its own test where it
    has one: a name containing "flash")."""
    try:
        from transformers.utils.generic import is_flash_attention_requested
    except ImportError:
        return "flash" in name
    return bool(is_flash_attention_requested(requested_attention_implementation=name))


def _flash_loader_module():
    return sys.modules.get("transformers.modeling_flash_attention_utils")


def _hook_flash_loader():
    """Wraps transformers' modeling_flash_attention_utils._lazy_imports (see the module docstring)
    so that it returns flashattn_cu's functions for names registered here. Idempotent; a
    transformers without that function gets no wrapper."""
    import transformers.modeling_flash_attention_utils  # noqa: F401  (load it)

    utils = _flash_loader_module()
    current = getattr(utils, "_lazy_imports", None)
    if current is None or getattr(current, "_flashattn_cu_wraps", None) is not None:
        return

    def _lazy_imports(implementation, *args, **kwargs):
        if implementation in _registered:
            # flash_attn 2.x's (flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache,
            # pad_input, unpad_input); flashattn_cu has no kvcache function.
            return flash_attn_func, flash_attn_varlen_func, None, pad_input, unpad_input
        return current(implementation, *args, **kwargs)

    _lazy_imports._flashattn_cu_wraps = current
    utils._lazy_imports = _lazy_imports


def _unhook_flash_loader(forget):
    """Restores the original _lazy_imports; `forget`: names whose functions transformers may have
    cached as its loaded flash implementation (dropped, so nothing serves them any more)."""
    utils = _flash_loader_module()
    if utils is None:
        return
    if getattr(utils, "_loaded_implementation", None) in forget:
        utils._loaded_implementation = None
    original = getattr(getattr(utils, "_lazy_imports", None), "_flashattn_cu_wraps", None)
    if original is not None and not any(_treated_as_flash(n) for n in _registered):
        utils._lazy_imports = original


def register(name=NAME):
    """Makes `attn_implementation=name` available in transformers (from_pretrained, from_config,
    set_attn_implementation) by registering `attention_forward` in AttentionInterface and
    `padding_mask` in AttentionMaskInterface. Idempotent; returns the name.

    Raises ImportError (naming transformers) when transformers is not installed, ValueError when
    the name is taken by another implementation (e.g. "sdpa") or has transformers' reserved
    characters. Names containing "flash" also get the loader wrapper described in the module
    docstring."""
    _check_name(name)
    _, attention_interface, mask_interface = _import_transformers()
    for interface, ours in ((attention_interface, attention_forward), (mask_interface,
                                                                       padding_mask)):
        existing = interface().get(name)
        if existing is not None and existing is not ours:
            raise ValueError(
                f"{_where}: {interface.__name__} already has {name!r} registered to "
                f"{getattr(existing, '__qualname__', existing)!r}; pick another name"
            )
    attention_interface.register(name, attention_forward)
    mask_interface.register(name, padding_mask)
    _registered.add(name)
    if _treated_as_flash(name):
        _hook_flash_loader()
    return name


def unregister(name=NAME):
    """Removes what register(name) added (a no-op returning False when it is not registered;
    True otherwise). transformers' interfaces have no public removal of a library-wide entry
    (GeneralInterface.__delitem__ removes only one instance's local override), so this deletes
    the entries from their class-wide `_global_mapping`, only where they are still ours. A model
    still configured with the name raises KeyError at its next forward; switch it first with
    model.set_attn_implementation("sdpa")."""
    if name not in _registered:
        return False
    _, attention_interface, mask_interface = _import_transformers()
    for interface, ours in ((attention_interface, attention_forward), (mask_interface,
                                                                       padding_mask)):
        mapping = getattr(interface, "_global_mapping", None)
        if mapping is None:
            raise RuntimeError(f"{_where}: this transformers' {interface.__name__} has no "
                               "_global_mapping; cannot unregister")
        if mapping.get(name) is ours:
            del mapping[name]
    _registered.discard(name)
    _unhook_flash_loader(forget={name})
    return True


def is_registered(name=NAME):
    """Whether `name` is registered by this module (and not unregistered since)."""
    return name in _registered
