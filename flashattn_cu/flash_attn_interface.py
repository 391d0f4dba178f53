"""The public API, a drop-in for flash_attn 2.x's `flash_attn_func`.

Data path: validate in Python (every error names the argument, what it got and what is
supported) -> pad the head dim up to a multiple of 8 if needed -> `FlashAttnFunc` (autograd) ->
`torch.ops.flashattn_cu.fwd` / `.bwd` (C++ binding, csrc/torch/) -> kernels (csrc/flash/).

The ops have fake (meta) implementations (flashattn_cu/_ops.py, with the autograd Functions), so
`torch.compile(fullgraph=True)` traces `flash_attn_func`, forward and backward, without a graph
break.
"""

import functools

import torch
import torch.nn.functional as F

from flashattn_cu import _C  # also loads the library that defines torch.ops.flashattn_cu
from flashattn_cu._arguments import (
    _NAMES,
    ArgumentTypeError,  # noqa: F401  (public here: README)
    ArgumentValueError,
    _check_alibi,
    _check_packed,
    _check_softcap,
    _check_tensors,
    _check_varlen,
    _flash_attn_window,
    _softmax_scale,
    _window_and_causal,
)
from flashattn_cu._ops import FlashAttnFunc, FlashAttnVarlenFunc

__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache", "FlashAttnFunc",
           "FlashAttnVarlenFunc"]


# ---------------------------------------------------------------------------------------------
# Where a call runs (the argument checks: _arguments.py)


def _attn_probs(s_dmask, dropout_p):
    """flash_attn's third return value of return_attn_probs: S_dmask with dropout, else None
    (flash_attn 2.x up to 2.6; 2.7 and later return an empty tensor there)."""
    return s_dmask if dropout_p > 0.0 else None


# Every head-dim instance, built or not (csrc/flash/head_dims.h), ascending.
_HEAD_DIM_INSTANCES = tuple(_C.head_dim_instances())


def _head_dim_instance(head_dim):
    """The compiled head-dim instance that runs `head_dim` (after padding to a multiple of 8):
    the smallest instance >= head_dim, as round_head_dim() in csrc/flash/head_dims.h; None past
    the largest (never a StopIteration, which a generator or map() around the call would turn
    into a silent end)."""
    return next((d for d in _HEAD_DIM_INSTANCES if d >= head_dim), None)


@functools.lru_cache(maxsize=None)
def _built_head_dims():
    """The head-dim instances compiled into this build (FLASHATTN_CU_HEAD_DIMS), ascending."""
    return tuple(_C.built_head_dims())


_capability_cache = {}


def _device_capability(device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    cap = _capability_cache.get(index)
    if cap is None:
        cap = _capability_cache[index] = torch.cuda.get_device_capability(index)
    return cap


def _maybe_contiguous(*tensors):
    """flash_attn's maybe_contiguous: a tensor whose last dimension is not contiguous is copied
    (the kernels read rows of headdim elements); others pass as they are. Differentiable, so the
    gradient reaches the caller's layout."""
    return tuple(t.contiguous() if t.shape[-1] > 1 and t.stride(-1) != 1 else t for t in tensors)


def _check_devices(q, k, v, fn="flash_attn_func"):
    """Where the call runs: CUDA tensors on one sm_80+ GPU, and this build's instance of the head
    dim."""
    tensors = (q, k, v)
    for name, t in zip(_NAMES, tensors):
        if t.device.type != "cuda":
            raise ArgumentValueError(
                f"{fn}: {name} is on device '{t.device}'; flashattn_cu runs on CUDA "
                f"GPUs only (move it with {name}.cuda())"
            )
    for name, t in zip(_NAMES[1:], tensors[1:]):
        if t.device != q.device:
            raise ArgumentValueError(
                f"{fn}: {name} is on {t.device} but q is on {q.device}; q, k, v must "
                "be on the same GPU"
            )
    # The C++ op checks the device and the head dim too (the latter without naming what the
    # build has); skip the Python queries while torch.compile traces.
    if not torch.compiler.is_compiling():
        major, minor = _device_capability(q.device)
        if major < 8:
            raise RuntimeError(
                f"{fn}: {q.device} ({torch.cuda.get_device_name(q.device)}) is "
                f"sm_{major}{minor}; flashattn_cu needs sm_80 or newer (Ampere, Ada, Hopper)"
            )
        head_dim = q.shape[-1]
        instance, built = _head_dim_instance(head_dim), _built_head_dims()
        if instance is None:
            raise ArgumentValueError(
                f"{fn}: head dim {head_dim} is not supported; supported: 1 to "
                f"{_HEAD_DIM_INSTANCES[-1]}"
            )
        if instance not in built:
            raise RuntimeError(
                f"{fn}: unsupported head dim {head_dim}: it runs on the head-dim "
                f"instance {instance}, which this build does not have (built: "
                f"{', '.join(str(d) for d in built)}); rebuild flashattn_cu with {instance} in "
                "FLASHATTN_CU_HEAD_DIMS, or with FLASHATTN_CU_HEAD_DIMS unset for every instance"
            )


# ---------------------------------------------------------------------------------------------
# Public API


# Inference calls (no autograd, no dropout) with at most this many query rows per kv head
# (seqlen_q x the GQA group: decoding, speculative steps) run on flash_attn_with_kvcache's split-KV
# kernel, as flash_attn 2.x splits such calls too: one CTA per (batch, head, 128-row tile) would
# leave most SMs idle and read each kv head once per query head. Below ~64 rows per key the work
# is memory-bound (4 rows FLOP per 4 bytes of K and V per key), where that kernel reads the keys
# at the copy bandwidth. Calls that record autograd keep the kernels whose row statistics the
# backward reads.
_SPLIT_KV_MAX_ROWS = 64


def _split_kv_route(q, k, v, dropout_p):
    """Whether flash_attn_func runs this call on the split-KV kernel (see _SPLIT_KV_MAX_ROWS)."""
    if dropout_p > 0 or (torch.is_grad_enabled() and
                         (q.requires_grad or k.requires_grad or v.requires_grad)):
        return False
    seqlen_q, nheads = q.shape[1], q.shape[2]
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    return seqlen_q >= 1 and seqlen_k >= 1 and seqlen_q * (nheads // nheads_k) <= _SPLIT_KV_MAX_ROWS


def _fwd_splitkv(*args):
    """The routed forward: out, softmax_lse (a seam the host tests watch)."""
    return torch.ops.flashattn_cu.fwd_splitkv(*args)


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """Scaled dot-product attention, softmax(q k^T * softmax_scale) v, as flash_attn 2.x.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim), float16 or bfloat16, on an sm_80+ GPU.
        k, v: (batch, seqlen_k, nheads_k, headdim); nheads % nheads_k == 0 (GQA/MQA: query head
            i uses kv head i // (nheads // nheads_k)).
        dropout_p: dropout probability in [0, 1) on the attention probabilities (flash_attn's:
            each is kept with probability 1 - dropout_p and scaled by 1 / (1 - dropout_p); the
            mask is drawn from torch's CUDA generator, so torch.cuda.manual_seed reproduces it
            and CUDA graph replays draw new ones). Pass 0.0 at evaluation.
        softmax_scale: defaults to headdim ** -0.5; must be positive and finite.
        causal: causal mask aligned to the bottom-right corner of the attention matrix: query i
            sees keys j <= i + seqlen_k - seqlen_q. A query that sees no key outputs 0.
        window_size: (left, right) sliding window, -1 for an unbounded side: query i sees keys j
            with d - left <= j <= d + right, d = i + seqlen_k - seqlen_q (bottom-right aligned,
            as flash_attn); causal=True sets right = 0. Only the key blocks a query block can
            see are visited. A query that sees no key outputs 0.
        softcap: 0.0 (none) or > 0: the logits q k^T * softmax_scale become
            softcap * tanh(logits / softcap) before ALiBi, the mask and the softmax (flash_attn's
            convention); softmax_lse is of the capped logits.
        alibi_slopes: fp32 (nheads,) or (batch, nheads): ALiBi as flash_attn defines it (with d
            query i's diagonal key, + slope * j on key j when causal, - slope * |d - j| else).
        deterministic: make the backward pass bitwise reproducible.
        return_attn_probs: also return softmax_lse (batch, nheads, seqlen_q), float32, +inf for
            rows that see no key, and S_dmask: with dropout (flash_attn's testing output)
            (batch, nheads, seqlen_q, seqlen_k rounded up to 128) in q's dtype, the softmax
            probabilities with dropped elements negated (sign bit set, also on a dropped 0),
            0 in the padding; None without dropout.
    Returns:
        out (batch, seqlen_q, nheads, headdim), or (out, softmax_lse, S_dmask) if
        return_attn_probs.
    """
    causal, window_left, window_right = _window_and_causal(causal, dropout_p, window_size, softcap,
                                                           alibi_slopes)
    _check_tensors(q, k, v)
    _check_devices(q, k, v)
    causal, window_left, window_right = _flash_attn_window(causal, window_left, window_right,
                                                           k.shape[1])
    q, k, v = _maybe_contiguous(q, k, v)
    head_dim = q.shape[-1]
    softmax_scale = _softmax_scale(softmax_scale, head_dim)

    # The kernels take head dims that are multiples of 8; zero columns change no dot product.
    pad = -head_dim % 8
    if pad:
        q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))
    alibi_slopes = _check_alibi(alibi_slopes, q.shape[0], q.shape[2], q.device)
    dropout_p = float(dropout_p)
    if _split_kv_route(q, k, v, dropout_p):
        out, softmax_lse = _fwd_splitkv(q, k, v, softmax_scale, causal, window_left,
                                        window_right, alibi_slopes, _check_softcap(softcap))
        if pad:
            out = out[..., :head_dim]
        return (out, softmax_lse, None) if return_attn_probs else out
    out, softmax_lse, s_dmask = FlashAttnFunc.apply(
        q, k, v, softmax_scale, causal, bool(deterministic), window_left, window_right,
        alibi_slopes, _check_softcap(softcap), dropout_p, bool(return_attn_probs) and dropout_p > 0,
    )
    if pad:
        out = out[..., :head_dim]
    if return_attn_probs:
        return out, softmax_lse, _attn_probs(s_dmask, dropout_p)
    return out


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_func on a packed projection, as flash_attn 2.x: qkv (batch, seqlen, 3, nheads,
    headdim) holds q, k and v (self-attention, so nheads_k == nheads); the other arguments and
    the returns are flash_attn_func's. The gradient reaches qkv as one (batch, seqlen, 3, nheads,
    headdim) tensor."""
    _check_packed("flash_attn_qkvpacked_func", "qkv", qkv,
                  ("batch", "seqlen", 3, "nheads", "headdim"))
    q, k, v = qkv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_func with k and v packed, as flash_attn 2.x: q (batch, seqlen_q, nheads,
    headdim), kv (batch, seqlen_k, 2, nheads_k, headdim); nheads % nheads_k == 0. The other
    arguments and the returns are flash_attn_func's."""
    _check_packed("flash_attn_kvpacked_func", "kv", kv,
                  ("batch", "seqlen_k", 2, "nheads_k", "headdim"))
    k, v = kv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


# ---------------------------------------------------------------------------------------------
# Variable-length batches (flash_attn's packed (total, nheads, headdim) layout)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    """Attention over a batch of sequences of different lengths, as flash_attn 2.x.

    Arguments:
        q: (total_q, nheads, headdim), the queries of every sequence one after the other;
            k, v: (total_k, nheads_k, headdim).
        cu_seqlens_q, cu_seqlens_k: (batch + 1,) int32 on q's GPU, cumulative lengths starting
            at 0: sequence b is rows cu_seqlens[b] .. cu_seqlens[b + 1] - 1. Lengths of 0 are
            allowed.
        max_seqlen_q, max_seqlen_k: ints, at least every sequence's length (they size the
            mma.sync kernels' grid; the Hopper kernels launch the sequences' own blocks).
            A call whose cu_seqlens contradict them (a longer sequence, a decreasing pair, rows
            past the tensors) stops with a CUDA error (a device-side trap, reported at the next
            synchronization) instead of computing a wrong answer (flash_attn leaves such rows
            unwritten); FLASHATTN_CU_CHECK_SEQLENS=1 checks them on the host first (a
            synchronization) and raises a ValueError naming the sequence.
        causal: per sequence, aligned to the bottom-right corner of its own attention matrix.
        The other arguments as flash_attn_func (dropout included).
        block_table: optional (batch, max_num_blocks_per_seq) int32 (paged prefill, flash_attn's
            paged KV): k and v are then paged caches (num_blocks, page_block_size, nheads_k,
            headdim), any page_block_size >= 1, read in place, and sequence b's keys are the
            first cu_seqlens_k[b + 1] - cu_seqlens_k[b] rows of its pages in block_table order
            (block_table.shape[1] * page_block_size >= max_seqlen_k). Forward only, as in
            flash_attn: the output's backward raises NotImplementedError; dropout_p > 0 raises
            NotImplementedError; head dims multiples of 8. Page numbers are device values:
            outside [0, num_blocks) they are clamped by the kernel, never read outside.
    Returns:
        out (total_q, nheads, headdim), or (out, softmax_lse (nheads, total_q), S_dmask) if
        return_attn_probs: S_dmask (batch, nheads, max_seqlen_q, max_seqlen_k rounded up to 128)
        with dropout, sequence b's rows and keys from 0 of its slab, else None.
    """
    fn = "flash_attn_varlen_func"
    if block_table is not None:
        from flashattn_cu.kvcache import _paged_varlen  # defined there (imports this module)

        return _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             dropout_p, softmax_scale, causal, window_size, softcap,
                             alibi_slopes, return_attn_probs, block_table)
    causal, window_left, window_right = _window_and_causal(causal, dropout_p, window_size, softcap,
                                                           alibi_slopes, fn)
    max_seqlen_q, max_seqlen_k = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                               max_seqlen_k, fn)
    q4, k4, v4 = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    _check_tensors(q4, k4, v4, fn)
    _check_devices(q4, k4, v4, fn)
    causal, window_left, window_right = _flash_attn_window(causal, window_left, window_right,
                                                           max_seqlen_k)
    q, k, v = _maybe_contiguous(q, k, v)
    head_dim = q.shape[-1]
    softmax_scale = _softmax_scale(softmax_scale, head_dim, fn)
    pad = -head_dim % 8
    if pad:
        q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))
    dropout_p = float(dropout_p)
    out, softmax_lse, s_dmask = FlashAttnVarlenFunc.apply(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
        bool(deterministic), window_left, window_right,
        _check_alibi(alibi_slopes, cu_seqlens_q.numel() - 1, q.shape[1], q.device, fn),
        _check_softcap(softcap, fn), dropout_p, bool(return_attn_probs) and dropout_p > 0,
    )
    if pad:
        out = out[..., :head_dim]
    if return_attn_probs:
        return out, softmax_lse, _attn_probs(s_dmask, dropout_p)
    return out


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_varlen_func on a packed projection, as flash_attn 2.x: qkv (total, 3, nheads,
    headdim); cu_seqlens and max_seqlen serve queries and keys alike."""
    _check_packed("flash_attn_varlen_qkvpacked_func", "qkv", qkv, ("total", 3, "nheads", "headdim"))
    q, k, v = qkv.unbind(dim=1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_varlen_func with k and v packed, as flash_attn 2.x: kv (total_k, 2, nheads_k,
    headdim)."""
    _check_packed("flash_attn_varlen_kvpacked_func", "kv", kv,
                  ("total_k", 2, "nheads_k", "headdim"))
    k, v = kv.unbind(dim=1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs)


# flash_attn.flash_attn_interface has it too (defined in flashattn_cu/kvcache.py, which imports
# the checks above, hence last).
from flashattn_cu.kvcache import flash_attn_with_kvcache  # noqa: E402,F401
