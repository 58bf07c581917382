"""Drop-in names of the ``entmax`` package (v1.3): switch by changing the import.

Extra arguments that only tune the package's solver (``k``, ``n_iter``, ``ensure_sum_one``) are
accepted and ignored: our solves are exact (α = 1.5, 2) or run to fp32 round-off (other α).
"""

from __future__ import annotations

import torch
from torch import Tensor

from longsparse.mappings.entmax import AlphaLike, entmax


def entmax_bisect(
    X: Tensor, alpha: AlphaLike = 1.5, dim: int = -1, n_iter: int = 50, ensure_sum_one: bool = True
) -> Tensor:
    return entmax(X, alpha, dim)


class Entmax15(torch.nn.Module):
    def __init__(self, dim: int = -1, k=None):
        super().__init__()
        self.dim = dim

    def forward(self, X: Tensor) -> Tensor:
        return entmax(X, 1.5, self.dim)


class Sparsemax(torch.nn.Module):
    def __init__(self, dim: int = -1, k=None):
        super().__init__()
        self.dim = dim

    def forward(self, X: Tensor) -> Tensor:
        return entmax(X, 2.0, self.dim)


class EntmaxBisect(torch.nn.Module):
    def __init__(self, alpha: AlphaLike = 1.5, dim: int = -1, n_iter: int = 50):
        super().__init__()
        self.alpha, self.dim = alpha, dim

    def forward(self, X: Tensor) -> Tensor:
        return entmax(X, self.alpha, self.dim)
