"""Drop-in names of the ``entmax`` package (v1.3): switch by changing the import.

Its 22 public callables with its signatures (``X`` first, then its keywords): the mappings here, the losses in
`longsparse.mappings.losses`, and ``sparsemax`` / ``entmax15`` in `longsparse.mappings.entmax`. Differences, all
in the direction of more exact results and clearer errors:

* the solver settings ``k`` (partial-sort size), ``n_iter`` (bisection steps) and ``ensure_sum_one`` are accepted
  and do not change the result: α = 1.5 and 2 (and normmax with α = 2, budget sparsemax) are solved exactly on
  their support, other α to fp32 round-off in float32 (float64 where that is not enough), never by a fixed
  number of bisection steps; rows always sum to 1 (to the budget);
* a fully masked row (all −inf) gives zeros, half-precision input is solved in float32, NaN / +inf input and
  α outside the map's domain raise one-line errors (normmax needs α > 1: below, the package returns NaN).
"""

from __future__ import annotations

import torch
from torch import Tensor

from longsparse.mappings.budget import BudgetLike, budget_sparsemax
from longsparse.mappings.entmax import AlphaLike, check_speed_hint, entmax, entmax15, sparsemax
from longsparse.mappings.normmax import normmax


def entmax_bisect(
    X: Tensor, alpha: AlphaLike = 1.5, dim: int = -1, n_iter: int | None = 50, ensure_sum_one: bool = True
) -> Tensor:
    """α-entmax along ``dim`` for any α > 0 (a number or a tensor broadcastable over the rows; differentiable in
    both): `longsparse.entmax`. Same shape as ``X``."""
    check_speed_hint("n_iter", n_iter)
    return entmax(X, alpha, dim)


def sparsemax_bisect(X: Tensor, dim: int = -1, n_iter: int | None = 50, ensure_sum_one: bool = True) -> Tensor:
    """Sparsemax along ``dim`` (exact); same shape as ``X``."""
    check_speed_hint("n_iter", n_iter)
    return entmax(X, 2.0, dim)


def normmax_bisect(X: Tensor, alpha: AlphaLike = 2, dim: int = -1, n_iter: int | None = 50) -> Tensor:
    """α-normmax along ``dim`` (α > 1; `longsparse.mappings.normmax`); same shape as ``X``."""
    check_speed_hint("n_iter", n_iter)
    return normmax(X, alpha, dim)


def budget_bisect(X: Tensor, budget: BudgetLike = 2, dim: int = -1, n_iter: int | None = 50) -> Tensor:
    """Budget sparsemax along ``dim``: p in [0, 1] summing to ``budget`` (`longsparse.mappings.budget`)."""
    check_speed_hint("n_iter", n_iter)
    return budget_sparsemax(X, budget, dim)


class Sparsemax(torch.nn.Module):
    def __init__(self, dim: int = -1, k: int | None = None):
        super().__init__()
        check_speed_hint("k", k)
        self.dim, self.k = dim, k

    def forward(self, X: Tensor) -> Tensor:
        return sparsemax(X, self.dim)


class Entmax15(torch.nn.Module):
    def __init__(self, dim: int = -1, k: int | None = None):
        super().__init__()
        check_speed_hint("k", k)
        self.dim, self.k = dim, k

    def forward(self, X: Tensor) -> Tensor:
        return entmax15(X, self.dim)


class SparsemaxBisect(torch.nn.Module):
    def __init__(self, dim: int = -1, n_iter: int | None = None):
        super().__init__()
        check_speed_hint("n_iter", n_iter)
        self.dim, self.n_iter = dim, n_iter

    def forward(self, X: Tensor) -> Tensor:
        return sparsemax_bisect(X, self.dim)


class EntmaxBisect(torch.nn.Module):
    def __init__(self, alpha: AlphaLike = 1.5, dim: int = -1, n_iter: int | None = 50):
        super().__init__()
        check_speed_hint("n_iter", n_iter)
        self.alpha, self.dim, self.n_iter = alpha, dim, n_iter

    def forward(self, X: Tensor) -> Tensor:
        return entmax(X, self.alpha, self.dim)


class NormmaxBisect(torch.nn.Module):
    def __init__(self, alpha: AlphaLike = 2, dim: int = -1, n_iter: int | None = 50):
        super().__init__()
        check_speed_hint("n_iter", n_iter)
        self.alpha, self.dim, self.n_iter = alpha, dim, n_iter

    def forward(self, X: Tensor) -> Tensor:
        return normmax(X, self.alpha, self.dim)


class BudgetBisect(torch.nn.Module):
    def __init__(self, budget: BudgetLike = 2, dim: int = -1, n_iter: int | None = 50):
        super().__init__()
        check_speed_hint("n_iter", n_iter)
        self.budget, self.dim, self.n_iter = budget, dim, n_iter

    def forward(self, X: Tensor) -> Tensor:
        return budget_sparsemax(X, self.budget, self.dim)
