"""The `reference` backend: all (B, H, Nq, Nk) logits at once, autograd differentiates everything (also α, the
ALiBi slopes and a float mask). Every other backend is tested equal to it."""

from __future__ import annotations

import torch
from torch import Tensor

from longsparse.attention.backends.registry import Backend
from longsparse.attention.call import AttentionCall
from longsparse.attention.capabilities import Capabilities
from longsparse.attention.logits import dense_logits

CAPABILITIES = Capabilities(grad_of_bias=True)


def run(call: AttentionCall) -> Tensor:
    k, v = call.kv_heads_repeated()
    z = dense_logits(
        call.q,
        k,
        scale=call.scale,
        q_scale=call.q_scale,
        alibi_slopes=call.alibi_slopes,
        attn_mask=call.attn_mask,
        is_causal=call.is_causal,
    )
    p = call.mapping(z)
    return torch.matmul(p, v.to(p.dtype)).to(call.q.dtype)


BACKEND = Backend(
    "reference", "materialises all (B, H, Nq, Nk) logits; autograd differentiates every input", (CAPABILITIES,), run
)
