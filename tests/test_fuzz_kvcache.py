"""Seeded randomized ("fuzz") tests of flash_attn_with_kvcache: features combined at random.

The fixed grids of test_kvcache.py and test_decode_sm90.py pick their combinations by hand; here
each case draws one at random from a seed: dtype, head dim (the build's instances and the
multiples of 8 that run on them), MHA / GQA / MQA, seqlen_q (decoding, speculative, prefill-like),
new keys appended or not (k / v given empty too), contiguous or paged caches (page sizes 1 .. 512,
random block tables, spare pages), cache_seqlens as a tensor, a Python int or None (0 and full to
the brim among them), cache_batch_idx, cache_leftpad, rotary (interleaved or not, any rotary_dim
multiple of 16), causal, windows (sides -1, 0, small, around the keys' count, at and past the
capacity), softcap, ALiBi ((nheads,) or (batch, nheads)), num_splits, softmax_scale, the kernel
path and return_softmax_lse. A small share of cases draws one argument the function documents as
an error instead and expects the exception, naming the argument, with the caches untouched.

Each case is checked against the fp32 reference on the logical cache after the append, by
flash_attn's rule (out 2x + 1e-5, lse likewise), the appended rows in the cache itself (k after
rotary to its rounding, v bitwise), and every other row of the cache tensors (spare pages,
entries cache_batch_idx does not name, rows before and after the append) bitwise unchanged.
Most cases put NaN in every cache row the call must not read (before cache_leftpad, from
cache_seqlens on, unused entries and pages), so a stray read fails.

The second test compares num_splits = k with num_splits = 1 (the split-KV merge, to the
output's rounding; the appended caches bitwise equal) and two identical calls (bitwise).

Cases: FLASHATTN_CU_FUZZ_CASES (default 40) and FLASHATTN_CU_FUZZ_SPLIT_CASES (default a
quarter of it) cases from seed FLASHATTN_CU_FUZZ_SEED (default 0): case i uses seed base + i
(the split test base + 1000000 + i). Every failure message starts with the seed and the drawn
configuration; `FLASHATTN_CU_FUZZ_SEED=<seed> FLASHATTN_CU_FUZZ_CASES=1 pytest
tests/test_fuzz_kvcache.py -k against_reference` runs that case alone. The configuration is
drawn by random.Random(seed) in kvcache_case() (pure Python: print it without a GPU), the
tensors by a CPU torch.Generator seeded with the same seed, so a seed gives the same case on
every machine with the same built head dims and kernel paths.
"""

import math
import os
import random

import pytest
import torch

from attn_helpers import (assert_lse_rule, assert_raises_naming, assert_rule, bits, kernel_paths,
                          draw_alibi, skip_unless_built, with_tanh_approx)
from flashattn_cu import _C
from flashattn_cu import flash_attn_with_kvcache
from flashattn_cu.testing import attention_ref, kernel_path
from test_kvcache import pages_per_entry, rotate_ref, to_pages

DEVICE = "cuda"
CASES = int(os.environ.get("FLASHATTN_CU_FUZZ_CASES", 40))
SPLIT_CASES = int(os.environ.get("FLASHATTN_CU_FUZZ_SPLIT_CASES", max(1, CASES // 4)))
BASE_SEED = int(os.environ.get("FLASHATTN_CU_FUZZ_SEED", 0))
SPLIT_SEED_OFFSET = 1_000_000

MAX_CAPACITY = 1500
PAGE_SIZES = (1, 3, 8, 16, 16, 32, 48, 64, 64, 96, 100, 128, 256, 512)
SPLIT_CHOICES = (1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 32, 64)

# (kind, what it needs of the drawn case): one argument turned into a documented error.
ERROR_KINDS = (
    ("batch_idx_with_paged", "paged"),
    ("rotary_without_k", "rotary"),
    ("rotary_dim_not_multiple_of_16", "rotary"),
    ("rotary_table_too_short", "rotary"),
    ("rotary_table_fp32", "rotary"),
    ("cache_seqlens_int_too_large", None),
    ("cache_seqlens_int64", None),
    ("num_splits_out_of_range", None),
    ("k_without_v", "k"),
    ("k_without_cache_seqlens", "k"),
    ("alibi_wrong_shape", None),
    ("alibi_fp16", None),
    ("head_dim_not_multiple_of_8", None),
    ("softcap_negative", None),
    ("softmax_scale_not_positive", None),
    ("nheads_not_multiple_of_nheads_k", "gqa_heads_k"),
    ("block_table_int64", "paged"),
    ("window_not_a_pair", None),
)


# ---------------------------------------------------------------------------------------------
# The configuration: pure Python, from random.Random(seed)


def _draw_head_dim(rng, built):
    """A head dim that runs on one of the built instances: the instance itself or a multiple of
    8 that rounds up to it."""
    instances = sorted(_C.head_dim_instances())
    inst = rng.choice(sorted(built))
    below = max([i for i in instances if i < inst], default=0)
    if rng.random() < 0.5:
        return inst
    return rng.choice(range(below + 8, inst + 1, 8))


def _draw_window_side(rng, capacity, longest):
    """One side of a window: unbounded, 0, small, around the keys' count, at / past the
    capacity."""
    r = rng.random()
    if r < 0.2:
        return -1
    if r < 0.32:
        return 0
    if r < 0.55:
        return rng.randint(1, 16)
    if r < 0.75:
        return max(0, longest + rng.randint(-3, 3))
    if r < 0.9:
        return max(0, capacity + rng.randint(-1, 1))
    return capacity + rng.choice((1, rng.randint(2, 1000), 10 ** 6))


def kvcache_case(rng, built=None, paths=("auto",), errors=True, long_cache=False):
    """One random configuration of a flash_attn_with_kvcache call, a dict of plain values.

    built: the head-dim instances to draw from (default every instance); paths: the kernel paths
    the GPU has (attn_helpers.kernel_paths()); errors: whether a small share of the cases draws
    a documented argument error; long_cache: capacities of 128 keys or more (the split test)."""
    built = list(built) if built else list(_C.head_dim_instances())
    cfg = {}
    cfg["dtype"] = rng.choice(("float16", "bfloat16"))
    d = cfg["head_dim"] = _draw_head_dim(rng, built)
    nheads_k = cfg["nheads_k"] = rng.choice((1, 1, 2, 3, 4))
    group = rng.choice((1, 1, 2, 3, 4, 5, 6, 7, 8))
    group = min(group, 16 // nheads_k)
    cfg["nheads"] = nheads_k * group
    batch = cfg["batch"] = rng.randint(1, 4)

    r = rng.random()
    if r < 0.01:
        seqlen_q = 0
    elif r < 0.45:
        seqlen_q = 1
    elif r < 0.8:
        seqlen_q = rng.randint(2, 8)
    elif r < 0.96:
        seqlen_q = rng.randint(9, 64)
    else:
        seqlen_q = rng.randint(65, 300)
    cfg["seqlen_q"] = seqlen_q

    low = math.log(128 if long_cache else 1)
    target = int(math.exp(rng.uniform(low, math.log(MAX_CAPACITY))))
    if rng.random() < 0.15:  # tile-sized capacities and one past them
        target = rng.choice((64, 128, 192, 256, 512, 1024)) + rng.choice((0, 1))
    paged = rng.random() < 0.45
    if paged:
        page_size = rng.choice(PAGE_SIZES)
        cfg["page_size"] = page_size
        cfg["pages_per_entry"] = max(1, -(-target // page_size))
        capacity = page_size * cfg["pages_per_entry"]
        cfg["spare_pages"] = rng.randint(0, 5)
    else:
        cfg["page_size"] = None
        capacity = max(1, target)
    cfg["capacity"] = capacity

    r = rng.random()
    if r < 0.3:
        new = 0
    elif r < 0.6:
        new = 1
    elif r < 0.85:
        new = rng.randint(2, 8)
    else:
        new = rng.randint(9, 300)
    new = min(new, capacity)
    cfg["seqlen_new"] = new

    rotary = d >= 16 and rng.random() < 0.35
    cfg["k_given"] = new > 0 or rotary or rng.random() < 0.4
    if rotary:
        cfg["rotary_dim"] = 16 * rng.randint(1, d // 16)
        cfg["rotary_interleaved"] = rng.random() < 0.5
    else:
        cfg["rotary_dim"] = 0
        cfg["rotary_interleaved"] = rng.random() < 0.5  # passed anyway, unused

    def length():
        r = rng.random()
        if r < 0.12:
            return 0
        if r < 0.3:
            return capacity - new  # full to the brim after the append
        return rng.randint(0, capacity - new)

    if not cfg["k_given"] and rng.random() < 0.35:
        cfg["seqlens_mode"] = "none"  # the whole cache
        seqlens = [capacity] * batch
    elif rng.random() < 0.2:
        cfg["seqlens_mode"] = "int"
        seqlens = [length()] * batch
    else:
        cfg["seqlens_mode"] = "tensor"
        seqlens = [length() for _ in range(batch)]
    cfg["cache_seqlens"] = seqlens

    if rng.random() < 0.3:
        pads = []
        for n in seqlens:
            r = rng.random()
            pads.append(0 if r < 0.2 else n if r < 0.35 else rng.randint(0, n))
        cfg["cache_leftpad"] = pads
    else:
        cfg["cache_leftpad"] = None

    if not paged:
        cfg["batch_cache"] = batch + rng.randint(0, 2)
        if rng.random() < 0.3:
            cfg["batch_cache"] = batch + rng.randint(0, 3)
            cfg["cache_batch_idx"] = rng.sample(range(cfg["batch_cache"]), batch)
        else:
            cfg["cache_batch_idx"] = None
    else:
        cfg["batch_cache"] = batch
        cfg["cache_batch_idx"] = None

    if rotary:
        need = max(n + max(seqlen_q, new) for n in seqlens)
        cfg["rotary_rows"] = max(capacity, need) + rng.randint(0, 20)

    cfg["causal"] = rng.random() < 0.4
    if rng.random() < 0.4:
        longest = max(n + new - (p or 0) for n, p in
                      zip(seqlens, cfg["cache_leftpad"] or [0] * batch))
        cfg["window_size"] = (_draw_window_side(rng, capacity, longest),
                              _draw_window_side(rng, capacity, longest))
        if rng.random() < 0.1:  # causal spelled as a window: (-1, 0), or a left side >= capacity
            cfg["window_size"] = (rng.choice((-1, capacity, capacity + 7)), 0)
    else:
        cfg["window_size"] = (-1, -1)
    cfg["softcap"] = round(rng.uniform(1.0, 50.0), 3) if rng.random() < 0.2 else 0.0
    r = rng.random()
    cfg["alibi"] = None if r < 0.8 else ("heads" if r < 0.9 else "batch_heads")
    cfg["num_splits"] = 0 if rng.random() < 0.4 else rng.choice(SPLIT_CHOICES + (
        rng.randint(1, 64),))
    cfg["softmax_scale"] = None if rng.random() < 0.7 else round(rng.uniform(0.02, 0.4), 4)
    cfg["return_softmax_lse"] = rng.random() < 0.75
    cfg["nan_outside"] = rng.random() < 0.8
    use_sm80 = rng.random() < 0.5
    cfg["path"] = "sm80" if use_sm80 and "sm80" in paths else "auto"

    cfg["error"] = None
    if errors and rng.random() < 0.1:
        have = {"paged": paged, "rotary": rotary, "k": cfg["k_given"],
                "gqa_heads_k": nheads_k >= 2, None: True}
        kinds = [kind for kind, needs in ERROR_KINDS if have[needs]]
        cfg["error"] = rng.choice(kinds)
        cfg["error_value"] = {
            "num_splits_out_of_range": rng.choice((-1, 129, 1000)),
            "softcap_negative": -round(rng.uniform(0.5, 50.0), 3),
            "softmax_scale_not_positive": rng.choice((0.0, -0.125)),
        }.get(cfg["error"])
    return cfg


def normalized_mask(cfg):
    """(causal, local, left, right) as flash_attn leaves a KV-cache call's mask (mha_fwd_kvcache,
    then set_params_fprop), written out step by step: causal makes right 0; a side >= the key
    bound (the cache's capacity) is unbounded; the call is causal iff (unbounded, 0); otherwise
    local iff a side is bounded, the unbounded side of a local call then taking the capacity."""
    capacity = cfg["capacity"]
    left, right = (side if side >= 0 else -1 for side in cfg["window_size"])
    if cfg["causal"]:
        right = 0
    if left >= capacity:
        left = -1
    if right >= capacity:
        right = -1
    causal = left < 0 and right == 0
    local = not causal and (left >= 0 or right >= 0)
    if local:
        left = capacity if left < 0 else left
        right = capacity if right < 0 else right
    return causal, local, left, right


def describe(seed, cfg):
    return f"[seed {seed}] {cfg}"


# ---------------------------------------------------------------------------------------------
# Tensors from the configuration


def build_inputs(cfg, seed):
    """The case's tensors (from a CPU torch.Generator seeded with `seed`, then moved to DEVICE):
    q, k / v new, the logical caches (batch_cache, capacity, heads_k, d) with NaN in every row
    the call must not read when cfg["nan_outside"], the caches as passed (contiguous copies or
    pages with a random block table), rotary tables and ALiBi slopes."""
    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, cfg["dtype"])
    d, nheads, nheads_k = cfg["head_dim"], cfg["nheads"], cfg["nheads_k"]
    batch, capacity, new = cfg["batch"], cfg["capacity"], cfg["seqlen_new"]

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)

    inp = {}
    inp["q"] = randn(batch, cfg["seqlen_q"], nheads, d)
    k_logical = randn(cfg["batch_cache"], capacity, nheads_k, d)
    v_logical = randn(cfg["batch_cache"], capacity, nheads_k, d)
    inp["k_new"] = randn(batch, new, nheads_k, d) if cfg["k_given"] else None
    inp["v_new"] = randn(batch, new, nheads_k, d) if cfg["k_given"] else None
    entries = cfg["cache_batch_idx"] or list(range(batch))
    pads = cfg["cache_leftpad"] or [0] * batch
    if cfg["nan_outside"]:
        for e in range(cfg["batch_cache"]):
            if e not in entries:
                k_logical[e] = float("nan")
                v_logical[e] = float("nan")
        for b, e in enumerate(entries):
            # Before the left padding and from the old keys' end (the rows the append fills
            # included: the call must write them before it reads them).
            for t in (k_logical, v_logical):
                t[e, :pads[b]] = float("nan")
                if cfg["seqlens_mode"] != "none":
                    t[e, cfg["cache_seqlens"][b]:] = float("nan")
    inp["k_logical"], inp["v_logical"] = k_logical, v_logical
    if cfg["page_size"] is None:
        inp["k_cache"], inp["v_cache"] = k_logical.clone(), v_logical.clone()
        inp["block_table"] = None
    else:
        num_pages = batch * cfg["pages_per_entry"] + cfg["spare_pages"]
        assert pages_per_entry(capacity, cfg["page_size"]) == cfg["pages_per_entry"]
        perm = torch.randperm(num_pages, generator=gen).to(DEVICE)
        inp["k_cache"], table = to_pages(k_logical, cfg["page_size"], num_pages, perm)
        inp["v_cache"], _ = to_pages(v_logical, cfg["page_size"], num_pages, perm)
        inp["block_table"] = table
    if cfg["rotary_dim"]:
        angle = torch.rand(cfg["rotary_rows"], cfg["rotary_dim"] // 2, generator=gen)
        angle = angle * (2 * math.pi)
        inp["cos"] = torch.cos(angle).to(dtype).to(DEVICE)
        inp["sin"] = torch.sin(angle).to(dtype).to(DEVICE)
    else:
        inp["cos"] = inp["sin"] = None
    inp["alibi"] = draw_alibi(cfg["alibi"], nheads, batch, gen)
    return inp


def call_kwargs(cfg, inp, k_cache, v_cache):
    """flash_attn_with_kvcache's keyword arguments for the case (on the given caches)."""
    mode = cfg["seqlens_mode"]
    if mode == "none":
        seqlens = None
    elif mode == "int":
        seqlens = cfg["cache_seqlens"][0]
    else:
        seqlens = torch.tensor(cfg["cache_seqlens"], dtype=torch.int32, device=DEVICE)

    def ints(values):
        return None if values is None else torch.tensor(values, dtype=torch.int32,
                                                        device=DEVICE)

    return dict(q=inp["q"], k_cache=k_cache, v_cache=v_cache, k=inp["k_new"], v=inp["v_new"],
                rotary_cos=inp["cos"], rotary_sin=inp["sin"], cache_seqlens=seqlens,
                cache_batch_idx=ints(cfg["cache_batch_idx"]),
                cache_leftpad=ints(cfg["cache_leftpad"]), block_table=inp["block_table"],
                softmax_scale=cfg["softmax_scale"], causal=cfg["causal"],
                window_size=tuple(cfg["window_size"]), softcap=cfg["softcap"],
                rotary_interleaved=cfg["rotary_interleaved"], alibi_slopes=inp["alibi"],
                num_splits=cfg["num_splits"], return_softmax_lse=cfg["return_softmax_lse"])


def appended_rows(cfg, inp, b):
    """Where entry b's new rows land in the cache tensors: (index0, index1) long tensors."""
    old, new = cfg["cache_seqlens"][b], cfg["seqlen_new"]
    rows = torch.arange(old, old + new, device=DEVICE)
    if cfg["page_size"] is None:
        entry = (cfg["cache_batch_idx"] or list(range(cfg["batch"])))[b]
        return torch.full_like(rows, entry), rows
    table = inp["block_table"].long()
    return table[b, rows // cfg["page_size"]], rows % cfg["page_size"]


# ---------------------------------------------------------------------------------------------
# Documented argument errors


def _error_call(cfg, kw):
    """kw with the case's error applied; (kw, exception type, text the message must contain)."""
    kind = cfg["error"]
    kw = dict(kw)
    q = kw["q"]
    if kind == "batch_idx_with_paged":
        kw["cache_batch_idx"] = torch.arange(cfg["batch"], dtype=torch.int32, device=DEVICE)
        return kw, ValueError, "cache_batch_idx"
    if kind == "rotary_without_k":
        kw["k"] = kw["v"] = None
        return kw, ValueError, "rotary_cos"
    if kind == "rotary_dim_not_multiple_of_16":
        half = cfg["rotary_dim"] // 2 - 4
        kw["rotary_cos"], kw["rotary_sin"] = kw["rotary_cos"][:, :half], kw["rotary_sin"][:, :half]
        return kw, ValueError, "rotary_dim"
    if kind == "rotary_table_too_short":
        rows = cfg["capacity"] - 1
        kw["rotary_cos"], kw["rotary_sin"] = kw["rotary_cos"][:rows], kw["rotary_sin"][:rows]
        return kw, ValueError, "rotary_cos"
    if kind == "rotary_table_fp32":
        kw["rotary_cos"] = kw["rotary_cos"].float()
        return kw, TypeError, "rotary_cos"
    if kind == "cache_seqlens_int_too_large":
        new = kw["k"].shape[1] if kw["k"] is not None else 0
        kw["cache_seqlens"] = cfg["capacity"] - new + 1
        return kw, ValueError, "cache_seqlens"
    if kind == "cache_seqlens_int64":
        kw["cache_seqlens"] = torch.tensor(cfg["cache_seqlens"], dtype=torch.int64,
                                           device=DEVICE)
        return kw, TypeError, "cache_seqlens"
    if kind == "num_splits_out_of_range":
        kw["num_splits"] = cfg["error_value"]
        return kw, ValueError, "num_splits"
    if kind == "k_without_v":
        kw["v"] = None
        return kw, ValueError, "k and v"
    if kind == "k_without_cache_seqlens":
        kw["cache_seqlens"] = None
        return kw, ValueError, "cache_seqlens"
    if kind == "alibi_wrong_shape":
        kw["alibi_slopes"] = torch.rand(cfg["nheads"] + 1, device=DEVICE)
        return kw, ValueError, "alibi_slopes"
    if kind == "alibi_fp16":
        kw["alibi_slopes"] = torch.rand(cfg["nheads"], device=DEVICE).half()
        return kw, TypeError, "alibi_slopes"
    if kind == "head_dim_not_multiple_of_8":
        d = cfg["head_dim"] - 4
        for name in ("q", "k_cache", "v_cache", "k", "v"):
            if kw[name] is not None:
                kw[name] = torch.zeros(*kw[name].shape[:-1], d, dtype=q.dtype, device=DEVICE)
        return kw, ValueError, "head dim"
    if kind == "softcap_negative":
        kw["softcap"] = cfg["error_value"]
        return kw, ValueError, "softcap"
    if kind == "softmax_scale_not_positive":
        kw["softmax_scale"] = cfg["error_value"]
        return kw, ValueError, "softmax_scale"
    if kind == "nheads_not_multiple_of_nheads_k":
        kw["q"] = torch.zeros(*q.shape[:2], q.shape[2] + 1, q.shape[3], dtype=q.dtype,
                              device=DEVICE)
        return kw, ValueError, "nheads"
    if kind == "block_table_int64":
        kw["block_table"] = kw["block_table"].long()
        return kw, TypeError, "block_table"
    if kind == "window_not_a_pair":
        kw["window_size"] = (1, 2, 3)
        return kw, ValueError, "window_size"
    raise AssertionError(f"unknown error kind {kind}")


def check_documented_error(seed, cfg, inp):
    what = describe(seed, cfg)
    k_before, v_before = inp["k_cache"].clone(), inp["v_cache"].clone()
    kw, exc, name = _error_call(cfg, call_kwargs(cfg, inp, inp["k_cache"], inp["v_cache"]))

    def call():
        with kernel_path(cfg["path"]):
            flash_attn_with_kvcache(**kw)
    assert_raises_naming(call, exc, (name,), what)
    assert torch.equal(bits(inp["k_cache"]), bits(k_before)), f"{what}: k_cache modified"
    assert torch.equal(bits(inp["v_cache"]), bits(v_before)), f"{what}: v_cache modified"


# ---------------------------------------------------------------------------------------------
# The tests


def checked_call(what, path, kw):
    """flash_attn_with_kvcache(**kw) on the kernel path; an exception from a valid call fails
    with the case's seed and configuration."""
    try:
        with kernel_path(path):
            return flash_attn_with_kvcache(**kw)
    except Exception as e:
        raise AssertionError(f"{what}: a valid call raised {type(e).__name__}: {e}") from e


def _case(seed, **kw):
    rng = random.Random(seed)
    cfg = kvcache_case(rng, built=_C.built_head_dims(), paths=kernel_paths(), **kw)
    return rng, cfg


def _entry_problem(cfg, inp, b):
    """Batch row b's attention problem as the reference sees it: (q (seqlen_q, nheads, d) rotated
    and rounded as the kernels hold it, the new keys rotated and rounded (None without an
    append), the keys and values the row attends to (its cache rows from cache_leftpad, then the
    new ones), attention_ref's mask and score arguments)."""
    dtype = getattr(torch, cfg["dtype"])
    seqlen_q, new = cfg["seqlen_q"], cfg["seqlen_new"]
    causal, local, left, right = normalized_mask(cfg)
    entry = (cfg["cache_batch_idx"] or list(range(cfg["batch"])))[b]
    old, pad = cfg["cache_seqlens"][b], (cfg["cache_leftpad"] or [0] * cfg["batch"])[b]
    cos, sin, interleaved = inp["cos"], inp["sin"], cfg["rotary_interleaved"]
    qb = inp["q"][b]
    kb_new = inp["k_new"][b] if new else None
    if cos is not None:
        if new:
            positions = torch.arange(old, old + new, device=DEVICE)
            kb_new = rotate_ref(kb_new, cos, sin, positions, interleaved).to(dtype)
        # flash_attn's q positions: the cache row of each query when causal or local (row i at
        # cache_seqlens + i, absolute: cache_leftpad does not shift them), else all at
        # cache_seqlens. The rotated q is rounded to the dtype as the kernels (and flash_attn)
        # hold it: the fp32 reference starts from those values, as the new keys' do (with one
        # query row and head the rounding of q alone can exceed the 2x baseline).
        steps = torch.arange(seqlen_q, device=DEVICE) if causal or local else \
            torch.zeros(seqlen_q, dtype=torch.long, device=DEVICE)
        qb = rotate_ref(qb, cos, sin, old + steps, interleaved).to(dtype)
    keys = inp["k_logical"][entry, pad:old]
    vals = inp["v_logical"][entry, pad:old]
    if new:
        keys = torch.cat((keys, kb_new))
        vals = torch.cat((vals, inp["v_new"][b]))
    alibi = inp["alibi"]
    if alibi is not None:
        alibi = alibi[None] if alibi.dim() == 1 else alibi[b:b + 1]
    kw = dict(causal=causal, window_size=(left, right), softcap=cfg["softcap"],
              alibi_slopes=alibi, softmax_scale=cfg["softmax_scale"])
    return qb, kb_new, keys, vals, kw


@pytest.mark.gpu
@pytest.mark.parametrize("index", range(CASES), ids=[f"seed{BASE_SEED + i}" for i in range(CASES)])
def test_fuzz_kvcache_against_reference(index):
    seed = BASE_SEED + index
    _, cfg = _case(seed)
    what = describe(seed, cfg)
    skip_unless_built(cfg["head_dim"])
    inp = build_inputs(cfg, seed)
    if cfg["error"] is not None:
        check_documented_error(seed, cfg, inp)
        return

    dtype = getattr(torch, cfg["dtype"])
    batch, seqlen_q, nheads, new = cfg["batch"], cfg["seqlen_q"], cfg["nheads"], cfg["seqlen_new"]
    k_cache, v_cache = inp["k_cache"], inp["v_cache"]
    k_before, v_before = k_cache.clone(), v_cache.clone()
    q_in = inp["q"].clone()
    kv_in = (inp["k_new"].clone(), inp["v_new"].clone()) if cfg["k_given"] else None
    result = checked_call(what, cfg["path"], call_kwargs(cfg, inp, k_cache, v_cache))

    # The return arity: out, or (out, lse) with return_softmax_lse.
    if cfg["return_softmax_lse"]:
        assert isinstance(result, tuple) and len(result) == 2, f"{what}: returned {type(result)}"
        out, lse = result
        assert lse.dtype == torch.float32 and lse.shape == (batch, nheads, seqlen_q), \
            f"{what}: lse {lse.dtype} {tuple(lse.shape)}"
    else:
        assert isinstance(result, torch.Tensor), f"{what}: returned {type(result)}"
        out, lse = result, None
    assert out.dtype == dtype and out.shape == inp["q"].shape, \
        f"{what}: out {out.dtype} {tuple(out.shape)}"
    assert torch.equal(inp["q"], q_in), f"{what}: q modified"
    if kv_in is not None:
        assert torch.equal(inp["k_new"], kv_in[0]) and torch.equal(inp["v_new"], kv_in[1]), \
            f"{what}: k / v modified"

    # Every cache element but the appended rows is bitwise what it was (spare pages, entries not
    # named, rows outside [cache_seqlens, cache_seqlens + seqlen_new), NaN included).
    written = torch.zeros(k_cache.shape[:2], dtype=torch.bool, device=DEVICE)
    if new:
        for b in range(batch):
            written[appended_rows(cfg, inp, b)] = True
    for name, after, before in (("k_cache", k_cache, k_before), ("v_cache", v_cache, v_before)):
        assert torch.equal(bits(after)[~written], bits(before)[~written]), \
            f"{what}: {name} changed outside the appended rows"

    cos = inp["cos"]
    outs, refs, pts, lses, lse_refs, lse_pts = [], [], [], [], [], []
    for b in range(batch):
        qb, kb_new, keys, vals, kw = _entry_problem(cfg, inp, b)
        if new:
            index = appended_rows(cfg, inp, b)
            got_k, got_v = k_cache[index], v_cache[index]
            if cos is not None:
                torch.testing.assert_close(got_k.float(), kb_new.float(), atol=0, rtol=1e-2,
                                           msg=lambda m: f"{what}: appended k, entry {b}: {m}")
            else:
                assert torch.equal(bits(got_k), bits(kb_new)), \
                    f"{what}: appended k, entry {b}"
            assert torch.equal(bits(got_v), bits(inp["v_new"][b])), \
                f"{what}: appended v, entry {b}"
        ref, lse_ref = attention_ref(qb[None].float(), keys[None], vals[None], **kw)
        pt, lse_pt = attention_ref(qb[None], keys[None], vals[None], upcast=False, **kw)
        pt, lse_pt = with_tanh_approx(pt, lse_pt, ref, lse_ref, qb[None], keys[None], vals[None],
                                      **kw)
        outs.append(out[b:b + 1]), refs.append(ref), pts.append(pt)
        if lse is not None:
            lses.append(lse[b:b + 1]), lse_refs.append(lse_ref), lse_pts.append(lse_pt)
    assert_rule(torch.cat(outs), torch.cat(refs), torch.cat(pts), 2, 1e-5, f"{what}: out")
    if lse is not None:
        assert_lse_rule(torch.cat(lses), torch.cat(lse_refs), torch.cat(lse_pts),
                        f"{what}: lse")


def _split_spread(cfg, inp):
    """sum_j P_ij |v_jc| per (batch, query, head, column), P the fp32 reference's probabilities
    (attention_ref over |v|): what the 16-bit rounding of P can move an output element by."""
    rows = []
    for b in range(cfg["batch"]):
        qb, _, keys, vals, kw = _entry_problem(cfg, inp, b)
        spread, _ = attention_ref(qb[None].float(), keys[None].float(), vals[None].float().abs(),
                                  **kw)
        rows.append(spread)
    return torch.cat(rows)


def _compare_within_rounding(a, b, dtype, what, spread):
    """a against b (out of the same call with other split counts), elementwise: |a - b| <=
    eps(dtype) * (max|b| over the (entry, query, head) row + spread) + 1e-5. The first term is
    the two outputs' roundings; the second P's: every kernel rounds P = exp(s - m) to 16 bits
    before P V, with m the running max of the keys it has walked, which a split's own max
    changes, so each P_j of the two calls is rounded at another scale (relative error up to
    eps / 2 each): |delta o_c| <= eps * sum_j P_j |v_jc| (spread, _split_spread). One split
    dropped or weighted wrong moves the LSE, compared to fp32 accuracy beside this. Equal
    elements (zeros of empty rows) count as 0."""
    assert not torch.isnan(a).any(), f"{what}: NaN"
    a32, b32 = a.float(), b.float()
    diff = (a32 - b32).abs().masked_fill(a32 == b32, 0.0)
    eps = torch.finfo(dtype).eps
    bound = eps * (b32.abs().amax(dim=-1, keepdim=True) + spread) + 1e-5
    worst = (diff - bound).max().item() if diff.numel() else 0.0
    assert worst <= 0, \
        f"{what}: |out - out(num_splits=1)| exceeds the roundings of out and P by {worst:.3e}"


@pytest.mark.gpu
@pytest.mark.parametrize("index", range(SPLIT_CASES),
                         ids=[f"seed{BASE_SEED + SPLIT_SEED_OFFSET + i}" for i in
                              range(SPLIT_CASES)])
def test_fuzz_kvcache_splits_and_determinism(index):
    """num_splits = k (0: the heuristic) against num_splits = 1 on copies of the same cache:
    out within the roundings of out and P (_compare_within_rounding), lse to fp32 accuracy, the
    appended caches bitwise equal; and the same call twice (fresh copies) bitwise equal in out,
    lse and the caches."""
    seed = BASE_SEED + SPLIT_SEED_OFFSET + index
    rng, cfg = _case(seed, errors=False, long_cache=True)
    cfg["num_splits"] = rng.choice((0,) + SPLIT_CHOICES[1:] + (rng.randint(2, 128),))
    cfg["return_softmax_lse"] = True
    what = describe(seed, cfg)
    skip_unless_built(cfg["head_dim"])
    inp = build_inputs(cfg, seed)
    dtype = getattr(torch, cfg["dtype"])
    runs = []
    for splits in (1, cfg["num_splits"], cfg["num_splits"]):
        k_cache, v_cache = inp["k_cache"].clone(), inp["v_cache"].clone()
        kw = call_kwargs(cfg, inp, k_cache, v_cache)
        kw["num_splits"] = splits
        out, lse = checked_call(what, cfg["path"], kw)
        runs.append((out, lse, k_cache, v_cache))
    (one, one_lse, k1, v1), (out, lse, k2, v2), (again, again_lse, k3, v3) = runs
    assert torch.equal(bits(again), bits(out)), f"{what}: out differs between two calls"
    assert torch.equal(again_lse.view(torch.int32), lse.view(torch.int32)), \
        f"{what}: lse differs between two calls"
    for name, x, y in (("k_cache", k3, k2), ("v_cache", v3, v2), ("k_cache (1 split)", k1, k2),
                       ("v_cache (1 split)", v1, v2)):
        assert torch.equal(bits(x), bits(y)), f"{what}: {name} differs after the append"
    _compare_within_rounding(out, one, dtype, what, _split_spread(cfg, inp))
    torch.testing.assert_close(lse, one_lse, atol=1e-4, rtol=1e-5,
                               msg=lambda m: f"{what}: lse against num_splits=1: {m}")


def test_case_generator_is_reproducible_and_covers_the_features():
    """CPU: the configurations are a function of the seed, and the default seeds draw every
    feature (a generator change that loses one fails here)."""
    cases = [kvcache_case(random.Random(s), paths=("auto", "sm80")) for s in range(CASES)]
    assert cases == [kvcache_case(random.Random(s), paths=("auto", "sm80"))
                     for s in range(CASES)]
    for feature, present in {
        "paged": lambda c: c["page_size"] is not None,
        "contiguous": lambda c: c["page_size"] is None,
        "append": lambda c: c["seqlen_new"] > 0,
        "rotary": lambda c: c["rotary_dim"] > 0,
        "cache_batch_idx": lambda c: c["cache_batch_idx"] is not None,
        "cache_leftpad": lambda c: c["cache_leftpad"] is not None,
        "causal": lambda c: c["causal"],
        "window": lambda c: tuple(c["window_size"]) != (-1, -1),
        "softcap": lambda c: c["softcap"] > 0,
        "alibi": lambda c: c["alibi"] is not None,
        "gqa": lambda c: c["nheads"] != c["nheads_k"],
        "decode": lambda c: c["seqlen_q"] == 1,
        "speculative": lambda c: 2 <= c["seqlen_q"] <= 8,
        "num_splits": lambda c: c["num_splits"] > 1,
        "sm80 path": lambda c: c["path"] == "sm80",
        "argument error": lambda c: c["error"] is not None,
    }.items():
        assert any(present(c) for c in cases), f"no case with {feature} in {len(cases)} seeds"
