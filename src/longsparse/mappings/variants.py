"""Softmax variants that transform the logits of a row before a softmax (docs/method.md §2): top-k and the adaptive
temperature of Veličković et al. (2024). Both choose something per row without a gradient (the kept set,
the temperature θ) and are softmax on what remains, so ∂L/∂z is the softmax Jacobian (× θ)."""

from __future__ import annotations

import torch
from torch import Tensor

from longsparse.mappings.entmax import entmax

# Polynomial P(H) of the adaptive temperature, highest power first.
ADATEMP_POLY = {
    "original": (-0.037, 0.481, -2.3, 4.917, -1.791),
    "reversed": (-1.791, 4.917, -2.3, 0.481, -0.037),  # the coefficient order of the official [A] code
}


def adaptive_temperature(z: Tensor, order: str = "original") -> Tensor:
    """θ (…, 1) per row of logits z (…, n): max(1, P(H)) where the entropy H of softmax(z) exceeds 0.5,
    else 1. θ is a constant for the gradient (computed without autograd); −inf entries are masked."""
    if order not in ADATEMP_POLY:
        raise ValueError(f"adatemp_order must be one of {sorted(ADATEMP_POLY)}, got {order!r}")
    with torch.no_grad():
        p = entmax(z.detach(), 1.0)
        h = -torch.special.xlogy(p, p).sum(-1, keepdim=True)  # 0·log 0 = 0 (masked keys, masked rows)
        return temperature_of_entropy(h, order)


def temperature_of_entropy(h: Tensor, order: str = "original") -> Tensor:
    """θ = max(1, P(h)) where the entropy h > 0.5, else 1, elementwise (same shape as h): the adaptive
    temperature of rows whose softmax has entropy h (a backend that gets h without the logits uses this)."""
    poly = torch.zeros_like(h)
    for c in ADATEMP_POLY[order]:
        poly = poly * h + c
    return torch.where(h > 0.5, poly.clamp_min(1.0), torch.ones_like(h))


def adaptive_temperature_softmax(z: Tensor, order: str = "original") -> Tensor:
    """softmax(θ·z) along the last axis with the adaptive temperature θ of `adaptive_temperature`."""
    return entmax(z * adaptive_temperature(z, order), 1.0)


def topk_dropped(z: Tensor, k: int) -> Tensor:
    """Bool (…, n): the entries of each row of z (…, n) below its k-th largest value. Ties with the k-th
    largest stay in, so a row may keep more than k entries. No gradient."""
    with torch.no_grad():
        thresh = z.topk(min(k, z.shape[-1]), dim=-1).values[..., -1:]
        return z < thresh


def topk_softmax(z: Tensor, k: int) -> Tensor:
    """softmax over the k largest entries of each row of z (…, n) (ties with the k-th kept); others 0."""
    return entmax(z.masked_fill(topk_dropped(z, k), float("-inf")), 1.0)
