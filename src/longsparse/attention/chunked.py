"""Query-chunked attention with a recomputing backward (flash-attention style, on CPU): the `chunked` and
`fused_cpu` backends.

Forward walks over blocks of queries; each block builds its logits, maps them and multiplies by v,
then throws them away. Only q, k, v, the q-scales and the output are kept for the backward, which
rebuilds each block's probabilities (the mappings are deterministic) and accumulates dq, dk, dv.
Memory is O(block × Nk) in both directions instead of O(Nq × Nk).

Blocks are (group of heads) × (run of queries): at long Nk a block holds few heads and enough
queries for each q·kᵀ product to stay compute-bound (a thin block would re-read all of k per block).
Under a causal mask a block of queries only reads the keys up to its last query, so the work is
about halved, and the mask itself is a small triangle on the last keys.

`fused=True` (the fused_cpu backend) hands each block's q·kᵀ to the C++ kernel, which applies scale,
ALiBi, the causal mask and α-entmax in one in-place pass (and the backward's Jacobian product likewise);
otherwise the block's logits come from `logits.block_logits` and its mapping from the registry.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from longsparse.attention.call import AttentionCall
from longsparse.attention.logits import block_logits
from longsparse.mappings import _kernel
from longsparse.mappings.registry import Mapping

# Logit elements per block (B·H·chunk·Nk): 64 MiB of fp32 per buffer, a quarter of the full (H, N, N)
# scores at N = 2048, H = 8 (the backward holds two such buffers).
_AUTO_CHUNK_ELEMENTS = 1 << 24
# Queries per block below which q·kᵀ turns memory-bound (it re-reads k for every block).
_MIN_ROWS = 256


class BlockSpec:
    """Everything the blocks share: how to build logits and map them."""

    def __init__(self, *, mapping: Mapping, is_causal: bool, scale: float, alibi_slopes: Optional[Tensor],
                 attn_mask: Optional[Tensor], first_pos: int, block: int, head_block: int, dtype: torch.dtype,
                 fused: bool):
        self.mapping, self.is_causal, self.scale = mapping, is_causal, scale
        self.alibi_slopes = None if alibi_slopes is None else alibi_slopes.detach().to(dtype)
        if attn_mask is not None and attn_mask.dim() < 4:
            attn_mask = attn_mask.view((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
        self.attn_mask = attn_mask
        self.first_pos, self.block, self.head_block, self.dtype = first_pos, block, head_block, dtype
        self.fused = fused

    # -- the fused C++ kernel ---------------------------------------------------------------
    def _per_block_rows(self, value, heads: slice, batch: int, n_heads: int):
        """A per-head quantity (float, (H,) or (1, H, 1, 1) tensor, or None) as float64 (batch × heads-in-block,)
        on the CPU, for the fused kernel."""
        if value is None:
            return torch.empty(0, dtype=torch.float64, device="cpu")
        if isinstance(value, Tensor):
            v = value.detach().reshape(-1).to(torch.float64)
            v = v.expand(n_heads) if v.numel() == 1 else v
            return v[heads].repeat(batch).contiguous()
        return torch.full((batch * len(range(n_heads)[heads]),), float(value), dtype=torch.float64, device="cpu")

    def fused_probabilities(self, qs: Tensor, k: Tensor, heads: slice, rows: slice, n_heads: int) -> Tensor:
        z = torch.matmul(qs, k.transpose(-1, -2))
        a = self._per_block_rows(self.mapping.alpha, heads, z.shape[0], n_heads)
        slopes = self._per_block_rows(self.alibi_slopes, heads, z.shape[0], n_heads)
        bad = _kernel.get().entmax_scores_forward(z.view(-1, z.shape[-2], z.shape[-1]), a, self.scale,
                                                  self.first_pos + rows.start, self.is_causal, slopes)
        if bad:
            raise ValueError("attention logits contain NaN or +inf (check q, k, scale and q_scale)")
        return z

    def fused_jvp(self, p: Tensor, dp: Tensor, heads: slice, n_heads: int) -> Tensor:
        """∂L/∂(q·kᵀ), i.e. already multiplied by the scale, computed in place in dp."""
        a = self._per_block_rows(self.mapping.alpha, heads, p.shape[0], n_heads)
        _kernel.get().entmax_scores_backward(p.view(-1, p.shape[-2], p.shape[-1]),
                                             dp.view(-1, dp.shape[-2], dp.shape[-1]), a, self.scale)
        return dp

    # -- blocks -----------------------------------------------------------------------------
    def blocks(self, n_heads: int, nq: int, nk: int):
        """(heads, rows, kend) of every block: heads and rows are slices, kend the visible keys."""
        for h0 in range(0, n_heads, self.head_block):
            heads = slice(h0, min(n_heads, h0 + self.head_block))
            for s in range(0, nq, self.block):
                e = min(nq, s + self.block)
                yield heads, slice(s, e), self.key_end(s, e, nk)

    def key_end(self, s: int, e: int, nk: int) -> int:
        """Keys visible to query rows [s, e): all, or up to the last row's own position if causal."""
        return min(nk, self.first_pos + e) if self.is_causal else nk

    def probabilities(self, qs: Tensor, k: Tensor, heads: slice, rows: slice):
        """(p, saved) of one block: query rows `rows` of heads `heads` (q already scaled) against k[..., :kend, :]."""
        mask = self.attn_mask
        if mask is not None:
            mask = mask[:, heads if mask.shape[1] != 1 else slice(None),
                        rows if mask.shape[2] != 1 else slice(None), : k.shape[-2]]
        z = block_logits(qs, k, scale=self.scale, first_pos=self.first_pos + rows.start,
                         alibi_slopes=None if self.alibi_slopes is None else self.alibi_slopes[heads],
                         attn_mask=mask, is_causal=self.is_causal)
        return self.mapping.rows(heads, rows).forward(z)

    def jvp(self, p: Tensor, dp: Tensor, saved, heads: slice, rows: slice) -> Tensor:
        """∂L/∂z of one block from ∂L/∂p."""
        return self.mapping.rows(heads, rows).backward(p, dp, saved)


def chunked_attention(call: AttentionCall, fused: bool) -> Tensor:
    """The chunked backends: blocks of ``call.chunk_size`` queries (None = sized automatically) over all
    heads, or over fewer heads when Nk is long. Returns (B, H, Nq, D) in q's dtype."""
    q = call.q
    k, v = call.kv_heads_repeated()
    B, H, Nq, Nk, _ = call.shape
    chunk_size, head_block = call.chunk_size, H
    if chunk_size is None:
        # all heads at once while that leaves ≥ _MIN_ROWS queries per block, else fewer heads
        head_block = max(1, min(H, _AUTO_CHUNK_ELEMENTS // max(1, B * Nk * _MIN_ROWS)))
        chunk_size = max(1, _AUTO_CHUNK_ELEMENTS // max(1, B * head_block * Nk))
        if call.is_causal:   # ≥ 8 query blocks, so that blocks skip the keys in their future
            chunk_size = min(chunk_size, max(_MIN_ROWS, -(-Nq // 8)))
    spec = BlockSpec(mapping=call.mapping, is_causal=call.is_causal, scale=call.scale,
                     alibi_slopes=call.alibi_slopes, attn_mask=call.attn_mask, first_pos=call.first_pos,
                     block=chunk_size, head_block=head_block, dtype=call.compute_dtype, fused=fused)
    return ChunkedAttention.apply(q, k, v, call.q_scale, spec)


class ChunkedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, q_scale: Optional[Tensor], spec: BlockSpec) -> Tensor:
        with torch.autocast(q.device.type, enabled=False):   # blocks are computed in spec.dtype
            return ChunkedAttention._forward(ctx, q, k, v, q_scale, spec)

    @staticmethod
    def _forward(ctx, q: Tensor, k: Tensor, v: Tensor, q_scale: Optional[Tensor], spec: BlockSpec) -> Tensor:
        cdt = spec.dtype
        qc, kc, vc = q.to(cdt), k.to(cdt), v.to(cdt)
        sc = None if q_scale is None else q_scale.to(cdt)
        nq, nk = q.shape[2], k.shape[2]
        out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=cdt, device=q.device)
        for h, r, kend in spec.blocks(q.shape[1], nq, nk):
            qs = qc[:, h, r] if sc is None else qc[:, h, r] * sc[:, h, r, None]
            if spec.fused:
                p = spec.fused_probabilities(qs, kc[:, h, :kend], h, r, q.shape[1])
            else:
                p, _ = spec.probabilities(qs, kc[:, h, :kend], h, r)
            out[:, h, r] = torch.matmul(p, vc[:, h, :kend])
        ctx.spec = spec
        ctx.in_dtypes = (q.dtype, k.dtype, v.dtype, None if q_scale is None else q_scale.dtype)
        ctx.save_for_backward(q, k, v, q_scale)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout: Tensor):
        with torch.autocast(dout.device.type, enabled=False):
            return ChunkedAttention._backward(ctx, dout)

    @staticmethod
    def _backward(ctx, dout: Tensor):
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
        for h, r, kend in spec.blocks(q.shape[1], nq, nk):
            q_blk = qc[:, h, r]
            qs = q_blk if sc is None else q_blk * sc[:, h, r, None]
            do_blk = do[:, h, r]
            dp = torch.matmul(do_blk, vc[:, h, :kend].transpose(-1, -2))
            if spec.fused:
                p = spec.fused_probabilities(qs, kc[:, h, :kend], h, r, q.shape[1])
                dz = spec.fused_jvp(p, dp, h, q.shape[1])
            else:
                p, saved = spec.probabilities(qs, kc[:, h, :kend], h, r)
                dz = spec.jvp(p, dp, saved, h, r).mul_(spec.scale)
            dv[:, h, :kend] += torch.matmul(p.transpose(-1, -2), do_blk)
            del p
            dqs = torch.matmul(dz, kc[:, h, :kend])
            dk[:, h, :kend] += torch.matmul(dz.transpose(-1, -2), qs)
            if sc is None:
                dq[:, h, r] = dqs
            else:
                dq[:, h, r] = dqs * sc[:, h, r, None]
                dsc[:, h, r] = (dqs * q_blk).sum(-1)
        dt = ctx.in_dtypes
        return (dq.to(dt[0]), dk.to(dt[1]), dv.to(dt[2]),
                None if dsc is None else dsc.to(dt[3]), None)
