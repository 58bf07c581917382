"""What every kernel computes per tile: key ranges and row limits, the head's constants, reductions, tile
loads, logits with ALiBi and masks, the ALiBi band's bounds and the block kernels' prologue (`_query_block`).

Raw functions: `build.kernels()` wraps them with triton.jit at first use (see attention/triton_ops.py)."""

from .lang import tl


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
