"""flash_attn_varlen_func(..., block_table=...): paged prefill (issue 10, item 2).

Varlen queries (total_q, nheads, d) with cu_seqlens_q against paged caches (num_blocks,
page_block_size, nheads_k, d) through a block table; sequence b's keys are the first
cu_seqlens_k[b + 1] - cu_seqlens_k[b] rows of its pages. The kvcache kernels in their varlen mode
(torch.ops.flashattn_cu.fwd_kvcache_varlen; csrc/flash/problem/kv_cache.h).

GPU: random length lists with 0 and 1 and one long sequence, sequences whose keys are fewer than
their queries (causal rows that see no key), page sizes 1 / 16 / 100 / 256, random block tables
whose spare entries, spare pages and the rows past each sequence's keys hold NaN (a read through
a wrong entry or past a length fails), causal / window / none, MHA and GQA (packed), softcap,
ALiBi, fp16 / bf16, d 64 / 128, forced split counts through the op; against the fp32 reference on
each sequence's gathered keys by the rule (2x; outputs poisoned by conftest). The backward raises.
CPU: argument errors, the fake registration (shapes under FakeTensorMode and on meta tensors),
torch.compile tracing.
"""

from unittest import mock

import pytest
import torch

from api_helpers import pretend_gpu
from attn_helpers import assert_lse_rule, assert_rule
from attn_helpers import cu_seqlens as cu
from flashattn_cu import _C, flash_attn_varlen_func
from flashattn_cu import kvcache as kvc
from flashattn_cu.testing import attention_ref


def skip_unless_built(head_dim):
    if next(d for d in _C.head_dim_instances() if d >= head_dim) not in _C.built_head_dims():
        pytest.skip(f"head dim {head_dim} not in this build")


def lengths_pair(long_k=1500):
    """(queries, keys) per sequence: 0 and 1 of each, keys past the queries (a cached prefix),
    fewer keys than queries, no key at all, one long sequence, and a few random ones."""
    q_lens = [0, 1, 1, 17, 64, 9, 5, 300, 0]
    k_lens = [13, 0, 1, 17, 64 + 50, 3, 0, long_k, 0]
    for _ in range(3):
        n = int(torch.randint(1, 130, ()).item())
        q_lens.append(n)
        k_lens.append(n + int(torch.randint(0, 400, ()).item()))
    return q_lens, k_lens


def paged_cache(keys, page_size, extra_pages=5, table_width=None):
    """A paged copy of a list of (n_b, heads_k, d) key (or value) tensors: pages in a random
    order, block table (batch, table_width) int32. Rows past n_b in a sequence's last page,
    the spare pages and the spare table entries (pointing at spare pages) all hold NaN."""
    per_seq = [-(-k.shape[0] // page_size) for k in keys]
    width = max(max(per_seq), 1) if table_width is None else table_width
    used = sum(per_seq)
    num_pages = used + extra_pages
    perm = torch.randperm(num_pages, device=keys[0].device)
    spare = perm[used:]
    shape = (num_pages, page_size, *keys[0].shape[1:])
    cache = torch.full(shape, float("nan"), device=keys[0].device, dtype=keys[0].dtype)
    table = spare[torch.randint(0, extra_pages, (len(keys), width), device=spare.device)]
    at = 0
    for b, k in enumerate(keys):
        pages = perm[at:at + per_seq[b]]
        at += per_seq[b]
        table[b, :per_seq[b]] = pages
        padded = torch.full((per_seq[b] * page_size, *k.shape[1:]), float("nan"),
                            device=k.device, dtype=k.dtype)
        padded[:k.shape[0]] = k
        cache[pages] = padded.view(per_seq[b], page_size, *k.shape[1:])
    return cache, table.to(torch.int32).contiguous()


def paged_reference_check(q_lens, k_lens, nheads, nheads_k, d, dtype, page_size, *,
                          causal=False, window=(-1, -1), softcap=0.0, alibi=False,
                          num_splits=None, spare_q=0, what=""):
    device = "cuda"
    qs = [torch.randn(n, nheads, d, device=device, dtype=dtype) for n in q_lens]
    ks = [torch.randn(n, nheads_k, d, device=device, dtype=dtype) for n in k_lens]
    vs = [torch.randn(n, nheads_k, d, device=device, dtype=dtype) for n in k_lens]
    k_cache, table = paged_cache(ks, page_size)
    # The same page order for v: copy k's table layout with v's rows.
    v_cache = torch.full_like(k_cache, float("nan"))
    for b, v in enumerate(vs):
        rows = torch.arange(v.shape[0], device=device)
        v_cache[table[b].long()[rows // page_size], rows % page_size] = v
    # spare_q: q rows past the last sequence (NaN), as a buffer padded to a fixed size.
    q = torch.cat(qs + [torch.full((spare_q, nheads, d), float("nan"), device=device,
                                   dtype=dtype)])
    slopes = torch.rand(len(q_lens), nheads, device=device) * 0.3 if alibi else None
    cq, ck = cu(q_lens), cu(k_lens)
    if num_splits is None:
        out, lse, none = flash_attn_varlen_func(
            q, k_cache, v_cache, cq, ck, max(q_lens), max(k_lens), causal=causal,
            window_size=window, softcap=softcap, alibi_slopes=slopes, return_attn_probs=True,
            block_table=table)
        assert none is None
    else:
        wl, wr = window
        out, lse = torch.ops.flashattn_cu.fwd_kvcache_varlen(
            q, k_cache, v_cache, cq, ck, table, max(q_lens), max(k_lens), d ** -0.5, causal,
            wl, 0 if causal else wr, slopes, softcap, num_splits)
    assert out.shape == q.shape and lse.shape == (nheads, q.shape[0])
    total = sum(q_lens)  # rows past the sequences: as a row that sees no key
    assert (out[total:] == 0).all() and (lse[:, total:] == float("inf")).all()
    outs, refs, pts, lses, lse_refs, lse_pts = [], [], [], [], [], []
    at = 0
    for b, n in enumerate(q_lens):
        if n == 0:
            continue
        kw = dict(causal=causal, window_size=window, softcap=softcap,
                  alibi_slopes=slopes[b:b + 1] if alibi else None)
        ref, lse_ref = attention_ref(qs[b][None].float(), ks[b][None], vs[b][None], **kw)
        pt, lse_pt = attention_ref(qs[b][None], ks[b][None], vs[b][None], upcast=False, **kw)
        outs.append(out[at:at + n]), refs.append(ref[0]), pts.append(pt[0])
        lses.append(lse[:, at:at + n]), lse_refs.append(lse_ref[0]), lse_pts.append(lse_pt[0])
        at += n
    assert_rule(torch.cat(outs), torch.cat(refs), torch.cat(pts), 2, 1e-5, what + " out")
    assert_lse_rule(torch.cat(lses, 1), torch.cat(lse_refs, 1), torch.cat(lse_pts, 1),
                    what + " lse")


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("mask", ["none", "causal", "window"])
@pytest.mark.parametrize("page_size", [1, 16, 100, 256])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_paged_prefill_against_reference(dtype, d, page_size, mask, heads):
    skip_unless_built(d)
    q_lens, k_lens = lengths_pair()
    window = (70, 8) if mask == "window" else (-1, -1)
    paged_reference_check(q_lens, k_lens, *heads, d, dtype, page_size, causal=mask == "causal",
                          window=window,
                          what=f"{dtype} d {d} page {page_size} {mask} {heads}")


@pytest.mark.gpu
@pytest.mark.parametrize("extras", [dict(softcap=30.0), dict(alibi=True),
                                    dict(alibi=True, causal=True),
                                    dict(softcap=20.0, causal=True, heads=(8, 2)),
                                    dict(window=(0, 0), heads=(6, 3))],
                         ids=["softcap", "alibi", "alibi_causal", "softcap_causal_gqa",
                              "window00_gqa3"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_paged_prefill_score_mods(extras, dtype):
    d = 128 if 128 in _C.built_head_dims() else _C.built_head_dims()[0]
    extras = dict(extras)
    heads = extras.pop("heads", (4, 4))
    q_lens, k_lens = lengths_pair(long_k=900)
    paged_reference_check(q_lens, k_lens, *heads, d, dtype, 16, what=f"{extras}", **extras)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 2, 5, 16])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
def test_paged_prefill_split_kv(num_splits, heads):
    """Several splits through the op (flash_attn_varlen_func uses the heuristic): the combine's
    varlen rows (head, token) land in o and lse; tokens of empty sequences stay absent."""
    d = 64 if 64 in _C.built_head_dims() else _C.built_head_dims()[0]
    q_lens, k_lens = lengths_pair(long_k=3000)
    paged_reference_check(q_lens, k_lens, *heads, d, torch.bfloat16, 16, causal=True,
                          num_splits=num_splits, what=f"{num_splits} splits")


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [None, 4])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
def test_paged_prefill_rows_past_the_sequences(heads, num_splits):
    """q rows past the last sequence (NaN): every sequence as the reference, those rows' out 0
    and lse +inf (dispatch_kvcache.cu clears them on the unpacked call, after the split
    combine, which writes every token's row)."""
    skip_unless_built(64)
    q_lens, k_lens = lengths_pair(long_k=300)
    paged_reference_check(q_lens, k_lens, *heads, 64, torch.bfloat16, 16, causal=True,
                          num_splits=num_splits, spare_q=9, what="spare q rows")


@pytest.mark.gpu
def test_paged_prefill_decode_shape_and_equal_to_kvcache():
    """max_seqlen_q = 1 with GQA (flash_attn's seqlenq_ngroups_swapped case) equals
    flash_attn_with_kvcache on the same pages and lengths."""
    d = 64 if 64 in _C.built_head_dims() else _C.built_head_dims()[0]
    batch, nheads, nheads_k, page = 5, 16, 2, 16
    k_lens = [1, 700, 33, 256, 1000]
    ks = [torch.randn(n, nheads_k, d, device="cuda", dtype=torch.float16) for n in k_lens]
    k_cache, table = paged_cache(ks, page)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch, nheads, d, device="cuda", dtype=torch.float16)
    out = flash_attn_varlen_func(q, k_cache, v_cache, cu([1] * batch), cu(k_lens), 1,
                                 max(k_lens), causal=True, block_table=table)
    seqlens = torch.tensor(k_lens, device="cuda", dtype=torch.int32)
    want = kvc.flash_attn_with_kvcache(q[:, None], k_cache, v_cache, cache_seqlens=seqlens,
                                       block_table=table, causal=True)
    torch.testing.assert_close(out.float(), want[:, 0].float(), atol=2e-3, rtol=0)


@pytest.mark.gpu
def test_paged_prefill_backward_raises():
    d = 64 if 64 in _C.built_head_dims() else _C.built_head_dims()[0]
    q = torch.randn(10, 4, d, device="cuda", dtype=torch.float16, requires_grad=True)
    ks = [torch.randn(n, 4, d, device="cuda", dtype=torch.float16) for n in (20, 7)]
    k_cache, table = paged_cache(ks, 16)
    k_cache = k_cache.nan_to_num().requires_grad_(True)
    out = flash_attn_varlen_func(q, k_cache, k_cache, cu([4, 6]), cu([20, 7]), 6, 20,
                                 causal=True, block_table=table)
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match="backward of flash_attn_varlen_func with "
                                                  "block_table"):
        out.sum().backward()
    with torch.no_grad():  # inference needs no autograd at all
        out = flash_attn_varlen_func(q, k_cache, k_cache, cu([4, 6]), cu([20, 7]), 6, 20,
                                     block_table=table)
    assert not out.requires_grad


# --------------------------------------------------------------------------------------------
# CPU: arguments, fake shapes, tracing


def make_args(total_q=70, nheads=8, nheads_k=2, d=64, pages=40, page=16, batch=3, width=5):
    q = torch.empty(total_q, nheads, d, dtype=torch.float16, device="cuda")
    k = torch.empty(pages, page, nheads_k, d, dtype=torch.float16, device="cuda")
    c = torch.empty(batch + 1, dtype=torch.int32, device="cuda")
    table = torch.empty(batch, width, dtype=torch.int32, device="cuda")
    return q, k, torch.empty_like(k), c, c, table


@pytest.mark.parametrize("return_attn_probs", [False, True])
def test_shapes_on_fake_tensors(return_attn_probs):
    with pretend_gpu():
        q, k, v, cq, ck, table = make_args()
        res = flash_attn_varlen_func(q, k, v, cq, ck, 40, 80, causal=True, block_table=table,
                                     return_attn_probs=return_attn_probs)
        if return_attn_probs:
            out, lse, none = res
            assert lse.shape == (8, 70) and lse.dtype == torch.float32 and none is None
        else:
            out = res
        assert out.shape == q.shape and out.dtype == q.dtype


def test_op_fake_shapes():
    q = torch.empty(70, 8, 64, dtype=torch.bfloat16, device="meta")
    k = torch.empty(10, 16, 2, 64, dtype=torch.bfloat16, device="meta")
    c = torch.empty(4, dtype=torch.int32, device="meta")
    table = torch.empty(3, 5, dtype=torch.int32, device="meta")
    out, lse = torch.ops.flashattn_cu.fwd_kvcache_varlen(q, k, k, c, c, table, 30, 80, 0.125,
                                                         True)
    assert out.shape == q.shape and out.stride() == q.stride()
    assert lse.shape == (8, 70) and lse.dtype == torch.float32


@pytest.mark.parametrize("change, error, message", [
    (dict(dropout_p=0.1), NotImplementedError, r"dropout_p > 0 with block_table"),
    (dict(k_rank3=True), ValueError, r"k must have rank 4 \(num_blocks, page_block_size"),
    (dict(q_rank4=True), ValueError, r"q must have rank 3 \(total_q, nheads, headdim\)"),
    (dict(table_dtype=torch.int64), TypeError, r"block_table must be int32"),
    (dict(table_rows=4), ValueError, r"block_table must have shape \(batch, "
                                     r"max_num_blocks_per_seq\) = \(3, >= ceil"),
    (dict(max_k=81), ValueError, r"= \(3, >= ceil\(max_seqlen_k / page_block_size\) = 6\) "
                                 r"for max_seqlen_k=81"),
    (dict(table_1d=True), ValueError, r"block_table must have shape"),
    (dict(head_dim=60), ValueError, r"head dim 60 is not supported with block_table"),
    (dict(heads_k=3), ValueError, r"q has 8 heads and k 3"),
    (dict(v_shape=True), ValueError, r"v has shape .* but k has"),
    (dict(cu_dtype=True), ValueError, r"cu_seqlens_q must be a 1-d int32 tensor"),
    (dict(max_q=-1), ValueError, r"max_seqlen_q must be a non-negative int"),
    (dict(alibi_shape=True), ValueError, r"alibi_slopes"),
])
def test_argument_errors(change, error, message):
    with pretend_gpu():
        q, k, v, cq, ck, table = make_args(
            d=60 if "head_dim" in change else 64,
            nheads_k=change.get("heads_k", 2))
        kwargs = dict(block_table=table)
        if "dropout_p" in change:
            kwargs["dropout_p"] = change["dropout_p"]
        if change.get("k_rank3"):
            k = v = torch.empty(90, 2, 64, dtype=torch.float16, device="cuda")
        if change.get("q_rank4"):
            q = q[None]
        if "table_dtype" in change:
            kwargs["block_table"] = table.to(change["table_dtype"])
        if "table_rows" in change:
            kwargs["block_table"] = torch.empty(change["table_rows"], 5, dtype=torch.int32,
                                                device="cuda")
        if change.get("table_1d"):
            kwargs["block_table"] = torch.empty(15, dtype=torch.int32, device="cuda")
        if change.get("v_shape"):
            v = torch.empty(41, 16, 2, 64, dtype=torch.float16, device="cuda")
        if change.get("cu_dtype"):
            cq = cq.long()
        if change.get("alibi_shape"):
            kwargs["alibi_slopes"] = torch.empty(5, dtype=torch.float32, device="cuda")
        with pytest.raises(error, match=message):
            flash_attn_varlen_func(q, k, v, cq, ck, change.get("max_q", 40),
                                   change.get("max_k", 80), **kwargs)


def test_cpu_tensors_are_rejected():
    q = torch.empty(10, 4, 64, dtype=torch.float16)
    k = torch.empty(4, 16, 4, 64, dtype=torch.float16)
    c = torch.zeros(2, dtype=torch.int32)
    table = torch.zeros(1, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="flash_attn_varlen_func: q is on device 'cpu'"):
        flash_attn_varlen_func(q, k, k, c, c, 10, 64, block_table=table)


def test_compile_fullgraph_traces_paged_prefill():
    """torch.compile(fullgraph=True) traces validation and the op with no graph break (meta
    tensors, device checks patched out)."""
    torch._dynamo.reset()
    q = torch.randn(70, 8, 64, device="meta", dtype=torch.float16)
    k = torch.randn(40, 16, 2, 64, device="meta", dtype=torch.float16)
    c = torch.zeros(4, device="meta", dtype=torch.int32)
    table = torch.zeros(3, 8, device="meta", dtype=torch.int32)

    def prefill(q, k, c, table):
        return flash_attn_varlen_func(q, k, k, c, c, 40, 100, causal=True, block_table=table)

    with mock.patch.object(kvc, "_check_devices", lambda *a: None):
        out = torch.compile(prefill, fullgraph=True, backend="aot_eager")(q, k, c, table)
    assert out.shape == q.shape
