"""The mapping tests' oracles: float64 brute-force references of α-entmax, and a switch between the two
solver paths of longsparse.mappings.entmax (the fused CPU kernel and the pure-PyTorch solver, which is what
runs under torch.compile and on non-CPU devices)."""

from __future__ import annotations

import contextlib
import importlib
import math

import pytest
import torch

M = importlib.import_module("longsparse.mappings.entmax")  # the module (the package re-exports a function of that name)

ALPHAS = [1.01, 1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0]


def kernel_available() -> bool:
    from longsparse import cpu_kernel

    return cpu_kernel.get() is not None


@contextlib.contextmanager
def solver_path(name: str):
    """Run the mappings through one solver: "kernel" (fused C++ CPU kernel) or "torch" (pure PyTorch)."""
    if name == "kernel":
        if not kernel_available():
            pytest.skip("fused CPU kernel not available")
        yield
        return
    assert name == "torch"
    orig = M._use_kernel
    M._use_kernel = lambda z: False
    try:
        yield
    finally:
        M._use_kernel = orig


PATHS = ["kernel", "torch"]


# ----------------------------------------------------------------------------- references


def _row_alpha64(alpha, x: torch.Tensor, dim: int) -> torch.Tensor:
    """alpha as float64, broadcast to x's shape with `dim` of size 1, then moved last."""
    shape = list(x.shape)
    shape[dim] = 1
    a = torch.as_tensor(alpha, dtype=torch.float64)
    return torch.broadcast_to(a, shape).movedim(dim, -1)


def ref_entmax(x: torch.Tensor, alpha, dim: int = -1, iters: int = 200) -> torch.Tensor:
    """α-entmax by float64 bisection on τ (up to 200 halvings, stopping once the bracket is down to
    adjacent doubles, which takes ~55 from the unit bracket),
    then p = [X − τ]₊^{1/(α−1)} renormalised. α: float or tensor broadcastable to the rows (dim size 1).
    α = 1 is softmax. All −inf rows give zeros."""
    dim = dim % x.dim()
    x = x.detach().to(torch.float64)
    if not isinstance(alpha, torch.Tensor) and alpha == 1:
        p = torch.softmax(x, dim)
        return torch.nan_to_num(p, nan=0.0)
    xt = x.movedim(dim, -1)
    a = _row_alpha64(alpha, x, dim)
    n = xt.shape[-1]
    m = xt.amax(-1, keepdim=True)
    masked = torch.isneginf(m)
    m = torch.where(masked, torch.zeros_like(m), m)
    X = (xt - m) * (a - 1)
    lo = -torch.ones_like(m * a)
    hi = -(float(n) ** (1 - a)) * torch.ones_like(lo)
    e = 1 / (a - 1)
    for _ in range(iters):
        mid = (lo + hi) / 2
        if bool(((mid == lo) | (mid == hi)).all()):
            break  # the bracket is down to adjacent doubles: further halvings change nothing
        f = (X - mid).clamp_min(0).pow(e).sum(-1, keepdim=True) - 1
        lo = torch.where(f >= 0, mid, lo)
        hi = torch.where(f < 0, mid, hi)
    p = (X - lo).clamp_min(0).pow(e)
    p = p / p.sum(-1, keepdim=True)
    p = torch.where(masked, torch.zeros_like(p), p)
    return p.movedim(-1, dim)


def ref_exact(x: torch.Tensor, alpha: float, dim: int = -1) -> torch.Tensor:
    """Exact α = 1.5 / α = 2 by sorting and trying every candidate support size k (float64):
    τ_k solves Σ_{i≤k} (X_(i) − τ)^{1/(α−1)} = 1 in closed form; the support is the largest k
    with X_(k) > τ_k."""
    assert alpha in (1.5, 2.0)
    dim = dim % x.dim()
    xt = x.detach().to(torch.float64).movedim(dim, -1)
    X = (xt - xt.amax(-1, keepdim=True)) * (alpha - 1)
    Xs, _ = torch.sort(X, -1, descending=True)
    k = torch.arange(1, X.shape[-1] + 1, dtype=torch.float64)
    c1 = Xs.cumsum(-1)
    if alpha == 2.0:
        tau = (c1 - 1) / k
    else:
        mean = c1 / k
        ss = (Xs * Xs).cumsum(-1) / k - mean * mean  # variance of the top k
        tau = mean - torch.sqrt(((1 / k) - ss).clamp_min(0))
    ok = Xs > tau
    kstar = ok.to(torch.int64).cumprod(-1).sum(-1, keepdim=True)  # supports are prefixes of the sort
    t = tau.gather(-1, kstar - 1)
    p = (X - t).clamp_min(0) ** (1 / (alpha - 1))
    return p.movedim(-1, dim)


def boundary_margin(x: torch.Tensor, alpha, dim: int = -1) -> float:
    """Smallest |(α−1)(x − max) − τ| over a tensor: how far the nearest entry is from entering or
    leaving the support (gradcheck needs this to exceed its finite-difference step)."""
    dim = dim % x.dim()
    x64 = x.detach().double()
    p = ref_entmax(x64, alpha, dim)
    a = _row_alpha64(alpha, x64, dim).movedim(-1, dim)
    X = (x64 - x64.amax(dim, keepdim=True)) * (a - 1)
    # τ from any support entry: p^{α−1} = X − τ
    tau = (X - p.pow(a - 1)).where(p > 0, torch.full_like(X, -math.inf)).amax(dim, keepdim=True)
    return float((X - tau).abs().min())


def spaced_scores(*shape, spacing: float = 0.3, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    """Scores whose entries in each row are well separated (random permutations of a grid plus small
    jitter), so no entry sits near the support boundary or ties with another."""
    g = torch.Generator().manual_seed(seed)
    n = shape[-1]
    rows = math.prod(shape[:-1])
    perm = torch.stack([torch.randperm(n, generator=g) for _ in range(rows)]).to(dtype)
    jitter = torch.rand(rows, n, generator=g, dtype=dtype) * spacing * 0.1
    return (perm * spacing + jitter).reshape(shape)
