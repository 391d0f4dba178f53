"""Shared pytest setup.

- Tests marked `gpu` (test_forward.py, test_backward.py mark whole modules) are skipped with the
  reason "no CUDA device" when torch.cuda.is_available() is False, so CI without a GPU runs the
  CPU tests only.
- Every GPU test runs with output poisoning on: the C++ ops fill each output with NaN right after
  allocating it, so an element a kernel does not write fails the comparison.
- Every test gets its own fixed seed (derived from its id): fresh inputs per test, reproducible.
"""

import sys
import zlib
from pathlib import Path

import pytest
import torch

_REPO = Path(__file__).resolve().parent.parent


def _drop_unbuilt_source_tree():
    """After `pip install .` the built package lives in site-packages, but `python -m pytest`
    run from the checkout puts the checkout first on sys.path, where flashattn_cu/ has no
    compiled _C. In that case import the installed package instead. (An editable install or
    `python setup.py build_ext --inplace` puts _C in the checkout and nothing changes.)"""
    if any((_REPO / "flashattn_cu").glob("_C*.so")):
        return
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _REPO]


_drop_unbuilt_source_tree()

import flashattn_cu  # noqa: E402
from flashattn_cu import _C  # noqa: E402
from flashattn_cu.testing import poison_outputs  # noqa: E402

HAS_CUDA = torch.cuda.is_available()


def pytest_report_header(config):
    where = Path(flashattn_cu.__file__).parent
    gpu = torch.cuda.get_device_name() if HAS_CUDA else "none (GPU tests skip)"
    return [
        f"flashattn_cu {flashattn_cu.__version__} from {where}",
        f"built archs {_C.built_archs()}, head dims {_C.built_head_dims()}; torch "
        f"{torch.__version__}; GPU: {gpu}",
    ]


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _poison_gpu_outputs(request):
    if "gpu" in request.node.keywords and HAS_CUDA:
        with poison_outputs():
            yield
    else:
        yield
