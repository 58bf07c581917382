"""The `adasplash` backend: α-entmax attention through the optional `adasplash` package (Triton kernels,
`pip install longsparse[cuda]`). Opt-in: only used when named (``backend="adasplash"``), since no GPU run has
yet measured it equal to the reference (tests/unit/attention/test_attention_cuda.py holds that check).

adasplash takes (B, H, N, D) q, k, v with N equal for queries and keys, one α in (1, 2], causal or
not, and always scales the logits by 1/√D. Its kernels (0.2.x) also need N a power of two and ≥ 64, and D one
of 16, 32, 64, 128, 256: other calls stop there with an assertion, so the backend's capabilities
(attention/backends/adasplash.py) exclude them.
A custom scale and per-query q-scales (SSMax/ASEntmax) are folded into q, which is exact up to rounding:
z = (q·s·scale·√D)·k / √D. ALiBi/NAPE slopes, masks, decoding with Nq < Nk and per-head α are not
expressible there. LONGSPARSE_ADASPLASH=0 disables it.
"""

from __future__ import annotations

import math

from torch import Tensor

from longsparse.attention.call import AttentionCall


def module():
    """(the adasplash module or None, why not)."""
    try:
        import adasplash
    except ImportError as exc:
        return None, f"not available: adasplash is not installed ({exc}); pip install 'longsparse[cuda]'"
    return adasplash, None


def run(call: AttentionCall) -> Tensor:
    """α-entmax attention through adasplash (k and v with their heads repeated for GQA)."""
    mod, why = module()
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
