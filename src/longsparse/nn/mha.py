"""EntmaxMultiheadAttention: a drop-in for torch.nn.MultiheadAttention with a sparse mapping.

Mask conventions follow nn.MultiheadAttention: a boolean ``attn_mask`` / ``key_padding_mask`` is
True where attention is NOT allowed; a float mask is added to the logits. ``attn_mask`` is (L, S) or
(B·num_heads, L, S); ``key_padding_mask`` is (B, S). A query that may attend to nothing gets zeros.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from longsparse.attention import attention, dense_logits
from longsparse.mappings import get_mapping


class EntmaxMultiheadAttention(nn.Module):
    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        kdim: Optional[int] = None,
        vdim: Optional[int] = None,
        batch_first: bool = True,
        alpha: float = 1.5,
        mapping: str = "entmax",
        topk: int = 32,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if dropout:
            raise ValueError("dropout is not supported by EntmaxMultiheadAttention (use dropout=0.0)")
        fk = dict(device=device, dtype=dtype)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.batch_first, self.alpha, self.mapping, self.topk = batch_first, alpha, mapping, topk
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **fk)
        self.k_proj = nn.Linear(kdim or embed_dim, embed_dim, bias=bias, **fk)
        self.v_proj = nn.Linear(vdim or embed_dim, embed_dim, bias=bias, **fk)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **fk)
        for lin in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    def _mask(self, attn_mask, key_padding_mask, B, L, S, is_causal, dtype, device) -> Optional[Tensor]:
        """Additive float mask broadcastable to (B, H, L, S), or None."""
        add = None

        def to_add(m: Tensor, name: str) -> Tensor:
            if m.dtype == torch.bool:
                return torch.zeros(m.shape, dtype=dtype, device=device).masked_fill(m, float("-inf"))
            if not m.is_floating_point():  # as nn.MultiheadAttention: an integer mask has no meaning
                raise ValueError(f"{name} must be bool (True = masked) or floating point (added); got dtype {m.dtype}")
            return m.to(dtype)

        if attn_mask is not None:
            m = to_add(attn_mask, "attn_mask")
            if m.dim() == 2:
                if m.shape != (L, S):
                    raise ValueError(f"2-D attn_mask must be {(L, S)}, got {tuple(m.shape)}")
                m = m.view(1, 1, L, S)
            elif m.dim() == 3:
                if m.shape != (B * self.num_heads, L, S):
                    raise ValueError(f"3-D attn_mask must be {(B * self.num_heads, L, S)}, got {tuple(m.shape)}")
                m = m.view(B, self.num_heads, L, S)
            else:
                raise ValueError(f"attn_mask must be 2-D or 3-D, got {m.dim()}-D")
            add = m
        if key_padding_mask is not None:
            if key_padding_mask.shape != (B, S):
                raise ValueError(f"key_padding_mask must be {(B, S)}, got {tuple(key_padding_mask.shape)}")
            m = to_add(key_padding_mask, "key_padding_mask").view(B, 1, 1, S)
            add = m if add is None else add + m
        if is_causal:
            c = torch.ones(L, S, dtype=torch.bool, device=device).triu(1)
            m = torch.zeros(L, S, dtype=dtype, device=device).masked_fill(c, float("-inf")).view(1, 1, L, S)
            add = m if add is None else add + m
        return add

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        need_weights: bool = True,
        attn_mask: Optional[Tensor] = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        B, L, _ = query.shape
        S = key.shape[1]
        H, Dh = self.num_heads, self.head_dim
        q = self.q_proj(query).view(B, L, H, Dh).transpose(1, 2)
        k = self.k_proj(key).view(B, S, H, Dh).transpose(1, 2)
        v = self.v_proj(value).view(B, S, H, Dh).transpose(1, 2)
        cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
        mask = self._mask(attn_mask, key_padding_mask, B, L, S, is_causal, cdt, q.device)
        scale = 1.0 / math.sqrt(Dh)
        weights = None
        if need_weights or L > S:
            z = dense_logits(q, k, scale=scale, attn_mask=mask, is_causal=False)
            p = get_mapping(self.mapping, alpha=self.alpha, topk=self.topk)(z)
            out = torch.matmul(p, v.to(p.dtype)).to(q.dtype)
            if need_weights:
                weights = (p.mean(1) if average_attn_weights else p).to(q.dtype)
        else:
            out = attention(
                q,
                k,
                v,
                mapping=self.mapping,
                alpha=self.alpha,
                is_causal=False,
                scale=scale,
                attn_mask=mask,
                topk=self.topk,
            )
        out = self.out_proj(out.transpose(1, 2).reshape(B, L, self.embed_dim))
        if unbatched:
            out = out.squeeze(0)
            weights = None if weights is None else weights.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return out, weights
