"""The Hopper data-movement wrappers (ptx/tma.h, ptx/mbarrier.h, ptx/sync.h, ptx/cluster.h) and
the host tensor maps (tma_host.h), through the self-test kernels of sm90/selftest.cu: a matrix
copied tile by tile through 128-byte-swizzled TMA loads (completing on an mbarrier) and TMA
stores, with partial tiles on both edges; blocks exchanged between the two CTAs of clusters
through distributed shared memory. Runs on sm_90 GPUs with sm_90a code in the build."""

import pytest
import torch

from flashattn_cu import _C


def skip_unless_hopper():
    if torch.cuda.get_device_capability() != (9, 0) or 90 not in _C.built_archs():
        pytest.skip("needs an sm_90 GPU and sm_90a code in the build")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(64, 64), (300, 200), (1, 8), (1000, 1032)])
def test_tma_copy_round_trip(dtype, shape):
    skip_unless_hopper()
    src = torch.randn(shape, device="cuda", dtype=dtype)
    dst = torch.full_like(src, float("nan"))
    _C._tma_copy_selftest(src, dst)
    torch.cuda.synchronize()
    assert torch.equal(dst, src)


@pytest.mark.gpu
def test_tma_copy_strided_rows():
    """A row stride larger than the row (a view of wider storage): the map's stride, not the
    width, steps between rows; the columns past the view stay untouched."""
    skip_unless_hopper()
    wide = torch.randn(130, 256, device="cuda", dtype=torch.bfloat16)
    src = wide[:, :136]
    dst_storage = torch.zeros_like(wide)
    dst = dst_storage[:, :136]
    _C._tma_copy_selftest(src, dst)
    torch.cuda.synchronize()
    assert torch.equal(dst, src)
    assert (dst_storage[:, 136:] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("blocks", [2, 264, 1000])
def test_cluster_exchange(blocks):
    """ptx/cluster.h: in clusters of two CTAs each block reads its partner's staged floats through
    distributed shared memory (mapa, ld.shared::cluster) between cluster barriers; the ranks are
    0 / 1 in launch order."""
    skip_unless_hopper()
    src = torch.randn(blocks, 512, device="cuda")
    dst = torch.full_like(src, float("nan"))
    ranks = torch.full((blocks,), -1, device="cuda", dtype=torch.int32)
    _C._cluster_exchange_selftest(src, dst, ranks)
    torch.cuda.synchronize()
    partner = torch.arange(blocks, device="cuda") ^ 1
    assert torch.equal(dst, src[partner])
    assert torch.equal(ranks.long(), torch.arange(blocks, device="cuda") % 2)
