"""Fenchel–Young losses against the `entmax` package (1.3) and their defining properties."""

from __future__ import annotations

import entmax.losses as EL
import pytest
import torch
from helpers.mappings import ref_entmax

import longsparse as ls

FUNCS = [  # (ours, package's, alpha)
    (ls.entmax15_loss, EL.entmax15_loss, 1.5),
    (ls.sparsemax_loss, EL.sparsemax_loss, 2.0),
    (lambda z, y: ls.entmax_bisect_loss(z, y, 1.3), lambda z, y: EL.entmax_bisect_loss(z, y, 1.3, 100), 1.3),
    (lambda z, y: ls.entmax_bisect_loss(z, y, 2.5), lambda z, y: EL.entmax_bisect_loss(z, y, 2.5, 100), 2.5),
]


def _data(n=12, C=9, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, C, generator=g, dtype=dtype) * 2
    y = torch.randint(0, C, (n,), generator=g)
    return z, y


def _tsallis(p, alpha):
    return (1 - p.pow(alpha).sum(-1)) / (alpha * (alpha - 1))


@pytest.mark.parametrize("i", range(len(FUNCS)))
def test_loss_and_grad_vs_entmax_package(i):
    ours, pkg, alpha = FUNCS[i]
    z, y = _data(seed=i)
    z1, z2 = z.clone().requires_grad_(), z.clone().requires_grad_()
    l1, l2 = ours(z1, y), pkg(z2, y)
    assert l1.shape == (z.shape[0],)
    torch.testing.assert_close(l1, l2, rtol=1e-9, atol=1e-10)
    w = torch.rand(z.shape[0], dtype=z.dtype)
    l1.backward(w)
    l2.backward(w)
    torch.testing.assert_close(z1.grad, z2.grad, rtol=1e-9, atol=1e-10)
    # fp32 logits agree with the float64 package to fp32 precision
    torch.testing.assert_close(ours(z.float(), y).double(), l2.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("alpha", [1.0, 1.25, 1.5, 2.0, 3.0])
def test_grad_is_p_minus_y_and_loss_nonnegative(alpha):
    z, y = _data(seed=3)
    z = z.requires_grad_()
    loss = ls.entmax_bisect_loss(z, y, alpha)
    assert (loss >= 0).all()
    loss.sum().backward()
    p = ref_entmax(z, alpha)
    expected = p - torch.nn.functional.one_hot(y, z.shape[1]).double()
    torch.testing.assert_close(z.grad, expected, rtol=0, atol=1e-12)
    # finite-difference check of the loss itself (the gradient formula is exact, not just the backward)
    zz = torch.randn(3, 5, dtype=torch.float64) * 0.5
    zz = zz.requires_grad_()
    assert torch.autograd.gradcheck(lambda t: ls.entmax_bisect_loss(t, y[:3] % 5, alpha), (zz,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 1.3])
def test_distribution_targets(alpha):
    z, _ = _data(seed=4)
    g = torch.Generator().manual_seed(9)
    y = torch.softmax(torch.randn(z.shape, generator=g, dtype=z.dtype) * 3, -1)
    y = ls.sparsemax(torch.randn(z.shape, generator=g, dtype=z.dtype) * 3)  # sparse targets too
    z = z.requires_grad_()
    loss = ls.entmax_bisect_loss(z, y, alpha)
    p = ref_entmax(z, alpha)
    if alpha == 1.0:
        H = lambda q: -(q * torch.log(q.clamp_min(1e-300))).sum(-1)  # noqa: E731
    else:
        H = lambda q: _tsallis(q, alpha)  # noqa: E731
    expected = ((p - y) * z.detach()).sum(-1) + H(p) - H(y)
    torch.testing.assert_close(loss, expected, rtol=1e-9, atol=1e-10)
    assert (loss >= 0).all()
    loss.sum().backward()
    torch.testing.assert_close(z.grad, p - y, rtol=0, atol=1e-12)


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 1.3, 2.5])
def test_zero_loss_when_target_is_the_mapping(alpha):
    z, _ = _data(seed=5, dtype=torch.float32)
    y = ls.entmax(z, alpha)
    assert ls.entmax_bisect_loss(z, y, alpha).abs().max() <= 1e-6
    assert ls.entmax_bisect_loss(z.double(), y.double(), alpha).abs().max() <= 1e-6
    # a one-hot target is reached by a large enough margin on a sparse mapping (α > 1)
    if alpha > 1:
        z1 = torch.full((2, 4), -10.0)
        z1[:, 1] = 10.0
        assert (ls.entmax_bisect_loss(z1, torch.tensor([1, 1]), alpha) == 0).all()
        assert (ls.entmax_bisect_loss(z1, torch.tensor([0, 2]), alpha) > 0).all()


@pytest.mark.parametrize("reduction", ["elementwise_mean", "sum", "none"])
@pytest.mark.parametrize("cls_pair", ["entmax15", "sparsemax", "bisect"])
def test_loss_modules_vs_entmax_package(reduction, cls_pair):
    ours_cls, pkg_cls = {
        "entmax15": (ls.Entmax15Loss, EL.Entmax15Loss),
        "sparsemax": (ls.SparsemaxLoss, EL.SparsemaxLoss),
        "bisect": (ls.EntmaxBisectLoss, EL.EntmaxBisectLoss),
    }[cls_pair]
    kw = {"alpha": 1.7} if cls_pair == "bisect" else {}
    z, y = _data(seed=6)
    y[:3] = 2  # several ignored positions
    for ignore_index in (2, -100):  # the package honours ignore_index only when ≥ 0
        ours = ours_cls(ignore_index=ignore_index, reduction=reduction, **kw)
        pkg = pkg_cls(
            ignore_index=ignore_index,
            reduction=reduction,
            **({"alpha": 1.7, "n_iter": 100} if cls_pair == "bisect" else {}),
        )
        z1, z2 = z.clone().requires_grad_(), z.clone().requires_grad_()
        l1, l2 = ours(z1, y), pkg(z2, y)
        torch.testing.assert_close(l1, l2, rtol=1e-9, atol=1e-10)
        l1.sum().backward()
        l2.sum().backward()
        torch.testing.assert_close(z1.grad, z2.grad, rtol=1e-9, atol=1e-10)
        if ignore_index == 2:
            assert (z1.grad[:3] == 0).all()
            if reduction == "none":
                assert (l1[:3] == 0).all()


def test_ignore_index_all_ignored_and_negative():
    z, y = _data(seed=7)
    loss = ls.Entmax15Loss(ignore_index=-100)
    y2 = y.clone()
    y2[::2] = -100  # our default ignore_index is honoured
    full = ls.entmax15_loss(z[1::2], y[1::2])
    torch.testing.assert_close(loss(z, y2), full.mean())
    torch.testing.assert_close(ls.Entmax15Loss(reduction="sum")(z, y2), full.sum())
    all_ignored = torch.full_like(y, -100)
    zz = z.clone().requires_grad_()
    out = loss(zz, all_ignored)
    assert out.item() == 0
    out.backward()
    assert (zz.grad == 0).all()


def test_loss_modules_accept_distribution_targets():
    z, _ = _data(seed=8)
    y = ls.entmax15(torch.randn_like(z) * 2)
    for mod, fn in (
        (ls.Entmax15Loss(), ls.entmax15_loss),
        (ls.SparsemaxLoss(reduction="sum"), ls.sparsemax_loss),
        (ls.EntmaxBisectLoss(1.3, reduction="none"), lambda a, b: ls.entmax_bisect_loss(a, b, 1.3)),
    ):
        out = mod(z, y)
        ref = fn(z, y)
        ref = {"elementwise_mean": ref.mean(), "mean": ref.mean(), "sum": ref.sum(), "none": ref}[mod.reduction]
        torch.testing.assert_close(out, ref)


def test_fp32_and_half_logits():
    z, y = _data(seed=10, dtype=torch.float32)
    l32 = ls.entmax15_loss(z, y)
    assert l32.dtype == torch.float32
    lb = ls.entmax15_loss(z.to(torch.bfloat16), y)
    assert lb.dtype == torch.bfloat16
    torch.testing.assert_close(lb.float(), ls.entmax15_loss(z.to(torch.bfloat16).float(), y), rtol=1e-2, atol=1e-2)


def test_bad_targets_raise():
    z, y = _data(seed=11)
    with pytest.raises(ValueError):
        ls.entmax15_loss(z, y[:-1])  # wrong number of class indices
    with pytest.raises(ValueError):
        ls.entmax15_loss(z, y.view(-1, 1))  # (n, 1) indices
    with pytest.raises(ValueError):
        ls.sparsemax_loss(z, torch.rand(z.shape[0], z.shape[1] + 1, dtype=z.dtype))  # distribution, wrong C
    with pytest.raises(ValueError):
        ls.sparsemax_loss(z, torch.full_like(y, z.shape[1]))  # index out of range
    with pytest.raises(ValueError):
        ls.sparsemax_loss(z, torch.full_like(y, -3))  # negative index
    with pytest.raises(ValueError):
        ls.entmax15_loss(z.view(3, 4, -1), y)  # logits must be (n, C)
    with pytest.raises(ValueError):
        ls.Entmax15Loss(reduction="avg")
    with pytest.raises(ValueError, match="alpha must be a number or a tensor of shape"):
        ls.entmax_bisect_loss(z, y, torch.full((2, 2), 1.5, dtype=z.dtype))
    with pytest.raises(ValueError, match="n_iter must be None or an integer >= 1"):
        ls.entmax_bisect_loss(z, y, 1.5, n_iter=0)
    with pytest.raises(ValueError, match="normmax alpha must be a finite number > 1"):
        ls.normmax_bisect_loss(z, y, alpha=1.0)


def test_tensor_alpha_one_per_row_or_shared():
    """The package's losses take alpha as a tensor: one value, or one per row (its docstring)."""
    z, y = _data(seed=12)
    torch.testing.assert_close(ls.entmax_bisect_loss(z, y, torch.tensor(1.5)), ls.entmax15_loss(z, y))
    a = torch.linspace(1.0, 2.5, z.shape[0], dtype=z.dtype)
    per_row = torch.stack([ls.entmax_bisect_loss(z[i : i + 1], y[i : i + 1], float(a[i])) for i in range(len(a))])
    torch.testing.assert_close(ls.entmax_bisect_loss(z, y, a), per_row.view(-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ls.EntmaxBisectLoss(a.view(-1, 1), reduction="none")(z, y), per_row.view(-1))
