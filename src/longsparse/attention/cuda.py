"""The CUDA fast path of `attention` for α-entmax: the optional `adasplash` package (Triton kernels,
`pip install longsparse[cuda]`), used when it is installed and the call is one it accepts.

adasplash takes (B, H, N, D) q, k, v with N equal for queries and keys, one α in (1, 2], causal or
not, and always scales the logits by 1/√D. Its kernels (0.2.x) also need N a power of two and ≥ 64, and D one of
16, 32, 64, 128, 256: other calls stop there with an assertion (seen on a GPU in session 25), so they stay on our path.
A custom scale and per-query q-scales (SSMax/ASEntmax) are folded into q, which is exact up to rounding:
z = (q·s·scale·√D)·k / √D. Everything else (ALiBi/NAPE slopes, masks, decoding with Nq < Nk, per-head α)
is not expressible there and stays on the chunked path. LONGSPARSE_ADASPLASH=0 turns this path off.
How close adasplash's results are to the reference is not measured yet: the GPU test
(tests/test_attention_cuda.py) did not finish in session 25's time on the GPU.
"""
from __future__ import annotations

import math
import os
from typing import Optional

import torch
from torch import Tensor

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_HEAD_DIMS = (16, 32, 64, 128, 256)
_MIN_LEN = 64     # adasplash's block-mask tile


def _on_cuda(t: Tensor) -> bool:
    return t.is_cuda


def _module():
    if os.environ.get("LONGSPARSE_ADASPLASH", "1") == "0":
        return None
    try:
        import adasplash
    except ImportError:
        return None
    return adasplash


def adasplash_attention(q: Tensor, k: Tensor, v: Tensor, *, alpha, is_causal: bool, scale: float,
                        q_scale: Optional[Tensor], alibi_slopes: Optional[Tensor],
                        attn_mask: Optional[Tensor]) -> Optional[Tensor]:
    """α-entmax attention through adasplash, or None when it does not apply (not CUDA, not installed,
    or an argument adasplash cannot express). k and v already have q's number of heads."""
    if not _on_cuda(q) or alibi_slopes is not None or attn_mask is not None:
        return None
    if isinstance(alpha, Tensor) or not 1.0 < float(alpha) <= 2.0:     # one α for all heads only
        return None
    if q.shape[2] != k.shape[2] or q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return None
    n = q.shape[2]
    if n < _MIN_LEN or n & (n - 1) or q.shape[-1] not in _HEAD_DIMS:
        return None
    mod = _module()
    if mod is None:
        return None
    factor = scale * math.sqrt(q.shape[-1])
    if q_scale is not None:
        q = q * (q_scale.unsqueeze(-1).to(q.dtype) * factor)
    elif factor != 1.0:
        q = q * factor
    return mod.adasplash(q.contiguous(), k.contiguous(), v.contiguous(), alpha=float(alpha), is_causal=is_causal)
