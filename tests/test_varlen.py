"""Variable-length batches: flash_attn_varlen_func and its packed forms.

GPU: every sequence of a random batch (lengths 0, 1, odd, one long) against the fp32 reference
of that sequence alone by the rule (forward 2x, gradients 3x), outputs poisoned first (conftest);
equal lengths bitwise equal to flash_attn_func on the same batch; deterministic mode bitwise
repeatable. CPU: argument checks and shapes on fake tensors.
"""

import math
import random
from unittest import mock

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import attn_helpers
from attn_helpers import DTYPES, HEADS, assert_lse_rule, assert_rule, instance_for
from attn_helpers import cu_seqlens as cu
from flashattn_cu import (
    _C,
    flash_attn_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from flashattn_cu import flash_attn_interface as fai
from flashattn_cu.testing import attention_ref, kernel_path

# Every test on each kernel family the GPU has (attn_helpers.kernel_paths): on an H200 the
# sm90a forward (TMA + wgmma, the head dims of tiles.h's fwd_tile_sm90) and the sm80 one.
@pytest.fixture(autouse=True, params=attn_helpers.kernel_paths())
def path(request):
    with kernel_path(request.param):
        yield request.param


LENGTH_LISTS = {
    "mixed": ([37, 0, 1, 200, 129, 64], [50, 3, 0, 257, 129, 64]),
    "one_long": ([5, 1030, 17], [5, 1030, 17]),
    "all_empty_k": ([7, 9], [0, 0]),
}


def skip_unless_built(head_dim):
    if instance_for(head_dim) not in _C.built_head_dims():
        pytest.skip(f"head dim {head_dim} not in this build")


def varlen_inputs(lq, lk, nheads, nheads_k, d, dtype):
    q = torch.randn(sum(lq), nheads, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(sum(lk), nheads_k, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(sum(lk), nheads_k, d, device="cuda", dtype=dtype, requires_grad=True)
    return q, k, v


def one_ulp(t, dtype):
    """The spacing of `dtype` at the largest magnitude in t (0 for an all-zero t)."""
    m = t.abs().max().item()
    if m == 0 or not math.isfinite(m):
        return 0.0
    return 2.0 ** math.floor(math.log2(m)) * torch.finfo(dtype).eps


def check_sequence(tensors, grads, dout, sq, sk, nq, nk, what, causal):
    """Sequence (rows sq .. sq + nq of q, sk .. sk + nk of k / v) of a varlen call against the
    fp32 reference of that sequence alone by the rule: out and lse (tensors: q, k, v, out, lse),
    and the gradients (grads: dq, dk, dv) for dout; zero gradients where it has no query or no
    key."""
    q, k, v, out, lse = tensors
    dq, dk, dv = grads
    qb, kb, vb = (t.detach()[s:s + n].unsqueeze(0).requires_grad_()
                  for t, s, n in ((q, sq, nq), (k, sk, nk), (v, sk, nk)))
    ref, ref_lse = attention_ref(qb, kb, vb, causal=causal)
    pt, pt_lse = attention_ref(qb, kb, vb, causal=causal, upcast=False)
    assert_rule(out[sq:sq + nq].unsqueeze(0), ref, pt, 2, 1e-5, f"out, {what}")
    assert_lse_rule(lse[:, sq:sq + nq].unsqueeze(0), ref_lse, pt_lse, f"lse, {what}")
    if nq > 0 and nk > 0:
        g = dout[sq:sq + nq].unsqueeze(0)
        refs = torch.autograd.grad(ref, (qb, kb, vb), g.float())
        qp, kp, vp = (t.detach().requires_grad_() for t in (qb, kb, vb))
        pt, _ = attention_ref(qp, kp, vp, causal=causal, upcast=False)
        pts = torch.autograd.grad(pt, (qp, kp, vp), g)
        for name, ours, r, p in zip(("dq", "dk", "dv"),
                                    (dq[sq:sq + nq], dk[sk:sk + nk], dv[sk:sk + nk]), refs, pts):
            # atol: at least one unit in the last place of the largest reference value (the
            # output's own rounding and the 16-bit P / dS operands cost about that), which the
            # max of pt's error over a tiny entry (a few hundred values) need not reach.
            atol = max(1e-4, one_ulp(r, ours.dtype))
            assert_rule(ours.unsqueeze(0), r, p, 3, atol, f"{name}, {what}")
    else:  # nothing to attend to, or nobody attending: zero gradients, no NaN
        assert (dq[sq:sq + nq] == 0).all() and (dk[sk:sk + nk] == 0).all()
        assert (dv[sk:sk + nk] == 0).all()


def check_each_sequence(tensors, grads, dout, lq, lk, causal):
    """check_sequence for every entry of the length lists lq / lk, in order; returns the rows
    (query, key) the entries cover."""
    sq, sk = 0, 0
    for b, (nq, nk) in enumerate(zip(lq, lk)):
        check_sequence(tensors, grads, dout, sq, sk, nq, nk, f"sequence {b} ({nq} x {nk})",
                       causal)
        sq, sk = sq + nq, sk + nk
    return sq, sk


@pytest.mark.gpu
@pytest.mark.parametrize("lengths", list(LENGTH_LISTS), ids=list(LENGTH_LISTS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", ["mha", "gqa"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("d", [64, 128, 59])
def test_varlen_against_each_sequence(lengths, causal, heads, dtype, d):
    skip_unless_built(d)
    lq, lk = LENGTH_LISTS[lengths]
    nheads, nheads_k = HEADS[heads]
    q, k, v = varlen_inputs(lq, lk, nheads, nheads_k, d, dtype)
    dout = torch.randn_like(q)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), max(lq), max(lk),
                                         causal=causal, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (nheads, sum(lq))
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    check_each_sequence((q, k, v, out, lse), (dq, dk, dv), dout, lq, lk, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_equal_lengths_match_the_padded_kernel(causal, deterministic, path):
    """All sequences of one length: on the sm80 path the same arithmetic as flash_attn_func on
    the batch, so the output, LSE and (deterministic) gradients are bitwise equal. The sm90
    forward gives the padded call (static variant) wider key blocks than varlen calls (tiles.h:
    fwd_tile_sm90), so there both are held to the reference by the rule instead."""
    skip_unless_built(128)
    b, s, h, d = 3, 300, 4, 128
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn_like(q)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, deterministic=deterministic,
                                  return_attn_probs=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    flat = [t.detach().reshape(b * s, h, d).requires_grad_() for t in (q, k, v)]
    cs = cu([s] * b)
    vout, vlse, _ = flash_attn_varlen_func(*flat, cs, cs, s, s, causal=causal,
                                           deterministic=deterministic, return_attn_probs=True)
    vgrads = torch.autograd.grad(vout, flat, dout.reshape(b * s, h, d))
    if path == "auto" and "sm80" in attn_helpers.kernel_paths():  # the sm90 forward runs
        ref, lse_ref = attention_ref(q, k, v, causal=causal)
        pt, lse_pt = attention_ref(q, k, v, causal=causal, upcast=False)
        ref_grads = torch.autograd.grad(ref, (q, k, v), dout)
        pt_grads = torch.autograd.grad(pt, (q, k, v), dout)
        for o, l in ((out, lse), (vout.reshape(b, s, h, d), vlse.reshape(h, b, s).permute(1, 0, 2))):
            assert_rule(o, ref, pt, 2, 1e-5, "out")
            assert_lse_rule(l, lse_ref, lse_pt)
        for name, g, vg, rg, pg in zip(("dq", "dk", "dv"), grads, vgrads, ref_grads, pt_grads):
            assert_rule(g, rg, pg, 3, 1e-5, name)
            assert_rule(vg.reshape(b, s, h, d), rg, pg, 3, 1e-5, name + " (varlen)")
        return
    assert torch.equal(vout, out.reshape(b * s, h, d))
    assert torch.equal(vlse, lse.permute(1, 0, 2).reshape(h, b * s))
    for name, g, vg in zip(("dq", "dk", "dv"), grads, vgrads):
        if name == "dq" and not deterministic:
            torch.testing.assert_close(vg, g.reshape(b * s, h, d), rtol=2 ** -7, atol=1e-5)
        else:
            assert torch.equal(vg, g.reshape(b * s, h, d)), name


@pytest.mark.gpu
def test_varlen_deterministic_is_bitwise_repeatable():
    skip_unless_built(64)
    lq, lk = LENGTH_LISTS["mixed"]
    q, k, v = varlen_inputs(lq, lk, 6, 2, 64, torch.float16)
    dout = torch.randn_like(q)
    runs = []
    for _ in range(2):
        out = flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), max(lq), max(lk), causal=True,
                                     deterministic=True)
        runs.append((out,) + torch.autograd.grad(out, (q, k, v), dout))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.gpu
def test_varlen_packed_forms():
    skip_unless_built(64)
    lens = [33, 0, 70, 1]
    qkv = torch.randn(sum(lens), 3, 4, 64, device="cuda", dtype=torch.bfloat16)
    c = cu(lens)
    out = flash_attn_varlen_qkvpacked_func(qkv, c, max(lens), causal=True)
    ref = flash_attn_varlen_func(*qkv.unbind(1), c, c, max(lens), max(lens), causal=True)
    assert torch.equal(out, ref)
    out = flash_attn_varlen_kvpacked_func(qkv[:, 0], qkv[:, 1:], c, c, max(lens), max(lens))
    assert torch.equal(out, flash_attn_varlen_func(*qkv.unbind(1), c, c, max(lens), max(lens)))


@pytest.mark.gpu
def test_seqused_k_in_the_op():
    """fwd_varlen's seqused_k (flash_attn's varlen_fwd argument): entry b attends to its first
    seqused_k[b] keys only."""
    skip_unless_built(64)
    lq, lk, used = [20, 31], [40, 50], [13, 50]
    q, k, v = varlen_inputs(lq, lk, 4, 4, 64, torch.bfloat16)
    seqused = torch.tensor(used, dtype=torch.int32, device="cuda")
    out, *_ = torch.ops.flashattn_cu.fwd_varlen(q, k, v, cu(lq), cu(lk), seqused, max(lq),
                                                  max(lk), 0.125, False)
    short_k = [k[0:13], k[40:90]]
    short_v = [v[0:13], v[40:90]]
    ref = flash_attn_varlen_func(q, torch.cat(short_k), torch.cat(short_v), cu(lq), cu(used),
                                 max(lq), max(used), softmax_scale=0.125)
    assert torch.equal(out, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_data_outside_an_entry_never_reaches_it(bad, causal, d):
    """Each sequence's output and gradients depend on its own rows only. The tensors hold rows
    past the last sequence (a buffer padded to a fixed size) and sequence 1 carries non-finite
    V and dout, the rest finite: sequences 0 and 2 must match the reference. The kernels' tiles
    read past a sequence's last key or query into the next rows (the sm90 kernels' TMA maps end
    at the tensors' rows); P = 0 there, but 0 x NaN is NaN in the tensor cores, so those rows
    must be zeroed on chip (sm90 forward: V; backward: Q and dO) or never loaded (sm80). The
    rows past the last sequence are outputs of no sequence: 0 (lse +inf), gradients 0."""
    skip_unless_built(d)
    lq, lk, spare = [37, 200, 129], [50, 257, 130], 77
    nheads, nheads_k = 4, 2
    dtype = torch.bfloat16
    q = torch.randn(sum(lq) + spare, nheads, d, device="cuda", dtype=dtype)
    k = torch.randn(sum(lk) + spare, nheads_k, d, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    for t, total in ((q, sum(lq)), (k, sum(lk)), (v, sum(lk)), (dout, sum(lq))):
        t[total:] = bad  # the buffer's rows past the last sequence
    v[lk[0]:lk[0] + 8] = bad  # sequence 1's first keys' values: sequence 0's tail block
    dout[lq[0]:lq[0] + lq[1]] = bad  # sequence 1's gradient, under sequence 0's query block
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), max(lq), max(lk),
                                         causal=causal, return_attn_probs=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    # The rows past the last sequence belong to none: written as rows that see no key (out 0,
    # lse +inf) and zero gradients, whatever the poisoned outputs held (flash_attn leaves them).
    tq, tk = sum(lq), sum(lk)
    assert (out[tq:] == 0).all() and (lse[:, tq:] == float("inf")).all(), "rows past the entries"
    assert (dq[tq:] == 0).all() and (dk[tk:] == 0).all() and (dv[tk:] == 0).all(), \
        "gradient rows past the entries"
    starts_q, starts_k = [0, lq[0], lq[0] + lq[1]], [0, lk[0], lk[0] + lk[1]]
    for b in (0, 2):
        check_sequence((q, k, v, out, lse), (dq, dk, dv), dout, starts_q[b], starts_k[b], lq[b],
                       lk[b], f"sequence {b} ({lq[b]} x {lk[b]}), {bad} outside it", causal)


@pytest.mark.gpu
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("d", [64, 128])
def test_rows_before_an_entry_never_reach_it(bad, d):
    """The sm90a forward aligns each causal entry's query blocks to its last row (problem/mask.h
    Mask::query_block_shift): an entry's first block starts above its row 0 and loads the rows
    before it, the previous entry's last ones, as its own first rows, which it never stores.
    Entry 0's queries are non-finite: entries 1 and 2 (lengths no tile divides, so their first
    blocks start up to 191 rows early) must match the reference, forward and backward."""
    skip_unless_built(d)
    lq, lk = [300, 1153, 517], [300, 1153, 600]
    nheads, nheads_k = 4, 2
    q, k, v = varlen_inputs(lq, lk, nheads, nheads_k, d, torch.bfloat16)
    with torch.no_grad():
        q[:lq[0]] = bad
    dout = torch.randn_like(q)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), max(lq), max(lk), causal=True,
                                         return_attn_probs=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    starts_q, starts_k = [0, lq[0], lq[0] + lq[1]], [0, lk[0], lk[0] + lk[1]]
    for b in (1, 2):
        check_sequence((q, k, v, out, lse), (dq, dk, dv), dout, starts_q[b], starts_k[b], lq[b],
                       lk[b], f"sequence {b} ({lq[b]} x {lk[b]}), {bad} queries before it", True)


@pytest.mark.gpu
def test_seqused_k_unused_keys_never_reach_the_output():
    """fwd_varlen's seqused_k with NaN in each entry's unused keys (a cache's rows past its
    length): the output is the reference over the used keys only."""
    skip_unless_built(64)
    lq, lk, used = [20, 31], [200, 150], [13, 129]
    q, k, v = varlen_inputs(lq, lk, 4, 4, 64, torch.bfloat16)
    k, v = k.detach().clone(), v.detach().clone()
    for start, n, u in ((0, 200, 13), (200, 150, 129)):
        k[start + u:start + n] = float("nan")
        v[start + u:start + n] = float("nan")
    seqused = torch.tensor(used, dtype=torch.int32, device="cuda")
    out, *_ = torch.ops.flashattn_cu.fwd_varlen(q, k, v, cu(lq), cu(lk), seqused, max(lq),
                                                  max(lk), 0.125, False)
    assert not out.isnan().any()
    short = [(k[0:13], v[0:13]), (k[200:329], v[200:329])]
    ref = flash_attn_varlen_func(q, torch.cat([s[0] for s in short]),
                                 torch.cat([s[1] for s in short]), cu(lq), cu(used), max(lq),
                                 max(used), softmax_scale=0.125)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
def test_many_entries_one_long(deterministic):
    """A skewed pack as document-masked pretraining makes it: 150 entries of 0-300 tokens (keys
    drawn apart, so rows that see no key and entries without queries occur) around one of 2000,
    GQA, causal, with rows past the last entry: every entry against its own reference (the
    compact tiles' binary search over 151 offsets: 8 levels), forward and backward, the
    deterministic dQ kernel too."""
    skip_unless_built(64)
    gen = torch.Generator().manual_seed(3)
    lq = torch.randint(0, 301, (150,), generator=gen).tolist()
    lk = torch.randint(0, 301, (150,), generator=gen).tolist()
    lq[97], lk[97] = 2000, 2000
    nheads, nheads_k = HEADS["gqa"]
    q, k, v = varlen_inputs(lq + [37], lk + [5], nheads, nheads_k, 64, torch.bfloat16)
    dout = torch.randn_like(q)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), max(lq), max(lk), causal=True,
                                         deterministic=deterministic, return_attn_probs=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    sq, sk = check_each_sequence((q, k, v, out, lse), (dq, dk, dv), dout, lq, lk, True)
    # The 37 query rows and 5 key rows past the last entry: a row that sees no key.
    assert (out[sq:] == 0).all() and torch.isinf(lse[:, sq:]).all()
    assert (dq[sq:] == 0).all() and (dk[sk:] == 0).all() and (dv[sk:] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 256])
def test_max_seqlen_far_past_the_entries(path, d):
    """The sm90 kernels' varlen grids are compact (problem/scheduler.h: query_tile_of,
    key_tile_of; the backward's preprocess and postprocess on either path too; at d 256 the
    forward's compact-only instance, sm90/fwd_work.h fwd_compact_in_walk): max_seqlen_q /
    max_seqlen_k bound the entries but do not size those grids, so 64 one-row entries under
    max_seqlen 2^30 (batch x heads x 2^30 / block_m blocks: past the 2^31 - 1 a grid holds) run
    forward and backward there and give the one-key answers: out = v, dv = dout, dq = dk = 0.
    The sm80 main kernels keep the batch x max_seqlen grid (its decoding at their start cost
    them registers: spills in the dynamic variants, NOTES 12.51): a clear error naming the grid."""
    skip_unless_built(d)
    q, k, v = varlen_inputs([1] * 64, [1] * 64, 32, 32, d, torch.bfloat16)
    cu_seqlens = cu([1] * 64)
    if path == "sm80" or not attn_helpers.sm90_built():
        with pytest.raises(RuntimeError, match=r"grid would exceed 2\^31 - 1 thread blocks"):
            flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, 2 ** 30, 2 ** 30)
        return
    for causal in (False, True):
        out = flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, 2 ** 30, 2 ** 30,
                                     causal=causal)
        torch.testing.assert_close(out, v.detach(), atol=0, rtol=0)
        dout = torch.randn_like(out)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
        torch.testing.assert_close(dv, dout, atol=0, rtol=0)
        for name, g in (("dq", dq), ("dk", dk)):
            assert g.abs().max() < 1e-2, f"{name}: {g.abs().max()}"


# Each varlen kernel decodes compact tiles (problem/scheduler.h compact_query_tiles /
# compact_key_tiles) only while they are fewer than the padded grid's batch x ceil(max_seqlen /
# block): a buffer of batch x max_seqlen rows or more gets the padded grid from the same call.
GRID_CASES = {
    "causal": {"causal": True},
    "window": {"window_size": (70, 9)},
    "softcap-alibi": {"softcap": 12.5, "alibi": True, "causal": True},
    "dropout": {"dropout_p": 0.17},
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GRID_CASES))
@pytest.mark.parametrize("d", [64, 128, 256])
def test_compact_and_padded_grids_agree_bitwise(name, d, path):
    """The same varlen call on its compact tiles and on the padded grid (the q / k / v buffers
    grown past batch x max_seqlen rows with data no entry holds): each tile runs the same code
    on the same rows, so out, lse and the deterministic gradients of the entries' rows are
    bitwise equal (dropout too: the mask is a function of the generator state and the element,
    not of the tile's index). On the sm80 path only the backward's pre- and postprocess grids
    change (its main kernels keep the padded grid)."""
    skip_unless_built(d)
    rng = random.Random(f"{name}-{d}")
    lq = [rng.randint(0, 150) for _ in range(23)] + [333]
    lk = [n if rng.random() < 0.5 else rng.randint(0, 150) for n in lq[:-1]] + [301]
    order = list(range(len(lq)))
    rng.shuffle(order)
    lq, lk = [lq[i] for i in order], [lk[i] for i in order]
    b, tq, tk = len(lq), sum(lq), sum(lk)
    for block in (64, 128, 192):  # the first call is compact for every tile height in use
        assert tq // block + b < b * -(-max(lq) // block), block
        assert tk // block + b < b * -(-max(lk) // block), block
    nheads, nheads_k = 4, 2
    kw = dict(GRID_CASES[name], deterministic=True, return_attn_probs=True)
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.rand(nheads, device="cuda") * 0.5
    big = varlen_inputs([b * max(lq) + 5], [b * max(lk) + 3], nheads, nheads_k, d,
                        torch.bfloat16)
    dout_big = torch.randn_like(big[0])
    cu_q, cu_k = cu(lq), cu(lk)
    runs = []
    for rows_q, rows_k in ((tq, tk), (big[0].shape[0], big[1].shape[0])):
        q, k, v = (t.detach()[:n].clone().requires_grad_()
                   for t, n in zip(big, (rows_q, rows_k, rows_k)))
        torch.cuda.manual_seed(20261205)
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), **kw)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout_big[:rows_q])
        runs.append((out[:tq], lse[:, :tq], dq[:tq], dk[:tk], dv[:tk]))
    for what, compact, padded in zip(("out", "lse", "dq", "dk", "dv"), *runs):
        assert torch.equal(compact, padded), (
            f"{what}: compact and padded grids differ by {(compact - padded).abs().max()}")


def skewed_lengths(seed, entries=40, long=1500):
    """A pack with more compact tiles than an H100 / H200 has SMs at 4 heads (block 128: ~100 a
    head): `entries` entries of 0-300 tokens (keys drawn apart), one without queries, one
    without keys (rows that see no key), and one long one."""
    rng = random.Random(seed)
    lq = [rng.randint(0, 300) for _ in range(entries)] + [0, 37, long]
    lk = [n if rng.random() < 0.5 else rng.randint(0, 300) for n in lq[:-3]] + [45, 0, long]
    order = list(range(len(lq)))
    rng.shuffle(order)
    return [lq[i] for i in order], [lk[i] for i in order]


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GRID_CASES))
@pytest.mark.parametrize("d", [64, 128, 256])
def test_dynamic_and_static_schedules_agree_bitwise(name, d, path):
    """The sm90a forward's dynamic tile scheduler (sm90/fwd_launch.h: a CTA per SM taking the
    next tile from a counter in the call's workspace, on the kernels whose producer hands out the
    tiles, fwd_work.h fwd_published_tiles) against the static schedule (one CTA per tile,
    flashattn_cu.testing.fwd_dynamic_tiles(False)) on varlen calls with more tiles than SMs: each
    tile runs the same code on the same rows whichever CTA takes it, so out and lse are bitwise
    equal (dropout too: the mask is a function of the generator state and the element); the
    dynamic call's entries are right against their references (the causal case, with the
    gradients); a second dynamic call equals the first (the counter is zeroed per call); so do
    both schedules with the tiles within an entry block after block (testing.fwd_varlen_order).
    The kernels' grids (torch's profiler) show which ran: on the sm90a path at d 64 / 128 a CTA
    per SM against one per tile; where no kernel takes it (d 256, the sm80 path) all calls are
    the static one."""
    skip_unless_built(d)
    from flashattn_cu.testing import fwd_dynamic_tiles, fwd_varlen_order

    lq, lk = skewed_lengths(f"dyn-{name}-{d}")
    if name == "causal":
        lk = list(lq)
    nheads, nheads_k = 4, 2
    q, k, v = varlen_inputs(lq + [29], lk + [3], nheads, nheads_k, d, torch.bfloat16)
    kw = dict(GRID_CASES[name], return_attn_probs=True)
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.rand(nheads, device="cuda") * 0.5
    cu_q, cu_k = cu(lq), cu(lk)
    # (dynamic, the tile order within an entry: testing.fwd_varlen_order)
    configs = [(True, "heads"), (False, "heads"), (True, "heads"), (True, "blocks"),
               (False, "blocks")]
    runs, grids = [], []
    for dynamic, order in configs:
        def call():
            torch.cuda.manual_seed(20261206)
            with fwd_dynamic_tiles(dynamic), fwd_varlen_order(order):
                runs.append(flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk),
                                                   **kw)[:2])
        grids.append(attn_helpers.kernel_grids(call, attn_helpers.SM90_FWD_KERNEL))
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    for (dynamic, order), g in zip(configs, grids):
        if path == "auto" and attn_helpers.sm90_built() and d <= 128:
            want_sms = dynamic
            assert len(g) == 1 and (g[0][0] == sms) == want_sms and g[0][0] >= sms, (
                f"{'dynamic' if dynamic else 'static'} call ({order}): grids {g}, {sms} SMs")
        else:
            assert g == grids[1], (g, grids[1])
    tq = sum(lq)
    for (dynamic, order), (out_b, lse_b) in zip(configs[1:], runs[1:]):
        what = f"{'dynamic' if dynamic else 'static'} ({order})"
        out_a, lse_a = runs[0]
        assert torch.equal(out_a[:tq], out_b[:tq]), (
            f"out: the first dynamic call and {what} differ by "
            f"{(out_a[:tq] - out_b[:tq]).abs().max()}")
        assert torch.equal(lse_a[:, :tq], lse_b[:, :tq]), f"lse: the first call and {what} differ"
    if name == "causal":
        dout = torch.randn_like(q)
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=True,
                                             return_attn_probs=True)
        assert torch.equal(out, runs[0][0])
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
        check_each_sequence((q, k, v, out, lse), (dq, dk, dv), dout, lq, lk, True)


@pytest.mark.gpu
def test_dynamic_schedule_in_a_cuda_graph_and_on_another_stream():
    """The dynamic scheduler's counter is zeroed on the call's stream (a memset node under
    capture): a captured varlen forward replayed twice, and the same call on a side stream,
    equal the eager call on the default stream bitwise."""
    skip_unless_built(128)
    lq, lk = skewed_lengths("dyn-graph")
    q, k, v = (t.detach() for t in varlen_inputs(lq, lk, 4, 2, 128, torch.bfloat16))
    cu_q, cu_k = cu(lq), cu(lk)

    def call():
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=True)

    eager = call()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # the op on a stream of its own (also its warm-up before capture)
            on_side = call()
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(on_side, eager), "the side stream's call differs"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    for _ in range(2):
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager), "a replay differs from the eager call"


# --------------------------------------------------------------------------------------------
# CPU: arguments and shapes


def fake_full_build():
    return mock.patch.object(fai, "_built_head_dims",
                             return_value=tuple(_C.head_dim_instances()))


def test_varlen_shapes_on_fake_tensors():
    with FakeTensorMode(), mock.patch.object(fai, "_device_capability", return_value=(9, 0)), \
            fake_full_build():
        q = torch.empty(70, 6, 59, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(90, 2, 59, dtype=torch.bfloat16, device="cuda")
        c = torch.empty(4, dtype=torch.int32, device="cuda")
        out, lse, dmask = flash_attn_varlen_func(q, k, k, c, c, 40, 50, causal=True,
                                                 return_attn_probs=True)
        assert out.shape == q.shape and lse.shape == (6, 70) and dmask is None


@pytest.mark.parametrize("change, error, message", [
    (dict(q=(70, 6, 64, 1)), ValueError, r"q must have rank 3 \(total_tokens, nheads, headdim\)"),
    (dict(cu_q=torch.int64), ValueError, "cu_seqlens_q must be a 1-d int32 tensor"),
    (dict(cu_k_len=3), ValueError, "cu_seqlens_q has 4 elements and cu_seqlens_k 3"),
    (dict(max_q=-1), ValueError, "max_seqlen_q must be a non-negative int"),
    (dict(max_k=2.5), ValueError, "max_seqlen_k must be a non-negative int"),
    # block_table (paged prefill: tests/test_paged_prefill.py) takes paged k / v.
    (dict(block_table=True), ValueError, r"k must have rank 4 \(num_blocks, page_block_size"),
    (dict(dropout_p=1.0), ValueError, r"dropout_p must be a probability in \[0, 1\), got 1.0"),
])
def test_varlen_argument_errors(change, error, message):
    with FakeTensorMode(), mock.patch.object(fai, "_device_capability", return_value=(9, 0)), \
            fake_full_build():
        q = torch.empty(change.get("q", (70, 6, 64)), dtype=torch.float16, device="cuda")
        k = torch.empty(90, 2, 64, dtype=torch.float16, device="cuda")
        cu_q = torch.empty(4, dtype=change.get("cu_q", torch.int32), device="cuda")
        cu_k = torch.empty(change.get("cu_k_len", 4), dtype=torch.int32, device="cuda")
        kwargs = {}
        if "block_table" in change:
            kwargs["block_table"] = torch.empty(3, 2, dtype=torch.int32, device="cuda")
        if "dropout_p" in change:
            kwargs["dropout_p"] = change["dropout_p"]
        with pytest.raises(error, match=message):
            flash_attn_varlen_func(q, k, k, cu_q, cu_k, change.get("max_q", 40),
                                   change.get("max_k", 50), **kwargs)
