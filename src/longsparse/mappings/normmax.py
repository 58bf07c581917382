"""α-normmax (Santos et al., 2024): the ℓ_α-norm-regularised sparse map

    normmax_α(x) = argmax_{p ∈ simplex} ⟨x, p⟩ − ‖p‖_α,   α > 1,

solved through α-entmax. Its optimality condition is p ∝ q with q_j = [x_j − τ]₊^{1/(α−1)} and Σ q^α = 1, that
is Σ [x − τ]₊^{α/(α−1)} = 1: the threshold equation of α′-entmax with α′ = 2 − 1/α ∈ (1, 2) on the scores
z = x·α/(α−1) (then (α′−1)·z = x), whose solution is q^α. So

    normmax_α(x) = e^{1/α} / Σ e^{1/α},   e = α′-entmax(x·α/(α−1)),

with α-entmax's solver: exact for α = 2 (α′ = 1.5, closed form on the support), fp32 round-off otherwise, the
fused CPU kernel where it runs; in float32 (float64 for float64 input), the result cast back. The backward is
the implicit-function Jacobian product (as in the ``entmax`` package), from the output p alone: with a = p and
b = p^{2−α} on the support and g = ∂L/∂p,

    ∂L/∂x = ‖p‖_α^{α−1} / (α−1) · (b⊙g − a·Σ b g − (b − a·Σ b)·Σ a g).
"""

from __future__ import annotations

import numbers
from typing import Union

import torch
from torch import Tensor

from longsparse.mappings.entmax import AlphaLike, _alpha_view, _check_input, entmax


def _check_normmax_alpha(alpha: AlphaLike) -> None:
    """α > 1 and finite (α ≤ 1 has no unique maximiser: ‖p‖_α is then constant or concave on the simplex)."""
    if isinstance(alpha, Tensor):
        a = alpha.detach()
        if not bool(torch.isfinite(a).all()) or bool((a <= 1).any()):
            raise ValueError(f"normmax alpha must be finite and > 1; got min {a.min().item():.4g}")
    elif isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 1 < float(alpha) < float("inf"):
        raise ValueError(f"normmax alpha must be a finite number > 1; got {alpha!r}")


def _normmax_forward(x: Tensor, alpha: Union[float, Tensor], dim: int) -> Tensor:
    """normmax of x (no autograd) along dim; α a float or a tensor broadcast over the rows."""
    e = entmax(x * (alpha / (alpha - 1)), 2 - 1 / alpha, dim)
    q = torch.where(e > 0, e.clamp_min(torch.finfo(e.dtype).tiny).pow(1 / alpha), e.new_zeros(()))
    return q / q.sum(dim, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)


def _normmax_backward(p: Tensor, g: Tensor, alpha: Union[float, Tensor], dim: int) -> Tensor:
    """∂L/∂x from the output p and g = ∂L/∂p: with a = p and b = p^{2−α} on the support,
    (‖p‖_α^{α−1} / (α−1)) · (b⊙g − a·Σ b g − (b − a·Σ b)·Σ a g)."""
    on = p > 0
    a = torch.where(on, p, p.new_zeros(()))
    b = torch.where(on, p.clamp_min(torch.finfo(p.dtype).tiny).pow(2 - alpha), p.new_zeros(()))
    dx = b * g
    dx = dx - a * dx.sum(dim, keepdim=True)
    dx = dx - (b - b.sum(dim, keepdim=True) * a) * (a * g).sum(dim, keepdim=True)
    norm_pow = a.pow(alpha).sum(dim, keepdim=True).pow((alpha - 1) / alpha)
    return dx * norm_pow / (alpha - 1)


class NormmaxFunction(torch.autograd.Function):
    """α-normmax with α a float or a tensor broadcast over the rows (no gradient of α)."""

    @staticmethod
    def forward(ctx, x: Tensor, alpha: Union[float, Tensor], dim: int) -> Tensor:
        cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
        a = alpha.to(cdt) if isinstance(alpha, Tensor) else alpha
        with torch.no_grad():
            p = _normmax_forward(x.to(cdt), a, dim)
        ctx.dim, ctx.alpha, ctx.in_dtype = dim, a, x.dtype
        ctx.save_for_backward(p)
        return p.to(x.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (p,) = ctx.saved_tensors
        return _normmax_backward(p, grad.to(p.dtype), ctx.alpha, ctx.dim).to(ctx.in_dtype), None, None


def normmax(x: Tensor, alpha: AlphaLike = 2.0, dim: int = -1) -> Tensor:
    """α-normmax of ``x`` along ``dim`` (α > 1: a number, or a tensor broadcastable over the rows with the ``dim``
    axis of size 1); same shape as ``x``, rows on the simplex, sparse. Differentiable in ``x``; −inf entries are
    masked and an all −inf row gives zeros."""
    dim = _check_input(x, dim)
    _check_normmax_alpha(alpha)
    if x.numel() == 0:
        return x.clone()
    if isinstance(alpha, Tensor):
        alpha = _alpha_view(alpha.detach(), x, dim)
    else:
        alpha = float(alpha)
    return NormmaxFunction.apply(x, alpha, dim)
