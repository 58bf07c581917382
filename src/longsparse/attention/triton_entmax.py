"""α-entmax flash attention in Triton: forward, backward and a split-K decode path.

Public entry points:

* ``entmax_attention_triton(q, k, v, *, alpha, is_causal, alibi_slopes, q_scale, scale, key_start, key_end)``
  → (B, H, Nq, D), differentiable in q, k, v (and q_scale, through autograd);
* ``supports(q, k, v, **kwargs) -> str | None``: None when the kernels take the call, else the reason;
* ``threshold_stats(q, k, v, **kwargs)``: the forward's row statistics and tile mask (diagnostics);
* ``solver_counts(q, k, v, **kwargs)``: what the forward did per query block, counted by the kernel.

Semantics are those of ``ls.attention(..., mapping="entmax")``: logits
    z_ij = (q_i · k_j) · scale − m_h · |i + Nk − Nq − j|
(causal rows see only j ≤ i + Nk − Nq, where this is the usual −m_h·(i − j); non-causal ALiBi is
symmetric, as flash-attn's), batch row b sees only the keys key_start[b] ≤ j < key_end[b] (left / right
padding), causal masking bottom-right aligned (query i sits at absolute position i + Nk − Nq),
p_i = α-entmax(z_i), o_i = Σ_j p_ij v_j; a row that can attend to nothing gives zeros. The per-query
q-scale (SSMax / ASEntmax) multiplies q before the kernel, which is exact because it does not scale the
bias; its gradient then flows through autograd.

Algorithm (one program per block of BLOCK_M query rows, key tiles of BLOCK_N, fp32 arithmetic; blocks
dispatched longest first):

1. max pass: the row max M over the key tiles.
2. threshold solve, in the shifted scale X = (α−1)(z − M) ∈ (−∞, 0] where τ ∈ [−1, −n^{1−α}] (n = the
   row's visible keys), f(τ) = Σ_j [X_j − τ]₊^{1/(α−1)} − 1 (decreasing, convex). Each sweep over the key
   tiles evaluates f at several points per row at once (the first sweep at P0 points spread geometrically
   over the bracket, later sweeps at the ends of the bracket the last one proved), and folds them into
   the bracket with Newton steps and, for α = 1.5 / 2, the closed-form τ of each point's support, which is
   an upper or a lower bound and is τ* exactly when that support is the true one — certified from below
   (every support entry stays positive) or from above (every other entry stays non-positive)
   (`_bracket_update`). Other α finish when the Newton step is below ``_TOL`` (output renormalised). A row
   whose bracket closes to rounding ends at its lower bound, renormalised; ``solver_counts`` reports those.
   The opt-in tolerance mode (``tolerance=ε``) also ends a row at the first point with |f| ≤ ε.
3. output pass: p = [X − τ]₊^{1/(α−1)} / Σp, O = p·V, and for training Σ u·V / Σ u (u = p^{2−α}) per row,
   from which the backward's δ is one dot product (no extra pass over K).

The loops over key tiles are plain `for` loops (no data-dependent branch around a load), so Triton
software-pipelines their K and V loads; tiles inside every row's visible range skip the visibility mask,
slope-0 (NoPE) heads the bias. Skipping: key tiles outside [key_start, key_end) and past the causal
diagonal are never visited; on ALiBi heads, the band of `attention/band.py` (a bound proving that keys
far enough away hold no support) limits every pass to the tiles near the diagonal. The output pass records
per (query block, key tile) whether the tile holds some p > 0 (⌈Nq/BLOCK_M⌉·⌈Nk/BLOCK_N⌉ bytes per head);
the row statistics are 3 floats per query (M, τ, 1/Σp). No N×N buffer exists.

Backward, with u = p^{2−α} (√p for α = 1.5, the support indicator for α = 2), g_ij = dO_i · v_j:
    ∂L/∂z_ij = u_ij (g_ij − δ_i),  δ_i = Σ_j u_ij g_ij / Σ_j u_ij = dO_i · (Σ_j u_ij v_j) / Σ_j u_ij.
δ comes from the forward's Σ u·V (a pre-pass computes it where the forward kept none: the decode path).
The tile mask becomes lists (per query block its live key tiles, per key tile its live query blocks),
so dk/dv — one program per (key tile, batch, kv head) over the query heads of its GQA group, summed
without atomics (deterministic) — and dq — one program per query block — loop over plain lists.

Decode (few queries against a long KV cache, ``decode=True`` or automatically for Nq ≤ 16 and
Nk ≥ 1024): τ is global over the row, so a split over keys cannot finish its rows alone. Instead
(a) a split-K kernel reads K once, writes the Nq×Nk fp32 logits to a scratch buffer and a per-split row
max; GQA query heads sharing a kv head go into one program so K is read once per group; (b) a kernel per
(split, row) keeps the candidates X > −1 (a superset of the support) of its split, packed; (c) one
program per row runs the block kernel's solve over its candidates (over the whole scratch row if a split
had more than its share); (d) a split-K kernel forms p from the scratch logits and τ and accumulates
partial P·V and Σp per split, skipping the V tiles where p is all zero; since τ is global, partial
outputs simply add (no rescaling, unlike softmax flash-decoding), and a small reduction divides by Σp.
The decode path also returns the row statistics, so its output is differentiable through the same
backward kernels.

The decode scratch is B·H·Nq·Nk fp32 logits plus at most as many candidates (with Nq ≤ 16).

Supported: α ∈ (1, 2] as a float (α = 1.5 and 2 with the exact finish) or a per-head (H,) tensor
(general solver; α itself is not differentiated); causal (bottom-right) or not; ALiBi / NAPE slopes (H,)
(not differentiated); q-scales; GQA; left and right padding through key_start / key_end; any N; head
dims 16, 32, 64, 128; float16 / bfloat16 / float32 inputs (fp32 accumulation; fp32 inputs use 3xTF32 dots on CUDA).
Refused (see `supports`): arbitrary attn_mask, other mappings, α outside (1, 2] or requiring grad,
other head dims and dtypes, non-CUDA tensors outside the interpreter.

Kernels are built lazily on first use: ``TRITON_INTERPRET=1`` (Triton's CPU interpreter, used by the
tests) must be set before that first use. The entry point is a ``torch.library.custom_op`` pair
(forward, backward) with fake implementations and registered autograd, so ``torch.compile`` traces
a model that calls it (fullgraph).
"""

import math
import os

import torch
from torch import Tensor

from .band import ROUNDING_MARGIN
from .call import tolerance_problem

try:  # the kernels need Triton; without it, `supports` says so and nothing else is built
    import triton
    import triton.language as tl

    _TRITON_ERROR: str | None = None
except ImportError as exc:  # pragma: no cover - exercised only where triton is absent
    import types

    triton = None
    tl = types.SimpleNamespace(constexpr=object)  # kernels' annotations still evaluate
    _TRITON_ERROR = f"triton is not installed ({exc}); pip install 'longsparse[gpu]'"

HEAD_DIMS = (16, 32, 64, 128)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
DECODE_MAX_QUERIES = 16  # the decode path holds all of a program's query rows in one tile
DECODE_MIN_KEYS = 1024  # below this the block kernel has enough key tiles per query block anyway
# ALiBi band (attention/band.py) from this many keys: a few dozen small launches, worth it only on long rows
BAND_MIN_KEYS = 1024
# Decode candidates (X > −1) kept per split: at most split / DECODE_CANDIDATE_DIVISOR (random logits keep ~7 % of
# 32K keys; trained attention far fewer); a row with a split past that solves over all its logits.
DECODE_CANDIDATE_DIVISOR = 4
_TOL = 1e-6  # Newton step (in τ, whose bracket has width < 1) at which general α stops
_MAX_SWEEPS_EXACT = 24  # α = 1.5 / 2: the exact finish certifies after a few sweeps (a cap, not a budget)
_MAX_SWEEPS_GENERAL = 32  # other α: quadratic convergence once the bracket is tight
# Points per sweep of the threshold solve, (first sweep, later sweeps), by mode (general, 1.5, 2); powers of
# two. More points cost element-wise work in every tile but fewer passes over K: on an H200, 4 first points
# timed 6 % faster than 8 and 3 % faster than 2 at 4K and 16K keys (benchmarks/results/gpu_check-h200-*).
SOLVER_POINTS = {0: (4, 2), 1: (4, 2), 2: (4, 2)}

_MODE_GENERAL, _MODE_15, _MODE_2 = 0, 1, 2
INTERPRETER_BLOCK = 32  # query and key tile of the interpreter (CPU tensors): see `_config`


# ============================================================================ kernels (raw functions)
# These are plain functions until `_kernels()` wraps them with triton.jit (or the interpreter), so the
# choice between compiled and interpreted kernels is made at first use, not at import.
#
# Compile-time switches are only those that change the arithmetic (MODE: α = 1.5 / 2 / general; the
# tiles; the dot precision; whether a tile mask exists). Causality, ALiBi, key ranges and per-head α
# are runtime arguments (a min, a multiply-add and a few scalar loads per tile or program), so one
# compiled kernel serves every such call: each Triton specialisation costs seconds of compilation.
# Conventions: `Slopes` (H,) fp32 (zeros = no bias), `Starts`, `Ends` (B,) int32: batch row b's keys
# [start, end) (0 and Nk: no padding), `Alpha` (H,) fp32 (read in the general mode only), `causal` 0/1.
# The helpers below are inlined by triton.jit, so factoring a kernel's prologue into them costs nothing.


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


def _key_range(Starts, Ends, b, Nk):
    """Batch row b's keys [start, end), clamped so that 0 ≤ start ≤ end ≤ Nk."""
    end = tl.minimum(tl.maximum(tl.load(Ends + b), 0), Nk)
    start = tl.minimum(tl.maximum(tl.load(Starts + b), 0), end)
    return start, end


def _row_limits(rows, Nq, Nk, start, end, causal):
    """Each query row sees the keys [start, limit): limit = end, and under causal masking at most the
    row's absolute position rows + Nk − Nq. A row that sees no key (limit ≤ start, or a tile-padding row
    past Nq) gets limit 0, so `max(limit − start, 0)` counts every row's keys."""
    lim = tl.zeros_like(rows) + end
    lim = tl.where(causal != 0, tl.minimum(lim, rows + (Nk - Nq) + 1), lim)
    return tl.where((rows < Nq) & (lim > start), lim, 0)


def _alpha_minus_one(Alpha, h, MODE: tl.constexpr):
    if MODE == 1:
        am1 = 0.5
    elif MODE == 2:
        am1 = 1.0
    else:
        am1 = tl.load(Alpha + h) - 1.0
    return am1


def _head_consts(Alpha, Slopes, h, MODE: tl.constexpr):
    """(α − 1, ALiBi slope) of head h."""
    return _alpha_minus_one(Alpha, h, MODE), tl.load(Slopes + h)


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


def _rsum(x, axis: tl.constexpr):
    """tl.sum for float tensors, through tl.reduce: the interpreter runs this in numpy, while calling
    tl.sum (itself a jit function) from an interpreted kernel re-patches triton.language (~6 ms a call)."""
    return tl.reduce(x, axis, tl.standard._sum_combine)


def _rmax(x, axis: tl.constexpr):
    """tl.max through tl.reduce (see `_rsum`)."""
    return tl.reduce(x, axis, tl.standard._elementwise_max)


def _rmin(x, axis: tl.constexpr):
    """tl.min through tl.reduce (see `_rsum`)."""
    return tl.reduce(x, axis, tl.standard._elementwise_min)


def _point(a, b, pi: tl.constexpr, P: tl.constexpr, GEOM: tl.constexpr):
    """Point pi of P of a sweep, per row (BM,). GEOM (the first sweep): geometric from −1 to hi, a = log2(−hi):
    τ* lies in [−1, −n^{1−α}] and may sit at any order of magnitude there (one key dominating: −1; n equal
    keys: hi). Otherwise evenly from a to b."""
    if P == 1:
        frac = 0.0
    else:
        frac = pi / (P - 1)
    if GEOM:
        t = -tl.exp2(a * frac)
    else:
        t = a + (b - a) * frac
    return t


def _later_bounds(lo, hi, MODE: tl.constexpr):
    """(a, b) of a later sweep's points: the bracket's ends [lo, hi] for α = 1.5 / 2 (both are bounds the
    last sweep proved, each close to τ* from its side), lo and the bracket's middle for other α (Newton from
    lo, guarded by bisection)."""
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


def _sweep_tile(X, a, b, cnt, sw, sp, mind, dneg, am1, P: tl.constexpr, GEOM: tl.constexpr, MODE: tl.constexpr):
    """Adds one tile of shifted scores X (BM, BN) to the per-point sums of a sweep at the P points of
    `_point(a, b, ·)`: support count, Σw, Σp, the smallest positive gap X − t and the largest non-positive
    one (each (BM, P)). The last two certify a closed-form τ from either side of the root (`_bracket_update`)."""
    cols = tl.arange(0, P)[None, :]
    for pi in tl.static_range(P):
        d = X - _point(a, b, pi, P, GEOM)[:, None]
        pos = d > 0
        p, w = _powers(d, am1, MODE)
        cnt = _add_column(cnt, pi, _rsum(pos.to(tl.float32), 1), P)
        sw = _add_column(sw, pi, _rsum(w, 1), P)
        sp = _add_column(sp, pi, _rsum(p, 1), P)
        if MODE != 0:
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
    Returns (lo, hi, tau, active, certified), the last the rows finished exactly here."""
    done = active == 0
    new_tau = tau
    certified = tl.zeros(lo.shape, tl.int1)
    lo_in = lo
    hi_in = hi
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
        if FTOL > 0:
            near = active & (done == 0) & (tl.abs(f) <= FTOL)
            new_tau = tl.where(near, t, new_tau)
            done = done | near
    # a sweep that could not tighten the bracket (its points repeat: rounding) ends the row at lo, as does a
    # bracket that rounding closed or crossed
    closed = active & (done == 0) & (((lo <= lo_in) & (hi >= hi_in)) | (hi <= lo))
    new_tau = tl.where(closed, lo, new_tau)
    done = done | closed
    return lo, hi, tl.where(active, new_tau, tau), active & (done == 0), certified


def _dot(a, b, acc, DOT_PREC: tl.constexpr):
    """a·b (+ acc) with fp32 accumulation. DOT_PREC "upcast" (interpreter only, for bfloat16, whose dot
    it computes wrongly in Triton 3.9) multiplies the operands as float32, exactly."""
    if DOT_PREC == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision=DOT_PREC)


def _load_tile(base, idx, valid, s_idx, s_d, D: tl.constexpr):
    """Rows idx of a (N, D) matrix at base with strides (s_idx, s_d): (len(idx), D), zero where not valid."""
    dcol = tl.arange(0, D)
    return tl.load(base + idx[:, None] * s_idx + dcol[None, :] * s_d, mask=valid[:, None], other=0.0)


def _load_tile_t(base, idx, valid, s_idx, s_d, D: tl.constexpr):
    """The transpose (D, len(idx)) of `_load_tile`."""
    dcol = tl.arange(0, D)
    return tl.load(base + idx[None, :] * s_idx + dcol[:, None] * s_d, mask=valid[None, :], other=0.0)


def _in_range(idx, lo, hi):
    """lo ≤ idx < hi (broadcasting), as one unsigned compare per element: idx − lo wraps to a huge value
    when idx < lo, and an empty range (hi ≤ lo) becomes the bound 0."""
    return (idx - lo).to(tl.uint32) < tl.maximum(hi - lo, 0).to(tl.uint32)


def _alibi(slope, qpos, kpos):
    """The ALiBi bias −m·|i − j| of query positions qpos (rows) and key positions kpos (columns): under
    causal masking every visible key has j ≤ i, so this is −m·(i − j) there; without it the bias is
    symmetric (as flash-attn's), so the farthest future key is not favoured."""
    return -slope * tl.abs(qpos[:, None] - kpos[None, :]).to(tl.float32)


def _logits(q, kT, qpos, kpos, start, row_lim, scale, slope, DOT_PREC: tl.constexpr):
    """z = q·kᵀ·scale − slope·|qpos − kpos|, −inf where the key is not visible to the row (outside
    [start, row_lim)); q (BM, D), kT (D, BN), slope a scalar or (BM, 1)."""
    z = _dot(q, kT, None, DOT_PREC) * scale + _alibi(slope, qpos, kpos)
    return tl.where(_in_range(kpos[None, :], start, row_lim[:, None]), z, float("-inf"))


def _logits_t(k, qT, qpos, kpos, start, row_lim, scale, slope, DOT_PREC: tl.constexpr):
    """The transposed logits tile (BN, BM) of `_logits`, for the kernels that own a key tile."""
    z = _dot(k, qT, None, DOT_PREC) * scale - slope * tl.abs(qpos[None, :] - kpos[:, None]).to(tl.float32)
    return tl.where(_in_range(kpos[:, None], start, row_lim[None, :]), z, float("-inf"))


def _block_scores(q, k_base, t, start, kend, skn, skd, qpos, row_lim, ti0, ti1, scale, slope, D, BN, DOT_PREC):
    """Key tile t of a query block: (kpos, logits (BM, BN)). The load masks only the key range [start, kend)
    (one compare per key); the per-entry visibility mask is applied only to tiles that need it: the interior
    tiles ti0 ≤ t < ti1 lie inside every row's visible range. The bias is added on ALiBi heads only."""
    kpos = t * BN + tl.arange(0, BN)
    kT = _load_tile_t(k_base, kpos, _in_range(kpos, start, kend), skn, skd, D)
    z = _dot(q, kT, None, DOT_PREC) * scale
    if slope != 0:
        z += _alibi(slope, qpos, kpos)
    if (t < ti0) | (t >= ti1):
        z = tl.where(_in_range(kpos[None, :], start, row_lim[:, None]), z, float("-inf"))
    return kpos, z


def _band_reach(qn, kmax, am1, row_lim, EPS: tl.constexpr):
    """The part of the ALiBi band bound (attention/band.py) that does not depend on the key's distance or on
    the row max: a key of row i can hold support only if scale·‖q_i‖·Kmax − m·dist > M_i − 1/(α−1), so with
    R_i = scale·‖q_i‖·Kmax + 1/(α−1), widened by EPS (band.ROUNDING_MARGIN) for the rounding of q·k and of
    the kernel's own test, it is dead once R_i − M_i − m·(1 − EPS)·dist ≤ 0. Rows that see no key get −inf
    (they never keep a tile alive)."""
    reach = qn * kmax * (1.0 + EPS) + (1.0 / am1) * (1.0 + EPS) + EPS
    return tl.where(row_lim > 0, reach, float("-inf"))


def _band_dead(reach, m, slope, dist_lo, EPS: tl.constexpr):
    """Whether every key at distance ≥ dist_lo (BM,) from its row is provably dead for every row of the block,
    given the row maxima m seen so far (a lower bound of the true ones). dist_lo may be negative (no bound)."""
    sees = reach > float("-inf")
    excess = reach - tl.where(sees, m, 0.0) - slope * (1.0 - EPS) * dist_lo.to(tl.float32)  # (−inf − −inf: NaN)
    return tl.max(tl.where(sees, excess, float("-inf")), 0) <= 0


def _query_block(
    Q,
    K,
    V,
    Alpha,
    Slopes,
    Starts,
    Ends,
    sqb,
    sqh,
    sqn,
    sqd,
    skb,
    skh,
    svb,
    svh,
    H,
    GROUP,
    Nq,
    Nk,
    n_qb,
    causal,
    D: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    MODE: tl.constexpr,
):
    """The start of every block kernel's program (grid (B·H, ⌈Nq/BM⌉)): its query rows and what they see.

    Query blocks run longest first: program (bh, j) takes block n_qb − 1 − j, so under causal masking the
    blocks with the most key tiles are dispatched first for every head and the short ones fill the tail.
    Returns (bh, pid_m, rows (BM,), rmask = real rows, qpos = their absolute positions, start, row_lim (BM,):
    each row sees the keys [start, row_lim), within the key tiles t0 ≤ t < t1 (kend = max row_lim); the interior
    tiles ti0 ≤ t < ti1 lie inside every row's
    range; am1 = α − 1 and the slope of the head; q (BM, D); k_base, v_base: the kv head's K and V)."""
    bh = tl.program_id(0)
    pid_m = n_qb - 1 - tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    hk = h // GROUP
    rows = pid_m * BM + tl.arange(0, BM)
    rmask = rows < Nq
    start, end = _key_range(Starts, Ends, b, Nk)
    row_lim = _row_limits(rows, Nq, Nk, start, end, causal)
    kend = tl.max(row_lim, 0)
    am1, slope = _head_consts(Alpha, Slopes, h, MODE)
    q = _load_tile(Q + b * sqb + h * sqh, rows, rmask, sqn, sqd, D)
    lim_min = tl.min(tl.where(rmask, row_lim, Nk + BN), 0)
    t0 = start // BN
    t1 = (kend + BN - 1) // BN
    ti0 = (start + BN - 1) // BN
    ti1 = tl.maximum(lim_min // BN, ti0)
    return (
        bh,
        pid_m,
        rows,
        rmask,
        rows + (Nk - Nq),
        start,
        row_lim,
        kend,
        t0,
        t1,
        ti0,
        ti1,
        am1,
        slope,
        q,
        K + b * skb + hk * skh,
        V + b * svb + hk * svh,
    )


def _fwd_kernel(
    Q,
    K,
    V,
    O,  # noqa: E741 (the output pointer; Q, K, V, O as in the attention formula)
    Stats,
    UV,
    TileMask,
    Live,
    Counts,
    KNorm,
    Alpha,
    Slopes,
    Starts,
    Ends,
    sqb,
    sqh,
    sqn,
    sqd,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    sob,
    soh,
    son,
    sod,
    H,
    GROUP,
    Nq,
    Nk,
    n_qb,
    n_kt,
    scale,
    causal,
    D: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    MODE: tl.constexpr,
    P0: tl.constexpr,
    P: tl.constexpr,
    MAX_SWEEPS: tl.constexpr,
    TOL: tl.constexpr,
    FTOL: tl.constexpr,
    DOT_PREC: tl.constexpr,
    BAND: tl.constexpr,
    BAND_EPS: tl.constexpr,
    STORE_UV: tl.constexpr,
    COUNT: tl.constexpr,
):
    """Grid (B·H, ⌈Nq/BM⌉). Writes O, Stats[0..2] = (row max M, τ, 1/Σp), the tile mask bits of the key
    tiles holding some p > 0 (the caller zeroes the rest), with STORE_UV the backward's Σ_j u_ij v_j / Σ_j u_ij
    per row (UV, fp32), and with COUNT the program's counters (Counts: sweeps, key tiles visited over all
    passes, key tiles of the block's causal range, rows finished uncertified). Live: (B·H·⌈Nq/BM⌉, 2·n_kt)
    int32 scratch, the blocks' lists of live key tiles. BAND: ALiBi heads bound their tiles in-kernel, with
    KNorm (B·H_kv,) fp32 the largest ‖k_j‖ over each batch row's keys."""
    (bh, pid_m, rows, rmask, qpos, start, row_lim, kend, t0, t1, ti0, ti1, am1, slope, q, k_base, v_base) = (
        _query_block(
            Q,
            K,
            V,
            Alpha,
            Slopes,
            Starts,
            Ends,
            sqb,
            sqh,
            sqn,
            sqd,
            skb,
            skh,
            svb,
            svh,
            H,
            GROUP,
            Nq,
            Nk,
            n_qb,
            causal,
            D,
            BM,
            BN,
            MODE,
        )
    )

    # 1. row max. ALiBi heads walk out from the diagonal and stop once `_band_dead` proves every farther key
    # tile holds no support, so every later pass visits only [t_lo, t_hi); other heads take every tile in a
    # plain (pipelined) loop.
    m = tl.full([BM], float("-inf"), tl.float32)
    t_lo = t0
    t_hi = t1
    if BAND & (slope > 0):
        qn = tl.sqrt(_rsum(q.to(tl.float32) * q.to(tl.float32), 1)) * tl.abs(scale)  # |scale|·‖q_i‖ (BM,)
        kmax = tl.load(KNorm + bh // GROUP)  # the kv head's largest ‖k_j‖ over the row's keys
        reach = _band_reach(qn, kmax, am1, row_lim, BAND_EPS)
        t_mid = tl.minimum(tl.maximum(tl.max(tl.where(rmask, qpos, 0), 0) // BN, t0), t1 - 1)
        t = t_mid
        go = t >= t0
        while go:
            kpos, z = _block_scores(
                q, k_base, t, start, kend, skn, skd, qpos, row_lim, ti0, ti1, scale, slope, D, BN, DOT_PREC
            )
            m = tl.maximum(m, _rmax(z, 1))
            t_lo = t
            t -= 1
            # keys of the tiles before t + 1 sit at least qpos − (t + 1)·BN + 1 before each row
            go = (t >= t0) & (_band_dead(reach, m, slope, qpos - (t + 1) * BN + 1, BAND_EPS) == 0)
        t = t_mid + 1
        go = t < t1
        while go:
            kpos, z = _block_scores(
                q, k_base, t, start, kend, skn, skd, qpos, row_lim, ti0, ti1, scale, slope, D, BN, DOT_PREC
            )
            m = tl.maximum(m, _rmax(z, 1))
            t += 1
            t_hi = t
            # keys of the tiles from t on sit at least t·BN − qpos after each row (non-causal rows only)
            go = (t < t1) & (_band_dead(reach, m, slope, t * BN - qpos, BAND_EPS) == 0)
    else:
        for t in range(t0, t1):
            kpos, z = _block_scores(
                q, k_base, t, start, kend, skn, skd, qpos, row_lim, ti0, ti1, scale, slope, D, BN, DOT_PREC
            )
            m = tl.maximum(m, _rmax(z, 1))
    m = tl.where(row_lim > 0, m, 0.0)
    visited = 2 * (t_hi - t_lo)  # the max pass and the first sweep

    # 2. threshold: a first sweep at P0 points spread over the bracket, then sweeps at P points (see
    # `_bracket_update`) until every row of the block has finished. Each sweep also lists the key tiles that
    # hold an entry above its rows' floor (lo, or τ once finished): τ only rises from there, so the other
    # tiles hold no support and later sweeps and the output pass skip them. Two lists per block (`Live`),
    # one read while the other is written, a barrier between sweeps.
    lo = tl.full([BM], -1.0, tl.float32)
    hi = _bracket_hi(tl.maximum(row_lim - start, 0), am1, MODE)
    tau = lo
    active = (row_lim - start) > 1
    uncertified = tl.zeros([BM], tl.int32)
    lhi = tl.log2(-hi)
    lists = Live + (bh.to(tl.int64) * n_qb + pid_m) * (2 * n_kt)
    n_live = 0
    # (the first sweep's sums have P0 columns: names of their own, since loop-carried values keep one type)
    cnt0, sw0, sp0, mind0, dneg0 = _sweep_sums(BM, P0)
    for t in range(t_lo, t_hi):
        kpos, z = _block_scores(
            q, k_base, t, start, kend, skn, skd, qpos, row_lim, ti0, ti1, scale, slope, D, BN, DOT_PREC
        )
        X = am1 * (z - m[:, None])
        cnt0, sw0, sp0, mind0, dneg0 = _sweep_tile(X, lhi, lhi, cnt0, sw0, sp0, mind0, dneg0, am1, P0, True, MODE)
        alive = _rmax(_rmax(X - lo[:, None], 1), 0) > 0
        tl.store(lists + n_kt + n_live, t, mask=alive)
        n_live += alive.to(tl.int32)
    tl.debug_barrier()
    was = active
    lo, hi, tau, active, cert = _bracket_update(
        lhi, lhi, cnt0, sw0, sp0, mind0, dneg0, lo, hi, tau, active, am1, P0, True, MODE, TOL, FTOL
    )
    uncertified += (was & (active == 0) & (cert == 0)).to(tl.int32)
    sweeps = 1
    n_active = tl.sum(active.to(tl.int32), 0)
    while (sweeps < MAX_SWEEPS) & (n_active > 0):
        pa, pb = _later_bounds(lo, hi, MODE)
        floor = tl.where(active, lo, tau)
        read = lists + (sweeps % 2) * n_kt
        write = lists + ((sweeps + 1) % 2) * n_kt
        visited += n_live
        n_next = 0
        cnt, sw, sp, mind, dneg = _sweep_sums(BM, P)
        for i in range(n_live):
            t = tl.load(read + i)
            kpos, z = _block_scores(
                q, k_base, t, start, kend, skn, skd, qpos, row_lim, ti0, ti1, scale, slope, D, BN, DOT_PREC
            )
            X = am1 * (z - m[:, None])
            cnt, sw, sp, mind, dneg = _sweep_tile(X, pa, pb, cnt, sw, sp, mind, dneg, am1, P, False, MODE)
            alive = _rmax(_rmax(X - floor[:, None], 1), 0) > 0
            tl.store(write + n_next, t, mask=alive)
            n_next += alive.to(tl.int32)
        tl.debug_barrier()
        n_live = n_next
        was = active
        lo, hi, tau, active, cert = _bracket_update(
            pa, pb, cnt, sw, sp, mind, dneg, lo, hi, tau, active, am1, P, False, MODE, TOL, FTOL
        )
        uncertified += (was & (active == 0) & (cert == 0)).to(tl.int32)
        n_active = tl.sum(active.to(tl.int32), 0)
        sweeps += 1
    tau = tl.where(active, lo, tau)  # rows still open at the sweep cap end at their lower bound
    uncertified += active.to(tl.int32)

    # 3. output over the last list; the tile mask records the tiles holding some p > 0 (what the backward
    # visits; the caller zeroed it)
    acc = tl.zeros([BM, D], tl.float32)
    lsum = tl.zeros([BM], tl.float32)
    uacc = tl.zeros([BM, D], tl.float32)
    usum = tl.zeros([BM], tl.float32)
    mask_row = TileMask + (bh.to(tl.int64) * n_qb + pid_m) * n_kt
    read = lists + (sweeps % 2) * n_kt
    visited += n_live
    for i in range(n_live):
        t = tl.load(read + i)
        kpos, z = _block_scores(
            q, k_base, t, start, kend, skn, skd, qpos, row_lim, ti0, ti1, scale, slope, D, BN, DOT_PREC
        )
        p, w = _powers(am1 * (z - m[:, None]) - tau[:, None], am1, MODE)
        v = _load_tile(v_base, kpos, _in_range(kpos, start, kend), svn, svd, D)
        acc = _dot(p.to(v.dtype), v, acc, DOT_PREC)
        lsum += _rsum(p, 1)
        if STORE_UV:
            uacc = _dot(w.to(v.dtype), v, uacc, DOT_PREC)
            usum += _rsum(w, 1)
        tl.store(mask_row + t, (_rmax(_rmax(p, 1), 0) > 0).to(tl.int8))
    inv = tl.where(lsum > 0, 1.0 / tl.where(lsum > 0, lsum, 1.0), 0.0)
    dcol = tl.arange(0, D)
    tl.store(
        O + (bh // H).to(tl.int64) * sob + (bh % H) * soh + rows[:, None] * son + dcol[None, :] * sod,
        (acc * inv[:, None]).to(O.dtype.element_ty),
        mask=rmask[:, None],
    )
    row0 = bh.to(tl.int64) * Nq
    if STORE_UV:
        uinv = tl.where(usum > 0, 1.0 / tl.where(usum > 0, usum, 1.0), 0.0)
        tl.store(UV + (row0 + rows[:, None]) * D + dcol[None, :], uacc * uinv[:, None], mask=rmask[:, None])
    srow = Stats + row0 + rows
    plane = tl.num_programs(0).to(tl.int64) * Nq  # B·H·Nq
    tl.store(srow, m, mask=rmask)
    tl.store(srow + plane, tau, mask=rmask)
    tl.store(srow + 2 * plane, inv, mask=rmask)
    if COUNT:
        crow = Counts + (bh.to(tl.int64) * n_qb + pid_m) * 4
        n_causal = (kend + BN - 1) // BN - start // BN
        tl.store(crow, sweeps)
        tl.store(crow + 1, visited)
        tl.store(crow + 2, n_causal)
        tl.store(crow + 3, tl.sum(uncertified, 0))


def _bwd_rows(DO, Stats, bh, rows, rmask, Nq, plane, D: tl.constexpr):
    """What the backward reads per query row of head bh: (row0 = the head's first row in the (B·H·Nq) row
    arrays, dO (BM, D) from the contiguous DO, and the forward's statistics M, τ, 1/Σp; `plane` = B·H·Nq)."""
    row0 = bh.to(tl.int64) * Nq
    do = _load_tile(DO + row0 * D, rows, rmask, D, 1, D)
    m, tau, inv = _row_stats(Stats, rows, rmask, row0, plane)
    return row0, do, m, tau, inv


def _row_stats(Stats, rows, rmask, row0, plane):
    """The forward's row statistics (M, τ, 1/Σp) of rows row0 + rows (`plane` = B·H·Nq)."""
    srow = Stats + row0 + rows
    return (
        tl.load(srow, mask=rmask, other=0.0),
        tl.load(srow + plane, mask=rmask, other=0.0),
        tl.load(srow + 2 * plane, mask=rmask, other=0.0),
    )


def _bwd_prep_kernel(
    Q,
    K,
    V,
    DO,
    Stats,
    Delta,
    Alpha,
    Slopes,
    Starts,
    Ends,
    sqb,
    sqh,
    sqn,
    sqd,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    H,
    GROUP,
    Nq,
    Nk,
    n_qb,
    scale,
    causal,
    D: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    MODE: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """Grid (B·H, ⌈Nq/BM⌉): δ_i = dO_i · Σ_j u_ij v_j / Σ_j u_ij (u unnormalised: the scale cancels), for
    the rows whose forward kept no Σ u·v (the decode path). dO is contiguous (B, H, Nq, D)."""
    (bh, pid_m, rows, rmask, qpos, start, row_lim, kend, t0, t1, ti0, ti1, am1, slope, q, k_base, v_base) = (
        _query_block(
            Q,
            K,
            V,
            Alpha,
            Slopes,
            Starts,
            Ends,
            sqb,
            sqh,
            sqn,
            sqd,
            skb,
            skh,
            svb,
            svh,
            H,
            GROUP,
            Nq,
            Nk,
            n_qb,
            causal,
            D,
            BM,
            BN,
            MODE,
        )
    )
    row0, do, m, tau, inv = _bwd_rows(DO, Stats, bh, rows, rmask, Nq, tl.num_programs(0).to(tl.int64) * Nq, D)
    usum = tl.zeros([BM], tl.float32)
    uv = tl.zeros([BM, D], tl.float32)
    for t in range(t0, t1):
        kpos, z = _block_scores(
            q, k_base, t, start, kend, skn, skd, qpos, row_lim, ti0, ti1, scale, slope, D, BN, DOT_PREC
        )
        _, w = _powers(am1 * (z - m[:, None]) - tau[:, None], am1, MODE)
        v = _load_tile(v_base, kpos, _in_range(kpos, start, kend), svn, svd, D)
        usum += _rsum(w, 1)
        uv = _dot(w.to(v.dtype), v, uv, DOT_PREC)
    delta = tl.sum(do.to(tl.float32) * uv, 1)
    delta = tl.where(usum > 0, delta / tl.where(usum > 0, usum, 1.0), 0.0)
    tl.store(Delta + row0 + rows, delta, mask=rmask)


def _bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    DK,
    DV,
    Stats,
    Delta,
    Blocks,
    NBlocks,
    Alpha,
    Slopes,
    Starts,
    Ends,
    sqb,
    sqh,
    sqn,
    sqd,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    H,
    GROUP,
    Nq,
    Nk,
    n_qb,
    n_kt,
    scale,
    causal,
    D: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    MODE: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """Grid (B·Hkv, ⌈Nk/BN⌉): dk, dv of one key tile, summed over the GQA group's query heads and the
    query blocks that hold support in the tile: Blocks (B·H, n_kt, n_qb) int32 lists them first for each
    (head, key tile), NBlocks (B·H, n_kt) counts them, so the loop is a plain, pipelined one. dO, DK, DV
    are contiguous."""
    bhk = tl.program_id(0)
    pid_n = tl.program_id(1)
    Hkv = H // GROUP
    b = (bhk // Hkv).to(tl.int64)
    hk = bhk % Hkv
    kpos = pid_n * BN + tl.arange(0, BN)
    start, end = _key_range(Starts, Ends, b, Nk)
    # every key of the tile is loaded (masking the load by [start, end) added register spills at D = 128):
    # keys outside the range still enter no logit, and their dk, dv come out zero if finite
    kmask = kpos < Nk
    k = _load_tile(K + b * skb + hk * skh, kpos, kmask, skn, skd, D)
    v = _load_tile(V + b * svb + hk * svh, kpos, kmask, svn, svd, D)
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    plane = (tl.num_programs(0) * GROUP).to(tl.int64) * Nq
    for hh in range(GROUP):
        h = hk * GROUP + hh
        bh = b * H + h
        row0 = bh * Nq
        am1, slope = _head_consts(Alpha, Slopes, h, MODE)
        lst = Blocks + (bh * n_kt + pid_n) * n_qb
        for i in range(tl.load(NBlocks + bh * n_kt + pid_n)):
            qb = tl.load(lst + i)
            rows = qb * BM + tl.arange(0, BM)
            rmask = rows < Nq
            row_lim = _row_limits(rows, Nq, Nk, start, end, causal)
            q = _load_tile(Q + b * sqb + h * sqh, rows, rmask, sqn, sqd, D)
            do = _load_tile(DO + row0 * D, rows, rmask, D, 1, D)
            m, tau, inv = _row_stats(Stats, rows, rmask, row0, plane)
            delta = tl.load(Delta + row0 + rows, mask=rmask, other=0.0)
            zT = _logits_t(k, tl.trans(q), rows + (Nk - Nq), kpos, start, row_lim, scale, slope, DOT_PREC)
            p, w = _powers(am1 * (zT - m[None, :]) - tau[None, :], am1, MODE)
            dv = _dot((p * inv[None, :]).to(do.dtype), do, dv, DOT_PREC)
            gT = _dot(v, tl.trans(do), None, DOT_PREC)
            dsT = w * _u_norm(inv, am1, MODE)[None, :] * (gT - delta[None, :])
            dk = _dot(dsT.to(q.dtype), q, dk, DOT_PREC)
    out = (bhk.to(tl.int64) * Nk + kpos[:, None]) * D + tl.arange(0, D)[None, :]
    tl.store(DK + out, (dk * scale).to(DK.dtype.element_ty), mask=kmask[:, None])
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=kmask[:, None])


def _bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    DQ,
    Stats,
    Delta,
    Tiles,
    NTiles,
    Alpha,
    Slopes,
    Starts,
    Ends,
    sqb,
    sqh,
    sqn,
    sqd,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    H,
    GROUP,
    Nq,
    Nk,
    n_qb,
    n_kt,
    scale,
    causal,
    D: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    MODE: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """Grid (B·H, ⌈Nq/BM⌉): dq of one query block over the key tiles holding its support: Tiles (B·H, n_qb,
    n_kt) int32 lists them first for each query block, NTiles (B·H, n_qb) counts them. dO, DQ are
    contiguous."""
    (bh, pid_m, rows, rmask, qpos, start, row_lim, kend, t0, t1, ti0, ti1, am1, slope, q, k_base, v_base) = (
        _query_block(
            Q,
            K,
            V,
            Alpha,
            Slopes,
            Starts,
            Ends,
            sqb,
            sqh,
            sqn,
            sqd,
            skb,
            skh,
            svb,
            svh,
            H,
            GROUP,
            Nq,
            Nk,
            n_qb,
            causal,
            D,
            BM,
            BN,
            MODE,
        )
    )
    row0, do, m, tau, inv = _bwd_rows(DO, Stats, bh, rows, rmask, Nq, tl.num_programs(0).to(tl.int64) * Nq, D)
    delta = tl.load(Delta + row0 + rows, mask=rmask, other=0.0)
    unorm = _u_norm(inv, am1, MODE)
    dq = tl.zeros([BM, D], tl.float32)
    lst = Tiles + (bh.to(tl.int64) * n_qb + pid_m) * n_kt
    for i in range(tl.load(NTiles + bh.to(tl.int64) * n_qb + pid_m)):
        t = tl.load(lst + i)
        kpos = t * BN + tl.arange(0, BN)
        kvalid = _in_range(kpos, start, kend)
        k = _load_tile(k_base, kpos, kvalid, skn, skd, D)
        v = _load_tile(v_base, kpos, kvalid, svn, svd, D)
        z = _logits(q, tl.trans(k), qpos, kpos, start, row_lim, scale, slope, DOT_PREC)
        _, w = _powers(am1 * (z - m[:, None]) - tau[:, None], am1, MODE)
        g = _dot(do, tl.trans(v), None, DOT_PREC)
        ds = w * unorm[:, None] * (g - delta[:, None])
        dq = _dot(ds.to(k.dtype), k, dq, DOT_PREC)
    dq = dq * scale
    dcol = tl.arange(0, D)
    tl.store(DQ + (row0 + rows[:, None]) * D + dcol[None, :], dq.to(DQ.dtype.element_ty), mask=rmask[:, None])


def _dec_program(g, H, GROUP, HPP, Nq, Nk, Starts, Ends, causal, BM: tl.constexpr):
    """A decode program's rows: HPP query heads (sharing one kv head) × Nq queries of batch row b, as rows
    r = head·Nq + query. Returns (b as int64, kv head hk, h (BM,), i (BM,), rvalid, start, row_lim, kend,
    srow = each row's index into the (B·H·Nq) scratch rows and stats)."""
    n_groups = H // HPP
    b = (g // n_groups).to(tl.int64)
    h0 = (g % n_groups) * HPP
    r = tl.arange(0, BM)
    h = h0 + r // Nq
    i = r % Nq
    rvalid = r < HPP * Nq
    start, end = _key_range(Starts, Ends, b, Nk)
    row_lim = tl.where(rvalid, _row_limits(i, Nq, Nk, start, end, causal), 0)
    return b, h0 // GROUP, h, i, rvalid, start, row_lim, tl.max(row_lim, 0), (b * H + h) * Nq + i


def _dec_scores_kernel(
    Q,
    K,
    Z,
    Mpart,
    Slopes,
    Starts,
    Ends,
    sqb,
    sqh,
    sqn,
    sqd,
    skb,
    skh,
    skn,
    skd,
    H,
    GROUP,
    HPP,
    Nq,
    Nk,
    split,
    n_split,
    scale,
    causal,
    D: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """Grid (n_split, B·H/HPP): logits of the split's visible keys [j0, j1) into Z (B·H·Nq, Nk) and the
    split's row max."""
    s = tl.program_id(0)
    b, hk, h, i, rvalid, start, row_lim, kend, srow = _dec_program(
        tl.program_id(1), H, GROUP, HPP, Nq, Nk, Starts, Ends, causal, BM
    )
    dcol = tl.arange(0, D)
    q = tl.load(
        Q + b * sqb + h[:, None] * sqh + i[:, None] * sqn + dcol[None, :] * sqd, mask=rvalid[:, None], other=0.0
    )
    slope = tl.load(Slopes + h, mask=rvalid, other=0.0)[:, None]
    k_base = K + b * skb + hk * skh
    j0 = tl.maximum(s * split, start)
    j1 = tl.minimum(s * split + split, kend)
    m = tl.full([BM], float("-inf"), tl.float32)
    for t in range((j1 - j0 + BN - 1) // BN):
        kpos = j0 + t * BN + tl.arange(0, BN)
        kT = _load_tile_t(k_base, kpos, kpos < j1, skn, skd, D)
        # the split's keys only, [j0, j1): j0 = start need not be tile-aligned, so the last tile can
        # reach past j1 into the next split, which owns (and counts) those keys
        z = _logits(q, kT, i + (Nk - Nq), kpos, start, tl.minimum(row_lim, j1), scale, slope, DOT_PREC)
        tl.store(Z + srow[:, None] * Nk + kpos[None, :], z, mask=rvalid[:, None] & (kpos[None, :] < j1))
        m = tl.maximum(m, _rmax(z, 1))
    tl.store(Mpart + srow * n_split + s, m, mask=rvalid)


def _dec_row(Mpart, Alpha, Starts, Ends, row, H, Nq, Nk, n_split, causal, BLOCK_S: tl.constexpr, MODE: tl.constexpr):
    """A decode row's (start, lim (as a 1-vector and a scalar), row max M from the split maxima, α − 1)."""
    bh = row // Nq
    start, end = _key_range(Starts, Ends, bh // H, Nk)
    lim1 = _row_limits(row % Nq + tl.zeros([1], tl.int32), Nq, Nk, start, end, causal)  # the row as a 1-vector
    lim = tl.max(lim1, 0)
    sidx = tl.arange(0, BLOCK_S)
    m = _rmax(tl.load(Mpart + row.to(tl.int64) * n_split + sidx, mask=sidx < n_split, other=float("-inf")), 0)
    m = tl.where(lim > 0, m, 0.0)
    return start, lim1, lim, m, _alpha_minus_one(Alpha, bh % H, MODE)


def _dec_filter_kernel(
    Z,
    Mpart,
    Cand,
    Cnt,
    Alpha,
    Starts,
    Ends,
    H,
    Nq,
    Nk,
    split,
    n_split,
    cap,
    causal,
    BLOCK_J: tl.constexpr,
    BLOCK_S: tl.constexpr,
    MODE: tl.constexpr,
):
    """Grid (n_split, B·H·Nq): the candidates of one split of one row, its visible logits with X = (α−1)(z − M)
    > −1 (a superset of the support, since τ ≥ −1), packed in key order into Cand (rows, n_split, cap); Cnt
    (rows, n_split) their count, which may exceed cap (the row then solves over all its logits). Every split
    of every row runs at once, so the per-row solve reads a few percent of the row instead of all of it."""
    s = tl.program_id(0)
    row = tl.program_id(1)
    start, lim1, lim, m, am1 = _dec_row(Mpart, Alpha, Starts, Ends, row, H, Nq, Nk, n_split, causal, BLOCK_S, MODE)
    seg = row.to(tl.int64) * n_split + s
    zrow = Z + row.to(tl.int64) * Nk
    j0 = tl.maximum(s * split, start)
    j1 = tl.minimum(s * split + split, lim)
    count = 0
    for c0 in range(j0, j1, BLOCK_J):
        j = c0 + tl.arange(0, BLOCK_J)
        x = tl.load(zrow + j, mask=j < j1, other=float("-inf"))
        keep = am1 * (x - m) > -1.0
        pos = count + tl.cumsum(keep.to(tl.int32), 0) - 1
        tl.store(Cand + seg * cap + pos, x, mask=keep & (pos < cap))
        count += tl.sum(keep.to(tl.int32), 0)
    tl.store(Cnt + seg, count)


def _dec_sweep(
    zrow, Cand, Cnt, row, start, lim, n_split, cap, overflow, m, a, b, am1, BLOCK_J: tl.constexpr, P, GEOM, MODE
):
    """One sweep of the decode solve (`_sweep_tile` sums at the points of `_point(a, b, ·)`) over the row's
    candidates, split by split; over all its logits [start, lim) when some split overflowed its candidates."""
    cnt, sw, sp, mind, dneg = _sweep_sums(1, P)
    n_seg = tl.where(overflow, 1, n_split)
    for s in range(n_seg):
        seg = row.to(tl.int64) * n_split + s
        base = tl.where(overflow, zrow + start, Cand + seg * cap)
        length = tl.where(overflow, lim - start, tl.minimum(tl.load(Cnt + seg), cap))
        for j0 in range(0, length, BLOCK_J):
            j = j0 + tl.arange(0, BLOCK_J)
            x = tl.load(base + j, mask=j < length, other=float("-inf"))
            cnt, sw, sp, mind, dneg = _sweep_tile(
                am1 * (x[None, :] - m), a, b, cnt, sw, sp, mind, dneg, am1, P, GEOM, MODE
            )
    return cnt, sw, sp, mind, dneg


def _dec_solve_kernel(
    Z,
    Mpart,
    Cand,
    Cnt,
    Stats,
    Alpha,
    Starts,
    Ends,
    H,
    Nq,
    Nk,
    n_split,
    cap,
    causal,
    BLOCK_J: tl.constexpr,
    BLOCK_S: tl.constexpr,
    MODE: tl.constexpr,
    P0: tl.constexpr,
    P: tl.constexpr,
    MAX_SWEEPS: tl.constexpr,
    TOL: tl.constexpr,
    FTOL: tl.constexpr,
):
    """Grid (B·H·Nq,): τ of one row by the block kernel's sweeps (`_bracket_update`) over the row's candidates
    (`_dec_filter_kernel`). Writes Stats[0] = M, Stats[1] = τ (Stats[2] is set after the output reduction)."""
    row = tl.program_id(0)
    start, lim1, lim, m, am1 = _dec_row(Mpart, Alpha, Starts, Ends, row, H, Nq, Nk, n_split, causal, BLOCK_S, MODE)
    zrow = Z + row.to(tl.int64) * Nk
    sidx = tl.arange(0, BLOCK_S)
    counts = tl.load(Cnt + row.to(tl.int64) * n_split + sidx, mask=sidx < n_split, other=0)
    overflow = tl.max(counts, 0) > cap
    nkeys = tl.maximum(lim1 - start, 0)
    lo = tl.full([1], -1.0, tl.float32)
    hi = _bracket_hi(nkeys, am1, MODE)
    tau = lo
    active = nkeys > 1
    lhi = tl.log2(-hi)
    cnt0, sw0, sp0, mind0, dneg0 = _dec_sweep(
        zrow, Cand, Cnt, row, start, lim, n_split, cap, overflow, m, lhi, lhi, am1, BLOCK_J, P0, True, MODE
    )
    lo, hi, tau, active, _ = _bracket_update(
        lhi, lhi, cnt0, sw0, sp0, mind0, dneg0, lo, hi, tau, active, am1, P0, True, MODE, TOL, FTOL
    )
    sweeps = 1
    n_active = tl.sum(active.to(tl.int32), 0)
    while (sweeps < MAX_SWEEPS) & (n_active > 0):
        pa, pb = _later_bounds(lo, hi, MODE)
        cnt, sw, sp, mind, dneg = _dec_sweep(
            zrow, Cand, Cnt, row, start, lim, n_split, cap, overflow, m, pa, pb, am1, BLOCK_J, P, False, MODE
        )
        lo, hi, tau, active, _ = _bracket_update(
            pa, pb, cnt, sw, sp, mind, dneg, lo, hi, tau, active, am1, P, False, MODE, TOL, FTOL
        )
        n_active = tl.sum(active.to(tl.int32), 0)
        sweeps += 1
    tau = tl.where(active, lo, tau)
    plane = tl.num_programs(0).to(tl.int64)
    one = tl.arange(0, 1)
    tl.store(Stats + row + one, m + tl.zeros([1], tl.float32))
    tl.store(Stats + plane + row + one, tau)


def _dec_out_kernel(
    Z,
    V,
    Stats,
    Opart,
    Lpart,
    Alpha,
    Starts,
    Ends,
    svb,
    svh,
    svn,
    svd,
    H,
    GROUP,
    HPP,
    Nq,
    Nk,
    split,
    n_split,
    causal,
    D: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    MODE: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """Grid (n_split, B·H/HPP): partial Σ p·v and Σ p of the split's visible keys (the V tile is read
    only where some p > 0)."""
    s = tl.program_id(0)
    b, hk, h, i, rvalid, start, row_lim, kend, srow = _dec_program(
        tl.program_id(1), H, GROUP, HPP, Nq, Nk, Starts, Ends, causal, BM
    )
    plane = (tl.num_programs(1) * HPP).to(tl.int64) * Nq
    m = tl.load(Stats + srow, mask=rvalid, other=0.0)
    tau = tl.load(Stats + plane + srow, mask=rvalid, other=0.0)
    if MODE == 1:
        am1 = 0.5
    elif MODE == 2:
        am1 = 1.0
    else:  # per row: the program's rows may belong to heads with different α
        am1 = (tl.load(Alpha + h, mask=rvalid, other=2.0) - 1.0)[:, None]
    v_base = V + b * svb + hk * svh
    j0 = tl.maximum(s * split, start)
    j1 = tl.minimum(s * split + split, kend)
    acc = tl.zeros([BM, D], tl.float32)
    lsum = tl.zeros([BM], tl.float32)
    for t in range((j1 - j0 + BN - 1) // BN):
        kpos = j0 + t * BN + tl.arange(0, BN)
        # keys past j1 belong to the next split (see _dec_scores_kernel): each key is counted once
        seen = (kpos[None, :] < row_lim[:, None]) & (kpos[None, :] < j1)
        z = tl.load(Z + srow[:, None] * Nk + kpos[None, :], mask=seen, other=float("-inf"))
        p, _ = _powers(am1 * (z - m[:, None]) - tau[:, None], am1, MODE)
        if _rmax(_rmax(p, 1), 0) > 0:
            v = _load_tile(v_base, kpos, kpos < j1, svn, svd, D)
            acc = _dot(p.to(v.dtype), v, acc, DOT_PREC)
            lsum += _rsum(p, 1)
    out = srow * n_split + s
    tl.store(Opart + out[:, None] * D + tl.arange(0, D)[None, :], acc, mask=rvalid[:, None])
    tl.store(Lpart + out, lsum, mask=rvalid)


_JIT_NAMES = (
    "_powers",
    "_u_norm",
    "_key_range",
    "_row_limits",
    "_alpha_minus_one",
    "_head_consts",
    "_bracket_hi",
    "_rsum",
    "_rmax",
    "_rmin",
    "_point",
    "_later_bounds",
    "_column",
    "_add_column",
    "_sweep_tile",
    "_sweep_sums",
    "_bracket_update",
    "_dot",
    "_load_tile",
    "_load_tile_t",
    "_in_range",
    "_alibi",
    "_logits",
    "_logits_t",
    "_block_scores",
    "_band_reach",
    "_band_dead",
    "_query_block",
    "_bwd_rows",
    "_row_stats",
    "_dec_program",
    "_dec_row",
    "_dec_sweep",
    "_fwd_kernel",
    "_bwd_prep_kernel",
    "_bwd_dkdv_kernel",
    "_bwd_dq_kernel",
    "_dec_scores_kernel",
    "_dec_filter_kernel",
    "_dec_solve_kernel",
    "_dec_out_kernel",
)
# Sizes stay runtime values: specialising on them (Triton does for 1 and multiples of 16) would
# compile a kernel per sequence length; strides keep their specialisation (contiguous loads).
_SIZE_ARGS = ("H", "GROUP", "HPP", "Nq", "Nk", "n_qb", "n_kt", "split", "n_split", "cap", "causal")
_RAW = {name: globals()[name] for name in _JIT_NAMES}
_BUILT: bool | None = None  # None: not built; else whether the kernels run in the interpreter


def _interpreting() -> bool:
    """TRITON_INTERPRET as triton.jit reads it (at the moment of this call)."""
    try:
        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # Triton without knobs (< 3.4)
        return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _kernels() -> bool:
    """Wraps the raw kernel functions with triton.jit (compiled or interpreted, by TRITON_INTERPRET at
    this first use) in this module's namespace, where the kernels look their helpers up. Returns
    whether they are interpreted."""
    global _BUILT
    if _BUILT is None:
        if triton is None:
            raise RuntimeError(_TRITON_ERROR)
        interpret = _interpreting()
        g = globals()
        for name in _JIT_NAMES:
            # The interpreter re-patches triton.language on every call of a jitted function, which
            # costs ~0.5 ms per helper call; plain helpers run under the kernel's patch and are exact.
            if name.endswith("_kernel"):
                raw = _RAW[name]
                sizes = [a for a in _SIZE_ARGS if a in raw.__code__.co_varnames[: raw.__code__.co_argcount]]
                g[name] = triton.jit(raw, do_not_specialize=sizes)
            elif not interpret:
                g[name] = triton.jit(_RAW[name])
        _BUILT = interpret
    return _BUILT


def _interpreter_mode() -> bool:
    """Whether the kernels run (or, once built, would run) in Triton's CPU interpreter."""
    return _BUILT if _BUILT is not None else _interpreting()


# ============================================================================ launch configuration


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _config(D: int, dtype: torch.dtype, device_type: str) -> dict:
    """Launch configuration: BM, BN (shared by the forward and the backward, since the tile mask is
    indexed in these tiles), num_warps per kernel, the dot precision, and the decode tiles (dec_BN for
    the split kernels, dec_BJ for the threshold sweep over scratch logits).

    CUDA: chosen by compiling for sm_90 with ptxas -v (16-bit inputs: no spills except ≤ 184 bytes in
    dk/dv at D = 128 and ≤ 148 bytes in general-α variants; shared memory ≤ 64 KiB). float32 inputs use
    3xTF32 dots (≈ fp32 accuracy on tensor cores; plain fp32 FMA dots spill tens of KB) and spill
    ≤ 2 KB at D = 128: fp32 is the accuracy configuration, 16-bit the fast one. Under the interpreter (CPU tensors) tiles are
    INTERPRETER_BLOCK: its cost is per tile, nearly independent of the tile's size, and tests lower it
    to 16 (the smallest tile tl.dot takes) to span more tiles."""
    if device_type != "cuda":
        b = INTERPRETER_BLOCK
        return {
            "BM": b,
            "BN": b,
            "fwd": 4,
            "prep": 4,
            "dkdv": 4,
            "dq": 4,
            "dec": 4,
            "dec_BN": b,
            "dec_BJ": 2 * b,
            "stages": 1,
            "prec": {torch.float32: "ieee", torch.bfloat16: "upcast"}.get(dtype, "tf32"),
        }
    if dtype == torch.float32:  # 32×32 keeps shared memory ≤ 64 KiB at D = 128 (A100-sized too)
        return {
            "BM": 32,
            "BN": 32,
            "fwd": 4,
            "prep": 4,
            "dkdv": 4,
            "dq": 4,
            "dec": 4,
            "dec_BN": 64,
            "dec_BJ": 512,
            "stages": 2,
            "prec": "tf32x3",
        }
    if D <= 64:
        return {
            "BM": 64,
            "BN": 64,
            "fwd": 4,
            "prep": 8,
            "dkdv": 8,
            "dq": 4,
            "dec": 4,
            "dec_BN": 64,
            "dec_BJ": 512,
            "stages": 3,
            "prec": "tf32",
        }
    return {
        "BM": 64,
        "BN": 64,
        "fwd": 8,
        "prep": 8,
        "dkdv": 8,
        "dq": 8,
        "dec": 4,
        "dec_BN": 64,
        "dec_BJ": 512,
        "stages": 2,
        "prec": "tf32",
    }


def _mode(alpha: float, alpha_heads: Tensor | None) -> int:
    if alpha_heads is None and alpha == 1.5:
        return _MODE_15
    if alpha_heads is None and alpha == 2.0:
        return _MODE_2
    return _MODE_GENERAL


_FILLED: dict = {}


def _filled(n: int, value, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A constant (n,) tensor, kept per (n, value, dtype, device): the kernels only read it, and a decode
    step then launches no fill kernels of its own."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.full((n,), value, dtype=dtype, device=device)  # graph-pool memory: not kept
    key = (n, value, dtype, str(device))
    t = _FILLED.get(key)
    if t is None:
        if len(_FILLED) > 256:
            _FILLED.clear()
        t = _FILLED[key] = torch.full((n,), value, dtype=dtype, device=device)
    return t


def _runtime_args(
    q: Tensor,
    k: Tensor,
    alpha: float,
    alpha_heads: Tensor | None,
    slopes: Tensor | None,
    key_start: Tensor | None,
    key_end: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The kernels' per-head α (H,) fp32, slopes (H,) fp32 (zeros: no bias), key starts and ends (B,)
    int32 (0 and Nk: no padding; given ones are already int32, see `_op_args`)."""
    B, H = q.shape[:2]
    Nk = int(k.shape[2])
    dev = q.device
    alphas = (
        _filled(H, float(alpha), torch.float32, dev)
        if alpha_heads is None
        else alpha_heads.to(device=dev, dtype=torch.float32).expand(H).contiguous()
    )
    slopes = (
        _filled(H, 0.0, torch.float32, dev)
        if slopes is None
        else slopes.to(device=dev, dtype=torch.float32).contiguous()
    )
    starts = _filled(B, 0, torch.int32, dev) if key_start is None else key_start
    ends = _filled(B, Nk, torch.int32, dev) if key_end is None else key_end
    return alphas, slopes, starts, ends


def _tile_mask_shape(
    B: int, H: int, Nq: int, Nk: int, D: int, dtype: torch.dtype, device_type: str, decode: bool
) -> tuple:
    if decode:
        return (0,)
    cfg = _config(D, dtype, device_type)
    return (B, H, -(-Nq // cfg["BM"]), -(-Nk // cfg["BN"]))


def _n_sm(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2


def _common_args(q: Tensor, k: Tensor, v: Tensor):
    return (*q.stride(), *k.stride(), *v.stride())


# ============================================================================ forward / backward launches


def _forward_impl(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alpha: float,
    alpha_heads: Tensor | None,
    slopes: Tensor | None,
    key_start: Tensor | None,
    key_end: Tensor | None,
    scale: float,
    is_causal: bool,
    decode: bool,
    need_uv: bool,
    tolerance: float = 0.0,
    counts: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    _kernels()
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group = H // Hkv
    mode = _mode(alpha, alpha_heads)
    max_sweeps = _MAX_SWEEPS_GENERAL if mode == _MODE_GENERAL else _MAX_SWEEPS_EXACT
    p0, p_later = SOLVER_POINTS[mode]
    cfg = _config(D, q.dtype, q.device.type)
    alphas, slopes_t, starts, ends = _runtime_args(q, k, alpha, alpha_heads, slopes, key_start, key_end)
    causal = int(is_causal)
    o = torch.empty((B, H, Nq, D), dtype=q.dtype, device=q.device)
    stats = torch.empty((3, B, H, Nq), dtype=torch.float32, device=q.device)
    empty = torch.empty((0,), dtype=torch.float32, device=q.device)
    if not decode:
        BM, BN = cfg["BM"], cfg["BN"]
        n_qb, n_kt = triton.cdiv(Nq, BM), triton.cdiv(Nk, BN)
        # the output pass writes the bits of the tiles it visits: the others must read "no support"
        tile_mask = torch.zeros((B, H, n_qb, n_kt), dtype=torch.int8, device=q.device)
        uv = torch.empty((B, H, Nq, D), dtype=torch.float32, device=q.device) if need_uv else empty
        live = torch.empty((B * H * n_qb, 2 * n_kt), dtype=torch.int32, device=q.device)
        band = slopes is not None and Nk >= BAND_MIN_KEYS
        knorm = _key_norm_bound(k, starts, ends) if band else stats
        _fwd_kernel[(B * H, n_qb)](
            q,
            k,
            v,
            o,
            stats,
            uv if need_uv else stats,
            tile_mask,
            live,
            stats if counts is None else counts,
            knorm,
            alphas,
            slopes_t,
            starts,
            ends,
            *_common_args(q, k, v),
            *o.stride(),
            H,
            group,
            Nq,
            Nk,
            n_qb,
            n_kt,
            scale,
            causal,
            D=D,
            BM=BM,
            BN=BN,
            MODE=mode,
            P0=p0,
            P=p_later,
            MAX_SWEEPS=max_sweeps,
            TOL=_TOL,
            FTOL=tolerance,
            DOT_PREC=cfg["prec"],
            BAND=band,
            BAND_EPS=ROUNDING_MARGIN,
            STORE_UV=need_uv,
            COUNT=counts is not None,
            num_warps=cfg["fwd"],
            num_stages=cfg["stages"],
        )
        return o, stats, tile_mask, uv

    # decode: split-K logits → per-row threshold → split-K output → reduction
    BN, BJ = cfg["dec_BN"], cfg["dec_BJ"]
    hpp = group if group * Nq <= 64 else 1  # query heads per program (they share one kv head)
    BMd = max(16, _next_pow2(hpp * Nq))
    n_prog = B * (H // hpp)
    n_split = max(1, min(triton.cdiv(Nk, BN), triton.cdiv(2 * _n_sm(q.device), n_prog)))
    split = triton.cdiv(triton.cdiv(Nk, n_split), BN) * BN
    n_split = triton.cdiv(Nk, split)
    rows = B * H * Nq
    z = torch.empty((rows, Nk), dtype=torch.float32, device=q.device)
    mpart = torch.empty((rows, n_split), dtype=torch.float32, device=q.device)
    _dec_scores_kernel[(n_split, n_prog)](
        q,
        k,
        z,
        mpart,
        slopes_t,
        starts,
        ends,
        *q.stride(),
        *k.stride(),
        H,
        group,
        hpp,
        Nq,
        Nk,
        split,
        n_split,
        scale,
        causal,
        D=D,
        BM=BMd,
        BN=BN,
        DOT_PREC=cfg["prec"],
        num_warps=cfg["dec"],
    )
    cap = max(16, triton.cdiv(split, DECODE_CANDIDATE_DIVISOR))
    cand = torch.empty((rows, n_split, cap), dtype=torch.float32, device=q.device)
    cand_n = torch.empty((rows, n_split), dtype=torch.int32, device=q.device)
    _dec_filter_kernel[(n_split, rows)](
        z,
        mpart,
        cand,
        cand_n,
        alphas,
        starts,
        ends,
        H,
        Nq,
        Nk,
        split,
        n_split,
        cap,
        causal,
        BLOCK_J=BJ,
        BLOCK_S=_next_pow2(n_split),
        MODE=mode,
        num_warps=cfg["dec"],
    )
    _dec_solve_kernel[(rows,)](
        z,
        mpart,
        cand,
        cand_n,
        stats,
        alphas,
        starts,
        ends,
        H,
        Nq,
        Nk,
        n_split,
        cap,
        causal,
        BLOCK_J=BJ,
        BLOCK_S=_next_pow2(n_split),
        MODE=mode,
        P0=p0,
        P=p_later,
        MAX_SWEEPS=max_sweeps,
        TOL=_TOL,
        FTOL=tolerance,
    )
    opart = torch.empty((rows, n_split, D), dtype=torch.float32, device=q.device)
    lpart = torch.empty((rows, n_split), dtype=torch.float32, device=q.device)
    _dec_out_kernel[(n_split, n_prog)](
        z,
        v,
        stats,
        opart,
        lpart,
        alphas,
        starts,
        ends,
        *v.stride(),
        H,
        group,
        hpp,
        Nq,
        Nk,
        split,
        n_split,
        causal,
        D=D,
        BM=BMd,
        BN=BN,
        MODE=mode,
        DOT_PREC=cfg["prec"],
        num_warps=cfg["dec"],
    )
    lsum = lpart.sum(1)
    inv = torch.where(lsum > 0, 1.0 / lsum, torch.zeros_like(lsum))
    o.copy_((opart.sum(1) * inv[:, None]).view(B, H, Nq, D))
    stats[2].copy_(inv.view(B, H, Nq))
    return o, stats, torch.empty((0,), dtype=torch.int8, device=q.device), empty


def _key_norm_bound(k: Tensor, starts: Tensor, ends: Tensor) -> Tensor:
    """(B·H_kv,) fp32: an upper bound of ‖k_j‖ over each batch row's keys [start, end) (the norms of 16-bit
    keys are rounded to their dtype, 2^-9 relative at most for bfloat16: widened by 2^-8)."""
    B, Hkv, Nk, _ = k.shape
    kn = torch.linalg.vector_norm(k, dim=-1).float() * (1.0 + 2.0**-8)
    j = torch.arange(Nk, device=k.device)
    seen = (j >= starts.long()[:, None]) & (j < ends.long()[:, None])  # (B, Nk)
    return kn.masked_fill(~seen[:, None, :], 0.0).amax(-1).reshape(B * Hkv).contiguous()


def _live_lists(tile_mask: Tensor, B: int, H: int, Nq: int, Nk: int, BM: int, BN: int):
    """From the forward's tile mask (B, H, n_qb, n_kt) (or, for the decode path, every visible tile): per
    query block the key tiles holding support, listed first (B, H, n_qb, n_kt) int32, and their count
    (B, H, n_qb); per key tile the query blocks, (B, H, n_kt, n_qb) and (B, H, n_kt). The backward's loops
    then run over plain lists, which Triton software-pipelines (a branch on a mask bit inside the loop
    would not be)."""
    live = tile_mask.bool()
    tiles = torch.argsort((~live).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    blocks = torch.argsort((~live).transpose(-1, -2).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return (
        tiles.contiguous(),
        live.sum(-1, dtype=torch.int32).contiguous(),
        blocks.contiguous(),
        live.sum(-2, dtype=torch.int32).contiguous(),
    )


def _backward_impl(
    do: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    stats: Tensor,
    tile_mask: Tensor,
    uv: Tensor,
    alpha: float,
    alpha_heads: Tensor | None,
    slopes: Tensor | None,
    key_start: Tensor | None,
    key_end: Tensor | None,
    scale: float,
    is_causal: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    _kernels()
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group = H // Hkv
    cfg = _config(D, q.dtype, q.device.type)
    BM, BN = cfg["BM"], cfg["BN"]
    n_qb, n_kt = triton.cdiv(Nq, BM), triton.cdiv(Nk, BN)
    mode = _mode(alpha, alpha_heads)
    alphas, slopes, starts, ends = _runtime_args(q, k, alpha, alpha_heads, slopes, key_start, key_end)
    do = do.contiguous()
    dq = torch.empty((B, H, Nq, D), dtype=q.dtype, device=q.device)
    dk = torch.empty((B, Hkv, Nk, D), dtype=k.dtype, device=k.device)
    dv = torch.empty((B, Hkv, Nk, D), dtype=v.dtype, device=v.device)
    args = (alphas, slopes, starts, ends, *_common_args(q, k, v), H, group, Nq, Nk, n_qb)
    flags = {"D": D, "BM": BM, "BN": BN, "MODE": mode, "DOT_PREC": cfg["prec"]}
    if uv.numel() > 0:  # δ_i = dO_i · (Σ_j u_ij v_j / Σ_j u_ij), the second sum kept by the forward
        delta = (do.float() * uv).sum(-1).contiguous()
    else:
        delta = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
        _bwd_prep_kernel[(B * H, n_qb)](
            q, k, v, do, stats, delta, *args, scale, int(is_causal), num_warps=cfg["prep"], **flags
        )
    if tile_mask.numel() == 0:  # the decode path keeps no tile mask: every tile a row can see
        tile_mask = _visible_tiles(q, k, starts, ends, is_causal, BM, BN)
    tiles, n_tiles, blocks, n_blocks = _live_lists(tile_mask, B, H, Nq, Nk, BM, BN)
    _bwd_dkdv_kernel[(B * Hkv, n_kt)](
        q,
        k,
        v,
        do,
        dk,
        dv,
        stats,
        delta,
        blocks,
        n_blocks,
        *args,
        n_kt,
        scale,
        int(is_causal),
        num_warps=cfg["dkdv"],
        num_stages=cfg["stages"],
        **flags,
    )
    _bwd_dq_kernel[(B * H, n_qb)](
        q,
        k,
        v,
        do,
        dq,
        stats,
        delta,
        tiles,
        n_tiles,
        *args,
        n_kt,
        scale,
        int(is_causal),
        num_warps=cfg["dq"],
        num_stages=cfg["stages"],
        **flags,
    )
    return dq, dk, dv


def _visible_tiles(q: Tensor, k: Tensor, starts: Tensor, ends: Tensor, is_causal: bool, BM: int, BN: int) -> Tensor:
    """(B, H, n_qb, n_kt) int8: 1 for the key tiles holding a key some row of the query block can see."""
    B, H, Nq, _ = q.shape
    Nk = k.shape[2]
    n_qb, n_kt = triton.cdiv(Nq, BM), triton.cdiv(Nk, BN)
    dev = q.device
    first_key = torch.arange(n_kt, device=dev) * BN  # (n_kt,)
    last_row = torch.clamp(torch.arange(n_qb, device=dev) * BM + BM - 1, max=Nq - 1) + (Nk - Nq)  # (n_qb,)
    lo = starts.to(dev).long().clamp(0, Nk)[:, None, None]
    hi = ends.to(dev).long().clamp(0, Nk)[:, None, None]
    tile_hi = torch.minimum(first_key + BN, torch.full_like(first_key, Nk))
    seen = (first_key[None, None, :] < hi) & (tile_hi[None, None, :] > lo)
    if is_causal:
        seen = seen & (first_key[None, None, :] <= last_row[None, :, None])
    return seen.to(torch.int8)[:, None].expand(B, H, n_qb, n_kt).contiguous()


# ============================================================================ custom ops (torch.compile)


@torch.library.custom_op("longsparse::triton_entmax_attention", mutates_args=())
def _attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alpha: float,
    alpha_heads: Tensor | None,
    slopes: Tensor | None,
    key_start: Tensor | None,
    key_end: Tensor | None,
    scale: float,
    is_causal: bool,
    decode: bool,
    need_uv: bool,
    tolerance: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(O (B, H, Nq, D), stats (3, B, H, Nq) fp32 = row max, τ, 1/Σp, tile mask int8 (B, H, ⌈Nq/BM⌉,
    ⌈Nk/BN⌉) or (0,) from the decode path, and with need_uv (block path) Σ_j u_ij v_j / Σ_j u_ij (B, H, Nq, D)
    fp32 for the backward's δ, else (0,)). tolerance: 0 (exact τ) or the opt-in mode's bound on |Σp − 1|."""
    return _forward_impl(
        q, k, v, alpha, alpha_heads, slopes, key_start, key_end, scale, is_causal, decode, need_uv, tolerance
    )


@_attention_op.register_fake
def _attention_fake(
    q, k, v, alpha, alpha_heads, slopes, key_start, key_end, scale, is_causal, decode, need_uv, tolerance
):
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    o = q.new_empty((B, H, Nq, D))
    stats = q.new_empty((3, B, H, Nq), dtype=torch.float32)
    mask = q.new_empty(_tile_mask_shape(B, H, Nq, Nk, D, q.dtype, q.device.type, decode), dtype=torch.int8)
    uv = q.new_empty((B, H, Nq, D) if need_uv and not decode else (0,), dtype=torch.float32)
    return o, stats, mask, uv


@torch.library.custom_op("longsparse::triton_entmax_attention_backward", mutates_args=())
def _attention_backward_op(
    do: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    stats: Tensor,
    tile_mask: Tensor,
    uv: Tensor,
    alpha: float,
    alpha_heads: Tensor | None,
    slopes: Tensor | None,
    key_start: Tensor | None,
    key_end: Tensor | None,
    scale: float,
    is_causal: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    return _backward_impl(
        do, q, k, v, stats, tile_mask, uv, alpha, alpha_heads, slopes, key_start, key_end, scale, is_causal
    )


@_attention_backward_op.register_fake
def _attention_backward_fake(
    do, q, k, v, stats, tile_mask, uv, alpha, alpha_heads, slopes, key_start, key_end, scale, is_causal
):
    # contiguous, as `_backward_impl` returns them (empty_like would copy the strides of a transposed q)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, alpha, alpha_heads, slopes, key_start, key_end, scale, is_causal, _decode, _need_uv, _tol = inputs
    _, stats, tile_mask, uv = output
    ctx.save_for_backward(q, k, v, stats, tile_mask, uv, alpha_heads, slopes, key_start, key_end)
    ctx.alpha, ctx.scale, ctx.is_causal = alpha, scale, is_causal
    ctx.mark_non_differentiable(stats, tile_mask, uv)


def _backward(ctx, do, _dstats, _dmask, _duv):
    q, k, v, stats, tile_mask, uv, alpha_heads, slopes, key_start, key_end = ctx.saved_tensors
    dq, dk, dv = _attention_backward_op(
        do, q, k, v, stats, tile_mask, uv, ctx.alpha, alpha_heads, slopes, key_start, key_end, ctx.scale, ctx.is_causal
    )
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


_attention_op.register_autograd(_backward, setup_context=_setup_context)


# ============================================================================ public API

AlphaArg = float | int | Tensor

_IGNORED_KWARGS = ("chunk_size", "topk", "adatemp_order", "path", "backend")


def supports(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mapping: str = "entmax",
    alpha: AlphaArg = 1.5,
    is_causal: bool = False,
    scale: float | None = None,
    alibi_slopes: Tensor | None = None,
    q_scale: Tensor | None = None,
    attn_mask: Tensor | None = None,
    key_start: Tensor | None = None,
    key_end: Tensor | None = None,
    decode: bool | None = None,
    tolerance: float | None = None,
    **other,
) -> str | None:
    """None when `entmax_attention_triton` can take this call, else a one-line reason.

    Accepts ``ls.attention``'s keywords (``mapping`` entmax / asentmax / sparsemax; ``chunk_size``,
    ``topk``, ``adatemp_order``, ``path``, ``backend`` are ignored) plus ``decode``. Refused:
    Triton missing; tensors not on CUDA (CPU only in interpreter mode, TRITON_INTERPRET=1); other
    mappings; α outside (1, 2], α requiring grad, an α tensor not of shape (H,); dtypes other than
    float16 / bfloat16 / float32 or mixed; head dims other than 16, 32, 64, 128; shapes that are not
    (B, H, N, D) with H divisible by H_kv and Nq ≤ Nk; an attn_mask; ALiBi slopes requiring grad or not
    of shape (H,); q_scale not (B, H, Nq) / (B, H, Nq, 1); key_start / key_end not integer (B,)
    tensors; decode=True with more than 16 queries; a tolerance that is not a float in (0, 0.5]."""
    if _TRITON_ERROR is not None:
        return _TRITON_ERROR
    for key in other:
        if key not in _IGNORED_KWARGS:
            return f"unsupported argument {key!r}"
    if mapping not in ("entmax", "asentmax", "sparsemax"):
        return f"mapping {mapping!r} is not α-entmax"
    if mapping == "sparsemax":
        alpha = 2.0
    tensors = {"q": q, "k": k, "v": v}
    for name, t in tensors.items():
        if not isinstance(t, Tensor) or t.dim() != 4:
            return f"{name} must be a 4-D (B, H, N, D) tensor"
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1:
        return f"q, k, v are on different devices: {sorted(map(str, devices))}"
    if q.device.type != "cuda" and not (q.device.type == "cpu" and _interpreter_mode()):
        return f"tensors on {q.device.type}: the kernels need CUDA (or CPU tensors with TRITON_INTERPRET=1)"
    if q.dtype not in DTYPES:
        return f"dtype {q.dtype} is not float16, bfloat16 or float32"
    if k.dtype != q.dtype or v.dtype != q.dtype:
        return f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}"
    B, H, Nq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B or k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        return f"inconsistent shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if k.shape[3] != D or v.shape[3] != D:
        return f"head dims differ: q {D}, k {k.shape[3]}, v {v.shape[3]}"
    if H % k.shape[1]:
        return f"query heads ({H}) not a multiple of key/value heads ({k.shape[1]})"
    if D not in HEAD_DIMS:
        return f"head dim {D} not one of {HEAD_DIMS}"
    Nk = k.shape[2]
    if Nk < 1 or Nq < 1:
        return "empty query or key sequence"
    if Nq > Nk:
        return f"more queries ({Nq}) than keys ({Nk}): queries sit at the last key positions"
    if isinstance(alpha, Tensor):
        if alpha.requires_grad:
            return "alpha requires grad (the kernels do not differentiate α; use backend='reference')"
        if alpha.numel() != 1 and tuple(alpha.shape) != (H,):
            return f"alpha tensor of shape {tuple(alpha.shape)}: only a scalar or per-head (H,) = ({H},)"
        if alpha.device.type == "cpu" and not torch.compiler.is_compiling():  # no device sync for CUDA α
            a = alpha.detach()
            if not bool(((a > 1) & (a <= 2)).all()):
                return "alpha outside (1, 2]"
    else:
        if not isinstance(alpha, (int, float)) or not 1.0 < float(alpha) <= 2.0:
            return f"alpha {alpha!r} outside (1, 2]"
    if attn_mask is not None:
        return "attn_mask is not supported (key_start / key_end take left / right padding, is_causal causality)"
    if alibi_slopes is not None:
        if alibi_slopes.requires_grad:
            return "alibi_slopes requires grad (not differentiated by the kernels)"
        if tuple(alibi_slopes.shape) != (H,):
            return f"alibi_slopes must have shape ({H},); got {tuple(alibi_slopes.shape)}"
    if q_scale is not None and tuple(q_scale.shape) not in ((B, H, Nq), (B, H, Nq, 1)):
        return f"q_scale must have shape ({B}, {H}, {Nq}) or ({B}, {H}, {Nq}, 1); got {tuple(q_scale.shape)}"
    for name, t in (("key_start", key_start), ("key_end", key_end)):
        if t is not None and (
            not isinstance(t, Tensor)
            or t.is_floating_point()
            or t.is_complex()
            or t.dtype == torch.bool
            or tuple(t.shape) != (B,)
        ):
            return f"{name} must be an integer tensor of shape ({B},)"
    if decode and Nq > DECODE_MAX_QUERIES:
        return f"the decode path takes at most {DECODE_MAX_QUERIES} queries; got {Nq}"
    if scale is not None and not math.isfinite(float(scale)):
        return f"scale {scale!r} is not finite"
    return tolerance_problem(tolerance)


def entmax_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    alpha: AlphaArg = 1.5,
    is_causal: bool = False,
    alibi_slopes: Tensor | None = None,
    q_scale: Tensor | None = None,
    scale: float | None = None,
    key_start: Tensor | None = None,
    key_end: Tensor | None = None,
    decode: bool | None = None,
    tolerance: float | None = None,
) -> Tensor:
    """α-entmax attention through the Triton kernels; returns (B, H, Nq, D) in q's dtype.

    q: (B, H, Nq, D); k, v: (B, H_kv, Nk, D) with H % H_kv == 0 (GQA) and Nq ≤ Nk: query i sits at
    absolute position i + Nk − Nq (bottom-right), so Nq < Nk is prefill against a cache or decoding.
    alpha: float in (1, 2] (1.5 and 2 finish exactly), or an (H,) tensor of per-head α (general solver;
    a 0-d tensor on the CPU counts as a float). Values of a CUDA α tensor are not checked here (that
    would synchronise): ls.attention checks α before it dispatches.
    alibi_slopes: (H,) slopes m, bias −m·(i − j); zero slopes are NoPE heads (NAPE = half zeros).
    q_scale: (B, H, Nq) or (B, H, Nq, 1) per-query multiplier of q (SSMax / ASEntmax), differentiable.
    scale: logit scale, default 1/√D. key_start, key_end: (B,) integers (None: 0, Nk): batch row b sees
    only the keys key_start[b] ≤ j < key_end[b] (left / right padding; positions stay the key indices);
    the keys outside get zero gradients (if finite: the dk/dv kernel loads whole key tiles).
    decode: force (True) or forbid (False) the split-K decode path; None = Nq ≤ 16 and Nk ≥ 1024.
    tolerance: None (default) solves τ exactly. A float ε in (0, 0.5] is the opt-in fast mode: a row's solve
    may stop at a τ̂ whose unnormalised Σp = S has |S − 1| ≤ ε, and p̂ = p(τ̂)/S. Then p̂ is exactly
    α-entmax of the logits times c = S^{1−α}, and ‖p̂ − p‖₁ ≤ 2|S − 1| ≤ 2ε (each row's output moves by at most
    2ε·max‖v_j‖); the backward differentiates α-entmax at p̂ (see docs/architecture.md, "Tolerance mode").
    Rows that can attend to nothing give zeros. Differentiable in q, k, v (not α, not the slopes).
    Raises ValueError with `supports`' reason when the call is not supported."""
    out, _, _, _ = _attention_op(
        *_op_args(
            q,
            k,
            v,
            alpha=alpha,
            is_causal=is_causal,
            alibi_slopes=alibi_slopes,
            q_scale=q_scale,
            scale=scale,
            key_start=key_start,
            key_end=key_end,
            decode=decode,
            tolerance=tolerance,
        )
    )
    return out


def threshold_stats(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> tuple[Tensor, Tensor, Tensor]:
    """The forward op's results for diagnostics and tests: (O, stats (3, B, H, Nq) fp32 = row max M / τ /
    1/Σp, tile mask int8 (B, H, ⌈Nq/BM⌉, ⌈Nk/BN⌉) with 1 where a key tile holds some p > 0; shape (0,)
    from the decode path). Takes `entmax_attention_triton`'s keywords."""
    out, stats, mask, _ = _attention_op(*_op_args(q, k, v, **kwargs))
    return out, stats, mask


def solver_counts(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> dict:
    """What the block forward did, per query block, counted by the kernel itself (benchmarks and tests; the
    block path only): a dict of (B, H, ⌈Nq/BM⌉) int32 tensors — `sweeps` of the threshold solve,
    `tiles_visited` (key tiles whose logits were computed, over the max pass, the sweeps and the output pass),
    `causal_tiles` (key tiles of the block's visible range: what one dense pass visits), `uncertified` (rows
    that ended renormalised rather than exactly) — and `qk_passes` = tiles_visited / causal_tiles. Takes
    `entmax_attention_triton`'s keywords."""
    args = _op_args(q, k, v, **{**kwargs, "decode": False})
    B, H, Nq, D = q.shape
    cfg = _config(D, q.dtype, q.device.type)
    n_qb = triton.cdiv(Nq, cfg["BM"])
    counts = torch.zeros((B, H, n_qb, 4), dtype=torch.int32, device=q.device)
    with torch.no_grad():
        _forward_impl(*args[:11], False, args[12], counts)
    out = dict(zip(("sweeps", "tiles_visited", "causal_tiles", "uncertified"), counts.unbind(-1)))
    out["qk_passes"] = out["tiles_visited"].float() / out["causal_tiles"].clamp(min=1).float()
    return out


def _op_args(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    alpha: AlphaArg = 1.5,
    is_causal: bool = False,
    alibi_slopes: Tensor | None = None,
    q_scale: Tensor | None = None,
    scale: float | None = None,
    key_start: Tensor | None = None,
    key_end: Tensor | None = None,
    decode: bool | None = None,
    tolerance: float | None = None,
) -> tuple:
    """Checks the call (`supports`) and turns it into the custom op's arguments."""
    reason = supports(
        q,
        k,
        v,
        alpha=alpha,
        is_causal=is_causal,
        scale=scale,
        alibi_slopes=alibi_slopes,
        q_scale=q_scale,
        key_start=key_start,
        key_end=key_end,
        decode=decode,
        tolerance=tolerance,
    )
    if reason is not None:
        raise ValueError(f"entmax_attention_triton: {reason}")
    H, Nq, D = q.shape[1:]
    Nk = k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if q_scale is not None:  # exact: the scale multiplies q·k, never the ALiBi bias
        q = q * (q_scale if q_scale.dim() == 4 else q_scale.unsqueeze(-1)).to(q.dtype)
    alpha_heads = None
    if isinstance(alpha, Tensor):
        if alpha.numel() == 1 and alpha.device.type == "cpu" and not torch.compiler.is_compiling():
            alpha = float(alpha.item())
        else:
            alpha_heads = alpha.detach().to(device=q.device, dtype=torch.float32).reshape(-1).expand(H).contiguous()
            alpha = 1.5  # not read by the kernels when per-head α is given
    slopes = None if alibi_slopes is None else alibi_slopes.detach().to(device=q.device, dtype=torch.float32)
    # the kernels' int32, clamped to [0, Nk] before narrowing (the kernels then clamp start to end)
    start, end = (
        None if t is None else t.to(q.device).clamp(0, Nk).to(torch.int32).contiguous() for t in (key_start, key_end)
    )
    if decode is None:
        decode = Nq <= DECODE_MAX_QUERIES and Nk >= DECODE_MIN_KEYS
    # the forward keeps Σ u·v for the backward's δ only when a gradient can be asked for
    need_uv = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    tol = 0.0 if tolerance is None else float(tolerance)
    return q, k, v, float(alpha), alpha_heads, slopes, start, end, scale, bool(is_causal), bool(decode), need_uv, tol
