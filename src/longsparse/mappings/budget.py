"""Budget sparsemax (k-subsets): the Euclidean projection onto the capped simplex

    budget_B(x) = argmin_p ‖p − x‖²   s.t.   0 ≤ p ≤ 1,  Σ p = B,

so p_j = clip(x_j − τ, 0, 1) with τ the root of S(τ) = Σ clip(x − τ, 0, 1) = B. S is piecewise linear and
nonincreasing with slope −|A(τ)| (A: the entries strictly between 0 and 1), so a bracketed Newton step
τ ← τ + (S(τ) − B)/|A| lands on the root once τ is in the root's linear piece (bisection where |A| = 0 or a
step leaves the bracket); τ is then recomputed in closed form on the found pieces, τ = (Σ_A x + |{x − τ ≥ 1}| −
B)/|A|, twice, so the result is exact up to the rounding of that sum. B = 0 gives zeros, B = the number of
unmasked entries gives ones on them; −inf entries are masked (always 0).

Backward (Jacobian of the projection): ∂L/∂x_j = g_j − (Σ_A g)/|A| on A, 0 elsewhere; ∂L/∂B = (Σ_A g)/|A|.
"""

from __future__ import annotations

import numbers
from typing import Union

import torch
from torch import Tensor

from longsparse.mappings.entmax import _MAX_ITER, _check_input

BudgetLike = Union[float, int, Tensor]


def _pieces(x: Tensor, tau: Tensor, dim: int):
    """(|A|, Σ_A x, number of entries at 1) at the threshold tau."""
    d = x - tau
    active = (d > 0) & (d < 1)
    size = active.sum(dim, keepdim=True).to(x.dtype)
    total = torch.where(active, x, x.new_zeros(())).sum(dim, keepdim=True)
    ones = (d >= 1).sum(dim, keepdim=True).to(x.dtype)
    return size, total, ones


def _budget_forward(x: Tensor, budget: Tensor, dim: int) -> Tensor:
    """The projection of x (compute dtype) along dim; budget broadcast over the rows (dim axis of size 1)."""
    finite = torch.isfinite(x)
    xf = torch.where(finite, x, x.new_zeros(()))
    big = torch.finfo(x.dtype).max
    hi = torch.where(finite, xf, x.new_full((), -big)).amax(dim, keepdim=True)  # S(hi) = 0 ≤ B
    lo = torch.where(finite, xf, x.new_full((), big)).amin(dim, keepdim=True) - 1  # S(lo) = #finite ≥ B
    n_finite = finite.sum(dim, keepdim=True).to(x.dtype)
    tau = hi - budget / n_finite.clamp_min(1)  # the package's start; S(τ) ≤ B there
    tol = 4 * torch.finfo(x.dtype).eps
    width = hi - lo
    for _ in range(4 * _MAX_ITER):
        d = (x - tau).clamp(0, 1)
        s = d.sum(dim, keepdim=True) - budget
        size = ((x - tau > 0) & (x - tau < 1)).sum(dim, keepdim=True).to(x.dtype)
        lo = torch.where(s > 0, tau, lo)
        hi = torch.where(s < 0, tau, hi)
        step = tau + s / size.clamp_min(1)
        # Newton can cycle between two linear pieces: a step outside the open bracket, or one after a step that
        # did not halve the bracket, is a bisection, so the bracket closes and the pieces are found
        mid = (lo + hi) / 2
        newton = (size > 0) & (step > lo) & (step < hi) & (hi - lo <= 0.5 * width)
        new_tau = torch.where(newton, step, mid)
        width = torch.where(hi - lo <= 0.5 * width, hi - lo, width)
        new_tau = torch.where(s == 0, tau, new_tau)
        done = (s == 0) | (hi - lo <= tol * (1 + hi.abs()))
        tau = new_tau
        if bool(done.all()):
            break
    for _ in range(2):  # exact on the pieces found
        size, total, ones = _pieces(x, tau, dim)
        tau = torch.where(size > 0, (total + ones - budget) / size.clamp_min(1), tau)
    p = (x - tau).clamp(0, 1)
    p = torch.where(budget == 0, p.new_zeros(()), p)
    p = torch.where(budget == n_finite, finite.to(p.dtype), p)
    return torch.where(finite, p, p.new_zeros(()))


class BudgetFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, budget: Tensor, dim: int) -> Tensor:
        cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
        p = _budget_forward(x.to(cdt), budget.to(cdt), dim)
        ctx.dim, ctx.in_dtype, ctx.budget_dtype, ctx.budget_shape = dim, x.dtype, budget.dtype, budget.shape
        ctx.save_for_backward(p)
        return p.to(x.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (p,) = ctx.saved_tensors
        g = grad.to(p.dtype)
        active = (p > 0) & (p < 1)
        size = active.sum(ctx.dim, keepdim=True).to(p.dtype)
        mean = torch.where(active, g, g.new_zeros(())).sum(ctx.dim, keepdim=True) / size.clamp_min(1)
        dx = torch.where(active, g - mean, g.new_zeros(()))
        db = mean.sum_to_size(ctx.budget_shape) if ctx.needs_input_grad[1] else None
        return dx.to(ctx.in_dtype), None if db is None else db.to(ctx.budget_dtype), None


def budget_sparsemax(x: Tensor, budget: BudgetLike = 2, dim: int = -1) -> Tensor:
    """The projection of ``x`` onto {0 ≤ p ≤ 1, Σ p = budget} along ``dim``; same shape as ``x``. ``budget``: a
    number, or a tensor broadcastable over the rows (the ``dim`` axis of size 1), between 0 and the number of
    unmasked (not −inf) entries of each row. Differentiable in ``x`` and in a tensor ``budget``."""
    dim = _check_input(x, dim)
    if isinstance(budget, Tensor):
        row_shape = list(x.shape)
        row_shape[dim] = 1
        try:
            ok = budget.dim() <= x.dim() and torch.broadcast_shapes(budget.shape, row_shape) == torch.Size(row_shape)
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"budget of shape {tuple(budget.shape)} does not broadcast over the rows of x {tuple(x.shape)} "
                f"(dim={dim}); use a number or a shape broadcastable to {tuple(row_shape)}"
            )
        b = budget if budget.is_floating_point() else budget.to(torch.get_default_dtype())
    elif isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise TypeError(f"budget must be a number or a tensor; got {type(budget).__name__}")
    else:
        b = torch.tensor(float(budget), dtype=x.dtype if x.is_floating_point() else None, device=x.device)
    if x.numel() == 0:
        return x.clone()
    if torch.isnan(x).any() or torch.isposinf(x).any():
        raise ValueError("budget_sparsemax input contains NaN or +inf (use -inf to mask entries)")
    n_finite = torch.isfinite(x).sum(dim, keepdim=True)
    bad = ~torch.isfinite(b) | (b < 0) | (b > n_finite)
    if bool(bad.any()):
        raise ValueError(
            f"budget must lie between 0 and the number of unmasked entries of each row ({x.shape[dim]} per row "
            f"here, fewer where -inf masks some); got {torch.broadcast_to(b.detach(), bad.shape)[bad][:3].tolist()}"
        )
    return BudgetFunction.apply(x, b, dim)
