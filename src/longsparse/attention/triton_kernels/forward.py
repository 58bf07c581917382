"""The block forward: row max (walking only the ALiBi band on ALiBi heads), the threshold sweeps over
live-tile lists, and the output pass (O, row statistics, the tile mask, Σ u·V for the backward).

Raw functions: `build.kernels()` wraps them with triton.jit at first use (see attention/triton_ops.py)."""

from .lang import tl
from .solve import (
    _anchored_proposal,
    _bracket_hi,
    _bracket_update,
    _later_bounds,
    _powers,
    _sweep_sums,
    _sweep_tile,
    _top_solve,
    _top_update,
)
from .tiles import _band_dead, _band_reach, _block_scores, _dot, _in_range, _load_tile, _query_block, _rmax, _rsum


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
    len_class,
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
    ANCHOR: tl.constexpr,
    FOLD_FROM: tl.constexpr,
    TOP: tl.constexpr,
    STORE_UV: tl.constexpr,
    COUNT: tl.constexpr,
):
    """Grid (B·H, ⌈Nq/BM⌉). Writes O, Stats[0..2] = (row max M, τ, 1/Σp), the tile mask bits of the key
    tiles holding some p > 0 (the caller zeroes the rest), with STORE_UV the backward's Σ_j u_ij v_j / Σ_j u_ij
    per row (UV, fp32), and with COUNT the program's counters (Counts: sweeps, key tiles visited over all
    passes, key tiles of the block's causal range, rows finished uncertified). Live: (B·H·⌈Nq/BM⌉, 2·n_kt)
    int32 scratch, the blocks' lists of live key tiles. BAND: ALiBi heads bound their tiles in-kernel, with
    KNorm (B·H_kv,) fp32 the largest ‖k_j‖ over each batch row's keys. ANCHOR (α = 1.5 with one-point later
    sweeps): the first sweep rides the max pass, anchored at the row max of the first tile it visits, and only
    proposes the solve's first point (`_anchored_proposal`). FOLD_FROM ≥ 0 (α = 1.5, one-point sweeps, exact
    solve; −1: off): the sweeps from that one (0-based, after the max pass) on also accumulate P·V at their
    point, and a sweep that finishes every row of the block, each certified, is the output pass too. TOP > 0
    (α = 1.5, one-point sweeps, not with ANCHOR; a power of two ≤ BN): the max pass also keeps each row's TOP
    largest scores, which certify τ* of every row whose support is smaller (`_top_solve`) and bracket the
    others' for a first sweep at P0 points spread over that bracket."""
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
    # plain (pipelined) loop. ANCHOR: the pass also takes the first sweep, at points placed from the row max
    # of the first tile it visits (the diagonal one; `_anchored_proposal` turns it into the solve's first
    # point), and lists the tiles that hold an entry within 1 (in X) of the running row max: a superset of
    # the tiles live at the row max, which the first sweep after it reads.
    m = tl.full([BM], float("-inf"), tl.float32)
    t_lo = t0
    t_hi = t1
    lo = tl.full([BM], -1.0, tl.float32)
    hi = _bracket_hi(tl.maximum(row_lim - start, 0), am1, MODE)
    lhi = tl.log2(-hi)
    lists = Live + (bh.to(tl.int64) * n_qb + pid_m) * (2 * n_kt)
    n_live = 0
    # (the first sweep's sums have P0 columns: names of their own, since loop-carried values keep one type)
    cnt0, sw0, sp0, mind0, dneg0 = _sweep_sums(BM, P0)
    m0 = tl.zeros([BM], tl.float32)  # ANCHOR: the first visited tile's row max (0 where that tile is empty)
    top = tl.full([BM, TOP if TOP > 0 else 1], float("-inf"), tl.float32)  # TOP: each row's largest scores
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
            if ANCHOR:
                m0 = tl.where(t == t_mid, tl.where(m > float("-inf"), m, 0.0), m0)
                cnt0, sw0, sp0, mind0, dneg0, n_live = _anchored_tile(
                    z, t, m, m0, lists + n_kt, n_live, lhi, cnt0, sw0, sp0, mind0, dneg0, am1, P0, MODE
                )
            if TOP > 0:
                top = _top_update(z, top, TOP)
                n_live = _list_near_max(z, t, m, lists + n_kt, n_live, am1)
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
            if ANCHOR:
                cnt0, sw0, sp0, mind0, dneg0, n_live = _anchored_tile(
                    z, t, m, m0, lists + n_kt, n_live, lhi, cnt0, sw0, sp0, mind0, dneg0, am1, P0, MODE
                )
            if TOP > 0:
                top = _top_update(z, top, TOP)
                n_live = _list_near_max(z, t, m, lists + n_kt, n_live, am1)
            t += 1
            t_hi = t
            # keys of the tiles from t on sit at least t·BN − qpos after each row (non-causal rows only)
            go = (t < t1) & (_band_dead(reach, m, slope, t * BN - qpos, BAND_EPS) == 0)
    elif ANCHOR:
        # the diagonal tile (the last) first, then the others in order
        for i in range(t0, t1):
            t = tl.where(i == t0, t1 - 1, i - 1)
            kpos, z = _block_scores(
                q, k_base, t, start, kend, skn, skd, qpos, row_lim, ti0, ti1, scale, slope, D, BN, DOT_PREC
            )
            m = tl.maximum(m, _rmax(z, 1))
            m0 = tl.where(i == t0, tl.where(m > float("-inf"), m, 0.0), m0)
            cnt0, sw0, sp0, mind0, dneg0, n_live = _anchored_tile(
                z, t, m, m0, lists + n_kt, n_live, lhi, cnt0, sw0, sp0, mind0, dneg0, am1, P0, MODE
            )
    elif TOP > 0:
        for t in range(t0, t1):
            kpos, z = _block_scores(
                q, k_base, t, start, kend, skn, skd, qpos, row_lim, ti0, ti1, scale, slope, D, BN, DOT_PREC
            )
            m = tl.maximum(m, _rmax(z, 1))
            top = _top_update(z, top, TOP)
            n_live = _list_near_max(z, t, m, lists + n_kt, n_live, am1)
    else:
        for t in range(t0, t1):
            kpos, z = _block_scores(
                q, k_base, t, start, kend, skn, skd, qpos, row_lim, ti0, ti1, scale, slope, D, BN, DOT_PREC
            )
            m = tl.maximum(m, _rmax(z, 1))
    m = tl.where(row_lim > 0, m, 0.0)
    visited = t_hi - t_lo  # the max pass

    # 2. threshold: a first sweep at P0 points spread over the bracket (or, anchored, the max pass's proposal),
    # then sweeps at P points (see `_bracket_update`) until every row of the block has finished. Each sweep
    # also lists the key tiles that hold an entry above its rows' floor (lo, or τ once finished): τ only rises
    # from there, so the other tiles hold no support and later sweeps and the output pass skip them. Two lists
    # per block (`Live`), one read while the other is written, a barrier between sweeps.
    tau = lo
    active = (row_lim - start) > 1
    uncertified = tl.zeros([BM], tl.int32)
    sweeps = 0
    if ANCHOR:
        anchor = am1 * (m0 - m)  # ≤ 0: the anchor in the row max's frame (0 for rows without keys)
        nxt = _anchored_proposal(cnt0, sw0, sp0, anchor, lo, hi, lhi, am1, P0)
    elif TOP > 0:
        # rows the largest scores certify are done; the others sweep once at P0 points geometric over their
        # bracket, reading the max pass's list (lists + n_kt) and writing the next (lists), so that either way
        # the first later sweep reads the list at lists + ((sweeps + 1) % 2)·n_kt
        certified, tau_top, lo, hi = _top_solve(top, m, row_lim - start, lo, hi, am1, TOP)
        tau = tl.where(active & certified, tau_top, tau)
        active = active & (certified == 0)
        nxt = lo
        if tl.sum(active.to(tl.int32), 0) > 0:
            llo = tl.log2(-lo)
            lhi_row = tl.log2(-hi)
            floor = tl.where(active, lo, tau)
            n_next = 0
            for i in range(n_live):
                t = tl.load(lists + n_kt + i)
                kpos, z = _block_scores(
                    q, k_base, t, start, kend, skn, skd, qpos, row_lim, ti0, ti1, scale, slope, D, BN, DOT_PREC
                )
                X = am1 * (z - m[:, None])
                cnt0, sw0, sp0, mind0, dneg0 = _sweep_tile(
                    X, llo, lhi_row, cnt0, sw0, sp0, mind0, dneg0, am1, P0, 2, MODE, True
                )
                alive = _rmax(_rmax(X - floor[:, None], 1), 0) > 0
                tl.store(lists + n_next, t, mask=alive)
                n_next += alive.to(tl.int32)
            tl.debug_barrier()
            visited += n_live
            n_live = n_next
            was = active
            lo, hi, tau, active, cert, nxt = _bracket_update(
                llo, lhi_row, cnt0, sw0, sp0, mind0, dneg0, lo, hi, tau, active, am1, P0, 2, MODE, TOL, FTOL
            )
            uncertified += (was & (active == 0) & (cert == 0)).to(tl.int32)
            sweeps = 1
    else:
        for t in range(t_lo, t_hi):
            kpos, z = _block_scores(
                q, k_base, t, start, kend, skn, skd, qpos, row_lim, ti0, ti1, scale, slope, D, BN, DOT_PREC
            )
            X = am1 * (z - m[:, None])
            cnt0, sw0, sp0, mind0, dneg0 = _sweep_tile(
                X, lhi, lhi, cnt0, sw0, sp0, mind0, dneg0, am1, P0, True, MODE, True
            )
            alive = _rmax(_rmax(X - lo[:, None], 1), 0) > 0
            tl.store(lists + n_kt + n_live, t, mask=alive)
            n_live += alive.to(tl.int32)
        tl.debug_barrier()
        visited += t_hi - t_lo
        was = active
        lo, hi, tau, active, cert, nxt = _bracket_update(
            lhi, lhi, cnt0, sw0, sp0, mind0, dneg0, lo, hi, tau, active, am1, P0, True, MODE, TOL, FTOL
        )
        uncertified += (was & (active == 0) & (cert == 0)).to(tl.int32)
        sweeps = 1
    tl.debug_barrier()
    n_active = tl.sum(active.to(tl.int32), 0)
    # the list the first later sweep reads is the one the max pass or the first sweep wrote (lists + n_kt; TOP:
    # see above)
    parity = 1 - sweeps
    if TOP > 0:
        parity = 1
    mask_row = TileMask + (bh.to(tl.int64) * n_qb + pid_m) * n_kt
    # FOLD_FROM: a folding sweep accumulates, over the support S(t) at each row's point t, Σd²v, Σd v and Σv
    # (d = X − t). A row certified at t has S(t) = S(τ) (`_bracket_update`'s finish: no entry between t and
    # τ = t + s), so its output Σ(d − s)²v = Σd²v − 2sΣd v + s²Σv and its Σ u v = Σd v − sΣv follow exactly;
    # a row finished before sits at t = τ (s = 0). A row ended uncertified here (at lo, not t), still open, or
    # with s > 0 above half its smallest d (where d − s from a rounded d loses precision) leaves the block to
    # the output pass. Tile-mask bits: a folding sweep writes those of the tiles it visits; every later sweep
    # clears those of the tiles it drops, so the output pass leaves no stale bit.
    a2 = tl.zeros([BM, D], tl.float32)
    a1 = tl.zeros([BM, D], tl.float32)
    a0 = tl.zeros([BM, D], tl.float32)
    f_s = tl.zeros([BM], tl.float32)
    f_cnt = tl.zeros([BM], tl.float32)
    f_sw = tl.zeros([BM], tl.float32)
    f_sp = tl.zeros([BM], tl.float32)
    folded = n_active * 0
    while (sweeps < MAX_SWEEPS) & (n_active > 0):
        pa, pb = _later_bounds(lo, hi, nxt, P, MODE)
        if FOLD_FROM >= 0:
            fold_now = sweeps >= FOLD_FROM
            pa = tl.where(active, pa, tau)
            pb = pa
            a2 = tl.zeros([BM, D], tl.float32)
            a1 = tl.zeros([BM, D], tl.float32)
            a0 = tl.zeros([BM, D], tl.float32)
        floor = tl.where(active, lo, tau)
        read = lists + ((sweeps + parity) % 2) * n_kt
        write = lists + ((sweeps + parity + 1) % 2) * n_kt
        visited += n_live
        n_next = 0
        cnt, sw, sp, mind, dneg = _sweep_sums(BM, P)
        for i in range(n_live):
            t = tl.load(read + i)
            kpos, z = _block_scores(
                q, k_base, t, start, kend, skn, skd, qpos, row_lim, ti0, ti1, scale, slope, D, BN, DOT_PREC
            )
            X = am1 * (z - m[:, None])
            cnt, sw, sp, mind, dneg = _sweep_tile(X, pa, pb, cnt, sw, sp, mind, dneg, am1, P, False, MODE, True)
            alive = _rmax(_rmax(X - floor[:, None], 1), 0) > 0
            tl.store(write + n_next, t, mask=alive)
            n_next += alive.to(tl.int32)
            if FOLD_FROM >= 0:
                if fold_now:
                    d = X - pa[:, None]
                    inside = d > 0
                    dp = tl.where(inside, d, 0.0)
                    v = _load_tile(v_base, kpos, _in_range(kpos, start, kend), svn, svd, D)
                    a2 = _dot((dp * dp).to(v.dtype), v, a2, DOT_PREC)
                    a1 = _dot(dp.to(v.dtype), v, a1, DOT_PREC)
                    a0 = _dot(tl.where(inside, 1.0, 0.0).to(v.dtype), v, a0, DOT_PREC)
                    tl.store(mask_row + t, (_rmax(_rmax(dp, 1), 0) > 0).to(tl.int8))
                else:
                    tl.store(mask_row + t, alive.to(tl.int8), mask=alive == 0)
        tl.debug_barrier()
        n_live = n_next
        was = active
        lo, hi, tau, active, cert, nxt = _bracket_update(
            pa, pb, cnt, sw, sp, mind, dneg, lo, hi, tau, active, am1, P, False, MODE, TOL, FTOL
        )
        ended_open = was & (active == 0) & (cert == 0)
        uncertified += ended_open.to(tl.int32)
        n_active = tl.sum(active.to(tl.int32), 0)
        sweeps += 1
        if FOLD_FROM >= 0:
            f_s = tau - pa
            # s > 0 computes d − s from d: with s ≤ half the smallest d (the smallest positive gap), rounding d to
            # the dot's precision errs at most twice as much, relative to d − s, as rounding d − s itself would
            steep = (f_s > 0) & (f_s > 0.5 * tl.min(mind, 1))
            blocked = tl.sum((ended_open | steep).to(tl.int32), 0)
            folded = (fold_now & (n_active == 0) & (blocked == 0)).to(tl.int32)
            f_cnt = _rsum(cnt, 1)
            f_sw = _rsum(sw, 1)
            f_sp = _rsum(sp, 1)
    tau = tl.where(active, lo, tau)  # rows still open at the sweep cap end at their lower bound
    uncertified += active.to(tl.int32)

    # 3. output over the last list; the tile mask records the tiles holding some p > 0 (what the backward
    # visits; the caller zeroed it)
    acc = tl.zeros([BM, D], tl.float32)
    lsum = tl.zeros([BM], tl.float32)
    uacc = tl.zeros([BM, D], tl.float32)
    usum = tl.zeros([BM], tl.float32)
    n_out = n_live
    if FOLD_FROM >= 0:  # the last sweep's accumulators at τ = t + s (see above), when it folded
        use = folded > 0
        acc = tl.where(use, a2 - (2.0 * f_s)[:, None] * a1 + (f_s * f_s)[:, None] * a0, acc)
        lsum = tl.where(use, f_sp - 2.0 * f_s * f_sw + f_s * f_s * f_cnt, lsum)
        uacc = tl.where(use, a1 - f_s[:, None] * a0, uacc)
        usum = tl.where(use, f_sw - f_s * f_cnt, usum)
        n_out = tl.where(use, 0, n_live)
    read = lists + ((sweeps + parity) % 2) * n_kt
    visited += n_out
    for i in range(n_out):
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


def _list_near_max(z, t, m, write, n_live, am1):
    """A tile z (BM, BN) of the max pass, m the running row max including it: lists tile t at write + n_live
    when some entry lies within 1 (in X) of m (a superset of the tiles live at the row max, since τ* ≥ −1).
    Returns the new list length."""
    m_seen = tl.where(m > float("-inf"), m, 0.0)  # rows without a key yet: their z are −inf
    alive = _rmax(_rmax(am1 * (z - m_seen[:, None]) + 1.0, 1), 0) > 0
    tl.store(write + n_live, t, mask=alive)
    return n_live + alive.to(tl.int32)


def _anchored_tile(z, t, m, m0, write, n_live, lhi, cnt0, sw0, sp0, mind0, dneg0, am1, P0: tl.constexpr, MODE):
    """ANCHOR: one tile z (BM, BN) of the max pass, m the running row max including it: adds it to the first
    sweep's sums at the points relative to m0, and lists tile t at write + n_live when some entry lies within
    1 (in X) of m. Returns the sums and the new list length."""
    cnt0, sw0, sp0, mind0, dneg0 = _sweep_tile(
        am1 * (z - m0[:, None]), lhi, lhi, cnt0, sw0, sp0, mind0, dneg0, am1, P0, True, MODE, False
    )
    return cnt0, sw0, sp0, mind0, dneg0, _list_near_max(z, t, m, write, n_live, am1)
