"""Argument checks of the public functions (flash_attn_interface.py, kvcache.py): each error
names the function, the argument, what it got and what is supported. Scalars (softcap, dropout_p,
window_size, softmax_scale) and ALiBi slopes; q, k, v as tensors (types, dtypes, shapes, head
counts); varlen's cu_seqlens and max_seqlen bounds. Where a call runs (CUDA device, sm_80+, the
build's head dims) stays in flash_attn_interface.py (_check_devices).

The errors are ArgumentValueError / ArgumentTypeError: ValueError / TypeError and, as flash_attn's
own (C++) checks raise, RuntimeError too; flash_attn_interface, where README names them,
imports them.
"""

import math
import numbers
import os
import struct

import torch

class ArgumentValueError(ValueError, RuntimeError):
    """A bad argument value. A ValueError, and a RuntimeError as flash_attn's own checks raise
    (TORCH_CHECK in its C++), so code written for flash_attn that catches RuntimeError to fall
    back to another backend catches these too."""


class ArgumentTypeError(TypeError, RuntimeError):
    """A bad argument type or dtype: a TypeError, and a RuntimeError as flash_attn's."""


_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


_MAX_HEAD_DIM = 256


_NAMES = ("q", "k", "v")


def _is_real(x):
    """A real number that is not a bool (a plain float / int first: the numbers ABC's isinstance
    costs ~0.4 us, on every call's checks)."""
    return type(x) in (float, int) or (not isinstance(x, bool) and isinstance(x, numbers.Real))


def _is_int(x):
    """An integral number that is not a bool (a plain int first, as _is_real)."""
    return type(x) is int or (not isinstance(x, bool) and isinstance(x, numbers.Integral))


def _check_softcap(softcap, fn="flash_attn_func"):
    """softcap as a float: 0.0 (none) or a positive normal float32 (the kernels compute in
    float32)."""
    if not _is_real(softcap):
        raise ArgumentTypeError(
            f"{fn}: softcap must be a Python number, got "
            f"{type(softcap).__name__}")
    softcap = float(softcap)
    if softcap == 0.0:
        return 0.0
    if not (math.isfinite(softcap) and softcap > 0):
        raise ArgumentValueError(
            f"{fn}: softcap must be 0.0 (none) or a positive finite "
            f"number, got {softcap}")
    if not _FLOAT32_MIN_NORMAL <= _as_float32(softcap) < 2.3e38:
        raise ArgumentValueError(
            f"{fn}: softcap={softcap} is not a normal positive float32 "
            "below 2.3e38 (the kernels compute in float32)")
    return softcap


def _check_dropout(dropout_p, fn="flash_attn_func"):
    """dropout_p as a float in [0, 1) (the kernels keep each probability with 1 - dropout_p)."""
    if not _is_real(dropout_p):
        raise ArgumentTypeError(
            f"{fn}: dropout_p must be a Python number, got "
            f"{type(dropout_p).__name__}")
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ArgumentValueError(
            f"{fn}: dropout_p must be a probability in [0, 1), got "
            f"{dropout_p}")
    return dropout_p


def _check_features(dropout_p, window_size, softcap, alibi_slopes, fn="flash_attn_func"):
    """Returns the window as (left, right), -1 for an unbounded side (flash_attn: any negative
    size is unbounded)."""
    _check_dropout(dropout_p, fn)
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ArgumentValueError(
            f"{fn}: window_size must be a pair (left, right), got {window_size!r}"
        ) from None
    for side in (left, right):
        if not _is_int(side):
            raise ArgumentValueError(
                f"{fn}: window_size must be a pair of ints, got "
                f"{window_size!r}")
    # As in flash_attn, a negative size means unbounded on that side; sizes past the matrix are
    # unbounded too (the kernels clamp per sequence).
    limit = 2 ** 31 - 1
    return (-1 if left < 0 else min(int(left), limit), -1 if right < 0 else min(int(right), limit))


def _window_and_causal(causal, dropout_p, window_size, softcap, alibi_slopes,
                       fn="flash_attn_func"):
    """The checked features' window (_check_features) with causal folded in, as the kernels take
    it: (causal, left, right). A window (-1, 0) is causal; causal means right = 0."""
    left, right = _check_features(dropout_p, window_size, softcap, alibi_slopes, fn)
    causal = bool(causal) or (left < 0 and right == 0)
    return causal, left, 0 if causal else right


def _flash_attn_window(causal, left, right, seqlen_k):
    """flash_attn's normalization of a call's window against its key bound seqlen_k (the padded
    call's seqlen_k, the varlen call's max_seqlen_k, the KV cache's capacity: csrc/flash_attn/
    flash_api.cpp, mha_fwd and its siblings, then set_params_fprop): a side >= seqlen_k is
    unbounded (-1); causal, or (-1, 0), is causal with right = 0; a bounded left side with an
    unbounded right takes right = seqlen_k (not unbounded: with more queries than keys the first
    rows stop there). The mask of every side it changes is the same but for those rows; what it
    also settles as flash_attn does is whether the call is causal (ALiBi's bias form, so the
    lse) or local (a KV cache's rotary position per query row). Returns (causal, left, right)."""
    left = -1 if left >= seqlen_k else left
    right = -1 if right >= seqlen_k else right
    causal = causal or (left < 0 and right == 0)
    if causal:
        right = 0
    elif left >= 0 and right < 0:
        right = seqlen_k
    return causal, left, right


def _softmax_scale(softmax_scale, head_dim, fn="flash_attn_func"):
    """softmax_scale as a float: headdim ** -0.5 for None, else checked (_check_scale)."""
    if softmax_scale is None:
        return head_dim ** (-0.5)
    _check_scale(softmax_scale, fn)
    return float(softmax_scale)


def _check_alibi(alibi_slopes, batch, nheads, device, fn="flash_attn_func"):
    """alibi_slopes as flash_attn takes them: fp32 (nheads,) or (batch, nheads) on q's GPU."""
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, torch.Tensor):
        raise ArgumentTypeError(
            f"{fn}: alibi_slopes must be a torch.Tensor, got "
            f"{type(alibi_slopes).__name__}")
    if alibi_slopes.dtype != torch.float32:
        raise ArgumentTypeError(f"{fn}: alibi_slopes must be float32, got {alibi_slopes.dtype}")
    if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
        raise ArgumentValueError(
            f"{fn}: alibi_slopes must have shape (nheads,) = ({nheads},) "
            f"or (batch, nheads) = ({batch}, {nheads}), got "
            f"{tuple(alibi_slopes.shape)}")
    if alibi_slopes.device != device:
        raise ArgumentValueError(
            f"{fn}: alibi_slopes is on {alibi_slopes.device} but q is on "
            f"{device}")
    return alibi_slopes


def _check_scale(softmax_scale, fn="flash_attn_func"):
    if not _is_real(softmax_scale):
        raise ArgumentTypeError(
            f"{fn}: softmax_scale must be None or a Python number, got "
            f"{type(softmax_scale).__name__}"
        )
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ArgumentValueError(
            f"{fn}: softmax_scale must be a positive finite number, got {softmax_scale}"
            " (None means headdim ** -0.5)"
        )
    if not _kernels_take_scale(softmax_scale):
        raise ArgumentValueError(
            f"{fn}: softmax_scale={softmax_scale} is not a normal positive float32 below 2.3e38 "
            "(the kernels compute in float32 with softmax_scale * log2(e); supported: about "
            "1.2e-38 to 2.3e38)"
        )


_FLOAT32_MIN_NORMAL = 2.0 ** -126


def _kernels_take_scale(softmax_scale):
    """Whether the kernels compute with this softmax_scale (a real; False for 0, negatives and
    NaN): they take it as a float32 and flush subnormals (1e-50 would become 0 there, 1e39 inf),
    and scale by softmax_scale * log2(e), which passes float32's range above ~2.36e38."""
    return _FLOAT32_MIN_NORMAL <= _as_float32(softmax_scale) < 2.3e38


def _as_float32(x):
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.inf


def _check_tensors(q, k, v, fn="flash_attn_func"):
    if _tensors_ok(q, k, v):
        return
    tensors = (q, k, v)
    for name, t in zip(_NAMES, tensors):
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in zip(_NAMES, tensors):
        if t.dtype not in _SUPPORTED_DTYPES:
            raise ArgumentTypeError(
                f"{fn}: {name} has dtype {t.dtype}; supported: torch.float16, "
                f"torch.bfloat16 (convert with {name}.half() or {name}.bfloat16())"
            )
    for name, t in zip(_NAMES[1:], tensors[1:]):
        if t.dtype != q.dtype:
            raise ArgumentTypeError(
                f"{fn}: {name} has dtype {t.dtype} but q has {q.dtype}; q, k, v must "
                "have the same dtype"
            )
    for name, t in zip(_NAMES, tensors):
        if t.dim() != 4:
            raise ArgumentValueError(
                f"{fn}: {name} must have rank 4 (batch, seqlen, nheads, headdim), got "
                f"shape {tuple(t.shape)}"
            )
    batch, _, nheads, head_dim = q.shape
    for name, t in zip(_NAMES[1:], tensors[1:]):
        if t.shape[0] != batch:
            raise ArgumentValueError(
                f"{fn}: {name} has batch size {t.shape[0]} but q has {batch}; shapes: "
                f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
            )
        if t.shape[3] != head_dim:
            raise ArgumentValueError(
                f"{fn}: {name} has head dim {t.shape[3]} but q has {head_dim}; q, k, v "
                "must share the head dim"
            )
    if v.shape[1] != k.shape[1]:
        raise ArgumentValueError(
            f"{fn}: v has seqlen {v.shape[1]} but k has {k.shape[1]}; k and v must "
            "have the same seqlen"
        )
    if v.shape[2] != k.shape[2]:
        raise ArgumentValueError(
            f"{fn}: v has {v.shape[2]} heads but k has {k.shape[2]}; k and v must have "
            "the same number of heads"
        )
    nheads_k = k.shape[2]
    if nheads < 1 or nheads_k < 1 or nheads % nheads_k != 0:
        raise ArgumentValueError(
            f"{fn}: q has {nheads} heads and k/v have {nheads_k}; nheads must be a "
            "positive multiple of nheads_k (MHA, GQA or MQA)"
        )
    if head_dim < 1 or head_dim > _MAX_HEAD_DIM:
        raise ArgumentValueError(
            f"{fn}: head dim {head_dim} is not supported; supported: 1 to "
            f"{_MAX_HEAD_DIM} (multiples of 8 run natively, others are zero-padded)"
        )


def _tensors_ok(q, k, v):
    """Whether q, k, v pass every check of _check_tensors, in one expression (its common case,
    a few attribute reads instead of its loops; the host time of every call). False sends the
    call through those checks, which raise naming what is wrong."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and
            isinstance(v, torch.Tensor)):
        return False
    qs, ks, dtype = q.shape, k.shape, q.dtype
    return (dtype in _SUPPORTED_DTYPES and k.dtype == dtype and v.dtype == dtype and
            len(qs) == 4 and len(ks) == 4 and v.shape == ks and ks[0] == qs[0] and
            ks[3] == qs[3] and 1 <= qs[3] <= _MAX_HEAD_DIM and qs[2] >= 1 and ks[2] >= 1 and
            qs[2] % ks[2] == 0)


def _check_packed(fn, name, t, shape):
    """A packed projection of `shape`, e.g. ("total", 3, "nheads", "headdim"): the one int is the
    packed dimension's size."""
    what = f"({', '.join(map(str, shape))})"
    axis = next(i for i, x in enumerate(shape) if isinstance(x, int))
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != len(shape) or t.shape[axis] != shape[axis]:
        raise ArgumentValueError(f"{fn}: {name} must be {what}, got shape {tuple(t.shape)}")


def _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, fn):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ArgumentValueError(
                f"{fn}: {name} must have rank 3 (total_tokens, nheads, headdim), got "
                f"shape {tuple(t.shape)}")
    bounds = _check_cu_seqlens(q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, fn)
    _check_seqlens_values(cu_seqlens_q, cu_seqlens_k, *bounds, q.shape[0], k.shape[0], fn)
    return bounds


def _check_seqlens_values(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, total_q,
                          total_k, fn):
    """With FLASHATTN_CU_CHECK_SEQLENS=1 (read at each call), the values of cu_seqlens: every
    entry's length in [0, max_seqlen], its rows inside the tensor (total_k None: not a bound,
    paged keys). A ValueError naming the entry, where the kernels, which check the same on the
    GPU without a synchronization, can only stop with a device error (problem/seqlen.h). This
    check reads the arrays to the host, a synchronization: off by default, and skipped while
    torch.compile traces or a CUDA graph is captured."""
    if os.environ.get("FLASHATTN_CU_CHECK_SEQLENS", "0") in ("", "0"):
        return
    if torch.compiler.is_compiling() or (cu_seqlens_q.is_cuda and
                                         torch.cuda.is_current_stream_capturing()):
        return
    for which, cu, bound, total in (("q", cu_seqlens_q, max_seqlen_q, total_q),
                                    ("k", cu_seqlens_k, max_seqlen_k, total_k)):
        c = cu.tolist()
        for b, (start, end) in enumerate(zip(c, c[1:])):
            if start < 0 or end - start < 0 or end - start > bound or \
                    (total is not None and end > total):
                raise ArgumentValueError(
                    f"{fn}: cu_seqlens_{which}[{b}] = {start} and cu_seqlens_{which}[{b + 1}] = "
                    f"{end} give sequence {b} {end - start} rows, but max_seqlen_{which} is "
                    f"{bound}" + ("" if total is None else f" and {which} has {total} rows") +
                    f": every length must be in [0, max_seqlen_{which}] and every sequence's rows "
                    f"inside the tensor")


def _check_cu_seqlens(q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, fn):
    """cu_seqlens_q / cu_seqlens_k int32 (batch + 1,) on q's device; returns the max_seqlen
    bounds as ints."""
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or \
                t.numel() < 1:
            got = (f"a {t.dim()}-d {t.dtype} tensor of shape {tuple(t.shape)}"
                   if isinstance(t, torch.Tensor) else type(t).__name__)
            raise ArgumentValueError(
                f"{fn}: {name} must be a 1-d int32 tensor of batch + 1 cumulative "
                f"lengths, got {got}")
        if t.device != q.device:
            raise ArgumentValueError(f"{fn}: {name} is on {t.device} but q is on {q.device}")
    if cu_seqlens_k.numel() != cu_seqlens_q.numel():
        raise ArgumentValueError(
            f"{fn}: cu_seqlens_q has {cu_seqlens_q.numel()} elements and "
            f"cu_seqlens_k {cu_seqlens_k.numel()}; both are batch + 1")
    out = []
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(m, torch.Tensor) and m.numel() == 1:
            m = m.item()
        if not _is_int(m) or m < 0:
            raise ArgumentValueError(f"{fn}: {name} must be a non-negative int, got {m!r}")
        out.append(int(m))
    return out
