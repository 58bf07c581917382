"""Fenchel–Young losses of the entmax family and of normmax (Blondel et al., 2020):

    L(z; y) = ⟨p − y, z⟩ + H(p) − H(y),   p = the mapping of z,   ∂L/∂z = p − y,

with H the mapping's entropy: Tsallis H_α(p) = (1 − Σ p^α)/(α(α−1)) for α-entmax (Shannon for α = 1; any α > 0),
1 − ‖p‖_α for α-normmax (α > 1). Targets are class indices (n,) or distributions (n, C). The loss is ≥ 0 and is
0 exactly when the mapping of z is y. The names and signatures are the ``entmax`` package's (v1.3): ``X`` first,
its solver settings ``k`` / ``n_iter`` accepted and not needed (the mappings are solved exactly or converged).
"""

from __future__ import annotations

from typing import Union

import torch
from torch import Tensor

from longsparse.mappings.entmax import AlphaLike, check_speed_hint, entmax
from longsparse.mappings.normmax import normmax

REDUCTIONS = ("elementwise_mean", "mean", "sum", "none")


def tsallis_entropy(p: Tensor, alpha: AlphaLike, dim: int = -1) -> Tensor:
    """H_α(p) = (1 − Σ p^α)/(α(α−1)) for α ≠ 1, −Σ p log p for α = 1 (per row of a tensor α, broadcast over
    the rows with ``dim`` of size 1). Shape: p's without ``dim``."""
    shannon = -torch.where(p > 0, p * torch.log(p.clamp_min(torch.finfo(p.dtype).tiny)), p.new_zeros(())).sum(dim)
    if not isinstance(alpha, Tensor):
        if alpha == 1:
            return shannon
        return (1 - p.pow(alpha).sum(dim)) / (alpha * (alpha - 1))
    a = alpha.to(p.dtype)
    at_one = a == 1
    a_safe = torch.where(at_one, torch.full_like(a, 2.0), a)
    tsallis = ((1 - p.pow(a_safe).sum(dim, keepdim=True)) / (a_safe * (a_safe - 1))).squeeze(dim)
    return torch.where(at_one.squeeze(dim) if at_one.dim() == p.dim() else at_one, shannon, tsallis)


def normmax_entropy(p: Tensor, alpha: AlphaLike, dim: int = -1) -> Tensor:
    """1 − ‖p‖_α: normmax's regulariser, 0 at a one-hot p. Shape: p's without ``dim``."""
    a = alpha.to(p.dtype) if isinstance(alpha, Tensor) else alpha
    return 1 - p.pow(a).sum(dim, keepdim=True).pow(1 / a).squeeze(dim)


def _target_distribution(target: Tensor, X: Tensor) -> Tensor:
    if X.dim() != 2:
        raise ValueError(f"Fenchel–Young losses take scores X of shape (n, C); got {tuple(X.shape)}")
    if target.is_floating_point():
        if target.shape != X.shape:
            raise ValueError(f"a distribution target must have X's shape {tuple(X.shape)}, got {tuple(target.shape)}")
        return target.to(X.dtype)
    if target.shape != X.shape[:1]:
        raise ValueError(f"class-index target must have shape ({X.shape[0]},), got {tuple(target.shape)}")
    if target.numel() and (target.min() < 0 or target.max() >= X.shape[1]):
        raise ValueError(f"target class indices must lie in [0, {X.shape[1]})")
    return torch.nn.functional.one_hot(target, X.shape[1]).to(X.dtype)


def _row_alpha(alpha: AlphaLike, X: Tensor) -> Union[float, Tensor]:
    """α as a float, or a tensor of one α (shape ()) or one per row ((n,) or (n, 1)) viewed as (n, 1); no
    gradient reaches it (as in the ``entmax`` package)."""
    if not isinstance(alpha, Tensor):
        return float(alpha)
    if alpha.numel() == 1:
        return alpha.detach().reshape(()).to(X.device)
    if alpha.shape not in ((X.shape[0],), (X.shape[0], 1)):
        raise ValueError(
            f"alpha must be a number or a tensor of shape (), ({X.shape[0]},) or ({X.shape[0]}, 1); "
            f"got {tuple(alpha.shape)}"
        )
    return alpha.detach().reshape(-1, 1).to(X.device)


class _FenchelYoungFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: Tensor, y: Tensor, alpha, kind: str) -> Tensor:
        cdt = torch.promote_types(z.dtype, torch.float32)
        a = alpha.to(cdt) if isinstance(alpha, Tensor) else alpha
        zf, yf = z.detach().to(cdt), y.to(cdt)
        if kind == "normmax":
            p = normmax(zf, a, dim=-1)
            omega_p, omega_y = normmax_entropy(p, a), normmax_entropy(yf, a)
        else:
            p = entmax(zf, a, dim=-1)
            omega_p, omega_y = tsallis_entropy(p, a), tsallis_entropy(yf, a)
        loss = ((p - yf) * zf).sum(-1) + omega_p - omega_y
        ctx.save_for_backward(p, yf)
        ctx.in_dtype = z.dtype
        return loss.clamp_min(0).to(z.dtype)  # ≥ 0 in exact arithmetic; clamp round-off

    @staticmethod
    def backward(ctx, grad: Tensor):
        p, y = ctx.saved_tensors
        return (grad.unsqueeze(-1).to(p.dtype) * (p - y)).to(ctx.in_dtype), None, None, None


def _fy_loss(X: Tensor, target: Tensor, alpha: AlphaLike, kind: str) -> Tensor:
    return _FenchelYoungFunction.apply(X, _target_distribution(target, X), _row_alpha(alpha, X), kind)


def entmax_bisect_loss(X: Tensor, target: Tensor, alpha: AlphaLike = 1.5, n_iter: int | None = 50) -> Tensor:
    """Per-example α-entmax Fenchel–Young loss (any α > 0: a number, or one per row), shape (n,)."""
    check_speed_hint("n_iter", n_iter)
    return _fy_loss(X, target, alpha, "entmax")


def sparsemax_bisect_loss(X: Tensor, target: Tensor, n_iter: int | None = 50) -> Tensor:
    """Per-example sparsemax loss, shape (n,) (the same numbers as `sparsemax_loss`: both are exact here)."""
    check_speed_hint("n_iter", n_iter)
    return _fy_loss(X, target, 2.0, "entmax")


def normmax_bisect_loss(X: Tensor, target: Tensor, alpha: AlphaLike = 2, n_iter: int | None = 50) -> Tensor:
    """Per-example α-normmax Fenchel–Young loss (α > 1), shape (n,)."""
    check_speed_hint("n_iter", n_iter)
    return _fy_loss(X, target, alpha, "normmax")


def entmax15_loss(X: Tensor, target: Tensor, k: int | None = None) -> Tensor:
    """Per-example 1.5-entmax loss, shape (n,)."""
    check_speed_hint("k", k)
    return _fy_loss(X, target, 1.5, "entmax")


def sparsemax_loss(X: Tensor, target: Tensor, k: int | None = None) -> Tensor:
    """Per-example sparsemax loss, shape (n,)."""
    check_speed_hint("k", k)
    return _fy_loss(X, target, 2.0, "entmax")


class _FYLoss(torch.nn.Module):
    """A loss over a batch: class indices equal to ``ignore_index`` contribute 0 (and no gradient) and are not
    counted by the mean; ``reduction``: elementwise_mean (= mean), sum or none."""

    def __init__(self, alpha: AlphaLike, kind: str, ignore_index: int = -100, reduction: str = "elementwise_mean"):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"unknown reduction {reduction!r}; choose one of {', '.join(REDUCTIONS)}")
        self.alpha, self.kind, self.ignore_index, self.reduction = alpha, kind, ignore_index, reduction

    def forward(self, X: Tensor, target: Tensor) -> Tensor:
        if target.is_floating_point():
            # distribution targets (n, C): ignore_index applies to class indices only
            keep = torch.ones(target.shape[:1], dtype=torch.bool, device=target.device)
        else:
            keep = target != self.ignore_index
        alpha = self.alpha
        if isinstance(alpha, Tensor) and alpha.numel() > 1:
            alpha = _row_alpha(alpha, X)[keep]
        loss = torch.zeros(target.shape[0], dtype=X.dtype, device=X.device)
        # no `if keep.any()`: with every position ignored the (empty) loss must still be connected to X, or
        # loss.backward() raises on an all-padding batch
        loss = loss.masked_scatter(keep, _fy_loss(X[keep], target[keep], alpha, self.kind))
        if self.reduction == "sum":
            return loss.sum()
        if self.reduction in ("mean", "elementwise_mean"):
            return loss.sum() / keep.sum().clamp_min(1)
        return loss


class Entmax15Loss(_FYLoss):
    def __init__(self, k: int | None = 100, ignore_index: int = -100, reduction: str = "elementwise_mean"):
        check_speed_hint("k", k)
        super().__init__(1.5, "entmax", ignore_index, reduction)
        self.k = k


class SparsemaxLoss(_FYLoss):
    def __init__(self, k: int | None = None, ignore_index: int = -100, reduction: str = "elementwise_mean"):
        check_speed_hint("k", k)
        super().__init__(2.0, "entmax", ignore_index, reduction)
        self.k = k


class SparsemaxBisectLoss(_FYLoss):
    def __init__(self, n_iter: int | None = 50, ignore_index: int = -100, reduction: str = "elementwise_mean"):
        check_speed_hint("n_iter", n_iter)
        super().__init__(2.0, "entmax", ignore_index, reduction)
        self.n_iter = n_iter


class EntmaxBisectLoss(_FYLoss):
    def __init__(
        self,
        alpha: AlphaLike = 1.5,
        n_iter: int | None = 50,
        ignore_index: int = -100,
        reduction: str = "elementwise_mean",
    ):
        check_speed_hint("n_iter", n_iter)
        super().__init__(alpha, "entmax", ignore_index, reduction)
        self.n_iter = n_iter


class NormmaxBisectLoss(_FYLoss):
    def __init__(
        self,
        alpha: AlphaLike = 2,
        n_iter: int | None = 50,
        ignore_index: int = -100,
        reduction: str = "elementwise_mean",
    ):
        check_speed_hint("n_iter", n_iter)
        super().__init__(alpha, "normmax", ignore_index, reduction)
        self.n_iter = n_iter
