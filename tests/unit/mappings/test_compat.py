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


# ---- every public callable of the package, with its signature --------------------------------------------------
PACKAGE_NAMES = sorted(n for n in dir(E) if not n.startswith("_") and callable(getattr(E, n)))


def test_every_package_callable_exists_with_its_parameters():
    """The 22 public callables of entmax 1.3, each with the package's parameter names in the package's order
    (so positional and keyword calls, X= included, carry over)."""
    import inspect

    assert len(PACKAGE_NAMES) == 22
    for name in PACKAGE_NAMES:
        ours, theirs = getattr(ls, name), getattr(E, name)
        sig = inspect.signature(ours.__init__ if inspect.isclass(ours) else ours)
        want = inspect.signature(theirs.__init__ if inspect.isclass(theirs) else theirs)
        assert list(sig.parameters) == list(want.parameters), name
        if inspect.isclass(ours):
            fwd = list(inspect.signature(ours.forward).parameters)
            assert fwd == list(inspect.signature(theirs.forward).parameters) and fwd[1] == "X", name


def test_keyword_X_and_solver_hints_are_accepted():
    x = _x((3, 7))
    for ours, theirs, kw in (
        (ls.entmax15, E.entmax15, dict(k=5)),
        (ls.sparsemax, E.sparsemax, dict(k=5)),
        (ls.entmax_bisect, E.entmax_bisect, dict(alpha=1.3, n_iter=100)),
        (ls.sparsemax_bisect, E.sparsemax_bisect, dict(n_iter=100)),
        (ls.normmax_bisect, E.normmax_bisect, dict(alpha=3, n_iter=100)),
        (ls.budget_bisect, E.budget_bisect, dict(budget=3, n_iter=100)),
    ):
        torch.testing.assert_close(ours(X=x, dim=0, **kw), theirs(X=x, dim=0, **kw), rtol=0, atol=1e-12)
    y = torch.tensor([0, 2, 1])
    for ours, theirs in ((ls.sparsemax_loss, E.sparsemax_loss), (ls.entmax15_loss, E.entmax15_loss)):
        torch.testing.assert_close(ours(X=x, target=y, k=5), theirs(X=x, target=y, k=5), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("alpha", [0.05, 0.3, 0.5, 0.8, 0.95, 0.999])
def test_entmax_bisect_below_one_is_the_dense_tsallis_map(alpha):
    """α in (0, 1), which the package accepts: every unmasked entry positive; values and the gradients of x and α
    equal the package's float64 bisection; float32 within fp32 round-off of it; masked entries stay 0."""
    x = _x((4, 3, 9), seed=5)
    x[0, 0, 2] = -math.inf
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    a1 = torch.tensor(alpha, dtype=torch.float64, requires_grad=True)
    a2 = a1.detach().clone().requires_grad_()
    p1, p2 = ls.entmax_bisect(x1, a1), E.entmax_bisect(x2, a2, n_iter=200)
    torch.testing.assert_close(p1, p2, rtol=0, atol=1e-12)
    assert p1[0, 0, 2] == 0 and (p1.masked_fill(x == -math.inf, 1) > 0).all()
    g = torch.randn_like(p1)
    p1.backward(g)
    p2.backward(g)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(a1.grad, a2.grad, rtol=1e-6, atol=1e-8)
    p32 = ls.entmax_bisect(x.float(), alpha)
    assert (p32.double() - p2.detach()).abs().max() < 2e-7
    assert (p32.sum(-1) - 1).abs().max() < 1e-6


def test_entmax_bisect_rows_mix_dense_softmax_and_sparse():
    x = _x((5, 8), seed=6)
    a = torch.tensor([0.5, 1.0, 1.5, 2.0, 3.0], dtype=torch.float64).view(5, 1)
    rows = [torch.softmax(x[i], -1) if a[i] == 1 else E.entmax_bisect(x[i], float(a[i]), n_iter=200) for i in range(5)]
    torch.testing.assert_close(ls.entmax_bisect(x, a), torch.stack(rows), rtol=0, atol=1e-12)


@pytest.mark.parametrize("alpha", [1.2, 1.5, 2.0, 3.0, 10.0, "rows"])
def test_normmax_equals_the_package(alpha):
    x = _x((6, 9), seed=7)
    a = torch.tensor([1.2, 1.5, 2.0, 3.0, 5.0, 10.0], dtype=torch.float64).view(6, 1) if alpha == "rows" else alpha
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    p1, p2 = ls.normmax_bisect(x1, a), E.normmax_bisect(x2, a, n_iter=200)
    torch.testing.assert_close(p1, p2, rtol=0, atol=1e-12)
    g = torch.randn_like(p1)
    p1.backward(g)
    p2.backward(g)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-8, atol=1e-10)
    a_t = a.T if isinstance(a, torch.Tensor) else a
    torch.testing.assert_close(ls.NormmaxBisect(a_t, dim=0)(x.T), p2.detach().T, rtol=0, atol=1e-12)
    assert (ls.normmax_bisect(x.float(), a).double() - p2.detach()).abs().max() < 1e-6


def test_normmax_two_is_exact():
    """α = 2 goes through 1.5-entmax's closed form: float64 sums and support are exact to round-off."""
    x = _x((50, 30), seed=8)
    p = ls.normmax_bisect(x, 2)
    q = E.normmax_bisect(x, 2, n_iter=200)
    assert (p - q).abs().max() < 1e-14 and ((p > 0) == (q > 0)).all()


@pytest.mark.parametrize("budget", [0, 1, 2.5, 5, 9, "rows"])
def test_budget_equals_the_package(budget):
    x = _x((6, 9), seed=9)
    b = torch.tensor([0.0, 1.0, 2.5, 4.0, 8.5, 9.0], dtype=torch.float64).view(6, 1) if budget == "rows" else budget
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    p1, p2 = ls.budget_bisect(x1, b), E.budget_bisect(x2, b, n_iter=200)
    torch.testing.assert_close(p1, p2, rtol=0, atol=1e-12)
    torch.testing.assert_close(p1.sum(-1, keepdim=True), torch.as_tensor(b, dtype=x.dtype).expand(6, 1))
    g = torch.randn_like(p1)
    p1.backward(g)
    p2.backward(g)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ls.BudgetBisect(b)(x), p2.detach(), rtol=0, atol=1e-12)


def test_budget_with_masked_entries_and_its_gradient_of_the_budget():
    x = _x((4, 7), seed=10)
    x[:, 5:] = -math.inf
    p = ls.budget_bisect(x, 2.0)
    assert (p[:, 5:] == 0).all() and torch.allclose(p.sum(-1), torch.full((4,), 2.0, dtype=x.dtype))
    torch.testing.assert_close(p[:, :5], ls.budget_bisect(x[:, :5], 2.0), rtol=0, atol=0)
    xx = x[:, :5].clone().requires_grad_()
    b = torch.tensor([[1.5], [2.0], [2.5], [3.5]], dtype=x.dtype, requires_grad=True)
    assert torch.autograd.gradcheck(ls.budget_bisect, (xx, b), eps=1e-6)


@pytest.mark.parametrize("name", ["sparsemax_bisect_loss", "normmax_bisect_loss"])
def test_new_losses_equal_the_package(name):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(10, 7, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 7, (10,), generator=g)
    kw = dict(alpha=3.0) if name.startswith("normmax") else {}
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    l1, l2 = getattr(ls, name)(x1, y, **kw), getattr(E, name)(x2, y, n_iter=200, **kw)
    torch.testing.assert_close(l1, l2, rtol=1e-10, atol=1e-12)
    w = torch.rand(10, dtype=x.dtype)
    l1.backward(w)
    l2.backward(w)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-10, atol=1e-12)
    cls = {"sparsemax_bisect_loss": "SparsemaxBisectLoss", "normmax_bisect_loss": "NormmaxBisectLoss"}[name]
    for reduction in ("sum", "elementwise_mean", "none"):
        ours = getattr(ls, cls)(**kw, ignore_index=y[0].item(), reduction=reduction)(x, y)
        theirs = getattr(E, cls)(**kw, n_iter=200, ignore_index=y[0].item(), reduction=reduction)(x, y)
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


def test_compat_errors_are_one_line():
    x = _x((3, 5))
    cases = [
        (lambda: ls.normmax_bisect(x, 1.0), "normmax alpha must be a finite number > 1"),
        (lambda: ls.normmax_bisect(x, torch.tensor([[2.0], [0.5], [3.0]])), "normmax alpha must be finite and > 1"),
        (lambda: ls.budget_bisect(x, 6), "budget must lie between 0 and the number of unmasked entries"),
        (lambda: ls.budget_bisect(x, -1), "budget must lie between 0"),
        (lambda: ls.budget_bisect(x, torch.ones(5)), "budget of shape \\(5,\\) does not broadcast"),
        (lambda: ls.entmax15(x, k=0), "k must be None or an integer >= 1"),
        (lambda: ls.Sparsemax(k=2.5), "k must be None or an integer >= 1"),
        (lambda: ls.sparsemax_bisect(x, n_iter=-3), "n_iter must be None or an integer >= 1"),
        (lambda: ls.entmax_bisect(x, 0.0), "alpha must be a finite number > 0"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as e:
            call()
        assert "\n" not in str(e.value)
