"""Query-chunked attention with a recomputing backward (flash-attention style, on CPU).

Forward walks over blocks of queries; each block builds its logits, maps them and multiplies by v,
then throws them away. Only q, k, v, the q-scales and the output are kept for the backward, which
rebuilds each block's probabilities (the mappings are deterministic) and accumulates dq, dk, dv.
Memory is O(block × Nk) in both directions instead of O(Nq × Nk).

Under a causal mask a block of queries only reads the keys up to its last query, so the work is
about halved, and the mask itself is a small (block × block) triangle on the last keys.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from longsparse.mappings.entmax import AlphaLike, entmax_jvp_backward


class BlockSpec:
    """Everything the blocks share: how to build logits and map them."""

    def __init__(self, *, name: str, alpha: AlphaLike, is_causal: bool, scale: float,
                 alibi_slopes: Optional[Tensor], attn_mask: Optional[Tensor], topk: int, adatemp_order: str,
                 first_pos: int, block: int, dtype: torch.dtype):
        self.name, self.alpha, self.is_causal, self.scale = name, alpha, is_causal, scale
        self.alibi_slopes = None if alibi_slopes is None else alibi_slopes.detach().to(dtype).view(1, -1, 1, 1)
        self.attn_mask, self.topk, self.adatemp_order = attn_mask, topk, adatemp_order
        self.first_pos, self.block, self.dtype = first_pos, block, dtype

    def key_end(self, s: int, e: int, nk: int) -> int:
        """Keys visible to query rows [s, e): all, or up to the last row's own position if causal."""
        return min(nk, self.first_pos + e) if self.is_causal else nk

    def logits(self, qs: Tensor, k: Tensor, s: int, e: int) -> Tensor:
        """Logits of query rows [s, e) (already scaled q) against keys k[..., :kend, :]."""
        from longsparse.attention.core import apply_bias_and_masks

        z = torch.matmul(qs, k.transpose(-1, -2)).mul_(self.scale)
        mask = self.attn_mask
        if mask is not None and mask.dim() >= 2 and mask.shape[-2] != 1:
            mask = mask[..., s:e, :]
        if mask is not None:
            mask = mask[..., : k.shape[-2]]
        return apply_bias_and_masks(z, self.first_pos + s, alibi_slopes=self.alibi_slopes, attn_mask=mask,
                                    is_causal=self.is_causal)

    def probabilities(self, z: Tensor):
        """(p, extra): extra is the per-row temperature for adatemp (needed by its backward)."""
        from longsparse.attention.core import adaptive_temperature, map_scores

        if self.name == "adatemp":
            theta = adaptive_temperature(z, self.adatemp_order)
            return map_scores(z * theta, "softmax"), theta
        return map_scores(z, self.name, alpha=self.alpha, topk=self.topk), None

    def jvp(self, p: Tensor, dp: Tensor, extra) -> Tensor:
        """∂L/∂z from ∂L/∂p for the block's mapping (top-k is softmax on its kept set: u = p)."""
        if self.name == "adatemp":
            return entmax_jvp_backward(p, dp, 1.0, -1).mul_(extra)
        alpha = {"softmax": 1.0, "topk": 1.0, "sparsemax": 2.0}.get(self.name, self.alpha)
        if isinstance(alpha, Tensor):
            alpha = alpha.to(p.dtype)
        else:
            alpha = float(alpha)
        return entmax_jvp_backward(p, dp, alpha, -1)


class ChunkedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, q_scale: Optional[Tensor], spec: BlockSpec) -> Tensor:
        cdt = spec.dtype
        qc, kc, vc = q.to(cdt), k.to(cdt), v.to(cdt)
        sc = None if q_scale is None else q_scale.to(cdt)
        nq, nk = q.shape[2], k.shape[2]
        out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=cdt)
        for s in range(0, nq, spec.block):
            e = min(nq, s + spec.block)
            kend = spec.key_end(s, e, nk)
            qs = qc[:, :, s:e] if sc is None else qc[:, :, s:e] * sc[:, :, s:e, None]
            p, _ = spec.probabilities(spec.logits(qs, kc[:, :, :kend], s, e))
            torch.matmul(p, vc[:, :, :kend], out=out[:, :, s:e])
        ctx.spec = spec
        ctx.in_dtypes = (q.dtype, k.dtype, v.dtype, None if q_scale is None else q_scale.dtype)
        ctx.save_for_backward(q, k, v, q_scale)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, q_scale = ctx.saved_tensors
        spec = ctx.spec
        cdt = spec.dtype
        qc, kc, vc, do = q.to(cdt), k.to(cdt), v.to(cdt), dout.to(cdt)
        sc = None if q_scale is None else q_scale.to(cdt)
        nq, nk = q.shape[2], k.shape[2]
        dq = torch.zeros_like(qc)
        dk = torch.zeros_like(kc)
        dv = torch.zeros_like(vc)
        dsc = None if sc is None else torch.zeros_like(sc)
        for s in range(0, nq, spec.block):
            e = min(nq, s + spec.block)
            kend = spec.key_end(s, e, nk)
            q_blk = qc[:, :, s:e]
            qs = q_blk if sc is None else q_blk * sc[:, :, s:e, None]
            p, extra = spec.probabilities(spec.logits(qs, kc[:, :, :kend], s, e))
            do_blk = do[:, :, s:e]
            dv[:, :, :kend] += torch.matmul(p.transpose(-1, -2), do_blk)
            dz = spec.jvp(p, torch.matmul(do_blk, vc[:, :, :kend].transpose(-1, -2)), extra)
            del p
            dz.mul_(spec.scale)
            dqs = torch.matmul(dz, kc[:, :, :kend])
            dk[:, :, :kend] += torch.matmul(dz.transpose(-1, -2), qs)
            if sc is None:
                dq[:, :, s:e] = dqs
            else:
                dq[:, :, s:e] = dqs * sc[:, :, s:e, None]
                dsc[:, :, s:e] = (dqs * q_blk).sum(-1)
        dt = ctx.in_dtypes
        return (dq.to(dt[0]), dk.to(dt[1]), dv.to(dt[2]),
                None if dsc is None else dsc.to(dt[3]), None)
