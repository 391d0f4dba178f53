"""Randomized cross-feature checks of the training API: each case draws one call of
flash_attn_func, flash_attn_varlen_func or a packed form, with its features combined at random
(GQA / MQA, causal, windows of every kind, softcap, ALiBi, dropout, the softmax scale, head dims
that run zero-padded, odd and block-edge lengths, varlen entries of length 0 and 1 and rows past
the last entry, non-contiguous inputs, deterministic, inference calls that take the split-KV
route, either kernel path for the forward and for the backward), and checks the output, the LSE
and the gradients against the fp32 reference by the rule (forward 2x, gradients 3x the input
dtype's own error; outputs poisoned by conftest, so an element never written fails).

The fixed grids of the other tests cover each feature and the combinations issue 8 item 7 names;
this file looks for the interactions nobody listed. A case is a seed: its configuration comes
from random.Random(seed) and is printed in every assertion, so a failure reproduces by seed.
FLASHATTN_CU_FUZZ_CASES (default 48) sets how many cases run, FLASHATTN_CU_FUZZ_SEED (default
0) the first seed: `FLASHATTN_CU_FUZZ_CASES=3000 FLASHATTN_CU_FUZZ_SEED=1000 python3 -m pytest
tests/test_fuzz_attention.py -q` explores new ones.
"""

import os
import random

import pytest
import torch

from attn_helpers import (assert_lse_rule, assert_rule, cu_seqlens, draw_alibi, fa_grads,
                          farther_each, instance_for, kernel_paths, tanh_approx_ref)
from flashattn_cu import (_C, flash_attn_func, flash_attn_kvpacked_func,
                          flash_attn_qkvpacked_func, flash_attn_varlen_func,
                          flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func)
from flashattn_cu.testing import attention_ref, dropout_mask_from_s_dmask, kernel_path

CASES = int(os.environ.get("FLASHATTN_CU_FUZZ_CASES", "48"))
FIRST_SEED = int(os.environ.get("FLASHATTN_CU_FUZZ_SEED", "0"))

APIS = ["func", "func", "func", "varlen", "varlen", "varlen", "kvpacked", "qkvpacked",
        "varlen_kvpacked", "varlen_qkvpacked"]
# Lengths at the kernels' block edges (64, 128, 176, 192 rows or keys a tile).
EDGES = [63, 64, 65, 127, 128, 129, 175, 176, 177, 191, 192, 193, 255, 256, 257]


def _length(rng, low=1, cap=1100):
    r = rng.random()
    if r < 0.15:
        n = rng.randint(low, 3)
    elif r < 0.35:
        n = rng.choice(EDGES)
    elif r < 0.92:
        n = rng.randint(max(low, 1), 300)
    else:
        n = rng.randint(300, 1100)
    return min(n, cap)


def _window_side(rng, bound):
    return rng.choice([-1, -1, 0, 1, rng.randint(2, 40), rng.randint(40, 400), bound - 1, bound,
                       bound + rng.randint(1, 50), 10 ** 6])


def _head_dim(rng):
    built = set(_C.built_head_dims())
    dims = [d for d in list(range(8, 257, 8)) + [3, 40, 59, 80, 111, 200, 250]
            if instance_for(d) in built]
    return rng.choice(dims)


def attention_case(rng):
    """One call's configuration (plain Python values, printable)."""
    api = rng.choice(APIS)
    c = {"api": api, "dtype": rng.choice(["float16", "bfloat16"]), "head_dim": _head_dim(rng)}
    c["dropout_p"] = rng.choice([0.1, 0.3, 0.5]) if rng.random() < 0.2 else 0.0
    # Dropout's baseline (fa_grads with its keep mask and the S_dmask decoding) holds more
    # (batch, nheads, seqlen_q, seqlen_k) float64 tensors: shorter rows there.
    cap = 400 if c["dropout_p"] > 0 else 1100
    nheads_k = rng.choice([1, 1, 2, 3])
    group = rng.choice([1, 1, 2, 3, 4, 8])
    if api.endswith("qkvpacked"):
        group = 1
    c["nheads"], c["nheads_k"] = nheads_k * group, nheads_k
    batch = rng.randint(1, 3)
    if api.startswith("varlen"):
        batch = rng.randint(1, 6)
        lq = [_length(rng, 0, cap) if rng.random() < 0.8 else rng.choice([0, 1])
              for _ in range(batch)]
        lk = list(lq) if api == "varlen_qkvpacked" or rng.random() < 0.3 else \
            [_length(rng, 0, cap) if rng.random() < 0.8 else rng.choice([0, 1]) for _ in lq]
        if sum(lq) + sum(lk) > 4000:  # keep a case small
            lq, lk = [min(n, 300) for n in lq], [min(n, 300) for n in lk]
        if api == "varlen_qkvpacked":
            lk = list(lq)
        c["lengths_q"], c["lengths_k"] = lq, lk
        extra = rng.randint(1, 200) if rng.random() < 0.3 else 0
        c["max_seqlen_q"] = max(lq) + extra
        c["max_seqlen_k"] = max(lk) + (extra if api == "varlen_qkvpacked" else
                                       rng.randint(1, 200) if rng.random() < 0.3 else 0)
        if api == "varlen_qkvpacked":
            c["max_seqlen_k"] = c["max_seqlen_q"]
        # Rows past the last entry (a buffer padded to a fixed size).
        c["spare_q"] = rng.choice([0, 0, 0, rng.randint(1, 70)])
        c["spare_k"] = c["spare_q"] if api == "varlen_qkvpacked" else \
            rng.choice([0, 0, 0, rng.randint(1, 70)])
        bound = c["max_seqlen_k"]
    else:
        sq = _length(rng, 1, cap)
        sk = sq if api == "qkvpacked" or rng.random() < 0.25 else _length(rng, 1, cap)
        c["batch"], c["seqlen_q"], c["seqlen_k"] = batch, sq, sk
        c["layout"] = rng.choice(["contiguous", "contiguous", "transposed", "strided"])
        bound = sk
    c["batch_size"] = batch
    c["causal"] = rng.random() < 0.4
    c["window"] = ((_window_side(rng, bound), _window_side(rng, bound)) if rng.random() < 0.4
                   else (-1, -1))
    c["softcap"] = round(rng.uniform(1.0, 50.0), 3) if rng.random() < 0.25 else 0.0
    c["alibi"] = rng.choice([None, None, None, "heads", "batch_heads"])
    c["softmax_scale"] = None if rng.random() < 0.6 else round(rng.uniform(0.3, 1.6) *
                                                              c["head_dim"] ** -0.5, 5)
    c["magnitude"] = rng.choice([1.0, 1.0, 1.0, 0.25, 2.0])
    c["key_offset"] = rng.random() < 0.2  # one vector added to every key: a per-row shift
    c["deterministic"] = rng.random() < 0.3
    # Inference calls (no autograd; padded calls with few query rows per kv head take the
    # split-KV route) unless dropout, which only training uses.
    c["grad"] = c["dropout_p"] > 0 or rng.random() < 0.75
    c["return_attn_probs"] = c["dropout_p"] > 0 or rng.random() < 0.6
    paths = kernel_paths()
    c["fwd_path"], c["bwd_path"] = rng.choice(paths), rng.choice(paths)
    return c


def _rand(gen, shape, dtype, magnitude):
    return (torch.randn(*shape, generator=gen, device="cuda") * magnitude).to(dtype)


def _as_layout(t, layout):
    """t (batch, seqlen, heads, d) as a new leaf with the strides a caller's view would have:
    contiguous, transposed (dense (batch, heads, seqlen, d) storage) or strided (a slice of a
    packed (batch, seqlen, 3, heads, d) projection)."""
    if layout == "transposed":
        t = t.transpose(1, 2).contiguous().transpose(1, 2)
    elif layout == "strided":
        packed = torch.empty(t.shape[0], t.shape[1], 3, *t.shape[2:], device=t.device,
                             dtype=t.dtype)
        packed[:, :, 1] = t
        t = packed[:, :, 1]
    return t.detach().requires_grad_()


def _ref_kw(c, alibi, b=None):
    slopes = alibi
    if alibi is not None and b is not None:  # one varlen entry: its batch row, as (1, nheads)
        slopes = alibi[b:b + 1] if alibi.dim() == 2 else alibi
    return dict(causal=c["causal"], softmax_scale=c["softmax_scale"], window_size=c["window"],
                softcap=c["softcap"], alibi_slopes=slopes)


def check_against_reference(q, k, v, out, lse, dout, grads, mask, c, alibi, what,
                            window_seqlen_k, b=None):
    """out (and lse, grads where given) of one batch (q, k, v (batch, s, h, d) leaves of this
    entry or call) against the fp32 reference by the rule."""
    kw = _ref_kw(c, alibi, b)
    p = c["dropout_p"]
    drop = dict(dropout_p=p, dropout_mask=mask) if p > 0 else {}
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    qp, kp, vp = (t.detach().requires_grad_() for t in (q, k, v))
    ref, ref_lse = attention_ref(q32, k32, v32, window_seqlen_k=window_seqlen_k, **kw, **drop)
    pt, pt_lse = attention_ref(qp, kp, vp, upcast=False, window_seqlen_k=window_seqlen_k, **kw,
                               **drop)
    pt_out = pt
    approx = None
    if c["softcap"] > 0:  # the kernels' tanh.approx: the second baseline (attn_helpers)
        qa, ka, va = (t.detach().float().requires_grad_() for t in (q, k, v))
        approx = (qa, ka, va), tanh_approx_ref(qa, ka, va, window_seqlen_k=window_seqlen_k,
                                               **kw, **drop)
        pt, pt_lse = (farther_each(a, b, r) for a, b, r in
                      zip((pt, pt_lse), approx[1], (ref, ref_lse)))
    assert_rule(out, ref, pt, 2, 1e-5, f"{what}: out")
    if lse is not None:
        assert_lse_rule(lse, ref_lse, pt_lse, f"{what}: lse")
    if grads is None or q.shape[1] == 0 or k.shape[1] == 0:
        if grads is not None:  # nothing to attend to, or nobody attending: zero gradients
            for name, g in zip(("dq", "dk", "dv"), grads):
                assert (g == 0).all(), f"{what}: {name} not 0"
        return
    refs = torch.autograd.grad(ref, (q32, k32, v32), dout.float())
    pts = torch.autograd.grad(pt_out, (qp, kp, vp), dout)
    # D = rowsum(dO * O) from the output as written, as every FlashAttention backward forms it:
    # its rounding is the gradients' error where a row's D nearly cancels dP (near one-hot rows
    # at magnitude 2, dropout's scaled O), which pt's autograd through the softmax does not have.
    # And in fp32 (the kernels' accumulation): a row of one key's dP - D residual (fa_grads).
    for precision in (torch.float64, torch.float32):
        fas = fa_grads(q, k, v, out, dout, kw, mask, p, window_seqlen_k, dtype=precision)
        pts = [farther_each(a, f, r) for a, f, r in zip(pts, fas, refs)]
    if approx is not None:
        aps = torch.autograd.grad(approx[1][0], approx[0], dout.float())
        pts = [farther_each(a, f, r) for a, f, r in zip(pts, aps, refs)]
    for name, g, r, base in zip(("dq", "dk", "dv"), grads, refs, pts):
        assert_rule(g, r, base, 3, 1e-4, f"{what}: {name}")


def _run(c, call, leaves, unpack, dout):
    """The case's call on its forward path (autograd on or off), then, with autograd, the
    gradients on its backward path (twice, bitwise equal, when deterministic): (out, lse,
    S_dmask, (dq, dk, dv) or None); unpack turns the leaves' gradients into dq, dk, dv."""
    with torch.set_grad_enabled(c["grad"]), kernel_path(c["fwd_path"]):
        res = call()
    out, lse, s_dmask = res if c["return_attn_probs"] else (res, None, None)
    grads = None
    if c["grad"]:
        with kernel_path(c["bwd_path"]):
            grads = unpack(torch.autograd.grad(out, leaves, dout, retain_graph=True))
            if c["deterministic"]:
                again = unpack(torch.autograd.grad(out, leaves, dout))
                for name, g, g2 in zip(("dq", "dk", "dv"), grads, again):
                    assert torch.equal(g, g2), f"deterministic {name} differs between two calls"
    return out, lse, s_dmask, grads


def _padded_case(c, gen):
    dtype = getattr(torch, c["dtype"])
    b, sq, sk, h, hk, d = (c["batch"], c["seqlen_q"], c["seqlen_k"], c["nheads"], c["nheads_k"],
                           c["head_dim"])
    m = c["magnitude"]
    q, k, v = (_rand(gen, s, dtype, m) for s in ((b, sq, h, d), (b, sk, hk, d), (b, sk, hk, d)))
    if c["key_offset"]:
        k = (k.float() + _rand(gen, (1, 1, hk, d), torch.float32, 1.5)).to(dtype)
    alibi = draw_alibi(c["alibi"], c["nheads"], c["batch_size"], gen)
    dout = _rand(gen, (b, sq, h, d), dtype, 1.0)
    args = dict(dropout_p=c["dropout_p"], softmax_scale=c["softmax_scale"], causal=c["causal"],
                window_size=c["window"], softcap=c["softcap"], alibi_slopes=alibi,
                deterministic=c["deterministic"], return_attn_probs=c["return_attn_probs"])
    if c["api"] == "qkvpacked":
        leaf = torch.stack((q, k, v), dim=2).requires_grad_()
        call = lambda: flash_attn_qkvpacked_func(leaf, **args)  # noqa: E731
        unpack = lambda g: g[0].unbind(2)  # noqa: E731
        leaves = (leaf,)
    elif c["api"] == "kvpacked":
        ql, kv = _as_layout(q, c["layout"]), torch.stack((k, v), dim=2).requires_grad_()
        call = lambda: flash_attn_kvpacked_func(ql, kv, **args)  # noqa: E731
        unpack = lambda g: (g[0], *g[1].unbind(2))  # noqa: E731
        leaves = (ql, kv)
    else:
        ql, kl, vl = (_as_layout(t, c["layout"]) for t in (q, k, v))
        call = lambda: flash_attn_func(ql, kl, vl, **args)  # noqa: E731
        unpack = lambda g: g  # noqa: E731
        leaves = (ql, kl, vl)
    out, lse, s_dmask, grads = _run(c, call, leaves, unpack, dout)
    assert out.shape == (b, sq, h, d) and out.dtype == dtype, f"out {tuple(out.shape)}"
    if lse is not None:
        assert lse.shape == (b, h, sq) and lse.dtype == torch.float32, f"lse {tuple(lse.shape)}"
    mask = None
    if c["dropout_p"] > 0:
        assert s_dmask is not None and not torch.isnan(s_dmask).any(), "S_dmask not written"
        mask = dropout_mask_from_s_dmask(s_dmask, sq, sk)
    else:
        assert s_dmask is None, "S_dmask without dropout"
    check_against_reference(q, k, v, out, lse, dout, grads, mask, c, alibi, "call", sk)


def _varlen_case(c, gen):
    dtype = getattr(torch, c["dtype"])
    lq, lk, h, hk, d = c["lengths_q"], c["lengths_k"], c["nheads"], c["nheads_k"], c["head_dim"]
    tq, tk = sum(lq) + c["spare_q"], sum(lk) + c["spare_k"]
    m = c["magnitude"]
    q, k, v = (_rand(gen, s, dtype, m) for s in ((tq, h, d), (tk, hk, d), (tk, hk, d)))
    if c["key_offset"]:
        k = (k.float() + _rand(gen, (1, hk, d), torch.float32, 1.5)).to(dtype)
    alibi = draw_alibi(c["alibi"], c["nheads"], c["batch_size"], gen)
    dout = _rand(gen, (tq, h, d), dtype, 1.0)
    cu_q, cu_k = cu_seqlens(lq, "cuda"), cu_seqlens(lk, "cuda")
    mq, mk = c["max_seqlen_q"], c["max_seqlen_k"]
    args = dict(dropout_p=c["dropout_p"], softmax_scale=c["softmax_scale"], causal=c["causal"],
                window_size=c["window"], softcap=c["softcap"], alibi_slopes=alibi,
                deterministic=c["deterministic"], return_attn_probs=c["return_attn_probs"])
    if c["api"] == "varlen_qkvpacked":
        leaf = torch.stack((q, k, v), dim=1).requires_grad_()
        call = lambda: flash_attn_varlen_qkvpacked_func(leaf, cu_q, mq, **args)  # noqa: E731
        unpack = lambda g: g[0].unbind(1)  # noqa: E731
        leaves = (leaf,)
    elif c["api"] == "varlen_kvpacked":
        ql, kv = q.clone().requires_grad_(), torch.stack((k, v), dim=1).requires_grad_()
        call = lambda: flash_attn_varlen_kvpacked_func(ql, kv, cu_q, cu_k, mq, mk,  # noqa: E731
                                                       **args)
        unpack = lambda g: (g[0], *g[1].unbind(1))  # noqa: E731
        leaves = (ql, kv)
    else:
        leaves = tuple(t.clone().requires_grad_() for t in (q, k, v))
        call = lambda: flash_attn_varlen_func(*leaves, cu_q, cu_k, mq, mk, **args)  # noqa: E731
        unpack = lambda g: g  # noqa: E731
    out, lse, s_dmask, grads = _run(c, call, leaves, unpack, dout)
    assert out.shape == (tq, h, d) and out.dtype == dtype, f"out {tuple(out.shape)}"
    if lse is not None:
        assert lse.shape == (h, tq) and lse.dtype == torch.float32, f"lse {tuple(lse.shape)}"
    if c["dropout_p"] > 0:
        assert s_dmask is not None and s_dmask.shape[:2] == (len(lq), h), "S_dmask shape"
        assert not torch.isnan(s_dmask).any(), "S_dmask not written"
    # Rows past the last entry are outputs of no entry: 0 (lse +inf), zero gradients.
    assert (out[sum(lq):] == 0).all(), "out rows past the last entry"
    if lse is not None:
        assert (lse[:, sum(lq):] == float("inf")).all(), "lse rows past the last entry"
    if grads is not None:
        assert (grads[0][sum(lq):] == 0).all(), "dq rows past the last entry"
        assert (grads[1][sum(lk):] == 0).all() and (grads[2][sum(lk):] == 0).all(), \
            "dk / dv rows past the last entry"
    sq0, sk0 = 0, 0
    for b, (nq, nk) in enumerate(zip(lq, lk)):
        rq, rk = slice(sq0, sq0 + nq), slice(sk0, sk0 + nk)
        mask = None
        if c["dropout_p"] > 0:
            mask = dropout_mask_from_s_dmask(s_dmask[b:b + 1], nq, nk)
        entry_grads = None if grads is None else (
            grads[0][rq][None], grads[1][rk][None], grads[2][rk][None])
        check_against_reference(
            q[rq][None], k[rk][None], v[rk][None], out[rq][None],
            None if lse is None else lse[:, rq][None], dout[rq][None], entry_grads, mask, c,
            alibi, f"entry {b} ({nq} x {nk})", mk, b=b)
        sq0, sk0 = sq0 + nq, sk0 + nk


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + CASES))
def test_random_call_against_reference(seed):
    rng = random.Random(seed)
    c = attention_case(rng)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    try:
        if c["api"].startswith("varlen"):
            _varlen_case(c, gen)
        else:
            _padded_case(c, gen)
    except AssertionError as e:
        raise AssertionError(f"seed {seed}, case {c}: {e}") from None


# The sm90 forward's compact varlen tiles on the kernel instances of their own (fwd_work.h
# fwd_compact_in_walk false: d 256's variants with sequence arrays, d 128's ALiBi on the 128 x 176
# tile): name -> (head dim, the case's changes).
COMPACT_ONLY = {
    "d256": (256, {}),
    "d256-softcap": (256, {"softcap": 20.0}),
    "d256-alibi": (256, {"alibi": "heads"}),
    "d256-alibi-softcap": (256, {"alibi": "batch", "softcap": 7.5}),
    "d256-dropout": (256, {"dropout_p": 0.2}),
    "d128-alibi": (128, {"alibi": "batch"}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(COMPACT_ONLY))
def test_skewed_pack_on_each_compact_kernel(name):
    """A skewed pack (31 entries: 0-200 tokens, one of 400, keys apart for half of them, rows
    past the last entry), causal GQA, on each forward instance that decodes compact tiles in a
    kernel of its own, each entry against its reference by the rule (the fuzz cases' checks)."""
    d, changes = COMPACT_ONLY[name]
    if instance_for(d) not in _C.built_head_dims():
        pytest.skip(f"head dim {d} not in this build")
    rng = random.Random(name)
    lq = [rng.randint(0, 200) for _ in range(30)] + [400]
    rng.shuffle(lq)
    lk = [n if rng.random() < 0.5 else rng.randint(0, 200) for n in lq]
    c = {"api": "varlen", "dtype": "bfloat16", "head_dim": d, "dropout_p": 0.0, "nheads": 4,
         "nheads_k": 2, "lengths_q": lq, "lengths_k": lk, "max_seqlen_q": max(lq),
         "max_seqlen_k": max(lk), "spare_q": 19, "spare_k": 7, "batch_size": len(lq),
         "causal": True, "window": (-1, -1), "softcap": 0.0, "alibi": None,
         "softmax_scale": None, "magnitude": 1.0, "key_offset": False, "deterministic": False,
         "grad": True, "return_attn_probs": True, "fwd_path": "auto", "bwd_path": "auto"}
    c.update(changes)
    try:
        _varlen_case(c, torch.Generator(device="cuda").manual_seed(len(name)))
    except AssertionError as e:
        raise AssertionError(f"{name}, case {c}: {e}") from None


def test_case_generator_is_reproducible_and_covers_the_features():
    """CPU: the configurations are a function of the seed, and over the default seeds every
    API, both dtypes and each feature appear (a generator change that loses one fails here)."""
    cases = [attention_case(random.Random(s)) for s in range(200)]
    assert cases == [attention_case(random.Random(s)) for s in range(200)]
    first = cases[:max(CASES, 48)]
    seen = {c["api"] for c in first}
    assert seen == set(APIS), f"APIs drawn: {seen}"
    for feature, present in {
        "causal": lambda c: c["causal"],
        "window": lambda c: c["window"] != (-1, -1),
        "softcap": lambda c: c["softcap"] > 0,
        "alibi": lambda c: c["alibi"] is not None,
        "dropout": lambda c: c["dropout_p"] > 0,
        "gqa": lambda c: c["nheads"] != c["nheads_k"],
        "inference": lambda c: not c["grad"],
        "deterministic": lambda c: c["deterministic"],
        "padded head dim": lambda c: c["head_dim"] % 8 != 0 or c["head_dim"] not in
        _C.head_dim_instances(),
        "empty entry": lambda c: 0 in c.get("lengths_q", []) + c.get("lengths_k", []),
        "rows past the last entry": lambda c: c.get("spare_q", 0) > 0,
        "combined": lambda c: sum((c["causal"] or c["window"] != (-1, -1), c["softcap"] > 0,
                                   c["alibi"] is not None, c["dropout_p"] > 0)) >= 2,
    }.items():
        assert any(present(c) for c in first), f"no case with {feature} in the first {len(first)}"
    assert {c["dtype"] for c in first} == {"float16", "bfloat16"}


def test_tanh_approx_baseline_compiles_to_the_kernels_instruction():
    """CPU: the softcap baseline's tanh (attn_helpers.tanh_approx_ref on the GPU) is
    tanh.approx.f32, the instruction ptx/math.h gives the kernels: its triton kernel compiled
    for sm_90 holds it (the GPU run checks its values against torch.tanh)."""
    triton = pytest.importorskip("triton")
    import attn_helpers
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        src = ASTSource(fn=attn_helpers._tanh_approx_kernel,
                        signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32",
                                   "BLOCK": "constexpr"}, constexprs={"BLOCK": 1024})
    except (ImportError, TypeError) as e:  # another triton's compile API
        pytest.skip(f"triton {triton.__version__}: {e}")
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    assert "tanh.approx.f32" in ptx
