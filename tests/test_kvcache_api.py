"""flash_attn_with_kvcache (issue 10), CPU side: flash_attn 2.x's signature, argument errors by
name, shapes on fake and meta tensors (the op's fake implementation), torch.compile tracing of a
decode step; and examples/generate.py against SDPA (GPU). tests/test_kvcache.py has the GPU
cases against the reference.
"""

import inspect
from unittest import mock

import pytest
import torch

from api_helpers import pretend_gpu
from flashattn_cu import _C, flash_attn_with_kvcache
from flashattn_cu import flash_attn_interface as fai
from flashattn_cu import kvcache as kvc


def test_signature_is_flash_attns():
    """flash_attn 2.x's flash_attn_with_kvcache, parameter for parameter with its defaults."""
    params = inspect.signature(flash_attn_with_kvcache).parameters
    expected = [("q", inspect.Parameter.empty), ("k_cache", inspect.Parameter.empty),
                ("v_cache", inspect.Parameter.empty), ("k", None), ("v", None),
                ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
                ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
                ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
                ("softcap", 0.0), ("rotary_interleaved", True), ("alibi_slopes", None),
                ("num_splits", 0), ("return_softmax_lse", False)]
    assert [(n, p.default) for n, p in params.items()] == expected
    assert fai.flash_attn_with_kvcache is flash_attn_with_kvcache


def make_args(batch=2, seqlen_q=1, nheads=8, nheads_k=2, d=64, capacity=256, paged=None,
              dtype=torch.float16):
    q = torch.empty(batch, seqlen_q, nheads, d, dtype=dtype, device="cuda")
    if paged:
        pages = batch * capacity // paged
        k_cache = torch.empty(pages, paged, nheads_k, d, dtype=dtype, device="cuda")
        table = torch.empty(batch, capacity // paged, dtype=torch.int32, device="cuda")
    else:
        k_cache = torch.empty(batch, capacity, nheads_k, d, dtype=dtype, device="cuda")
        table = None
    return q, k_cache, torch.empty_like(k_cache), table


@pytest.mark.parametrize("paged", [None, 16, 100])
def test_shapes_on_fake_tensors(paged):
    with pretend_gpu():
        q, kc, vc, table = make_args(paged=paged)
        k = torch.empty(2, 1, 2, 64, dtype=torch.float16, device="cuda")
        seqlens = torch.empty(2, dtype=torch.int32, device="cuda")
        cos = torch.empty(256 if not paged else 400, 16, dtype=torch.float16, device="cuda")
        out, lse = flash_attn_with_kvcache(q, kc, vc, k, k, rotary_cos=cos, rotary_sin=cos,
                                           cache_seqlens=seqlens, block_table=table,
                                           causal=True, return_softmax_lse=True)
        assert out.shape == q.shape and out.dtype == q.dtype
        assert lse.shape == (2, 8, 1) and lse.dtype == torch.float32
        assert flash_attn_with_kvcache(q, kc, vc, cache_seqlens=5, block_table=table).shape == \
            q.shape


def _error_case(change):
    q, kc, vc, table = make_args(paged=16 if change.get("paged") else None)
    kwargs = dict(cache_seqlens=torch.empty(2, dtype=torch.int32, device="cuda"))
    args = [q, kc, vc]
    if "q" in change:
        args[0] = torch.empty(change["q"], dtype=torch.float16, device="cuda")
    if "q_dtype" in change:
        args[0] = q.float()
    if "cache_seqlens" in change:
        kwargs["cache_seqlens"] = change["cache_seqlens"]
    if "seqlens_dtype" in change:
        kwargs["cache_seqlens"] = torch.empty(2, dtype=torch.int64, device="cuda")
    if "k_only" in change:
        args.append(torch.empty(2, 1, 2, 64, dtype=torch.float16, device="cuda"))
    if "k_shape" in change:
        kn = torch.empty(change["k_shape"], dtype=torch.float16, device="cuda")
        args += [kn, kn]
    if change.get("paged"):
        kwargs["block_table"] = table
    if "table_dtype" in change:
        kwargs["block_table"] = table.long()
    if "batch_idx" in change:
        kwargs["cache_batch_idx"] = torch.empty(2, dtype=torch.int32, device="cuda")
    if "num_splits" in change:
        kwargs["num_splits"] = change["num_splits"]
    if "rotary" in change:
        kwargs["rotary_cos"] = kwargs["rotary_sin"] = torch.empty(*change["rotary"],
                                                                  dtype=torch.float16,
                                                                  device="cuda")
        kn = torch.empty(2, 1, 2, 64, dtype=torch.float16, device="cuda")
        args += [kn, kn]
    if "head_dim" in change:
        d = change["head_dim"]
        args = [torch.empty(2, 1, 8, d, dtype=torch.float16, device="cuda"),
                torch.empty(2, 256, 2, d, dtype=torch.float16, device="cuda"),
                torch.empty(2, 256, 2, d, dtype=torch.float16, device="cuda")]
    if "leftpad_shape" in change:
        kwargs["cache_leftpad"] = torch.empty(3, dtype=torch.int32, device="cuda")
    return args, kwargs


@pytest.mark.parametrize("change, error, message", [
    (dict(q=(2, 8, 64)), ValueError, r"q must have rank 4"),
    (dict(q_dtype=True), TypeError, r"q has dtype torch.float32"),
    (dict(seqlens_dtype=True), TypeError, r"cache_seqlens must be int32"),
    (dict(cache_seqlens=250, k_shape=(2, 10, 2, 64)), ValueError,
     r"cache_seqlens=250 with 10 new keys does not fit the cache of 256"),
    (dict(k_only=True), ValueError, r"k and v must be given together"),
    (dict(k_shape=(2, 3, 4, 64)), ValueError, r"k must have shape \(batch, seqlen_new"),
    (dict(paged=True, table_dtype=True), TypeError, r"block_table must be int32"),
    (dict(paged=True, batch_idx=True), ValueError, r"cache_batch_idx is not supported with a "
                                                   r"paged cache"),
    (dict(num_splits=129), ValueError, r"num_splits must be an int in \[0, 128\]"),
    (dict(num_splits=-1), ValueError, r"num_splits must be an int in \[0, 128\]"),
    (dict(rotary=(256, 20)), ValueError, r"rotary_dim = 2 \* rotary_cos.shape\[1\] = 40 must be"),
    (dict(rotary=(100, 16)), ValueError, r"rotary_cos has 100 positions; it needs at least"),
    (dict(head_dim=60), ValueError, r"head dim 60 is not supported"),
    # Past the largest instance: a ValueError naming it, never a StopIteration from the
    # instance lookup (a generator or map() around the call would end silently on that).
    (dict(head_dim=264), ValueError, r"head dim 264 is not supported"),
    (dict(head_dim=512), ValueError, r"head dim 512 is not supported"),
    (dict(leftpad_shape=True), ValueError, r"cache_leftpad must have shape \(2,\)"),
])
def test_argument_errors(change, error, message):
    with pretend_gpu():
        args, kwargs = _error_case(change)
        with pytest.raises(error, match=message):
            flash_attn_with_kvcache(*args, **kwargs)


def test_shared_checks_name_flash_attn_with_kvcache():
    """The checks flash_attn_with_kvcache shares with flash_attn_func name the function called."""
    with pretend_gpu():
        q, kc, vc, _ = make_args()
        with pytest.raises(ValueError, match=r"^flash_attn_with_kvcache: softcap must be 0.0"):
            flash_attn_with_kvcache(q, kc, vc, cache_seqlens=3, softcap=-1.0)
        with pytest.raises(ValueError, match=r"^flash_attn_with_kvcache: window_size must be"):
            flash_attn_with_kvcache(q, kc, vc, cache_seqlens=3, window_size=(1, 2, 3))


def test_rotary_without_new_keys_is_an_error():
    with pretend_gpu():
        q, kc, vc, _ = make_args()
        cos = torch.empty(256, 16, dtype=torch.float16, device="cuda")
        with pytest.raises(ValueError, match="rotary_cos / rotary_sin need the new k and v"):
            flash_attn_with_kvcache(q, kc, vc, rotary_cos=cos, rotary_sin=cos, cache_seqlens=3)


@pytest.mark.gpu
@pytest.mark.skipif(64 not in _C.built_head_dims(), reason="head dim 64 not built")
def test_append_into_memory_shared_by_entries_or_caches_is_an_error():
    """The append writes the caches in place: an expanded cache (entries sharing memory) would
    take several entries' rows in a race, and one tensor given as both caches both k and v."""
    q = torch.randn(2, 1, 8, 64, dtype=torch.float16, device="cuda")
    kc = torch.zeros(2, 256, 2, 64, dtype=torch.float16, device="cuda")
    vc = torch.zeros_like(kc)
    kn = torch.randn(2, 1, 2, 64, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="k_cache has elements that share memory"):
        flash_attn_with_kvcache(q, kc[:1].expand(2, -1, -1, -1), vc, k=kn, v=kn, cache_seqlens=3)
    with pytest.raises(ValueError, match="k_cache and v_cache share memory"):
        flash_attn_with_kvcache(q, kc, kc, k=kn, v=kn, cache_seqlens=3)
    # Without an append nothing is written: a shared cache is read as given.
    flash_attn_with_kvcache(q, kc, kc, cache_seqlens=3)


def test_cpu_tensors_are_rejected():
    q = torch.empty(2, 1, 8, 64, dtype=torch.float16)
    kc = torch.empty(2, 256, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="q is on device 'cpu'; flashattn_cu runs on CUDA"):
        flash_attn_with_kvcache(q, kc, kc, cache_seqlens=3)


def test_op_fake_shapes():
    q = torch.empty(3, 4, 8, 64, dtype=torch.bfloat16, device="meta")
    kc = torch.empty(10, 16, 2, 64, dtype=torch.bfloat16, device="meta")
    seqlens = torch.empty(3, dtype=torch.int32, device="meta")
    table = torch.empty(3, 5, dtype=torch.int32, device="meta")
    out, lse = torch.ops.flashattn_cu.fwd_kvcache(q, kc, kc, seqlens, None, None, table, 0.125,
                                                  True)
    assert out.shape == q.shape and out.stride() == q.stride()
    assert lse.shape == (3, 8, 4) and lse.dtype == torch.float32
    # cache_seqlens None: every entry holds the whole cache (fwd_splitkv's calls).
    out, lse = torch.ops.flashattn_cu.fwd_kvcache(q, kc, kc, None, None, None, table, 0.125, True)
    assert out.shape == q.shape and lse.shape == (3, 8, 4)
    k_new = torch.empty(3, 4, 2, 64, dtype=torch.bfloat16, device="meta")
    cos = torch.empty(80, 16, dtype=torch.bfloat16, device="meta")
    out, lse = torch.ops.flashattn_cu.fwd_kvcache(q, kc, kc, seqlens, None, None, table, 0.125,
                                                  True, k_new=k_new, v_new=k_new,
                                                  rotary_cos=cos, rotary_sin=cos,
                                                  rotary_interleaved=False)
    assert out.shape == q.shape and lse.shape == (3, 8, 4)


def _unfused_case(paged, seqlens, seqlen_new=4, seqlen_q=3, capacity=32, table_rows=48):
    """_append_unfused (the torch-op append, on the CPU here) on a small cache: returns the
    caches before and after, the new rows, the rotated q and the tables."""
    torch.manual_seed(0)
    batch, heads_k, d = len(seqlens), 2, 32
    k = torch.randn(batch, seqlen_new, heads_k, d)
    v = torch.randn_like(k)
    q = torch.randn(batch, seqlen_q, 4, d)
    angle = torch.rand(table_rows, d // 2) * 6.28
    cos, sin = torch.cos(angle), torch.sin(angle)
    if paged:
        page = 8
        k_cache = torch.randn(batch * capacity // page, page, heads_k, d)
        table = torch.randperm(k_cache.shape[0]).to(torch.int32).view(batch, -1)
    else:
        k_cache, table = torch.randn(batch, capacity, heads_k, d), None
    v_cache = torch.randn_like(k_cache)
    before = (k_cache.clone(), v_cache.clone())
    cache_seqlens = torch.tensor(seqlens, dtype=torch.int32)
    q_rot, counts = kvc._append_unfused(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens, None,
                                        table, True, False, capacity)
    return before, (k_cache, v_cache), (k, v), q, q_rot, cos, sin, table, counts


def _logical(cache, table):
    if table is None:
        return cache
    return cache[table.long()].flatten(1, 2)  # (batch, pages x page, heads, d)


@pytest.mark.parametrize("paged", [False, True])
def test_unfused_append_drops_rows_past_the_cache(paged):
    """New rows that cache_seqlens puts past the cache (a caller's bug) are not written, as the
    kernels drop them (kv_append.h write_appended_rows); the rows that fit are written rotated
    at their positions, every other cache row is unchanged, and the duplicate index_put_ writes
    agree, so two runs give the same bits."""
    capacity, new = 32, 4
    seqlens = [30, 32, 35, 5]  # 2 rows fit, none fit, none (past), all fit
    before, after, (k, v), _, _, cos, sin, table, counts = _unfused_case(paged, seqlens)
    assert counts.tolist() == [s + new for s in seqlens]
    k_before, k_after = _logical(before[0], table), _logical(after[0], table)
    v_before, v_after = _logical(before[1], table), _logical(after[1], table)
    for b, start in enumerate(seqlens):
        for row in range(capacity):
            i = row - start
            if 0 <= i < new:
                pos = torch.tensor([[row]])
                want = kvc._rotate(k[b:b + 1, i:i + 1], cos[pos], sin[pos], False)[0, 0]
                assert torch.equal(k_after[b, row], want), (b, row)
                assert torch.equal(v_after[b, row], v[b, i]), (b, row)
            else:
                assert torch.equal(k_after[b, row], k_before[b, row]), (b, row)
                assert torch.equal(v_after[b, row], v_before[b, row]), (b, row)
    again = _unfused_case(paged, seqlens)[1]
    assert torch.equal(again[0], after[0]) and torch.equal(again[1], after[1])


def test_unfused_query_rotary_positions_pass_the_capacity():
    """q row i (causal: per row) is rotated at cache_seqlens + i even past the cache's capacity
    when seqlen_q > seqlen_new, reading the tables' rows there as flash_attn does (the kernels'
    rotary_of clamps to the tables' rows, not to the cache's)."""
    capacity, table_rows = 32, 48
    _, _, _, q, q_rot, cos, sin, _, _ = _unfused_case(False, [30], seqlen_new=1, seqlen_q=6,
                                                      capacity=capacity, table_rows=table_rows)
    pos = torch.arange(30, 36).unsqueeze(0)  # 32 .. 35 past the cache
    assert torch.equal(q_rot, kvc._rotate(q, cos[pos], sin[pos], False))
    # Past the tables too (a caller's bug): clamped to their last row.
    _, _, _, q, q_rot, cos, sin, _, _ = _unfused_case(False, [30], seqlen_new=1, seqlen_q=6,
                                                      capacity=capacity, table_rows=33)
    pos = torch.arange(30, 36).clamp(max=32).unsqueeze(0)
    assert torch.equal(q_rot, kvc._rotate(q, cos[pos], sin[pos], False))


def test_compile_fullgraph_traces_a_decode_step():
    """torch.compile(fullgraph=True) traces validation, rotary, the in-place paged append and the
    op with no graph break (meta tensors, device checks patched out)."""
    torch._dynamo.reset()
    q = torch.randn(2, 1, 8, 64, device="meta", dtype=torch.float16)
    k = torch.randn(2, 1, 2, 64, device="meta", dtype=torch.float16)
    kc = torch.randn(32, 16, 2, 64, device="meta", dtype=torch.float16)
    vc = torch.randn(32, 16, 2, 64, device="meta", dtype=torch.float16)
    table = torch.zeros(2, 16, device="meta", dtype=torch.int32)
    seqlens = torch.zeros(2, device="meta", dtype=torch.int32)
    cos = torch.randn(256, 16, device="meta", dtype=torch.float16)

    def step(q, k, kc, vc, seqlens):
        return flash_attn_with_kvcache(q, kc, vc, k, k, rotary_cos=cos, rotary_sin=cos,
                                       cache_seqlens=seqlens, block_table=table, causal=True)

    with mock.patch.object(kvc, "_check_devices", lambda *a: None):
        out = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, kc, vc, seqlens)
    assert out.shape == q.shape


@pytest.mark.gpu
@pytest.mark.skipif(64 not in _C.built_head_dims(), reason="the example's head dim 64 not built")
@pytest.mark.parametrize("page_size", [1, 16, 100])
def test_example_generate_matches_sdpa(page_size):
    """examples/generate.py: greedy generation on a paged cache through flash_attn_with_kvcache
    gives the tokens of the same model on SDPA (exit status 0; near ties are reported, not
    failed)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "generate.py"
    run = subprocess.run([sys.executable, str(script), "--page-size", str(page_size),
                          "--new-tokens", "24", "--layers", "2"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "RESULT generate tokens equal" in run.stdout
