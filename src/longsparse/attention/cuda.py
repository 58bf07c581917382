"""The `adasplash` backend: α-entmax attention through the optional `adasplash` package (Triton kernels,
`pip install longsparse[cuda]`). Opt-in: only used when named (``backend="adasplash"``), since no GPU run has
yet measured it equal to the reference (tests/unit/attention/test_attention_cuda.py holds that check).

adasplash takes (B, H, N, D) q, k, v with N equal for queries and keys, one α in (1, 2], causal or
not, and always scales the logits by 1/√D. Its kernels (0.2.x) also need N a power of two and ≥ 64, and D one
of 16, 32, 64, 128, 256: other calls stop there with an assertion, so `supports` refuses them.
A custom scale and per-query q-scales (SSMax/ASEntmax) are folded into q, which is exact up to rounding:
z = (q·s·scale·√D)·k / √D. ALiBi/NAPE slopes, masks, decoding with Nq < Nk and per-head α are not
expressible there. LONGSPARSE_ADASPLASH=0 disables it.
"""

from __future__ import annotations

import math
import os
from typing import Optional

import torch
from torch import Tensor

from longsparse.attention.call import AttentionCall

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_HEAD_DIMS = (16, 32, 64, 128, 256)
_MIN_LEN = 64  # adasplash's block-mask tile


def _on_cuda(call: AttentionCall) -> bool:
    return call.device_type == "cuda"


def _module():
    """(the adasplash module or None, why not)."""
    try:
        import adasplash
    except ImportError as exc:
        return None, f"not available: adasplash is not installed ({exc}); pip install 'longsparse[cuda]'"
    return adasplash, None


def supports(call: AttentionCall) -> Optional[str]:
    if os.environ.get("LONGSPARSE_ADASPLASH", "1") == "0":
        return "disabled by LONGSPARSE_ADASPLASH=0"
    if not _on_cuda(call):
        return f"tensors on {call.device_type}: adasplash needs CUDA"
    alpha = call.mapping.alpha
    if alpha is None:
        return f"mapping {call.mapping_name!r} is not α-entmax"
    if isinstance(alpha, Tensor):
        return "one α for all heads only (no per-head α)"
    if not 1.0 < float(alpha) <= 2.0:
        return f"α = {float(alpha):g} outside (1, 2]"
    if call.grad_of_bias:
        return "does not differentiate alpha, alibi_slopes or attn_mask"
    if call.alibi_slopes is not None:
        return "ALiBi slopes are not expressible in adasplash"
    if call.attn_mask is not None:
        return "attn_mask is not expressible in adasplash"
    B, H, Nq, Nk, D = call.shape
    if Nq != Nk:
        return f"decoding (Nq = {Nq} < Nk = {Nk}) is not expressible in adasplash"
    q, k, v = call.q, call.k, call.v
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtypes {q.dtype}, {k.dtype}, {v.dtype}: needs one of float16, bfloat16, float32"
    if Nq < _MIN_LEN or Nq & (Nq - 1):
        return f"length {Nq}: its kernels need a power of two ≥ {_MIN_LEN}"
    if v.shape[-1] != D:
        return f"value head dim {v.shape[-1]} differs from q/k's {D}: adasplash takes one head dim"
    if D not in _HEAD_DIMS:
        return f"head dim {D} not one of {_HEAD_DIMS}"
    return _module()[1]


def run(call: AttentionCall) -> Tensor:
    """α-entmax attention through adasplash (k and v with their heads repeated for GQA)."""
    mod, why = _module()
    if mod is None:
        raise RuntimeError(why)
    q = call.q
    k, v = call.kv_heads_repeated()
    factor = call.scale * math.sqrt(q.shape[-1])
    if call.q_scale is not None:
        q = q * (call.q_scale.unsqueeze(-1).to(q.dtype) * factor)
    elif factor != 1.0:
        q = q * factor
    return mod.adasplash(
        q.contiguous(), k.contiguous(), v.contiguous(), alpha=float(call.mapping.alpha), is_causal=call.is_causal
    )
