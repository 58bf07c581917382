"""Fenchel–Young losses of the entmax family (Blondel et al., 2020):

    L(z; y) = ⟨p − y, z⟩ + H_α(p) − H_α(y),   p = α-entmax(z),   ∂L/∂z = p − y,

with H_α the Tsallis entropy (Shannon for α = 1). Targets are class indices (n,) or distributions
(n, C). The loss is ≥ 0 and is 0 exactly when entmax(z) = y.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longsparse.mappings.entmax import AlphaLike, entmax


def tsallis_entropy(p: Tensor, alpha: AlphaLike, dim: int = -1) -> Tensor:
    """H_α(p) = (1 − Σ p^α)/(α(α−1)) for α > 1, −Σ p log p for α = 1."""
    if not isinstance(alpha, Tensor) and alpha == 1:
        return -torch.where(p > 0, p * torch.log(p.clamp_min(1e-38)), p.new_zeros(())).sum(dim)
    a = torch.as_tensor(alpha, dtype=p.dtype)
    return ((1 - p.pow(a).sum(dim, keepdim=True)) / (a * (a - 1))).squeeze(dim)


def _target_distribution(target: Tensor, logits: Tensor) -> Tensor:
    if logits.dim() != 2:
        raise ValueError(f"Fenchel–Young losses take logits of shape (n, C); got {tuple(logits.shape)}")
    if target.is_floating_point():
        if target.shape != logits.shape:
            raise ValueError(
                f"a distribution target must have the logits' shape {tuple(logits.shape)}, got {tuple(target.shape)}"
            )
        return target.to(logits.dtype)
    if target.shape != logits.shape[:1]:
        raise ValueError(f"class-index target must have shape ({logits.shape[0]},), got {tuple(target.shape)}")
    if target.numel() and (target.min() < 0 or target.max() >= logits.shape[1]):
        raise ValueError(f"target class indices must lie in [0, {logits.shape[1]})")
    return torch.nn.functional.one_hot(target, logits.shape[1]).to(logits.dtype)


class _FenchelYoungFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: Tensor, y: Tensor, alpha: float) -> Tensor:
        p = entmax(z.detach(), alpha, dim=-1).to(torch.promote_types(z.dtype, torch.float32))
        zf, yf = z.to(p.dtype), y.to(p.dtype)
        loss = ((p - yf) * zf).sum(-1) + tsallis_entropy(p, alpha) - tsallis_entropy(yf, alpha)
        ctx.save_for_backward(p, yf)
        ctx.in_dtype = z.dtype
        return loss.clamp_min(0).to(z.dtype)  # ≥ 0 in exact arithmetic; clamp round-off

    @staticmethod
    def backward(ctx, grad: Tensor):
        p, y = ctx.saved_tensors
        return (grad.unsqueeze(-1).to(p.dtype) * (p - y)).to(ctx.in_dtype), None, None


def entmax_bisect_loss(logits: Tensor, target: Tensor, alpha: float = 1.5, n_iter: int | None = None) -> Tensor:
    """Per-example α-entmax Fenchel–Young loss, shape (n,). ``n_iter`` is accepted for
    compatibility with the ``entmax`` package and ignored (the solve runs to convergence)."""
    if isinstance(alpha, Tensor):
        raise TypeError("the Fenchel–Young loss takes a float alpha")
    return _FenchelYoungFunction.apply(logits, _target_distribution(target, logits), float(alpha))


def entmax15_loss(logits: Tensor, target: Tensor, k: int | None = None) -> Tensor:
    """Per-example 1.5-entmax loss; ``k`` (a speed hint in the ``entmax`` package) is ignored."""
    return entmax_bisect_loss(logits, target, 1.5)


def sparsemax_loss(logits: Tensor, target: Tensor, k: int | None = None) -> Tensor:
    """Per-example sparsemax loss; ``k`` is ignored."""
    return entmax_bisect_loss(logits, target, 2.0)


class _FYLoss(torch.nn.Module):
    def __init__(self, alpha: float, ignore_index: int = -100, reduction: str = "elementwise_mean"):
        super().__init__()
        if reduction not in ("elementwise_mean", "mean", "sum", "none"):
            raise ValueError(f"unknown reduction {reduction!r}")
        self.alpha, self.ignore_index, self.reduction = alpha, ignore_index, reduction

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        if target.is_floating_point():
            # distribution targets (n, C): ignore_index applies to class indices only
            keep = torch.ones(target.shape[:1], dtype=torch.bool, device=target.device)
        else:
            keep = target != self.ignore_index
        loss = torch.zeros(target.shape[0], dtype=logits.dtype, device=logits.device)
        # no `if keep.any()`: with every position ignored the (empty) loss must still be connected to
        # the logits, or loss.backward() raises on an all-padding batch
        loss = loss.masked_scatter(keep, entmax_bisect_loss(logits[keep], target[keep], self.alpha))
        if self.reduction == "sum":
            return loss.sum()
        if self.reduction in ("mean", "elementwise_mean"):
            return loss.sum() / keep.sum().clamp_min(1)
        return loss


class Entmax15Loss(_FYLoss):
    def __init__(self, k=None, ignore_index: int = -100, reduction: str = "elementwise_mean"):
        super().__init__(1.5, ignore_index, reduction)


class SparsemaxLoss(_FYLoss):
    def __init__(self, k=None, ignore_index: int = -100, reduction: str = "elementwise_mean"):
        super().__init__(2.0, ignore_index, reduction)


class EntmaxBisectLoss(_FYLoss):
    def __init__(self, alpha: float = 1.5, n_iter=None, ignore_index: int = -100, reduction: str = "elementwise_mean"):
        super().__init__(alpha, ignore_index, reduction)
