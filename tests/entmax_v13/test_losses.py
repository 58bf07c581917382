# Copyright (c) 2019 DeepSPIN. MIT License: see LICENSE in this folder.
# entmax/test_losses.py of the `entmax` package at tag v1.3 (github.com/deep-spin/entmax, commit 4a9eb7f), run against
# longsparse's drop-in names. Adapted: the import (entmax.losses -> longsparse); the module's random data seeded; the `__main__` block, which calls functions the file does not define, removed. Kept otherwise as upstream wrote it (not reformatted, so that it
# diffs against upstream); tests/entmax_v13/__init__.py says what the suite checks.
import pytest
import torch
from torch.autograd import gradcheck, grad
from functools import partial

from longsparse import (
    SparsemaxLoss,
    Entmax15Loss,
    SparsemaxBisectLoss,
    EntmaxBisectLoss,
    NormmaxBisectLoss
)


# make data
torch.manual_seed(0)
Xs = [
    torch.randn(4, 10, dtype=torch.float64, requires_grad=True)
    for _ in range(5)
]

ys = [torch.max(torch.randn_like(X), dim=1)[1] for X in Xs]


losses = [
    SparsemaxLoss,
    partial(SparsemaxLoss, k=5),
    Entmax15Loss,
    partial(Entmax15Loss, k=5),
    SparsemaxBisectLoss,
    EntmaxBisectLoss,
    NormmaxBisectLoss
]


@pytest.mark.parametrize("Loss", losses)
def test_non_neg(Loss):

    for X, y in zip(Xs, ys):
        ls = Loss(reduction="none")
        lval = ls(X, y)
        assert torch.all(lval >= 0)


@pytest.mark.parametrize("Loss", losses)
@pytest.mark.parametrize("ignore_index", (False, True))
@pytest.mark.parametrize("reduction", ("sum", "elementwise_mean"))
def test_loss(Loss, ignore_index, reduction):

    for X, y in zip(Xs, ys):
        iix = y[0] if ignore_index else -100
        ls = Loss(ignore_index=iix, reduction=reduction)
        gradcheck(ls, (X, y), eps=1e-5)


@pytest.mark.parametrize("Loss", losses)
def test_index_ignored(Loss):

    x = torch.randn(20, 6, dtype=torch.float64, requires_grad=True)
    _, y = torch.max(torch.randn_like(x), dim=1)

    loss_ignore = Loss(reduction="sum", ignore_index=y[0])
    loss_noignore = Loss(reduction="sum", ignore_index=-100)

    assert loss_ignore(x, y) < loss_noignore(x, y)

