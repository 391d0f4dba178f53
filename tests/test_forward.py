"""GPU tests of the forward pass against the fp32 reference.

Rule (flash_attn's): max|out - ref| <= 2 * max|pt - ref| + 1e-5, ref = fp32 attention on the same
inputs, pt = the same math in the input dtype. Outputs are poisoned with NaN before the kernel
(conftest), so unwritten elements fail. Budget: a few minutes on one H200.
"""

import pytest
import torch

import attn_helpers
from attn_helpers import (DTYPES, HEAD_DIMS, HEADS, SEQLEN_PAIRS, assert_lse_rule, assert_rule,
                          attention_fp32_scores, instance_for, make_qkv)
from flashattn_cu import _C, flash_attn_func
from flashattn_cu.testing import attention_ref, kernel_path

pytestmark = pytest.mark.gpu


# Every test on each kernel family the GPU has (attn_helpers.kernel_paths): on an H200 the
# sm90a forward (TMA + wgmma, the head dims of tiles.h's fwd_tile_sm90) and the sm80 one.
@pytest.fixture(autouse=True, params=attn_helpers.kernel_paths())
def path(request):
    with kernel_path(request.param):
        yield request.param


def built(head_dim):
    return instance_for(head_dim) in _C.built_head_dims()


def skip_unless_built(head_dim):
    if not built(head_dim):
        pytest.skip(f"head dim instance {instance_for(head_dim)} not in this build")


def check_forward(q, k, v, causal, softmax_scale=None, batch_rows=None):
    """Runs flash_attn_func and checks out and lse against the reference."""
    out, lse, s_dmask = flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal,
                                        return_attn_probs=True)
    assert s_dmask is None
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    ref, lse_ref = attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale)
    pt, lse_pt = attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale, upcast=False)
    assert_rule(out, ref, pt, 2, 1e-5, "out")
    assert_lse_rule(lse, lse_ref, lse_pt)
    return out, lse


# --------------------------------------------------------------------------------------------
# The main grid: every head dim x dtype x causal x seqlen pair, heads cycling MHA/GQA/MQA, and
# all three head layouts on a smaller set of pairs (so the grid is thorough without a full
# cartesian product at 2048).


@pytest.mark.parametrize("seqlen_q, seqlen_k", SEQLEN_PAIRS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_forward_grid(dtype, head_dim, causal, seqlen_q, seqlen_k):
    skip_unless_built(head_dim)
    kind = list(HEADS)[(HEAD_DIMS.index(head_dim) + SEQLEN_PAIRS.index((seqlen_q, seqlen_k))) % 3]
    nheads, nheads_k = HEADS[kind]
    batch = 1 if seqlen_q * seqlen_k >= 1 << 20 else 2
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype)
    check_forward(q, k, v, causal)


@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(113, 203), (239, 1), (1023, 1024), (3, 799)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [59, 64, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_forward_heads(dtype, head_dim, causal, seqlen_q, seqlen_k, heads):
    skip_unless_built(head_dim)
    nheads, nheads_k = HEADS[heads]
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype)
    check_forward(q, k, v, causal)


# The sm90a forward picks its tile by the call (tiles.h fwd_short_rows_sm90): causal calls of at
# most 1024 (d = 64), 2048 (d = 256; d = 128 with a score modifier) or 3072 (d = 128 plain) keys,
# d = 64 calls of at most 1024 query rows (256 when non-causal and plain) and d = 128 plain
# non-causal calls of at most 1536 keys take a narrower tile than longer ones. Both sides of each
# length, causal and not, sq != sk.
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(256, 700), (257, 300), (1024, 1024), (1025, 1025),
                                                (1000, 1100), (1500, 1536), (1536, 1537),
                                                (2048, 2048), (2049, 2049), (700, 3000),
                                                (3072, 3072), (3000, 3073)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_forward_tile_lengths(dtype, head_dim, causal, seqlen_q, seqlen_k):
    skip_unless_built(head_dim)
    q, k, v = make_qkv(1, seqlen_q, seqlen_k, 4, 2, head_dim, dtype)
    check_forward(q, k, v, causal)


# The sm90a forward's causal schedules (tiles.h fwd_causal_persistent_sm90 / fwd_causal_order_sm90):
# the persistent grid up to 16k keys at d 64, 12k at d 128 and above 1k up to 4k at d 256, in
# groups of heads that fwd_launch.h fwd_walk_group sizes for the walk's balance (within the L2's
# bound, or up to 4x it where none within balances); beyond, one CTA per tile in groups of heads
# whose K / V fit half the L2 (d 64 only where forced), longest first over all tiles (d 64 past
# 16k, d 256 from 4k to 8k) or head after head (d 128 past 12k, d 256 up to 1k keys and past 8k). Heads enough for several groups (40 heads: d 64 at 4.5k keys 2 L2 groups, d 128
# at 3.5k 3, on a 50 MB L2; 64 heads: d 64 at 2k and d 128 at 1k, 50 the L2's group, fewer the
# walk's; d 128 3k 80 heads and d 256 1.5k 32 heads: groups past the L2's on a 50 MB L2; d 128
# 10k 8 heads: groups of 2-4 heads on long rows); every tile written once (outputs poisoned) and
# right.
@pytest.mark.parametrize("head_dim, seqlen, nheads", [(64, 4500, 40), (64, 7000, 16),
                                                      (64, 9000, 4), (64, 2048, 64),
                                                      (64, 12500, 2),
                                                      (128, 1024, 64), (128, 3500, 40),
                                                      (128, 3000, 80), (128, 6000, 16),
                                                      (128, 10000, 8), (128, 12400, 2),
                                                      (256, 500, 64), (256, 1000, 48),
                                                      (256, 1500, 32), (256, 3000, 8),
                                                      (256, 4096, 16), (256, 9000, 2)])
def test_forward_causal_schedules(head_dim, seqlen, nheads):
    skip_unless_built(head_dim)
    q, k, v = make_qkv(1, seqlen, seqlen, nheads, nheads, head_dim, torch.bfloat16)
    check_forward(q, k, v, True)


# The schedules of a causal call (flashattn_cu.testing.fwd_causal_schedule: the persistent grid's
# walk and one CTA per tile, in whatever order tiles.h fwd_causal_order_sm90 gives the lengths,
# and that order with the dynamic scheduler allowed, testing.fwd_dynamic_tiles, which these
# padded calls' kernels do not take: the same per-tile grid; test_varlen.py has it against the
# static schedule)
# on shapes where the library takes either, with a left window, softcap and ALiBi (their own
# instances): each right against the reference, and all bitwise equal (every tile is the same
# code on the same data; only who computes it and when differs).
@pytest.mark.parametrize("head_dim, seqlen, nheads, mods", [
    (64, 1000, 12, {}), (64, 3000, 6, {}), (64, 7000, 2, {}), (64, 9000, 2, {}),
    (128, 1000, 12, {}), (128, 3000, 6, {}), (128, 3000, 4, {"window_size": (700, 0)}),
    (128, 2500, 4, {"softcap": 30.0}), (64, 2500, 4, {"alibi": True}),
    (256, 1000, 8, {}), (256, 2000, 10, {}), (256, 5000, 2, {}),
    (256, 2000, 4, {"window_size": (500, 0)})])
def test_forward_causal_schedules_agree(head_dim, seqlen, nheads, mods):
    from flashattn_cu.testing import fwd_causal_schedule, fwd_dynamic_tiles

    skip_unless_built(head_dim)
    q, k, v = make_qkv(1, seqlen, seqlen, nheads, nheads, head_dim, torch.bfloat16)
    kw, ulps = dict(mods), 0
    if kw.pop("alibi", False):  # float64 reference, fp32 scores as the baseline (test_alibi.py)
        slopes = torch.rand(nheads, device=q.device, dtype=torch.float32)
        kw["alibi_slopes"], ulps = slopes, 8
        ref, lse_ref = attention_ref(q.double(), k.double(), v.double(), causal=True,
                                     alibi_slopes=slopes.double())
        pt, lse_pt = attention_fp32_scores(q, k, v, causal=True, alibi_slopes=slopes,
                                           return_lse=True)
    else:
        ref, lse_ref = attention_ref(q, k, v, causal=True, **kw)
        pt, lse_pt = attention_ref(q, k, v, causal=True, upcast=False, **kw)
    outs = {}
    for schedule in ("persistent", "per_tile", "dynamic"):
        # dynamic: the per-tile order through the dynamic scheduler (a CTA per SM taking tiles
        # from a counter) where the kernel has it and the tiles outnumber the SMs
        with fwd_causal_schedule("per_tile" if schedule == "dynamic" else schedule), \
                fwd_dynamic_tiles(schedule == "dynamic"):
            out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True, **kw)
        assert_rule(out, ref, pt, 2, 1e-5, f"out ({schedule})")
        assert_lse_rule(lse, lse_ref, lse_pt, f"lse ({schedule})", fp32_ulps=ulps)
        outs[schedule] = (out, lse)
    for other in ("per_tile", "dynamic"):
        assert torch.equal(outs["persistent"][0], outs[other][0]), f"out differs ({other})"
        assert torch.equal(outs["persistent"][1], outs[other][1]), f"lse differs ({other})"


# Padded calls on the kernels that take the dynamic tile scheduler (those with sequence arrays,
# sm90/fwd_work.h fwd_published_tiles: dropout; softcap with ALiBi; softcap with a window),
# forced to one CTA per tile (flashattn_cu.testing.fwd_causal_schedule) on more tiles than SMs:
# with the scheduler (a CTA per SM, grid = the SM count, seen through torch's profiler) and
# without (grid = the tiles), out and lse bitwise equal (dropout from the same generator state);
# the window's and ALiBi's tiles store O from the registers over several tiles a CTA.
@pytest.mark.parametrize("head_dim, seqlen, nheads, mods", [
    (64, 2048, 16, {"dropout_p": 0.1}),
    (128, 3000, 8, {"softcap": 20.0, "alibi": True}),
    (128, 4000, 8, {"softcap": 30.0, "window_size": (500, 0)}),
])
def test_dynamic_schedule_on_padded_calls(head_dim, seqlen, nheads, mods, path):
    from flashattn_cu.testing import fwd_causal_schedule, fwd_dynamic_tiles

    skip_unless_built(head_dim)
    q, k, v = make_qkv(1, seqlen, seqlen, nheads, nheads, head_dim, torch.bfloat16)
    kw = dict(mods)
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.rand(nheads, device=q.device, dtype=torch.float32)
    outs, grids = [], []
    for dynamic in (True, False):
        def call():
            torch.cuda.manual_seed(20261206)
            with fwd_causal_schedule("per_tile"), fwd_dynamic_tiles(dynamic):
                outs.append(flash_attn_func(q, k, v, causal=True, return_attn_probs=True,
                                            **kw)[:2])
        grids.append(attn_helpers.kernel_grids(call, attn_helpers.SM90_FWD_KERNEL))
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    if path == "auto" and attn_helpers.sm90_built():
        assert [g[0] for g in grids[0]] == [sms], f"dynamic call's grids {grids[0]}, {sms} SMs"
        assert len(grids[1]) == 1 and grids[1][0][0] > sms, f"static call's grids {grids[1]}"
    else:
        assert grids[0] == grids[1] == [], (grids[0], grids[1])
    assert torch.equal(outs[0][0], outs[1][0]), (
        f"out differs by schedule: {(outs[0][0] - outs[1][0]).abs().max()}")
    assert torch.equal(outs[0][1], outs[1][1]), "lse differs by schedule"


# The sm90a forward aligns a causal call's query blocks to the last row (problem/mask.h
# Mask::query_block_shift: where every row's keys run from key 0 to an end growing with the row):
# the partial block is the first, starting up to 191 rows above row 0 (those rows load as zeros and
# are never stored), and walks fewest key blocks; not on the instances that store O by TMA (d 256, d
# 128's 128 x 128 tiles: sm90/fwd_launch.h fwd_m_shift). Shapes whose first block sits 1 .. 191 rows
# above 0 on the tiles of tiles.h (d 64 192 rows, 128 rows for short calls and the other dims; 1153
# = 6 x 192 + 1 = 9 x 128 + 1), sq > sk (rows without keys in the shifted block), a bounded right
# side without causal (shifted), a left window (not shifted), softcap (bf16: the bounded instances)
# and ALiBi; batch 2, so rows above a shifted block's 0 would be the previous entry's if its loads
# or stores were off; outputs poisoned (every row written once), LSE checked.
LAST_ALIGNED_MODS = {
    "causal": dict(causal=True),
    "right_window": dict(window_size=(-1, 37)),
    "left_window": dict(causal=True, window_size=(300, 0)),
    "softcap": dict(causal=True, softcap=30.0),
    "alibi": dict(causal=True, alibi="heads"),
}


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1153, 1153), (1000, 1100), (2001, 2001),
                                                (700, 300), (333, 1200)])
@pytest.mark.parametrize("mods", list(LAST_ALIGNED_MODS))
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_forward_last_aligned_blocks(head_dim, mods, seqlen_q, seqlen_k):
    skip_unless_built(head_dim)
    kw = dict(LAST_ALIGNED_MODS[mods])
    nheads, nheads_k = 4, 2
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, torch.bfloat16)
    if kw.pop("alibi", None):
        kw["alibi_slopes"] = torch.rand(nheads, device=q.device) * 0.5
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    ref, lse_ref = attention_ref(q, k, v, window_seqlen_k=seqlen_k, **kw)
    pt, lse_pt = attention_ref(q, k, v, upcast=False, window_seqlen_k=seqlen_k, **kw)
    pt, lse_pt = attn_helpers.with_tanh_approx(pt, lse_pt, ref, lse_ref, q, k, v,
                                               window_seqlen_k=seqlen_k, **kw)
    assert_rule(out, ref, pt, 2, 1e-5, f"out, {mods}")
    assert_lse_rule(lse, lse_ref, lse_pt, f"lse, {mods}")


@pytest.mark.parametrize("softmax_scale", [0.05, 0.3, 1.0])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_custom_softmax_scale(dtype, softmax_scale):
    skip_unless_built(64)
    q, k, v = make_qkv(2, 257, 300, 4, 2, 64, dtype)
    check_forward(q, k, v, causal=True, softmax_scale=softmax_scale)


# --------------------------------------------------------------------------------------------
# Layouts: strides the kernels take directly, and ones the binding must copy.


def layouts(batch, seqlen, nheads, head_dim, dtype):
    """Yields (name, tensor) for differently strided (batch, seqlen, nheads, head_dim) tensors."""
    shape = (batch, seqlen, nheads, head_dim)
    yield "contiguous", torch.randn(shape, device=attn_helpers.DEVICE, dtype=dtype)
    yield "bhsd_transposed", torch.randn(batch, nheads, seqlen, head_dim, device=attn_helpers.DEVICE,
                                         dtype=dtype).transpose(1, 2)
    yield "seqlen_slice", torch.randn(batch, seqlen + 13, nheads, head_dim, device=attn_helpers.DEVICE,
                                      dtype=dtype)[:, 5:5 + seqlen]
    yield "head_slice", torch.randn(batch, seqlen, nheads + 3, head_dim, device=attn_helpers.DEVICE,
                                    dtype=dtype)[:, :, 1:1 + nheads]
    yield "batch_stride", torch.randn(2 * batch, seqlen, nheads, head_dim, device=attn_helpers.DEVICE,
                                      dtype=dtype)[::2]
    # Row stride not a multiple of 8 elements: the binding copies to a contiguous tensor.
    yield "odd_row_stride", torch.randn(batch, seqlen, nheads, head_dim + 3, device=attn_helpers.DEVICE,
                                        dtype=dtype)[..., :head_dim]
    # Base pointer not 16-byte aligned: copied as well.
    flat = torch.randn(batch * seqlen * nheads * head_dim + 1, device=attn_helpers.DEVICE, dtype=dtype)
    yield "misaligned", flat[1:].view(shape)


LAYOUT_NAMES = ["contiguous", "bhsd_transposed", "seqlen_slice", "head_slice", "batch_stride",
                "odd_row_stride", "misaligned"]


@pytest.mark.parametrize("layout", LAYOUT_NAMES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_strided_inputs(layout, causal, head_dim):
    skip_unless_built(head_dim)
    dtype = torch.bfloat16
    q = dict(layouts(2, 177, 4, head_dim, dtype))[layout]
    k = dict(layouts(2, 250, 2, head_dim, dtype))[layout]
    v = dict(layouts(2, 250, 2, head_dim, dtype))[layout]
    check_forward(q, k, v, causal)


def test_packed_qkv_views():
    """q, k, v as views into one packed (batch, seqlen, 3, nheads, head_dim) tensor."""
    skip_unless_built(128)
    qkv = torch.randn(2, 300, 3, 8, 128, device=attn_helpers.DEVICE, dtype=torch.float16)
    q, k, v = qkv.unbind(2)
    check_forward(q, k, v, causal=True)


# --------------------------------------------------------------------------------------------
# Degenerate sizes


@pytest.mark.parametrize("batch, seqlen_q, seqlen_k", [(0, 16, 16), (2, 0, 16), (0, 0, 0),
                                                       (2, 0, 0)])
def test_empty_inputs(batch, seqlen_q, seqlen_k):
    skip_unless_built(64)
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, 4, 2, 64, torch.float16)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (batch, 4, seqlen_q)


@pytest.mark.parametrize("causal", [False, True])
def test_no_keys(causal):
    """seqlen_k = 0: every query sees no key -> output 0, lse +inf."""
    skip_unless_built(64)
    q, k, v = make_qkv(2, 37, 0, 4, 2, 64, torch.bfloat16)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert (out == 0).all()
    assert (lse == float("inf")).all()


def test_causal_rows_without_keys():
    """seqlen_q > seqlen_k with causal: the first seqlen_q - seqlen_k rows see no key."""
    skip_unless_built(64)
    q, k, v = make_qkv(2, 100, 30, 4, 4, 64, torch.float16)
    out, lse = check_forward(q, k, v, causal=True)
    assert (out[:, :70] == 0).all() and (lse[:, :, :70] == float("inf")).all()


def test_many_batch_heads_grid_limit():
    """batch * nheads > 65535 (the gridDim.y/z limit) with tiny sequences."""
    skip_unless_built(32)
    q, k, v = make_qkv(1100, 3, 5, 64, 16, 32, torch.float16)
    check_forward(q, k, v, causal=True)


# --------------------------------------------------------------------------------------------
# Execution context: compile, streams, devices, determinism, op registration


def test_compile_fullgraph_forward():
    skip_unless_built(64)
    torch._dynamo.reset()
    q, k, v = make_qkv(2, 129, 257, 4, 2, 59, torch.bfloat16)

    def attn(q, k, v):
        return flash_attn_func(q, k, v, causal=True)

    compiled = torch.compile(attn, fullgraph=True)
    out = compiled(q, k, v)
    assert torch.equal(out, attn(q, k, v))
    ref, _ = attention_ref(q, k, v, causal=True)
    pt, _ = attention_ref(q, k, v, causal=True, upcast=False)
    assert_rule(out, ref, pt, 2, 1e-5, "compiled out")


def test_runs_on_current_stream():
    """On a side stream, q is written only after a ~50 ms sleep kernel; the op, called on that
    stream, must read it after the write. A launch on any other stream (the legacy default one,
    or the stream current when the module loaded) would read q before it is written."""
    skip_unless_built(128)
    q_src, k, v = make_qkv(2, 1024, 1024, 8, 8, 128, torch.float16)
    expected = flash_attn_func(q_src, k, v)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time on this stream only
        q = q_src * 1  # allocated and written on `stream`, after the sleep
        out = flash_attn_func(q, k, v)
        done = torch.cuda.Event()
        done.record(stream)
    assert not done.query(), "the sleep kernel did not delay the stream; the test proves nothing"
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(out, expected)


def test_forward_is_deterministic():
    skip_unless_built(128)
    q, k, v = make_qkv(2, 1000, 1100, 8, 2, 128, torch.bfloat16)
    first = flash_attn_func(q, k, v, causal=True)
    for _ in range(5):
        assert torch.equal(flash_attn_func(q, k, v, causal=True), first)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_second_gpu():
    skip_unless_built(64)
    q, k, v = make_qkv(2, 200, 300, 4, 2, 64, torch.float16, device="cuda:1")
    out, _ = check_forward(q, k, v, causal=True)
    assert out.device == torch.device("cuda:1")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_different_gpus_rejected():
    q, k, v = make_qkv(1, 8, 8, 2, 2, 64, torch.float16)
    with pytest.raises(ValueError, match="k is on cuda:1 but q is on cuda:0"):
        flash_attn_func(q, k.to("cuda:1"), v)


def test_opcheck_fwd():
    skip_unless_built(64)
    q, k, v = make_qkv(2, 65, 80, 4, 2, 64, torch.float16)
    torch.library.opcheck(torch.ops.flashattn_cu.fwd.default, (q, k, v, 0.125, True),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_head_dim_not_built_reports_clearly():
    """A head-dim instance left out of the build, on the GPU: flash_attn_func's message and the
    ops' own (C++ dispatch) error. Needs a build without some instance; the message is checked
    on every build by test_api.py::test_head_dim_not_built_message (a pretend partial build)."""
    missing = [d for d in _C.head_dim_instances() if d not in _C.built_head_dims()]
    if not missing:
        pytest.skip("every head-dim instance is built (test_api.py checks the message on the CPU)")
    d = missing[0]
    q, k, v = make_qkv(1, 8, 8, 2, 2, d, torch.float16)
    with pytest.raises(RuntimeError, match=rf"unsupported head dim {d}: it runs on the head-dim "
                       rf"instance {d}, which this build does not have"):
        flash_attn_func(q, k, v)
    with pytest.raises(RuntimeError, match="fwd failed: unsupported head dim"):
        torch.ops.flashattn_cu.fwd(q, k, v, 0.125, False)
    out, lse = torch.zeros_like(q), torch.zeros(1, 2, 8, device=q.device)
    with pytest.raises(RuntimeError, match="bwd failed: unsupported head dim"):
        torch.ops.flashattn_cu.bwd(out, q, k, v, out, lse, 0.125, False, False)
