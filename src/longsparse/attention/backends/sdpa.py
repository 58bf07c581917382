"""The `sdpa` backend: torch scaled_dot_product_attention for the softmax-form mappings: softmax; top-k and
adaptive temperature after a no-grad pass over the logits (the kept set / θ enter SDPA's mask and q). Softmax
without gradient whose bias would exceed `SDPA_MAX_ELEMENTS` runs in blocks of query rows."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from longsparse.attention.backends.registry import Backend
from longsparse.attention.call import AttentionCall
from longsparse.attention.capabilities import SOFTMAX_FORMS, Capabilities
from longsparse.attention.logits import additive_bias, bias_shape, dense_logits

# The bias size limit is no capability: sdpa takes any size (in query blocks), auto weighs it (policy.py).
CAPABILITIES = Capabilities(mappings=SOFTMAX_FORMS)


def run(call: AttentionCall) -> Tensor:
    """torch SDPA (fused kernels on CPU and CUDA; a fully masked row gives 0). SDPA's own causal flag aligns
    queries top-left, so decoding (Nq < Nk) and ALiBi need an explicit bias; so does a scale ≤ 0, since the
    flag's −inf is multiplied by the scale (0 · −inf = NaN). Top-k and adaptive temperature: one pass over the
    logits without autograd picks the kept set / θ (no gradient through either), which then enter as −inf in
    the bias / as a factor of q and the bias: one differentiated attention. Softmax without gradient whose
    bias would exceed auto's SDPA limit runs in query blocks (`_query_blocks`), each bias within it."""
    q = call.q
    k, v = call.kv_heads_repeated()
    B, H, Nq, Nk, _ = call.shape
    if call.q_scale is not None:
        q = q * call.q_scale.unsqueeze(-1).to(q.dtype)
    m = call.mapping
    simple = call.alibi_slopes is None and call.attn_mask is None
    if not m.adjusts_logits and simple and (not call.is_causal or (Nq == Nk and call.scale > 0)):
        return F.scaled_dot_product_attention(q, k, v, is_causal=call.is_causal, scale=call.scale)
    if not m.adjusts_logits and not call.wants_grad:
        rows = _rows_per_block(call)
        if rows < Nq:
            return _query_blocks(call, q, k, v, rows)
    theta = None
    with torch.no_grad():
        bias = additive_bias(
            B,
            H,
            Nq,
            Nk,
            dtype=q.dtype,
            device=q.device,
            alibi_slopes=call.alibi_slopes,
            attn_mask=call.attn_mask,
            is_causal=call.is_causal,
        )
        if m.adjusts_logits:
            z = dense_logits(
                q,
                k,
                scale=call.scale,
                alibi_slopes=call.alibi_slopes,
                attn_mask=call.attn_mask,
                is_causal=call.is_causal,
            )
            theta, dropped = m.softmax_adjustment(z)
            if theta is not None:
                theta = theta.to(q.dtype)
                bias = None if bias is None else theta * bias  # θ ≥ 1 keeps −inf at −inf
            if dropped is not None:
                drop = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(dropped, float("-inf"))
                bias = drop if bias is None else bias + drop
        bias = None if bias is None else bias.expand(B, H, Nq, Nk)
    if theta is not None:
        q = q * theta
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=call.scale)


# Largest bias (softmax: per batch row, H·Nq·Nk with ALiBi, else Nq·Nk) or logits tensor (top-k, adaptive
# temperature: B·H·Nq·Nk) that the sdpa backend materialises at once, 64 MiB of fp32: auto's limit for sdpa, past
# which softmax without gradient runs in blocks of query rows.
SDPA_MAX_ELEMENTS = 1 << 24


def bias_row_elements(call: AttentionCall) -> int:
    """Elements of the bias sdpa builds per batch row and query row: heads × keys (the heads of the ALiBi
    slopes or of the mask, else 1). Auto's SDPA limit and the query blocks both count with it."""
    _, H, _, Nk, _ = call.shape
    shape = bias_shape(1, H, 1, Nk, alibi_slopes=call.alibi_slopes, attn_mask=call.attn_mask)
    return shape[1] * shape[3]


def _rows_per_block(call: AttentionCall) -> int:
    """Query rows whose bias stays within `SDPA_MAX_ELEMENTS`; at least 1."""
    return max(1, SDPA_MAX_ELEMENTS // bias_row_elements(call))


def _query_blocks(call: AttentionCall, q: Tensor, k: Tensor, v: Tensor, rows: int) -> Tensor:
    """Softmax without gradient as SDPA over blocks of `rows` query rows, each with its own bias (its rows'
    ALiBi distances and masks, against the keys it can see: under causal masking up to its last row's
    position), so no bias larger than a block's is ever built. Equal to one SDPA call with the whole bias.
    q (B, H, Nq, D) already scaled by q_scale; k, v (B, H, Nk, D) with the kv heads repeated."""
    B, H, Nq, Nk, _ = call.shape
    first = call.first_pos
    out = q.new_empty((B, H, Nq, v.shape[-1]))
    mask = call.attn_mask
    for s in range(0, Nq, rows):
        e = min(Nq, s + rows)
        kend = min(Nk, first + e) if call.is_causal else Nk
        block_mask = None if mask is None else mask[..., slice(s, e) if mask.shape[-2] != 1 else slice(None), :kend]
        bias = additive_bias(
            B,
            H,
            e - s,
            kend,
            dtype=q.dtype,
            device=q.device,
            alibi_slopes=call.alibi_slopes,
            attn_mask=block_mask,
            is_causal=call.is_causal,
            first_pos=first + s,
        )
        out[:, :, s:e] = F.scaled_dot_product_attention(
            q[:, :, s:e], k[:, :, :kend], v[:, :, :kend], attn_mask=bias.expand(B, H, e - s, kend), scale=call.scale
        )
    return out


BACKEND = Backend(
    "sdpa",
    "torch scaled_dot_product_attention for softmax, top-k and adaptive temperature",
    (CAPABILITIES,),
    run,
)
