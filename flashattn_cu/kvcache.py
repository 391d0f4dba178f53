"""`flash_attn_with_kvcache`, flash_attn 2.x's inference entry point (issue 10).

Data path: validate (every error names the argument) -> `torch.ops.flashattn_cu.fwd_kvcache`
(split-KV attention over the cache, GQA packing of each kv head's query heads for any seqlen_q
(not with ALiBi), paged gather through block_table; csrc/flash/problem/kv_cache.h), which also
appends the new k / v to the cache in place at cache_seqlens (contiguous or paged) and applies
rotary to q and the new k in the kernel (csrc/flash/problem/kv_append.h: the row-ownership
rule). The torch-op version of the append and rotary (`_append_unfused`) is kept as the
reference the GPU tests compare the fused path with bit for bit, and serves the two cases the
kernel cannot: seqlen_new == 0 with rotary (q rotated, nothing appended) and seqlen_q == 0 (no
attention block runs to do the append).

flash_attn_varlen_func(..., block_table=...) (paged prefill) comes here too (`_paged_varlen`):
the same op in its varlen mode, `torch.ops.flashattn_cu.fwd_kvcache_varlen` (varlen queries
with cu_seqlens_q, each sequence's keys counted by cu_seqlens_k, lse (nheads, total_q)); forward
only, as in flash_attn.
"""

import torch

from flashattn_cu import _C  # noqa: F401  (loads the library that defines torch.ops.flashattn_cu)
from flashattn_cu import flash_attn_interface as _fai
from flashattn_cu._arguments import (
    ArgumentTypeError,
    ArgumentValueError,
    _check_alibi,
    _check_cu_seqlens,
    _check_dropout,
    _check_seqlens_values,
    _check_softcap,
    _flash_attn_window,
    _is_int,
    _SUPPORTED_DTYPES,
    _softmax_scale,
    _window_and_causal,
)

__all__ = ["flash_attn_with_kvcache"]

_FN = "flash_attn_with_kvcache"
_MAX_SPLITS = 128


def _check_tensor(t, name, rank, shape_text, fn=_FN):
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ArgumentValueError(
            f"{fn}: {name} must have rank {rank} {shape_text}, got shape "
            f"{tuple(t.shape)}")


def _check_dtypes(named, q, fn=_FN):
    """Every (name, tensor) of `named` fp16 or bf16, and q's dtype."""
    for name, t in named:
        if t.dtype not in _SUPPORTED_DTYPES:
            raise ArgumentTypeError(
                f"{fn}: {name} has dtype {t.dtype}; supported: torch.float16, "
                "torch.bfloat16")
        if t.dtype != q.dtype:
            raise ArgumentTypeError(f"{fn}: {name} has dtype {t.dtype} but q has {q.dtype}")


def _check_int_tensor(t, name, shape, device, fn=_FN):
    """An int32 tensor of `shape` on `device` (None passes)."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise ArgumentTypeError(f"{fn}: {name} must be int32, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ArgumentValueError(
            f"{fn}: {name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.device != device:
        raise ArgumentValueError(f"{fn}: {name} is on {t.device} but q is on {device}")
    return t


def _check_devices(q, k_cache, v_cache, fn=_FN, names=("q", "k_cache", "v_cache")):
    """CUDA tensors on one GPU, an sm_80+ GPU and this build's instance of the head dim."""
    for name, t in zip(names, (q, k_cache, v_cache)):
        if t.device.type != "cuda":
            raise ArgumentValueError(
                f"{fn}: {name} is on device '{t.device}'; flashattn_cu runs on "
                "CUDA GPUs only")
        if t.device != q.device:
            raise ArgumentValueError(f"{fn}: {name} is on {t.device} but q is on {q.device}")
    _fai._check_devices(q, k_cache, v_cache, fn)


def _score_args(causal, window_size, softcap, alibi_slopes, softmax_scale, head_dim, seqlen_k,
                batch, nheads, device, fn):
    """A call's checked score arguments: (causal, window_left, window_right) with the window
    normalized against seqlen_k as flash_attn does (_arguments._flash_attn_window),
    the softmax scale, softcap and ALiBi slopes."""
    causal, left, right = _window_and_causal(causal, 0.0, window_size, softcap, alibi_slopes, fn)
    causal, left, right = _flash_attn_window(causal, left, right, seqlen_k)
    return (causal, left, right, _softmax_scale(softmax_scale, head_dim, fn),
            _check_softcap(softcap, fn), _check_alibi(alibi_slopes, batch, nheads, device, fn))


def _rotate(x, cos, sin, interleaved):
    """flash_attn's rotary embedding on the first 2 * cos.shape[-1] channels of x (batch, seqlen,
    heads, d), cos / sin (batch, seqlen, rotary_dim / 2) gathered at each row's position; in
    fp32, rounded back to x's dtype. interleaved: channel pairs (0, 1), (2, 3), ... (GPT-J);
    else (i, i + rotary_dim / 2) (GPT-NeoX)."""
    rot = 2 * cos.shape[-1]
    xr = x[..., :rot].float()
    c, s = cos.float().unsqueeze(2), sin.float().unsqueeze(2)
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
        out = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((out.to(x.dtype), x[..., rot:]), dim=-1)


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
):
    """Attention of q against a KV cache, as flash_attn 2.x's flash_attn_with_kvcache.

    If k and v are given, they are written into k_cache / v_cache *in place* at rows
    cache_seqlens[b], cache_seqlens[b] + 1, ... of each entry (paged caches too), and the
    attention covers them. With rotary_cos / rotary_sin (seqlen_ro, rotary_dim / 2), the new k is
    rotated at positions cache_seqlens[b] + i; q at cache_seqlens[b] + i when causal or local,
    else at cache_seqlens[b] for every row (flash_attn's rule).

    Arguments:
        q: (batch, seqlen_q, nheads, headdim), fp16 or bf16.
        k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim), or with block_table
            (num_blocks, page_block_size, nheads_k, headdim) with any page_block_size >= 1.
            Read in place: last dim contiguous, other strides multiples of 8.
        k, v: optional (batch, seqlen_new, nheads_k, headdim) new keys / values.
        rotary_cos, rotary_sin: optional (seqlen_ro, rotary_dim / 2), q's dtype, rotary_dim a
            multiple of 16 and <= headdim, seqlen_ro >= the cache's capacity; needs k and v.
        cache_seqlens: int or (batch,) int32: keys already in each entry's cache (before the
            append). None: the whole cache. The caller keeps cache_seqlens + seqlen_new within
            the cache (a device value: new rows past it are not written, nothing is written
            outside it, and the attention sees the cache's keys).
        cache_batch_idx: optional (batch,) int32: entry b uses cache entry cache_batch_idx[b]
            (contiguous caches; indices are device values, clamped into range by the kernel).
        cache_leftpad: optional (batch,) int32: entry b's keys start at cache row
            cache_leftpad[b].
        block_table: optional (batch, max_num_blocks_per_seq) int32 page numbers (device values:
            numbers outside [0, num_blocks) are clamped by the kernel, never read outside).
        softmax_scale, causal, window_size, softcap, alibi_slopes: as flash_attn_func (causal and
            the window are bottom-right aligned with the cache's keys).
        rotary_interleaved: GPT-J style pairs (True) or GPT-NeoX halves (False).
        num_splits: 0 picks a split-KV count from the SM count, the tiles and the cache length;
            1 .. 128 forces one.
        return_softmax_lse: also return the fp32 (batch, nheads, seqlen_q) LSE.
    Returns:
        out (batch, seqlen_q, nheads, headdim), or (out, softmax_lse) with return_softmax_lse.
    """
    return _with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                         cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                         window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
                         return_softmax_lse, fused=True)


def _with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                  cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal, window_size,
                  softcap, rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse,
                  fused):
    """flash_attn_with_kvcache; fused=False appends and rotates with torch ops before the op
    (`_append_unfused`, the reference of the fused path)."""
    _check_tensor(q, "q", 4, "(batch, seqlen_q, nheads, headdim)")
    paged = block_table is not None
    cache_text = ("(num_blocks, page_block_size, nheads_k, headdim)" if paged else
                  "(batch_cache, seqlen_cache, nheads_k, headdim)")
    _check_tensor(k_cache, "k_cache", 4, cache_text)
    _check_tensor(v_cache, "v_cache", 4, cache_text)
    _check_dtypes((("q", q), ("k_cache", k_cache), ("v_cache", v_cache)), q)
    batch, seqlen_q, nheads, head_dim = q.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ArgumentValueError(
            f"{_FN}: v_cache has shape {tuple(v_cache.shape)} but k_cache has "
            f"{tuple(k_cache.shape)}")
    nheads_k = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ArgumentValueError(
            f"{_FN}: k_cache has head dim {k_cache.shape[3]} but q has {head_dim}")
    if head_dim % 8 != 0 or not 0 < head_dim <= 256:
        raise ArgumentValueError(
            f"{_FN}: head dim {head_dim} is not supported; supported: multiples of "
            "8 up to 256 (the cache is read in place, so it cannot be padded)")
    # After the head dim's own check: _check_devices looks up the build's instance for it.
    _check_devices(q, k_cache, v_cache)
    if nheads_k < 1 or nheads % nheads_k != 0:
        raise ArgumentValueError(
            f"{_FN}: q has {nheads} heads and k_cache {nheads_k}; nheads must be a "
            "positive multiple of nheads_k")
    device = q.device

    if paged:
        _check_tensor(block_table, "block_table", 2, "(batch, max_num_blocks_per_seq)")
        if block_table.shape[0] != batch or block_table.shape[1] < 1:
            raise ArgumentValueError(
                f"{_FN}: block_table must have shape (batch, max_num_blocks_per_seq)"
                f" = ({batch}, >= 1), got {tuple(block_table.shape)}")
        block_table = _check_int_tensor(block_table, "block_table", tuple(block_table.shape),
                                        device)
        if k_cache.shape[0] < 1 or k_cache.shape[1] < 1:
            raise ArgumentValueError(
                f"{_FN}: a paged k_cache needs at least one page of at least one "
                f"row, got shape {tuple(k_cache.shape)}")
        if cache_batch_idx is not None:
            raise ArgumentValueError(
                f"{_FN}: cache_batch_idx is not supported with a paged cache "
                "(block_table); index the block table instead")
        page_size = k_cache.shape[1]
        capacity = block_table.shape[1] * page_size
    else:
        capacity = k_cache.shape[1]
    cache_batch_idx = _check_int_tensor(cache_batch_idx, "cache_batch_idx", (batch,), device)
    cache_leftpad = _check_int_tensor(cache_leftpad, "cache_leftpad", (batch,), device)
    if not paged and cache_batch_idx is None and k_cache.shape[0] < batch:
        raise ArgumentValueError(
            f"{_FN}: k_cache has {k_cache.shape[0]} entries but q has batch "
            f"{batch}; pass cache_batch_idx to pick entries")

    if (k is None) != (v is None):
        raise ArgumentValueError(
            f"{_FN}: k and v must be given together (got "
            f"{'k' if k is not None else 'v'} only)")
    seqlen_new = 0
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            _check_tensor(t, name, 4, "(batch, seqlen_new, nheads_k, headdim)")
            if t.dtype != q.dtype:
                raise ArgumentTypeError(f"{_FN}: {name} has dtype {t.dtype} but q has {q.dtype}")
            if t.device != device:
                raise ArgumentValueError(f"{_FN}: {name} is on {t.device} but q is on {device}")
        seqlen_new = k.shape[1]
        want = (batch, seqlen_new, nheads_k, head_dim)
        for name, t in (("k", k), ("v", v)):
            if tuple(t.shape) != want:
                raise ArgumentValueError(
                    f"{_FN}: {name} must have shape (batch, seqlen_new, nheads_k, "
                    f"headdim) = {want}, got {tuple(t.shape)}")
        if cache_seqlens is None:
            raise ArgumentValueError(
                f"{_FN}: cache_seqlens is required when k and v are given (where "
                "to append them)")

    if cache_seqlens is None:
        # The whole cache: the op takes None for it (no lengths tensor to fill) unless
        # cache_leftpad needs the lengths beside it (k / v need cache_seqlens: checked above).
        if cache_leftpad is not None:
            cache_seqlens = torch.full((batch,), capacity, dtype=torch.int32, device=device)
    elif _is_int(cache_seqlens):
        if not 0 <= cache_seqlens <= capacity - seqlen_new:
            raise ArgumentValueError(
                f"{_FN}: cache_seqlens={cache_seqlens} with {seqlen_new} new keys "
                f"does not fit the cache of {capacity} keys per entry")
        cache_seqlens = torch.full((batch,), int(cache_seqlens), dtype=torch.int32,
                                   device=device)
    else:
        cache_seqlens = _check_int_tensor(cache_seqlens, "cache_seqlens", (batch,), device)

    # The window against the cache's capacity, as flash_attn's mha_fwd_kvcache (its seqlen_k).
    causal, window_left, window_right, softmax_scale, softcap, alibi_slopes = _score_args(
        causal, window_size, softcap, alibi_slopes, softmax_scale, head_dim, capacity, batch,
        nheads, device, _FN)
    if not _is_int(num_splits) or not 0 <= num_splits <= _MAX_SPLITS:
        raise ArgumentValueError(
            f"{_FN}: num_splits must be an int in [0, {_MAX_SPLITS}] (0: "
            f"heuristic), got {num_splits!r}")

    if (rotary_cos is None) != (rotary_sin is None):
        raise ArgumentValueError(f"{_FN}: rotary_cos and rotary_sin must be given together")
    if rotary_cos is not None:
        if k is None:
            raise ArgumentValueError(
                f"{_FN}: rotary_cos / rotary_sin need the new k and v to rotate "
                "(flash_attn's rule)")
        for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            _check_tensor(t, name, 2, "(seqlen_ro, rotary_dim / 2)")
            if t.device != device:
                raise ArgumentValueError(f"{_FN}: {name} is on {t.device} but q is on {device}")
            if t.dtype != q.dtype:
                raise ArgumentTypeError(f"{_FN}: {name} has dtype {t.dtype} but q has {q.dtype}")
        if tuple(rotary_sin.shape) != tuple(rotary_cos.shape):
            raise ArgumentValueError(
                f"{_FN}: rotary_sin has shape {tuple(rotary_sin.shape)} but "
                f"rotary_cos has {tuple(rotary_cos.shape)}")
        rotary_dim = 2 * rotary_cos.shape[1]
        if rotary_dim > head_dim or rotary_dim % 16 != 0 or rotary_dim == 0:
            raise ArgumentValueError(
                f"{_FN}: rotary_dim = 2 * rotary_cos.shape[1] = {rotary_dim} must be "
                f"a positive multiple of 16 and <= headdim {head_dim}")
        if rotary_cos.shape[0] < capacity:
            raise ArgumentValueError(
                f"{_FN}: rotary_cos has {rotary_cos.shape[0]} positions; it needs "
                f"at least the cache's {capacity}")

    # flash_attn copies a q, k or v whose last dimension is not contiguous (the caches are
    # written in place and must be so already: the binding says so).
    q = _fai._maybe_contiguous(q)[0]
    if k is not None:
        k, v = _fai._maybe_contiguous(k, v)
    if k is not None and fused and seqlen_new > 0 and seqlen_q > 0:
        # The kernel appends (rotated) k and v and rotates q itself (problem/kv_append.h).
        out, softmax_lse = torch.ops.flashattn_cu.fwd_kvcache(
            q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
            softmax_scale, causal, window_left, window_right, alibi_slopes, softcap,
            int(num_splits), k, v, rotary_cos, rotary_sin, bool(rotary_interleaved))
        return (out, softmax_lse) if return_softmax_lse else out
    if k is not None:
        q, cache_seqlens = _append_unfused(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            block_table, causal or window_left >= 0 or window_right >= 0, rotary_interleaved,
            capacity)
    if cache_seqlens is not None:
        cache_seqlens = cache_seqlens.to(torch.int32)
    out, softmax_lse = torch.ops.flashattn_cu.fwd_kvcache(
        q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad,
        block_table, softmax_scale, causal, window_left, window_right, alibi_slopes, softcap,
        int(num_splits))
    return (out, softmax_lse) if return_softmax_lse else out


def _append_unfused(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                    cache_batch_idx, block_table, q_per_row, rotary_interleaved, capacity):
    """The append and rotary as torch ops on the stream (no host sync): the reference of the
    fused kernel path (same fp32 math, same rounding, so the same cache bytes) and the path of
    the cases it cannot serve (module docstring). Returns the rotated q and the key counts
    after the append."""
    batch, seqlen_new = k.shape[:2]
    seqlen_q = q.shape[1]
    device = q.device
    last = max(capacity - 1, 0)
    start = cache_seqlens.long().unsqueeze(1)
    # New row i lands on cache row cache_seqlens[b] + i (absolute, leftpad included). Rows past
    # the cache (a caller's bug, see cache_seqlens above) are not written, as in the kernels:
    # here each is sent to the nearest cache row (0 or the last) carrying exactly what that
    # row receives anyway (the new row that lands there, or its current contents), so the
    # duplicate writes of index_put_ agree and the result is deterministic.
    steps = torch.arange(seqlen_new, device=device, dtype=torch.int64)
    pos = (start + steps).clamp_(0, last)
    src = pos - start  # the new row that lands on pos, if any
    lands = (src >= 0) & (src < seqlen_new)
    src = src.clamp_(0, max(seqlen_new - 1, 0))
    gather = src[:, :, None, None].expand(-1, -1, k.shape[2], k.shape[3])
    k, v = k.gather(1, gather), v.gather(1, gather)
    if rotary_cos is not None:
        k = _rotate(k, rotary_cos[pos], rotary_sin[pos], rotary_interleaved)
        # q row i at cache_seqlens + i (causal or a window) or + 0, clamped to the tables' rows:
        # flash_attn reads the tables past the cache when seqlen_q > seqlen_new.
        q_steps = torch.arange(seqlen_q, device=device, dtype=torch.int64)
        if not q_per_row:
            q_steps = torch.zeros_like(q_steps)
        q_pos = (start + q_steps).clamp_(0, rotary_cos.shape[0] - 1)
        q = _rotate(q, rotary_cos[q_pos], rotary_sin[q_pos], rotary_interleaved)
    if block_table is not None:
        page_size = k_cache.shape[1]
        page = block_table.long().gather(1, torch.div(pos, page_size, rounding_mode="floor"))
        page = page.clamp_(0, k_cache.shape[0] - 1)
        index = (page, pos % page_size)
    else:
        entries = (cache_batch_idx.long().clamp(0, k_cache.shape[0] - 1)  # as the kernel
                   if cache_batch_idx is not None else torch.arange(batch, device=device))
        index = (entries.unsqueeze(1).expand(batch, seqlen_new), pos)
    keep = lands[:, :, None, None]
    k_cache.index_put_(index, torch.where(keep, k, k_cache[index]))
    v_cache.index_put_(index, torch.where(keep, v, v_cache[index]))
    return q, cache_seqlens + seqlen_new


# ---------------------------------------------------------------------------------------------
# flash_attn_varlen_func(..., block_table=...): paged prefill

_VARLEN_FN = "flash_attn_varlen_func"
_NO_BACKWARD = (
    "backward of flash_attn_varlen_func with block_table (paged KV) is not implemented: the "
    "paged path is forward-only, as in flash_attn (whose varlen backward takes no block table). "
    "For gradients pass contiguous k and v (total_k, nheads_k, headdim) without block_table")


class _PagedVarlenFunc(torch.autograd.Function):
    """The paged prefill forward; its backward raises (never a silent wrong gradient)."""

    @staticmethod
    def forward(ctx, q, k_cache, v_cache, *args):
        out, lse = torch.ops.flashattn_cu.fwd_kvcache_varlen(q, k_cache, v_cache, *args)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        raise NotImplementedError(_NO_BACKWARD)


def _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                  softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
                  block_table):
    """flash_attn_varlen_func with block_table (its arguments; see its docstring)."""
    fn = _VARLEN_FN
    dropout_p = _check_dropout(dropout_p, fn)
    if dropout_p > 0.0:
        raise NotImplementedError(
            f"{fn}: dropout_p > 0 with block_table (paged KV) is not implemented (got "
            f"dropout_p={dropout_p}); flash_attn's paged path has no dropout either. Pass "
            "dropout_p=0.0, or contiguous k and v without block_table")
    _check_tensor(q, "q", 3, "(total_q, nheads, headdim)", fn)
    paged_text = "(num_blocks, page_block_size, nheads_k, headdim) with block_table"
    _check_tensor(k, "k", 4, paged_text, fn)
    _check_tensor(v, "v", 4, paged_text, fn)
    _check_dtypes((("q", q), ("k", k), ("v", v)), q, fn)
    total_q, nheads, head_dim = q.shape
    if tuple(v.shape) != tuple(k.shape):
        raise ArgumentValueError(
            f"{fn}: v has shape {tuple(v.shape)} but k has {tuple(k.shape)} "
            "(paged caches of one layout)")
    num_blocks, page_size, nheads_k = k.shape[:3]
    if k.shape[3] != head_dim:
        raise ArgumentValueError(f"{fn}: k has head dim {k.shape[3]} but q has {head_dim}")
    if head_dim % 8 != 0 or not 0 < head_dim <= 256:
        raise ArgumentValueError(
            f"{fn}: head dim {head_dim} is not supported with block_table; "
            "supported: multiples of 8 up to 256 (the paged cache is read in "
            "place, so it cannot be padded)")
    _check_devices(q, k, v, fn, ("q", "k", "v"))  # after the head dim's check, as above
    if nheads_k < 1 or nheads % nheads_k != 0:
        raise ArgumentValueError(
            f"{fn}: q has {nheads} heads and k {nheads_k}; nheads must be a "
            "positive multiple of nheads_k")
    if num_blocks < 1 or page_size < 1:
        raise ArgumentValueError(
            f"{fn}: a paged k needs at least one page of at least one row, got "
            f"shape {tuple(k.shape)}")
    max_seqlen_q, max_seqlen_k = _check_cu_seqlens(q, cu_seqlens_q, cu_seqlens_k,
                                                   max_seqlen_q, max_seqlen_k, fn)
    _check_seqlens_values(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, total_q,
                          None, fn)  # paged keys: no row bound
    batch = cu_seqlens_q.numel() - 1
    device = q.device
    need = max(1, -(-max_seqlen_k // page_size))
    if not isinstance(block_table, torch.Tensor):
        raise ArgumentTypeError(
            f"{fn}: block_table must be a torch.Tensor, got "
            f"{type(block_table).__name__}")
    if block_table.dtype != torch.int32:
        raise ArgumentTypeError(f"{fn}: block_table must be int32, got {block_table.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.shape[1] < need:
        raise ArgumentValueError(
            f"{fn}: block_table must have shape (batch, max_num_blocks_per_seq) = ({batch}, >= "
            f"ceil(max_seqlen_k / page_block_size) = {need}) for max_seqlen_k={max_seqlen_k} and "
            f"page_block_size={page_size}, got {tuple(block_table.shape)}")
    if block_table.device != device:
        raise ArgumentValueError(
            f"{fn}: block_table is on {block_table.device} but q is on {device}")

    causal, window_left, window_right, softmax_scale, softcap, alibi_slopes = _score_args(
        causal, window_size, softcap, alibi_slopes, softmax_scale, head_dim, max_seqlen_k, batch,
        nheads, device, fn)
    q = _fai._maybe_contiguous(q)[0]  # as flash_attn; the paged k / v are read in place
    out, lse = _PagedVarlenFunc.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table,
                                      max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                                      window_left, window_right, alibi_slopes, softcap)
    return (out, lse, None) if return_attn_probs else out
