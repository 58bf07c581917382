"""The threshold solve: p and u from gaps (`_powers`), the bracket of τ, the points of a sweep, the per-tile
sums of a sweep and `_bracket_update`, which folds them into each row's bracket and finishes rows (exactly,
or within the opt-in tolerance).

Raw functions: `build.kernels()` wraps them with triton.jit at first use (see attention/triton_ops.py)."""

from .lang import tl
from .tiles import _rmax, _rmin, _rsum


def _powers(d, am1, MODE: tl.constexpr):
    """For gaps d = X − τ: p = d₊^{1/(α−1)} and w = d₊^{1/(α−1) − 1} = p^{2−α}, which is both the
    Newton weight (f'(τ) = −Σw/(α−1)) and the u of the backward. Entries with d ≤ 0 (or −inf) give 0."""
    pos = d > 0
    dp = tl.where(pos, d, 0.0)
    if MODE == 2:
        p = dp
        w = tl.where(pos, 1.0, 0.0)
    elif MODE == 1:
        p = dp * dp
        w = dp
    else:
        e = 1.0 / am1
        lg = tl.log2(tl.where(pos, d, 1.0))
        p = tl.where(pos, tl.exp2(e * lg), 0.0)
        w = tl.where(pos, tl.exp2((e - 1.0) * lg), 0.0)
    return p, w


def _u_norm(inv, am1, MODE: tl.constexpr):
    """(1/Σp)^{2−α}: turns the unnormalised w of `_powers` into u = p^{2−α} of the normalised p."""
    if MODE == 2:
        u = tl.full(inv.shape, 1.0, tl.float32)
    elif MODE == 1:
        u = tl.sqrt(inv)
    else:
        u = tl.exp2((1.0 - am1) * tl.log2(tl.where(inv > 0, inv, 1.0)))
    return u


def _bracket_hi(nkeys, am1, MODE: tl.constexpr):
    """−n^{1−α}: the threshold of n equal scores, an upper bound on τ (as floats, n ≥ 1)."""
    n = tl.maximum(nkeys, 1).to(tl.float32)
    if MODE == 2:
        hi = -1.0 / n
    elif MODE == 1:
        hi = -1.0 / tl.sqrt(n)
    else:
        hi = -tl.exp2(-am1 * tl.log2(n))
    return hi


def _point(a, b, pi: tl.constexpr, P: tl.constexpr, GEOM: tl.constexpr):
    """Point pi of P of a sweep, per row (BM,). GEOM = 1 (the first sweep): geometric from −1 to hi,
    a = log2(−hi): τ* lies in [−1, −n^{1−α}] and may sit at any order of magnitude there (one key dominating:
    −1; n equal keys: hi). GEOM = 2: geometric from lo to hi of a bracket inside that one, a = log2(−lo),
    b = log2(−hi). Otherwise evenly from a to b."""
    if P == 1:
        frac = 0.0
    else:
        frac = pi / (P - 1)
    if GEOM == 2:
        t = -tl.exp2(a + (b - a) * frac)
    elif GEOM:
        t = -tl.exp2(a * frac)
    else:
        t = a + (b - a) * frac
    return t


def _later_bounds(lo, hi, nxt, P: tl.constexpr, MODE: tl.constexpr):
    """(a, b) of a later sweep's points. One point (P = 1, α = 1.5): `nxt`, the point `_bracket_update`
    proposed. Otherwise the bracket's ends [lo, hi] for α = 1.5 / 2 (both are bounds the last sweep proved,
    each close to τ* from its side), lo and the bracket's middle for other α (Newton from lo, guarded by
    bisection)."""
    if P == 1:
        return nxt, nxt
    if MODE == 0:
        far = 0.5 * (lo + hi)
    else:
        far = hi
    return lo, far


def _column(T, pi: tl.constexpr, P: tl.constexpr):
    """Column pi (a compile-time index) of a (BM, P) tensor, as (BM,)."""
    return _rsum(tl.where(tl.arange(0, P)[None, :] == pi, T, 0.0), 1)


def _add_column(T, pi: tl.constexpr, x, P: tl.constexpr):
    """T with x (BM,) added to column pi."""
    return tl.where(tl.arange(0, P)[None, :] == pi, T + x[:, None], T)


def _sweep_tile(
    X, a, b, cnt, sw, sp, mind, dneg, am1, P: tl.constexpr, GEOM: tl.constexpr, MODE: tl.constexpr, GAPS: tl.constexpr
):
    """Adds one tile of shifted scores X (BM, BN) to the per-point sums of a sweep at the P points of
    `_point(a, b, ·)`: support count, Σw, Σp, the smallest positive gap X − t and the largest non-positive
    one (each (BM, P)). The last two certify a closed-form τ from either side of the root (`_bracket_update`);
    GAPS = False leaves them as they are (a sweep that certifies nothing: the max pass's anchored one)."""
    cols = tl.arange(0, P)[None, :]
    for pi in tl.static_range(P):
        d = X - _point(a, b, pi, P, GEOM)[:, None]
        pos = d > 0
        p, w = _powers(d, am1, MODE)
        cnt = _add_column(cnt, pi, _rsum(pos.to(tl.float32), 1), P)
        sw = _add_column(sw, pi, _rsum(w, 1), P)
        sp = _add_column(sp, pi, _rsum(p, 1), P)
        if (MODE != 0) & GAPS:
            lo_gap = _rmin(tl.where(pos, d, float("inf")), 1)
            hi_gap = _rmax(tl.where(pos, float("-inf"), d), 1)
            mind = tl.where(cols == pi, tl.minimum(mind, lo_gap[:, None]), mind)
            dneg = tl.where(cols == pi, tl.maximum(dneg, hi_gap[:, None]), dneg)
    return cnt, sw, sp, mind, dneg


def _sweep_sums(BM: tl.constexpr, P: tl.constexpr):
    """Zeroed per-point sums of a sweep (see `_sweep_tile`)."""
    z = tl.zeros([BM, P], tl.float32)
    return z, z, z, z + float("inf"), z + float("-inf")


def _bracket_update(
    a,
    b,
    cnt,
    sw,
    sp,
    mind,
    dneg,
    lo,
    hi,
    tau,
    active,
    am1,
    P: tl.constexpr,
    GEOM: tl.constexpr,
    MODE: tl.constexpr,
    TOL,
    FTOL: tl.constexpr,
):
    """Folds a sweep's sums at the points of `_point(a, b, ·)` into each active row's bracket lo ≤ τ* ≤ hi
    and finishes rows.

    f(t) = Σp − 1 is decreasing and convex in t, so a point with f ≥ 0 lies below the root (its support
    S(t) = {X > t} contains the true one) and a point with f < 0 above it (S(t) is inside the true one).
    Bounds: a point itself; the Newton step from a point below (convexity: still below); the closed form
    τ_S of Σ_S (X − τ)^{1/(α−1)} = 1 on S = S(t) (α = 1.5: Σ(X − τ)² over a superset is at least f, so its
    root lies above τ*, and over a subset at most f, so below; α = 2: Σ(X − τ) over either is at most f,
    so its root lies below).
    Exact finish (α = 1.5 / 2): τ_S is τ* exactly when S is the true support, which holds when every entry
    of S stays above τ_S (smallest gap `mind` > τ_S − t) and every entry outside stays at or below it
    (largest outside gap `dneg` ≤ τ_S − t); one of the two is automatic on each side of the root. Other α
    finish when the Newton step from below falls under TOL. A row whose bracket this sweep could not tighten
    (rounding: the next points would repeat) ends at lo, where Σp ≥ 1: the output pass renormalises it.
    FTOL > 0 (the opt-in tolerance mode): a row without an exact finish ends at the first point with
    |Σp − 1| ≤ FTOL, renormalised by the output pass.
    Next point (`nxt`, what a one-point sweep evaluates next): the closed form τ_S from this sweep's lowest
    point above the root, else from its highest point below it, where it lies in the new bracket, else the
    bracket's middle. A one-point sweep (P = 1) tightens one side only, so its row ends at lo only when its
    next point would repeat this one (or the bracket closed).
    Returns (lo, hi, tau, active, certified, nxt); certified: the rows finished exactly here."""
    done = active == 0
    new_tau = tau
    certified = tl.zeros(lo.shape, tl.int1)
    lo_in = lo
    hi_in = hi
    from_above = tl.full(lo.shape, float("nan"), tl.float32)
    from_below = tl.full(lo.shape, float("nan"), tl.float32)
    for pi in tl.static_range(P):
        t = _point(a, b, pi, P, GEOM)
        n = _column(cnt, pi, P)
        w_sum = _column(sw, pi, P)
        f = _column(sp, pi, P) - 1.0
        below = f >= 0
        has = w_sum > 0
        newton = t + f * am1 / tl.where(has, w_sum, 1.0)
        if MODE == 1:
            disc = w_sum * w_sum - n * f
            s = f / tl.where(has, w_sum + tl.sqrt(tl.maximum(disc, 0.0)), 1.0)
            valid = has & (disc >= 0)
        elif MODE == 2:
            s = f / tl.where(n > 0, n, 1.0)
            valid = n > 0
        else:
            s = newton - t
            valid = has
        lo = tl.where(active & below, tl.maximum(lo, t), lo)
        hi = tl.where(active & (f < 0), tl.minimum(hi, t), hi)
        if MODE == 1:
            lo = tl.where(active & below & has, tl.maximum(lo, tl.minimum(newton, hi)), lo)
            hi = tl.where(active & below & valid, tl.minimum(hi, t + s), hi)
            lo = tl.where(active & (f < 0) & valid, tl.maximum(lo, tl.minimum(t + s, hi)), lo)
        elif MODE == 2:
            lo = tl.where(active & valid, tl.maximum(lo, tl.minimum(t + s, hi)), lo)
        else:
            lo = tl.where(active & below & has, tl.maximum(lo, tl.minimum(newton, hi)), lo)
        if MODE == 0:
            fin = active & (done == 0) & below & has & (tl.abs(s) <= TOL)
        else:
            fin = active & (done == 0) & valid & tl.where(below, _column(mind, pi, P) > s, _column(dneg, pi, P) <= s)
            certified = certified | fin
        new_tau = tl.where(fin, t + s, new_tau)
        done = done | fin
        from_below = tl.where(below & valid, t + s, from_below)
        from_above = tl.where((f < 0) & valid & (from_above != from_above), t + s, from_above)
        if FTOL > 0:
            near = active & (done == 0) & (tl.abs(f) <= FTOL)
            new_tau = tl.where(near, t, new_tau)
            done = done | near
    cand = tl.where(from_above != from_above, from_below, from_above)
    nxt = tl.where((cand >= lo) & (cand <= hi), cand, 0.5 * (lo + hi))  # nan compares false: the middle
    if P == 1:
        # the next point repeats this one (rounding), or the bracket closed or crossed: end at lo
        closed = active & (done == 0) & ((nxt == a) | (hi <= lo))
    else:
        # a sweep that could not tighten the bracket (its points repeat: rounding) ends the row at lo, as
        # does a bracket that rounding closed or crossed
        closed = active & (done == 0) & (((lo <= lo_in) & (hi >= hi_in)) | (hi <= lo))
    new_tau = tl.where(closed, lo, new_tau)
    done = done | closed
    return lo, hi, tl.where(active, new_tau, tau), active & (done == 0), certified, nxt


def _anchored_proposal(cnt, sw, sp, anchor, lo, hi, lhi, am1, P: tl.constexpr):
    """α = 1.5: the first point of the solve from a sweep the max pass took at the points `_point(lhi, lhi, ·,
    GEOM)` relative to `anchor` (BM,), the shifted row max of the block's diagonal tile (≤ 0 in the row max's
    frame). The closed form from its lowest point above the root, else from its highest point below, where it
    lies in [lo, hi], else the bracket's middle. Only a proposal: those sums were taken relative to another
    maximum, so no bound or finish is drawn from them (the sweeps that follow decide everything)."""
    from_above = tl.full(lo.shape, float("nan"), tl.float32)
    from_below = tl.full(lo.shape, float("nan"), tl.float32)
    for pi in tl.static_range(P):
        t = anchor + _point(lhi, lhi, pi, P, True)
        n = _column(cnt, pi, P)
        w_sum = _column(sw, pi, P)
        f = _column(sp, pi, P) - 1.0
        has = w_sum > 0
        disc = w_sum * w_sum - n * f
        s = f / tl.where(has, w_sum + tl.sqrt(tl.maximum(disc, 0.0)), 1.0)
        valid = has & (disc >= 0)
        from_below = tl.where((f >= 0) & valid, t + s, from_below)
        from_above = tl.where((f < 0) & valid & (from_above != from_above), t + s, from_above)
    cand = tl.where(from_above != from_above, from_below, from_above)
    return tl.where((cand >= lo) & (cand <= hi), cand, 0.5 * (lo + hi))


def _top_update(z, top, T: tl.constexpr):
    """The running T largest scores of each row (BM, T), descending, −inf where a row has seen fewer, with one
    more tile z (BM, BN) of scores (−inf where masked). T ≤ BN, a power of two."""
    cand = tl.topk(z, T, dim=1)
    both = tl.reshape(tl.join(top, cand), [top.shape[0], 2 * T])
    return tl.topk(both, T, dim=1)


def _top_solve(top, m, nkeys, lo, hi, am1, T: tl.constexpr):
    """α = 1.5: what the T largest scores of each row (`top`, (BM, T), descending; m the row max) decide before
    any sweep. Sorted scores give the support exactly: with τ_k the closed form over the k largest, x_k > τ_k
    holds for k up to the support's size and fails after it, so when it fails within the T known (or a row
    has at most T keys) the support and τ* = τ_k are certain. Otherwise the support holds all T, so τ_T (the
    closed form over a subset of the support, at most τ*) bounds τ* below and x_T (in the support) above.
    Returns (certified (BM,) bool, τ where certified, lo, hi)."""
    X = am1 * (top - m[:, None])  # ≤ 0, descending, −inf past a row's keys
    col = tl.arange(0, T)[None, :]
    valid = X > float("-inf")
    Xv = tl.where(valid, X, 0.0)
    k = tl.cumsum(valid.to(tl.float32), 1)
    s1 = tl.cumsum(Xv, 1)
    s2 = tl.cumsum(Xv * Xv, 1)
    # τ_k = (s1 − √(k − (k·s2 − s1²))) / k: only to count the k with x_k > τ_k (rounding here can move the
    # count by one at a tie; the closed form below is recomputed stably and checked on both sides)
    tau_k = (s1 - tl.sqrt(tl.maximum(k - (k * s2 - s1 * s1), 0.0))) / tl.maximum(k, 1.0)
    n_in = _rsum((valid & (X > tau_k)).to(tl.int32), 1)
    decided = (n_in < T) | (nkeys <= T)
    n_sel = tl.where(decided, n_in, T)
    x_last = _rsum(tl.where(col == n_sel[:, None] - 1, X, 0.0), 1)  # the smallest selected score
    x_next = _rmax(tl.where(col == n_sel[:, None], X, float("-inf")), 1)  # the largest left out (−inf: none known)
    d = tl.where(col < n_sel[:, None], X - x_last[:, None], 0.0)  # ≥ 0
    n = n_sel.to(tl.float32)
    w = _rsum(d, 1)
    f = _rsum(d * d, 1) - 1.0
    # the closed form from the point x_last (above the root: f < 0), as `_bracket_update` takes it
    s = f / tl.maximum(w + tl.sqrt(tl.maximum(w * w - n * f, 0.0)), 1e-30)
    tau = x_last + s
    certified = decided & (n_sel > 0) & (x_last > tau) & (x_next <= tau)
    x_T = _rsum(tl.where(col == T - 1, X, 0.0), 1)
    new_hi = tl.where(decided, hi, tl.minimum(hi, x_T))
    new_lo = tl.where(decided, lo, tl.minimum(tl.maximum(lo, tau), new_hi))
    return certified, tau, new_lo, new_hi
