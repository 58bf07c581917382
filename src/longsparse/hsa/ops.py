"""Functional pieces of HSA: sliding-window attention (through ``longsparse.attention``), the chunk visibility
rule and chunk selection / weighting (top-k + stick-breaking or softmax, or α-entmax with an optional cap)."""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from longsparse.attention import attention
from longsparse.mappings import entmax


def sliding_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    scale: float,
    *,
    q_scale: Optional[Tensor] = None,
    alibi_slopes: Optional[Tensor] = None,
    mapping: str = "softmax",
    **attention_kwargs,
) -> Tensor:
    """Causal attention where query i sees keys i−window+1 … i (``window`` keys, itself included) of the same
    contiguous span, through ``longsparse.attention`` with any mapping. q, k, v: (B, H, N, D) → (B, H, N, D);
    q_scale (B, H, N); alibi_slopes (H,) (bias −m·(i − j)); ``attention_kwargs`` go to ``longsparse.attention``
    (alpha, topk, adatemp_order, chunk_size, backend). Memory O(N·window): beyond 2·window tokens the queries
    are processed in blocks of ``window`` against the previous and their own key block, the blocks folded into
    the batch (bottom-right alignment puts query i of a block at key index window + i, so the ALiBi distance
    and the causal bound are those of the sequence; the band's lower bound is a mask)."""
    B, H, N, D = q.shape
    W = window
    attend = functools.partial(attention, scale=scale, alibi_slopes=alibi_slopes, mapping=mapping, **attention_kwargs)
    if N <= 2 * W:
        i = torch.arange(N, device=q.device)
        band = None if N <= W else (i[:, None] - i[None, :]) < W
        return attend(q, k, v, is_causal=True, q_scale=q_scale, attn_mask=band)
    nb = -(-N // W)
    pad = nb * W - N
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        if q_scale is not None:
            q_scale = F.pad(q_scale, (0, pad), value=1.0)
    kp = F.pad(k, (0, 0, W, 0)).unfold(2, 2 * W, W).transpose(-1, -2)  # (B, H, nb, 2W, D)
    vp = F.pad(v, (0, 0, W, 0)).unfold(2, 2 * W, W).transpose(-1, -2)

    def fold(t: Tensor) -> Tensor:  # (B, H, nb, ...) → (B·nb, H, ...)
        return t.transpose(1, 2).reshape(B * nb, H, *t.shape[3:])

    i = torch.arange(W, device=q.device)[:, None]
    j = torch.arange(2 * W, device=q.device)[None, :]
    band = j > i  # key pos − query pos > −W; ≤ 0 is the causal mask
    first = band & (j >= W)  # block 0: the padding before position 0
    mask = torch.stack([first] + [band] * (nb - 1))  # (nb, W, 2W)
    mask = mask.expand(B, nb, W, 2 * W).reshape(B * nb, 1, W, 2 * W)
    qs = None if q_scale is None else fold(q_scale.view(B, H, nb, W))
    out = attend(fold(q.view(B, H, nb, W, D)), fold(kp), fold(vp), is_causal=True, q_scale=qs, attn_mask=mask)
    return out.view(B, nb, H, W, D).transpose(1, 2).reshape(B, H, nb * W, D)[:, :, :N]


def visible_chunks(positions: Tensor, n_chunks: int, chunk_size: int) -> Tensor:
    """(N, C) bool: chunk c (positions [cS, (c+1)S)) is visible to the token at position t iff
    (c+1)·S <= t — complete and strictly in the past. ``positions``: (N,) absolute positions."""
    c = torch.arange(n_chunks, device=positions.device)
    return (c[None, :] + 1) * chunk_size <= positions[:, None]


def n_visible(positions: Tensor, chunk_size: int) -> Tensor:
    """Number of visible chunks per position: floor(t / S)."""
    return torch.div(positions, chunk_size, rounding_mode="floor")


def length_scale(positions: Tensor, chunk_size: int, gamma) -> Tensor:
    """ASEntmax-style query multiplier log(n_visible + 1)^γ (n_visible clamped to >= 1: with nothing
    visible the value is irrelevant, and the clamp keeps the γ-gradient finite)."""
    n = n_visible(positions, chunk_size).clamp_min(1).to(torch.float32)
    return torch.log(n + 1) ** gamma


def sample_gumbel(shape, device, generator: Optional[torch.Generator] = None) -> Tensor:
    u = torch.rand(shape, device=device, generator=generator).clamp(1e-9, 1 - 1e-9)
    return -torch.log(-torch.log(u))


def chunk_weights(
    scores: Tensor,
    visible: Tensor,
    *,
    weights: str,
    topk: int = 2,
    alpha: float = 1.5,
    cap: Optional[int] = None,
    noise: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Dense chunk weights from retrieval scores.

    scores (..., C) real retrieval scores; visible (..., C) bool (broadcastable). noise: added to the
    scores for the *discrete* choice only (top-k / entmax cap); the weights use the clean scores.
    Returns (weights (..., C), selected (..., C) bool). Invisible chunks always get weight 0 and are never
    selected.

    * stickbreaking: top-k by score; β_c = σ(s_c); ordered by recency (the most recent selected chunk
      breaks the stick first): w_c = β_c · Π_{selected c' > c} (1 − β_c'). Σw <= 1; the rest is no-one's.
    * softmax: top-k by score; softmax over the selected scores (Σw = 1 when anything is visible).
    * entmax: α-entmax over all visible scores (or, with ``cap``, over the ``cap`` best visible ones —
      identical whenever the uncapped support is no larger than ``cap``); selected = weight > 0.
    """
    visible = visible.expand_as(scores)
    neg = torch.tensor(float("-inf"), dtype=scores.dtype, device=scores.device)
    masked = torch.where(visible, scores, neg)
    choose = masked if noise is None else torch.where(visible, scores + noise, neg)
    C = scores.shape[-1]
    if C == 0:
        return scores.clone(), visible.clone()

    def top(k):
        k = min(k, C)
        idx = choose.topk(k, dim=-1).indices
        sel = torch.zeros_like(visible).scatter(-1, idx, True)
        return sel & visible

    if weights == "entmax":
        if cap is not None:
            sel = top(cap)
            masked = torch.where(sel, scores, neg)
        w = entmax(masked, alpha=alpha, dim=-1)
        return w, (w > 0) & visible
    sel = top(topk)
    if weights == "softmax":
        z = torch.where(sel, scores, neg)
        m = z.amax(-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(z - m)
        s = e.sum(-1, keepdim=True)
        return e / torch.where(s > 0, s, torch.ones_like(s)), sel
    if weights == "stickbreaking":
        zeros = torch.zeros_like(scores)
        log_beta = torch.where(sel, F.logsigmoid(scores), zeros)
        log_1mb = torch.where(sel, F.logsigmoid(-scores), zeros)
        # Σ_{c' > c} log(1 − β_c'): reverse exclusive cumulative sum
        after = log_1mb.flip(-1).cumsum(-1).flip(-1) - log_1mb
        w = torch.where(sel, torch.exp(log_beta + after), zeros)
        return w, sel
    raise ValueError(f"unknown weights {weights!r}")


class ChunkMemory:
    """Landmarks (B, C, d) of the chunks 0..C−1 and, when held, their token states (B, C, S, d)."""

    def __init__(self, landmarks: Tensor, tokens: Optional[Tensor]):
        self.landmarks = landmarks
        self.tokens = tokens

    @property
    def n_chunks(self) -> int:
        return self.landmarks.shape[1]

    def chunk_tokens(self, chunk_ids: Tensor) -> Tensor:
        """Token states (B, U, S, d) of the chunks ``chunk_ids`` (U,)."""
        return self.tokens[:, chunk_ids]

    def chunk_table(self, idx: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """For chunk ids idx (B, N, K): the token states (B, U, S, d) of the U distinct ids, those ids (U,)
        (sorted), and slot (B, N, K), the index of idx[b, n, k] among them."""
        ids = torch.unique(idx)
        return self.chunk_tokens(ids), ids, torch.searchsorted(ids, idx)
