"""What the CPU tests of the Python API share (test_api.py, test_api_fake.py, test_modules.py,
test_dropout.py, test_packed_and_padding.py): small q / k / v on the CPU, fake CUDA tensors on a
pretend GPU (FakeTensorMode, the arch query and the build's head dims patched), and a spy on
FlashAttnFunc.apply. None of it needs a GPU."""

import contextlib
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from flashattn_cu import _C
from flashattn_cu import flash_attn_interface as fai

F16 = torch.float16


def no_device_check(q, k, v):
    """Stands in for the CUDA-only device checks when meta tensors carry the call."""


def cpu_qkv(b=2, sq=5, sk=7, h=4, hk=2, d=64, dtype=F16):
    return (torch.randn(b, sq, h, d, dtype=dtype), torch.randn(b, sk, hk, d, dtype=dtype),
            torch.randn(b, sk, hk, d, dtype=dtype))


def fake_cuda_qkv(devices=("cuda:0", "cuda:0", "cuda:0"), d=64, grad=True):
    """Fake CUDA q, k, v; grad=True records autograd, so flash_attn_func takes FlashAttnFunc
    (without it these short rows would take the split-KV route, _split_kv_route)."""
    shapes = [(2, 5, 4, d), (2, 7, 2, d), (2, 7, 2, d)]
    return [torch.empty(s, dtype=F16, device=dev, requires_grad=grad)
            for s, dev in zip(shapes, devices)]


@contextlib.contextmanager
def pretend_gpu(capability=(9, 0), built=None):
    """FakeTensorMode on a pretend GPU of compute capability `capability`, with a build that has
    the head-dim instances `built` (default: every one, whatever this build holds)."""
    built = tuple(_C.head_dim_instances() if built is None else built)
    with FakeTensorMode(), \
            mock.patch.object(fai, "_device_capability", return_value=capability), \
            mock.patch.object(fai, "_built_head_dims", return_value=built):
        yield


def capture_apply():
    """(calls, spy): patch FlashAttnFunc.apply with side_effect=spy to record its arguments."""
    calls = []
    real = fai.FlashAttnFunc.apply

    def spy(*args):
        calls.append(args)
        return real(*args)
    return calls, spy
