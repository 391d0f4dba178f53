"""Sliding-window attention (flash_attn's window_size): forward and backward against the fp32
reference by the rule, over windows, causal, seqlen pairs, MHA/GQA, dtypes and head dims, padded
and varlen; rows that see no key; and the block-skipping that makes its cost scale with the
window (tested on the host in tests/cpp/api_checks.cpp, measured in the benchmark)."""

import pytest
import torch

from attn_helpers import (HEADS, assert_lse_rule, assert_rule, cu_seqlens, instance_for,
                          kernel_names, make_qkv, sm90_built, sm90_fwd_instance)
from flashattn_cu import _C, flash_attn_func, flash_attn_varlen_func
from flashattn_cu.testing import attention_ref, kernel_path

WINDOWS = [(0, 0), (16, 0), (7, 9), (-1, 33), (64, -1), (1000, 1000)]
SEQLENS = [(1, 239), (113, 203), (512, 256), (799, 3)]
# dtype and head dim paired (fp16 with 64, bf16 with 128): every kernel instance kind is reached
# while the GPU suite stays within its time budget.
DTYPE_DIMS = [(torch.float16, 64), (torch.bfloat16, 128)]


def skip_unless_built(head_dim):
    if instance_for(head_dim) not in _C.built_head_dims():
        pytest.skip(f"head dim {head_dim} not in this build")


@pytest.mark.gpu
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlens", SEQLENS)
@pytest.mark.parametrize("heads", ["mha", "gqa"])
@pytest.mark.parametrize("dtype, d", DTYPE_DIMS, ids=["fp16-d64", "bf16-d128"])
def test_window_against_reference(window, causal, seqlens, heads, dtype, d):
    skip_unless_built(d)
    sq, sk = seqlens
    nheads, nheads_k = HEADS[heads]
    q, k, v = make_qkv(2, sq, sk, nheads, nheads_k, d, dtype, requires_grad=True)
    dout = torch.randn_like(q)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window,
                                  return_attn_probs=True)
    # The window as flash_attn_func normalizes it against seqlen_k (flash_attn's rules: sides
    # >= sk unbounded, ...): (-1, 33) and (7, 9) at sq 799 / sk 3 are full attention.
    ref, ref_lse = attention_ref(q, k, v, causal=causal, window_size=window, window_seqlen_k=sk)
    pt, pt_lse = attention_ref(q, k, v, causal=causal, window_size=window, upcast=False,
                               window_seqlen_k=sk)
    assert_rule(out, ref, pt, 2, 1e-5, "out")
    assert_lse_rule(lse, ref_lse, pt_lse)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    refs = torch.autograd.grad(ref, (q, k, v), dout.float())
    pts = torch.autograd.grad(pt, (q, k, v), dout)
    for name, g, r, p in zip(("dq", "dk", "dv"), grads, refs, pts):
        assert_rule(g, r, p, 3, 1e-4, name)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
def test_window_deterministic_and_sm80_path(deterministic):
    """The deterministic dQ kernel and the sm80 path walk the window too."""
    skip_unless_built(128)
    q, k, v = make_qkv(2, 700, 900, 6, 2, 128, torch.bfloat16, requires_grad=True)
    dout = torch.randn_like(q)
    window = (200, 10)
    ref, _ = attention_ref(q, k, v, window_size=window)
    pt, _ = attention_ref(q, k, v, window_size=window, upcast=False)
    refs = torch.autograd.grad(ref, (q, k, v), dout.float())
    pts = torch.autograd.grad(pt, (q, k, v), dout)
    for path in ("auto", "sm80"):
        with kernel_path(path):
            out = flash_attn_func(q, k, v, window_size=window, deterministic=deterministic)
            grads = torch.autograd.grad(out, (q, k, v), dout)
        assert_rule(out, ref, pt, 2, 1e-5, f"out ({path})")
        for name, g, r, p in zip(("dq", "dk", "dv"), grads, refs, pts):
            assert_rule(g, r, p, 3, 1e-4, f"{name} ({path})")


@pytest.mark.gpu
def test_window_varlen():
    skip_unless_built(64)
    lens = [300, 0, 1, 77, 129]
    cu = cu_seqlens(lens)
    q = torch.randn(sum(lens), 4, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    k = torch.randn_like(q, requires_grad=True)
    v = torch.randn_like(q, requires_grad=True)
    window = (32, 0)
    out = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), window_size=window)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    start = 0
    for n in lens:
        sl = slice(start, start + n)
        qb, kb, vb = (t.detach()[sl].unsqueeze(0).requires_grad_() for t in (q, k, v))
        ref, _ = attention_ref(qb, kb, vb, window_size=window)
        pt, _ = attention_ref(qb, kb, vb, window_size=window, upcast=False)
        assert_rule(out[sl].unsqueeze(0), ref, pt, 2, 1e-5, f"out, length {n}")
        if n > 0:
            r = torch.autograd.grad(ref, (qb, kb, vb), torch.ones_like(ref))
            qp, kp, vp = (t.detach().requires_grad_() for t in (qb, kb, vb))
            ptr, _ = attention_ref(qp, kp, vp, window_size=window, upcast=False)
            p = torch.autograd.grad(ptr, (qp, kp, vp), torch.ones_like(ptr))
            for name, g, rr, pp in zip(("dq", "dk", "dv"), (dq[sl], dk[sl], dv[sl]), r, p):
                assert_rule(g.unsqueeze(0), rr, pp, 3, 1e-4, f"{name}, length {n}")
        start += n


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(3, 1500, 1500, 16, 16), (1, 4100, 5000, 8, 2)],
                         ids=["equal-1500", "sq4100-sk5000-gqa"])
@pytest.mark.parametrize("window", [(300, 0), (700, 5)])
@pytest.mark.parametrize("dtype, d", DTYPE_DIMS, ids=["fp16-d64", "bf16-d128"])
def test_window_causal_persistent_grid(shape, window, dtype, d):
    """Causal windows whose rows see at most 4096 keys run on the sm90 forward's persistent grid
    (more tiles than SMs; sm90/fwd_launch.h causal_persistent), whatever seqlen_k."""
    skip_unless_built(d)
    batch, sq, sk, nheads, nheads_k = shape
    q, k, v = make_qkv(batch, sq, sk, nheads, nheads_k, d, dtype)
    for path in ("auto", "sm80"):
        with kernel_path(path):
            out, lse, _ = flash_attn_func(q, k, v, causal=True, window_size=window,
                                          return_attn_probs=True)
        ref, ref_lse = attention_ref(q, k, v, causal=True, window_size=window)
        pt, pt_lse = attention_ref(q, k, v, causal=True, window_size=window, upcast=False)
        assert_rule(out, ref, pt, 2, 1e-5, f"out ({path})")
        assert_lse_rule(lse, ref_lse, pt_lse)


def test_sm90_fwd_instance_reads_both_name_forms():
    """attn_helpers.sm90_fwd_instance reads FwdTraits' arguments by position, so template
    arguments added to or taken from FwdTraits (kSkipKept and kSumsWgmma after kLazyRescale, where
    kLazySums was; kTailInExp, then kTwoP and kPairKV last) cannot shift what it reports
    unnoticed: the demangled and the mangled name of one kernel give the same instance (names as
    cuobjdump and torch's profiler show them, all 29 arguments, here with kBlockM 128,
    kLazyRescale 8, kSkipKept clear, kSumsWgmma set, kTailInExp at level 2, kTwoP 0 and kPairKV
    clear), and a name short of kTailInExp (the 26 of FwdTraits before it) raises."""
    traits = ["128", "128", "176", "2", "true", "0", "0", "true", "false", "0", "true", "false",
              "false", "true", "true", "false", "false", "false", "false", "false", "false",
              "false", "false", "8", "false", "true", "2", "0", "false"]
    demangled = ("void flashattn_cu::sm90::fwd_kernel<__nv_bfloat16, flashattn_cu::sm90::"
                 f"FwdTraits<{', '.join(traits)}>, 9, false>(flashattn_cu::sm90::FwdTmaParams)")
    code = "".join(f"Lb{int(a == 'true')}E" if a in ("true", "false") else f"Li{a}E"
                   for a in traits)
    mangled = ("_ZN12flashattn_cu4sm9010fwd_kernelI13__nv_bfloat16NS0_9FwdTraitsI"
               f"{code}EELi9ELb0EEEvNS0_12FwdTmaParamsE")
    # variant, kLazyRescale, kSkipKept, kSumsWgmma, kTailInExp's level, kBlockM
    expect = (9, 8, False, True, 2, 128)
    assert tuple(sm90_fwd_instance(demangled)) == expect
    assert tuple(sm90_fwd_instance(mangled)) == expect
    assert sm90_fwd_instance("void flashattn_cu::sm80::fwd_kernel<...>()") is None
    short = traits[:26]
    with pytest.raises(AssertionError, match="no template arguments"):
        sm90_fwd_instance(demangled.replace(", ".join(traits), ", ".join(short)))
    short_code = "".join(f"Lb{int(a == 'true')}E" if a in ("true", "false") else f"Li{a}E"
                         for a in short)
    with pytest.raises(AssertionError, match="no template arguments"):
        sm90_fwd_instance(mangled.replace(code, short_code))


@pytest.mark.gpu
def test_padded_window_instance_is_the_one_that_runs():
    """On Hopper a window alone on a padded call runs the forward's padded window instance
    (problem/mask.h kPaddedWindowVariant, 8) at the head dims tiles.h fwd_padded_window_sm90
    gives it (64, 128); a varlen window call, a window with softcap and d = 256 keep the dynamic
    variants (1; softcap 3). The window tests above check its results."""
    if not sm90_built():
        pytest.skip("needs an sm_90 GPU and sm_90a code")

    def variant(fn):
        found = [i for i in map(sm90_fwd_instance, kernel_names(fn)) if i is not None]
        assert len(found) == 1, found
        return found[0].variant

    for d, dtype in ((64, torch.float16), (128, torch.bfloat16), (256, torch.bfloat16)):
        if instance_for(d) not in _C.built_head_dims():
            continue
        q, k, v = make_qkv(2, 300, 300, 4, 2, d, dtype)
        expect = 8 if d in (64, 128) else 1
        assert variant(lambda: flash_attn_func(q, k, v, causal=True, window_size=(64, 0))) == expect
        assert variant(lambda: flash_attn_func(q, k, v, window_size=(32, 16))) == expect
        assert variant(lambda: flash_attn_func(q, k, v, causal=True, window_size=(64, 0),
                                               softcap=20.0)) == 3
        cu = torch.tensor([0, 100, 300], device="cuda", dtype=torch.int32)
        qv, kv, vv = (t.reshape(-1, *t.shape[2:])[:300] for t in (q, k, v))
        assert variant(lambda: flash_attn_varlen_func(qv, kv, vv, cu, cu, 200, 200, causal=True,
                                                      window_size=(64, 0))) == 1


@pytest.mark.gpu
def test_measured_knobs_reach_their_instances():
    """tiles.h's rules for three FwdTraits knobs, kept by time (benchmarks/NOTES.md 12.95,
    12.97), reach the instances they were measured on and no other: kSkipKept (outputs bitwise
    the running max's) on d = 256's static ALiBi instance (problem/mask.h kStaticAlibiVariant,
    9: a padded ALiBi call past the short-row rule), not on plain d = 256 or d = 128 ALiBi; kSumsWgmma on
    d = 128's dynamic softcap instance (3: softcap with a window), not on its static one (7);
    kTailInExp at level 1 on the tiles of 128 query rows (two consumers), not on d = 64's
    192-row tile.
    Their results are the ALiBi, softcap, window and forward tests'."""
    if not sm90_built():
        pytest.skip("needs an sm_90 GPU and sm_90a code")

    def instance(fn):
        found = [i for i in map(sm90_fwd_instance, kernel_names(fn)) if i is not None]
        assert len(found) == 1, found
        return found[0]

    def slopes(h):
        return torch.rand(h, device="cuda", dtype=torch.float32)

    for d, skip in ((256, True), (128, False)):
        if instance_for(d) not in _C.built_head_dims():
            continue
        q, k, v = make_qkv(1, 2317, 2317, 4, 4, d, torch.bfloat16)
        alibi = instance(lambda: flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes(4)))
        assert (alibi.variant, alibi.skip) == (9, skip), (d, alibi)
        assert not instance(lambda: flash_attn_func(q, k, v, causal=True)).skip, d
    if instance_for(128) in _C.built_head_dims():
        q, k, v = make_qkv(1, 2317, 2317, 4, 4, 128, torch.bfloat16)
        dyn = instance(lambda: flash_attn_func(q, k, v, softcap=30.0, window_size=(512, 0)))
        assert (dyn.variant, dyn.sums_wgmma) == (3, True), dyn
        static = instance(lambda: flash_attn_func(q, k, v, softcap=30.0))
        assert (static.variant, static.sums_wgmma) == (7, False), static
    # kTailInExp at level 2 (NOTES 12.97, 12.99) on every two-consumer tile (128 query rows), off
    # on d = 64's three-consumer 192 x 128: both kinds must show up among these calls, or the
    # check is empty.
    seen = set()
    for d in (64, 128, 256):
        if instance_for(d) not in _C.built_head_dims():
            continue
        q, k, v = make_qkv(1, 2317, 2317, 4, 4, d, torch.bfloat16)
        for kwargs in ({}, {"causal": True}, {"window_size": (512, 0)},
                       {"alibi_slopes": slopes(4)}):
            got = instance(lambda: flash_attn_func(q, k, v, **kwargs))
            assert got.tail_in_exp == (2 if got.block_m == 128 else 0), (d, kwargs, got)
            seen.add(got.block_m)
    if instance_for(64) in _C.built_head_dims() and instance_for(128) in _C.built_head_dims():
        assert seen >= {128, 192}, seen
