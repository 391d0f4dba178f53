"""Attention dropout (flash_attn's dropout_p): the kept fraction, output and gradients against the
fp32 reference with the kernels' own mask (recovered from S_dmask's signs) by the rule (forward
2x, gradients 3x), on both backward paths (sm90 and sm80, from one forward: both regenerate the
forward's mask) and the deterministic dQ kernel, with causal masks, windows, softcap, ALiBi, GQA
and varlen; reproducibility under torch.cuda.manual_seed, a fresh mask per call, and CUDA graph
capture and replay. CPU tests: argument checks and the fake (meta) implementations."""

from unittest import mock

import pytest
import torch

from api_helpers import cpu_qkv, pretend_gpu
from attn_helpers import (HEADS, assert_lse_rule, assert_rule, cu_seqlens, fa_grads,
                          farther_each, instance_for, kernel_paths, make_qkv)
from flashattn_cu import _C, flash_attn_func, flash_attn_varlen_func
from flashattn_cu import flash_attn_interface as fai
from flashattn_cu.testing import attention_ref, dropout_mask_from_s_dmask, kernel_path

F16, BF16 = torch.float16, torch.bfloat16


def skip_unless_built(head_dim):
    if instance_for(head_dim) not in _C.built_head_dims():
        pytest.skip(f"head dim {head_dim} not in this build")


def keep_probability(p):
    """The kernels' exact keep probability: round((1 - p) * 65536) / 65536 (common/philox.h)."""
    return int((1.0 - p) * 65536 + 0.5) / 65536


def check_dropout(q, k, v, dout, p, what, deterministic=False, **kw):
    """One forward with dropout p, then the backward on every kernel path from the same forward
    (the saved rng_state), all against the fp32 reference with the mask of S_dmask."""
    sq, sk = q.shape[1], k.shape[1]
    out, lse, s_dmask = flash_attn_func(q, k, v, dropout_p=p, return_attn_probs=True,
                                        deterministic=deterministic, **kw)
    assert s_dmask.shape == (q.shape[0], q.shape[2], -(-sq // 128) * 128, -(-sk // 128) * 128)
    assert not torch.isnan(s_dmask).any(), f"{what}: S_dmask not fully written"
    mask = dropout_mask_from_s_dmask(s_dmask, sq, sk)
    # Rows of the undropped probabilities sum to 1 (or 0 for a row that sees no key).
    row_sums = s_dmask[:, :, :sq, :sk].float().abs().sum(-1)
    assert ((row_sums - 1).abs() < 2e-2).logical_or(row_sums == 0).all(), f"{what}: S_dmask rows"
    ref, ref_lse = attention_ref(q, k, v, dropout_p=p, dropout_mask=mask, **kw)
    pt, pt_lse = attention_ref(q, k, v, upcast=False, dropout_p=p, dropout_mask=mask, **kw)
    assert_rule(out, ref, pt, 2, 1e-5, f"{what}: out")
    assert_lse_rule(lse, ref_lse, pt_lse, f"{what}: lse")
    refs = torch.autograd.grad(ref, (q, k, v), dout.float())
    pts = torch.autograd.grad(pt, (q, k, v), dout)
    for path in kernel_paths():
        with kernel_path(path):
            grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        for name, g, r, p_ in zip(("dq", "dk", "dv"), grads, refs, pts):
            assert_rule(g, r, p_, 3, 1e-4, f"{what}: {name} ({path})")
    return mask


# --------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
@pytest.mark.parametrize("p", [0.17, 0.5, 0.9])
def test_kept_fraction(p):
    """The kept fraction over 4 x 512 x 512 elements per head is 1 - p to 5 standard deviations,
    per (batch, head) too; the heads' masks differ; the rounding padding of S_dmask is 0."""
    skip_unless_built(64)
    q, k, v = make_qkv(2, 512, 509, 2, 2, 64, BF16)
    _, _, s_dmask = flash_attn_func(q, k, v, dropout_p=p, return_attn_probs=True)
    mask = dropout_mask_from_s_dmask(s_dmask, 512, 509)
    keep = keep_probability(p)
    per_head = mask.float().mean(dim=(2, 3))
    n = 512 * 509
    assert ((per_head - keep).abs() <= 5 * (keep * (1 - keep) / n) ** 0.5).all(), per_head
    heads = mask.flatten(0, 1)
    assert not any(torch.equal(heads[i], heads[j]) for i in range(4) for j in range(i))
    pad = s_dmask[:, :, :, 509:].float()
    assert (pad == 0).all() and not torch.signbit(pad).any()


# (dtype, head dim): the instances 64, 128 and 256 and the padded 40.
DIMS = [(F16, 64), (BF16, 128), (F16, 256), (BF16, 40)]
MASKS = [(False, (-1, -1)), (True, (-1, -1)), (False, (40, 9))]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, d", DIMS, ids=[f"{str(t)[6:]}-d{d}" for t, d in DIMS])
@pytest.mark.parametrize("causal, window", MASKS, ids=["full", "causal", "window"])
# (300, 333) causal: the sm90a forward's blocks aligned to the last row, the shift rounded down to
# 16 rows (sm90/fwd_launch.h fwd_m_shift) where the Philox map wants its tiles; (1, 239) likewise.
@pytest.mark.parametrize("seqlens", [(113, 203), (1, 239), (512, 256), (300, 333)])
def test_dropout_against_reference(dtype, d, causal, window, seqlens):
    skip_unless_built(d)
    sq, sk = seqlens
    nheads, nheads_k = HEADS["gqa" if (d + sq) % 2 else "mha"]
    q, k, v = make_qkv(2, sq, sk, nheads, nheads_k, d, dtype, requires_grad=True)
    dout = torch.randn_like(q)
    check_dropout(q, k, v, dout, 0.17, f"d={d} causal={causal} window={window}", causal=causal,
                  window_size=window)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, d", [(F16, 96), (BF16, 64), (BF16, 256)],
                         ids=["fp16-d96", "bf16-d64", "bf16-d256"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_dropout_with_softcap_alibi_and_gqa(dtype, d, deterministic):
    """Dropout takes softcap and ALiBi as run-time branches of its kernel variant: each alone and
    both, with windows, GQA and the deterministic dQ kernel."""
    skip_unless_built(d)
    q, k, v = make_qkv(2, 150, 190, 6, 2, d, dtype, requires_grad=True)
    with torch.no_grad():
        q.mul_(2.0)
    slopes = torch.tensor([2.0 ** (-i - 1) for i in range(6)], device="cuda")
    dout = torch.randn_like(q)
    for kw in (dict(softcap=4.0, causal=True), dict(alibi_slopes=slopes, window_size=(30, 45)),
               dict(softcap=4.0, alibi_slopes=slopes, causal=True, window_size=(70, 0))):
        check_dropout(q, k, v, dout, 0.3, f"{sorted(kw)}", deterministic=deterministic, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
def test_dropout_varlen(deterministic):
    """Each sequence of a varlen batch (lengths 0, 1 and a long one) against its own reference
    with its slab of S_dmask as the mask, on every backward path. The gradients' baseline is the
    larger of pt's error and that of the FlashAttention backward in float64 on the kernel's
    rounded output (attn_helpers.fa_grads): the length-1 sequence has dq = 0 exactly, which
    pt reproduces exactly and no FlashAttention backward does (measured on the H200: 1.6e-2 on
    both paths, the float64 FlashAttention backward 1.6e-2)."""
    skip_unless_built(64)
    lens = [300, 0, 1, 77, 129]
    cu = cu_seqlens(lens)
    q = torch.randn(sum(lens), 4, 64, device="cuda", dtype=BF16, requires_grad=True)
    k = torch.randn(sum(lens), 2, 64, device="cuda", dtype=BF16, requires_grad=True)
    v = torch.randn(sum(lens), 2, 64, device="cuda", dtype=BF16, requires_grad=True)
    dout = torch.randn_like(q)
    p, kw = 0.25, dict(causal=True)
    out, _, s_dmask = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), dropout_p=p,
                                             return_attn_probs=True, deterministic=deterministic,
                                             **kw)
    assert s_dmask.shape == (len(lens), 4, 384, 384) and not torch.isnan(s_dmask).any()
    grads = {}
    for path in kernel_paths():
        with kernel_path(path):
            grads[path] = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    for b, (start, n) in enumerate(zip(cu[:-1].tolist(), lens)):
        if n == 0:
            continue
        sl = slice(start, start + n)
        mask = dropout_mask_from_s_dmask(s_dmask[b:b + 1], n, n)
        qb, kb, vb = (t.detach()[sl].unsqueeze(0).requires_grad_() for t in (q, k, v))
        ref, _ = attention_ref(qb, kb, vb, dropout_p=p, dropout_mask=mask, **kw)
        pt, _ = attention_ref(qb, kb, vb, upcast=False, dropout_p=p, dropout_mask=mask, **kw)
        d_b = dout[sl].unsqueeze(0)
        ref_grads = torch.autograd.grad(ref, (qb, kb, vb), d_b.float())
        pt_grads = torch.autograd.grad(pt, (qb, kb, vb), d_b)
        fa_g = fa_grads(qb, kb, vb, out[sl].unsqueeze(0), d_b, kw, mask, p)
        pt_grads = [farther_each(pg, fg, rg) for pg, fg, rg in zip(pt_grads, fa_g, ref_grads)]
        assert_rule(out[sl].unsqueeze(0), ref, pt, 2, 1e-5, f"out, sequence {b}")
        for path, gs in grads.items():
            for name, g, r, p_ in zip(("dq", "dk", "dv"), gs, ref_grads, pt_grads):
                assert_rule(g[sl].unsqueeze(0), r, p_, 3, 1e-4, f"{name}, sequence {b} ({path})")


def _run(q, k, v, dout, p, deterministic):
    out = flash_attn_func(q, k, v, dropout_p=p, causal=True, deterministic=deterministic)
    return (out, *torch.autograd.grad(out, (q, k, v), dout))


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
def test_same_seed_is_bitwise_reproducible_and_calls_differ(deterministic):
    """torch.cuda.manual_seed before each call: the same output bitwise, and the same dk, dv (dq
    too with deterministic=True, on every backward path); without reseeding the next call draws
    another mask (the generator's offset advances)."""
    skip_unless_built(128)
    q, k, v = make_qkv(2, 300, 300, 4, 2, 128, BF16, requires_grad=True)
    dout = torch.randn_like(q)
    for path in kernel_paths():
        with kernel_path(path):
            torch.cuda.manual_seed(1234)
            first = _run(q, k, v, dout, 0.2, deterministic)
            torch.cuda.manual_seed(1234)
            second = _run(q, k, v, dout, 0.2, deterministic)
            third = _run(q, k, v, dout, 0.2, deterministic)
        compared = ("out", "dq", "dk", "dv") if deterministic else ("out", "dk", "dv")
        for name, a, b in zip(("out", "dq", "dk", "dv"), first, second):
            if name in compared:
                assert torch.equal(a, b), f"{name} differs under the same seed ({path})"
            else:  # dq: fp32 atomics in any order, then rounded
                torch.testing.assert_close(a.float(), b.float(), atol=5e-2, rtol=2e-2)
        assert not torch.equal(first[0], third[0]), "two calls drew the same mask"


@pytest.mark.gpu
def test_generator_argument_of_the_op():
    """The op's gen argument: two generators with one seed give one mask; rng_state is
    (seed, offset) of the call."""
    skip_unless_built(64)
    q, k, v = make_qkv(1, 64, 64, 2, 2, 64, F16)
    outs = []
    for _ in range(2):
        gen = torch.Generator(device="cuda").manual_seed(77)
        out, _, _, rng_state, s_dmask = torch.ops.flashattn_cu.fwd(
            q, k, v, 0.125, False, -1, -1, None, 0.0, 0.4, True, gen)
        outs.append((out, rng_state.cpu(), s_dmask))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][2], outs[1][2])
    assert outs[0][1].tolist()[0] == 77 and outs[0][1].tolist() == outs[1][1].tolist()


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_generator_of_another_gpu_is_refused():
    """The op's gen must belong to q's GPU: one of another GPU would be read and advanced for
    this call's mask (torch checks only that it is a CUDA generator)."""
    skip_unless_built(64)
    q, k, v = make_qkv(1, 64, 64, 2, 2, 64, F16)
    gen = torch.Generator(device="cuda:1")
    with pytest.raises(ValueError, match="gen must be a generator of q's device"):
        torch.ops.flashattn_cu.fwd(q, k, v, 0.125, False, -1, -1, None, 0.0, 0.4, False, gen)


@pytest.mark.gpu
def test_call_reserves_four_offsets_per_batch_entry_and_head():
    """A call owns the generator's offsets [o, o + 4 * batch * nheads): one Philox counter per
    (batch entry, head), o / 4 + batch * nheads + head in the counter's lower half, where torch's
    own kernels keep theirs (common/philox.h), so no other consumer of the generator draws the
    same random words. The generator advances by that much and rng_state holds (seed, o)."""
    skip_unless_built(64)
    q, k, v = make_qkv(3, 40, 56, 5, 5, 64, F16)
    gen = torch.Generator(device="cuda").manual_seed(5)
    gen.set_offset(12)
    for call in range(2):
        before = gen.get_offset()
        *_, rng_state, _ = torch.ops.flashattn_cu.fwd(
            q, k, v, 0.125, False, -1, -1, None, 0.0, 0.2, False, gen)
        assert rng_state.cpu().tolist() == [5, before], call
        assert gen.get_offset() - before == 4 * 3 * 5, call


@pytest.mark.gpu
def test_cuda_graph_replays_draw_fresh_masks():
    """A captured forward + backward with dropout: each replay draws a new mask (the generator's
    state is read by the kernels at run time), and each replay's outputs and gradients match
    the reference with that replay's mask."""
    skip_unless_built(64)
    q, k, v = make_qkv(2, 130, 190, 4, 4, 64, F16, requires_grad=True)
    dout = torch.randn_like(q)
    p = 0.3

    def step():
        out, _, s_dmask = flash_attn_func(q, k, v, dropout_p=p, return_attn_probs=True)
        return (out, s_dmask, *torch.autograd.grad(out, (q, k, v), dout))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    masks = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        out, s_dmask, dq, dk, dv = (t.clone() for t in static)
        mask = dropout_mask_from_s_dmask(s_dmask, 130, 190)
        masks.append(mask)
        ref, _ = attention_ref(q, k, v, dropout_p=p, dropout_mask=mask)
        pt, _ = attention_ref(q, k, v, upcast=False, dropout_p=p, dropout_mask=mask)
        assert_rule(out, ref, pt, 2, 1e-5, "graph replay: out")
        refs = torch.autograd.grad(ref, (q, k, v), dout.float())
        pts = torch.autograd.grad(pt, (q, k, v), dout)
        for name, g, r, p_ in zip(("dq", "dk", "dv"), (dq, dk, dv), refs, pts):
            assert_rule(g, r, p_, 3, 1e-4, f"graph replay: {name}")
    assert not torch.equal(masks[0], masks[1]), "two replays drew the same mask"


# --------------------------------------------------------------------------------------------
# CPU: argument checks and the fake implementations


@pytest.mark.parametrize("p, error, message", [
    (-0.1, ValueError, r"dropout_p must be a probability in \[0, 1\), got -0.1"),
    (1.0, ValueError, r"dropout_p must be a probability in \[0, 1\), got 1.0"),
    (float("nan"), ValueError, r"dropout_p must be a probability in \[0, 1\), got nan"),
    ("0.1", TypeError, "dropout_p must be a Python number, got str"),
    (True, TypeError, "dropout_p must be a Python number, got bool"),
])
def test_dropout_p_checked(p, error, message):
    q, k, v = cpu_qkv()
    with pytest.raises(error, match=message):
        flash_attn_func(q, k, v, dropout_p=p)
    with pytest.raises(error, match=message):
        flash_attn_varlen_func(q[0], k[0], v[0], torch.tensor([0, 5], dtype=torch.int32),
                               torch.tensor([0, 7], dtype=torch.int32), 5, 7, dropout_p=p)


def _fake_qkv(b=2, sq=5, sk=130, h=4, hk=2, d=64):
    return (torch.empty(b, sq, h, d, dtype=F16, device="cuda"),
            torch.empty(b, sk, hk, d, dtype=F16, device="cuda"),
            torch.empty(b, sk, hk, d, dtype=F16, device="cuda"))


def test_fake_shapes_of_the_attention_probs():
    """return_attn_probs: S_dmask (batch, nheads, seqlen_q, seqlen_k rounded up to 128) in q's
    dtype with dropout, None without (flash_attn up to 2.6); the padded head dim too."""
    with pretend_gpu():
        for d in (64, 59):
            q, k, v = _fake_qkv(d=d)
            out, lse, s_dmask = flash_attn_func(q, k, v, dropout_p=0.1, return_attn_probs=True)
            assert out.shape == q.shape and lse.shape == (2, 4, 5)
            assert s_dmask.shape == (2, 4, 128, 256) and s_dmask.dtype == F16
            assert flash_attn_func(q, k, v, return_attn_probs=True)[2] is None
            assert flash_attn_func(q, k, v, dropout_p=0.1).shape == q.shape
        lens = torch.tensor([0, 3, 3, 10], dtype=torch.int32, device="cuda")
        qv, kv = torch.empty(10, 4, 64, dtype=F16, device="cuda"), torch.empty(10, 2, 64,
                                                                                dtype=F16,
                                                                                device="cuda")
        out, lse, s_dmask = flash_attn_varlen_func(qv, kv, kv, lens, lens, 7, 129, dropout_p=0.5,
                                                   return_attn_probs=True)
        assert out.shape == qv.shape and lse.shape == (4, 10)
        assert s_dmask.shape == (3, 4, 128, 256)


def test_fake_ops_on_meta():
    q = torch.empty(3, 9, 8, 128, device="meta", dtype=BF16)
    k = torch.empty(3, 17, 2, 128, device="meta", dtype=BF16)
    out, lse, stats, rng_state, s_dmask = torch.ops.flashattn_cu.fwd(
        q, k, k, 0.1, False, -1, -1, None, 0.0, 0.2, True)
    assert rng_state.shape == (2,) and rng_state.dtype == torch.int64
    assert s_dmask.shape == (3, 8, 128, 128) and s_dmask.dtype == BF16
    *_, rng_state, s_dmask = torch.ops.flashattn_cu.fwd(q, k, k, 0.1, False)
    assert rng_state.shape == (0,) and s_dmask.shape == (0,)
    dq, dk, dv = torch.ops.flashattn_cu.bwd(out, q, k, k, out, lse, 0.1, False, True, stats,
                                            -1, -1, None, 0.0, 0.2, torch.empty(2, device="meta",
                                                                                dtype=torch.int64))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == k.shape


def test_compile_fullgraph_traces_dropout():
    """torch.compile(fullgraph=True) traces dropout forward and backward (the generator is
    drawn inside the op)."""
    torch._dynamo.reset()
    q = torch.randn(2, 5, 4, 64, device="meta", dtype=F16, requires_grad=True)
    k = torch.randn(2, 7, 2, 64, device="meta", dtype=F16, requires_grad=True)
    v = torch.randn(2, 7, 2, 64, device="meta", dtype=F16, requires_grad=True)

    def step(q, k, v):
        out, lse, s_dmask = flash_attn_func(q, k, v, dropout_p=0.1, causal=True,
                                            return_attn_probs=True)
        return out.float().sum() + s_dmask.float().sum() * 0

    with mock.patch.object(fai, "_check_devices", lambda q, k, v: None):
        loss = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v)
        loss.backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


def _compiled_graphs(fn, *args):
    """The forward and backward graphs AOTAutograd makes of fn (torch.compile, fullgraph, with
    Inductor's partitioner, whose common-subexpression pass and recomputation choices are what
    matter here), run on the given (meta) tensors with loss.backward(). A graph that saves the
    generator's state cannot run on meta tensors (torch's RNG-state ops have no meta backend):
    then the forward graph alone is returned, with None for the backward."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    graphs = {}

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm
            return gm.forward
        return compiler

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw"),
                           partition_fn=min_cut_rematerialization_partition)
    with mock.patch.object(fai, "_check_devices", lambda q, k, v, fn="": None):
        try:
            torch.compile(fn, fullgraph=True, backend=backend)(*args).backward()
        except Exception:
            if "fw" not in graphs or not _rng_state_saved(graphs["fw"]):
                raise
    return graphs["fw"], graphs.get("bw")


def _rng_state_saved(gm):
    """Whether gm runs a flashattn_cu forward under AOTAutograd's run_and_save_rng_state."""
    ops = (torch.ops.flashattn_cu.fwd.default, torch.ops.flashattn_cu.fwd_varlen.default)
    return any(n.op == "call_function" and "run_and_save_rng_state" in str(n.target) and
               any(a in ops for a in n.args) for n in gm.graph.nodes)


def _calls(gm, op):
    """The nodes of gm that call op (directly or through an RNG-state wrapper of AOTAutograd)."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and
            (n.target is op or any(a is op for a in n.args))]


def test_ops_are_tagged_as_seeded_random():
    """The forwards draw from torch's generator, so they carry torch.Tag.nondeterministic_seeded
    (as SDPA's flash op): torch.compile must not merge or freely recompute them."""
    for op in (torch.ops.flashattn_cu.fwd.default, torch.ops.flashattn_cu.fwd_varlen.default):
        assert torch.Tag.nondeterministic_seeded in op.tags, op
    assert torch.Tag.nondeterministic_seeded not in torch.ops.flashattn_cu.bwd.default.tags


@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_compile_keeps_two_identical_dropout_calls(dropout_p):
    """Two identical calls in one compiled step (R-Drop, consistency losses) stay two calls, each
    drawing its own mask; common-subexpression elimination merged them before the tag."""
    q, k, v = (torch.randn(2, 9, 4, 64, device="meta", dtype=F16, requires_grad=True)
               for _ in range(3))

    def step(q, k, v):
        return (flash_attn_func(q, k, v, dropout_p=dropout_p).float().sum() +
                flash_attn_func(q, k, v, dropout_p=dropout_p).float().sum())

    if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 14):
        # torch 2.11's common-subexpression pass merges them despite the tag (measured on the
        # H200's torch 2.11): a limitation of that torch (README), not checked there.
        pytest.skip("torch < 2.14 merges identical seeded custom ops (README: dropout)")
    fw, _ = _compiled_graphs(step, q, k, v)
    assert len(_calls(fw, torch.ops.flashattn_cu.fwd.default)) == 2


def test_compile_checkpoint_replays_the_dropout_forward_with_its_rng_state():
    """Under torch.compile with activation checkpointing, a dropout forward that the backward
    recomputes must regenerate the forward's mask: the partitioner either saves its outputs or
    runs it with the generator state it first ran with (run_and_save_rng_state in the forward
    graph, run_with_rng_state in the backward). Before the op carried the seeded tag the
    backward graph recomputed it plainly, drawing a fresh offset: gradients of another mask."""
    from torch.utils.checkpoint import checkpoint

    q, k, v = (torch.randn(2, 9, 4, 64, device="meta", dtype=F16, requires_grad=True)
               for _ in range(3))

    def step(q, k, v):
        def block(q, k, v):
            return flash_attn_func(q * 2, k, v, dropout_p=0.1).float().sin()
        return checkpoint(block, q, k, v, use_reentrant=False).sum()

    fw, bw = _compiled_graphs(step, q, k, v)
    if bw is not None:
        plain = [n for n in _calls(bw, torch.ops.flashattn_cu.fwd.default)
                 if n.target is torch.ops.flashattn_cu.fwd.default]
        assert not plain, "the dropout forward recomputed without its RNG state"
    else:
        assert _rng_state_saved(fw)
