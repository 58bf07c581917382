"""Drop-in names of the `entmax` package, and the learned-α helpers."""

from __future__ import annotations

import math

import entmax as E
import pytest
import torch

import longsparse as ls


def _x(shape=(4, 3, 10), seed=0, dtype=torch.float64):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 2


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_compat_names_match_entmax_package(dim):
    x = _x()
    torch.testing.assert_close(ls.Entmax15(dim=dim)(x), E.Entmax15(dim=dim)(x), rtol=0, atol=1e-12)
    torch.testing.assert_close(ls.Sparsemax(dim=dim)(x), E.Sparsemax(dim=dim)(x), rtol=0, atol=1e-12)
    for alpha in (1.2, 1.5, 2.0, 3.0):
        ref = E.entmax_bisect(x, alpha, dim=dim, n_iter=100)
        torch.testing.assert_close(ls.entmax_bisect(x, alpha, dim=dim), ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(ls.entmax_bisect(x, alpha, dim, 50, True), ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(ls.EntmaxBisect(alpha=alpha, dim=dim, n_iter=7)(x), ref, rtol=0, atol=1e-12)
    # package-only tuning arguments are accepted (and ignored: the solve is exact / converged)
    torch.testing.assert_close(ls.Entmax15(dim=dim, k=3)(x), E.Entmax15(dim=dim)(x), rtol=0, atol=1e-12)
    torch.testing.assert_close(ls.Sparsemax(dim=dim, k=3)(x), E.Sparsemax(dim=dim)(x), rtol=0, atol=1e-12)


def test_compat_tensor_alpha_and_gradients():
    x = _x((2, 3, 5, 5), seed=1)
    a = torch.tensor([1.3, 1.6, 2.2], dtype=torch.float64).view(3, 1, 1)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    a1, a2 = a.clone().requires_grad_(), a.clone().requires_grad_()
    p1 = ls.EntmaxBisect(alpha=a1)(x1)
    p2 = E.entmax_bisect(x2, a2, n_iter=100)
    torch.testing.assert_close(p1, p2, rtol=0, atol=1e-12)
    g = torch.randn_like(p1)
    p1.backward(g)
    p2.backward(g)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(a1.grad, a2.grad, rtol=1e-8, atol=1e-10)


def test_compat_fp32_matches_package():
    x = _x(dtype=torch.float32)
    torch.testing.assert_close(ls.Entmax15()(x), E.Entmax15()(x), rtol=0, atol=2e-6)
    torch.testing.assert_close(ls.Sparsemax()(x), E.Sparsemax()(x), rtol=0, atol=2e-6)
    torch.testing.assert_close(ls.entmax_bisect(x, 1.5), E.entmax15(x.double()).float(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("max_alpha", [2.0, 3.0, 1.5])
def test_bounded_alpha_round_trip(max_alpha):
    for alpha in (1.001, 1.1, 1.25, (1 + max_alpha) / 2, max_alpha - 1e-3):
        raw = ls.inverse_bounded_alpha(alpha, max_alpha)
        back = ls.bounded_alpha(torch.tensor(raw, dtype=torch.float64), max_alpha)
        assert math.isclose(back.item(), alpha, rel_tol=0, abs_tol=1e-12)
    with pytest.raises(ValueError):
        ls.inverse_bounded_alpha(1.0, max_alpha)
    with pytest.raises(ValueError):
        ls.inverse_bounded_alpha(max_alpha, max_alpha)
    with pytest.raises(ValueError):
        ls.bounded_alpha(torch.zeros(()), 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_bounded_alpha_stays_strictly_inside(dtype):
    """Even where σ(raw) saturates to 0 or 1 in the parameter's dtype, α stays in the open interval
    (1, max): an α of exactly 1.0 would be rejected by entmax as a tensor α."""
    raw = torch.tensor([-1e4, -100.0, -40.0, -17.0, -5.0, 0.0, 5.0, 17.0, 40.0, 100.0, 1e4], dtype=dtype)
    raw.requires_grad_()
    for max_alpha in (2.0, 3.0):
        a = ls.bounded_alpha(raw, max_alpha)
        assert a.dtype == dtype
        assert (a > 1).all() and (a < max_alpha).all(), a
        a.sum().backward()
        assert torch.isfinite(raw.grad).all()
        raw.grad = None
    # and entmax accepts every one of them
    x = torch.randn(raw.numel(), 6)
    p = ls.entmax(x, ls.bounded_alpha(raw.detach().float()).view(-1, 1))
    assert torch.isfinite(p).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(raw.numel()))


def test_learned_alpha_module():
    la = ls.LearnedAlpha((3,), init=1.5)
    a = la()
    assert a.shape == (3,)
    torch.testing.assert_close(a, torch.full((3,), 1.5))
    assert [n for n, _ in la.named_parameters()] == ["raw"]
    la2 = ls.LearnedAlpha(4, init=1.2, max_alpha=3.0)
    torch.testing.assert_close(la2(), torch.full((4,), 1.2))
    assert ls.LearnedAlpha().forward().shape == ()
    # α learns: gradient reaches raw through entmax, per head, and an optimiser step keeps α in (1, 2)
    x = torch.randn(2, 3, 5, 5)
    target = ls.entmax(x, torch.tensor([1.1, 1.5, 1.9]))
    opt = torch.optim.SGD(la.parameters(), lr=2.0)
    for _ in range(5):
        opt.zero_grad()
        loss = (ls.entmax(x, la()) - target).pow(2).sum()
        loss.backward()
        assert la.raw.grad is not None and (la.raw.grad[[0, 2]] != 0).all()
        opt.step()
        assert ((la() > 1) & (la() < 2)).all()
    a = la().detach()
    assert a[0] < 1.5 < a[2] and abs(a[1] - 1.5) < 1e-6  # each head moved towards its target α
    with pytest.raises(ValueError):
        ls.LearnedAlpha(init=2.5)
