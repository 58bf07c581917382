"""Positions: NoPE, RoPE, ALiBi and NAPE.

* RoPE uses the rotate-half layout: a head vector x = [x₁, x₂] (halves of size d/2) becomes
  [x₁ cos − x₂ sin, x₂ cos + x₁ sin] with angle pos·θ^{−2j/d} for pair j — the same as multiplying
  the complex number x₁ⱼ + i·x₂ⱼ by e^{i·pos·θ^{−2j/d}}. It is applied with *absolute* positions, so
  keys are rotated once when they enter the KV cache and cached decoding equals the full forward.
* ALiBi adds −m_h·(i − j) to the logits (the slopes are passed to ``longsparse.attention``). The
  standard slopes are m_h = 2^{−8h/H}, h = 1…H (Press et al., 2022).
* NAPE (docs/method.md §3): the first H/2 heads ALiBi with m_h = 1/h (h = 1…H/2; variant "geometric":
  2^{−(h−1)}), the other H/2 heads NoPE.

``position_setup`` returns the per-head slopes (zeros for NoPE heads, or None when no head uses
ALiBi) and which heads a length scaler (SSMax / ASEntmax) may scale: under NAPE only the NoPE heads,
under NoPE / RoPE / ALiBi all heads.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

POSITIONS = ("nope", "rope", "alibi", "nape")
NAPE_SLOPES = ("harmonic", "geometric")


def alibi_slopes(n_heads: int) -> Tensor:
    """Standard ALiBi slopes 2^{−8h/H}, h = 1…H (for H not a power of two, the interleaving rule of
    Press et al.: the slopes of the next-lower power of two, then every other slope of the next one)."""
    if n_heads < 1:
        raise ValueError(f"n_heads must be >= 1, got {n_heads}")

    def pow2(n):
        start = 2 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        s = pow2(n_heads)
    else:
        p = 2 ** math.floor(math.log2(n_heads))
        s = pow2(p) + pow2(2 * p)[0::2][: n_heads - p]
    return torch.tensor(s, dtype=torch.float32)


def nape_slopes(n_heads: int, variant: str = "harmonic") -> Tensor:
    """Per-head slopes under NAPE: the first H/2 heads 1/h (or 2^{−(h−1)}), the rest 0 (NoPE)."""
    if n_heads < 2 or n_heads % 2:
        raise ValueError(f"NAPE needs an even number of heads (>= 2), got {n_heads}")
    if variant not in NAPE_SLOPES:
        raise ValueError(f"unknown NAPE slope variant {variant!r}; choose one of {', '.join(NAPE_SLOPES)}")
    half = n_heads // 2
    h = torch.arange(1, half + 1, dtype=torch.float32)
    first = 1.0 / h if variant == "harmonic" else 2.0 ** (-(h - 1))
    return torch.cat([first, torch.zeros(half)])


def position_setup(positions: str, n_heads: int, nape_variant: str = "harmonic") -> Tuple[Optional[Tensor], Tensor]:
    """(alibi_slopes (H,) float with zeros for NoPE heads — None when no head uses ALiBi,
    scalable (H,) bool: the heads a length scaler multiplies)."""
    if positions not in POSITIONS:
        raise ValueError(f"unknown positions {positions!r}; choose one of {', '.join(POSITIONS)}")
    if positions in ("nope", "rope"):
        return None, torch.ones(n_heads, dtype=torch.bool)
    if positions == "alibi":
        return alibi_slopes(n_heads), torch.ones(n_heads, dtype=torch.bool)
    slopes = nape_slopes(n_heads, nape_variant)
    return slopes, slopes == 0


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RoPE(nn.Module):
    """Rotary position embedding (rotate-half) applied with absolute positions.

    ``forward(x, positions)``: x (B, H, N, D), positions (B, N) or (N,) integer → rotated x."""

    def __init__(self, head_dim: int, theta: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        if theta <= 0:
            raise ValueError(f"rope theta must be > 0, got {theta}")
        self.head_dim = head_dim
        self.theta = float(theta)
        inv = 1.0 / (self.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        if positions.dim() == 1:
            positions = positions.unsqueeze(0)
        # angles in float64: positions up to 10^5+ keep their precision
        ang = positions.to(torch.float64).unsqueeze(-1) * self.inv_freq.to(torch.float64)  # (B, N, D/2)
        ang = torch.cat((ang, ang), dim=-1).unsqueeze(1)  # (B, 1, N, D)
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        return x * cos + rotate_half(x) * sin

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta}"
