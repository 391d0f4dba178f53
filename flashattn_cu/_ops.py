"""The C++ ops' Python side: fake (meta) implementations of all seven ops in
torch.ops.flashattn_cu (csrc/torch/flashattn_cu.cpp has their schemas), so torch.compile
(fullgraph) traces every public function, forward and backward, without a graph break; and the
autograd Functions over fwd / bwd (padded and varlen) that flash_attn_interface.py calls."""

import torch

from flashattn_cu import _C  # noqa: F401  (loads the library that defines torch.ops.flashattn_cu)


# ---------------------------------------------------------------------------------------------
# Fake implementations: output shapes, dtypes and strides exactly as the C++ ops allocate them,
# for torch.compile / FakeTensor / meta tensors.


def _non_overlapping_and_dense(t):
    """Tensor.is_non_overlapping_and_dense() of ATen (c10's rule): the dims of size != 1, in
    order of increasing stride, have strides 1, size0, size0*size1, ..."""
    required = 1
    for size, stride in sorted(((n, st) for n, st in zip(t.shape, t.stride()) if n != 1),
                               key=lambda ns: ns[1]):
        if stride != required:
            return False
        required *= size
    return True


def _empty_like_layout(t):
    """What the C++ ops allocate for an output or gradient shaped like t (empty_like_layout in
    csrc/torch/common.cpp): t's strides where t is dense with a contiguous last dim and
    every other stride a multiple of 8 (flash_attn's `torch.empty_like(q)`), else contiguous."""
    keep = _non_overlapping_and_dense(t) and (t.shape[-1] <= 1 or t.stride(-1) == 1)
    keep = keep and all(n <= 1 or st % 8 == 0 for n, st in zip(t.shape[:-1], t.stride()[:-1]))
    if keep:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return t.new_empty(t.shape)


def _round128(n):
    return (n + 127) // 128 * 128


def _dropout_outputs_fake(q, batch, nheads, seqlen_q, seqlen_k, dropout_p, return_softmax):
    """rng_state int64 (2,) with dropout, else (0,); S_dmask (batch, nheads, seqlen_q and seqlen_k
    rounded up to 128) or an empty (0,) tensor: dropout_outputs in csrc/torch/common.cpp."""
    rng_state = q.new_empty((2 if dropout_p > 0 else 0,), dtype=torch.int64)
    if return_softmax:
        s_dmask = q.new_empty((batch, nheads, _round128(seqlen_q), _round128(seqlen_k)))
    else:
        s_dmask = q.new_empty((0,))
    return rng_state, s_dmask


@torch.library.register_fake("flashattn_cu::fwd_splitkv")
def _fwd_splitkv_fake(q, k, v, softmax_scale, causal, window_left=-1, window_right=-1,
                      alibi_slopes=None, softcap=0.0, num_splits=0):
    batch, seqlen_q, nheads, _ = q.shape
    return _empty_like_layout(q), q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)


@torch.library.register_fake("flashattn_cu::fwd")
def _fwd_fake(q, k, v, softmax_scale, causal, window_left=-1, window_right=-1, alibi_slopes=None,
              softcap=0.0, dropout_p=0.0, return_softmax=False, gen=None):
    batch, seqlen_q, nheads, head_dim = q.shape
    out = _empty_like_layout(q)
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
    stats = q.new_empty((batch, nheads, seqlen_q, 2), dtype=torch.float32)
    return (out, lse, stats,
            *_dropout_outputs_fake(q, batch, nheads, seqlen_q, k.shape[1], dropout_p,
                                  return_softmax))


@torch.library.register_fake("flashattn_cu::bwd")
def _bwd_fake(dout, q, k, v, out, softmax_lse, softmax_scale, causal, deterministic,
              softmax_stats=None, window_left=-1, window_right=-1, alibi_slopes=None,
              softcap=0.0, dropout_p=0.0, rng_state=None):
    return _empty_like_layout(q), _empty_like_layout(k), _empty_like_layout(v)


@torch.library.register_fake("flashattn_cu::fwd_varlen")
def _fwd_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                     softmax_scale, causal, window_left=-1, window_right=-1, alibi_slopes=None,
                     softcap=0.0, dropout_p=0.0, return_softmax=False, gen=None):
    total_q, nheads, _ = q.shape
    lse = q.new_empty((nheads, total_q), dtype=torch.float32)
    stats = q.new_empty((nheads, total_q, 2), dtype=torch.float32)
    return (_empty_like_layout(q), lse, stats,
            *_dropout_outputs_fake(q, cu_seqlens_q.shape[0] - 1, nheads, max_seqlen_q,
                                   max_seqlen_k, dropout_p, return_softmax))


@torch.library.register_fake("flashattn_cu::bwd_varlen")
def _bwd_varlen_fake(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k, softmax_scale, causal, deterministic, softmax_stats=None,
                     window_left=-1, window_right=-1, alibi_slopes=None, softcap=0.0,
                     dropout_p=0.0, rng_state=None):
    return _empty_like_layout(q), _empty_like_layout(k), _empty_like_layout(v)


@torch.library.register_fake("flashattn_cu::fwd_kvcache")
def _fwd_kvcache_fake(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad,
                      block_table, softmax_scale, causal, window_left=-1, window_right=-1,
                      alibi_slopes=None, softcap=0.0, num_splits=0, k_new=None, v_new=None,
                      rotary_cos=None, rotary_sin=None, rotary_interleaved=True):
    # k_cache / v_cache are mutated in place (the schema's Tensor(a!)); nothing to do here.
    batch, seqlen_q, nheads, _ = q.shape
    return _empty_like_layout(q), q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)


@torch.library.register_fake("flashattn_cu::fwd_kvcache_varlen")
def _fwd_kvcache_varlen_fake(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, block_table,
                             max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left=-1,
                             window_right=-1, alibi_slopes=None, softcap=0.0, num_splits=0):
    total_q, nheads, _ = q.shape
    return _empty_like_layout(q), q.new_empty((nheads, total_q), dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# Autograd


_DOUBLE_BACKWARD_MESSAGE = (
    b"flashattn_cu: flash_attn_func has no double backward: its gradients (dq, dk, dv) are not "
    b"differentiable, so a gradient of them (torch.autograd.grad(..., create_graph=True) and a "
    b"second backward through the result, e.g. a gradient penalty or a Hessian-vector product) "
    b"cannot be computed. Use torch.nn.functional.scaled_dot_product_attention with the math "
    b"backend for higher-order gradients."
)


def _no_double_backward(grads, inputs):
    """Returns `grads` unchanged unless this backward itself is being recorded (create_graph=True
    with an input that requires grad). Then each gradient comes back as an alias whose own
    backward raises _DOUBLE_BACKWARD_MESSAGE: without it autograd would treat the kernel's
    gradients as constants and silently drop every second-order term."""
    if not torch.is_grad_enabled() or not any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in inputs
    ):
        return grads
    err_fn = torch._C._functions.DelayedError(_DOUBLE_BACKWARD_MESSAGE, len(grads))
    aliases = []
    for g in grads:
        g = g.detach()
        g.requires_grad_(True)
        aliases.append(g)
    return tuple(err_fn(*aliases))


def _skip_zero_grads(ctx):
    """softmax_lse and S_dmask are not differentiable, yet autograd materializes a zero gradient
    for each before the backward (a fill kernel and its launch on every training step). Without
    that, the backward gets None for them, and for out only if no gradient reached it. Eager
    only: dynamo does not trace set_materialize_grads (a graph break under fullgraph)."""
    if not torch.compiler.is_compiling():
        ctx.set_materialize_grads(False)


class FlashAttnFunc(torch.autograd.Function):
    """Attention on (batch, seqlen, nheads, headdim) tensors whose head dim is already a multiple
    of 8 and <= 256. Returns (out, softmax_lse, S_dmask); softmax_lse and S_dmask are not
    differentiable; S_dmask is an empty tensor unless return_softmax (which needs dropout_p > 0).

    The forward saves the per-row statistics the kernel returns besides the LSE (row max and
    log2 of the row sum), from which the backward recomputes the probabilities exactly at any
    logit magnitude (csrc/include/flashattn_cu/flashattn_cu.h, FwdParams::softmax_stats), and
    dropout's rng_state (seed, offset), from which it regenerates the forward's mask."""

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, deterministic, window_left=-1,
                window_right=-1, alibi_slopes=None, softcap=0.0, dropout_p=0.0,
                return_softmax=False):
        out, softmax_lse, softmax_stats, rng_state, s_dmask = torch.ops.flashattn_cu.fwd(
            q, k, v, softmax_scale, causal, window_left, window_right, alibi_slopes, softcap,
            dropout_p, return_softmax,
        )
        ctx.alibi_slopes = alibi_slopes
        ctx.softcap = softcap
        ctx.dropout_p = dropout_p
        ctx.save_for_backward(q, k, v, out, softmax_lse, softmax_stats, rng_state)
        ctx.softmax_scale = softmax_scale
        ctx.causal = causal
        ctx.deterministic = deterministic
        ctx.window = (window_left, window_right)
        ctx.mark_non_differentiable(softmax_lse, s_dmask)
        _skip_zero_grads(ctx)
        return out, softmax_lse, s_dmask

    @staticmethod
    def backward(ctx, dout, _dlse, _ds_dmask):
        if dout is None:  # no gradient reached out (_skip_zero_grads): none for the inputs
            return (None,) * 12
        q, k, v, out, softmax_lse, softmax_stats, rng_state = ctx.saved_tensors
        with torch.no_grad():
            # dout may be any layout (out.sum() gives a stride-0 expand); the op copies if it must.
            dq, dk, dv = torch.ops.flashattn_cu.bwd(
                dout, q, k, v, out, softmax_lse, ctx.softmax_scale, ctx.causal,
                ctx.deterministic, softmax_stats, *ctx.window, ctx.alibi_slopes, ctx.softcap,
                ctx.dropout_p, rng_state if ctx.dropout_p > 0 else None,
            )
        dq, dk, dv = _no_double_backward((dq, dk, dv), (dout, q, k, v))
        return dq, dk, dv, None, None, None, None, None, None, None, None, None


class FlashAttnVarlenFunc(torch.autograd.Function):
    """Attention on varlen (total, nheads, headdim) tensors (head dim a multiple of 8, <= 256)
    with cu_seqlens_q / cu_seqlens_k. Returns (out, softmax_lse (nheads, total_q), S_dmask), as
    FlashAttnFunc."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                softmax_scale, causal, deterministic, window_left=-1, window_right=-1,
                alibi_slopes=None, softcap=0.0, dropout_p=0.0, return_softmax=False):
        out, softmax_lse, softmax_stats, rng_state, s_dmask = torch.ops.flashattn_cu.fwd_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, None, max_seqlen_q, max_seqlen_k, softmax_scale,
            causal, window_left, window_right, alibi_slopes, softcap, dropout_p, return_softmax,
        )
        ctx.alibi_slopes = alibi_slopes
        ctx.softcap = softcap
        ctx.dropout_p = dropout_p
        ctx.window = (window_left, window_right)
        ctx.save_for_backward(q, k, v, out, softmax_lse, softmax_stats, cu_seqlens_q,
                              cu_seqlens_k, rng_state)
        ctx.max_seqlen_q, ctx.max_seqlen_k = max_seqlen_q, max_seqlen_k
        ctx.softmax_scale = softmax_scale
        ctx.causal = causal
        ctx.deterministic = deterministic
        ctx.mark_non_differentiable(softmax_lse, s_dmask)
        _skip_zero_grads(ctx)
        return out, softmax_lse, s_dmask

    @staticmethod
    def backward(ctx, dout, _dlse, _ds_dmask):
        if dout is None:  # as FlashAttnFunc.backward
            return (None,) * 16
        (q, k, v, out, softmax_lse, softmax_stats, cu_seqlens_q, cu_seqlens_k,
         rng_state) = ctx.saved_tensors
        with torch.no_grad():
            dq, dk, dv = torch.ops.flashattn_cu.bwd_varlen(
                dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, ctx.max_seqlen_q,
                ctx.max_seqlen_k, ctx.softmax_scale, ctx.causal, ctx.deterministic, softmax_stats,
                *ctx.window, ctx.alibi_slopes, ctx.softcap, ctx.dropout_p,
                rng_state if ctx.dropout_p > 0 else None,
            )
        dq, dk, dv = _no_double_backward((dq, dk, dv), (dout, q, k, v))
        return (dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None,
                None, None)
