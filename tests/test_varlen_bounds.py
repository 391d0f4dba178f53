"""Varlen calls whose cu_seqlens contradict max_seqlen_q / max_seqlen_k or the tensors: the kernels
stop (problem/seqlen.h bad_seqlens: a device trap) instead of computing a plausible wrong answer
(an understated max_seqlen_q shifted a causal entry's diagonal onto future keys and left its last
rows unwritten; an understated max_seqlen_k dropped keys; a cu_seqlens past the tensor's rows
wrote out of it). A trap ends the process's CUDA context, so each case runs in a child process:
it must end with the CUDA error, never finish with an output. With FLASHATTN_CU_CHECK_SEQLENS=1
the Python functions read cu_seqlens first and raise a ValueError naming the entry (CPU tests
below). Controls: the same calls with an exact or overstated bound succeed and match the
reference in the child.

GPU: every kernel family that reads cu_seqlens is reached: the forward on the default path (sm90
on Hopper) and on the sm80 path, the backward (the op called with the bad bound after a good
forward), paged prefill (the kvcache kernels)."""

import os
import sys
import textwrap

import pytest
import torch

import flashattn_cu
from attn_helpers import ChildRuns
from flashattn_cu import _C

CHILD_ENV = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(flashattn_cu.__file__)))

needs_gpu_d64 = [pytest.mark.gpu,
                 pytest.mark.skipif(64 not in _C.built_head_dims(),
                                    reason="the cases need the d 64 instance built")]


def gpu_d64(fn):
    for mark in reversed(needs_gpu_d64):
        fn = mark(fn)
    return fn

# Run in the child with q, k, v (total 300 rows, 4 heads, d 64, bf16), cu (lengths 100, 0, 37,
# 163: the longest 163), the functions and the reference in scope; it must raise (from the CUDA
# error of the trap) after the kernel printed its line.
PRELUDE = textwrap.dedent("""
    import sys, torch
    from flashattn_cu import flash_attn_varlen_func
    from flashattn_cu.testing import attention_ref, kernel_path
    torch.manual_seed(0)
    lens = [100, 0, 37, 163]
    total = sum(lens)
    cu = torch.tensor([0, 100, 100, 137, 300], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(total, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    def check_against_reference(out, causal):
        for b, n in enumerate(lens):
            s = slice(int(cu[b]), int(cu[b]) + n)
            if n == 0:
                continue
            ref, _ = attention_ref(q[s][None], k[s][None], v[s][None], causal=causal)
            err = (out[s].float() - ref[0]).abs().max().item()
            assert err < 2e-2, (b, err)
""")

BAD = [
    ("fwd_max_q_understated_causal",
     "flash_attn_varlen_func(q, k, v, cu, cu, 160, 163, causal=True)", "cu_seqlens_q"),
    # max_seqlen_q 0: no forward kernel runs (nothing to compute); the binding launches the
    # check alone (flashattn_cu::check_varlen_seqlens) rather than return zeros for real rows.
    ("fwd_max_q_zero", "flash_attn_varlen_func(q, k, v, cu, cu, 0, 163)", "cu_seqlens_q"),
    ("fwd_max_k_understated",
     "flash_attn_varlen_func(q, k, v, cu, cu, 163, 120)", "cu_seqlens_k"),
    ("fwd_max_q_understated_sm80",
     "exec('with kernel_path(\"sm80\"):\\n flash_attn_varlen_func(q, k, v, cu, cu, 150, 163)')",
     "cu_seqlens_q"),
    ("fwd_decreasing",
     "flash_attn_varlen_func(q, k, v, torch.tensor([0, 100, 60, 137, 300], dtype=torch.int32, "
     "device='cuda'), cu, 163, 163)", "cu_seqlens_q"),
    ("fwd_past_the_rows",
     "flash_attn_varlen_func(q, k, v, cu, torch.tensor([0, 100, 100, 137, 340], "
     "dtype=torch.int32, device='cuda'), 163, 203)", "cu_seqlens_k"),
    ("bwd_max_q_understated",
     "exec('o, lse, st, rng, _ = torch.ops.flashattn_cu.fwd_varlen(q, k, v, cu, cu, None, 163, "
     "163, 0.125, True)\\ntorch.cuda.synchronize()\\ntorch.ops.flashattn_cu.bwd_varlen(o, q, k, "
     "v, o, lse, cu, cu, 140, 163, 0.125, True, False, st)')", "cu_seqlens_q"),
    ("paged_prefill_max_q_understated",
     "exec('kc = k.new_zeros(48, 16, 4, 64)\\nvc = v.new_zeros(48, 16, 4, 64)\\n"
     "table = torch.arange(48, dtype=torch.int32, device=\"cuda\").view(4, 12)\\n"
     "flash_attn_varlen_func(q, kc, vc, cu, cu, 150, 163, causal=True, block_table=table)')",
     "cu_seqlens_q"),
]

CHILD_BAD = PRELUDE + textwrap.dedent("""
    try:
        eval(sys.argv[1])
        torch.cuda.synchronize()
        print("FINISHED WITHOUT AN ERROR")
    except ValueError as exc:  # FLASHATTN_CU_CHECK_SEQLENS=1's, before any kernel
        print("VALUEERROR", exc)
""")


@pytest.fixture(scope="module")
def children():
    """Every GPU case's child (the bad calls with the host check off and on, and the controls),
    started together when the first of them runs."""
    runs = ChildRuns()
    for name, code, _ in BAD:
        for check in (False, True):
            env = dict(CHILD_ENV, FLASHATTN_CU_CHECK_SEQLENS="1" if check else "0")
            runs.submit((name, check), [sys.executable, "-c", CHILD_BAD, code], env=env)
    runs.submit("ok", [sys.executable, "-c", CHILD_OK], env=CHILD_ENV)
    yield runs
    runs.close()


def run_bad(children, name, check):
    res = children.result((name, check))
    return res, res.stdout + res.stderr


@gpu_d64
@pytest.mark.parametrize("name, code, which", BAD, ids=[c[0] for c in BAD])
def test_bad_cu_seqlens_stop_the_kernel(children, name, code, which):
    res, text = run_bad(children, name, check=False)
    assert "FINISHED WITHOUT AN ERROR" not in res.stdout, f"{name}: no error\n{text[-3000:]}"
    assert "VALUEERROR" not in res.stdout, f"{name}: the host check ran with it off\n{text}"
    # The trap surfaces as torch's "CUDA error: ..." at the next synchronization, or as the
    # binding's "CUDA launch failed" when a later launch of the same call meets it first (paged
    # prefill's outside-rows kernel, measured on the H200).
    assert res.returncode != 0 and ("CUDA error" in text or "CUDA launch failed" in text), \
        f"{name}\n{text[-3000:]}"


@gpu_d64
@pytest.mark.parametrize("name, code, which", [c for c in BAD if not c[0].startswith("bwd")],
                         ids=[c[0] for c in BAD if not c[0].startswith("bwd")])
def test_bad_cu_seqlens_named_with_the_host_check(children, name, code, which):
    """FLASHATTN_CU_CHECK_SEQLENS=1: the functions raise a ValueError naming the entry before
    anything runs (the op called directly, as the bwd case does, has only the kernels' check)."""
    res, text = run_bad(children, name, check=True)
    assert res.returncode == 0 and f"VALUEERROR flash_attn_varlen_func: {which}[" in res.stdout, \
        f"{name}\n{text[-3000:]}"


CHILD_OK = PRELUDE + textwrap.dedent("""
    for path in ("auto", "sm80"):
        with kernel_path(path):
            for causal in (False, True):
                for bounds in ((163, 163), (500, 1000)):  # exact and overstated
                    out = flash_attn_varlen_func(q, k, v, cu, cu, *bounds, causal=causal)
                    check_against_reference(out, causal)
    torch.cuda.synchronize()
    print("OK")
""")


@gpu_d64
def test_exact_and_overstated_bounds_run(children):
    """The checks stop nothing valid: the longest entry equal to the bound, and bounds larger
    than every entry (flash_attn allows those), on both paths, causal and not."""
    res = children.result("ok")
    assert res.returncode == 0 and res.stdout.strip().endswith("OK"), \
        (res.stdout[-3000:], res.stderr[-3000:])
    assert "flashattn_cu: cu_seqlens" not in res.stdout


# --------------------------------------------------------------------------------------------
# The host check (CPU)


@pytest.mark.parametrize("cu_q, cu_k, bounds, totals, message", [
    ([0, 3, 10], [0, 5, 9], (6, 5), (10, 9), r"cu_seqlens_q\[1\] = 3 and cu_seqlens_q\[2\] = 10 "
     r"give sequence 1 7 rows, but max_seqlen_q is 6 and q has 10 rows"),
    ([0, 3, 10], [0, 5, 9], (7, 4), (10, 9), r"cu_seqlens_k\[0\] = 0 and cu_seqlens_k\[1\] = 5 "
     r"give sequence 0 5 rows, but max_seqlen_k is 4"),
    ([0, 6, 3], [0, 1, 2], (6, 6), (10, 9), r"sequence 1 -3 rows"),
    ([0, 3, 12], [0, 1, 2], (9, 6), (10, 9), r"sequence 1 9 rows, but max_seqlen_q is 9 and q "
     r"has 10 rows"),
    ([-1, 3, 9], [0, 1, 2], (9, 6), (10, 9), r"cu_seqlens_q\[0\] = -1"),
    ([0, 3, 9], [0, 1, 40], (9, 40), (10, None), None),  # paged keys: no row bound
    ([0, 3, 9], [0, 1, 2], (6, 1), (10, 9), None),
])
def test_host_check_of_cu_seqlens(monkeypatch, cu_q, cu_k, bounds, totals, message):
    from flashattn_cu import _arguments

    args = (torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32),
            *bounds, *totals, "flash_attn_varlen_func")
    monkeypatch.setenv("FLASHATTN_CU_CHECK_SEQLENS", "0")
    _arguments._check_seqlens_values(*args)  # off: reads nothing
    monkeypatch.setenv("FLASHATTN_CU_CHECK_SEQLENS", "1")
    if message is None:
        _arguments._check_seqlens_values(*args)
    else:
        with pytest.raises(ValueError, match="flash_attn_varlen_func: .*" + message):
            _arguments._check_seqlens_values(*args)
