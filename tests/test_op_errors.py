"""Bad arguments straight to torch.ops.flashattn_cu.fwd / .bwd (as torch.compile, opcheck and
C++ callers reach them, past flash_attn_func's Python checks) must raise a Python exception that
names the argument: never crash the process. Each call runs in a child process, so a crash is a
test failure with its exit status, not the end of the test run (on the H200 image a message that
streamed a number once killed the process with SIGSEGV)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import flashattn_cu
from attn_helpers import ChildRuns
from flashattn_cu import _C

# Children run from outside the checkout with the tested package's own location on the path, so
# they import the same built package as this process.
CHILD_ENV = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(flashattn_cu.__file__)))

# The cases' tensors have head dim 64 (and one of 128): a build without that instance answers
# them with its own NotImplementedError instead (a build of other head dims, e.g.
# FLASHATTN_CU_HEAD_DIMS=256 on the device while iterating).
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(64 not in _C.built_head_dims(),
                                 reason="the cases need the d 64 instance built")]

# (name, code run with q, k, v (bf16, (2, 64, 4, 64) / (2, 80, 2, 64)), out, lse, stats, dout
# and the ops in scope; expected exception type; a fragment of its message)
CASES = [
    ("scale_zero", "fwd(q, k, v, 0.0, False)", "ValueError", "softmax_scale"),
    ("scale_negative", "fwd(q, k, v, -0.5, False)", "ValueError", "softmax_scale"),
    ("scale_nan", "fwd(q, k, v, float('nan'), False)", "ValueError", "softmax_scale"),
    ("scale_underflows_float32", "fwd(q, k, v, 1e-50, False)", "ValueError", "softmax_scale"),
    ("scale_subnormal_float32", "fwd(q, k, v, 1e-40, False)", "ValueError", "softmax_scale"),
    ("scale_overflows_float32", "fwd(q, k, v, 1e39, False)", "ValueError", "softmax_scale"),
    ("scale_log2_overflows", "fwd(q, k, v, 2.4e38, False)", "ValueError", "softmax_scale"),
    ("bwd_scale_underflows", "bwd(dout, q, k, v, out, lse, 1e-50, False, False, stats)",
     "ValueError", "softmax_scale"),
    ("head_dim_60", "fwd(q[..., :60].contiguous(), k[..., :60].contiguous(), "
                    "v[..., :60].contiguous(), 0.125, False)", "ValueError", "head dim"),
    ("head_dim_264", "fwd(*(torch.zeros(1, 4, 2, 264, device='cuda', dtype=torch.bfloat16),) * 3,"
                     " 0.06, False)", "ValueError", "head dim"),
    ("nheads_not_multiple", "fwd(q, k[:, :, :1].expand(2, 80, 3, 64), v[:, :, :1].expand(2, 80, 3, 64), "
                            "0.125, False)", "ValueError", "multiple of nheads"),
    ("float32_inputs", "fwd(q.float(), k.float(), v.float(), 0.125, False)", "TypeError",
     "dtype"),
    ("mixed_dtypes", "fwd(q, k.half(), v, 0.125, False)", "TypeError", "dtypes must match"),
    ("k_on_cpu", "fwd(q, k.cpu(), v, 0.125, False)", "ValueError", "k must be a CUDA tensor"),
    ("rank_3", "fwd(q[0], k[0], v[0], 0.125, False)", "ValueError", "rank 4"),
    ("batch_mismatch", "fwd(q, k[:1], v[:1], 0.125, False)", "ValueError", "batch sizes differ"),
    ("last_dim_strided", "fwd(torch.zeros(2, 64, 4, 128, device='cuda', dtype=torch.bfloat16)"
                         "[..., ::2], k, v, 0.125, False)", "ValueError", "contiguous"),
    ("seqlen_beyond_kernels", "fwd(q, k[:, :1].expand(2, 2**31 - 1, 2, 64), "
                              "v[:, :1].expand(2, 2**31 - 1, 2, 64), 0.125, False)",
     "ValueError", "seqlen"),
    ("bwd_lse_shape", "bwd(dout, q, k, v, out, lse[:, :, :10], 0.125, False, False)",
     "ValueError", "softmax_lse must have shape"),
    ("bwd_lse_dtype", "bwd(dout, q, k, v, out, lse.double(), 0.125, False, False)",
     "TypeError", "softmax_lse must be float32"),
    ("bwd_stats_shape", "bwd(dout, q, k, v, out, lse, 0.125, False, False, stats[..., :1])",
     "ValueError", "softmax_stats must have shape"),
    ("bwd_out_shape", "bwd(dout, q, k, v, out[:, :10], lse, 0.125, False, False)", "ValueError",
     "out must have the shape of q"),
    ("bwd_dout_on_cpu", "bwd(dout.cpu(), q, k, v, out, lse, 0.125, False, False)", "ValueError",
     "dout must be on"),
    # No query head: rejected by name (the kvcache op used to return before its append).
    ("zero_query_heads", "fwd(q[:, :, :0], k, v, 0.125, False)", "ValueError",
     "positive multiple"),
    ("kvcache_zero_query_heads",
     "torch.ops.flashattn_cu.fwd_kvcache(q[:, :1, :0], k, v, torch.zeros(2, dtype=torch.int32, "
     "device='cuda'), None, None, None, 0.125, False, -1, -1, None, 0.0, 0, "
     "k[:, :1].contiguous(), v[:, :1].contiguous())", "ValueError", "positive multiple"),
]

CHILD = textwrap.dedent("""
    import json, sys, torch
    import flashattn_cu  # noqa: F401  (registers the ops)
    fwd, bwd = torch.ops.flashattn_cu.fwd, torch.ops.flashattn_cu.bwd
    torch.manual_seed(0)
    q = torch.randn(2, 64, 4, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 80, 2, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out, lse, stats = fwd(q, k, v, 0.125, False)[:3]  # (out, lse, stats, rng_state, S_dmask)
    dout = torch.randn_like(out)
    try:
        eval(sys.argv[1])
        torch.cuda.synchronize()
        print(json.dumps({"type": None, "message": ""}))
    except Exception as exc:
        print(json.dumps({"type": type(exc).__name__, "message": str(exc)}))
""")


@pytest.fixture(scope="module")
def children():
    """Every case's child, started together when the first case runs."""
    runs = ChildRuns()
    for name, code, _, _ in CASES:
        runs.submit(name, [sys.executable, "-c", CHILD, code], env=CHILD_ENV)
    yield runs
    runs.close()


@pytest.mark.parametrize("name, code, exc_type, fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_argument_raises_in_child(children, name, code, exc_type, fragment):
    res = children.result(name)
    assert res.returncode == 0, (
        f"{name}: the child process died (exit {res.returncode}) instead of raising:\n"
        f"{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["type"] == exc_type and fragment in got["message"], (name, got)
    assert got["message"].startswith("flashattn_cu: "), got["message"]


def test_launch_does_not_take_an_unrelated_error():
    """An error left in the thread's CUDA last-error state by another library before our call is
    neither reported as ours nor cleared by us: our launches are checked by their own return
    values. The error is planted through the very libcudart mapped into the process. The op must
    not raise on it (the old check read cudaGetLastError and failed the call with it), and the C++
    entry point, called through ctypes with nothing of torch in between, must leave it in place."""
    child = textwrap.dedent("""
        import ctypes, glob, os, torch
        import flashattn_cu
        q = torch.randn(1, 32, 2, 64, device="cuda", dtype=torch.float16)
        out, lse, stats, *_ = torch.ops.flashattn_cu.fwd(q, q, q, 0.125, False)
        torch.cuda.synchronize()
        with open("/proc/self/maps") as f:
            mapped = sorted({l.split()[-1] for l in f if "libcudart.so" in l})
        assert len(mapped) == 1, f"expected one libcudart in the process, found {mapped}"
        rt = ctypes.CDLL(mapped[0])

        def plant():
            rt.cudaGetLastError()
            assert rt.cudaSetDevice(ctypes.c_int(10**6)) != 0  # invalid device ordinal
            return rt.cudaPeekAtLastError()

        planted = plant()
        torch.ops.flashattn_cu.fwd(q, q, q, 0.125, False)  # must not raise on the foreign error
        after_op = rt.cudaPeekAtLastError()  # torch's own calls around the op may clear it

        # flashattn_cu::fwd(const FwdParams&, cudaStream_t) straight from the extension.
        # The layout of flashattn_cu.h: the AttnParams base, then FwdParams' own fields.
        class FwdParams(ctypes.Structure):
            _fields_ = ([(n, ctypes.c_void_p) for n in ("q", "k", "v")]
                        + [(f"s{i}", ctypes.c_int64) for i in range(12)]
                        + [(n, ctypes.c_int) for n in ("batch", "seqlen_q", "seqlen_k",
                                                       "num_heads", "num_heads_k", "head_dim")]
                        + [("scale", ctypes.c_float), ("causal", ctypes.c_bool),
                           ("dtype", ctypes.c_int), ("window_left", ctypes.c_int),
                           ("window_right", ctypes.c_int), ("alibi_slopes", ctypes.c_void_p),
                           ("alibi_slopes_batch_stride", ctypes.c_int64),
                           ("softcap", ctypes.c_float), ("dropout_p", ctypes.c_float),
                           ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p),
                           ("total_q", ctypes.c_int), ("total_k", ctypes.c_int),
                           ("seqused_k", ctypes.c_void_p),
                           ("philox_seed", ctypes.c_uint64), ("philox_offset", ctypes.c_uint64),
                           ("philox_seed_ptr", ctypes.c_void_p),
                           ("philox_offset_ptr", ctypes.c_void_p)]
                        + [(n, ctypes.c_void_p) for n in ("o", "lse", "stats", "rng_state",
                                                          "s_dmask")])
        p = FwdParams()
        p.q = p.k = p.v = q.data_ptr()
        p.o, p.lse, p.stats = out.data_ptr(), lse.data_ptr(), stats.data_ptr()
        for t in range(4):  # (batch, row, head) strides of q, k, v, o: all laid out as q
            p.__setattr__(f"s{3 * t}", 0)
            p.__setattr__(f"s{3 * t + 1}", q.stride(1))
            p.__setattr__(f"s{3 * t + 2}", q.stride(2))
        p.batch, p.seqlen_q, p.seqlen_k, p.num_heads, p.num_heads_k, p.head_dim = 1, 32, 32, 2, 2, 64
        p.scale, p.causal, p.dtype = 0.125, False, 0
        p.window_left = p.window_right = -1
        lib = ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(flashattn_cu.__file__), "_C*.so"))[0])
        fwd = lib._ZN12flashattn_cu3fwdERKNS_9FwdParamsEP11CUstream_st
        fwd.restype = ctypes.c_int
        # Control: does the runtime itself keep the error across the successful queries fwd()
        # makes before launching (cudaGetDevice, cudaDeviceGetAttribute)?
        plant()
        dev, val = ctypes.c_int(), ctypes.c_int()
        rt.cudaGetDevice(ctypes.byref(dev))
        rt.cudaDeviceGetAttribute(ctypes.byref(val), 75, dev)  # compute capability major
        control = rt.cudaPeekAtLastError()
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)  # before planting
        plant()
        status = fwd(ctypes.byref(p), stream)
        after_cpp = rt.cudaPeekAtLastError()
        torch.cuda.synchronize()
        print("planted", planted, "after_op", after_op, "control", control, "status", status,
              "after_cpp", after_cpp)
    """)
    res = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=300, cwd="/", env=CHILD_ENV)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "planted 101" in res.stdout, f"the foreign error was not planted: {res.stdout}"
    # The call succeeded (status 0): the foreign error was not reported as ours.
    assert "status 0 " in res.stdout, res.stdout + res.stderr
    # Where the runtime keeps the error across successful calls (control), ours must too:
    # cudaErrorInvalidDevice (101) is still there for its owner to read.
    if "control 101" in res.stdout:
        assert "after_cpp 101" in res.stdout, res.stdout + res.stderr


def test_misaligned_row_statistics_are_copied():
    """softmax_lse / softmax_stats given as contiguous views at an offset the kernels cannot read
    (4 bytes past a 16-byte boundary) are copied by the backward op, not refused with a generic
    error: the same gradients, bit for bit (deterministic), as with the aligned tensors."""
    torch.manual_seed(0)
    q = torch.randn(2, 64, 4, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 80, 2, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out, lse, stats = torch.ops.flashattn_cu.fwd(q, k, v, 0.125, False)[:3]
    dout = torch.randn_like(out)

    def offset_copy(t):
        buf = torch.empty(t.numel() + 1, device=t.device, dtype=t.dtype)
        view = buf[1:].view(t.shape)
        view.copy_(t)
        assert view.is_contiguous() and view.data_ptr() % 16 != 0
        return view

    bwd = torch.ops.flashattn_cu.bwd
    ref = bwd(dout, q, k, v, out, lse, 0.125, False, True, stats)
    got = bwd(dout, q, k, v, out, offset_copy(lse), 0.125, False, True, offset_copy(stats))
    for name, a, b in zip(("dq", "dk", "dv"), got, ref):
        assert torch.equal(a, b), name
