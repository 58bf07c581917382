"""Attention over blocks of queries with a recomputing backward: the `chunked` backend (pure PyTorch) and the
`fused_cpu` backend (the C++ kernel, flash-style).

chunked: forward walks over blocks of queries; each block builds its logits, maps them and multiplies by v,
then throws them away. Only q, k, v and the q-scales are kept for the backward, which rebuilds each
block's probabilities (the mappings are deterministic) and accumulates dq, dk, dv. Memory is
O(block × Nk) in both directions instead of O(Nq × Nk). Blocks are (group of heads) × (run of queries): at
long Nk a block holds few heads and enough queries for each q·kᵀ product to stay compute-bound (a thin
block would re-read all of k per block). Under a causal mask a block of queries only reads the keys up to
its last query, so the work is about halved, and the mask itself is a small triangle on the last keys.

fused_cpu (`fused_attention`): the kernel's `attention_forward` / `attention_backward`
(attention/csrc/attention_cpu.cpp) take q, k, v whole and walk over blocks of `FUSED_BLOCK_ROWS` queries and tiles
of `FUSED_KEY_TILE` keys: one tile of logits exists at a time (scale, ALiBi and the causal mask applied
as it is built), each row's α-entmax threshold is solved on the candidates collected across its tiles,
and the output is gathered from the support only. The forward keeps, besides q, k, v, three float64
numbers per query row (max, τ, normaliser), from which the backward rebuilds each row's support without a
solve. Extra memory: O(block rows × key tile) plus the rows' candidates, never O(Nq × Nk).

`BlockSpec.fused_probabilities` / `fused_jvp` map whole blocks with the kernel's older in-place entry points
(`entmax_scores_forward` / `_backward`, attention/csrc/scores_cpu.cpp); the fused_dense backend uses them.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from longsparse import cpu_kernel
from longsparse.attention.band import alibi_live_keys
from longsparse.attention.call import AttentionCall
from longsparse.attention.logits import block_logits
from longsparse.mappings.registry import Mapping

_NONE_F64 = torch.empty(0, dtype=torch.float64)
_NONE_I64 = torch.empty(0, dtype=torch.int64)
_NONE_I32 = torch.empty(0, dtype=torch.int32)

# Logit elements per block (B·H·chunk·Nk): 64 MiB of fp32 per buffer, a quarter of the full (H, N, N)
# scores at N = 2048, H = 8 (the backward holds two such buffers).
_AUTO_CHUNK_ELEMENTS = 1 << 24
# Queries per block below which q·kᵀ turns memory-bound (it re-reads k for every block).
_MIN_ROWS = 256


class BlockSpec:
    """Everything the blocks share: how to build logits and map them."""

    def __init__(
        self,
        *,
        mapping: Mapping,
        is_causal: bool,
        scale: float,
        alibi_slopes: Optional[Tensor],
        attn_mask: Optional[Tensor],
        first_pos: int,
        block: int,
        head_block: int,
        dtype: torch.dtype,
        fused: bool,
    ):
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
        bad = cpu_kernel.get().entmax_scores_forward(
            z.view(-1, z.shape[-2], z.shape[-1]), a, self.scale, self.first_pos + rows.start, self.is_causal, slopes
        )
        if bad:
            raise ValueError("attention logits contain NaN or +inf (check q, k, scale and q_scale)")
        return z

    def fused_jvp(self, p: Tensor, dp: Tensor, heads: slice, n_heads: int) -> Tensor:
        """∂L/∂(q·kᵀ), i.e. already multiplied by the scale, computed in place in dp."""
        a = self._per_block_rows(self.mapping.alpha, heads, p.shape[0], n_heads)
        cpu_kernel.get().entmax_scores_backward(
            p.view(-1, p.shape[-2], p.shape[-1]), dp.view(-1, dp.shape[-2], dp.shape[-1]), a, self.scale
        )
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
            mask = mask[
                :,
                heads if mask.shape[1] != 1 else slice(None),
                rows if mask.shape[2] != 1 else slice(None),
                : k.shape[-2],
            ]
        z = block_logits(
            qs,
            k,
            scale=self.scale,
            first_pos=self.first_pos + rows.start,
            alibi_slopes=None if self.alibi_slopes is None else self.alibi_slopes[heads],
            attn_mask=mask,
            is_causal=self.is_causal,
        )
        return self.mapping.rows(heads, rows).forward(z)

    def jvp(self, p: Tensor, dp: Tensor, saved, heads: slice, rows: slice) -> Tensor:
        """∂L/∂z of one block from ∂L/∂p."""
        return self.mapping.rows(heads, rows).backward(p, dp, saved)


def chunked_attention(call: AttentionCall) -> Tensor:
    """The chunked backend: blocks of ``call.chunk_size`` queries (None = sized automatically) over all
    heads, or over fewer heads when Nk is long. Returns (B, H, Nq, D) in q's dtype."""
    q = call.q
    k, v = call.kv_heads_repeated()
    B, H, Nq, Nk, _ = call.shape
    chunk_size, head_block = call.chunk_size, H
    if chunk_size is None:
        # all heads at once while that leaves ≥ _MIN_ROWS queries per block, else fewer heads
        head_block = max(1, min(H, _AUTO_CHUNK_ELEMENTS // max(1, B * Nk * _MIN_ROWS)))
        chunk_size = max(1, _AUTO_CHUNK_ELEMENTS // max(1, B * head_block * Nk))
        if call.is_causal:  # ≥ 8 query blocks, so that blocks skip the keys in their future
            chunk_size = min(chunk_size, max(_MIN_ROWS, -(-Nq // 8)))
    spec = BlockSpec(
        mapping=call.mapping,
        is_causal=call.is_causal,
        scale=call.scale,
        alibi_slopes=call.alibi_slopes,
        attn_mask=call.attn_mask,
        first_pos=call.first_pos,
        block=chunk_size,
        head_block=head_block,
        dtype=call.compute_dtype,
        fused=False,
    )
    return ChunkedAttention.apply(q, k, v, call.q_scale, spec)


class ChunkedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, q_scale: Optional[Tensor], spec: BlockSpec) -> Tensor:
        with torch.autocast(q.device.type, enabled=False):  # blocks are computed in spec.dtype
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
        return (dq.to(dt[0]), dk.to(dt[1]), dv.to(dt[2]), None if dsc is None else dsc.to(dt[3]), None)


# ----------------------------------------------------------------------------- fused_cpu

# Query rows per block and keys per tile of the fused kernel. Enough rows keep the per-tile products compute-bound
# (a thin block re-reads its k tile for few rows: q·kᵀ ran at 34 GFLOP/s with 16 rows, 120 with 64, one core);
# a 128 × 512 fp32 logit tile is 256 KiB, in L2 with its k and v tiles. At N = 16384, 1 thread, 128 rows ran
# the softmax forward at 1.06× SDPA's time against 1.16× with 64 rows (α = 1.5: 0.65 against 0.70×), 256 rows
# no better; 2K fwd+bwd the same with either. docs/benchmarks.md, "Fused attention kernel".
FUSED_BLOCK_ROWS = 128
FUSED_KEY_TILE = 512
# Fewest query rows for which the fused kernel takes a band of live keys on ALiBi heads (`FusedSpec.find_band`).
# The band reads every key's norm, as much memory as the kernel's walk of an ALiBi head for one row: decoding
# (Nq = 1, 8 heads, half NAPE, 1 thread, CPU time) ran 1.04-1.6x slower with it at Nk = 4K-64K, Nq = 16
# 1.03-1.25x, Nq = 32-64 1.14-1.18x at 4K and 0.79-0.82x at 64K, Nq = 128 0.63-0.91x.
BAND_MIN_ROWS = 64


def _per_head(value, n_heads: int) -> Tensor:
    """A per-head quantity (float, or a tensor of 1 or H elements) as contiguous float64 (H,) on the CPU."""
    if isinstance(value, Tensor):
        v = value.detach().reshape(-1).to(device="cpu", dtype=torch.float64)
        return (v.expand(n_heads) if v.numel() == 1 else v).contiguous()
    return torch.full((n_heads,), float(value), dtype=torch.float64, device="cpu")


class FusedSpec:
    """The fused kernel's arguments besides q, k, v: per-head α and ALiBi slopes (float64 (H,); no slopes:
    empty), scale, causal flag, the key ranges (int64 (B,) key_start / key_end; none: empty), each row's band
    of live keys (int32 (B, H, Nq) band_lo / band_hi, set by `find_band` from the forward's q; none: empty),
    compute dtype, block rows and key tile."""

    def __init__(self, call: AttentionCall, block_rows: int, key_tile: int):
        H = call.q.shape[1]
        self.alpha = _per_head(call.mapping.alpha, H)
        self.slopes = _NONE_F64 if call.alibi_slopes is None else _per_head(call.alibi_slopes, H)
        self.key_start, self.key_end = (
            _NONE_I64 if t is None else t.to(device="cpu", dtype=torch.int64).contiguous()
            for t in (call.key_start, call.key_end)
        )
        self.scale, self.is_causal, self.dtype = call.scale, call.is_causal, call.compute_dtype
        self.block_rows, self.key_tile = block_rows, key_tile
        self.band_lo = self.band_hi = _NONE_I32

    def find_band(self, qs: Tensor, k: Tensor) -> None:
        """Sets each row's band of live keys (attention/band.py) from the kernel's own queries qs (q·s in the
        compute dtype) and keys k (H heads), so that the kernel walks only the key tiles next to the diagonal
        on ALiBi heads; the backward reads the same band. The band is computed for the heads with a positive
        slope and α > 1 (the others get [0, Nk): the kernel cuts it to the visible keys). Only calls with at
        least `BAND_MIN_ROWS` query rows, and only causal ones: the band assumes the symmetric bias
        −m·|P − j| off the causal mask, while the kernel's non-causal bias is −m·(P − j)."""
        if self.slopes.numel() == 0 or not self.is_causal or qs.shape[2] < BAND_MIN_ROWS:
            return
        banded = ((self.slopes > 0) & (self.alpha > 1)).nonzero().flatten().tolist()
        if not banded:
            return
        # a slice of heads (NAPE's are the first H/2) is a view; any other set: all heads (copying k costs more)
        contiguous = banded == list(range(banded[0], banded[-1] + 1))
        heads = slice(banded[0], banded[-1] + 1) if contiguous else slice(None)
        B, H, Nq, Nk = qs.shape[0], qs.shape[1], qs.shape[2], k.shape[2]
        first, last = alibi_live_keys(
            qs[:, heads],
            k[:, heads],
            alibi_slopes=self.slopes[heads],
            alpha=self.alpha[heads],
            scale=self.scale,
            is_causal=self.is_causal,
            key_start=self.key_start if self.key_start.numel() else None,
            key_end=self.key_end if self.key_end.numel() else None,
        )
        self.band_lo = torch.zeros((B, H, Nq), dtype=torch.int32, device="cpu")
        self.band_hi = torch.full((B, H, Nq), Nk, dtype=torch.int32, device="cpu")
        self.band_lo[:, heads] = first
        self.band_hi[:, heads] = last

    def args(self):
        """The kernel's arguments after (q, k, v[, dout, out, stats])."""
        return (
            self.alpha,
            self.scale,
            self.is_causal,
            self.slopes,
            self.key_start,
            self.key_end,
            self.band_lo,
            self.band_hi,
            self.block_rows,
            self.key_tile,
        )


def fused_attention(call: AttentionCall) -> Tensor:
    """The fused_cpu backend: α-entmax attention (α per head; 1 is softmax) by the C++ kernel, blocks of
    ``call.chunk_size`` query rows (None: `FUSED_BLOCK_ROWS`). Key ranges are read natively: a block's tiles
    start at its batch row's key_start (left padding costs nothing). Returns (B, H, Nq, D) in q's dtype."""
    k, v = call.kv_heads_repeated()
    spec = FusedSpec(call, call.chunk_size or FUSED_BLOCK_ROWS, FUSED_KEY_TILE)
    return FusedAttention.apply(call.q, k, v, call.q_scale, spec)


def _scaled_queries(q: Tensor, q_scale: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    """q·s in the compute dtype, contiguous: what the kernel takes as its queries."""
    q = q.to(dtype)
    return (q if q_scale is None else q * q_scale.to(dtype).unsqueeze(-1)).contiguous()


class FusedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, q_scale: Optional[Tensor], spec: FusedSpec) -> Tensor:
        cdt = spec.dtype
        kc, vc = k.to(cdt).contiguous(), v.to(cdt).contiguous()
        qs = _scaled_queries(q, q_scale, cdt)
        spec.find_band(qs, kc)
        out, stats, bad = cpu_kernel.get().attention_forward(qs, kc, vc, *spec.args())
        if bad:
            raise ValueError("attention logits contain NaN or +inf (check q, k, scale and q_scale)")
        ctx.spec = spec
        # softmax heads differentiate by BLAS products, which need dout·out per row (the output is kept)
        kept_out = out if bool((spec.alpha == 1).any()) else _NONE_F64.to(cdt)
        ctx.save_for_backward(q, k, v, q_scale, stats, kept_out)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, q_scale, stats, out = ctx.saved_tensors
        spec = ctx.spec
        cdt = spec.dtype
        qs = _scaled_queries(q, q_scale, cdt)
        dqs, dk, dv = cpu_kernel.get().attention_backward(
            qs, k.to(cdt).contiguous(), v.to(cdt).contiguous(), dout.to(cdt).contiguous(), out, stats, *spec.args()
        )
        dq = dsc = None
        if q_scale is None:
            dq = dqs
        else:
            dq = dqs * q_scale.to(cdt).unsqueeze(-1)
            dsc = (dqs * q.to(cdt)).sum(-1).to(q_scale.dtype)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsc, None
