"""flash_attn_with_kvcache (issue 10): split-KV attention over a contiguous or paged KV cache.

GPU: flash_attn's kvcache cases (seqlen_q 1 .. 256 with seqlen_new, contiguous and paged with
random block tables and page sizes 1 / 16 / 64 / 256 / 100, rotary interleaved and not,
cache_batch_idx, cache_leftpad, MHA / GQA / MQA, causal, windows, softcap, ALiBi) against the
fp32 reference on the gathered cache by the rule (2x, outputs poisoned by conftest), the
appended rows checked in the cache itself, every num_splits 1 .. 64 against num_splits = 1,
rows that see no key (0, +inf), CUDA graph replay; the fused append + rotary against the torch-op
reference (caches bitwise equal). The CPU side (signature, argument errors, fake shapes,
torch.compile tracing) is tests/test_kvcache_api.py.
"""

import pytest
import torch

from attn_helpers import assert_entries_match_reference, assert_lse_rule, assert_rule
from flashattn_cu import _C, flash_attn_with_kvcache
from flashattn_cu import kvcache as kvc
from flashattn_cu.testing import attention_ref

HEAD_DIM = 128 if 128 in _C.built_head_dims() else _C.built_head_dims()[0]


def skip_unless_built(head_dim):
    if next(d for d in _C.head_dim_instances() if d >= head_dim) not in _C.built_head_dims():
        pytest.skip(f"head dim {head_dim} not in this build")


def rotary_tables(seqlen, rotary_dim, dtype, device="cuda"):
    """cos / sin (seqlen, rotary_dim / 2) as flash_attn's tests build them."""
    angle = torch.rand(seqlen, rotary_dim // 2, device=device) * 2 * torch.pi
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


def rotate_ref(x, cos, sin, positions, interleaved):
    """Rotary embedding in fp32, written from flash_attn's definition (independently of
    flashattn_cu.kvcache._rotate): x (seqlen, heads, d), positions (seqlen,)."""
    rot = 2 * cos.shape[1]
    c = cos[positions].float().unsqueeze(1)
    s = sin[positions].float().unsqueeze(1)
    x = x.float()
    xr, rest = x[..., :rot], x[..., rot:]
    if interleaved:
        even, odd = xr[..., 0::2], xr[..., 1::2]
        out = torch.empty_like(xr)
        out[..., 0::2] = even * c - odd * s
        out[..., 1::2] = even * s + odd * c
    else:
        half = rot // 2
        lo, hi = xr[..., :half], xr[..., half:]
        out = torch.cat((lo * c - hi * s, lo * s + hi * c), dim=-1)
    return torch.cat((out, rest), dim=-1)


def pages_per_entry(capacity, page_size):
    """Whole pages holding `capacity` rows (the last one partly used when page_size does not
    divide it)."""
    return -(-capacity // page_size)


def to_pages(logical, page_size, num_pages, generator_perm):
    """A paged copy of a (batch, capacity, heads, d) cache: pages in a random order (with spare
    pages), the block table that maps it back. The capacity is rounded up to whole pages; the
    rows past it and the spare pages hold NaN, so a kernel that reads past cache_seqlens or
    through a wrong table entry fails the test (the reference never sees them)."""
    batch, capacity = logical.shape[:2]
    per_entry = pages_per_entry(capacity, page_size)
    assert batch * per_entry <= num_pages, "to_pages: not enough pages"
    table = generator_perm[: batch * per_entry].view(batch, per_entry).to(torch.int32)
    padded = torch.full((batch, per_entry * page_size, *logical.shape[2:]), float("nan"),
                        device=logical.device, dtype=logical.dtype)
    padded[:, :capacity] = logical
    paged = torch.full((num_pages, page_size, *logical.shape[2:]), float("nan"),
                       device=logical.device, dtype=logical.dtype)
    paged[table.long().flatten()] = padded.reshape(batch * per_entry, page_size,
                                                   *logical.shape[2:])
    return paged, table


def to_paged_pair(k_logical, v_logical, page_size, spare_pages):
    """K and V caches paged with one random page order (to_pages) and spare_pages unused pages
    besides the entries', and their block table."""
    batch, capacity = k_logical.shape[:2]
    num_pages = batch * pages_per_entry(capacity, page_size) + spare_pages
    perm = torch.randperm(num_pages, device=k_logical.device)
    k_cache, table = to_pages(k_logical, page_size, num_pages, perm)
    v_cache, _ = to_pages(v_logical, page_size, num_pages, perm)
    return k_cache, v_cache, table


def gather_pages(paged, table):
    batch, per_entry = table.shape
    return paged[table.long().flatten()].view(batch, per_entry * paged.shape[1],
                                              *paged.shape[2:])


CASES = {
    # name: (seqlen_q, seqlen_new, heads, page_size, extras)
    "decode_gqa": (1, 1, (8, 2), None, {}),
    "decode_mqa_paged16_causal": (1, 1, (6, 1), 16, {"causal": True}),
    "decode_gqa_left_window": (1, 1, (8, 2), None, {"window": (50, -1)}),
    "decode_mha_paged1": (1, 1, (4, 4), 1, {}),
    "decode_gqa_paged100": (1, 1, (8, 2), 100, {}),
    "spec4_causal_paged64": (4, 4, (8, 2), 64, {"causal": True}),
    "spec8_rotary_interleaved": (8, 8, (8, 2), None, {"causal": True, "rotary": True}),
    "q16_rotary_neox_paged256": (16, 16, (6, 2), 256, {"rotary": "neox"}),
    "q128_new64_causal": (128, 64, (4, 1), None, {"causal": True}),
    "q256_new256_window": (256, 256, (4, 2), 16, {"window": (100, 0)}),
    "q3_no_new_leftpad": (3, 0, (6, 3), None, {"leftpad": True}),
    "q1_leftpad_paged16_rotary": (1, 1, (8, 2), 16, {"leftpad": True, "rotary": True}),
    "q5_batch_idx": (5, 2, (8, 8), None, {"batch_idx": True, "causal": True}),
    "q1_softcap_alibi": (1, 1, (8, 2), None, {"softcap": 30.0, "alibi": True}),
    "q7_window_both_sides": (7, 3, (4, 2), 64, {"window": (33, 5)}),
    # Pages holding whole key blocks, <= 16 packed rows: the sm90 decode kernel after the append.
    "decode_paged64_rotary_neox": (1, 1, (8, 2), 64, {"rotary": "neox"}),
    "spec4_new9_paged256_causal_rotary": (4, 9, (8, 2), 256, {"causal": True, "rotary": True}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_kvcache_against_reference(case, dtype):
    seqlen_q, seqlen_new, (nheads, nheads_k), page_size, extras = CASES[case]
    d = HEAD_DIM
    batch, capacity = 3, 768
    device = "cuda"
    causal = extras.get("causal", False)
    window = extras.get("window", (-1, -1))
    local = window != (-1, -1)
    q = torch.randn(batch, seqlen_q, nheads, d, device=device, dtype=dtype)
    batch_cache = batch + 2 if extras.get("batch_idx") else batch
    k_logical = torch.randn(batch_cache, capacity, nheads_k, d, device=device, dtype=dtype)
    v_logical = torch.randn_like(k_logical)
    cache_seqlens = torch.randint(0, capacity - seqlen_new + 1, (batch,), device=device,
                                  dtype=torch.int32)
    cache_seqlens[0] = capacity - seqlen_new  # one entry full to the brim
    leftpad = None
    if extras.get("leftpad"):
        leftpad = (torch.rand(batch, device=device) * cache_seqlens.float()).to(torch.int32)
        leftpad[-1] = cache_seqlens[-1]  # an entry whose old keys are all padding
    batch_idx = None
    if extras.get("batch_idx"):
        batch_idx = torch.randperm(batch_cache, device=device)[:batch].to(torch.int32)
    k_new = v_new = None
    if seqlen_new:
        k_new = torch.randn(batch, seqlen_new, nheads_k, d, device=device, dtype=dtype)
        v_new = torch.randn_like(k_new)
    cos = sin = None
    interleaved = extras.get("rotary") != "neox"
    if extras.get("rotary"):
        # As many positions as the cache has rows (a paged one: whole pages).
        rows = capacity if page_size is None else pages_per_entry(capacity, page_size) * page_size
        cos, sin = rotary_tables(rows, d // 2, dtype)
    alibi = (torch.rand(nheads, device=device) * 0.3) if extras.get("alibi") else None
    softcap = extras.get("softcap", 0.0)

    block_table = None
    if page_size is not None:
        k_cache, v_cache, block_table = to_paged_pair(k_logical, v_logical, page_size, 7)
    else:
        k_cache, v_cache = k_logical.clone(), v_logical.clone()

    out, lse = flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
        cache_seqlens=cache_seqlens, cache_batch_idx=batch_idx, cache_leftpad=leftpad,
        block_table=block_table, causal=causal, window_size=window, softcap=softcap,
        rotary_interleaved=interleaved, alibi_slopes=alibi, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (batch, nheads, seqlen_q)

    # The cache after the append, seen logically, and what the reference expects in it.
    k_after = gather_pages(k_cache, block_table) if page_size else k_cache
    v_after = gather_pages(v_cache, block_table) if page_size else v_cache
    outs, refs, pts, lses, lse_refs, lse_pts = [], [], [], [], [], []
    for b in range(batch):
        entry = int(batch_idx[b]) if batch_idx is not None else b
        old, pad = int(cache_seqlens[b]), int(leftpad[b]) if leftpad is not None else 0
        qb = q[b]
        kb_new = k_new[b] if seqlen_new else None
        if cos is not None:
            new_pos = torch.arange(old, old + seqlen_new, device=device)
            kb_new = rotate_ref(kb_new, cos, sin, new_pos, interleaved).to(dtype)
            q_pos = (torch.arange(old, old + seqlen_q, device=device) if causal or local else
                     torch.full((seqlen_q,), old, device=device))
            qb = rotate_ref(qb, cos, sin, q_pos, interleaved)
        if seqlen_new:
            torch.testing.assert_close(k_after[entry, old:old + seqlen_new].float(),
                                       kb_new.float(), atol=0, rtol=1e-2)
            assert torch.equal(v_after[entry, old:old + seqlen_new], v_new[b]), "v appended"
        keys = torch.cat([k_logical[entry, pad:old]] + ([kb_new] if seqlen_new else []))
        vals = torch.cat([v_logical[entry, pad:old]] + ([v_new[b]] if seqlen_new else []))
        kw = dict(causal=causal, window_size=window, softcap=softcap,
                  alibi_slopes=alibi[None] if alibi is not None else None)
        ref, lse_ref = attention_ref(qb[None].float(), keys[None], vals[None], **kw)
        pt, lse_pt = attention_ref(qb[None].to(dtype), keys[None], vals[None], upcast=False,
                                   **kw)
        outs.append(out[b:b + 1]), refs.append(ref), pts.append(pt)
        lses.append(lse[b:b + 1]), lse_refs.append(lse_ref), lse_pts.append(lse_pt)
    assert_rule(torch.cat(outs), torch.cat(refs), torch.cat(pts), 2, 1e-5, f"{case} out")
    assert_lse_rule(torch.cat(lses), torch.cat(lse_refs), torch.cat(lse_pts), f"{case} lse")


@pytest.mark.gpu
@pytest.mark.parametrize("mask", ["causal", "window", "none"])
@pytest.mark.parametrize("seqlen_q", [2, 3, 4, 5, 8])
def test_packed_gqa_speculative(seqlen_q, mask):
    """GQA packing for seqlen_q > 1 (dispatch.cu pack_gqa, problem/kv_cache.h GqaPack): the
    (query, query head) pairs of a kv head as tile rows, query-major; each row's causal diagonal
    and window are its query's. Groups 3 (not a power of two), 4 and 16 (with 8 queries, 128
    rows: two query tiles), contiguous and paged 16 caches, the heuristic's splits and 5."""
    d, dtype = HEAD_DIM, torch.float16
    batch, capacity = 3, 700
    causal = mask == "causal"
    window = (37, 2) if mask == "window" else (-1, -1)
    for (nheads, nheads_k), page_size, num_splits in (((6, 2), None, 0), ((32, 8), 16, 5),
                                                       ((16, 1), None, 5), ((16, 1), 16, 0)):
        q = torch.randn(batch, seqlen_q, nheads, d, device="cuda", dtype=dtype)
        k_logical = torch.randn(batch, capacity, nheads_k, d, device="cuda", dtype=dtype)
        v_logical = torch.randn_like(k_logical)
        seqlens = torch.tensor([capacity, 1, 300 + seqlen_q], device="cuda", dtype=torch.int32)
        table = None
        if page_size is None:
            k_cache, v_cache = k_logical, v_logical
        else:
            k_cache, v_cache, table = to_paged_pair(k_logical, v_logical, page_size, 3)
        out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                           block_table=table, causal=causal, window_size=window,
                                           num_splits=num_splits, return_softmax_lse=True)
        assert_entries_match_reference(
            q, out, lse, k_logical, v_logical, seqlens,
            f"seqlen_q {seqlen_q}, {mask}, {nheads}/{nheads_k} heads, page {page_size}",
            causal=causal, window_size=window)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("page_size", [1, 16, 64, 100, 256])
def test_paged_gather_page_sizes(page_size, num_splits):
    """The paged gather (problem/kv_load.h: the block-table reads a tile ahead, row offsets in
    shared memory) on caches of many tiles whose pages straddle tiles, lengths that end inside
    a page and a tile, a v_cache with other strides than k_cache (a head slice of a wider
    tensor: its own page and row strides), NaN in every row the kernel must not read, GQA
    packed (group 4) and not (MHA), causal with 3 queries."""
    d, dtype = HEAD_DIM, torch.bfloat16
    batch, seqlen_q, capacity = 3, 3, 1000
    for nheads, nheads_k in ((8, 2), (2, 2)):
        per_entry = pages_per_entry(capacity, page_size)
        num_pages = batch * per_entry + 5
        perm = torch.randperm(num_pages, device="cuda")
        k_logical = torch.randn(batch, capacity, nheads_k, d, device="cuda", dtype=dtype)
        v_logical = torch.randn_like(k_logical)
        k_cache, table = to_pages(k_logical, page_size, num_pages, perm)
        v_wide, _ = to_pages(v_logical.repeat_interleave(2, dim=2), page_size, num_pages, perm)
        v_cache = v_wide[:, :, ::2]  # head stride 2d, page and row strides twice k_cache's
        assert v_cache.stride() != k_cache.stride()
        seqlens = torch.tensor([capacity, 517, 64 * 5 + 1], device="cuda", dtype=torch.int32)
        q = torch.randn(batch, seqlen_q, nheads, d, device="cuda", dtype=dtype)
        out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                           block_table=table, causal=True,
                                           num_splits=num_splits, return_softmax_lse=True)
        assert_entries_match_reference(
            q, out, lse, k_logical, v_logical, seqlens,
            f"page {page_size}, {nheads}/{nheads_k} heads, {num_splits} splits", causal=True)


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True])
def test_every_split_count_matches_one_split(paged):
    """num_splits 1 .. 64 on a cache long enough for 64 splits of several key blocks each: the
    combine's merge equals one pass over the keys (to the output's rounding)."""
    d, dtype = HEAD_DIM, torch.bfloat16
    batch, nheads, nheads_k, capacity = 2, 4, 1, 64 * 64 * 3
    q = torch.randn(batch, 1, nheads, d, device="cuda", dtype=dtype)
    k_cache = torch.randn(batch, capacity, nheads_k, d, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    seqlens = torch.tensor([capacity, capacity // 2 + 17], device="cuda", dtype=torch.int32)
    table = None
    if paged:
        k_cache, v_cache, table = to_paged_pair(k_cache, v_cache, 64, 0)
    base, base_lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                             block_table=table, num_splits=1,
                                             return_softmax_lse=True)
    for splits in range(2, 65):
        out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                           block_table=table, num_splits=splits,
                                           return_softmax_lse=True)
        assert not torch.isnan(out).any(), f"num_splits={splits}: NaN"
        err = (out.float() - base.float()).abs().max().item()
        assert err <= 2 ** -7 * base.float().abs().max().item() + 1e-5, (splits, err)
        torch.testing.assert_close(lse, base_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 256])
@pytest.mark.parametrize("seqlen_q", [1, 20])
def test_whole_cache_without_cache_seqlens(seqlen_q, page_size):
    """cache_seqlens=None (the whole cache: the op gets None, the kernels no lengths array) gives
    bitwise what the same call with every length at the capacity gives, on the sm90 decode kernel
    (1 query) and the sm80 kernel (20 queries x 4 heads); with cache_leftpad the lengths are
    filled in; the op itself refuses None beside cache_leftpad or an append, by name."""
    batch, capacity, d = 3, 512, HEAD_DIM
    q = torch.randn(batch, seqlen_q, 8, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, capacity, 2, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    table = None
    if page_size is not None:
        k, v, table = to_paged_pair(k, v, page_size, 3)
    full = torch.full((batch,), capacity, device="cuda", dtype=torch.int32)
    for kw in ({}, {"causal": True}, {"window_size": (100, 0)}):
        a = flash_attn_with_kvcache(q, k, v, block_table=table, return_softmax_lse=True, **kw)
        b = flash_attn_with_kvcache(q, k, v, cache_seqlens=full, block_table=table,
                                    return_softmax_lse=True, **kw)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), kw
    if page_size is None:
        pad = torch.tensor([0, 5, 100], device="cuda", dtype=torch.int32)
        a = flash_attn_with_kvcache(q, k, v, cache_leftpad=pad)
        b = flash_attn_with_kvcache(q, k, v, cache_seqlens=full, cache_leftpad=pad)
        assert torch.equal(a, b)
        with pytest.raises(ValueError, match="cache_seqlens is required with cache_leftpad"):
            torch.ops.flashattn_cu.fwd_kvcache(q, k, v, None, None, pad, None, 0.125, False)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 8])
def test_rows_that_see_no_key(num_splits):
    """Entries with no key (cache_seqlens 0, or all of them left padding) give 0 and LSE +inf,
    never NaN, on one split and on several (where every split is empty)."""
    d, dtype = HEAD_DIM, torch.float16
    q = torch.randn(3, 2, 4, d, device="cuda", dtype=dtype)
    k_cache = torch.randn(3, 1024, 2, d, device="cuda", dtype=dtype)
    seqlens = torch.tensor([0, 500, 1024], device="cuda", dtype=torch.int32)
    leftpad = torch.tensor([0, 500, 3], device="cuda", dtype=torch.int32)
    out, lse = flash_attn_with_kvcache(q, k_cache, k_cache, cache_seqlens=seqlens,
                                       cache_leftpad=leftpad, num_splits=num_splits,
                                       return_softmax_lse=True)
    assert torch.equal(out[:2], torch.zeros_like(out[:2]))
    assert torch.isinf(lse[:2]).all() and (lse[:2] > 0).all()
    assert torch.isfinite(out[2]).all() and torch.isfinite(lse[2]).all()


@pytest.mark.gpu
def test_heuristic_splits_and_cuda_graph_replay():
    """num_splits = 0 (the heuristic) agrees with one split; a captured decode step replays with
    new cache_seqlens and appends where they say, with no host sync in the call."""
    d, dtype = HEAD_DIM, torch.bfloat16
    batch, nheads, nheads_k, capacity, page = 4, 8, 2, 4096, 16
    q = torch.randn(batch, 1, nheads, d, device="cuda", dtype=dtype)
    k_new = torch.randn(batch, 1, nheads_k, d, device="cuda", dtype=dtype)
    v_new = torch.randn_like(k_new)
    num_pages = batch * capacity // page
    k_cache = torch.randn(num_pages, page, nheads_k, d, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    table = torch.randperm(num_pages, device="cuda").view(batch, -1).to(torch.int32)
    seqlens = torch.tensor([100, 4000, 1, 2047], device="cuda", dtype=torch.int32)

    def step():
        return flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                       block_table=table)

    k_copy, v_copy = k_cache.clone(), v_cache.clone()
    one = flash_attn_with_kvcache(q, k_copy, v_copy, k_new, v_new, cache_seqlens=seqlens,
                                  block_table=table, num_splits=1)
    eager = step()
    torch.testing.assert_close(eager.float(), one.float(), atol=2e-2, rtol=0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    seqlens.copy_(torch.tensor([7, 3000, 0, 2048], dtype=torch.int32))
    graph.replay()
    again = flash_attn_with_kvcache(q, k_copy, v_copy, k_new, v_new, cache_seqlens=seqlens,
                                    block_table=table, num_splits=1)
    torch.testing.assert_close(captured.float(), again.float(), atol=2e-2, rtol=0)


# The fused append + rotary (csrc/flash/problem/kv_append.h) against the torch-op reference
# (flashattn_cu.kvcache._append_unfused): the whole caches bitwise equal after the call, the
# outputs by the rule against the fp32 reference. The race-prone shapes: several splits and
# several query blocks per kv head (each new row has one owner; the others read k_new / v_new).
FUSED_CASES = {
    # name: (seqlen_q, seqlen_new, (heads, heads_k), page_size, extras)
    "decode_gqa_packed": (1, 1, (8, 2), None, {}),
    "decode_paged1": (1, 1, (8, 2), 1, {}),
    "decode_paged16_leftpad": (1, 1, (8, 2), 16, {"leftpad": True}),
    "spec4_paged100_causal": (4, 4, (8, 2), 100, {"causal": True}),
    "spec8_batch_idx": (8, 8, (6, 3), None, {"batch_idx": True, "causal": True}),
    "q20_groups4_two_query_blocks": (20, 20, (8, 2), 16, {"causal": True}),  # 80 packed rows
    "q1_new150_window": (1, 150, (4, 4), None, {"window": (40, 0)}),  # rows no query sees
    "q130_new130_mha_paged100": (130, 130, (2, 2), 100, {"causal": True}),
    "q3_alibi_unpacked_gqa": (3, 5, (8, 2), None, {"alibi": True}),  # rule 2's head % group
    "q6_new70_leftpad_batch_idx": (6, 70, (4, 1), None, {"leftpad": True, "batch_idx": True}),
    "decode_new3_paged256": (1, 3, (8, 2), 256, {}),  # sm90 decode after the append
    "decode_new2_paged16": (1, 2, (8, 2), 16, {}),  # its 16-key tiles after the append
    "spec2_paged64_groups8_causal": (2, 2, (16, 2), 64, {"causal": True}),  # 16 packed rows
    # More queries than new keys at the cache's end: q's rotary positions pass the capacity and
    # read the tables' rows there (flash_attn's positions; the tables are longer than the cache).
    "q6_new2_rotary_past_capacity": (6, 2, (8, 2), None, {"causal": True, "long_tables": True}),
    # Paged: the kernels' capacity is the whole pages (608 rows of 16); the 8 new rows fill the
    # last page's rows past the logical 600, the 12 queries' positions run to 611.
    "q12_new8_paged16_rotary_past": (12, 8, (8, 2), 16, {"causal": True, "long_tables": True}),
}
ROTARY_MODES = {
    # name: (interleaved, rotary_dim as a fraction of head_dim) or None
    "none": None,
    "interleaved": (True, 1),
    "neox": (False, 1),
    "interleaved_half": (True, 2),
    "neox_half": (False, 2),
}


def _bits(t):
    """A tensor's bits (NaN-safe exact comparison)."""
    return t.view(torch.int16)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("rotary", list(ROTARY_MODES))
@pytest.mark.parametrize("case", list(FUSED_CASES))
def test_fused_append_matches_unfused(case, rotary, num_splits):
    seqlen_q, seqlen_new, (nheads, nheads_k), page_size, extras = FUSED_CASES[case]
    d, dtype, device = HEAD_DIM, torch.bfloat16 if num_splits == 1 else torch.float16, "cuda"
    batch, capacity = 3, 600
    causal = extras.get("causal", False)
    window = extras.get("window", (-1, -1))
    local = window != (-1, -1)
    batch_cache = batch + 2 if extras.get("batch_idx") else batch
    q = torch.randn(batch, seqlen_q, nheads, d, device=device, dtype=dtype)
    k_logical = torch.randn(batch_cache, capacity, nheads_k, d, device=device, dtype=dtype)
    v_logical = torch.randn_like(k_logical)
    k_new = torch.randn(batch, seqlen_new, nheads_k, d, device=device, dtype=dtype)
    v_new = torch.randn_like(k_new)
    cache_seqlens = torch.randint(0, capacity - seqlen_new + 1, (batch,), device=device,
                                  dtype=torch.int32)
    cache_seqlens[0] = capacity - seqlen_new  # the append ends at the cache's last row
    cache_seqlens[1] = min(3, capacity - seqlen_new)  # the new rows in the first key block
    leftpad = None
    if extras.get("leftpad"):
        leftpad = (torch.rand(batch, device=device) * cache_seqlens.float()).to(torch.int32)
        leftpad[-1] = cache_seqlens[-1]  # only new keys
    batch_idx = None
    if extras.get("batch_idx"):
        batch_idx = torch.randperm(batch_cache, device=device)[:batch].to(torch.int32)
    cos = sin = None
    interleaved = True
    table = None
    rows = capacity
    if page_size is not None:
        rows = pages_per_entry(capacity, page_size) * page_size
    if extras.get("long_tables"):
        cache_seqlens[0] = rows - seqlen_new  # the append ends at the kernels' capacity
    if ROTARY_MODES[rotary] is not None:
        interleaved, fraction = ROTARY_MODES[rotary]
        cos, sin = rotary_tables(rows + (16 if extras.get("long_tables") else 0),
                                 d // fraction, dtype)
    alibi = (torch.rand(nheads, device=device) * 0.3) if extras.get("alibi") else None
    if page_size is not None:
        k_cache, v_cache, table = to_paged_pair(k_logical, v_logical, page_size, 7)
    else:
        k_cache, v_cache = k_logical.clone(), v_logical.clone()
    k_ref_cache, v_ref_cache = k_cache.clone(), v_cache.clone()
    kw = dict(rotary_cos=cos, rotary_sin=sin, cache_seqlens=cache_seqlens,
              cache_batch_idx=batch_idx, cache_leftpad=leftpad, block_table=table,
              causal=causal, window_size=window, rotary_interleaved=interleaved,
              alibi_slopes=alibi, num_splits=num_splits, return_softmax_lse=True)
    q_in, k_in, v_in = q.clone(), k_new.clone(), v_new.clone()
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **kw)
    # The unfused path appends with torch ops and then attends without new keys: the same kernel
    # as the fused call (dispatch.cu decode_sm90_ok does not depend on the append; on the sm90
    # decode path the fused append is its own kernel first, fwd/append.h).
    ref_out, ref_lse = kvc._with_kvcache(
        q, k_ref_cache, v_ref_cache, k_new, v_new, cos, sin, cache_seqlens, batch_idx, leftpad,
        table, None, causal, window, 0.0, interleaved, alibi, num_splits, True, fused=False)
    what = f"{case}, rotary {rotary}, {num_splits} splits"
    assert torch.equal(q, q_in) and torch.equal(k_new, k_in) and torch.equal(v_new, v_in), \
        what + ": inputs modified"
    # The caches, every row (the spare pages and the rows past the append included).
    assert torch.equal(_bits(k_cache), _bits(k_ref_cache)), what + ": k_cache differs"
    assert torch.equal(_bits(v_cache), _bits(v_ref_cache)), what + ": v_cache differs"
    # The same keys and queries reach the same tiles: the outputs agree to their rounding, and
    # both follow the rule against the fp32 reference on the appended cache.
    torch.testing.assert_close(out.float(), ref_out.float(), atol=2e-3, rtol=0)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-5)
    k_after = gather_pages(k_cache, table) if page_size else k_cache
    v_after = gather_pages(v_cache, table) if page_size else v_cache
    outs, refs, pts = [], [], []
    for b in range(batch):
        entry = int(batch_idx[b]) if batch_idx is not None else b
        old = int(cache_seqlens[b])
        pad = int(leftpad[b]) if leftpad is not None else 0
        qb = q[b]
        if cos is not None:
            q_pos = (torch.arange(old, old + seqlen_q, device=device) if causal or local else
                     torch.full((seqlen_q,), old, device=device))
            qb = rotate_ref(qb, cos, sin, q_pos, interleaved).to(dtype)
        keys = k_after[entry:entry + 1, pad:old + seqlen_new]
        vals = v_after[entry:entry + 1, pad:old + seqlen_new]
        akw = dict(causal=causal, window_size=window,
                   alibi_slopes=alibi[None] if alibi is not None else None)
        ref, _ = attention_ref(qb[None].float(), keys, vals, **akw)
        pt, _ = attention_ref(qb[None], keys, vals, upcast=False, **akw)
        outs.append(out[b:b + 1]), refs.append(ref), pts.append(pt)
    assert_rule(torch.cat(outs), torch.cat(refs), torch.cat(pts), 2, 1e-5, what + " out")


@pytest.mark.gpu
def test_fused_append_without_query_rows_or_new_rows():
    """The two cases the kernel cannot serve go through the torch-op path: seqlen_new 0 with
    rotary (q rotated, nothing appended) and seqlen_q 0 (the new rows still appended)."""
    d, dtype = HEAD_DIM, torch.float16
    q = torch.randn(2, 3, 4, d, device="cuda", dtype=dtype)
    k_cache = torch.randn(2, 256, 2, d, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    cos, sin = rotary_tables(256, d, dtype)
    seqlens = torch.tensor([10, 200], device="cuda", dtype=torch.int32)
    empty = torch.empty(2, 0, 2, d, device="cuda", dtype=dtype)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, empty, empty, rotary_cos=cos,
                                  rotary_sin=sin, cache_seqlens=seqlens, causal=True)
    ref = kvc._with_kvcache(q, k_cache, v_cache, empty, empty, cos, sin, seqlens, None, None,
                            None, None, True, (-1, -1), 0.0, True, None, 0, False, fused=False)
    assert torch.equal(out, ref)
    k_new = torch.randn(2, 4, 2, d, device="cuda", dtype=dtype)
    k_copy = k_cache.clone()
    flash_attn_with_kvcache(q[:, :0], k_cache, v_cache, k_new, k_new, cache_seqlens=seqlens)
    assert torch.equal(k_cache[0, 10:14], k_new[0]) and torch.equal(k_cache[1, 200:204], k_new[1])
    assert torch.equal(k_cache[0, :10], k_copy[0, :10]) and torch.equal(k_cache[0, 14:],
                                                                        k_copy[0, 14:])


@pytest.mark.gpu
def test_expanded_block_table_is_copied():
    """A block table whose rows share storage (one row expanded over the batch, stride 0: entries
    that share a prompt's pages) is read as its contiguous copy (flash_attn takes it too): the
    same output, bit for bit, as with the table made contiguous by the caller."""
    skip_unless_built(64)
    torch.manual_seed(5)
    q = torch.randn(3, 1, 8, 64, device="cuda", dtype=torch.float16)
    kc = torch.randn(12, 16, 2, 64, device="cuda", dtype=torch.float16)
    vc = torch.randn_like(kc)
    row = torch.randperm(12, device="cuda")[:4].to(torch.int32)
    table = row.expand(3, 4)
    assert table.stride() == (0, 1)
    seqlens = torch.tensor([20, 64, 33], dtype=torch.int32, device="cuda")
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table)
    ref = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table.contiguous())
    assert torch.equal(out, ref)
