"""GPU tests of the backward pass (dq, dk, dv) against the fp32 reference.

Rule: max|dx - dx_ref| <= 3 * max|dx_pt - dx_ref| + 1e-4, dx_ref from fp32 autograd through
attention_ref, dx_pt from the same autograd in the input dtype. Outputs (and the workspace) are
poisoned before the kernels run (conftest). Budget: a few minutes on one H200.
"""

import pytest
import torch

import attn_helpers
from attn_helpers import (DTYPES, HEAD_DIMS, HEADS, assert_rule, instance_for, kv_splits,
                          make_qkv)
from flashattn_cu import _C, flash_attn_func
from flashattn_cu.testing import attention_ref, kernel_path, poison_outputs

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True, params=attn_helpers.kernel_paths())
def path(request):
    with kernel_path(request.param):
        yield request.param

BWD_SEQLEN_PAIRS = [(1, 239), (113, 203), (128, 217), (512, 256), (3, 799), (239, 1), (799, 3),
                    (1023, 1024)]


def built(head_dim):
    return instance_for(head_dim) in _C.built_head_dims()


def skip_unless_bwd(head_dim):
    """Skips only when the head-dim instance was deliberately left out of the build
    (FLASHATTN_CU_HEAD_DIMS); any failure of a built one is a test failure."""
    if not built(head_dim):
        pytest.skip(f"head dim instance {instance_for(head_dim)} not in this build")


def grads(out, inputs, dout):
    return torch.autograd.grad(out, inputs, dout)


def reference_grads(q, k, v, dout, **mask):
    """The rule's references: attention_ref's output in fp32 (ref) and in the input dtype (pt),
    and the gradients of each for dout (refs, pts); mask: attention_ref's causal / window_size."""
    ref, _ = attention_ref(q, k, v, **mask)
    pt, _ = attention_ref(q, k, v, upcast=False, **mask)
    return ref, pt, grads(ref, (q, k, v), dout.float()), grads(pt, (q, k, v), dout)


def check_backward(q, k, v, causal, dout=None, deterministic=False):
    """Forward + backward through flash_attn_func; checks dq, dk, dv (and out) by the rule."""
    out = flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
    if dout is None:
        dout = torch.randn_like(out)
    ref, pt, refs, pts = reference_grads(q, k, v, dout, causal=causal)
    assert_rule(out, ref, pt, 2, 1e-5, "out")
    ours = grads(out, (q, k, v), dout)
    for name, g, r, p, x in zip(("dq", "dk", "dv"), ours, refs, pts, (q, k, v)):
        assert g.shape == x.shape and g.dtype == x.dtype, name
        assert_rule(g, r, p, 3, 1e-4, name)
    return ours


@pytest.mark.parametrize("seqlen_q, seqlen_k", BWD_SEQLEN_PAIRS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_backward_grid(dtype, head_dim, causal, seqlen_q, seqlen_k):
    skip_unless_bwd(head_dim)
    kind = list(HEADS)[(HEAD_DIMS.index(head_dim) + BWD_SEQLEN_PAIRS.index((seqlen_q, seqlen_k)))
                       % 3]
    nheads, nheads_k = HEADS[kind]
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype,
                       requires_grad=True)
    check_backward(q, k, v, causal)


@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_backward_heads(dtype, head_dim, causal, heads):
    skip_unless_bwd(head_dim)
    nheads, nheads_k = HEADS[heads]
    q, k, v = make_qkv(2, 333, 517, nheads, nheads_k, head_dim, dtype, requires_grad=True)
    check_backward(q, k, v, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_2048(causal):
    skip_unless_bwd(128)
    q, k, v = make_qkv(1, 2048, 2048, 6, 2, 128, torch.bfloat16, requires_grad=True)
    check_backward(q, k, v, causal)


# The sm90a backward walks a causal call's key tiles longest first over all tiles from 8k keys
# at d 128 and past 8k at d 64 (tiles.h bwd_causal_lpt_sm90: every key block deferred, key
# block 0 of every head first), head after head below: both sides, GQA, by the rule.
@pytest.mark.parametrize("head_dim, seqlen", [(64, 8192), (64, 8200), (128, 8000), (128, 8200)])
def test_backward_causal_tile_orders(head_dim, seqlen):
    skip_unless_bwd(head_dim)
    q, k, v = make_qkv(1, seqlen, seqlen, 4, 2, head_dim, torch.bfloat16, requires_grad=True)
    check_backward(q, k, v, True)


@pytest.mark.parametrize("layout", ["half_last_dim", "transposed", "expand_from_sum"])
def test_non_contiguous_dout(layout):
    skip_unless_bwd(64)
    q, k, v = make_qkv(2, 150, 190, 4, 2, 64, torch.float16, requires_grad=True)
    shape = (2, 150, 4, 64)
    if layout == "half_last_dim":
        dout = torch.randn(*shape[:-1], 128, device=attn_helpers.DEVICE, dtype=torch.float16)[..., ::2]
    elif layout == "transposed":
        dout = torch.randn(2, 4, 150, 64, device=attn_helpers.DEVICE, dtype=torch.float16).transpose(1, 2)
    else:
        dout = torch.ones(1, device=attn_helpers.DEVICE, dtype=torch.float16).expand(shape)  # out.sum()
    check_backward(q, k, v, causal=True, dout=dout)


def test_grad_through_sum():
    skip_unless_bwd(64)
    q, k, v = make_qkv(2, 100, 120, 4, 4, 64, torch.bfloat16, requires_grad=True)
    flash_attn_func(q, k, v, causal=True).sum().backward()
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    attention_ref(qr, kr, vr, causal=True)[0].sum().backward()
    for g, r in ((q.grad, qr.grad), (k.grad, kr.grad), (v.grad, vr.grad)):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g.float(), r.float(), atol=5e-2, rtol=5e-2)


def test_padded_head_dim_grads():
    """head dim 59 is zero-padded to 64: gradients come back with 59 columns."""
    skip_unless_bwd(59)
    q, k, v = make_qkv(2, 77, 91, 4, 1, 59, torch.float16, requires_grad=True)
    dq, dk, dv = check_backward(q, k, v, causal=False)
    assert dq.shape[-1] == dk.shape[-1] == dv.shape[-1] == 59


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_deterministic_bitwise(dtype, causal):
    """deterministic=True: dq, dk, dv bitwise identical over 50 reruns (GQA, so dk/dv sum over
    a head group, and several KV blocks per query block, so dq sums over blocks)."""
    skip_unless_bwd(128)
    q, k, v = make_qkv(2, 1024, 1024, 8, 2, 128, dtype, requires_grad=True)
    out = flash_attn_func(q, k, v, causal=causal, deterministic=True)
    dout = torch.randn_like(out)
    first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    for _ in range(49):
        again = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), f"{name} differs between runs with deterministic=True"


@pytest.mark.parametrize("head_dim", [64, 59])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_compile_forward_backward(dtype, head_dim):
    """torch.compile(fullgraph=True) of the forward; the backward then runs the AOT-autograd
    compiled backward graph. Both must match eager (deterministic=True on both sides)."""
    skip_unless_bwd(head_dim)
    torch._dynamo.reset()
    q, k, v = make_qkv(2, 200, 260, 4, 2, head_dim, dtype, requires_grad=True)
    dout = torch.randn(2, 200, 4, head_dim, device=attn_helpers.DEVICE, dtype=dtype)

    @torch.compile(fullgraph=True)
    def loss_fn(q, k, v):
        out = flash_attn_func(q, k, v, causal=True, deterministic=True)
        return out, (out.float() * dout.float()).sum()

    out_c, loss_c = loss_fn(q, k, v)
    grads_c = torch.autograd.grad(loss_c, (q, k, v))
    out_e = flash_attn_func(q, k, v, causal=True, deterministic=True)
    grads_e = torch.autograd.grad((out_e.float() * dout.float()).sum(), (q, k, v))
    assert torch.equal(out_c, out_e)
    for name, c, e in zip(("dq", "dk", "dv"), grads_c, grads_e):
        torch.testing.assert_close(c, e, atol=1e-3, rtol=1e-3, msg=lambda m: f"{name}: {m}")
    _, _, refs, pts = reference_grads(q, k, v, dout, causal=True)
    for name, c, r, p in zip(("dq", "dk", "dv"), grads_c, refs, pts):
        assert_rule(c, r, p, 3, 1e-4, f"compiled {name}")


def capture_training_step(step, leaves):
    """step() (a forward + backward into leaves' .grad) warmed up on a side stream, as CUDA
    graphs require, then captured: (graph, step's captured return value)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            for t in leaves:
                t.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in leaves:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    return graph, static


def replay_on_new_inputs(graph, static_out, leaves, dout):
    """Fresh random values into the captured leaves and dout, one replay: [out] + the leaves'
    gradients, cloned."""
    with torch.no_grad():
        for t in leaves:
            t.copy_(torch.randn_like(t))
    dout.copy_(torch.randn_like(dout))
    graph.replay()
    torch.cuda.synchronize()
    return [static_out.clone()] + [t.grad.clone() for t in leaves]


def test_cuda_graph_training_step():
    """Forward + backward captured in a CUDA graph and replayed on new data equals eager."""
    skip_unless_bwd(128)
    q, k, v = make_qkv(2, 512, 512, 8, 2, 128, torch.bfloat16, requires_grad=True)
    dout = torch.randn(2, 512, 8, 128, device=attn_helpers.DEVICE, dtype=torch.bfloat16)

    def step():
        out = flash_attn_func(q, k, v, causal=True, deterministic=True)
        out.backward(dout)
        return out

    graph, static_out = capture_training_step(step, (q, k, v))
    replayed = replay_on_new_inputs(graph, static_out, (q, k, v), dout)

    qe, ke, ve = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out_e = flash_attn_func(qe, ke, ve, causal=True, deterministic=True)
    out_e.backward(dout)
    for name, r, e in zip(("out", "dq", "dk", "dv"), replayed, (out_e, qe.grad, ke.grad, ve.grad)):
        assert torch.equal(r, e), f"{name}: graph replay differs from eager"


def test_empty_and_keyless_grads():
    skip_unless_bwd(64)
    # seqlen_q = 0: no gradient reaches k, v.
    q, k, v = make_qkv(2, 0, 40, 4, 2, 64, torch.float16, requires_grad=True)
    dq, dk, dv = grads(flash_attn_func(q, k, v), (q, k, v),
                       torch.empty(2, 0, 4, 64, device=attn_helpers.DEVICE, dtype=torch.float16))
    assert dq.shape == q.shape and (dk == 0).all() and (dv == 0).all()
    # seqlen_k = 0: the output is constant 0, so dq = 0.
    q, k, v = make_qkv(2, 30, 0, 4, 2, 64, torch.float16, requires_grad=True)
    dq, dk, dv = grads(flash_attn_func(q, k, v), (q, k, v),
                       torch.randn(2, 30, 4, 64, device=attn_helpers.DEVICE, dtype=torch.float16))
    assert (dq == 0).all() and dk.shape == k.shape and dv.shape == v.shape


@pytest.mark.parametrize("varlen", [False, True])
def test_no_zero_gradient_for_the_lse(varlen):
    """softmax_lse is not differentiable: autograd must not fill a zero gradient for it before
    the backward (a fill kernel on every training step), and the gradients stay right."""
    skip_unless_bwd(64)
    q, k, v = make_qkv(2, 200, 200, 4, 2, 64, torch.bfloat16, requires_grad=True)
    dout = torch.randn_like(q)
    if varlen:
        from flashattn_cu import flash_attn_varlen_func
        cu = torch.tensor([0, 200, 400], dtype=torch.int32, device=q.device)
        flat = [t.reshape(400, *t.shape[2:]) for t in (q, k, v)]

        def step():
            out, _lse, _ = flash_attn_varlen_func(*flat, cu, cu, 200, 200, causal=True,
                                                  return_attn_probs=True)
            return torch.autograd.grad(out, (q, k, v), dout.reshape(400, 4, 64))
    else:
        def step():
            out, _lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
            return torch.autograd.grad(out, (q, k, v), dout)

    with poison_outputs(False):  # the poisoning's own fills
        step()
        names = attn_helpers.kernel_names(step)
    assert names and not [n for n in names if "FillFunctor" in n], names
    ours = step()
    _, _, refs, pts = reference_grads(q, k, v, dout, causal=True)
    for name, g, r, p in zip(("dq", "dk", "dv"), ours, refs, pts):
        assert_rule(g, r, p, 3, 1e-4, name)


@pytest.mark.parametrize("with_stats", [False, True])
def test_opcheck_bwd(with_stats):
    skip_unless_bwd(64)
    q, k, v = make_qkv(2, 65, 80, 4, 2, 64, torch.float16)
    out, lse, stats, *_ = torch.ops.flashattn_cu.fwd(q, k, v, 0.125, True)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.flashattn_cu.bwd.default,
                          (dout, q, k, v, out, lse, 0.125, True, True) + ((stats,) if with_stats
                                                                          else ()),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "packed"])
def test_real_output_layout_matches_fake(layout):
    """The ops allocate outputs and gradients with the strides their fake implementations
    promise (torch.compile'd graphs assert them), for dense and non-dense inputs."""
    skip_unless_bwd(64)
    q = attn_helpers.layouts(attn_helpers.DEVICE)[layout].normal_()
    k, v = torch.randn_like(q), torch.randn_like(q)
    out, lse, *_ = torch.ops.flashattn_cu.fwd(q, k, v, 0.125, True)
    dq, dk, dv = torch.ops.flashattn_cu.bwd(torch.randn_like(out), q, k, v, out, lse, 0.125, True,
                                            False)
    metas = [t.to("meta") for t in (q, k, v)]
    fake_out, fake_lse, *_ = torch.ops.flashattn_cu.fwd(*metas, 0.125, True)
    fakes = torch.ops.flashattn_cu.bwd(fake_out, *metas, fake_out, fake_lse, 0.125, True, False)
    assert out.stride() == fake_out.stride()
    assert [g.stride() for g in (dq, dk, dv)] == [f.stride() for f in fakes]
    ref, _ = attention_ref(q, k, v, causal=True)
    pt, _ = attention_ref(q, k, v, causal=True, upcast=False)
    assert_rule(out, ref, pt, 2, 1e-5, f"out ({layout})")


def test_long_context_memory_is_linear():
    """seqlen 32k, 16 heads, d 128, bf16, causal: forward + backward within a small multiple of
    the inputs' size (naive attention would need 32 GiB for one bf16 score matrix)."""
    skip_unless_bwd(128)
    seqlen, nheads, head_dim = 32768, 16, 128
    q, k, v = make_qkv(1, seqlen, seqlen, nheads, nheads, head_dim, torch.bfloat16,
                       requires_grad=True)
    dout = torch.randn_like(q)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = flash_attn_func(q, k, v, causal=True)
    out.backward(dout)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    tensor_bytes = q.numel() * q.element_size()  # 128 MiB
    naive_bytes = nheads * seqlen * seqlen * 2
    # out, lse, dq, dk, dv and the (fp32 dq accumulator) workspace: ~ a dozen tensors of q's size.
    assert peak < 16 * tensor_bytes, f"peak {peak / 2**20:.0f} MiB"
    assert peak < naive_bytes / 16
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    # The last 64 query rows against the full reference (bottom-right causal alignment).
    rows = slice(seqlen - 64, seqlen)
    ref, _ = attention_ref(q.detach()[:, rows], k.detach(), v.detach(), causal=True)
    pt, _ = attention_ref(q.detach()[:, rows], k.detach(), v.detach(), causal=True, upcast=False)
    assert_rule(out.detach()[:, rows], ref, pt, 2, 1e-5, "out[-64:]")


def test_sm90_backward_is_dispatched(path):
    """On H100/H200 the default path runs the wgmma kernel for d = 128 (and the sm80 path does
    not): the benchmark numbers are those of the kernel we think they are."""
    if torch.cuda.get_device_capability() != (9, 0) or 90 not in _C.built_archs():
        pytest.skip("needs an sm_90 GPU and a build with sm_90a")
    skip_unless_bwd(128)
    q, k, v = make_qkv(1, 256, 256, 2, 2, 128, torch.bfloat16, requires_grad=True)
    out = flash_attn_func(q, k, v)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out.sum().backward()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()
             if "bwd_kernel" in e.name or "bwd_ws_kernel" in e.name]  # (a warp-specialized build)
    assert names, "no backward kernel seen by the profiler"
    uses_sm90 = any("sm90" in n for n in names)
    assert uses_sm90 == (path == "auto"), names


# --------------------------------------------------------------------------------------------
# GQA/MQA: one thread block summing several query heads into dK/dV, and head groups cut into
# kv_splits parts whose partial sums the postprocess adds (bwd_kv_splits in bwd/params.h).

GQA_SPLIT_CASES = {
    # name: (batch, seqlen_q, seqlen_k, nheads, nheads_k), and the (kv_splits, heads per split)
    # each must reach; checked against the mirror of bwd_kv_splits so the case cannot drift.
    "one_block_sums_group": ((4, 200, 4096, 8, 2), (1, 4)),
    "split_in_two_of_four": ((1, 190, 8192, 8, 2), (2, 2)),
    "mqa_split_8_of_16": ((2, 150, 2048, 16, 1), (8, 2)),
}


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("case", list(GQA_SPLIT_CASES))
def test_backward_gqa_head_splits(case, head_dim, causal, deterministic):
    skip_unless_bwd(head_dim)
    (batch, sq, sk, h, hk), (splits, per_split) = GQA_SPLIT_CASES[case]
    assert kv_splits(batch, h, hk, sk) == splits and (h // hk) // splits == per_split
    q, k, v = make_qkv(batch, sq, sk, h, hk, head_dim, torch.bfloat16, requires_grad=True)
    check_backward(q, k, v, causal, deterministic=deterministic)


# --------------------------------------------------------------------------------------------
# deterministic=True against the reference over the grid (the sm80 dQ kernel, both main-kernel
# paths, the d = 256 split kernel), and its bitwise reproducibility.


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(113, 203), (512, 256), (3, 799), (799, 3)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 160, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_deterministic_grid(dtype, head_dim, causal, seqlen_q, seqlen_k):
    skip_unless_bwd(head_dim)
    nheads, nheads_k = HEADS[list(HEADS)[[32, 64, 96, 128, 160, 256].index(head_dim) % 3]]
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype,
                       requires_grad=True)
    check_backward(q, k, v, causal, deterministic=True)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_default_path_dkdv_bitwise(head_dim):
    """Without deterministic=True only dQ uses atomics: dK and dV are summed in registers (and
    head-split partials in order), so they must be bitwise the same on every rerun."""
    skip_unless_bwd(head_dim)
    q, k, v = make_qkv(2, 700, 900, 8, 2, head_dim, torch.bfloat16, requires_grad=True)
    out = flash_attn_func(q, k, v, causal=True)
    dout = torch.randn_like(out)
    first = torch.autograd.grad(out, (k, v), dout, retain_graph=True)
    for _ in range(10):
        again = torch.autograd.grad(out, (k, v), dout, retain_graph=True)
        for name, a, b in zip(("dk", "dv"), first, again):
            assert torch.equal(a, b), f"{name} differs between reruns on the default path"


def test_backward_runs_on_current_stream():
    """dout is written on a side stream after a ~50 ms sleep kernel; the backward op, called on
    that stream, must see it (a launch on another stream would read dout before it is written).
    The op is called directly: autograd would run it on the forward's stream instead."""
    skip_unless_bwd(128)
    q, k, v = make_qkv(2, 1024, 1024, 8, 2, 128, torch.bfloat16)
    scale = 128 ** -0.5
    out, lse, stats, *_ = torch.ops.flashattn_cu.fwd(q, k, v, scale, True)
    dout_src = torch.randn_like(out)
    expected = torch.ops.flashattn_cu.bwd(dout_src, q, k, v, out, lse, scale, True, True, stats)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)
        dout = dout_src * 1
        got = torch.ops.flashattn_cu.bwd(dout, q, k, v, out, lse, scale, True, True, stats)
        done = torch.cuda.Event()
        done.record(stream)
    assert not done.query(), "the sleep kernel did not delay the stream; the test proves nothing"
    torch.cuda.current_stream().wait_stream(stream)
    for name, g, e in zip(("dq", "dk", "dv"), got, expected):
        assert torch.equal(g, e), name


# --------------------------------------------------------------------------------------------
# The sm90a backward's streamed dQ convert (bwd/pipeline.h): each 64-row block of the fp32
# accumulator goes to dq once every key tile that may add to it has set its flag, on the SMs the
# main kernel's last tiles leave idle. Shapes with many more tiles than SMs (the convert runs
# under the main kernel), both tile orders (head after head; a causal call's longest first,
# block after block), windows on one or both sides, GQA with head splits, sq != sk both ways,
# against the reference and against the convert after the main kernel (dK / dV bitwise: the
# convert does not touch them). The workspace is poisoned (conftest): flags read before the
# preprocess cleared them would convert early and fail the rule.

STREAM_CASES = {
    # name: (batch, seqlen_q, seqlen_k, nheads, nheads_k, causal, window_size)
    "window_many_tiles": (2, 3000, 3000, 8, 8, True, (300, 0)),
    "window_both_sides": (2, 1500, 1300, 4, 4, False, (200, 100)),
    "causal_longest_first": (1, 8200, 8200, 4, 2, True, (-1, -1)),
    "causal_many_tiles": (4, 2048, 2048, 16, 16, True, (-1, -1)),
    "noncausal_gqa": (3, 1000, 1500, 6, 2, False, (-1, -1)),
    "gqa_head_splits": (1, 190, 8192, 8, 2, False, (-1, -1)),
    "short_q_long_k": (2, 65, 4000, 4, 4, True, (-1, -1)),
    "long_q_short_k": (2, 4000, 100, 4, 4, True, (-1, -1)),
}


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("case", list(STREAM_CASES))
@pytest.mark.parametrize("path", ["auto"], indirect=True)  # the default path only: no sm80 half
def test_streamed_dq_convert(case, head_dim, path):
    from flashattn_cu.testing import bwd_streamed_dq

    if torch.cuda.get_device_capability() != (9, 0) or 90 not in _C.built_archs():
        pytest.skip("the sm90a backward's postprocess (an sm_90 GPU)")
    skip_unless_bwd(head_dim)
    batch, sq, sk, h, hk, causal, window = STREAM_CASES[case]
    q, k, v = make_qkv(batch, sq, sk, h, hk, head_dim, torch.bfloat16, requires_grad=True)
    out = flash_attn_func(q, k, v, causal=causal, window_size=window)
    dout = torch.randn_like(out)
    got = {}
    for streamed in (False, True):
        with bwd_streamed_dq(streamed):
            got[streamed] = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    for name, a, b in zip(("dk", "dv"), got[False][1:], got[True][1:]):
        assert torch.equal(a, b), f"{name} differs with the streamed dQ convert"
    _, _, refs, pts = reference_grads(q, k, v, dout, causal=causal, window_size=window)
    for streamed in (False, True):
        for name, g, r, p in zip(("dq", "dk", "dv"), got[streamed], refs, pts):
            assert_rule(g, r, p, 3, 1e-4, f"{name} (streamed {streamed})")


@pytest.mark.parametrize("path", ["auto"], indirect=True)  # the default path only: no sm80 half
def test_streamed_dq_convert_in_a_cuda_graph(path):
    """The streamed dQ convert captured in a CUDA graph (the main kernel -> postprocess edge
    programmatic, the flags cleared by the captured preprocess on every replay): two replays on
    new data equal the eager streamed backward (dK / dV bitwise, dQ within the fp32 additions'
    order), and a reduction of dK captured right behind the backward sees the finished dK (the
    convert's blocks wait for the main kernel's end before they exit)."""
    from flashattn_cu.testing import bwd_streamed_dq

    if torch.cuda.get_device_capability() != (9, 0) or 90 not in _C.built_archs():
        pytest.skip("the sm90a backward's postprocess (an sm_90 GPU)")
    skip_unless_bwd(128)
    # MHA with 256 key tiles: kv_splits 1, so the postprocess has no dK / dV job whose blocks
    # would wait for the main kernel anyway (bwd/params.h bwd_kv_splits).
    batch, seqlen, heads, d = 2, 2048, 8, 128
    assert kv_splits(batch, heads, heads, seqlen) == 1
    q, k, v = make_qkv(batch, seqlen, seqlen, heads, heads, d, torch.bfloat16, requires_grad=True)
    dout = torch.randn(batch, seqlen, heads, d, device=attn_helpers.DEVICE, dtype=torch.bfloat16)

    def step():
        out = flash_attn_func(q, k, v, causal=True, window_size=(300, 0))
        out.backward(dout)
        return out, k.grad.float().sum(dim=(0, 1))

    with bwd_streamed_dq(True):
        graph, (static_out, static_dk_sum) = capture_training_step(step, (q, k, v))
        for _ in range(2):
            replayed = replay_on_new_inputs(graph, static_out, (q, k, v), dout)
            assert torch.equal(static_dk_sum, replayed[2].float().sum(dim=(0, 1))), \
                "a kernel captured behind the backward read dK before it was finished"
            qe, ke, ve = (t.detach().clone().requires_grad_() for t in (q, k, v))
            out_e = flash_attn_func(qe, ke, ve, causal=True, window_size=(300, 0))
            out_e.backward(dout)
            for name, r, e in zip(("out", "dk", "dv"), (replayed[0], replayed[2], replayed[3]),
                                  (out_e, ke.grad, ve.grad)):
                assert torch.equal(r, e), f"{name}: graph replay differs from eager"
            scale = qe.grad.float().abs().max().item()
            assert (replayed[1].float() - qe.grad.float()).abs().max().item() <= 1e-2 * scale, \
                "dq: graph replay differs from eager beyond the additions' order"


# --------------------------------------------------------------------------------------------
# Double backward: not supported, and never silently wrong.


def test_double_backward_raises_by_name():
    skip_unless_bwd(64)
    q, k, v = make_qkv(2, 64, 80, 4, 2, 64, torch.float16, requires_grad=True)
    out = flash_attn_func(q, k, v, causal=True)
    dq, dk, dv = torch.autograd.grad(out.float().square().sum(), (q, k, v), create_graph=True)
    # First-order results are the same as without create_graph.
    ref = torch.autograd.grad(flash_attn_func(q, k, v, causal=True).float().square().sum(),
                              (q, k, v))
    for g, r in zip((dq, dk, dv), ref):
        assert torch.equal(g, r)
    with pytest.raises(RuntimeError, match="flash_attn_func has no double backward"):
        (dq.float().square().sum() + dk.float().sum()).backward()


def test_create_graph_without_second_backward_is_fine():
    """create_graph=True for some other part of a model must not break the attention gradient."""
    skip_unless_bwd(64)
    q, k, v = make_qkv(1, 32, 48, 2, 2, 64, torch.bfloat16, requires_grad=True)
    w = torch.randn(64, device=attn_helpers.DEVICE, dtype=torch.bfloat16, requires_grad=True)
    loss = (flash_attn_func(q * w, k, v) * w).float().sum()
    gw, = torch.autograd.grad(loss, (w,), create_graph=True)
    assert gw.shape == w.shape and torch.isfinite(gw).all()
