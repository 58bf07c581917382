"""The α-entmax family: p_j = [(α−1)·z_j − τ]₊^{1/(α−1)}, Σ p = 1.

One threshold solver serves every α > 1 (α = 1 is softmax; 0 < α < 1 is the dense Tsallis map, below):

* rows are shifted by their max and scaled by (α−1), so τ lies in [−1, −n^{1−α}] (docs/method.md §1);
* a bracketed Newton iteration from τ₀ = −1 (monotone, no overshoot for 1 < α ≤ 2; for α > 2 a
  step leaving the bracket is replaced by bisection) runs until τ stops moving;
* α = 1.5 and α = 2 then finish in closed form on the found support (exact), other α renormalise
  the output (removes the common-mode error of τ, leaving fp32 round-off).

The solve runs in float32 (float64 for float64 input) and the result is cast back, so half-precision
inputs give rows that sum to 1 in their own precision. Rows that are entirely −inf give zeros (as
torch SDPA does), never NaN. The backward needs only the output p:
    ∂L/∂z = u⊙g − u·(Σ u g)/(Σ u),  u = p^{2−α}.

0 < α < 1 (the ``entmax`` package accepts it): the exponent 1/(α−1) is negative, so every unmasked entry is
positive, p_j = (t + (1−α)(max z − z_j))^{−1/(1−α)} with t ∈ [1, n^{1−α}]; Σ p − 1 is decreasing and convex
in t, so Newton from t = 1 climbs to the root without overshoot (`_dense_t`). The same backward holds.
"""

from __future__ import annotations

import math
import numbers
from typing import Union

import torch
from torch import Tensor

from longsparse import cpu_kernel

AlphaLike = Union[float, int, Tensor]

_MAX_ITER = 50  # bisection alone would reach 2^-50 on the unit bracket
_COMPILED_ITER = 24  # fixed count when traced by torch.compile (no data-dependent exit)


# ----------------------------------------------------------------------------- input checks


def _check_input(x: Tensor, dim: int) -> int:
    if not isinstance(x, Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"entmax needs a floating-point tensor, got dtype {x.dtype}")
    if x.dim() == 0:
        raise ValueError("entmax needs at least one dimension (got a 0-d tensor)")
    if not -x.dim() <= dim < x.dim():
        raise IndexError(f"dim {dim} is out of range for a tensor with {x.dim()} dimensions")
    return dim % x.dim()


def _check_finite_rows(row_max: Tensor) -> None:
    """NaN or +inf anywhere in a row shows up in its max (amax propagates NaN); checking the
    row maxima costs one row-sized reduction instead of a pass over the scores."""
    if torch.compiler.is_compiling():
        return
    if torch.isnan(row_max).any():
        _reject_input(1)
    if torch.isposinf(row_max).any():
        _reject_input(2)


def _reject_input(problem: int) -> None:
    """problem 1: a NaN, 2: a +inf among the scores (the fused kernel's codes)."""
    if problem == 1:
        raise ValueError("entmax input contains NaN")
    raise ValueError("entmax input contains +inf (use -inf to mask entries)")


def _compute_dtype(dtype: torch.dtype, alpha: AlphaLike = 1.5) -> torch.dtype:
    """float32, or float64 for float64 input and for α > 2, where p = d^{1/(α−1)} is so steep at the
    support boundary that fp32 rounding of the scaled scores alone costs ~1e-5 in p; likewise for
    1 < α < 1.1, where the power 1/(α−1) > 10 amplifies the fp32 rounding of d = X − τ (relative
    2^-24) into p (α = 1.01: up to ~1.3e-6 absolute in p, and ~1e-3 relative in ∂L/∂α, whose
    1/(α−1)² factor cancels O(1) terms)."""
    if dtype == torch.float64:
        return torch.float64
    # 0.9 < α < 1: the exponent −1/(1−α) < −10 amplifies rounding the same way
    if isinstance(alpha, Tensor):
        steep = (alpha > 2) | ((alpha > 1) & (alpha < 1.1)) | ((alpha > 0.9) & (alpha < 1))
        if not torch.compiler.is_compiling() and bool(steep.any()):
            return torch.float64
    elif alpha > 2 or 1 < alpha < 1.1 or 0.9 < alpha < 1:
        return torch.float64
    return torch.float32


def _alpha_view(alpha: Tensor, x: Tensor, dim: int) -> Tensor:
    """Shape α to broadcast against x with the mapped axis kept as size 1.

    Standard broadcasting applies, with one convenience: a 1-D α of length x.shape[1] is per-head
    for (B, H, ...) inputs and is viewed as (1, H, 1, ...)."""
    if not alpha.is_floating_point():
        alpha = alpha.to(torch.get_default_dtype())
    if alpha.dim() == 1 and alpha.numel() > 1 and x.dim() >= 2 and alpha.numel() == x.shape[1] and dim != 1:
        alpha = alpha.view(1, -1, *([1] * (x.dim() - 2)))
    row_shape = list(x.shape)
    row_shape[dim] = 1
    try:
        # α must broadcast *to* the row shape: mutual broadcasting is not enough, since an α that
        # is not 1 along the mapped axis (e.g. shape (n,) for rows of length n) would otherwise
        # be applied per column (pure-PyTorch solver) or crash the CPU kernel's expand.
        if torch.broadcast_shapes(alpha.shape, tuple(row_shape)) != torch.Size(row_shape):
            raise RuntimeError
    except RuntimeError:
        raise ValueError(
            f"alpha of shape {tuple(alpha.shape)} does not broadcast over the rows of x "
            f"{tuple(x.shape)} (dim={dim}); use a float, shape (H,) for (B, H, ...) scores, or a "
            f"shape broadcastable to {tuple(row_shape)}"
        ) from None
    if alpha.dim() > x.dim():
        raise ValueError(f"alpha has more dimensions ({alpha.dim()}) than x ({x.dim()})")
    return alpha


def _check_alpha_values(alpha: AlphaLike, dense: bool = False) -> None:
    """α must be finite and ≥ 1 (α = 1 is softmax), as a number or in every entry of a tensor; with ``dense``
    any α > 0 (0 < α < 1: the dense Tsallis maps, which only the mapping functions take, not attention)."""
    bound = "> 0 (1 is softmax, below 1 dense)" if dense else ">= 1 (1 is softmax)"
    if isinstance(alpha, Tensor):
        if torch.compiler.is_compiling():
            return
        a = alpha.detach()
        if not bool(torch.isfinite(a).all()):
            bad = "NaN" if bool(a.isnan().any()) else "inf"
            raise ValueError(f"alpha must be finite; got a tensor containing {bad}")
        if bool((a <= 0).any() if dense else (a < 1).any()):
            raise ValueError(f"alpha must be {bound}; got min {a.min().item():.4g}")
    else:
        if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
            raise TypeError(f"alpha must be a number or a tensor; got {type(alpha).__name__}")
        if not math.isfinite(alpha) or (alpha <= 0 if dense else alpha < 1):
            raise ValueError(f"alpha must be a finite number {bound}; got {alpha}")


# ----------------------------------------------------------------------------- the solver


def _safe_softmax(z: Tensor, dim: int) -> Tensor:
    """softmax whose fully masked (all −inf) rows are zeros instead of NaN."""
    row_max = z.amax(dim, keepdim=True)
    p = torch.softmax(z, dim)
    return torch.where(row_max == float("-inf"), p.new_zeros(()), p)


def _shifted_scores(z: Tensor, am1: Union[float, Tensor], dim: int):
    """X = (α−1)(z − max z) in the compute dtype; returns X and the fully-masked-row indicator."""
    row_max = z.amax(dim, keepdim=True)
    _check_finite_rows(row_max)
    masked = row_max == float("-inf")
    row_max = torch.where(masked, z.new_zeros(()), row_max)
    return (z - row_max) * am1, masked


def _newton_tau(X: Tensor, alpha: Union[float, Tensor], dim: int) -> Tensor:
    """Bracketed Newton solve of Σ [X − τ]₊^{1/(α−1)} = 1 for τ (X has row max 0)."""
    n = X.shape[dim]
    am1 = alpha - 1
    exponent = 1.0 / am1
    shape = list(X.shape)
    shape[dim] = 1
    lo = X.new_full(shape, -1.0)  # f(lo) ≥ 0
    hi = -(X.new_full(shape, float(n)) ** (-am1))  # f(hi) ≤ 0
    tau = lo.clone()
    width = 2 * (hi - lo)
    tol = 4 * torch.finfo(X.dtype).eps
    compiling = torch.compiler.is_compiling()
    # 1 < α ≤ 2: Newton from the left is monotone; α > 2 may need bisection (one bit per step)
    monotone = (
        bool((alpha <= 2).all())
        if isinstance(alpha, Tensor) and not compiling
        else (isinstance(alpha, float) and alpha <= 2)
    )
    iters = _COMPILED_ITER if compiling else (_MAX_ITER if monotone else 4 * _MAX_ITER)
    for _ in range(iters):
        d = (X - tau).clamp_min_(0)
        if isinstance(alpha, float) and alpha == 2.0:
            f = d.sum(dim, keepdim=True) - 1
            fprime = -(d > 0).sum(dim, keepdim=True).to(X.dtype)
        elif isinstance(alpha, float) and alpha == 1.5:
            f = (d * d).sum(dim, keepdim=True) - 1
            fprime = -2 * d.sum(dim, keepdim=True)
        else:
            pe = d.pow(exponent)
            f = pe.sum(dim, keepdim=True) - 1
            fprime = -exponent * (pe / d.clamp_min(torch.finfo(X.dtype).tiny)).sum(dim, keepdim=True)
        lo = torch.where(f > 0, tau, lo)
        hi = torch.where(f < 0, tau, hi)
        step = tau - f / fprime.clamp(max=-torch.finfo(X.dtype).tiny)
        inside = (step >= lo) & (step <= hi)
        new_tau = torch.where(inside, step, (lo + hi) / 2)
        if not monotone:
            # α > 2: Newton can crawl where f' blows up at the support boundary; a step that did not
            # halve the bracket becomes a bisection, and only a closed bracket ends the solve
            new_tau = torch.where(hi - lo > 0.5 * width, (lo + hi) / 2, new_tau)
            width = hi - lo
        new_tau = torch.where(f == 0, tau, new_tau)
        moved = (new_tau - tau).abs()
        tau = new_tau
        done = (hi - lo <= tol) | (f == 0) if not monotone else moved <= tol
        if not compiling and bool(done.all()):
            break
    return tau


def _dense_t(X: Tensor, alpha: Union[float, Tensor], dim: int) -> Tensor:
    """0 < α < 1: the t > 0 with Σ (t + X)^{−1/(1−α)} = 1, X = (1−α)(max z − z) ≥ 0 (+inf where masked). The sum
    is decreasing and convex in t and ≥ 1 at t = 1, ≤ 1 at t = n^{1−α}: Newton from t = 1 climbs monotonically;
    a step leaving the bracket (round-off) is replaced by bisection."""
    n = X.shape[dim]
    beta = 1 - alpha
    exponent = -1.0 / beta
    shape = list(X.shape)
    shape[dim] = 1
    lo = X.new_ones(shape)  # f(lo) ≥ 0
    hi = X.new_full(shape, float(n)) ** beta  # f(hi) ≤ 0
    t = lo.clone()
    tol = 4 * torch.finfo(X.dtype).eps
    for _ in range(_MAX_ITER):
        d = X + t
        p = d.pow(exponent)
        f = p.sum(dim, keepdim=True) - 1
        fprime = exponent * (p / d).sum(dim, keepdim=True)  # < 0
        lo = torch.where(f > 0, t, lo)
        hi = torch.where(f < 0, t, hi)
        step = t - f / fprime.clamp(max=-torch.finfo(X.dtype).tiny)
        new_t = torch.where((step >= lo) & (step <= hi), step, (lo + hi) / 2)
        new_t = torch.where(f == 0, t, new_t)
        done = (new_t - t).abs() <= tol * new_t
        t = new_t
        if not torch.compiler.is_compiling() and bool(done.all()):
            break
    return t


def _solve_dense(z: Tensor, alpha: Union[float, Tensor], dim: int) -> Tensor:
    """α-entmax for 0 < α < 1 (every entry of a tensor α): dense on the unmasked entries, renormalised."""
    X, masked = _shifted_scores(z, alpha - 1, dim)  # (α−1)(z − max) = (1−α)(max − z) ≥ 0
    t = _dense_t(X, alpha, dim)
    p = (X + t).pow(-1.0 / (1 - alpha))
    p = p / p.sum(dim, keepdim=True).clamp_min(torch.finfo(X.dtype).tiny)
    return torch.where(masked, p.new_zeros(()), p)


def _finish_entmax15(X: Tensor, tau: Tensor, dim: int) -> Tensor:
    """Exact τ for α = 1.5 on the support {X > τ}: Σ_S (X − τ)² = 1."""
    support = X > tau
    k = support.sum(dim, keepdim=True).clamp_min(1).to(X.dtype)
    Xs = torch.where(support, X, X.new_zeros(()))
    mean = Xs.sum(dim, keepdim=True) / k
    ss = torch.where(support, (X - mean) ** 2, X.new_zeros(())).sum(dim, keepdim=True)
    tau = mean - ((1 - ss).clamp_min(0) / k).sqrt()
    d = (X - tau).clamp_min_(0)
    return d * d


def _finish_sparsemax(X: Tensor, tau: Tensor, dim: int) -> Tensor:
    """Exact τ for α = 2 on the support {X > τ}: Σ_S (X − τ) = 1."""
    support = X > tau
    k = support.sum(dim, keepdim=True).clamp_min(1).to(X.dtype)
    tau = (torch.where(support, X, X.new_zeros(())).sum(dim, keepdim=True) - 1) / k
    return (X - tau).clamp_min_(0)


def _finish_generic(X: Tensor, tau: Tensor, alpha: Union[float, Tensor], dim: int) -> Tensor:
    p = (X - tau).clamp_min_(0).pow(1.0 / (alpha - 1))
    return p / p.sum(dim, keepdim=True).clamp_min(torch.finfo(X.dtype).tiny)


def _use_kernel(z: Tensor) -> bool:
    return not torch.compiler.is_compiling() and cpu_kernel.usable_on(z.device)


def _rows(t: Tensor, dim: int) -> Tensor:
    """t with `dim` moved last, as a contiguous (rows, n) matrix."""
    return t.movedim(dim, -1).contiguous().view(-1, t.shape[dim])


def _row_alpha(alpha: Union[float, Tensor], z: Tensor, dim: int) -> Tensor:
    shape = list(z.shape)
    shape[dim] = 1
    if isinstance(alpha, Tensor):
        a = alpha.detach().to(torch.float64).expand(shape)
        return a.movedim(dim, -1).reshape(-1).contiguous()
    return torch.full((z.numel() // z.shape[dim],), float(alpha), dtype=torch.float64, device=z.device)


def _kernel_forward(z: Tensor, alpha: Union[float, Tensor], dim: int) -> Tensor:
    # the kernel takes each row's max itself (the row is then in cache) and reports NaN / +inf rows
    p, bad = cpu_kernel.get().entmax_forward(_rows(z, dim), _row_alpha(alpha, z, dim))
    if bad:
        _reject_input(bad)
    moved = list(z.movedim(dim, -1).shape)
    return p.view(moved).movedim(-1, dim)


def entmax_forward(z: Tensor, alpha: Union[float, Tensor], dim: int) -> Tensor:
    """α-entmax of z (already in the compute dtype) along dim; alpha a float or a broadcast tensor
    in the compute dtype. No autograd: the Functions below wrap it. On CPU the fused kernel runs
    (it solves in double internally, softmax on its rows with α = 1); elsewhere, or without it, the
    pure-PyTorch solver. This and the kernel's row solver are where α = 1 becomes softmax: the
    threshold solve divides by α − 1."""
    if isinstance(alpha, float) and alpha == 1.0:
        _check_finite_rows(z.amax(dim, keepdim=True))
        return _safe_softmax(z, dim)
    if isinstance(alpha, float) and alpha < 1:
        return _solve_dense(z, alpha, dim)
    if isinstance(alpha, Tensor) and (torch.compiler.is_compiling() or bool((alpha < 1).any())):
        # rows with α < 1 take the dense solve, the others this function with a stand-in α on the dense rows
        dense = alpha < 1
        p = entmax_forward(z, torch.where(dense, torch.full_like(alpha, 2.0), alpha), dim)
        return torch.where(dense, _solve_dense(z, torch.where(dense, alpha, torch.full_like(alpha, 0.5)), dim), p)
    if _use_kernel(z):
        return _kernel_forward(z, alpha, dim)
    if isinstance(alpha, Tensor) and (torch.compiler.is_compiling() or bool((alpha == 1).any())):
        # rows with α = 1 are softmax; the solve runs them with a stand-in α (any > 1) and discards them
        at_one = alpha == 1
        p = _solve(z, torch.where(at_one, torch.full_like(alpha, 2.0), alpha), dim)
        return torch.where(at_one, _safe_softmax(z, dim), p)
    return _solve(z, alpha, dim)


def _solve(z: Tensor, alpha: Union[float, Tensor], dim: int) -> Tensor:
    """The pure-PyTorch α-entmax for α > 1 (every entry of a tensor α)."""
    X, masked = _shifted_scores(z, alpha - 1, dim)
    tau = _newton_tau(X, alpha, dim)
    if isinstance(alpha, float) and alpha == 1.5:
        p = _finish_entmax15(X, tau, dim)
    elif isinstance(alpha, float) and alpha == 2.0:
        p = _finish_sparsemax(X, tau, dim)
    else:
        p = _finish_generic(X, tau, alpha, dim)
    return torch.where(masked, p.new_zeros(()), p)


# ----------------------------------------------------------------------------- backward pieces


def _support_weights(p: Tensor, alpha: Union[float, Tensor]) -> Tensor:
    """u = p^{2−α} on the support (0 elsewhere)."""
    if isinstance(alpha, float):
        if alpha == 1.5:
            return p.sqrt()
        if alpha == 2.0:
            return (p > 0).to(p.dtype)
        if alpha == 1.0:
            return p
    u = p.pow(2 - alpha)
    return torch.where(p > 0, u, p.new_zeros(()))


def entmax_jvp_backward(p: Tensor, grad: Tensor, alpha: Union[float, Tensor], dim: int) -> Tensor:
    """∂L/∂z = u⊙g − u·(Σ u g)/(Σ u) with u = p^{2−α}; fully masked rows (Σ u = 0) give 0. The kernel takes
    α ≥ 1 only: rows with α < 1 (dense) take the PyTorch form."""
    dense = (alpha < 1) if isinstance(alpha, float) else (torch.compiler.is_compiling() or bool((alpha < 1).any()))
    if not (isinstance(alpha, float) and alpha == 1.0) and not dense and _use_kernel(p):
        dz = cpu_kernel.get().entmax_backward(_rows(p, dim), _rows(grad, dim), _row_alpha(alpha, p, dim))
        return dz.view(list(p.movedim(dim, -1).shape)).movedim(-1, dim)
    u = _support_weights(p, alpha)
    ug = u * grad
    q = ug.sum(dim, keepdim=True) / u.sum(dim, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
    return ug.sub_(u * q)


def entmax_alpha_backward(p: Tensor, grad: Tensor, alpha: Tensor, dim: int) -> Tensor:
    """∂L/∂α per row (Correia et al., 2019), derived from p_i = u_i^{1/(α−1)}:
        ∂p_i/∂α = (p_i − û_i)/(α−1)² − (p_i log p_i − û_i Σ_j p_j log p_j)/(α−1),  û = u/Σu.
    At α = 1 (softmax) both terms are 0/0; their limit, the right derivative, is
        ∂p_i/∂α = ½ p_i (Σ_j p_j log² p_j − log² p_i)
    (expand p_i = (1 + (α−1)(z_i − t))^{1/(α−1)} = e^{z_i − t}(1 − (α−1)(z_i − t)²/2 + …) with Σ p = 1)."""
    tiny = torch.finfo(p.dtype).tiny
    logp = torch.where(p > 0, torch.log(p.clamp_min(tiny)), p.new_zeros(()))
    plogp = p * logp
    at_one = alpha == 1
    am1 = torch.where(at_one, torch.ones_like(alpha), alpha - 1)  # α = 1 rows take the limit below
    u = _support_weights(p, alpha)
    u_hat = u / u.sum(dim, keepdim=True).clamp_min(tiny)
    neg_entropy = plogp.sum(dim, keepdim=True)
    dp_dalpha = (p - u_hat) / am1**2 - (plogp - u_hat * neg_entropy) / am1
    if torch.compiler.is_compiling() or bool(at_one.any()):
        plog2p = plogp * logp
        dp_dalpha = torch.where(at_one, 0.5 * (p * plog2p.sum(dim, keepdim=True) - plog2p), dp_dalpha)
    return (grad * dp_dalpha).sum(dim, keepdim=True)


# ----------------------------------------------------------------------------- autograd Functions


class EntmaxFunction(torch.autograd.Function):
    """α-entmax with a float α (1.5 and 2 exact; any α ≥ 1). Saves only the output."""

    @staticmethod
    def forward(ctx, x: Tensor, alpha: float, dim: int) -> Tensor:
        cdt = _compute_dtype(x.dtype, alpha)
        p = entmax_forward(x.to(cdt), float(alpha), dim)
        ctx.alpha, ctx.dim, ctx.in_dtype = float(alpha), dim, x.dtype
        ctx.save_for_backward(p)
        return p.to(x.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (p,) = ctx.saved_tensors
        gz = entmax_jvp_backward(p, grad.to(p.dtype), ctx.alpha, ctx.dim)
        return gz.to(ctx.in_dtype), None, None


class EntmaxAlphaFunction(torch.autograd.Function):
    """α-entmax with a tensor α broadcast over the rows; differentiable in both z and α."""

    @staticmethod
    def forward(ctx, x: Tensor, alpha: Tensor, dim: int) -> Tensor:
        cdt = _compute_dtype(x.dtype, alpha)
        a = alpha.to(cdt)
        p = entmax_forward(x.to(cdt), a, dim)
        ctx.dim, ctx.in_dtype, ctx.alpha_dtype = dim, x.dtype, alpha.dtype
        ctx.alpha_shape = alpha.shape
        ctx.save_for_backward(p, a)
        return p.to(x.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        p, a = ctx.saved_tensors
        g = grad.to(p.dtype)
        gz = entmax_jvp_backward(p, g, a, ctx.dim).to(ctx.in_dtype) if ctx.needs_input_grad[0] else None
        ga = None
        if ctx.needs_input_grad[1]:
            ga = entmax_alpha_backward(p, g, a, ctx.dim).sum_to_size(ctx.alpha_shape).to(ctx.alpha_dtype)
        return gz, ga, None


# ----------------------------------------------------------------------------- public functions


def entmax(x: Tensor, alpha: AlphaLike = 1.5, dim: int = -1) -> Tensor:
    """α-entmax along ``dim`` for any α > 0 (1 → softmax, 1.5 → entmax15, 2 → sparsemax; below 1 the dense
    Tsallis maps, as the ``entmax`` package's entmax_bisect). Same shape as ``x``.

    ``alpha`` is a number or a tensor broadcastable over the rows (the ``dim`` axis as size 1); a
    1-D tensor of length ``x.shape[1]`` is read as per-head α for (B, H, ...) scores; rows with
    α = 1 are softmax. A tensor α gets a gradient. Entries equal to −inf are masked; an all −inf row
    gives zeros.
    """
    dim = _check_input(x, dim)
    _check_alpha_values(alpha, dense=True)
    if x.numel() == 0:
        return x.clone()
    if isinstance(alpha, Tensor):
        return EntmaxAlphaFunction.apply(x, _alpha_view(alpha, x, dim), dim)
    return EntmaxFunction.apply(x, float(alpha), dim)


def check_speed_hint(name: str, value, minimum: int = 1) -> None:
    """The ``entmax`` package's solver settings (``k``: partial-sort size, ``n_iter``: bisection steps) are
    accepted for compatibility and do not change the result (the solves here are exact or converged); a value
    the package could not take is still refused."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        raise ValueError(f"{name} must be None or an integer >= {minimum}; got {value!r}")


def entmax15(X: Tensor, dim: int = -1, k: int | None = None) -> Tensor:
    """1.5-entmax (exact) along ``dim``; same shape as ``X``. ``k``: the ``entmax`` package's sort hint, not needed."""
    check_speed_hint("k", k)
    return entmax(X, 1.5, dim)


def sparsemax(X: Tensor, dim: int = -1, k: int | None = None) -> Tensor:
    """Sparsemax = 2-entmax (exact): the Euclidean projection onto the simplex, along ``dim``; same shape as ``X``.
    ``k``: the ``entmax`` package's sort hint, not needed."""
    check_speed_hint("k", k)
    return entmax(X, 2.0, dim)


def bounded_alpha(raw: Tensor, max_alpha: float = 2.0) -> Tensor:
    """Map an unconstrained parameter to α ∈ (1, max_alpha) for users who learn α: 1 + (m−1)·σ(raw)."""
    if max_alpha <= 1:
        raise ValueError(f"max_alpha must be > 1, got {max_alpha}")
    alpha = 1 + (max_alpha - 1) * torch.sigmoid(raw)
    # In fp32, σ(raw) saturates (raw ≲ −17 gives exactly 1.0, raw ≳ 17 exactly max_alpha): keep α
    # strictly inside (1, max_alpha), as documented, with the bounds one relative ulp inside, passing
    # the gradient straight through the clamp.
    eps = torch.finfo(alpha.dtype).eps
    inside = alpha.clamp(1 + eps, max_alpha * (1 - eps))
    return alpha + (inside - alpha).detach()


def inverse_bounded_alpha(alpha: float, max_alpha: float = 2.0) -> float:
    """The raw value that ``bounded_alpha`` maps to ``alpha`` (for initialisation)."""
    if not 1 < alpha < max_alpha:
        raise ValueError(f"alpha must lie in (1, {max_alpha}), got {alpha}")
    s = (alpha - 1) / (max_alpha - 1)
    return math.log(s / (1 - s))


class LearnedAlpha(torch.nn.Module):
    """A learned α of a given shape (e.g. (H,) per head), kept in (1, max_alpha)."""

    def __init__(self, shape=(), init: float = 1.5, max_alpha: float = 2.0):
        super().__init__()
        self.max_alpha = max_alpha
        self.raw = torch.nn.Parameter(
            torch.full(tuple(shape) if not isinstance(shape, int) else (shape,), inverse_bounded_alpha(init, max_alpha))
        )

    def forward(self) -> Tensor:
        return bounded_alpha(self.raw, self.max_alpha)
