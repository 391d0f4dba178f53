"""flashattn_cu: hand-written CUDA FlashAttention-2 for PyTorch, a drop-in for flash_attn 2.x.

    from flashattn_cu import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)   # q, k, v: (batch, seqlen, nheads, headdim)
"""

__version__ = "0.1.0"

import torch  # noqa: E402,F401  (loads libc10/libtorch, which the extension links against)

from flashattn_cu.flash_attn_interface import (  # noqa: E402
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)

__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func", "__version__"]
