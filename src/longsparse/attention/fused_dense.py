"""The `fused_dense` backend: all (B, H, Nq, Nk) logits at once through the C++ kernel, the probabilities kept
for the backward.

For short rows with a gradient (the synthetic tasks train at 80–120 tokens) the recomputing backward of
fused_cpu and chunked repeats the forward's q·kᵀ and α-entmax solve to save memory that is small there, and
the reference builds the logits with several autograd passes (scale, ALiBi, mask) before its mapping. Here the forward is one q·kᵀ product, one in-place kernel pass (scale, ALiBi, causal mask, α-entmax:
`chunked.BlockSpec.fused_probabilities`) and p·v; the backward reuses p: d(p) = dout·vᵀ, the kernel's Jacobian
product in place (`BlockSpec.fused_jvp`), then the three products. Memory: p is kept, B·H·Nq·Nk elements of
the compute dtype, so the auto policy sends it short rows only (`policy.FUSED_DENSE_MAX_KEYS` / `_ELEMENTS`).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from longsparse.attention.call import AttentionCall
from longsparse.attention.chunked import BlockSpec


def fused_dense_attention(call: AttentionCall) -> Tensor:
    """The call (α-entmax mapping, CPU, no attn_mask; see attention/backends/fused.py) as one block.
    Returns (B, H, Nq, D) in q's dtype."""
    k, v = call.kv_heads_repeated()
    B, H, Nq, Nk, _ = call.shape
    spec = BlockSpec(
        mapping=call.mapping,
        is_causal=call.is_causal,
        scale=call.scale,
        alibi_slopes=call.alibi_slopes,
        attn_mask=None,
        first_pos=call.first_pos,
        block=max(1, Nq),
        head_block=H,
        dtype=call.compute_dtype,
        fused=True,
    )
    return FusedDenseAttention.apply(call.q, k, v, call.q_scale, spec)


class FusedDenseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, q_scale: Optional[Tensor], spec: BlockSpec) -> Tensor:
        with torch.autocast(q.device.type, enabled=False):  # computed in spec.dtype, as the chunked blocks
            cdt = spec.dtype
            # contiguous once here: the batched products would copy strided (B, N, H, D)-layout heads at every
            # use, three times more in the backward
            qs = q.to(cdt) if q_scale is None else q.to(cdt) * q_scale.to(cdt).unsqueeze(-1)
            qs, kc, vc = qs.contiguous(), k.to(cdt).contiguous(), v.to(cdt).contiguous()
            H = q.shape[1]
            p = spec.fused_probabilities(qs, kc, slice(0, H), slice(0, q.shape[2]), H)  # (B, H, Nq, Nk)
            out = torch.matmul(p, vc)
        ctx.spec = spec
        ctx.in_dtypes = (q.dtype, k.dtype, v.dtype, None if q_scale is None else q_scale.dtype)
        # the unscaled q only for the q-scale's gradient; the rest is B·H·N·D each beside p's B·H·Nq·Nk
        ctx.save_for_backward(None if q_scale is None else q, q_scale, qs, kc, vc, p)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, q_scale, qs, kc, vc, p = ctx.saved_tensors
        spec = ctx.spec
        with torch.autocast(dout.device.type, enabled=False):
            do = dout.to(spec.dtype).contiguous()
            H = p.shape[1]
            dv = torch.matmul(p.transpose(-1, -2), do)
            dz = spec.fused_jvp(p, torch.matmul(do, vc.transpose(-1, -2)), slice(0, H), H)  # ∂L/∂(qs·kᵀ)
            dqs = torch.matmul(dz, kc)
            dk = torch.matmul(dz.transpose(-1, -2), qs)
            dq = dsc = None
            if q_scale is None:
                dq = dqs
            else:
                dq = dqs * q_scale.to(spec.dtype).unsqueeze(-1)
                dsc = (dqs * q.to(spec.dtype)).sum(-1)
        dt = ctx.in_dtypes
        return (dq.to(dt[0]), dk.to(dt[1]), dv.to(dt[2]), None if dsc is None else dsc.to(dt[3]), None)
