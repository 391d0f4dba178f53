"""CPU tests of the Python API: signature, build queries and switches, op schemas, validation
messages, unsupported features, device checks on fake CUDA tensors, the command line (the fake
implementations' shapes and torch.compile tracing: test_api_fake.py). None of these needs a
GPU."""

import inspect
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import flashattn_cu
from api_helpers import F16, capture_apply, cpu_qkv, fake_cuda_qkv, no_device_check, pretend_gpu
from flashattn_cu import _arguments, _C, _ops, flash_attn_func, flash_attn_with_kvcache
from flashattn_cu import flash_attn_interface as fai


def test_version_and_exports():
    assert flashattn_cu.__version__ == "0.1.0"
    assert flashattn_cu.flash_attn_func is flash_attn_func
    assert "flash_attn_func" in flashattn_cu.__all__


def test_varlen_messages_name_the_varlen_function():
    """The checks flash_attn_varlen_func shares with flash_attn_func name the function called."""
    q = torch.zeros(8, 2, 64, dtype=F16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^flash_attn_varlen_func: dropout_p must be a "):
        flashattn_cu.flash_attn_varlen_func(q, q, q, cu, cu, 8, 8, dropout_p=1.5)
    with pytest.raises(ValueError, match=r"^flash_attn_varlen_func: window_size must be a pair"):
        flashattn_cu.flash_attn_varlen_func(q, q, q, cu, cu, 8, 8, window_size=3)
    with pytest.raises(ValueError, match=r"^flash_attn_func: window_size must be a pair"):
        flash_attn_func(*cpu_qkv(), window_size=3)


def test_star_import_of_the_interface_module():
    """`from flash_attn.flash_attn_interface import *` brings every public function (flash_attn
    defines no __all__ there); the same line against flashattn_cu must too."""
    names = {}
    exec("from flashattn_cu.flash_attn_interface import *", names)
    for fn in ("flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
               "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
               "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache"):
        assert names[fn] is getattr(flashattn_cu, fn), fn


def test_signature_matches_flash_attn_2():
    # flash_attn 2.x (flash_attn/flash_attn_interface.py), parameter for parameter.
    expected = [
        ("q", inspect.Parameter.empty), ("k", inspect.Parameter.empty),
        ("v", inspect.Parameter.empty), ("dropout_p", 0.0), ("softmax_scale", None),
        ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0),
        ("alibi_slopes", None), ("deterministic", False), ("return_attn_probs", False),
    ]
    params = inspect.signature(flash_attn_func).parameters
    assert [(p.name, p.default) for p in params.values()] == expected
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params.values())


def test_build_info():
    archs, dims = _C.built_archs(), _C.built_head_dims()
    assert archs and all(a >= 80 for a in archs), archs
    assert dims and set(dims) <= set(_C.head_dim_instances()), dims
    assert dims == sorted(dims)
    assert fai._built_head_dims() == tuple(dims)


def test_head_dim_instances():
    """One list (csrc/flash/head_dims.h) behind the extension, the kernels' round_head_dim()
    and the Python interface's _head_dim_instance()."""
    instances = _C.head_dim_instances()
    assert instances == sorted(set(instances)) and all(d > 0 and d % 8 == 0 for d in instances)
    assert instances[-1] == _arguments._MAX_HEAD_DIM
    header = Path(__file__).resolve().parent.parent / "csrc" / "flash" / "head_dims.h"
    m = re.search(r"^#define FLASHATTN_CU_HEAD_DIM_INSTANCES\s+(.+)$", header.read_text(), re.M)
    assert [int(x) for x in m.group(1).split(",")] == instances, "extension built from another list"
    for d in range(1, _arguments._MAX_HEAD_DIM + 1):
        smallest = min(i for i in instances if i >= d)
        assert _C._round_head_dim(d) == fai._head_dim_instance(d) == smallest, d
    # Past the largest instance: None, not a StopIteration (which a generator or map() around
    # the caller would turn into a silent end).
    assert fai._head_dim_instance(max(instances) + 8) is None


def test_kernel_path_switch():
    from flashattn_cu.testing import kernel_path

    assert _C._kernel_path() == "auto"
    with kernel_path("sm80"):
        assert _C._kernel_path() == "sm80"
    assert _C._kernel_path() == "auto"
    with pytest.raises(ValueError, match="'auto' or 'sm80', got 'sm90'"):
        _C._set_kernel_path("sm90")


def test_fwd_causal_schedule_switch():
    from flashattn_cu.testing import fwd_causal_schedule

    assert _C._fwd_causal_schedule() == "auto"
    for schedule in ("persistent", "per_tile"):
        with fwd_causal_schedule(schedule):
            assert _C._fwd_causal_schedule() == schedule
        assert _C._fwd_causal_schedule() == "auto"
    with pytest.raises(ValueError, match="'auto', 'persistent' or 'per_tile', got 'dynamic'"):
        _C._set_fwd_causal_schedule("dynamic")
    assert _C._fwd_causal_schedule() == "auto"


@pytest.mark.parametrize("name, default", [("fwd_dynamic_tiles", True),
                                           ("bwd_streamed_dq", False)])
def test_on_off_switch(name, default):
    """A process-wide on / off switch: its default, the other setting while
    flashattn_cu.testing's context is active, the default again after it."""
    from flashattn_cu import testing

    get = getattr(_C, f"_{name}")
    assert get() is default
    with getattr(testing, name)(not default):
        assert get() is (not default)
    assert get() is default


def test_fwd_varlen_order_switch():
    from flashattn_cu.testing import fwd_varlen_order

    assert _C._fwd_varlen_order() == "heads"
    with fwd_varlen_order("blocks"):
        assert _C._fwd_varlen_order() == "blocks"
    assert _C._fwd_varlen_order() == "heads"
    with pytest.raises(ValueError, match="'heads' or 'blocks', got 'rows'"):
        _C._set_fwd_varlen_order("rows")
    assert _C._fwd_varlen_order() == "heads"


def test_op_schemas():
    assert str(torch.ops.flashattn_cu.fwd.default._schema) == (
        "flashattn_cu::fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, "
        "int window_left=-1, int window_right=-1, Tensor? alibi_slopes=None, "
        "float softcap=0., float dropout_p=0., bool return_softmax=False, "
        "Generator? gen=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
    assert str(torch.ops.flashattn_cu.bwd.default._schema) == (
        "flashattn_cu::bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, "
        "Tensor softmax_lse, float softmax_scale, bool causal, bool deterministic, "
        "Tensor? softmax_stats=None, int window_left=-1, int window_right=-1, "
        "Tensor? alibi_slopes=None, float softcap=0., float dropout_p=0., "
        "Tensor? rng_state=None) -> (Tensor, Tensor, Tensor)")
    assert str(torch.ops.flashattn_cu.fwd_varlen.default._schema) == (
        "flashattn_cu::fwd_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, "
        "Tensor cu_seqlens_k, Tensor? seqused_k, int max_seqlen_q, int max_seqlen_k, "
        "float softmax_scale, bool causal, int window_left=-1, int window_right=-1, "
        "Tensor? alibi_slopes=None, float softcap=0., float dropout_p=0., "
        "bool return_softmax=False, Generator? gen=None) -> "
        "(Tensor, Tensor, Tensor, Tensor, Tensor)")
    assert str(torch.ops.flashattn_cu.bwd_varlen.default._schema) == (
        "flashattn_cu::bwd_varlen(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, "
        "Tensor softmax_lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
        "int max_seqlen_k, float softmax_scale, bool causal, bool deterministic, "
        "Tensor? softmax_stats=None, int window_left=-1, int window_right=-1, "
        "Tensor? alibi_slopes=None, float softcap=0., float dropout_p=0., "
        "Tensor? rng_state=None) -> (Tensor, Tensor, Tensor)")
    assert str(torch.ops.flashattn_cu.fwd_kvcache.default._schema) == (
        "flashattn_cu::fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor? cache_seqlens, Tensor? cache_batch_idx, Tensor? cache_leftpad, "
        "Tensor? block_table, float softmax_scale, bool causal, int window_left=-1, "
        "int window_right=-1, Tensor? alibi_slopes=None, float softcap=0., int num_splits=0, "
        "Tensor? k_new=None, Tensor? v_new=None, Tensor? rotary_cos=None, "
        "Tensor? rotary_sin=None, bool rotary_interleaved=True) -> (Tensor, Tensor)")
    assert str(torch.ops.flashattn_cu.fwd_kvcache_varlen.default._schema) == (
        "flashattn_cu::fwd_kvcache_varlen(Tensor q, Tensor k_cache, Tensor v_cache, "
        "Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor block_table, int max_seqlen_q, "
        "int max_seqlen_k, float softmax_scale, bool causal, int window_left=-1, "
        "int window_right=-1, Tensor? alibi_slopes=None, float softcap=0., int num_splits=0) -> "
        "(Tensor, Tensor)")


# --------------------------------------------------------------------------------------------
# Unsupported features


def test_not_implemented():
    """Paged prefill (flash_attn_varlen_func with block_table) is forward-only without dropout,
    as flash_attn's paged path (tests/test_paged_prefill.py has the rest)."""
    q, k, v = cpu_qkv()
    with pytest.raises(NotImplementedError, match=r"flash_attn_varlen_func: dropout_p > 0 with "
                       r"block_table \(paged KV\) is not implemented"):
        fai.flash_attn_varlen_func(q[0], k, v, torch.tensor([0, 5], dtype=torch.int32),
                                   torch.tensor([0, 7], dtype=torch.int32), 5, 7, dropout_p=0.1,
                                   block_table=torch.zeros(1, 1, dtype=torch.int32))


def test_window_size_must_be_pair():
    q, k, v = cpu_qkv()
    with pytest.raises(ValueError, match="window_size must be a pair"):
        flash_attn_func(q, k, v, window_size=3)


# --------------------------------------------------------------------------------------------
# Validation: each message names the argument, what it got and what is supported.


def _raises(exc, pattern, q, k, v, **kwargs):
    with pytest.raises(exc, match=pattern):
        flash_attn_func(q, k, v, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float_dtypes_rejected(dtype):
    q, k, v = cpu_qkv(dtype=dtype)
    _raises(TypeError, rf"q has dtype {dtype}; supported: torch\.float16, torch\.bfloat16", q, k, v)


def test_k_float32_rejected():
    q, k, v = cpu_qkv()
    _raises(TypeError, r"k has dtype torch\.float32; supported", q, k.float(), v)


def test_mixed_dtypes_rejected():
    q, k, v = cpu_qkv()
    _raises(TypeError, r"v has dtype torch\.bfloat16 but q has torch\.float16", q, k, v.bfloat16())


def test_non_tensor_rejected():
    q, k, v = cpu_qkv()
    _raises(TypeError, "k must be a torch.Tensor, got list", q, [1, 2], v)


def test_cpu_tensors_rejected():
    q, k, v = cpu_qkv()
    _raises(ValueError, r"q is on device 'cpu'; flashattn_cu runs on CUDA GPUs only", q, k, v)


def test_wrong_rank():
    q, k, v = cpu_qkv()
    _raises(ValueError, r"q must have rank 4 \(batch, seqlen, nheads, headdim\), got shape "
            r"\(5, 4, 64\)", q[0], k, v)
    _raises(ValueError, r"v must have rank 4 .* got shape \(1, 2, 7, 2, 64\)", q, k, v[None])


def test_batch_mismatch():
    q, k, v = cpu_qkv()
    _raises(ValueError, "k has batch size 1 but q has 2", q, k[:1], v)


def test_head_dim_mismatch():
    q, k, v = cpu_qkv()
    _raises(ValueError, "v has head dim 32 but q has 64", q, k, v[..., :32])


def test_k_v_seqlen_mismatch():
    q, k, v = cpu_qkv()
    _raises(ValueError, "v has seqlen 6 but k has 7", q, k, v[:, :6])


def test_k_v_heads_mismatch():
    q, k, v = cpu_qkv()
    _raises(ValueError, "v has 1 heads but k has 2", q, k, v[:, :, :1])


def test_nheads_not_multiple():
    q, k, v = cpu_qkv(h=6, hk=4)
    _raises(ValueError, r"q has 6 heads and k/v have 4; nheads must be a positive multiple of "
            r"nheads_k", q, k, v)


@pytest.mark.parametrize("d", [264, 512])
def test_head_dim_too_large(d):
    q, k, v = cpu_qkv(d=d)
    _raises(ValueError, rf"head dim {d} is not supported; supported: 1 to 256", q, k, v)


def test_non_contiguous_last_dim_is_copied():
    """flash_attn copies a q, k or v whose last dimension is not contiguous (maybe_contiguous);
    so does flash_attn_func: the op gets the same values with stride 1 (the op itself still
    refuses such tensors, test_op_errors.py)."""
    calls, spy = capture_apply()
    with pretend_gpu((8, 0)), mock.patch.object(fai.FlashAttnFunc, "apply", side_effect=spy):
        q, k, v = fake_cuda_qkv()
        q_t = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # last-dim stride 5
        k_s = torch.empty(2, 7, 2, 128, dtype=F16, device="cuda:0")[..., ::2]  # stride 2
        assert q_t.stride(-1) != 1 and k_s.stride(-1) != 1
        out = flash_attn_func(q_t, k_s, v)
    q_arg, k_arg, v_arg = calls[0][:3]
    assert q_arg.stride(-1) == 1 and k_arg.stride(-1) == 1 and v_arg is v
    assert q_arg.shape == q.shape and k_arg.shape == k.shape and out.shape == q.shape


def test_non_contiguous_last_dim_values_and_gradient():
    """The copy is maybe_contiguous's .contiguous(): same values, and a differentiable copy."""
    x = torch.randn(2, 3, 4, 8, dtype=torch.float64).transpose(-1, -2).contiguous() \
        .transpose(-1, -2).requires_grad_()
    (y,) = fai._maybe_contiguous(x)
    assert y.stride(-1) == 1 and torch.equal(y, x)
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    z = torch.randn(2, 3, 4, 8)
    assert fai._maybe_contiguous(z)[0] is z


@pytest.mark.parametrize("scale", [0.0, -0.125, float("inf"), float("nan")])
def test_bad_softmax_scale(scale):
    q, k, v = (t.to("meta") for t in cpu_qkv())
    with mock.patch.object(fai, "_check_devices", no_device_check):
        _raises(ValueError, "softmax_scale must be a positive finite number", q, k, v,
                softmax_scale=scale)


@pytest.mark.parametrize("scale", [1e-50, 1e-40, 1e39, 3.5e38, 3.3e38, 2.4e38])
def test_softmax_scale_not_a_normal_float32(scale):
    """Finite and positive as a Python float, but 0, subnormal or inf as the float32 the kernels
    use, or so large that softmax_scale * log2(e) is (2.4e38: every output NaN before): rejected
    by name before anything runs."""
    q, k, v = (t.to("meta") for t in cpu_qkv())
    with mock.patch.object(fai, "_check_devices", no_device_check):
        _raises(ValueError, "is not a normal positive float32", q, k, v, softmax_scale=scale)


@pytest.mark.parametrize("scale", [2.0 ** -126, 1e-30, 2.29e38])
def test_softmax_scale_extremes_that_float32_holds(scale):
    q, k, v = (t.to("meta") for t in cpu_qkv())
    with mock.patch.object(fai, "_check_devices", no_device_check):
        assert flash_attn_func(q, k, v, softmax_scale=scale).shape == q.shape


@pytest.mark.parametrize("scale", [True, "0.1", torch.tensor(0.1)])
def test_softmax_scale_type(scale):
    q, k, v = (t.to("meta") for t in cpu_qkv())
    with mock.patch.object(fai, "_check_devices", no_device_check):
        _raises(TypeError, "softmax_scale must be None or a Python number", q, k, v,
                softmax_scale=scale)


# Device checks with fake CUDA tensors (no GPU needed).


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2,
                    reason="FakeTensorMode cannot fake cuda:1 next to a real single GPU")
def test_different_gpus_rejected():
    with FakeTensorMode():
        q, k, v = fake_cuda_qkv(("cuda:0", "cuda:1", "cuda:0"))
        _raises(ValueError, "k is on cuda:1 but q is on cuda:0; q, k, v must be on the same GPU",
                q, k, v)


def test_pre_ampere_gpu_rejected():
    with pretend_gpu((7, 5)), \
            mock.patch.object(torch.cuda, "get_device_name", return_value="Tesla T4"):
        q, k, v = fake_cuda_qkv()
        _raises(RuntimeError, r"cuda:0 \(Tesla T4\) is sm_75; flashattn_cu needs sm_80 or newer",
                q, k, v)


@pytest.mark.parametrize("missing", _C.head_dim_instances())
def test_head_dim_not_built_message(missing):
    """A build without the instance `missing` (FLASHATTN_CU_HEAD_DIMS) says so, naming the head
    dim, the instance and what the build has, also for head dims padded up to the instance; the
    instances it has still run. On a GPU, test_forward.py::test_head_dim_not_built_reports_clearly
    checks a real partial build."""
    instances = _C.head_dim_instances()
    built = [d for d in instances if d != missing]
    below = ([0] + instances)[instances.index(missing)]  # the next smaller instance, or 0
    with pretend_gpu((8, 0), built):
        for d in sorted({below + 1, missing - 3, missing}):
            _raises(RuntimeError, rf"flash_attn_func: unsupported head dim {d}: it runs on the "
                    rf"head-dim instance {missing}, which this build does not have \(built: "
                    rf"{', '.join(map(str, built))}\); rebuild flashattn_cu with {missing} in "
                    "FLASHATTN_CU_HEAD_DIMS", *fake_cuda_qkv(d=d))
        for d in built:
            q, k, v = fake_cuda_qkv(d=d)
            assert flash_attn_func(q, k, v).shape == q.shape


# --------------------------------------------------------------------------------------------
# Command line


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
@pytest.mark.parametrize("command", ["check", "bench"])
def test_cli_without_gpu(command, tmp_path):
    import os

    # Run from an empty directory with flashattn_cu's own location on the path, so the
    # subprocess imports the same (built) package as this test.
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(flashattn_cu.__file__)))
    res = subprocess.run([sys.executable, "-m", "flashattn_cu", command], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, env=env)
    assert res.returncode != 0
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0], res.stdout + res.stderr


def test_number_formatting_inside_the_extension_raises_cleanly():
    """c10::str / std::ostringstream inside _C must use the process's one libstdc++: with a
    private static copy (a compiler that links libstdc++ statically, e.g. the H200 image's CXX)
    the first number formatted there crashed the process. Run in a child so a crash is reported,
    not fatal."""
    code = ("import flashattn_cu._C as C\n"
            "try:\n    C._raise_with_number(60)\n"
            "except RuntimeError as e:\n    print('raised:', str(e).splitlines()[0])\n")
    import os

    # From outside the checkout, with the tested package's own location on the path.
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(flashattn_cu.__file__)))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd="/", env=env)
    assert res.returncode == 0, f"child died (exit {res.returncode}): {res.stderr[-2000:]}"
    assert "a message that streams a number: 60" in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize("shape, stride", [((2, 3, 4), (12, 4, 1)), ((2, 3, 4), (4, 8, 1)),
                                           ((2, 3, 4), (24, 4, 1)), ((2, 1, 4), (4, 99, 1)),
                                           ((2, 3, 4), (0, 4, 1)), ((3, 4), (1, 3)),
                                           ((2, 2), (1, 1)), ((0, 5), (5, 1))])
def test_non_overlapping_and_dense_matches_aten(shape, stride):
    """ATen's own test, seen through empty_like: it keeps the strides exactly of a
    non-overlapping and dense tensor, and gives fresh dense strides to any other."""
    t = torch.empty_strided(shape, stride)
    assert _ops._non_overlapping_and_dense(t) == (torch.empty_like(t).stride() == t.stride())


@pytest.mark.parametrize("slopes, error, message", [
    (lambda: torch.ones(4, dtype=torch.float16, device="cuda"), TypeError, "must be float32"),
    (lambda: torch.ones(3, device="cuda"), ValueError, r"shape \(nheads,\) = \(4,\)"),
    (lambda: torch.ones(2, 4, 1, device="cuda"), ValueError, r"or \(batch, nheads\) = \(2, 4\)"),
    (lambda: [0.5] * 4, TypeError, "must be a torch.Tensor"),
])
def test_alibi_slopes_checked(slopes, error, message):
    with pretend_gpu((9, 0)):
        q, k, v = fake_cuda_qkv()
        with pytest.raises(error, match=message):
            flash_attn_func(q, k, v, alibi_slopes=slopes())


def test_alibi_slopes_reach_the_kernel():
    calls, spy = capture_apply()
    with pretend_gpu((9, 0)), mock.patch.object(fai.FlashAttnFunc, "apply", side_effect=spy):
        q, k, v = fake_cuda_qkv()
        for shape in ((4,), (2, 4)):
            flash_attn_func(q, k, v, alibi_slopes=torch.ones(shape, device="cuda"))
            assert tuple(calls[-1][8].shape) == shape


@pytest.mark.parametrize("softcap, error, message", [
    (-1.0, ValueError, "softcap must be 0.0 .none. or a positive finite number, got -1.0"),
    (float("nan"), ValueError, "softcap must be 0.0"),
    (float("inf"), ValueError, "softcap must be 0.0"),
    (1e-50, ValueError, "not a normal positive float32"),
    (1e39, ValueError, "not a normal positive float32"),
    (True, TypeError, "softcap must be a Python number, got bool"),
    ("30", TypeError, "softcap must be a Python number, got str"),
])
def test_softcap_checked(softcap, error, message):
    with pretend_gpu((9, 0)):
        q, k, v = fake_cuda_qkv()
        with pytest.raises(error, match=message):
            flash_attn_func(q, k, v, softcap=softcap)


def test_softcap_reaches_the_kernel():
    calls, spy = capture_apply()
    with pretend_gpu((9, 0)), mock.patch.object(fai.FlashAttnFunc, "apply", side_effect=spy):
        q, k, v = fake_cuda_qkv()
        for softcap, expected in ((30, 30.0), (0.5, 0.5), (0, 0.0), (0.0, 0.0)):
            flash_attn_func(q, k, v, softcap=softcap)
            assert calls[-1][9] == expected and type(calls[-1][9]) is float


def test_unbuilt_source_folder_says_what_to_do(tmp_path):
    """Importing a flashattn_cu folder without the compiled extension (the checkout, first on
    sys.path when Python runs from its root) raises an ImportError that says so and what to do,
    not "cannot import name '_C' (circular import)"."""
    import shutil

    src = Path(flashattn_cu.__file__).resolve().parent
    shutil.copytree(src, tmp_path / "flashattn_cu",
                    ignore=shutil.ignore_patterns("_C*", "__pycache__"))
    res = subprocess.run([sys.executable, "-c", "import flashattn_cu"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert res.returncode != 0
    assert "has no compiled extension (_C)" in res.stderr, res.stderr[-2000:]
    assert str(tmp_path / "flashattn_cu") in res.stderr
    assert "circular import" not in res.stderr


def _direct_call(op, q, k):
    if op == "fwd":
        return torch.ops.flashattn_cu.fwd(q, k, k, 0.125, False)
    if op == "fwd_splitkv":
        return torch.ops.flashattn_cu.fwd_splitkv(q, k, k, 0.125, False)
    return torch.ops.flashattn_cu.fwd_kvcache(q, k.detach().clone(), k.detach().clone(), None,
                                              None, None, None, 0.125, False)


@pytest.mark.parametrize("op", ["fwd", "fwd_splitkv", "fwd_kvcache"])
def test_ops_called_directly_do_not_differentiate_silently(op):
    """The ops have no derivative of their own (flash_attn_func's autograd.Functions hold it):
    called directly with an input that requires grad, the output's backward raises naming the op,
    and forward-mode AD raises at the call. torch's default fallback warned at backward and gave
    zero gradients; a forward_ad dual or torch.func.jvp got no tangent or a zero one, silently
    (flash_attn_with_kvcache and flash_attn_func's split-KV route run these ops directly)."""
    import torch.autograd.forward_ad as fwAD
    q = torch.empty(2, 1, 4, 64, device="meta", dtype=F16, requires_grad=True)
    k = torch.empty(2, 128, 4, 64, device="meta", dtype=F16)
    out = _direct_call(op, q, k)[0]
    assert out.requires_grad
    with pytest.raises(RuntimeError, match=f"flashattn_cu::{op}"):
        torch.autograd.grad(out.float().sum(), q)
    with torch.no_grad():
        assert not _direct_call(op, q, k)[0].requires_grad
    assert not _direct_call(op, q.detach(), k)[0].requires_grad
    with fwAD.dual_level():
        dual = fwAD.make_dual(q.detach(), torch.empty_like(q.detach()))
        with pytest.raises(Exception, match=f"forward AD with flashattn_cu::{op}"):
            _direct_call(op, dual, k)
    with pytest.raises(Exception, match=f"forward AD with flashattn_cu::{op}"):
        torch.func.jvp(lambda x: _direct_call(op, x, k)[0], (q.detach(),),
                       (torch.empty_like(q.detach()),))


def test_argument_errors_are_also_runtime_errors_as_flash_attns():
    """flash_attn's checks raise RuntimeError (TORCH_CHECK): code that catches it to fall back
    to another backend catches ours too, which are ValueError / TypeError as well."""
    q, k, v = cpu_qkv()
    for call, base in ((lambda: flash_attn_func(q, k, v), ValueError),
                       (lambda: flash_attn_func(q, k, v, window_size=(1, 2, 3)), ValueError),
                       (lambda: flash_attn_func(q.float(), k.float(), v.float()), TypeError),
                       (lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=-1), ValueError)):
        with pytest.raises(RuntimeError) as info:
            call()
        assert isinstance(info.value, base), info.value


def _tensor_cases():
    """q, k, v triples around every check of _check_tensors: valid ones (MHA, GQA, MQA, head
    dims 1 / 256) and one of each way to fail it."""
    def t(*shape, dtype=torch.float16):
        return torch.empty(shape, dtype=dtype)
    ok = (t(2, 5, 4, 64), t(2, 7, 2, 64), t(2, 7, 2, 64))
    yield ok
    yield t(1, 3, 8, 1), t(1, 9, 1, 1), t(1, 9, 1, 1)
    yield t(1, 3, 4, 256, dtype=torch.bfloat16), t(1, 3, 4, 256, dtype=torch.bfloat16), \
        t(1, 3, 4, 256, dtype=torch.bfloat16)
    q, k, v = ok
    yield q.numpy(), k, v
    yield q, k, [1.0]
    yield q.float(), k.float(), v.float()
    yield q, k.bfloat16(), v
    yield q, k, v.bfloat16()
    yield q[0], k, v
    yield q, k[0], v[0]
    yield q, k, v[:, :6]
    yield q, k, t(2, 7, 1, 64)
    yield q, k, t(2, 7, 2, 32)
    yield q, t(2, 7, 3, 64), t(2, 7, 3, 64)
    yield t(3, 5, 4, 64), k, v
    yield t(2, 5, 4, 32), k, v
    yield t(2, 5, 0, 64), t(2, 7, 0, 64), t(2, 7, 0, 64)
    yield t(2, 5, 4, 0), t(2, 7, 2, 0), t(2, 7, 2, 0)
    yield t(1, 2, 2, 264), t(1, 2, 2, 264), t(1, 2, 2, 264)


def test_tensor_fast_check_agrees_with_the_full_checks():
    """_check_tensors's one-expression common case (_tensors_ok) accepts exactly what its full
    checks accept: never a call those would refuse."""
    for case in _tensor_cases():
        with mock.patch.object(_arguments, "_tensors_ok", return_value=False):
            try:
                _arguments._check_tensors(*case)
                full = True
            except (TypeError, ValueError):
                full = False
        assert _arguments._tensors_ok(*case) == full, [getattr(x, "shape", x) for x in case]
