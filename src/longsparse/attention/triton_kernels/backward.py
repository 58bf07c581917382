"""The backward: δ where the forward kept no Σ u·V (decode), then dk/dv per key tile and dq per query block,
over the lists of live tiles built from the forward's tile mask.

Raw functions: `build.kernels()` wraps them with triton.jit at first use (see attention/triton_ops.py)."""

from .lang import tl
from .solve import _powers, _u_norm
from .tiles import (
    _block_scores,
    _dot,
    _head_consts,
    _in_range,
    _key_range,
    _load_tile,
    _logits,
    _logits_t,
    _query_block,
    _row_limits,
    _rsum,
)


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
    len_class,
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
    len_class,
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
