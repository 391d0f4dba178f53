"""Diagnosis of test_dropout_varlen's length-1 sequence: dq on each backward path, against a
float64 FlashAttention backward whose D = rowsum(dO * O) uses the kernel's rounded O."""
import torch

from flashattn_cu import flash_attn_varlen_func
from flashattn_cu.testing import kernel_path, dropout_mask_from_s_dmask

torch.manual_seed(0)
lens = [300, 0, 1, 77, 129]
cu = torch.zeros(len(lens) + 1, dtype=torch.int32, device="cuda")
cu[1:] = torch.tensor(lens, device="cuda").cumsum(0)
B = torch.bfloat16
q = torch.randn(sum(lens), 4, 64, device="cuda", dtype=B, requires_grad=True)
k = torch.randn(sum(lens), 2, 64, device="cuda", dtype=B, requires_grad=True)
v = torch.randn(sum(lens), 2, 64, device="cuda", dtype=B, requires_grad=True)
dout = torch.randn_like(q)
for fwd_path in ("auto", "sm80"):
    with kernel_path(fwd_path):
        out, _, s_dmask = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), dropout_p=0.25,
                                                 return_attn_probs=True, causal=True)
    s = 300  # sequence 2: one query, one key
    o, do_, vv = out[s].double(), dout[s].double(), v[s].double()  # (4, 64), (2, 64)
    mask = dropout_mask_from_s_dmask(s_dmask[2:3], 1, 1)[0, :, 0, 0]
    for bwd_path in ("auto", "sm80"):
        with kernel_path(bwd_path):
            dq = torch.autograd.grad(out, (q,), dout, retain_graph=True)[0][s].float()
        print(f"fwd {fwd_path} bwd {bwd_path}: max|dq| {dq.abs().max().item():.3e}, kept {mask.tolist()}")
    for h in range(4):
        hk = h // 2
        dp = (do_[h] * vv[hk]).sum() / 0.75 * float(mask[h])
        D = (do_[h] * o[h]).sum()
        dq_h = (dp - D) * k[s, hk].double() * 64 ** -0.5
        print(f"  head {h}: FA backward in fp64 with D from the rounded O: max|dq| {dq_h.abs().max().item():.3e}")
