"""Helpers shared by the GPU tests: input construction and the error rule."""

import collections
import concurrent.futures
import itertools
import os
import re
import subprocess

import torch

from flashattn_cu import _C
from flashattn_cu.testing import alibi_bias, attention_ref, max_abs_diff

# (nheads, nheads_k)
HEADS = {"mha": (6, 6), "gqa": (6, 2), "mqa": (6, 1)}
# Every head-dim instance, and head dims that run zero-padded on one.
HEAD_DIMS = sorted({*_C.head_dim_instances(), 40, 59, 80, 111})
SEQLEN_PAIRS = [(1, 239), (113, 203), (128, 217), (512, 256), (1023, 1024), (2048, 2048),
                (3, 799), (239, 1), (799, 3)]
DTYPES = [torch.float16, torch.bfloat16]
DEVICE = "cuda"


def instance_for(head_dim):
    """The compiled head-dim instance that runs `head_dim`."""
    return next(d for d in _C.head_dim_instances() if d >= head_dim)


def skip_unless_built(head_dim):
    """Skip (naming both) where this build lacks the instance that runs head_dim."""
    import pytest

    inst = instance_for(head_dim)
    if inst not in _C.built_head_dims():
        pytest.skip(f"head dim {head_dim} (instance {inst}) not in this build")


def bits(t):
    """t's bytes as integers, for bitwise comparisons in which NaN equals itself."""
    return t.view(torch.int32) if t.dtype == torch.float32 else \
        t.view(torch.int16) if t.element_size() == 2 else t


def cu_seqlens(lengths, device=DEVICE):
    """A varlen call's cu_seqlens for these sequence lengths: int32 (batch + 1,), 0 and then
    their running sums."""
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


def assert_raises_naming(call, exc, names, what):
    """call() must raise exc with every text of names in its message; anything else (another
    exception, a message without them, no exception) fails, the message starting with what."""
    expected = f"{what}: expected {exc.__name__} naming {' and '.join(map(repr, names))}"
    try:
        call()
    except exc as e:
        missing = [name for name in names if name not in str(e)]
        assert not missing, f"{expected}, got: {e}"
    except Exception as e:
        raise AssertionError(f"{expected}, got {type(e).__name__}: {e}") from e
    else:
        raise AssertionError(f"{expected}; nothing was raised")


def layouts(device, b=2, s=24, h=4, d=64, dtype=torch.bfloat16):
    """(b, s, h, d) tensors as callers hand them over: contiguous; a transposed view of
    (b, h, s, d) storage (dense, not contiguous); sliced from a packed (b, s, 3, h, d) qkv (not
    dense)."""
    packed = torch.empty(b, s, 3, h, d, device=device, dtype=dtype)
    return {
        "contiguous": torch.empty(b, s, h, d, device=device, dtype=dtype),
        "transposed": torch.empty(b, h, s, d, device=device, dtype=dtype).transpose(1, 2),
        "packed": packed[:, :, 0],
    }


def make_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, *,
             requires_grad=False, scale=1.0, device=None):
    device = DEVICE if device is None else device

    def rand(*shape):
        t = torch.randn(*shape, device=device, dtype=dtype) * scale
        return t.requires_grad_(requires_grad)
    return (rand(batch, seqlen_q, nheads, head_dim), rand(batch, seqlen_k, nheads_k, head_dim),
            rand(batch, seqlen_k, nheads_k, head_dim))


def assert_rule(ours, ref, pt, factor, atol, what):
    """flash_attn's rule: max|ours - ref| <= factor * max|pt - ref| + atol, where ref is the
    fp32 computation and pt the same math in the input dtype. NaN anywhere fails."""
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    err, pt_err = max_abs_diff(ours, ref), max_abs_diff(pt, ref)
    assert err <= factor * pt_err + atol, (
        f"{what}: max|ours - ref| = {err:.3e} > {factor} * max|pt - ref| ({pt_err:.3e}) + {atol}"
    )


def assert_lse_rule(lse, lse_ref, lse_pt, what="lse", fp32_ulps=0):
    """softmax_lse by the same rule (factor 2): +inf exactly where the reference has +inf (rows
    that see no key), elsewhere max|lse - ref| <= 2 * max|pt - ref| + 1e-5, with pt the LSE of
    the scores computed in the input dtype. fp32_ulps > 0: compared in float64 against lse_ref as
    given (not rounded to float32 first), each row allowed fp32_ulps float32 ulps (2^-24 each)
    of |ref| beyond that, for the kernels' own rounding of a large LSE (row max, scale, log2 of
    the sum, ln 2), which at ALiBi's causal bias (1e5 .. 2e6) outgrows the baseline's error."""
    assert lse.dtype == torch.float32 and lse.shape == lse_ref.shape, what
    empty = torch.isinf(lse_ref)
    assert torch.equal(torch.isinf(lse) & (lse > 0), empty), f"{what}: +inf rows differ"
    assert not torch.isnan(lse).any(), f"{what}: NaN"
    keep = ~empty
    if not fp32_ulps:
        assert_rule(lse[keep], lse_ref[keep].float(), lse_pt[keep].float(), 2, 1e-5, what)
        return
    ref = lse_ref[keep].double()
    err = (lse[keep].double() - ref).abs()
    pt_err = (lse_pt[keep].double() - ref).abs().max()
    allowed = 2 * pt_err + 1e-5 + fp32_ulps * 2.0 ** -24 * ref.abs()
    worst = (err - allowed).argmax()
    assert (err <= allowed).all(), (
        f"{what}: |lse - ref| = {err[worst].item():.3e} > {allowed[worst].item():.3e} "
        f"(2 * baseline {pt_err.item():.3e} + {fp32_ulps} ulps of {ref[worst].item():.6e})")


def assert_entries_match_reference(q, out, lse, k_logical, v_logical, seqlens, what, **kw):
    """out / lse of a cache call against the fp32 reference (by the rule) on each entry b's first
    seqlens[b] keys of the logical (batch, capacity, heads_k, d) cache; kw: attention_ref's mask
    arguments."""
    outs, refs, pts, lses, lse_refs, lse_pts = [], [], [], [], [], []
    for b in range(q.shape[0]):
        n = int(seqlens[b])
        keys, vals = k_logical[b:b + 1, :n], v_logical[b:b + 1, :n]
        ref, lse_ref = attention_ref(q[b:b + 1].float(), keys, vals, **kw)
        pt, lse_pt = attention_ref(q[b:b + 1], keys, vals, upcast=False, **kw)
        outs.append(out[b:b + 1]), refs.append(ref), pts.append(pt)
        lses.append(lse[b:b + 1]), lse_refs.append(lse_ref), lse_pts.append(lse_pt)
    assert_rule(torch.cat(outs), torch.cat(refs), torch.cat(pts), 2, 1e-5, what + " out")
    assert_lse_rule(torch.cat(lses), torch.cat(lse_refs), torch.cat(lse_pts), what + " lse")


def check_both_paths(q, k, v, dout, what, deterministic=False, **kw):
    """flash_attn_func on both kernel paths (auto, sm80) against the fp32 reference by the rule:
    out and lse 2x, gradients 3x (kw: attention_ref's and flash_attn_func's common arguments)."""
    from flashattn_cu import flash_attn_func
    from flashattn_cu.testing import attention_ref, kernel_path

    # The window as flash_attn_func normalizes it (flash_attn's rules against seqlen_k).
    ref, ref_lse = attention_ref(q, k, v, window_seqlen_k=k.shape[1], **kw)
    pt, pt_lse = attention_ref(q, k, v, upcast=False, window_seqlen_k=k.shape[1], **kw)
    refs = torch.autograd.grad(ref, (q, k, v), dout.float())
    pts = torch.autograd.grad(pt, (q, k, v), dout)
    for path in ("auto", "sm80"):
        with kernel_path(path):
            out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True,
                                          deterministic=deterministic, **kw)
            grads = torch.autograd.grad(out, (q, k, v), dout)
        assert_rule(out, ref, pt, 2, 1e-5, f"{what}: out ({path})")
        assert_lse_rule(lse, ref_lse, pt_lse, f"{what}: lse ({path})")
        for name, g, r, p in zip(("dq", "dk", "dv"), grads, refs, pts):
            assert_rule(g, r, p, 3, 1e-4, f"{what}: {name} ({path})")


def fa_grads(q, k, v, out, dout, kw, mask=None, p=0.0, window_seqlen_k=None,
             dtype=torch.float64):
    """The FlashAttention backward in `dtype` from the kernel's own (rounded) output: D =
    rowsum(dO * O) with O as written, as every FlashAttention backward computes it. Where the
    exact gradient (nearly) vanishes (a row that sees one key: dq = 0; a near one-hot row, whose
    dP - D cancels) the kernels' dq is that rounding's residual, not 0 with dropout (O = v /
    (1 - p), rounded) or with a second key of small weight (fp16 at magnitude 2: up to 4.7x
    pt's dq error on CPU emulations of such rows, benchmarks/NOTES.md 12.57), and the
    input-dtype baseline (autograd through the softmax) does not have it: the larger of the
    two is the rule's baseline there (farther_each). In float32 (the kernels' accumulation:
    dP = dO V^T and D in fp32) it has the kernels' other residual there: with O = v exactly (a
    row of one key, no dropout) dP - D is the difference of two fp32 sums of the same products
    in different orders, ~eps32 * sum_i |dO_i v_i|, which every key's dk gathers over the rows
    (fuzz seed 2391, benchmarks/NOTES.md 12.59); float64 and autograd give 0 there. kw:
    attention_ref's mask and score arguments (causal, softmax_scale, window_size, softcap,
    alibi_slopes); mask: dropout's keep mask (batch, nheads, seqlen_q, seqlen_k). The
    probabilities come from the reference itself (attention_ref with v the identity: its masks,
    softcap and ALiBi exactly), a (batch, seqlen_k, nheads, seqlen_k) tensor: for rows of up to
    about a thousand keys."""
    b, sq, h, d = q.shape
    sk, group = k.shape[1], h // k.shape[2]
    scale = kw.get("softmax_scale")
    scale = d ** -0.5 if scale is None else scale
    softcap = kw.get("softcap", 0.0)
    qx, kx, vx = (t.detach().to(dtype) for t in (q, k, v))
    eye = torch.eye(sk, dtype=dtype, device=q.device)[None, :, None, :]
    probs, _ = attention_ref(qx, kx, eye.expand(b, sk, k.shape[2], sk),
                             window_seqlen_k=window_seqlen_k, **kw)
    probs = probs.to(dtype).permute(0, 2, 1, 3)  # (b, h, sq, sk)
    kr, vr = (t.repeat_interleave(group, dim=2) for t in (kx, vx))
    do = dout.detach().to(dtype)
    kept = torch.ones_like(probs) if mask is None else mask.to(dtype) / (1.0 - p)
    dp = torch.einsum("bqhd,bkhd->bhqk", do, vr) * kept
    delta = (do * out.detach().to(dtype)).sum(-1).transpose(1, 2).unsqueeze(-1)
    ds = probs * (dp - delta)
    if softcap > 0:
        raw = torch.einsum("bqhd,bkhd->bhqk", qx, kr) * scale
        ds = ds * (1 - torch.tanh(raw / softcap) ** 2)
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kr) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, qx) * scale
    dv = torch.einsum("bhqk,bqhd->bkhd", probs * kept, do)
    fold = lambda t: t.reshape(b, sk, h // group, group, d).sum(3)  # noqa: E731
    return dq, fold(dk), fold(dv)


# The softcap's tanh in every kernel is tanh.approx.f32 (MUFU.TANH, ptx/math.h, as flash_attn's
# through cutlass's fast_tanh): a relative error up to 2^-10.987 (PTX ISA), ~4.9e-4 of each
# capped logit, of one sign over runs of nearby arguments. The input-dtype baseline rounds its
# scores without a bias, so its errors average out in a row's LSE and softmax where the
# approximation's do not. (The fuzz failures it was first written for, seeds 440 and 316, had
# other causes: exp2_fma's polynomial and D from the rounded output, benchmarks/NOTES.md 12.57.)
TANH_APPROX_REL = 2.0 ** -10.987

try:
    import triton
    import triton.language as tl
except ImportError:  # the uniform model below instead
    triton = None

if triton is not None:
    @triton.jit
    def _tanh_approx_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        x = tl.load(x_ptr + offs, mask=inside, other=0.0)
        y = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x],
                                      dtype=tl.float32, is_pure=True, pack=1)
        tl.store(y_ptr + offs, y, mask=inside)


def _tanh_approx_values(x):
    """tanh.approx.f32 of a float32 CUDA tensor, the kernels' instruction (through triton)."""
    x = x.contiguous()
    y = torch.empty_like(x)
    if x.numel():
        _tanh_approx_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


class _TanhApprox(torch.autograd.Function):
    """tanh.approx.f32 forward, 1 - t^2 of that t backward (as the kernels' backward)."""

    @staticmethod
    def forward(ctx, x):
        t = _tanh_approx_values(x.float()).to(x.dtype)
        ctx.save_for_backward(t)
        return t

    @staticmethod
    def backward(ctx, grad):
        (t,) = ctx.saved_tensors
        return grad * (1 - t * t)


_TANH_APPROX_CHECKED = {}


def tanh_approx():
    """The kernels' tanh for attention_ref (a differentiable function on CUDA float32 tensors),
    or None without triton. Checked once per device against torch.tanh (within TANH_APPROX_REL,
    finite, and not torch.tanh itself): a wrong stand-in would widen the rule, so it raises."""
    if triton is None or not torch.cuda.is_available():
        return None
    device = torch.cuda.current_device()
    if device not in _TANH_APPROX_CHECKED:
        x = torch.linspace(-12.0, 12.0, 200001, device="cuda")
        t, exact = _tanh_approx_values(x), torch.tanh(x.double())
        rel = ((t.double() - exact).abs() / exact.abs().clamp_min(1e-30)).max().item()
        assert torch.isfinite(t).all() and rel <= 2.0 ** -10.9, \
            f"tanh.approx through triton: relative error {rel:.3e} past 2^-10.987"
        assert not torch.equal(t, torch.tanh(x)), "tanh.approx through triton equals torch.tanh"
        _TANH_APPROX_CHECKED[device] = True
    return _TanhApprox.apply


def tanh_approx_ref(q, k, v, softcap, softmax_scale=None, **kw):
    """attention_ref (float32 for half inputs) with the kernels' tanh.approx in the cap: the
    rule's second baseline for softcap calls (farther_each with pt), the same math at the
    kernels' precision point for the cap. Without triton (or on the CPU) a model of it instead:
    every capped logit off by tanh.approx's relative error, all in one direction (the cap and
    the scale both times 1 + TANH_APPROX_REL give (1 + e) softcap tanh(s / softcap))."""
    fn = tanh_approx() if q.is_cuda else None
    if fn is not None:
        return attention_ref(q, k, v, softcap=softcap, softmax_scale=softmax_scale, tanh=fn,
                             **kw)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    f = 1.0 + TANH_APPROX_REL
    return attention_ref(q, k, v, softcap=softcap * f, softmax_scale=scale * f, **kw)


def with_tanh_approx(pt, pt_lse, ref, ref_lse, q, k, v, **kw):
    """The rule's baselines (out, LSE) of a forward: pt's, widened elementwise by
    tanh_approx_ref's where kw (attention_ref's arguments) has a softcap; as given without."""
    if not kw.get("softcap"):
        return pt, pt_lse
    ap, ap_lse = tanh_approx_ref(q.float(), k.float(), v.float(), **kw)
    return farther_each(pt, ap, ref), farther_each(pt_lse, ap_lse, ref_lse)


def farther_each(a, b, ref):
    """Elementwise, whichever of a and b is farther from ref, in float64: the larger baseline of
    the rule (its max error that of the farther of the two). Where both equal ref's +inf (an
    LSE row that sees no key) a."""
    a, b, ref = a.double(), b.double(), ref.double()
    return torch.where((b - ref).abs() > (a - ref).abs(), b, a)


def draw_alibi(kind, nheads, batch, gen):
    """The fuzz cases' ALiBi slopes: None, "heads" (nheads,) or "batch" (batch, nheads), uniform
    in [0, 1) from gen (drawn on gen's device), on the GPU."""
    if kind is None:
        return None
    shape = (nheads,) if kind == "heads" else (batch, nheads)
    return torch.rand(*shape, generator=gen, device=gen.device).to(DEVICE)


def kv_splits(batch, nheads, nheads_k, seqlen_k):
    """How many thread blocks share one kv head's query-head group in the backward: a mirror of
    bwd_kv_splits() in csrc/flash/bwd/params.h (the tests use it to aim at each case)."""
    group = nheads // nheads_k
    base = batch * nheads_k * ((seqlen_k + 127) // 128)
    if group <= 1 or base <= 0 or base >= 256:
        return 1
    chosen = 1
    for s in range(2, group + 1):
        if group % s:
            continue
        if base * s > 1024:
            break
        chosen = s
        if base * s >= 256:
            break
    return chosen


def attention_fp32_scores(q, k, v, causal=False, softmax_scale=None, alibi_slopes=None,
                          return_lse=False, window_size=(-1, -1)):
    """The kernels' own precision points in PyTorch: scores and softmax in float32 (from the
    exact products of the 16-bit inputs), probabilities rounded to the input dtype before they
    multiply v, outputs in the input dtype. Where pt (everything in the input dtype) is far off
    because 16-bit scores cannot hold large logits, this is the baseline of the rule: its error
    against a float64 reference is what rounding at those points alone costs. alibi_slopes:
    flash_attn's bias (attention_ref's forms) added to the float32 scores; return_lse: also the
    float32 log-sum-exp (batch, nheads, seqlen_q); window_size: (left, right) as the kernels take
    it (attention_ref's raw semantics, window_seqlen_k=None: a negative side is unbounded, causal
    sets right = 0)."""
    dtype = q.dtype
    nheads, nheads_k = q.shape[2], k.shape[2]
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    if nheads != nheads_k:
        k = k.repeat_interleave(nheads // nheads_k, dim=2)
        v = v.repeat_interleave(nheads // nheads_k, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * softmax_scale
    sq, sk = q.shape[1], k.shape[1]
    left, right = window_size
    right = 0 if causal else right
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes, q.shape[0], sq, sk, causal and left < 0,
                                     torch.float32)
    rows = torch.arange(sq, device=q.device).unsqueeze(1)
    cols = torch.arange(sk, device=q.device).unsqueeze(0)
    if right >= 0:
        scores = scores.masked_fill(cols > rows + (sk - sq) + right, float("-inf"))
    if left >= 0:
        scores = scores.masked_fill(cols < rows + (sk - sq) - left, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0).to(dtype)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v)
    return (out, torch.logsumexp(scores, dim=-1)) if return_lse else out


def sm90_built():
    """Whether the GPU is an sm_90 one and this build has sm_90a code for it (the Hopper kernels
    run on the default path)."""
    return (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
            and 90 in _C.built_archs())


def kernel_paths():
    """The kernel families a GPU test runs under: on an sm_90 GPU with sm_90a code built, the
    default path (wgmma backward where it covers the head dim) and the sm80 mma.sync kernels."""
    return ["auto", "sm80"] if sm90_built() else ["auto"]


def kernel_names(fn):
    """The names of the CUDA kernels fn() launches (torch's profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]


SM90_FWD_KERNEL = ("sm90::fwd_kernel", "4sm9010fwd_kernel")  # demangled, mangled

# What sm90_fwd_instance reads: fwd_kernel<Element, FwdTraits<...>, kVariant, kCompactOnly>
# (FwdTmaParams), demangled or mangled: FwdTraits' arguments by position (sm90/fwd_traits.h:
# kBlockM the 2nd, kLazyRescale the 24th, kSkipKept the 25th, kSumsWgmma the 26th, kTailInExp
# the 27th), then the kernel's variant.
_SM90_FWD_ARGS = (re.compile(r"FwdTraits<([^<>]*)>, (\d+), (?:true|false)>\("),
                  re.compile(r"FwdTraitsI((?:L[ib]-?\d+E)+)EELi(\d+)ELb[01]EEEvNS0_12FwdTmaParams"))
_SM90_FWD_BLOCK_M = 1
_SM90_FWD_LAZY, _SM90_FWD_SKIP, _SM90_FWD_SUMSW, _SM90_FWD_TAIL = 23, 24, 25, 26
Sm90FwdInstance = collections.namedtuple("Sm90FwdInstance",
                                         "variant lazy skip sums_wgmma tail_in_exp block_m")


def sm90_fwd_instance(name):
    """The sm90 forward instance a kernel name (kernel_names) shows: its variant
    (problem/mask.h KernelVariant), FwdTraits kLazyRescale, kSkipKept, kSumsWgmma,
    kTailInExp's level (the template argument, before fwd_traits.h's conditions) and kBlockM
    (the tile's query rows); None for another kernel."""
    if not any(part in name for part in SM90_FWD_KERNEL):
        return None
    found = _SM90_FWD_ARGS[0].search(name)
    if found:
        args = [a.strip() for a in found.group(1).split(",")]
    else:
        found = _SM90_FWD_ARGS[1].search(name)
        args = re.findall(r"L[ib](-?\d+)E", found.group(1)) if found else []
    assert found and len(args) > _SM90_FWD_TAIL, f"no template arguments read in {name}"
    flag = lambda a: a in ("true", "1")  # noqa: E731
    return Sm90FwdInstance(int(found.group(2)), int(args[_SM90_FWD_LAZY]),
                           flag(args[_SM90_FWD_SKIP]), flag(args[_SM90_FWD_SUMSW]),
                           int(args[_SM90_FWD_TAIL]), int(args[_SM90_FWD_BLOCK_M]))


def kernel_grids(fn, name_parts):
    """The grids ([x, y, z]) of the CUDA kernels fn() launches whose names contain one of
    name_parts, in launch order (torch's profiler, through its trace's kernel records)."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and
                      any(part in e["name"] for part in name_parts)), key=lambda e: e["ts"])
    return [e["args"]["grid"] for e in kernels]


class ChildRuns:
    """Child processes started together (at most `workers` at a time) and read back by name:
    the tests that run a call in a child of its own (a crash or a device trap ends only that
    child) pay each child's ~5 s of importing torch and starting CUDA side by side instead of
    one case after another. result(name) waits for that child's CompletedProcess."""

    def __init__(self, workers=8):
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, min(workers, os.cpu_count() or 1)))
        self._runs = {}

    def submit(self, name, argv, *, env, timeout=300):
        assert name not in self._runs, name
        self._runs[name] = self._pool.submit(subprocess.run, argv, capture_output=True,
                                             text=True, timeout=timeout, cwd="/", env=env)

    def result(self, name):
        return self._runs[name].result()

    def close(self):
        self._pool.shutdown(wait=True, cancel_futures=True)
