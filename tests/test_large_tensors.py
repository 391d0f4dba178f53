"""Tensors past 2^31 elements and offsets past 2^31: where 32-bit index arithmetic would silently
read or write the wrong element. Shapes users reach: a padded batch of 8k short sequences (batch
64 x 8k tokens x 32 heads x d 128 is 2^31 elements), a varlen pack of millions of tokens, one
sequence of 264k tokens read through a row stride of 8192 (heads x d of a wider layout),
dropout's S_dmask over 46k x 46k, a paged KV cache of 8256 pages of 256 x 8 x 128, a
contiguous cache of 66 x 32k entries, and one decode call appending 2^27 rows. Each test keeps the work small (short sequences, one head,
one query row) and checks the parts that lie past 2^31 against the fp32 reference by the rule,
the rest of every output for being written (outputs start as NaN: the poisoning fixture).
Each needs 12-75 GB of free GPU memory and skips with the amount where a GPU has less."""

import gc

import pytest
import torch

from attn_helpers import (assert_entries_match_reference, assert_lse_rule, assert_rule,
                          instance_for, kernel_paths)
from flashattn_cu import (_C, flash_attn_func, flash_attn_varlen_func,
                          flash_attn_with_kvcache)
from flashattn_cu.testing import attention_ref, dropout_mask_from_s_dmask, kernel_path

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
TWO31 = 2 ** 31


def head_dim(preferred):
    """preferred if its instance is built, else the smallest built head-dim instance (the
    shapes below derive their sizes from it, so they pass 2^31 elements at any head dim)."""
    if instance_for(preferred) in _C.built_head_dims():
        return preferred
    return _C.built_head_dims()[0]


@pytest.fixture(autouse=True)
def _free_after():
    """Give the cached blocks back after each test: the suite's other tests (and the child
    processes some of them start) need the device's memory."""
    yield
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def need_free_gib(gib):
    # gc first: a failed test's traceback keeps its frame (and its tensors) alive past teardown.
    gc.collect()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    if free < gib * 2 ** 30:
        pytest.skip(f"needs {gib} GiB of free GPU memory, {free / 2 ** 30:.0f} GiB free")


def check_entries(q, out, lse, k_logical, v_logical, seqlens, what, causal):
    """A cache call's out / lse entry by entry (each against its own baseline of the rule)."""
    for b in range(q.shape[0]):
        assert_entries_match_reference(q[b:b + 1], out[b:b + 1], lse[b:b + 1], k_logical[b:b + 1],
                                       v_logical[b:b + 1], seqlens[b:b + 1], f"{what} entry {b}",
                                       causal=causal)


def check_forward(out, lse, ref, ref_lse, pt, pt_lse, what):
    assert_rule(out, ref, pt, 2, 1e-5, f"{what}: out")
    assert_lse_rule(lse, ref_lse, pt_lse, f"{what}: lse")


def assert_written(path, out, lse, grads):
    """Every element of out, lse and the gradients written (they start as NaN: poisoning)."""
    assert not out.isnan().any() and not lse.isnan().any(), f"{path}: out / lse not written"
    for name, g in zip(("dq", "dk", "dv"), grads):
        assert not g.isnan().any(), f"{path}: {name} not written"


def reference_with_grads(q, k, v, dout, **kw):
    """(ref, ref_lse, pt, pt_lse, ref grads, pt grads) of attention_ref on detached copies."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref, ref_lse = attention_ref(q, k, v, **kw)
    pt, pt_lse = attention_ref(q, k, v, upcast=False, **kw)
    refs = torch.autograd.grad(ref, (q, k, v), dout.float())
    pts = torch.autograd.grad(pt, (q, k, v), dout)
    return ref, ref_lse, pt, pt_lse, refs, pts


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_padded_batch_past_2_31_elements(causal):
    """(8200, 256, 8, d 128) q, k, v, out, dout and gradients: the entries from 8192 on start
    past 2^31 elements (batch offsets, the dQ accumulator's rows), forward and backward on every
    kernel path."""
    d = head_dim(128)
    seqlen, nheads = 256, 8
    batch = TWO31 // (seqlen * nheads * d) + 8
    assert batch * seqlen * nheads * d > TWO31
    need_free_gib(56)
    q, k, v, dout = (torch.randn(batch, seqlen, nheads, d, device="cuda", dtype=BF16)
                     for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    checked = [0, batch - 9, batch - 8, batch - 1]  # batch - 8: the first entry past 2^31
    refs = {b: reference_with_grads(q[b:b + 1], k[b:b + 1], v[b:b + 1], dout[b:b + 1],
                                    causal=causal) for b in checked}
    for path in kernel_paths():
        with kernel_path(path):
            out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
            grads = torch.autograd.grad(out, (q, k, v), dout)
        assert_written(path, out, lse, grads)
        for b in checked:
            ref, ref_lse, pt, pt_lse, ref_g, pt_g = refs[b]
            what = f"{path} entry {b}"
            check_forward(out[b:b + 1], lse[b:b + 1], ref, ref_lse, pt, pt_lse, what)
            for name, g, r, p in zip(("dq", "dk", "dv"), grads, ref_g, pt_g):
                assert_rule(g[b:b + 1], r, p, 3, 1e-4, f"{what}: {name}")
        del out, lse, grads


def test_varlen_past_2_31_elements():
    """A varlen pack of ~2.1M query rows and as many key rows (16 heads, d 64: 2^31 elements
    past row 2^21), random lengths 0-700 (keys drawn apart from the queries, so causal rows that
    see no key occur) and a 2500-token sequence at the end: the sequences that straddle and
    follow 2^31 against the reference, forward and backward, on every kernel path."""
    d = head_dim(64)
    nheads = 16
    rows_past = TWO31 // (nheads * d)
    need_free_gib(56)
    gen = torch.Generator().manual_seed(7)
    count = rows_past // 350 + 200  # mean length 350: past rows_past by ~70k rows
    lq = torch.randint(0, 701, (count,), generator=gen).tolist() + [1, 0, 2500, 97]
    lk = torch.randint(0, 701, (count,), generator=gen).tolist() + [3, 5, 2500, 0]
    assert sum(lq) > rows_past + 3000 and sum(lk) > rows_past
    cu_q = torch.tensor([0] + lq, device="cuda").cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lk, device="cuda").cumsum(0).to(torch.int32)
    starts_q = cu_q.tolist()
    # The sequences whose query rows, and whose key rows, straddle row rows_past (2^31 elements),
    # the one after, the first one and the last four (past it).
    cu_k_list = cu_k.tolist()
    straddle = next(i for i in range(len(lq)) if starts_q[i + 1] > rows_past)
    straddle_k = next(i for i in range(len(lk)) if cu_k_list[i + 1] > rows_past)
    checked = sorted({0, straddle, straddle + 1, straddle_k, *range(len(lq) - 4, len(lq))})
    q = torch.randn(sum(lq), nheads, d, device="cuda", dtype=BF16, requires_grad=True)
    k = torch.randn(sum(lk), nheads, d, device="cuda", dtype=BF16, requires_grad=True)
    v = torch.randn(sum(lk), nheads, d, device="cuda", dtype=BF16, requires_grad=True)
    dout = torch.randn_like(q)

    def part(t, cu, i):
        return t[cu[i]:cu[i + 1]].unsqueeze(0)

    refs = {i: reference_with_grads(part(q, starts_q, i), part(k, cu_k_list, i),
                                    part(v, cu_k_list, i), part(dout, starts_q, i), causal=True)
            for i in checked}
    for path in kernel_paths():
        with kernel_path(path):
            out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk),
                                                 causal=True, return_attn_probs=True)
            grads = torch.autograd.grad(out, (q, k, v), dout)
        assert_written(path, out, lse, grads)
        for i in checked:
            ref, ref_lse, pt, pt_lse, ref_g, pt_g = refs[i]
            what = f"{path} sequence {i} ({lq[i]} x {lk[i]} at row {starts_q[i]})"
            rows = slice(starts_q[i], starts_q[i + 1])
            check_forward(out[rows].unsqueeze(0), lse[:, rows].unsqueeze(0), ref, ref_lse, pt,
                          pt_lse, what)
            for name, g, r, p, cu in zip(("dq", "dk", "dv"), grads, ref_g, pt_g,
                                         (starts_q, cu_k_list, cu_k_list)):
                assert_rule(part(g, cu, i), r, p, 3, 1e-4, f"{what}: {name}")
        del out, lse, grads


def test_long_sequence_with_a_wide_row_stride():
    """One causal sequence of 264,192 tokens, one head of d 128 read from a (1, seqlen, 64, 128)
    layout (row stride 8192 elements: the last rows lie past 2^31 elements of their storage), q,
    k, v and dout alike. The first 64 rows see only the first 64 keys and the last 64 keys are
    seen only by the last 64 rows, so both ends have an exact reference of their own: out, lse
    and dq of the first and last 64 rows, dk and dv of the last 64 keys, every kernel path."""
    d = head_dim(128)
    wide = 8192 // d  # heads of the wider layout
    seqlen = TWO31 // (wide * d) + 2048
    need_free_gib(12)
    storage = torch.empty(1, seqlen, wide, d, device="cuda", dtype=BF16)
    views = []
    for i in range(4):
        view = storage[:, :, i:i + 1].detach()
        view.normal_()
        views.append(view)
    q, k, v, dout = views
    assert q.stride(1) == wide * d and (seqlen - 1) * q.stride(1) > TWO31
    for t in (q, k, v):
        t.requires_grad_()
    last, first = slice(seqlen - 64, seqlen), slice(0, 64)
    ref_last = reference_with_grads(q[:, last], k, v, dout[:, last], causal=True)
    ref_first = reference_with_grads(q[:, first], k[:, first], v[:, first], dout[:, first],
                                     causal=True)
    for path in kernel_paths():
        with kernel_path(path):
            out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
            dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
        assert_written(path, out, lse, (dq, dk, dv))
        for rows, (ref, ref_lse, pt, pt_lse, ref_g, pt_g) in ((last, ref_last),
                                                              (first, ref_first)):
            what = f"{path} rows {rows.start}-{rows.stop}"
            check_forward(out[:, rows], lse[:, :, rows], ref, ref_lse, pt, pt_lse, what)
            assert_rule(dq[:, rows], ref_g[0], pt_g[0], 3, 1e-4, f"{what}: dq")
        _, _, _, _, ref_g, pt_g = ref_last
        assert_rule(dk[:, last], ref_g[1][:, last], pt_g[1][:, last], 3, 1e-4, f"{path}: dk")
        assert_rule(dv[:, last], ref_g[2][:, last], pt_g[2][:, last], 3, 1e-4, f"{path}: dv")
        del out, lse, dq, dk, dv


def test_dropout_s_dmask_past_2_31_elements():
    """Dropout with return_attn_probs over 46,400 x 46,400 (one head, d 64): S_dmask (1, 1,
    46464, 46464) holds 2.16e9 elements, its last rows past 2^31. Every element written; the last
    64 rows' probabilities sum to 1 and, with their mask, give the kernel's out, lse and dq (the
    backward regenerates the mask from the Philox counters of those rows), forward and backward
    on each kernel path."""
    d = head_dim(64)
    seqlen, p = 46400, 0.1
    rounded = -(-seqlen // 128) * 128
    assert rounded * rounded > TWO31
    need_free_gib(16)
    q, k, v, dout = (torch.randn(1, seqlen, 1, d, device="cuda", dtype=BF16) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    last = slice(seqlen - 64, seqlen)
    for path in kernel_paths():
        with kernel_path(path):
            out, lse, s_dmask = flash_attn_func(q, k, v, dropout_p=p, return_attn_probs=True)
        assert s_dmask.shape == (1, 1, rounded, rounded)
        assert not s_dmask.isnan().any(), f"{path}: S_dmask not fully written"
        tail = s_dmask[:, :, last].clone()
        del s_dmask
        sums = tail[..., :seqlen].float().abs().sum(-1)
        assert ((sums - 1).abs() < 2e-2).all(), (
            f"{path}: S_dmask's last rows sum to {sums.min()}-{sums.max()}")
        mask = dropout_mask_from_s_dmask(tail, 64, seqlen)
        ref, ref_lse, pt, pt_lse, ref_g, pt_g = reference_with_grads(
            q[:, last], k, v, dout[:, last], dropout_p=p, dropout_mask=mask)
        check_forward(out[:, last], lse[:, :, last], ref, ref_lse, pt, pt_lse,
                      f"{path}: last rows")
        with kernel_path(path):
            dq, = torch.autograd.grad(out, (q,), dout)
        assert not dq.isnan().any(), f"{path}: dq not written"
        assert_rule(dq[:, last], ref_g[0], pt_g[0], 3, 1e-4, f"{path}: dq of the last rows")
        del out, lse, dq


@pytest.mark.parametrize("seqlen_q", [1, 4])
def test_paged_cache_past_2_31_elements(seqlen_q):
    """A paged cache of 8256 pages of 256 x 8 heads x d 128 (2.16e9 elements; pages from 8192
    on start past 2^31), the entries' 160 pages the last of them in a random order (the rest NaN):
    decode and speculative queries (32 heads over 8) with their new rows appended, every split
    count path (heuristic and 7), every kernel path, against the reference on the gathered
    cache; the appended rows land in their pages."""
    d = head_dim(128)
    page, nheads_k, nheads, batch = 256, 8, 32, 4
    per_entry, past = 40, 64  # pages of each entry; pages past 2^31 elements
    first_past = TWO31 // (page * nheads_k * d)
    num_pages = first_past + past
    need_free_gib(16)
    k_cache = torch.full((num_pages, page, nheads_k, d), float("nan"), device="cuda", dtype=BF16)
    v_cache = torch.full_like(k_cache, float("nan"))
    # The entries' 160 pages: the last 96 before 2^31 and the 64 past it, in a random order,
    # but the page each entry's new rows go to is one past 2^31 (the appends' offsets too).
    lengths = [per_entry * page - seqlen_q, 1, 7000, 300]
    gen = torch.Generator().manual_seed(11)
    appends = (torch.randperm(past, generator=gen)[:batch] + first_past).tolist()
    pool = [x for x in range(num_pages - batch * per_entry, num_pages) if x not in appends]
    others = [pool[i] for i in torch.randperm(len(pool), generator=gen).tolist()]
    rows = []
    for b in range(batch):
        column = (lengths[b] + seqlen_q - 1) // page
        row = [others.pop() for _ in range(per_entry - 1)]
        rows.append(row[:column] + [appends[b]] + row[column:])
    table = torch.tensor(rows, device="cuda", dtype=torch.int32)
    used = table.long().flatten()
    assert sorted(used.tolist()) == list(range(num_pages - batch * per_entry, num_pages))
    for cache in (k_cache, v_cache):
        cache[used] = torch.randn(batch * per_entry, page, nheads_k, d, device="cuda", dtype=BF16)
    cache_seqlens = torch.tensor(lengths, device="cuda", dtype=torch.int32)
    q = torch.randn(batch, seqlen_q, nheads, d, device="cuda", dtype=BF16)
    k_new = torch.randn(batch, seqlen_q, nheads_k, d, device="cuda", dtype=BF16)
    v_new = torch.randn_like(k_new)
    causal = seqlen_q > 1
    for path in kernel_paths():
        for splits in (0, 7):
            with kernel_path(path):
                out, lse = flash_attn_with_kvcache(
                    q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=cache_seqlens,
                    block_table=table, causal=causal, num_splits=splits,
                    return_softmax_lse=True)
            k_logical = k_cache[table.long()].flatten(1, 2)
            v_logical = v_cache[table.long()].flatten(1, 2)
            for b in range(batch):
                rows = slice(int(cache_seqlens[b]), int(cache_seqlens[b]) + seqlen_q)
                assert torch.equal(k_logical[b, rows], k_new[b]), f"entry {b}: k_new not appended"
                assert torch.equal(v_logical[b, rows], v_new[b]), f"entry {b}: v_new not appended"
            check_entries(q, out, lse, k_logical, v_logical,
                                    (cache_seqlens + seqlen_q).tolist(),
                                    f"{path} splits {splits}", causal)


def test_contiguous_cache_past_2_31_elements():
    """A contiguous cache of 66 entries of 32,768 x 8 heads x d 128 (2.2e9 elements; entries 64
    and 65 start past 2^31, the others NaN), reached through cache_batch_idx, decode with the new
    row appended, every kernel path, heuristic and 5 splits."""
    d = head_dim(128)
    capacity, nheads_k, nheads = 32768, 8, 32
    entries = TWO31 // (capacity * nheads_k * d) + 2
    need_free_gib(16)
    k_cache = torch.full((entries, capacity, nheads_k, d), float("nan"), device="cuda",
                         dtype=BF16)
    v_cache = torch.full_like(k_cache, float("nan"))
    idx = [entries - 1, 0, entries - 2]
    for e in idx:
        k_cache[e].normal_()
        v_cache[e].normal_()
    batch_idx = torch.tensor(idx, device="cuda", dtype=torch.int32)
    cache_seqlens = torch.tensor([capacity - 1, 17, 20000], device="cuda", dtype=torch.int32)
    q = torch.randn(3, 1, nheads, d, device="cuda", dtype=BF16)
    k_new = torch.randn(3, 1, nheads_k, d, device="cuda", dtype=BF16)
    v_new = torch.randn_like(k_new)
    for path in kernel_paths():
        for splits in (0, 5):
            with kernel_path(path):
                out, lse = flash_attn_with_kvcache(
                    q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=cache_seqlens,
                    cache_batch_idx=batch_idx, num_splits=splits, return_softmax_lse=True)
            k_logical, v_logical = k_cache[batch_idx.long()], v_cache[batch_idx.long()]
            for b in range(3):
                row = int(cache_seqlens[b])
                assert torch.equal(k_logical[b, row], k_new[b, 0]), f"entry {b}: k_new"
                assert torch.equal(v_logical[b, row], v_new[b, 0]), f"entry {b}: v_new"
            check_entries(q, out, lse, k_logical, v_logical,
                                    (cache_seqlens + 1).tolist(), f"{path} splits {splits}",
                                    False)


def test_append_of_2_27_rows_in_one_call():
    """flash_attn_with_kvcache appending 2^27 + 64 new rows (d 128) to an empty contiguous cache
    in one decode call (k_new / v_new one row each, expanded: stride 0): the append kernel's
    single block for the (entry, kv head) counts rows x 16-byte chunks past 2^31, which a 32-bit
    count wrapped to a negative bound (nothing written, the decode reading whatever the cache
    held). Every key is then the same, so the answer is closed-form: out = v_new's row, lse =
    q . k * scale + ln(keys); every appended row equals k_new's / v_new's (the cache starts as
    NaN). Both kernel paths, 64 splits (2M keys each: every fp32 partial sum of the equal
    weights stays below 2^24, where adding 1 would stop counting); 70 GB."""
    d = head_dim(128)
    rows = 2 ** 34 // d + 64
    need_free_gib(75)
    k_cache = torch.full((1, rows, 1, d), float("nan"), device="cuda", dtype=BF16)
    v_cache = torch.full_like(k_cache, float("nan"))
    k_row = torch.randn(1, 1, 1, d, device="cuda", dtype=BF16)
    v_row = torch.randn(1, 1, 1, d, device="cuda", dtype=BF16)
    k_new, v_new = k_row.expand(1, rows, 1, d), v_row.expand(1, rows, 1, d)
    q = torch.randn(1, 1, 8, d, device="cuda", dtype=BF16)
    seqlens = torch.zeros(1, device="cuda", dtype=torch.int32)
    scale = d ** -0.5
    lse_ref = (q.float()[0, 0] @ k_row.float()[0, 0, 0]) * scale + torch.log(
        torch.tensor(float(rows), device="cuda", dtype=torch.float64)).float()
    for path in kernel_paths():
        k_cache.fill_(float("nan"))
        v_cache.fill_(float("nan"))
        with kernel_path(path):
            out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
                                               cache_seqlens=seqlens, num_splits=64,
                                               return_softmax_lse=True)
        for name, cache, row in (("k", k_cache, k_row), ("v", v_cache, v_row)):
            for chunk in cache[0].split(2 ** 24):  # 2 GiB of bool at most at a time
                assert (chunk == row[0]).all(), f"{path}: {name}_new not appended everywhere"
        # Equal keys: uniform weights over one value row. The P V sums of up to 2^21 equal
        # bf16 products round in fp32 (k x v needs more than 24 bits past k = 2^16): a few
        # percent of |v| at most; a row never written (NaN) fails whatever the tolerance.
        torch.testing.assert_close(out[0, 0].float(), v_row[0, 0].float().expand(8, d),
                                   atol=0.03 * v_row.abs().max().item(), rtol=0,
                                   msg=lambda m: f"{path}: out: {m}")
        torch.testing.assert_close(lse[0, :, 0], lse_ref, atol=1e-3, rtol=1e-5,
                                   msg=lambda m: f"{path}: lse: {m}")
