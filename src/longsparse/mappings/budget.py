"""Budget sparsemax (k-subsets): the Euclidean projection onto the capped simplex

    budget_B(x) = argmin_p ‖p − x‖²   s.t.   0 ≤ p ≤ 1,  Σ p = B,

so p_j = clip(x_j − τ, 0, 1) with τ the root of S(τ) = Σ clip(x − τ, 0, 1) = B. S is piecewise linear and
nonincreasing with slope −|A(τ)| (A: the entries strictly between 0 and 1) and kinks at x_j and x_j − 1.
Regula falsi (Illinois) from a bracket at most 1 wide (`_budget_bracket`) reaches the linear piece that holds
the root, where τ = (Σ_A x + #{x − τ ≥ 1} − B)/|A| in closed form: exact up to the rounding of that sum, at
about the cost of the ``entmax`` package's 50 bisection steps or less. B = 0 gives zeros, B = the number of
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
    """(|A|, Σ_A x, number of entries at 1) at the threshold tau; A: the entries with 0 < x − τ < 1."""
    d = x - tau
    active = (d > 0) & (d < 1)
    size = active.sum(dim, keepdim=True).to(x.dtype)
    total = torch.where(active, x, x.new_zeros(())).sum(dim, keepdim=True)
    ones = (d >= 1).sum(dim, keepdim=True).to(x.dtype)
    return size, total, ones


def _budget_bracket(x: Tensor, budget: Tensor, n_finite: Tensor, dim: int):
    """[lo, hi] holding τ. For budgets up to a quarter of the row, at most 1 wide: with x_(k) the k-th largest
    entry, the ⌈B⌉ largest entries are ≥ 1 above lo = x_(⌈B⌉) − 1 (so S(lo) ≥ B), and at most ⌊B⌋ entries lie
    above hi = x_(⌊B⌋+1) (so S(hi) ≤ B); the partial sort costs more than it saves beyond that, where the bracket
    is [min − 1, max] (S = #unmasked, 0)."""
    top = int(budget.max().item()) + 1
    if top > max(1, x.shape[dim] // 4):
        big = torch.finfo(x.dtype).max
        finite = torch.isfinite(x)
        lo = torch.where(finite, x, x.new_full((), big)).amin(dim, keepdim=True) - 1
        return lo, torch.where(finite, x, x.new_full((), -big)).amax(dim, keepdim=True)
    largest = x.topk(top, dim).values
    last = (n_finite - 1).clamp_min(0).long()
    upper = torch.minimum(budget.ceil().long() - 1, last).clamp_min(0).expand_as(n_finite)
    lower = torch.minimum(budget.floor().long(), last).expand_as(n_finite)
    return largest.gather(dim, upper) - 1, largest.gather(dim, lower)


def _budget_forward(x: Tensor, budget: Tensor, dim: int) -> Tensor:
    """The projection of x (compute dtype) along dim; budget broadcast over the rows (dim axis of size 1)."""
    finite = torch.isfinite(x)
    n_finite = finite.sum(dim, keepdim=True)
    lo, hi = _budget_bracket(x, budget, n_finite, dim)
    buf = torch.empty_like(x)

    def f(tau: Tensor) -> Tensor:  # S(τ) − B, nonincreasing in τ
        return torch.sub(x, tau, out=buf).clamp_(0, 1).sum(dim, keepdim=True) - budget

    f_lo, f_hi = f(lo), f(hi)
    tol = 4 * torch.finfo(x.dtype).eps
    side = torch.zeros_like(hi)  # +1: the last step moved lo, −1: hi
    tau = hi
    for _ in range(4 * _MAX_ITER):
        # regula falsi: on the root's linear piece the secant is the root; the Illinois rule (halve the value kept
        # at an end that stays twice) keeps the bracket shrinking from both sides
        tau = torch.where(f_lo > f_hi, hi - f_hi * (hi - lo) / (f_hi - f_lo).clamp(max=-tol), (lo + hi) / 2)
        tau = torch.minimum(torch.maximum(tau, lo), hi)
        fm = f(tau)
        up = fm > 0
        down = fm < 0
        f_hi = torch.where(up & (side > 0), f_hi / 2, f_hi)
        f_lo = torch.where(down & (side < 0), f_lo / 2, f_lo)
        lo, f_lo = torch.where(up, tau, lo), torch.where(up, fm, f_lo)
        hi, f_hi = torch.where(down, tau, hi), torch.where(down, fm, f_hi)
        side = up.to(x.dtype) - down.to(x.dtype)
        done = (fm.abs() <= tol * (1 + budget)) | (hi - lo <= tol * (1 + hi.abs()))
        if bool(done.all()):
            break
    # exact on the piece found (|S(τ) − B| ≤ tol: a kink closer to the root than that moves p by round-off only)
    size, total, ones = _pieces(x, tau, dim)
    tau = torch.where(size > 0, (total + ones - budget) / size.clamp_min(1), tau)
    p = (x - tau).clamp_(0, 1)
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
