"""The one place where attention logits are built (the fused CPU kernel repeats its arithmetic in C++ and
is tested equal to it):

    z_ij = (q_i · s_i) · k_j · scale − m_h · |pos_i − j| + mask_ij,   −inf where j > pos_i (causal),

with s the per-query q-scale (SSMax / ASEntmax; it scales q·k, never the bias), m the ALiBi slopes and
pos_i = Nk − Nq + i the absolute position of query row i: the queries sit at the last Nq key positions
(bottom-right alignment), so a short q against a long KV cache is decoding. A bool mask is True where a
query may attend; a float mask is added.

ALiBi is symmetric, −m·|pos_i − j| (flash-attn's non-causal form): a causal row only sees keys j ≤ pos_i,
where it is Press et al.'s −m·(pos_i − j); a non-causal row is penalised by distance in both directions
(the signed form would give the farthest future key the largest logit).

`add_bias_and_masks` is the bias/mask step on any block of rows; `block_logits` and `dense_logits` build
logits from q and k with it, `additive_bias` builds the bias alone (for SDPA's attn_mask).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Logits are built and mapped in float32 (float64 for float64 inputs)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_mask_dtype(attn_mask: Optional[Tensor]) -> None:
    """SDPA's contract: a bool mask (True = attend) or a float one (added); an integer mask would be
    read as a bias of 0/1, silently not masking."""
    if attn_mask is not None and attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise ValueError(
            f"attn_mask must be bool (True = attend) or floating point (added to the logits); "
            f"got dtype {attn_mask.dtype}"
        )


def add_bias_and_masks(
    z: Tensor,
    first_pos: int,
    *,
    alibi_slopes: Optional[Tensor] = None,
    attn_mask: Optional[Tensor] = None,
    is_causal: bool = True,
) -> Tensor:
    """Adds ALiBi and the masks to logits z (B, h, n, kend) of query rows at absolute positions first_pos …
    first_pos + n − 1 against keys 0 … kend − 1, in place (autograd-safe: no op here saves z).

    alibi_slopes: (h,) slopes of these heads. attn_mask: bool or float, broadcastable to z (already cut to
    these heads, rows and keys). z must already have the broadcast shape of everything added to it."""
    n, kend = z.shape[-2], z.shape[-1]
    q_pos = torch.arange(first_pos, first_pos + n, dtype=z.dtype, device=z.device).unsqueeze(-1)
    if alibi_slopes is not None:
        # positions are integers below 2^24: exact in float32. |·|: symmetric ALiBi (see the module docstring);
        # equal to the signed distance on every key a causal row sees
        dist = (q_pos - torch.arange(kend, dtype=z.dtype, device=z.device)).abs_()
        z = z.sub_(alibi_slopes.to(z.dtype).view(-1, 1, 1) * dist)
    if attn_mask is not None:
        z = (
            z.masked_fill_(~attn_mask, float("-inf"))
            if attn_mask.dtype == torch.bool
            else z.add_(attn_mask.to(z.dtype))
        )
    if is_causal and kend > first_pos + 1:
        # only keys after the first row's position can be in the future of some row
        future = torch.arange(first_pos + 1, kend, device=z.device).unsqueeze(0) > q_pos.long()
        z[..., first_pos + 1 :].masked_fill_(future, float("-inf"))
    return z


def block_logits(
    qs: Tensor,
    k: Tensor,
    *,
    scale: float,
    first_pos: int,
    alibi_slopes: Optional[Tensor] = None,
    attn_mask: Optional[Tensor] = None,
    is_causal: bool = True,
) -> Tensor:
    """Logits (B, h, n, kend) of query rows qs (B, h, n, D) (q-scale already applied, in the compute dtype)
    against keys k (B, h, kend, D); see `add_bias_and_masks` for the rest."""
    z = torch.matmul(qs, k.transpose(-1, -2)).mul_(scale)
    return add_bias_and_masks(z, first_pos, alibi_slopes=alibi_slopes, attn_mask=attn_mask, is_causal=is_causal)


def dense_logits(
    q: Tensor,
    k: Tensor,
    *,
    scale: float,
    q_scale: Optional[Tensor] = None,
    alibi_slopes: Optional[Tensor] = None,
    attn_mask: Optional[Tensor] = None,
    is_causal: bool = True,
) -> Tensor:
    """All logits (B, H, Nq, Nk) in the compute dtype, −inf where masked, differentiable in every tensor
    argument. q (B, H, Nq, D); k (B, H, Nk, D) with H heads (GQA already repeated); q_scale (B, H, Nq);
    alibi_slopes (H,); attn_mask broadcastable to (B, H, Nq, Nk)."""
    check_mask_dtype(attn_mask)
    Nq, Nk = q.shape[2], k.shape[2]
    cdt = compute_dtype(q.dtype)
    if q_scale is not None:
        q = q * q_scale.unsqueeze(-1).to(q.dtype)
    z = torch.matmul(q.to(cdt), k.to(cdt).transpose(-1, -2)) * scale
    if attn_mask is not None and torch.broadcast_shapes(attn_mask.shape, z.shape) != z.shape:
        z = z.expand(torch.broadcast_shapes(attn_mask.shape, z.shape)).clone()
    return add_bias_and_masks(z, Nk - Nq, alibi_slopes=alibi_slopes, attn_mask=attn_mask, is_causal=is_causal)


def bias_shape(
    B: int, H: int, Nq: int, Nk: int, *, alibi_slopes: Optional[Tensor], attn_mask: Optional[Tensor]
) -> Tuple[int, ...]:
    """The smallest shape broadcastable to (B, H, Nq, Nk) that holds the bias of these arguments."""
    shape = (1, H if alibi_slopes is not None else 1, Nq, Nk)
    if attn_mask is not None:
        shape = torch.broadcast_shapes(shape, attn_mask.shape)
    return tuple(shape)


def additive_bias(
    B: int,
    H: int,
    Nq: int,
    Nk: int,
    *,
    dtype: torch.dtype,
    device: torch.device,
    alibi_slopes: Optional[Tensor] = None,
    attn_mask: Optional[Tensor] = None,
    is_causal: bool = True,
    first_pos: Optional[int] = None,
) -> Optional[Tensor]:
    """ALiBi, attn_mask and the causal mask as one additive bias of shape `bias_shape` (broadcastable to
    (B, H, Nq, Nk)) in ``dtype``, −inf where masked; None when there is nothing to add. Built in the
    compute dtype, without gradient. first_pos: the first query row's absolute position (default Nk − Nq,
    the queries at the last positions; a block of query rows passes its own)."""
    if alibi_slopes is None and attn_mask is None and not is_causal:
        return None
    shape = bias_shape(B, H, Nq, Nk, alibi_slopes=alibi_slopes, attn_mask=attn_mask)
    with torch.no_grad():
        z = torch.zeros(shape, dtype=compute_dtype(dtype), device=device)
        z = add_bias_and_masks(
            z,
            Nk - Nq if first_pos is None else first_pos,
            alibi_slopes=None if alibi_slopes is None else alibi_slopes.detach(),
            attn_mask=None if attn_mask is None else attn_mask.detach(),
            is_causal=is_causal,
        )
    return z.to(dtype)
