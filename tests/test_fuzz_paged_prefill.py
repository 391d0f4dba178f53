"""Seeded randomized ("fuzz") tests of paged prefill: flash_attn_varlen_func(..., block_table=...).

tests/test_paged_prefill.py checks this path on a fixed grid (one length list, page sizes 1 / 16 /
100 / 256, d 64 / 128, one feature at a time). Here each case draws a whole call from a seed and
combines the features at random: fp16 / bf16; every head dim that runs on a built instance (the
instance itself or a multiple of 8 that rounds up to it; the paged cache is read in place, so only
multiples of 8); MHA / GQA / MQA (nheads_k 1 .. 4, groups 1 .. 8); 1 .. 6 sequences with their own
query and key counts (0, 1, the kernels' block edges, up to 600 queries and ~1300 keys within a
size budget, fewer keys than queries, no query or no key in the whole batch); max_seqlen_q /
max_seqlen_k larger than the longest sequence; query rows past the last sequence (NaN or data);
page sizes 1 .. 512 with a random page order, spare pages, block tables wider than needed whose
unused columns point at NaN pages, at spare pages or at page numbers outside the cache (device
values the kernel clamps), pages shared by two sequences (a common prefix); q as a contiguous
tensor, a slice of a packed projection or a transposed view; k / v as separate caches or views of
one (num_blocks, page_block_size, 2, nheads_k, headdim) tensor; causal; windows (sides -1, 0,
small, around the lengths, at and past max_seqlen_k, causal spelled as a window); softcap; ALiBi
((nheads,) or (batch, nheads)); softmax_scale; return_attn_probs; deterministic (ignored here);
FLASHATTN_CU_CHECK_SEQLENS=1 (the host check of cu_seqlens must accept every valid case); the
kernel path.

Every cache row the call must not read holds NaN: the rows past each sequence's keys in its last
page, the pages of the table's unused columns, the spare pages. Each sequence is checked against
the fp32 reference (attention_ref with window_seqlen_k=max_seqlen_k: the window normalized
against max_seqlen_k, as flash_attn does) on its keys gathered through its block table, by
flash_attn's rule (out 2x + 1e-5, lse likewise; outputs poisoned by conftest, so a row never
written fails); rows past the last sequence must be 0 with lse +inf; q, the caches, the block
table and cu_seqlens must come back bitwise unchanged.

Some cases make q, k or v require grad: the output then requires grad and its backward raises
NotImplementedError naming block_table (forward only, as the docstring says); under
torch.no_grad / torch.inference_mode the output does not require grad. A small share of the cases
draws dropout_p > 0 (NotImplementedError naming dropout_p) or one argument that
flashattn_cu/kvcache.py's _paged_varlen (and the checks it calls in _arguments.py) rejects, and
expects that exception type with a message that names the argument.

Cases: FLASHATTN_CU_FUZZ_CASES (default 40) cases from seed FLASHATTN_CU_FUZZ_SEED (default 0):
case i uses seed base + i. Every failure message starts with the seed and the drawn
configuration; `FLASHATTN_CU_FUZZ_SEED=<seed> FLASHATTN_CU_FUZZ_CASES=1 pytest
tests/test_fuzz_paged_prefill.py -k against_reference` runs that case alone. The configuration
comes from random.Random(seed) in paged_prefill_case() (pure Python: print it without a GPU),
the tensors (page order included) from a CPU torch.Generator seeded with the same seed, so a
seed gives the same case on every machine with the same built head dims and kernel paths.
"""

import contextlib
import os
import random
from unittest import mock

import pytest
import torch

from attn_helpers import (assert_lse_rule, assert_raises_naming, assert_rule, bits, cu_seqlens,
                          draw_alibi, kernel_paths, skip_unless_built, with_tanh_approx)
from flashattn_cu import _C
from flashattn_cu import flash_attn_varlen_func
from flashattn_cu._arguments import _flash_attn_window
from flashattn_cu.testing import attention_ref, kernel_path
from test_kvcache import gather_pages, pages_per_entry, to_pages

DEVICE = "cuda"
CASES = int(os.environ.get("FLASHATTN_CU_FUZZ_CASES", 40))
BASE_SEED = int(os.environ.get("FLASHATTN_CU_FUZZ_SEED", 0))
DEFAULT_CASES = 40  # the seeds the CPU coverage test looks at: 0 .. 39

PAGE_SIZES = (1, 3, 8, 16, 16, 48, 64, 64, 100, 128, 256, 512)
# Query / key counts at the kernels' block edges (64-, 128- and 176-row tiles).
EDGES = (63, 64, 65, 127, 128, 129, 175, 176, 177)
MAX_QUERIES = 600
MAX_KEYS = 1200
# nheads * sum over the sequences of queries x keys: larger cases are cut down (the reference
# is plain PyTorch, one sequence at a time).
SCORE_BUDGET = 12_000_000
CHECK_SEQLENS = "FLASHATTN_CU_CHECK_SEQLENS"

# (kind, what it needs of the drawn case): one argument turned into a documented error.
ERROR_KINDS = (
    ("dropout_out_of_range", None),
    ("q_rank_4", None),
    ("k_rank_3", None),
    ("v_shape_differs", None),
    ("q_fp32", None),
    ("k_other_dtype", None),
    ("head_dim_unsupported", None),
    ("k_head_dim_differs", "head_dim_16"),
    ("nheads_not_multiple_of_nheads_k", "gqa_heads_k"),
    ("k_without_pages", None),
    ("cu_seqlens_q_int64", None),
    ("cu_seqlens_k_longer", None),
    ("max_seqlen_negative", None),
    ("max_seqlen_not_int", None),
    ("seqlen_past_max_checked", "some_length"),
    ("block_table_not_a_tensor", None),
    ("block_table_int64", None),
    ("block_table_too_narrow", "two_columns"),
    ("block_table_wrong_shape", None),
    ("block_table_other_device", None),
    ("window_not_a_pair", None),
    ("window_not_ints", None),
    ("softcap_invalid", None),
    ("softmax_scale_not_positive", None),
    ("alibi_wrong_shape", None),
    ("alibi_fp16", None),
    ("alibi_other_device", None),
)


# ---------------------------------------------------------------------------------------------
# The configuration: pure Python, from random.Random(seed)


def _head_dim(rng, built):
    """A multiple of 8 that runs on one of the built instances: the instance, or a head dim
    between the instance below it and it (rounded up to it)."""
    instances = sorted(_C.head_dim_instances())
    inst = rng.choice(sorted(built))
    lower = [i for i in instances if i < inst]
    start = (lower[-1] if lower else 0) + 8
    if rng.random() < 0.5 or start > inst:
        return inst
    return rng.randrange(start, inst + 1, 8)


def _query_count(rng):
    r = rng.random()
    if r < 0.12:
        return 0
    if r < 0.24:
        return 1
    if r < 0.46:
        return rng.choice(EDGES)
    if r < 0.85:
        return rng.randint(2, 120)
    return rng.randint(121, MAX_QUERIES)


def _key_count(rng, queries):
    r = rng.random()
    if r < 0.1:
        return 0
    if r < 0.18:
        return 1
    if r < 0.42:  # the prompt after a cached prefix (possibly empty)
        return queries + rng.choice((0, 0, rng.randint(1, 16), rng.randint(17, 700)))
    if r < 0.55:  # fewer keys than queries
        return max(0, queries - rng.randint(1, 100))
    if r < 0.7:
        return rng.choice(EDGES + (191, 192, 193, 255, 256, 257))
    return rng.randint(2, MAX_KEYS)


def _fit_budget(lq, lk, nheads):
    """Halves the larger count of the costliest sequence until the case fits SCORE_BUDGET."""
    while nheads * sum(a * b for a, b in zip(lq, lk)) > SCORE_BUDGET:
        b = max(range(len(lq)), key=lambda i: lq[i] * lk[i])
        if lq[b] >= lk[b]:
            lq[b] //= 2
        else:
            lk[b] //= 2


def _past(rng):
    """How far a max_seqlen goes past the longest sequence."""
    return rng.choice((1, rng.randint(2, 64), rng.randint(65, 300)))


def _window_side(rng, max_k, longest_q, longest_k):
    """One side of a window: unbounded (any negative), 0, small, around the lengths, at and past
    max_seqlen_k."""
    r = rng.random()
    if r < 0.18:
        return rng.choice((-1, -1, -1, -2, -100))
    if r < 0.3:
        return 0
    if r < 0.52:
        return rng.randint(1, 16)
    if r < 0.72:
        around = rng.choice((longest_k, longest_q, abs(longest_k - longest_q)))
        return max(0, around + rng.randint(-3, 3))
    if r < 0.88:  # the bound flash_attn normalizes against: exactly at it most often
        return max(0, max_k + rng.choice((-1, 0, 0, 1)))
    return max_k + rng.choice((1, rng.randint(2, 1000), 10 ** 6))


def paged_prefill_case(rng, built=None, paths=("auto",), errors=True):
    """One random configuration of a paged flash_attn_varlen_func call, a dict of plain values.

    built: the head-dim instances to draw from (default every instance); paths: the kernel paths
    the GPU has (attn_helpers.kernel_paths()); errors: whether a small share of the cases draws
    dropout or another documented argument error instead of a valid call."""
    built = list(built) if built else list(_C.head_dim_instances())
    cfg = {}
    cfg["dtype"] = rng.choice(("float16", "bfloat16"))
    d = cfg["head_dim"] = _head_dim(rng, built)
    nheads_k = cfg["nheads_k"] = rng.choice((1, 1, 2, 2, 3, 4))
    group = rng.choice((1, 1, 2, 2, 3, 4, 5, 6, 7, 8))
    cfg["nheads"] = nheads_k * min(group, max(1, 16 // nheads_k))
    batch = cfg["batch"] = rng.randint(1, 6)

    lq = [_query_count(rng) for _ in range(batch)]
    lk = [_key_count(rng, n) for n in lq]
    r = rng.random()
    if r < 0.04:
        lq = [0] * batch  # no query row in the whole batch
    elif r < 0.08:
        lk = [0] * batch  # no key in the whole batch
    _fit_budget(lq, lk, cfg["nheads"])
    cfg["lengths_q"], cfg["lengths_k"] = lq, lk
    cfg["max_seqlen_q"] = max(lq) + (_past(rng) if rng.random() < 0.3 else 0)
    cfg["max_seqlen_k"] = max(lk) + (_past(rng) if rng.random() < 0.3 else 0)
    cfg["spare_q"] = rng.choice((0, 0, 0, rng.randint(1, 70)))
    cfg["spare_q_nan"] = rng.random() < 0.5

    page = cfg["page_size"] = rng.choice(PAGE_SIZES)
    need = max(1, -(-cfg["max_seqlen_k"] // page))
    cfg["table_width"] = need + (0 if rng.random() < 0.65 else rng.randint(1, 3))
    cfg["spare_pages"] = rng.randint(0, 5)
    r = rng.random()
    cfg["table_fill"] = "own" if r < 0.55 else "spare" if r < 0.82 else "wild"
    if cfg["table_fill"] == "spare":
        cfg["spare_pages"] = max(1, cfg["spare_pages"])
    cfg["shared_prefix"] = None  # (a, b, pages): b's first pages are a's
    if batch >= 2 and rng.random() < 0.25:
        a, b = rng.sample(range(batch), 2)
        full = min(lk[a], lk[b]) // page
        if full >= 1:
            cfg["shared_prefix"] = (a, b, rng.randint(1, min(full, 40)))
    r = rng.random()
    cfg["q_layout"] = "contiguous" if r < 0.7 else "packed" if r < 0.85 else "transposed"
    cfg["kv_layout"] = "separate" if rng.random() < 0.7 else "interleaved"

    cfg["causal"] = rng.random() < 0.4
    if rng.random() < 0.45:
        sides = (cfg["max_seqlen_k"], max(lq), max(lk))
        cfg["window_size"] = (_window_side(rng, *sides), _window_side(rng, *sides))
        if rng.random() < 0.2:  # causal spelled as a window
            cfg["window_size"] = (rng.choice((-1, cfg["max_seqlen_k"], 10 ** 6)), 0)
    else:
        cfg["window_size"] = (-1, -1)
    cfg["softcap"] = round(rng.uniform(1.0, 50.0), 3) if rng.random() < 0.2 else 0.0
    r = rng.random()
    cfg["alibi"] = None if r < 0.78 else ("heads" if r < 0.89 else "batch_heads")
    cfg["softmax_scale"] = None if rng.random() < 0.7 else round(rng.uniform(0.02, 0.4), 4)
    cfg["return_attn_probs"] = rng.random() < 0.6
    cfg["deterministic"] = rng.random() < 0.3
    cfg["check_seqlens"] = rng.random() < 0.15
    use_sm80 = rng.random() < 0.5
    cfg["path"] = "sm80" if use_sm80 and "sm80" in paths else "auto"
    r = rng.random()
    cfg["grad"] = ("backward" if r < 0.1 else "no_grad" if r < 0.16 else
                   "inference_mode" if r < 0.2 else "none")
    cfg["grad_inputs"] = rng.choice(("q", "k", "v", "qk", "kv", "qkv")) \
        if cfg["grad"] != "none" else ""

    cfg["error"] = None
    r = rng.random()
    if errors and r < 0.04:
        cfg["error"] = "dropout"
        cfg["error_value"] = rng.choice((0.1, 0.5, 0.9, 1e-6))
    elif errors and r < 0.14:
        have = {None: True, "head_dim_16": d >= 16, "gqa_heads_k": nheads_k >= 2,
                "some_length": max(lq) >= 1 or max(lk) >= 1, "two_columns": need >= 2}
        kinds = [kind for kind, needs in ERROR_KINDS if have[needs]]
        kind = cfg["error"] = rng.choice(kinds)
        if kind == "seqlen_past_max_checked":
            which = rng.choice([w for w, ls in (("q", lq), ("k", lk)) if max(ls) >= 1])
        else:
            which = rng.choice(("q", "k"))
        cfg["error_value"] = {
            "dropout_out_of_range": rng.choice((1.0, 1.5, -0.1)),
            "head_dim_unsupported": rng.choice((d - 4, d + 4, 264, 512)),
            "max_seqlen_negative": which,
            "max_seqlen_not_int": which,
            "seqlen_past_max_checked": which,
            "block_table_wrong_shape": rng.choice(("more_rows", "fewer_rows", "flat", "3d"))
            if batch >= 2 else rng.choice(("more_rows", "flat", "3d")),
            "window_not_a_pair": rng.choice(((1, 2, 3), (4,), 5)),
            "window_not_ints": rng.choice(((2.5, -1), (-1, 1.0), (True, 0))),
            "softcap_invalid": rng.choice((-round(rng.uniform(0.5, 50.0), 3), float("inf"))),
            "softmax_scale_not_positive": rng.choice((0.0, -0.125, float("inf"))),
            "alibi_wrong_shape": rng.choice(("nheads_plus_1", "batch_plus_1")),
        }.get(kind)
    if cfg["error"] is not None:
        cfg["grad"], cfg["grad_inputs"] = "none", ""
    return cfg


def normalized_window(cfg):
    """(causal, left, right) as the interface leaves the case's mask (flash_attn's rules against
    max_seqlen_k; the CPU coverage test asks whether a window survives them)."""
    left, right = (side if side >= 0 else -1 for side in cfg["window_size"])
    return _flash_attn_window(cfg["causal"], left, right, cfg["max_seqlen_k"])


def describe(seed, cfg):
    return f"[seed {seed}] {cfg}"


# ---------------------------------------------------------------------------------------------
# Tensors from the configuration


def build_inputs(cfg, seed):
    """The case's tensors, drawn from a CPU torch.Generator seeded with `seed` and then moved to
    DEVICE: q (total_q, nheads, d) in its layout, the paged caches and their block table, the
    cumulative lengths, the ALiBi slopes, and own_pages[b] (the table columns that hold sequence
    b's keys)."""
    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, cfg["dtype"])
    d, nheads, nheads_k, batch = cfg["head_dim"], cfg["nheads"], cfg["nheads_k"], cfg["batch"]
    lq, lk, page, width = cfg["lengths_q"], cfg["lengths_k"], cfg["page_size"], \
        cfg["table_width"]
    nan = float("nan")

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    inp = {}
    used_q = sum(lq)
    q = randn(used_q + cfg["spare_q"], nheads, d)
    if cfg["spare_q_nan"]:
        q[used_q:] = nan
    keys, values = randn(sum(lk), nheads_k, d), randn(sum(lk), nheads_k, d)

    # The logical caches (batch, width * page, nheads_k, d): each sequence's keys, then NaN.
    k_logical = torch.full((batch, width * page, nheads_k, d), nan, dtype=dtype)
    v_logical = torch.full_like(k_logical, nan)
    at = 0
    for b, n in enumerate(lk):
        k_logical[b, :n], v_logical[b, :n] = keys[at:at + n], values[at:at + n]
        at += n
    num_pages = batch * width + cfg["spare_pages"]
    assert pages_per_entry(width * page, page) == width
    perm = torch.randperm(num_pages, generator=gen)
    k_paged, table = to_pages(k_logical, page, num_pages, perm)
    v_paged, _ = to_pages(v_logical, page, num_pages, perm)
    table = table.clone()
    own = [pages_per_entry(n, page) for n in lk]
    if cfg["shared_prefix"] is not None:
        a, b, shared = cfg["shared_prefix"]
        table[b, :shared] = table[a, :shared]
    if cfg["table_fill"] != "own":
        spare = perm[batch * width:]
        wild = torch.tensor((-1, num_pages, num_pages + 1000, 2 ** 31 - 1, -2 ** 31),
                            dtype=torch.int64)
        pool = spare if cfg["table_fill"] == "spare" else wild
        for b in range(batch):
            unused = width - own[b]
            if unused > 0:
                pick = torch.randint(len(pool), (unused,), generator=gen)
                table[b, own[b]:] = pool[pick].to(torch.int32)
    inp["own_pages"] = own

    if cfg["q_layout"] == "packed":  # the middle third of a (total_q, 3, nheads, d) projection
        packed = torch.full((q.shape[0], 3, nheads, d), nan, dtype=dtype)
        packed[:, 1] = q
        inp["q"] = packed.to(DEVICE)[:, 1]
    elif cfg["q_layout"] == "transposed":  # dense (nheads, total_q, d) storage
        inp["q"] = q.transpose(0, 1).contiguous().to(DEVICE).transpose(0, 1)
    else:
        inp["q"] = q.to(DEVICE)
    if cfg["kv_layout"] == "interleaved":  # views of one (num_blocks, page, 2, nheads_k, d)
        kv = torch.stack((k_paged, v_paged), dim=2).to(DEVICE)
        inp["k_cache"], inp["v_cache"] = kv[:, :, 0], kv[:, :, 1]
    else:
        inp["k_cache"], inp["v_cache"] = k_paged.to(DEVICE), v_paged.to(DEVICE)
    inp["block_table"] = table.to(DEVICE)
    inp["cu_seqlens_q"], inp["cu_seqlens_k"] = cu_seqlens(lq, DEVICE), cu_seqlens(lk, DEVICE)
    inp["alibi"] = draw_alibi(cfg["alibi"], nheads, batch, gen)
    return inp


def call_kwargs(cfg, inp):
    """flash_attn_varlen_func's keyword arguments for the case."""
    return dict(q=inp["q"], k=inp["k_cache"], v=inp["v_cache"],
                cu_seqlens_q=inp["cu_seqlens_q"], cu_seqlens_k=inp["cu_seqlens_k"],
                max_seqlen_q=cfg["max_seqlen_q"], max_seqlen_k=cfg["max_seqlen_k"],
                dropout_p=0.0, softmax_scale=cfg["softmax_scale"], causal=cfg["causal"],
                window_size=tuple(cfg["window_size"]), softcap=cfg["softcap"],
                alibi_slopes=inp["alibi"], deterministic=cfg["deterministic"],
                return_attn_probs=cfg["return_attn_probs"], block_table=inp["block_table"])


def _synchronize():
    """A device error of the call surfaces here, inside the case (its seed in the message)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------
# Documented argument errors (flashattn_cu/kvcache.py, _paged_varlen, and _arguments.py)


def _error_call(cfg, kw):
    """kw with the case's error applied: (kw, environment, exception type, the texts the message
    must contain)."""
    kind, value = cfg["error"], cfg.get("error_value")
    kw = dict(kw)
    env = {}
    q, k, v, table = kw["q"], kw["k"], kw["v"], kw["block_table"]
    if kind == "dropout":
        kw["dropout_p"] = value
        return kw, env, NotImplementedError, ("dropout_p",)
    if kind == "dropout_out_of_range":
        kw["dropout_p"] = value
        return kw, env, ValueError, ("dropout_p",)
    if kind == "q_rank_4":
        kw["q"] = q[None]
        return kw, env, ValueError, ("q must have rank 3",)
    if kind == "k_rank_3":
        kw["k"] = k.reshape(-1, *k.shape[2:])
        return kw, env, ValueError, ("k must have rank 4",)
    if kind == "v_shape_differs":
        kw["v"] = torch.cat((v, v[:1]))
        return kw, env, ValueError, ("v has shape",)
    if kind == "q_fp32":
        kw["q"] = q.float()
        return kw, env, TypeError, ("q has dtype",)
    if kind == "k_other_dtype":
        kw["k"] = k.to(torch.bfloat16 if k.dtype == torch.float16 else torch.float16)
        return kw, env, TypeError, ("k has dtype",)
    if kind in ("head_dim_unsupported", "k_head_dim_differs"):
        d = value if kind == "head_dim_unsupported" else cfg["head_dim"] - 8
        names = ("k", "v") if kind == "k_head_dim_differs" else ("q", "k", "v")
        for name in names:
            kw[name] = torch.zeros(*kw[name].shape[:-1], d, dtype=q.dtype, device=DEVICE)
        return kw, env, ValueError, ("head dim" if kind == "head_dim_unsupported" else
                                     "k has head dim",)
    if kind == "nheads_not_multiple_of_nheads_k":
        kw["q"] = torch.zeros(q.shape[0], q.shape[1] + 1, q.shape[2], dtype=q.dtype,
                              device=DEVICE)
        return kw, env, ValueError, ("nheads",)
    if kind == "k_without_pages":
        kw["k"], kw["v"] = k[:0], v[:0]
        return kw, env, ValueError, ("paged k",)
    if kind == "cu_seqlens_q_int64":
        kw["cu_seqlens_q"] = kw["cu_seqlens_q"].long()
        return kw, env, ValueError, ("cu_seqlens_q",)
    if kind == "cu_seqlens_k_longer":
        cu = kw["cu_seqlens_k"]
        kw["cu_seqlens_k"] = torch.cat((cu, cu[-1:]))
        return kw, env, ValueError, ("cu_seqlens_k",)
    if kind == "max_seqlen_negative":
        kw[f"max_seqlen_{value}"] = -1
        return kw, env, ValueError, (f"max_seqlen_{value}",)
    if kind == "max_seqlen_not_int":
        kw[f"max_seqlen_{value}"] = float(kw[f"max_seqlen_{value}"])
        return kw, env, ValueError, (f"max_seqlen_{value}",)
    if kind == "seqlen_past_max_checked":
        # The host check (a synchronization) of FLASHATTN_CU_CHECK_SEQLENS=1 names the sequence
        # (without it such a call stops with a device-side trap: the docstring).
        lengths = cfg[f"lengths_{value}"]
        kw[f"max_seqlen_{value}"] = max(lengths) - 1
        env[CHECK_SEQLENS] = "1"
        return kw, env, ValueError, (f"cu_seqlens_{value}", f"max_seqlen_{value}")
    if kind == "block_table_not_a_tensor":
        kw["block_table"] = table.tolist()
        return kw, env, TypeError, ("block_table",)
    if kind == "block_table_int64":
        kw["block_table"] = table.long()
        return kw, env, TypeError, ("block_table",)
    if kind == "block_table_too_narrow":
        need = -(-cfg["max_seqlen_k"] // cfg["page_size"])
        kw["block_table"] = table[:, :need - 1]
        return kw, env, ValueError, ("block_table",)
    if kind == "block_table_wrong_shape":
        kw["block_table"] = {"more_rows": lambda: torch.cat((table, table[:1])),
                             "fewer_rows": lambda: table[1:],
                             "flat": lambda: table.flatten(),
                             "3d": lambda: table[None]}[value]()
        return kw, env, ValueError, ("block_table",)
    if kind == "block_table_other_device":
        kw["block_table"] = table.to("meta")
        return kw, env, ValueError, ("block_table",)
    if kind in ("window_not_a_pair", "window_not_ints"):
        kw["window_size"] = value
        return kw, env, ValueError, ("window_size",)
    if kind == "softcap_invalid":
        kw["softcap"] = value
        return kw, env, ValueError, ("softcap",)
    if kind == "softmax_scale_not_positive":
        kw["softmax_scale"] = value
        return kw, env, ValueError, ("softmax_scale",)
    if kind == "alibi_wrong_shape":
        shape = (cfg["nheads"] + 1,) if value == "nheads_plus_1" else \
            (cfg["batch"] + 1, cfg["nheads"])
        kw["alibi_slopes"] = torch.full(shape, 0.25).to(DEVICE)
        return kw, env, ValueError, ("alibi_slopes",)
    if kind == "alibi_fp16":
        kw["alibi_slopes"] = torch.full((cfg["nheads"],), 0.25, dtype=torch.float16).to(DEVICE)
        return kw, env, TypeError, ("alibi_slopes",)
    if kind == "alibi_other_device":
        kw["alibi_slopes"] = torch.full((cfg["nheads"],), 0.25, device="meta")
        return kw, env, ValueError, ("alibi_slopes",)
    raise AssertionError(f"unknown error kind {kind}")


def check_documented_error(what, cfg, inp):
    kw, env, exc, names = _error_call(cfg, call_kwargs(cfg, inp))
    if cfg["check_seqlens"]:
        env.setdefault(CHECK_SEQLENS, "1")

    def call():
        with mock.patch.dict(os.environ, env), kernel_path(cfg["path"]):
            flash_attn_varlen_func(**kw)
            _synchronize()
    assert_raises_naming(call, exc, names, what)


# ---------------------------------------------------------------------------------------------
# The tests


def _grad_context(mode):
    if mode == "no_grad":
        return torch.no_grad()
    if mode == "inference_mode":
        return torch.inference_mode()
    return contextlib.nullcontext()


def checked_call(what, cfg, kw):
    """flash_attn_varlen_func(**kw) on the case's kernel path, grad mode and environment; an
    exception from a valid call (or a device error it causes) fails with the seed and
    configuration."""
    env = {CHECK_SEQLENS: "1"} if cfg["check_seqlens"] else {}
    try:
        with mock.patch.dict(os.environ, env), kernel_path(cfg["path"]), \
                _grad_context(cfg["grad"]):
            result = flash_attn_varlen_func(**kw)
            _synchronize()
    except Exception as e:
        raise AssertionError(f"{what}: a valid call raised {type(e).__name__}: {e}") from e
    return result


def _case(seed, **kw):
    return paged_prefill_case(random.Random(seed), built=_C.built_head_dims(),
                              paths=kernel_paths(), **kw)


def _check_against_reference(what, cfg, inp, out, lse):
    dtype = getattr(torch, cfg["dtype"])
    lq, lk = cfg["lengths_q"], cfg["lengths_k"]
    total_q, nheads, d = inp["q"].shape
    used = sum(lq)
    assert out.dtype == dtype and tuple(out.shape) == (total_q, nheads, d), \
        f"{what}: out {out.dtype} {tuple(out.shape)}"
    if lse is not None:
        assert lse.dtype == torch.float32 and tuple(lse.shape) == (nheads, total_q), \
            f"{what}: lse {lse.dtype} {tuple(lse.shape)}"

    # Rows past the last sequence: the output of no sequence, 0 with lse +inf.
    assert (out[used:] == 0).all(), f"{what}: out rows past the last sequence are not 0"
    if lse is not None:
        assert (lse[:, used:] == float("inf")).all(), \
            f"{what}: lse rows past the last sequence are not +inf"

    page, alibi = cfg["page_size"], inp["alibi"]
    q0 = 0
    for b, (nq, nk) in enumerate(zip(lq, lk)):
        rows = slice(q0, q0 + nq)
        q0 += nq
        if nq == 0:
            continue
        # Sequence b's keys: the first nk rows of its pages in block table order.
        columns = inp["block_table"][b:b + 1, :inp["own_pages"][b]]
        keys = gather_pages(inp["k_cache"].detach(), columns)[:, :nk]
        values = gather_pages(inp["v_cache"].detach(), columns)[:, :nk]
        qb = inp["q"].detach()[rows][None]
        slopes = None
        if alibi is not None:
            slopes = alibi if alibi.dim() == 1 else alibi[b:b + 1]
        kw = dict(causal=cfg["causal"], window_size=tuple(cfg["window_size"]),
                  softcap=cfg["softcap"], alibi_slopes=slopes,
                  softmax_scale=cfg["softmax_scale"], window_seqlen_k=cfg["max_seqlen_k"])
        ref, lse_ref = attention_ref(qb.float(), keys, values, **kw)
        pt, lse_pt = attention_ref(qb, keys, values, upcast=False, **kw)
        pt, lse_pt = with_tanh_approx(pt, lse_pt, ref, lse_ref, qb, keys, values, **kw)
        entry = f"{what}: sequence {b} ({nq} queries x {nk} keys, page {page})"
        assert_rule(out[rows][None], ref, pt, 2, 1e-5, f"{entry}: out")
        if lse is not None:
            assert_lse_rule(lse[:, rows][None], lse_ref, lse_pt, f"{entry}: lse")


def _check_backward_raises(what, out, leaves):
    try:
        torch.autograd.grad(out, leaves, torch.ones_like(out))
    except NotImplementedError as e:
        assert "block_table" in str(e), f"{what}: the backward's message: {e}"
    except Exception as e:
        raise AssertionError(f"{what}: the backward raised {type(e).__name__}: {e}") from e
    else:
        raise AssertionError(f"{what}: the backward of a paged call did not raise")


@pytest.mark.gpu
@pytest.mark.parametrize("index", range(CASES), ids=[f"seed{BASE_SEED + i}" for i in range(CASES)])
def test_fuzz_paged_prefill_against_reference(index):
    seed = BASE_SEED + index
    cfg = _case(seed)
    what = describe(seed, cfg)
    skip_unless_built(cfg["head_dim"])
    try:
        inp = build_inputs(cfg, seed)
        if cfg["error"] is not None:
            check_documented_error(what, cfg, inp)
            return
        names = ("q", "k_cache", "v_cache", "block_table", "cu_seqlens_q", "cu_seqlens_k")
        before = {name: inp[name].clone() for name in names}
        leaves = []
        for letter, name in (("q", "q"), ("k", "k_cache"), ("v", "v_cache")):
            if letter in cfg["grad_inputs"]:
                leaves.append(inp[name].requires_grad_())
        result = checked_call(what, cfg, call_kwargs(cfg, inp))

        # The return arity: out, or (out, softmax_lse, None) with return_attn_probs.
        if cfg["return_attn_probs"]:
            assert isinstance(result, tuple) and len(result) == 3 and result[2] is None, \
                f"{what}: returned {type(result).__name__} of {len(result)}"
            out, lse, _ = result
        else:
            assert isinstance(result, torch.Tensor), f"{what}: returned {type(result)}"
            out, lse = result, None
        want_grad = cfg["grad"] == "backward"
        assert out.requires_grad == want_grad, \
            f"{what}: out.requires_grad is {out.requires_grad} (grad mode {cfg['grad']})"
        for name in names:
            assert torch.equal(bits(inp[name].detach()), bits(before[name])), \
                f"{what}: {name} modified"

        _check_against_reference(what, cfg, inp, out.detach(),
                                 None if lse is None else lse.detach())
        if want_grad:
            _check_backward_raises(what, out, leaves)
    except AssertionError:
        raise
    except Exception as e:  # a failure of the test's own code: still under its seed
        raise AssertionError(f"{what}: {type(e).__name__}: {e}") from e


def test_case_generator_is_reproducible_and_covers_the_features():
    """CPU: the configurations are a function of the seed, and the default seeds draw every
    feature (a generator change that loses one fails here)."""
    seeds = range(DEFAULT_CASES)
    cases = [paged_prefill_case(random.Random(s), paths=("auto", "sm80")) for s in seeds]
    assert cases == [paged_prefill_case(random.Random(s), paths=("auto", "sm80"))
                     for s in seeds]
    valid = [c for c in cases if c["error"] is None]
    for feature, present in {
        "float16": lambda c: c["dtype"] == "float16",
        "bfloat16": lambda c: c["dtype"] == "bfloat16",
        "head dim below its instance": lambda c: c["head_dim"] not in _C.head_dim_instances(),
        "gqa": lambda c: 1 < c["nheads"] // c["nheads_k"] < c["nheads"],
        "mqa": lambda c: c["nheads_k"] == 1 and c["nheads"] > 1,
        "batch of 5 or more": lambda c: c["batch"] >= 5,
        "sequence without queries": lambda c: 0 in c["lengths_q"],
        "sequence with one query": lambda c: 1 in c["lengths_q"],
        "sequence without keys": lambda c: 0 in c["lengths_k"],
        "query count at a block edge": lambda c: bool(set(EDGES) & set(c["lengths_q"])),
        "more than 300 queries": lambda c: max(c["lengths_q"]) > 300,
        "more than 600 keys": lambda c: max(c["lengths_k"]) > 600,
        "fewer keys than queries": lambda c: any(0 < k < q for q, k in
                                                 zip(c["lengths_q"], c["lengths_k"])),
        "max_seqlen_q past the longest": lambda c: c["max_seqlen_q"] > max(c["lengths_q"]),
        "max_seqlen_k past the longest": lambda c: c["max_seqlen_k"] > max(c["lengths_k"]),
        "rows past the last sequence": lambda c: c["spare_q"] > 0,
        "page size 1": lambda c: c["page_size"] == 1,
        "page size not a power of 2": lambda c: c["page_size"] in (3, 48, 100),
        "page size 256 or more": lambda c: c["page_size"] >= 256,
        "wider block table": lambda c: c["table_width"] > max(
            1, -(-c["max_seqlen_k"] // c["page_size"])),
        "unused columns on spare pages": lambda c: c["table_fill"] == "spare",
        "unused columns out of range": lambda c: c["table_fill"] == "wild",
        "shared prefix pages": lambda c: c["shared_prefix"] is not None,
        "packed q": lambda c: c["q_layout"] == "packed",
        "transposed q": lambda c: c["q_layout"] == "transposed",
        "interleaved k / v": lambda c: c["kv_layout"] == "interleaved",
        "causal": lambda c: c["causal"],
        "window": lambda c: normalized_window(c)[1] >= 0 or normalized_window(c)[2] > 0,
        "window unbounded by max_seqlen_k": lambda c: max(c["window_size"]) >= c["max_seqlen_k"],
        "softcap": lambda c: c["softcap"] > 0,
        "alibi (nheads,)": lambda c: c["alibi"] == "heads",
        "alibi (batch, nheads)": lambda c: c["alibi"] == "batch_heads",
        "softmax_scale": lambda c: c["softmax_scale"] is not None,
        "return_attn_probs": lambda c: c["return_attn_probs"],
        "FLASHATTN_CU_CHECK_SEQLENS": lambda c: c["check_seqlens"],
        "backward raises": lambda c: c["grad"] == "backward",
        "no_grad / inference_mode": lambda c: c["grad"] in ("no_grad", "inference_mode"),
        "sm80 path": lambda c: c["path"] == "sm80",
    }.items():
        assert any(present(c) for c in valid), f"no valid case with {feature} in seeds " \
                                               f"0 .. {DEFAULT_CASES - 1}"
    assert any(c["error"] == "dropout" for c in cases), "no dropout case"
    assert any(c["error"] not in (None, "dropout") for c in cases), "no argument error case"
    combined = [c for c in valid if sum((c["causal"] or c["window_size"] != (-1, -1),
                                         c["softcap"] > 0, c["alibi"] is not None,
                                         c["nheads"] != c["nheads_k"])) >= 3]
    assert combined, "no case combining three of mask, softcap, ALiBi and GQA"
