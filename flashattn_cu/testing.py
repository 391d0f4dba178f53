"""Reference attention and test helpers (used by tests/, benchmarks/ and `python -m flashattn_cu`)."""

import contextlib

import torch

__all__ = ["alibi_bias", "attention_ref", "dropout_mask_from_s_dmask", "poison_outputs",
           "max_abs_diff"]


def attention_ref(q, k, v, causal=False, softmax_scale=None, upcast=True, window_size=(-1, -1),
                  alibi_slopes=None, softcap=0.0, dropout_p=0.0, dropout_mask=None,
                  window_seqlen_k=None, tanh=None):
    """Attention computed with plain PyTorch ops, in the flash_attn layout.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim) with
    nheads % nheads_k == 0 (query head i uses kv head i // (nheads // nheads_k)).
    causal: bottom-right aligned, query i sees keys j <= i + seqlen_k - seqlen_q.
    window_size: (left, right), flash_attn's sliding window: with d = i + seqlen_k - seqlen_q,
    query i sees keys d - left <= j <= d + right; a negative side is unbounded; causal sets
    right = 0.
    window_seqlen_k: the key bound the public functions normalize the window against as
    flash_attn does (the padded call's seqlen_k, a varlen call's max_seqlen_k, a KV cache's
    capacity; _arguments._flash_attn_window): a side >= it is unbounded, (-1, 0) is
    causal, a bounded left with an unbounded right takes right = window_seqlen_k. None: the window
    as given (the kernels' raw semantics).
    alibi_slopes: fp32 (nheads,) or (batch, nheads), flash_attn's ALiBi: with d the diagonal key,
    the scaled score of key j gets + slope * j when causal without a left window, else
    - slope * |d - j|.
    softcap: > 0 caps the scaled scores: softcap * tanh(scores / softcap), before ALiBi and the
    mask (flash_attn's order). tanh: the function the cap uses (default torch.tanh; the tests
    pass the kernels' own approximation for a baseline at their precision).
    dropout_p, dropout_mask: flash_attn's dropout with a given mask, bool (batch, nheads, seqlen_q,
    seqlen_k), True = kept (e.g. recovered from the kernels' S_dmask, dropout_mask_from_s_dmask):
    the probabilities' dropped elements become 0 and the kept ones are scaled by
    1 / (1 - dropout_p) before they multiply v; lse is of the undropped probabilities.
    upcast=True computes in float32 (float64 inputs stay float64) and returns float32 output;
    upcast=False computes in the input dtype (the "pt" baseline of the error rule) and returns
    that dtype. A query row that sees no key gives output 0 and lse +inf.

    Returns (out, lse): out like q; lse (batch, nheads, seqlen_q) float32 (float64 for float64
    inputs).
    """
    if upcast and q.dtype != torch.float64:
        q, k, v = q.float(), k.float(), v.float()
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    if nheads % nheads_k != 0:
        raise ValueError(f"nheads ({nheads}) must be a multiple of nheads_k ({nheads_k})")
    if softmax_scale is None:
        softmax_scale = head_dim ** (-0.5)
    group = nheads // nheads_k
    if group > 1:
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)

    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * softmax_scale
    if softcap > 0:
        scores = (torch.tanh if tanh is None else tanh)(scores / softcap) * softcap
    left, right = window_size
    if window_seqlen_k is not None:  # flash_attn's rules, written out here independently
        left = -1 if left >= window_seqlen_k else left
        right = -1 if right >= window_seqlen_k else right
        causal = causal or (left < 0 and right == 0)
        if left >= 0 and right < 0 and not causal:
            right = window_seqlen_k
    if causal:
        right = 0
    rows = torch.arange(seqlen_q, device=q.device).unsqueeze(1)
    cols = torch.arange(seqlen_k, device=q.device).unsqueeze(0)
    diagonal = rows + (seqlen_k - seqlen_q)
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=q.device)
    if right >= 0:
        visible &= cols <= diagonal + right
    if left >= 0:
        visible &= cols >= diagonal - left
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes, batch, seqlen_q, seqlen_k,
                                     causal and left < 0, scores.dtype)
    scores = scores.masked_fill(~visible, float("-inf"))
    empty_row = ~visible.any(dim=1)  # (seqlen_q,), True where the query sees no key

    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse = torch.logsumexp(scores.to(lse_dtype), dim=-1)
    lse = lse.masked_fill(empty_row, float("inf"))

    probs = torch.softmax(scores, dim=-1)
    probs = probs.masked_fill(empty_row.unsqueeze(1), 0.0)  # softmax of all -inf is NaN
    if dropout_mask is not None:
        probs = probs.masked_fill(~dropout_mask, 0.0) / (1.0 - dropout_p)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v)
    return out, lse


def alibi_bias(alibi_slopes, batch, seqlen_q, seqlen_k, linear, dtype):
    """flash_attn's ALiBi bias, (batch or 1, nheads, seqlen_q, seqlen_k) in dtype, for slopes of
    shape (nheads,) or (batch, nheads): + slope * j where linear (causal without a left window),
    else - slope * |d - j|, d = i + seqlen_k - seqlen_q the diagonal key of query i."""
    device = alibi_slopes.device
    nheads = alibi_slopes.shape[-1]
    slopes = alibi_slopes.to(dtype)
    slopes = (slopes.view(1, nheads, 1, 1) if slopes.dim() == 1
              else slopes.view(batch, nheads, 1, 1))
    rows = torch.arange(seqlen_q, device=device).unsqueeze(1)
    cols = torch.arange(seqlen_k, device=device).unsqueeze(0)
    if linear:
        bias = cols.to(dtype).expand(seqlen_q, seqlen_k)
    else:
        bias = -(rows + (seqlen_k - seqlen_q) - cols).abs().to(dtype)
    return slopes * bias


def dropout_mask_from_s_dmask(s_dmask, seqlen_q, seqlen_k):
    """The keep mask (bool (batch, nheads, seqlen_q, seqlen_k), True = kept) in the kernels'
    S_dmask (flash_attn_func(..., return_attn_probs=True) with dropout): a dropped element is
    negated, its sign bit set even where the probability is 0."""
    return ~torch.signbit(s_dmask[:, :, :seqlen_q, :seqlen_k].float())


def max_abs_diff(a, b):
    """max |a - b| in float32 (0.0 for empty tensors); inf-equal elements count as 0."""
    if a.numel() == 0:
        return 0.0
    a, b = a.float(), b.float()
    same = a == b  # covers matching infinities
    return (a - b).abs().masked_fill(same, 0.0).max().item()


@contextlib.contextmanager
def _set_while_active(get, set_, value):
    """A process-wide setting of the C++ extension (getter, setter) at `value` for the block."""
    previous = get()
    set_(value)
    try:
        yield
    finally:
        set_(previous)


def poison_outputs(enabled=True):
    """While active, the C++ ops fill every output (and the backward workspace) with NaN / 0xFF
    right after allocating it, so elements a kernel fails to write show up in comparisons."""
    from flashattn_cu import _C

    return _set_while_active(_C._poison_outputs, _C._set_poison_outputs, enabled)


def kernel_path(path):
    """While active, the ops use the given kernel family: "auto" (the fastest built for the GPU:
    the sm_90a wgmma backward on H100/H200 where it covers the head dim) or "sm80" (the mma.sync
    kernels everywhere). Process-wide, so tests and benchmarks can compare both on one GPU."""
    from flashattn_cu import _C

    return _set_while_active(_C._kernel_path, _C._set_kernel_path, path)


def fwd_causal_schedule(schedule):
    """While active, the sm90a forward hands out a causal call's tiles as given: "auto" (by head
    dim and keys, as measured fastest), "persistent" (a CTA per SM walking its share of the tiles)
    or "per_tile" (a CTA per tile). Varlen calls and other GPUs are unaffected; the results are
    the same. Process-wide, so tests and benchmarks can run both schedules on one shape."""
    from flashattn_cu import _C

    return _set_while_active(_C._fwd_causal_schedule, _C._set_fwd_causal_schedule, schedule)


def fwd_dynamic_tiles(enabled):
    """While active, the sm90a forward may (True, the default) or may not (False) hand out the
    tiles of a call it would run one CTA per tile through its dynamic scheduler, a CTA per SM
    taking the next tile from a counter: varlen calls (and calls with softcap, ALiBi, dropout or
    seqused_k) on the kernels that take it (head dims up to 128 but the 128 x 176 tile). The
    results are the same. Process-wide, so tests and benchmarks can run both on one call."""
    from flashattn_cu import _C

    return _set_while_active(_C._fwd_dynamic_tiles, _C._set_fwd_dynamic_tiles, enabled)


def fwd_varlen_order(order):
    """While active, the sm90a forward orders a varlen call's tiles within each entry as given:
    "heads" (head after head, each head's query blocks longest first; the default) or "blocks"
    (block after block, every head's longest query block first). The order in which the
    dynamic scheduler (or the hardware) hands out the tiles; the results are the same.
    Process-wide, so tests and benchmarks can run both on one call."""
    from flashattn_cu import _C

    return _set_while_active(_C._fwd_varlen_order, _C._set_fwd_varlen_order, order)


def bwd_streamed_dq(enabled):
    """While active, the sm90a backward converts dQ streamed (True: each block of rows as soon as
    every key tile that adds to it is done, under the main kernel's last tiles) or after the main
    kernel (False, the default until streaming measures faster). Non-deterministic calls on
    padded rows at head dims 64 and 128; the results are the same up to the order of the fp32 dQ
    additions (dK, dV bitwise). Process-wide, so tests and benchmarks can run both on one call."""
    from flashattn_cu import _C

    return _set_while_active(_C._bwd_streamed_dq, _C._set_bwd_streamed_dq, enabled)
