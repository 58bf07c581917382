"""Hypothesis properties of α-entmax: simplex output, shift invariance, permutation equivariance,
monotonicity, sparsity non-decreasing in α, and fp32-vs-float64-reference accuracy on adversarial rows."""

from __future__ import annotations

import pytest
import torch
from helpers.mappings import ALPHAS, PATHS, ref_entmax, solver_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import longsparse as ls

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

finite = st.floats(min_value=-50, max_value=50, allow_nan=False, allow_infinity=False, width=32)
rows = st.lists(finite, min_size=1, max_size=24)
alphas = st.sampled_from([1.0] + ALPHAS)


def _t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


@pytest.mark.parametrize("path", PATHS)
@SETTINGS
@given(rows, alphas)
def test_simplex_and_accuracy(path, row, alpha):
    """Non-negative, sums to 1, and within 1e-6 of the float64 reference (hypothesis shrinks towards
    ties, zeros and boundary cases)."""
    with solver_path(path):
        x = _t(row)
        p = ls.entmax(x, alpha)
    assert (p >= 0).all()
    assert abs(p.double().sum().item() - 1) <= 1e-6
    assert (p.double() - ref_entmax(x, alpha)).abs().max() <= 1e-6


@SETTINGS
@given(rows, alphas, st.floats(-1e3, 1e3, allow_nan=False))
def test_shift_invariance(row, alpha, c):
    """entmax(x + c) = entmax(x) for a constant c per row (float64 so x + c is exact enough)."""
    x = _t(row, torch.float64)
    torch.testing.assert_close(ls.entmax(x + c, alpha), ls.entmax(x, alpha), rtol=0, atol=1e-9)


@SETTINGS
@given(st.lists(rows, min_size=1, max_size=4), alphas, st.randoms(use_true_random=False))
def test_permutation_equivariance(row_list, alpha, rnd):
    n = min(len(r) for r in row_list)
    x = _t([r[:n] for r in row_list])
    perm = list(range(n))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    torch.testing.assert_close(ls.entmax(x[:, perm], alpha), ls.entmax(x, alpha)[:, perm], rtol=0, atol=1e-6)
    # and along dim 0 of the transposed tensor
    torch.testing.assert_close(ls.entmax(x.T, alpha, dim=0), ls.entmax(x, alpha).T, rtol=0, atol=1e-7)


@pytest.mark.parametrize("path", PATHS)
@SETTINGS
@given(rows, alphas)
def test_order_preserving(path, row, alpha):
    """A larger score never gets a smaller weight (exactly, not up to a tolerance: every step of the
    solve is monotone in the score, and so is fp rounding)."""
    with solver_path(path):
        x = _t(row)
        p = ls.entmax(x, alpha)
    order = torch.argsort(x, stable=True)
    xs, ps = x[order], p[order]
    assert (ps[1:] >= ps[:-1]).all()
    assert (ps[1:][xs[1:] == xs[:-1]] == ps[:-1][xs[1:] == xs[:-1]]).all()  # ties get equal weight


@SETTINGS
@given(rows, alphas, st.integers(0, 23), st.floats(0.0, 20.0, allow_nan=False))
def test_raising_a_score_does_not_lower_its_weight(row, alpha, i, delta):
    x = _t(row, torch.float64)
    i = i % x.numel()
    y = x.clone()
    y[i] += delta
    assert ls.entmax(y, alpha)[i] >= ls.entmax(x, alpha)[i] - 1e-12


@SETTINGS
@given(st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=2, max_size=16))
def test_sparsity_non_decreasing_in_alpha(row):
    """The number of zeros of α-entmax(x) never decreases as α grows (same row, α on a fine grid
    1.01 … 4.0). Checked on the float64 reference, and our mapping must give the same zero set except
    for entries within 1e-9 of the support boundary (round-off decides their side)."""
    x = _t(row, torch.float64)
    grid = torch.linspace(1.01, 4.0, 150, dtype=torch.float64).unsqueeze(1)
    X = x.expand(grid.shape[0], -1)
    r = ref_entmax(X, grid)
    zeros = (r == 0).sum(-1)
    assert (zeros[1:] >= zeros[:-1]).all(), (grid[1:][zeros[1:] < zeros[:-1]], zeros)
    p = ls.entmax(X, grid)
    differ = (r == 0) != (p == 0)
    assert not differ.any() or torch.maximum(r, p)[differ].max() < 1e-9


@pytest.mark.parametrize("path", PATHS)
@SETTINGS
@given(st.lists(st.sampled_from([0.0, 1.0, -1.0, 2.5, float("-inf")]), min_size=1, max_size=12), alphas)
def test_masked_entries_and_ties(path, row, alpha):
    """Rows built from a few repeated values and −inf: masked entries get exactly 0, ties equal
    weights, all-masked rows zeros; never NaN; gradient finite and 0 on masked entries."""
    with solver_path(path):
        x = _t(row).requires_grad_()
        p = ls.entmax(x, alpha)
        p.backward(torch.linspace(-1, 1, len(row)))
    assert not torch.isnan(p).any() and torch.isfinite(x.grad).all()
    masked = torch.isneginf(x.detach())
    assert (p[masked] == 0).all() and (x.grad[masked] == 0).all()
    if masked.all():
        assert (p == 0).all()
    else:
        assert abs(p.sum().item() - 1) <= 1e-6
        assert (p.double() - ref_entmax(x, alpha)).abs().max() <= 1e-6
