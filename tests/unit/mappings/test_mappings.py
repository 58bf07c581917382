"""α-entmax values and gradients against float64 references and the `entmax` package (1.3), on both
solver paths (fused CPU kernel, pure PyTorch); robustness and error handling; torch.compile."""

from __future__ import annotations

import entmax as E
import pytest
import torch
from helpers.mappings import ALPHAS, boundary_margin, ref_entmax, ref_exact, spaced_scores

import longsparse as ls

TOL = 1e-6  # acceptance: max abs error of fp32 input vs the float64 reference

# (shape, dim): 1-D, 2-D along either axis, the middle dim of 3-D / 4-D tensors, long rows, n = 1, 2
CASES = [
    ((11,), -1),
    ((6, 33), -1),
    ((6, 33), 0),
    ((6, 33), 1),
    ((3, 7, 5), 1),
    ((2, 3, 9, 4), 1),
    ((2, 3, 9, 4), 2),
    ((3, 257), -1),
    ((2, 1000), -1),
    ((5, 1), -1),
    ((40, 2), -1),
]
SCALES = [0.1, 1.0, 3.0, 30.0]


def _inputs(shape, scale, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * scale


# ----------------------------------------------------------------------------- the references themselves


def test_references_agree():
    """The bisection reference and the exact sort-based solve agree (and with the package's exact
    float64 entmax15/sparsemax), so either can serve as the oracle."""
    x = _inputs((300, 17), 3.0, 0).double()
    for alpha, pkg in ((1.5, E.entmax15), (2.0, E.sparsemax)):
        r = ref_entmax(x, alpha)
        assert (r - ref_exact(x, alpha)).abs().max() < 1e-14
        assert (r - pkg(x, dim=-1)).abs().max() < 1e-14
    # softmax limit: α → 1 approaches softmax
    assert (ref_entmax(x, 1.0001) - torch.softmax(x, -1)).abs().max() < 1e-3


# ----------------------------------------------------------------------------- values


@pytest.mark.parametrize("alpha", ALPHAS)
def test_values_vs_float64_reference(path, alpha):
    worst = 0.0
    for i, (shape, dim) in enumerate(CASES):
        for j, scale in enumerate(SCALES):
            x = _inputs(shape, scale, 100 * i + j)
            p = ls.entmax(x, alpha, dim=dim)
            assert p.dtype == torch.float32 and p.shape == x.shape
            err = (p.double() - ref_entmax(x, alpha, dim)).abs().max().item()
            worst = max(worst, err)
    assert worst <= TOL, f"alpha={alpha}: max abs error {worst:.3e}"


@pytest.mark.parametrize("alpha", ALPHAS)
def test_tensor_alpha_values_match_float_alpha(path, alpha):
    x = _inputs((4, 3, 6, 10), 2.0, 7)
    ref = ref_entmax(x, alpha, -1)
    for a in (torch.tensor(alpha), torch.full((3,), alpha), torch.full((3, 1, 1), alpha)):
        p = ls.entmax(x, a, dim=-1)
        assert (p.double() - ref).abs().max() <= TOL


def test_named_functions_vs_entmax_package(path):
    for i, (shape, dim) in enumerate(CASES):
        x = _inputs(shape, 2.0, i)
        x64 = x.double()
        assert (ls.entmax15(x, dim=dim).double() - E.entmax15(x64, dim=dim)).abs().max() <= TOL
        assert (ls.sparsemax(x, dim=dim).double() - E.sparsemax(x64, dim=dim)).abs().max() <= TOL
        for alpha in (1.25, 1.75, 3.0):
            ref = E.entmax_bisect(x64, alpha, dim=dim, n_iter=100)
            assert (ls.entmax(x, alpha, dim=dim).double() - ref).abs().max() <= TOL
        # the package's own fp32 sort-based mappings agree with ours to fp32 round-off
        assert (ls.entmax15(x, dim=dim) - E.entmax15(x, dim=dim)).abs().max() <= 2e-6


def test_alpha_one_is_softmax(path):
    x = _inputs((5, 3, 12), 3.0, 1)
    for dim in (0, 1, -1):
        torch.testing.assert_close(ls.entmax(x, 1.0, dim=dim), torch.softmax(x, dim), rtol=0, atol=1e-7)
        torch.testing.assert_close(ls.entmax(x, 1, dim=dim), torch.softmax(x, dim), rtol=0, atol=1e-7)


def test_per_head_alpha_is_read_per_head(path):
    """A 1-D α of length x.shape[1] is per head for (B, H, N, N) scores, whatever dim is mapped
    (except dim = 1 itself)."""
    x = _inputs((2, 3, 5, 5), 2.0, 3)
    alphas = [1.3, 1.6, 2.5]
    for dim in (-1, 2):
        p = ls.entmax(x, torch.tensor(alphas), dim=dim)
        for h, a in enumerate(alphas):
            assert (p[:, h] - ls.entmax(x[:, h], a, dim=dim - 1 if dim > 0 else dim)).abs().max() <= 1e-6


def test_long_rows_and_many_rows(path):
    x = _inputs((3, 4096), 4.0, 11)
    for alpha in (1.5, 2.0, 1.3):
        assert (ls.entmax(x, alpha).double() - ref_entmax(x, alpha)).abs().max() <= TOL
    x = _inputs((2000, 7), 2.0, 12)
    assert (ls.entmax15(x).double() - ref_exact(x, 1.5)).abs().max() <= TOL


def _generic_alpha_rows(n: int, seed: int) -> torch.Tensor:
    """Rows that steer the generic-α kernel path (a lower bound on τ from a pass over the row, Halley
    steps with vectorised powers) into its corners: Gaussian rows of several scales, a row of ties,
    logits around 1e4 (fp32 row sums lose digits there), a row with −inf entries, a one-hot-like row."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randn(n, generator=g) * s for s in (0.25, 1.0, 2.0, 8.0)]
    rows.append(torch.full((n,), 0.5))
    rows.append(1e4 + torch.randn(n, generator=g))
    r = torch.randn(n, generator=g)
    r[1::3] = float("-inf")
    rows.append(r)
    r = torch.randn(n, generator=g) * 0.1
    r[n // 2] = 40.0
    rows.append(r)
    return torch.stack(rows)


@pytest.mark.parametrize("n", [1, 7, 1027, 8193])
@pytest.mark.parametrize("alpha", [1.1, 1.3, 1.6, 1.9])
def test_generic_alpha_long_rows_values_and_grads(path, alpha, n):
    x = _generic_alpha_rows(n, int(alpha * 100) + n)
    ref = ref_entmax(x, alpha)
    xx = x.clone().requires_grad_()
    p = ls.entmax(xx, alpha)
    assert (p.double() - ref).abs().max().item() <= TOL
    assert ((p.double().sum(-1) - 1).abs() <= 1e-5).all()
    # exact zeros outside the support (entries of the float64 reference that fp32 can hold)
    assert (p[ref == 0] == 0).all() and (p[ref > 1e-30] > 0).all()
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(n))
    p.backward(g)
    # float64 reference gradient from the reference output: u = p^(2−α), dz = u g − u Σug/Σu
    u = torch.where(ref > 0, ref.pow(2 - alpha), torch.zeros((), dtype=torch.float64))
    gd = g.double()
    dz = u * gd - u * (u * gd).sum(-1, keepdim=True) / u.sum(-1, keepdim=True)
    assert (xx.grad.double() - dz).abs().max().item() <= TOL


# ----------------------------------------------------------------------------- gradients wrt x


@pytest.mark.parametrize("alpha", ALPHAS)
def test_grad_x_vs_float64_reference(path, alpha):
    """fp32 gradient for a random upstream gradient vs the `entmax` package's float64 autograd
    (entmax_bisect, 100 bisection steps: float64 bisection of the unit bracket converges in ~55)."""
    worst = 0.0
    for i, (shape, dim) in enumerate(CASES):
        x = _inputs(shape, 2.0, 500 + i)
        g = _inputs(shape, 1.0, 900 + i)
        xx = x.clone().requires_grad_()
        ls.entmax(xx, alpha, dim=dim).backward(g)
        assert xx.grad.dtype == torch.float32
        xr = x.double().requires_grad_()
        E.entmax_bisect(xr, alpha, dim=dim, n_iter=100).backward(g.double())
        worst = max(worst, (xx.grad.double() - xr.grad).abs().max().item())
    assert worst <= TOL, f"alpha={alpha}: max abs grad error {worst:.3e}"


@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.25, 1.75, 3.0])
def test_gradcheck_float64(path, alpha):
    x = spaced_scores(2, 7, seed=int(alpha * 10)).requires_grad_()
    assert boundary_margin(x, alpha) > 1e-3  # no entry near the support boundary
    fn = {1.5: ls.entmax15, 2.0: ls.sparsemax}.get(alpha, lambda t: ls.entmax(t, alpha))
    assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-6, rtol=1e-5)
    # along another dim too
    x2 = spaced_scores(2, 6, seed=1).T.requires_grad_()  # non-contiguous, rows along dim 0
    assert torch.autograd.gradcheck(lambda t: ls.entmax(t, alpha, dim=0), (x2,), eps=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- gradients wrt α


def _pkg_alpha_grad(x64, alpha64, g64, dim=-1):
    """(∂/∂x, ∂/∂α) from the `entmax` package in float64; α must broadcast its way (H, 1, 1)."""
    xr = x64.clone().requires_grad_()
    ar = alpha64.clone().requires_grad_()
    E.entmax_bisect(xr, ar, dim=dim, n_iter=100).backward(g64)
    return xr.grad, ar.grad


@pytest.mark.parametrize("alpha_shape", ["scalar", "(H,)", "(H,1,1)"])
def test_alpha_grad_vs_entmax_package(path, alpha_shape):
    B, H, N = 2, 3, 6
    x = _inputs((B, H, N, N), 2.0, 21).double()
    g = _inputs((B, H, N, N), 1.0, 22).double()
    per_head = torch.tensor([1.3, 1.6, 2.5], dtype=torch.float64)
    if alpha_shape == "scalar":
        a, pkg_a = torch.tensor(1.4, dtype=torch.float64), torch.tensor(1.4, dtype=torch.float64)
    elif alpha_shape == "(H,)":
        a, pkg_a = per_head.clone(), per_head.view(H, 1, 1)
    else:
        a, pkg_a = per_head.view(H, 1, 1).clone(), per_head.view(H, 1, 1)
    gx_ref, ga_ref = _pkg_alpha_grad(x, pkg_a, g)
    ga_ref = ga_ref.reshape(a.shape)

    # float64: tight
    xx, aa = x.clone().requires_grad_(), a.clone().requires_grad_()
    ls.entmax(xx, aa).backward(g)
    assert aa.grad.shape == a.shape
    torch.testing.assert_close(aa.grad, ga_ref, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(xx.grad, gx_ref, rtol=1e-8, atol=1e-10)

    # float32 x and α: ∂p/∂α carries a 1/(α−1)² factor on differences of O(1) terms, so its fp32
    # round-off is ≈ eps32/(α−1)² relative (≈ 1.3e-6 at α = 1.3); x's gradient stays at 1e-6 absolute
    xx, aa = x.float().requires_grad_(), a.float().requires_grad_()
    ls.entmax(xx, aa).backward(g.float())
    assert aa.grad.dtype == torch.float32
    torch.testing.assert_close(aa.grad.double(), ga_ref, rtol=2e-5, atol=1e-6)
    assert (xx.grad.double() - gx_ref).abs().max() <= TOL


@pytest.mark.parametrize("alpha", [1.01, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0])
def test_alpha_grad_each_alpha_float64(path, alpha):
    x = _inputs((16, 9), 2.0, int(alpha * 100)).double()
    g = _inputs((16, 9), 1.0, 1).double()
    a = torch.full((16, 1), alpha, dtype=torch.float64)
    _, ga_ref = _pkg_alpha_grad(x, a, g)
    aa = a.clone().requires_grad_()
    ls.entmax(x, aa).backward(g)
    torch.testing.assert_close(aa.grad, ga_ref, rtol=1e-7, atol=1e-9)
    # fp32 x and α: ∂p/∂α = (p − û)/(α−1)² − …: O(1) terms that cancel, times 1/(α−1)², so its fp32
    # round-off is ≈ eps32/(α−1)² in absolute terms (|g| ~ 1): 1.2e-5 at α = 1.1, 1e-6 at 1.35, 1.2e-7
    # at 2. Below α = 1.1 the solve (and the saved p) is float64, which removes it.
    aa = a.float().requires_grad_()
    ls.entmax(x.float(), aa).backward(g.float())
    eps32 = torch.finfo(torch.float32).eps
    atol = 1e-6 if alpha < 1.1 else max(1e-6, 8 * eps32 / (alpha - 1) ** 2)
    torch.testing.assert_close(aa.grad.double(), ga_ref, rtol=0, atol=atol)


def test_gradcheck_x_and_alpha_per_head(path):
    B, H, N = 1, 3, 4
    x = spaced_scores(B, H, N, N, seed=3).requires_grad_()
    for a in (
        torch.tensor([1.3, 1.7, 2.4], dtype=torch.float64),
        torch.tensor([1.3, 1.7, 2.4], dtype=torch.float64).view(H, 1, 1),
        torch.tensor(1.6, dtype=torch.float64),
    ):
        assert boundary_margin(x, a.view(-1, 1, 1) if a.dim() == 1 else a) > 1e-3
        a = a.requires_grad_()
        assert torch.autograd.gradcheck(lambda t, al: ls.entmax(t, al), (x, a), eps=1e-6, atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------- robustness

ROBUST_ALPHAS = [1.0, 1.5, 2.0, 1.25, 3.0, "tensor"]


def _call(x, alpha, dim=-1):
    if alpha == "tensor":
        return ls.entmax(x, torch.tensor([1.3, 1.6, 2.5][: x.shape[1]]), dim=dim)
    return ls.entmax(x, alpha, dim=dim)


@pytest.mark.parametrize("alpha", ROBUST_ALPHAS)
def test_fully_masked_rows(path, alpha):
    x = torch.randn(2, 3, 4, 6)
    x[0, 1, 2] = float("-inf")  # one fully masked row
    x[1, :, 0] = float("-inf")  # fully masked rows in every head
    x[1, 2, 3, :3] = float("-inf")  # a row mixing −inf and finite
    x = x.requires_grad_()
    p = _call(x, alpha)
    assert not torch.isnan(p).any()
    assert (p[0, 1, 2] == 0).all() and (p[1, :, 0] == 0).all()
    assert (p[1, 2, 3, :3] == 0).all()
    sums = p.sum(-1)
    sums_expected = torch.ones_like(sums)
    sums_expected[0, 1, 2] = 0
    sums_expected[1, :, 0] = 0
    torch.testing.assert_close(sums, sums_expected, rtol=0, atol=1e-6)
    # the mixed row equals the mapping of its finite part
    sub = _call(x.detach()[1:2, :, 3:4, 3:], alpha)
    assert (p[1, 2, 3, 3:] - sub[0, 2, 0]).abs().max() <= 1e-6
    g = torch.randn_like(p)
    p.backward(g)
    assert not torch.isnan(x.grad).any()
    assert (x.grad[0, 1, 2] == 0).all() and (x.grad[1, :, 0] == 0).all()
    assert (x.grad[1, 2, 3, :3] == 0).all()


def test_fully_masked_rows_alpha_grad(path):
    x = torch.randn(2, 3, 4, 5)
    x[0, 0] = float("-inf")
    a = torch.tensor([1.3, 1.6, 2.5], requires_grad=True)
    p = ls.entmax(x, a)
    p.backward(torch.randn_like(p))
    assert torch.isfinite(a.grad).all()
    # a head whose rows are all masked gets α-gradient only from its unmasked batch element
    x2 = x.clone()
    x2[:, 0] = float("-inf")
    a2 = a.detach().clone().requires_grad_()
    ls.entmax(x2, a2).backward(torch.randn_like(p))
    assert a2.grad[0] == 0 and torch.isfinite(a2.grad).all()


@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.25, 3.0])
def test_huge_and_tiny_logits(path, alpha):
    g = torch.Generator().manual_seed(5)
    huge = (torch.rand(8, 16, generator=g) * 2 - 1) * 1e4
    huge[0] = torch.tensor([1e4, -1e4] * 8)
    tiny = torch.randn(8, 16, generator=g) * 1e-8
    for x in (huge, tiny):
        p = ls.entmax(x, alpha)
        assert torch.isfinite(p).all()
        assert (p.double() - ref_entmax(x, alpha)).abs().max() <= TOL
    # 1e-8-scale logits: essentially uniform
    assert (ls.entmax(tiny, alpha) - 1 / 16).abs().max() < 1e-6
    # huge logits separate completely: all mass on the max (row 0 has 8 tied maxima: 1/8 each)
    p = ls.entmax(huge, alpha)
    assert (p[1:].max(-1).values == 1).all()
    torch.testing.assert_close(p[0], torch.tensor([1 / 8, 0.0] * 8), rtol=0, atol=1e-7)


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 1.25, 3.0])
def test_ties(path, alpha):
    x = torch.zeros(3, 8)
    x[1] = 5.0
    x[2, :3] = 2.0  # three tied maxima, the rest lower
    p = ls.entmax(x, alpha)
    torch.testing.assert_close(p[0], torch.full((8,), 1 / 8), rtol=0, atol=1e-7)
    torch.testing.assert_close(p[1], torch.full((8,), 1 / 8), rtol=0, atol=1e-7)
    assert (p[2, :3] == p[2, 0]).all()
    assert (p[2].double() - ref_entmax(x[2], alpha)).abs().max() <= TOL


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.25, 3.0, "tensor"])
def test_half_precision(path, dtype, alpha):
    eps = torch.finfo(dtype).eps
    x = _inputs((4, 3, 50), 2.0, 9).to(dtype)
    p = _call(x, alpha)
    assert p.dtype == dtype
    assert (p.float().sum(-1) - 1).abs().max() <= eps  # the row sums to 1 in its own precision
    p32 = _call(x.float(), alpha)
    # the same input values solved in fp32, rounded to the half type: within half an ulp (+ fp16 subnormals)
    assert ((p.float() - p32).abs() <= p32 * eps / 2 + 1e-7).all()
    xx = x.clone().requires_grad_()
    _call(xx, alpha).backward(torch.ones_like(p))
    assert xx.grad.dtype == dtype and torch.isfinite(xx.grad.float()).all()


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 1.25, "tensor"])
def test_empty_dims(path, alpha):
    for shape, dim in (((3, 2, 0), -1), ((0, 3, 5), -1), ((2, 3, 0, 4), 2), ((0, 3, 4), 1)):
        if alpha == "tensor" and dim == 1:
            continue
        x = torch.randn(shape, requires_grad=True)
        p = _call(x, alpha, dim)
        assert p.shape == x.shape and p.dtype == x.dtype
        p.sum().backward()
        assert x.grad.shape == x.shape


def test_errors():
    x = torch.randn(3, 5)
    with pytest.raises(ValueError):
        ls.entmax(x, torch.linspace(1.2, 2.0, 5))  # α varying along the mapped axis, not per row
    for bad in (0.0, -1.0, float("nan"), float("inf")):  # α in (0, 1) is the dense Tsallis map
        with pytest.raises(ValueError, match="alpha must be a finite number > 0"):
            ls.entmax(x, bad)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        ls.entmax(x, torch.tensor([1.5, 0.0, 1.5]).view(3, 1))
    with pytest.raises(ValueError, match="alpha must be a finite number >= 1"):  # attention keeps α >= 1
        ls.attention(*(torch.randn(1, 1, 4, 8) for _ in range(3)), alpha=0.5)
    for bad in (float("inf"), float("nan")):  # a tensor α must be finite (α = 1 rows are softmax)
        with pytest.raises(ValueError, match="alpha must be finite"):
            ls.entmax(x, torch.tensor([1.5, bad, 1.5]).view(3, 1))
    y = x.clone()
    y[1, 2] = float("nan")
    for fn in (
        ls.entmax15,
        ls.sparsemax,
        lambda t: ls.entmax(t, 1.3),
        lambda t: ls.entmax(t, 1.0),
        lambda t: ls.entmax(t, torch.tensor(1.3)),
    ):
        with pytest.raises(ValueError, match="NaN"):
            fn(y)
    y[1, 2] = float("inf")
    for fn in (ls.entmax15, lambda t: ls.entmax(t, 1.3), lambda t: ls.entmax(t, 1.0)):
        with pytest.raises(ValueError, match=r"\+inf"):
            fn(y)
    for dim in (2, -3, 5):
        with pytest.raises(IndexError):
            ls.entmax15(x, dim=dim)
    with pytest.raises(TypeError):
        ls.entmax15(torch.arange(5))
    with pytest.raises(TypeError):
        ls.sparsemax(torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError):
        ls.entmax15(torch.tensor(1.0))  # 0-d
    s = torch.randn(2, 3, 4, 4)
    for a in (
        torch.full((5,), 1.5),
        torch.full((2, 3), 1.5),
        torch.full((1, 1, 1, 1, 1), 1.5),
        torch.full((4, 1, 1), 1.5),
    ):
        with pytest.raises(ValueError):
            ls.entmax(s, a)


# ----------------------------------------------------------------------------- torch.compile


def _check_compiled(backend):
    torch._dynamo.reset()
    x = _inputs((4, 3, 16), 2.0, 31)
    x[0, 0] = float("-inf")  # a fully masked row
    fns = {
        "entmax15": lambda t: ls.entmax15(t),
        "sparsemax": lambda t: ls.sparsemax(t, dim=1),
        "entmax(1.3)": lambda t: ls.entmax(t, 1.3),
    }
    for name, fn in fns.items():
        compiled = torch.compile(fn, fullgraph=True, backend=backend)
        xx, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        pe, pc = fn(xx), compiled(xc)
        assert not torch.isnan(pc).any(), name
        assert (
            pc.double()
            - ref_entmax(x, {"entmax15": 1.5, "sparsemax": 2.0}.get(name, 1.3), 1 if name == "sparsemax" else -1)
        ).abs().max() <= TOL, name
        assert (pc.double() - pe.double()).abs().max() <= TOL, name
        g = torch.randn_like(pe)
        pe.backward(g)
        pc.backward(g)
        assert (xc.grad - xx.grad).abs().max() <= 1e-6, name


def test_torch_compile_fullgraph_traces():
    """Dynamo captures each entry point as one graph (fullgraph=True: any graph break raises) and
    the traced program matches eager. backend="eager" runs the captured graph without code
    generation, so this stays fast; the inductor run is the slow test below."""
    _check_compiled("eager")


@pytest.mark.slow
def test_torch_compile_fullgraph_inductor():
    """Same with the default inductor backend (C++ codegen): ~100 s on 2 CPU cores, hence slow."""
    _check_compiled("inductor")
