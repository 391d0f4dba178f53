"""flashattn_cu as the flash backend of `torch.nn.functional.scaled_dot_product_attention` (opt-in).

    import flashattn_cu.sdpa
    flashattn_cu.sdpa.activate()     # SDPA's flash backend now runs flashattn_cu's kernels
    ...
    flashattn_cu.sdpa.deactivate()   # PyTorch's own FlashAttention-2 again

Every caller of SDPA then reaches flashattn_cu without code changes: Hugging Face models with
`attn_implementation="sdpa"`, torch.compile'd models, and PyTorch's context parallel
(`torch.distributed.tensor.experimental.context_parallel`), whose ring attention runs the same
aten ops on each rank.

What it replaces: the CUDA kernels of `aten::_scaled_dot_product_flash_attention` and
`aten::_scaled_dot_product_flash_attention_backward`, through PyTorch's own registry of flash
implementations (`torch.nn.attention.register_flash_attention_impl`, under the name
"flashattn_cu") where the installed torch has it, else by the same reversible dispatcher override
done here. Semantics are aten's: (batch, heads, seqlen, head_dim) tensors, `scale=None` meaning
head_dim ** -0.5, the full 9-tuple of outputs, and `is_causal` on square calls (SDPA, whose causal
is top-left aligned, sends no other causal call to the flash op; CausalBias's lower-right variant
calls the op directly).

What goes to PyTorch's own kernel instead (captured before the override with
`torch.library.get_kernel`), never to a different answer: dropout_p > 0, return_debug_mask, causal
with seqlen_q != seqlen_k, a scale the kernels refuse (not a positive normal float32 below
2.3e38), dtypes other
than float16/bfloat16, head dims that are not a multiple of 8, over 256 or not in this build, a
head dim that is not contiguous, tensors on different devices, GPUs older than sm_80.
`call_counts()` says how many calls ran where (under CUDA-graph replay nothing is counted: the
Python wrappers run only while capturing). The backward recomputes the probabilities from the
LSE alone, as aten's interface hands over nothing else (flashattn_cu.h: exact while |LSE| < ~2^14;
`flash_attn_func` itself keeps the exact row statistics).
"""

import collections
import logging

import torch

from flashattn_cu._ops import _non_overlapping_and_dense
from flashattn_cu._arguments import _kernels_take_scale
from flashattn_cu.flash_attn_interface import (_built_head_dims, _device_capability,
                                               _head_dim_instance)

__all__ = ["activate", "deactivate", "is_active", "call_counts", "reset_call_counts", "NAME"]

NAME = "flashattn_cu"
_FWD_OP = "_scaled_dot_product_flash_attention"
_BWD_OP = "_scaled_dot_product_flash_attention_backward"

logger = logging.getLogger(__name__)
_counts = collections.Counter()
_direct_handle = None  # the override's handle when torch has no registry of flash impls


def _torch_registry():
    """torch.nn.attention's registry functions, or None on a torch without them."""
    attn = torch.nn.attention
    names = ("register_flash_attention_impl", "activate_flash_attention_impl",
             "restore_flash_attention_impl", "current_flash_attention_impl")
    if all(hasattr(attn, n) for n in names):
        return attn
    return None


# ---------------------------------------------------------------------------------------------
# What flashattn_cu serves


def _unsupported(query, key, value, dropout_p, is_causal, *more, scale=None):
    """Why a call must run PyTorch's own kernel, or None when flashattn_cu serves it. Depends on
    nothing the forward knows and the backward does not (except return_debug_mask, which only
    changes the forward's outputs), so a call's forward and backward decide alike."""
    if dropout_p != 0.0:
        return "dropout_p > 0"
    tensors = (query, key, value) + more
    if any(t.dtype != query.dtype for t in tensors) or query.dtype not in (torch.float16,
                                                                           torch.bfloat16):
        return "dtype"
    if any(t.dim() != 4 for t in tensors):
        return "rank"
    if any(t.device != query.device for t in tensors) or query.device.type != "cuda":
        return "device"
    head_dim = query.shape[-1]
    if key.shape[-1] != head_dim or value.shape[-1] != head_dim:
        return "head dims differ"
    if head_dim % 8 != 0 or not 0 < head_dim <= 256:
        return "head dim not a multiple of 8 up to 256"
    if _head_dim_instance(head_dim) not in _built_head_dims():
        return "head dim not in this build"
    if any(t.stride(-1) != 1 and t.shape[-1] > 1 for t in tensors):
        return "head dim not contiguous"
    if query.shape[1] % key.shape[1] != 0 or key.shape[1] != value.shape[1]:
        return "heads"
    if is_causal and query.shape[2] != key.shape[2]:
        # torch's SDPA never sends these here (its is_causal is top-left); CausalBias's
        # lower-right variant calls the op directly and gets FlashAttention-2's bottom-right.
        return "causal with seqlen_q != seqlen_k"
    if scale is not None and not _kernels_take_scale(scale):
        return "scale not a positive normal float32 below 2.3e38"
    if _device_capability(query.device)[0] < 8:
        return "GPU older than sm_80"
    return None


def _count(key, reason=None):
    name = key if reason is None else f"{key} fallback: {reason}"
    _counts[name] += 1
    if reason is not None:
        logger.debug("flashattn_cu.sdpa: %s runs PyTorch's kernel (%s)", key, reason)


# ---------------------------------------------------------------------------------------------
# The kernels registered for aten's ops (called with the dispatch keyset first, so a fallback can
# hand the call to the original kernel)


def _forward(original, keyset, query, key, value, dropout_p=0.0, is_causal=False,
             return_debug_mask=False, *, scale=None):
    reason = _unsupported(query, key, value, dropout_p, is_causal, scale=scale)
    if reason is None and return_debug_mask:
        reason = "return_debug_mask"
    if reason is not None:
        _count("forward", reason)
        return original.call_boxed(keyset, query, key, value, dropout_p, is_causal,
                                   return_debug_mask, scale=scale)
    _count("forward")
    softmax_scale = query.shape[-1] ** -0.5 if scale is None else scale
    # (batch, seqlen, heads, d) views of SDPA's (batch, heads, seqlen, d) tensors: no copy.
    out, lse, *_ = torch.ops.flashattn_cu.fwd(query.transpose(1, 2), key.transpose(1, 2),
                                             value.transpose(1, 2), softmax_scale, is_causal)
    device = query.device
    rng_state = torch.zeros((2,), dtype=torch.uint64, device=device)
    unused = torch.zeros((), dtype=torch.uint64, device=device)
    debug_attn_mask = torch.empty(0, dtype=query.dtype, device=device)
    return (_aten_layout(out.transpose(1, 2), query), lse, None, None, query.shape[2],
            key.shape[2], rng_state, unused, debug_attn_mask)


def _backward(original, keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q,
              cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *,
              scale=None):
    reason = _unsupported(query, key, value, dropout_p, is_causal, out, scale=scale)
    if reason is not None:
        _count("backward", reason)
        return original.call_boxed(keyset, grad_out, query, key, value, out, logsumexp,
                                   cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                                   philox_seed, philox_offset, scale=scale)
    _count("backward")
    softmax_scale = query.shape[-1] ** -0.5 if scale is None else scale
    dq, dk, dv = torch.ops.flashattn_cu.bwd(
        grad_out.transpose(1, 2), query.transpose(1, 2), key.transpose(1, 2),
        value.transpose(1, 2), out.transpose(1, 2), logsumexp, softmax_scale, is_causal,
        torch.are_deterministic_algorithms_enabled())
    return (_aten_layout(dq.transpose(1, 2), query), _aten_layout(dk.transpose(1, 2), key),
            _aten_layout(dv.transpose(1, 2), value))


def _aten_layout(result, like):
    """result in the strides aten's meta functions give it, `torch.empty_like(like)` (compiled
    graphs assert them). flashattn_cu's ops already allocate so for every dense input, the usual
    case; other layouts (e.g. a query sliced from a packed tensor) get a copy."""
    # empty_like keeps the strides of a dense tensor exactly; only the others need asking.
    if _non_overlapping_and_dense(like):
        expected = like.stride()
    else:
        expected = torch.empty_like(like, device="meta").stride()
    if result.stride() == expected:
        return result
    fixed = torch.empty_strided(like.shape, expected, dtype=result.dtype, device=result.device)
    return fixed.copy_(result)


class _Handle:
    """Keeps the override alive; remove() restores PyTorch's kernels."""

    def __init__(self, library):
        self.library = library

    def remove(self):
        if self.library is not None:
            self.library._destroy()
            self.library = None


def _register():
    """Overrides the CUDA kernels of aten's SDPA flash ops (the registry's register_fn)."""
    import functools

    originals = {op: torch.library.get_kernel(f"aten::{op}", "CUDA") for op in (_FWD_OP, _BWD_OP)}
    lib = torch.library.Library("aten", "IMPL")
    lib.impl(_FWD_OP, functools.partial(_forward, originals[_FWD_OP]), "CUDA", with_keyset=True)
    lib.impl(_BWD_OP, functools.partial(_backward, originals[_BWD_OP]), "CUDA", with_keyset=True)
    return _Handle(lib)


# ---------------------------------------------------------------------------------------------
# Public API


def activate():
    """Routes SDPA's flash backend to flashattn_cu (idempotent). With torch's registry of flash
    implementations this is `torch.nn.attention.activate_flash_attention_impl("flashattn_cu")`,
    which first restores any other implementation that was active."""
    global _direct_handle
    registry = _torch_registry()
    if registry is not None:
        if registry.current_flash_attention_impl() != NAME:
            registry.activate_flash_attention_impl(NAME)
    elif _direct_handle is None:
        _direct_handle = _register()


def deactivate():
    """Restores PyTorch's own flash kernels (a no-op when flashattn_cu is not active)."""
    global _direct_handle
    registry = _torch_registry()
    if registry is not None:
        if registry.current_flash_attention_impl() == NAME:
            registry.restore_flash_attention_impl()
    if _direct_handle is not None:
        _direct_handle.remove()
        _direct_handle = None


def is_active():
    registry = _torch_registry()
    if registry is not None and registry.current_flash_attention_impl() == NAME:
        return True
    return _direct_handle is not None


def call_counts():
    """How many SDPA flash calls ran flashattn_cu ("forward", "backward") and how many went to
    PyTorch's kernel, by reason ("forward fallback: dropout_p > 0", ...), since the last reset."""
    return dict(_counts)


def reset_call_counts():
    _counts.clear()


# Known to torch's registry by name once this module is imported (so that
# `torch.nn.attention.activate_flash_attention_impl("flashattn_cu")` works too); nothing is
# activated until asked. `import flashattn_cu` alone does not import this module.
if _torch_registry() is not None:
    _torch_registry().register_flash_attention_impl(NAME, register_fn=_register)
