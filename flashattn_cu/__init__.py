"""flashattn_cu: hand-written CUDA FlashAttention-2 for PyTorch, a drop-in for flash_attn 2.x.

    from flashattn_cu import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)   # q, k, v: (batch, seqlen, nheads, headdim)
"""

__version__ = "0.1.0"

import sys as _sys
from pathlib import Path as _Path


def _check_extension_present():
    """A clear error instead of "cannot import name '_C' ... circular import" when this folder
    has no compiled extension: typically the source checkout, which Python imports first when
    run from the checkout's root after a (non-editable) `pip install .`."""
    here = _Path(__file__).resolve().parent
    if any(here.glob("_C*.so")) or any(here.glob("_C*.pyd")):
        return
    installed = None
    for entry in _sys.path:
        cand = _Path(entry or ".").resolve() / "flashattn_cu"
        if cand != here and (any(cand.glob("_C*.so")) or any(cand.glob("_C*.pyd"))):
            installed = cand
            break
    if installed is not None:
        raise ImportError(
            f"flashattn_cu: Python imported the source folder {here}, which has no compiled "
            f"extension (_C), because the current directory comes first on sys.path; the "
            f"installed flashattn_cu is at {installed}. Run from another directory, or build in "
            f"place with `pip install --no-build-isolation -e .`."
        )
    raise ImportError(
        f"flashattn_cu: {here} has no compiled extension (_C) and no installed flashattn_cu was "
        f"found on sys.path. Build it: `pip install --no-build-isolation .` (or `-e .` to build "
        f"in place); see the README."
    )


_check_extension_present()

import torch  # noqa: E402,F401  (loads libc10/libtorch, which the extension links against)

from flashattn_cu.flash_attn_interface import (  # noqa: E402
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from flashattn_cu.kvcache import flash_attn_with_kvcache  # noqa: E402

__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache", "__version__"]
