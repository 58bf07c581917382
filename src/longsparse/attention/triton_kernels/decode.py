"""Decoding (few queries, a long KV cache): split-K logits, per-split candidates, a per-row solve over them,
split-K output, and the combine of the splits' partial sums into the output (five launches, nothing between).

Raw functions: `build.kernels()` wraps them with triton.jit at first use (see attention/triton_ops.py)."""

from .lang import tl
from .solve import _bracket_hi, _bracket_update, _later_bounds, _powers, _sweep_sums, _sweep_tile
from .tiles import _alpha_minus_one, _dot, _key_range, _load_tile, _load_tile_t, _logits, _rmax, _row_limits, _rsum


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
                am1 * (x[None, :] - m), a, b, cnt, sw, sp, mind, dneg, am1, P, GEOM, MODE, True
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
    lo, hi, tau, active, _, nxt = _bracket_update(
        lhi, lhi, cnt0, sw0, sp0, mind0, dneg0, lo, hi, tau, active, am1, P0, True, MODE, TOL, FTOL
    )
    sweeps = 1
    n_active = tl.sum(active.to(tl.int32), 0)
    while (sweeps < MAX_SWEEPS) & (n_active > 0):
        pa, pb = _later_bounds(lo, hi, nxt, P, MODE)
        cnt, sw, sp, mind, dneg = _dec_sweep(
            zrow, Cand, Cnt, row, start, lim, n_split, cap, overflow, m, pa, pb, am1, BLOCK_J, P, False, MODE
        )
        lo, hi, tau, active, _, nxt = _bracket_update(
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


def _dec_combine_kernel(Opart, Lpart, Out, Stats, n_split, D: tl.constexpr, BLOCK_S: tl.constexpr):
    """Grid (rows,): a row's output Σ_s Opart / Σ_s Lpart over the splits, in Out's dtype (zeros for a row that
    attends to nothing: Σp = 0), and 1/Σp into the stats' third plane. Rows are (b, h, i) in Out's
    contiguous (B, H, Nq, D) order, as the other decode kernels number them. The splits are read BLOCK_S at a
    time, so the registers stay (BLOCK_S, D) however many splits there are."""
    row = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, D)
    acc = tl.zeros([D], tl.float32)
    lsum = tl.zeros([BLOCK_S], tl.float32)
    for s0 in range(0, n_split, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        live = s < n_split
        lsum += tl.load(Lpart + row * n_split + s, mask=live, other=0.0)
        part = tl.load(Opart + (row * n_split + s)[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
        acc += tl.sum(part, 0)
    total = tl.sum(lsum, 0)
    inv = tl.where(total > 0, 1.0 / total, 0.0)
    tl.store(Out + row * D + d, (acc * inv).to(Out.dtype.element_ty))
    one = tl.arange(0, 1)
    tl.store(Stats + 2 * tl.num_programs(0).to(tl.int64) + row + one, inv + tl.zeros([1], tl.float32))
