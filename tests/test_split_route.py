"""flash_attn_func's inference route: calls without autograd or dropout whose query rows per kv
head are few (flash_attn_interface._split_kv_route) run on the split-KV kernel of
flash_attn_with_kvcache (torch.ops.flashattn_cu.fwd_splitkv). The routed output against the fp32
reference by the rule, its LSE, bitwise the same as flash_attn_with_kvcache on the same inputs,
the layouts callers hand over, CUDA graphs; which calls route (on the host)."""

import pytest
import torch

from attn_helpers import assert_lse_rule, assert_rule, instance_for, layouts, make_qkv
from flashattn_cu import _C, flash_attn_func, flash_attn_with_kvcache
from flashattn_cu import flash_attn_interface as fai
from flashattn_cu.testing import attention_ref


def skip_unless_built(head_dim):
    if instance_for(head_dim) not in _C.built_head_dims():
        pytest.skip(f"head dim {head_dim} not in this build")


def test_which_calls_route():
    """Host-only: the rule itself (tensors on the CPU; nothing is launched)."""
    def qkv(sq, h, hk, grad=False):
        q = torch.zeros(2, sq, h, 64, requires_grad=grad)
        k = torch.zeros(2, 300, hk, 64)
        return q, k, k.clone()

    assert fai._split_kv_route(*qkv(1, 32, 8), 0.0)              # decode, group 4
    assert fai._split_kv_route(*qkv(16, 32, 8), 0.0)             # 64 rows per kv head
    assert not fai._split_kv_route(*qkv(17, 32, 8), 0.0)         # 68 rows
    assert fai._split_kv_route(*qkv(64, 8, 8), 0.0)              # MHA: 64 queries
    assert not fai._split_kv_route(*qkv(1, 32, 8), 0.1)          # dropout keeps its kernels
    assert not fai._split_kv_route(*qkv(1, 32, 8, grad=True), 0.0)  # autograd records
    with torch.no_grad():
        assert fai._split_kv_route(*qkv(1, 32, 8, grad=True), 0.0)
    q, k, v = qkv(1, 32, 8)
    assert not fai._split_kv_route(q, k[:, :0], v[:, :0], 0.0)   # no keys: the main kernels
    assert not fai._split_kv_route(q[:, :0], k, v, 0.0)          # no queries


CASES = [  # (seqlen_q, seqlen_k, nheads, nheads_k)
    (1, 1, 8, 2), (1, 777, 32, 8), (1, 4099, 16, 1), (4, 1000, 8, 8), (13, 333, 8, 2),
    (64, 257, 4, 4), (7, 3, 8, 2),
]
FEATURES = {
    "plain": {}, "causal": {"causal": True}, "window": {"window_size": (100, 7)},
    "causal-window": {"causal": True, "window_size": (50, -1)}, "softcap": {"softcap": 30.0},
    "alibi": {"alibi": True},
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "sq{}-sk{}-h{}-hk{}".format(*c))
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("dtype, d", [(torch.float16, 64), (torch.bfloat16, 128)],
                         ids=["fp16-d64", "bf16-d128"])
def test_routed_forward_against_reference(case, feature, dtype, d):
    skip_unless_built(d)
    sq, sk, h, hk = case
    q, k, v = make_qkv(2, sq, sk, h, hk, d, dtype)
    kw = dict(FEATURES[feature])
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.rand(2, h, device="cuda", dtype=torch.float32) * 0.3
    assert fai._split_kv_route(q, k, v, 0.0)
    out, lse, probs = flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    assert probs is None
    ref, ref_lse = attention_ref(q, k, v, **kw)
    pt, pt_lse = attention_ref(q, k, v, upcast=False, **kw)
    assert_rule(out, ref, pt, 2, 1e-5, "out")
    assert_lse_rule(lse, ref_lse, pt_lse)
    # The same kernel as flash_attn_with_kvcache on the same inputs, bit for bit.
    same, same_lse = flash_attn_with_kvcache(q, k, v, return_softmax_lse=True, **kw)
    assert torch.equal(out, same) and torch.equal(lse, same_lse)


@pytest.mark.gpu
def test_routed_matches_the_autograd_path():
    """The same call recording autograd runs the main kernels: both within the rule, and the
    gradient path is unchanged by the route."""
    skip_unless_built(128)
    q, k, v = make_qkv(3, 2, 1500, 32, 8, 128, torch.bfloat16)
    ref, _ = attention_ref(q, k, v, causal=True)
    pt, _ = attention_ref(q, k, v, causal=True, upcast=False)
    with torch.no_grad():
        routed = flash_attn_func(q, k, v, causal=True)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    trained = flash_attn_func(qg, kg, vg, causal=True)
    assert trained.grad_fn is not None
    assert_rule(routed, ref, pt, 2, 1e-5, "routed")
    assert_rule(trained.detach(), ref, pt, 2, 1e-5, "autograd path")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "packed"])
def test_routed_layouts(layout):
    """k / v views in the layouts callers hand over (copied where the kernel cannot read them)."""
    skip_unless_built(64)
    k = layouts("cuda", b=2, s=300, h=2, d=64, dtype=torch.float16)[layout].normal_()
    v = layouts("cuda", b=2, s=300, h=2, d=64, dtype=torch.float16)[layout].normal_()
    q = torch.randn(2, 1, 8, 64, device="cuda", dtype=torch.float16)
    out = flash_attn_func(q, k, v)
    ref, _ = attention_ref(q, k, v)
    pt, _ = attention_ref(q, k, v, upcast=False)
    assert_rule(out, ref, pt, 2, 1e-5, layout)


@pytest.mark.gpu
def test_routed_in_a_cuda_graph():
    """A decode step captured once and replayed on new inputs (the serving pattern)."""
    skip_unless_built(128)
    q, k, v = make_qkv(4, 1, 2048, 32, 8, 128, torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        flash_attn_func(q, k, v)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attn_func(q, k, v)
    for _ in range(2):
        for t in (q, k, v):
            t.normal_()
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = attention_ref(q, k, v)
        pt, _ = attention_ref(q, k, v, upcast=False)
        assert_rule(out, ref, pt, 2, 1e-5, "replay")
