"""Which keys an ALiBi head can still attend to: a provable band [first, last) of keys per query row, outside
which α-entmax gives probability exactly 0, so that attention kernels skip the key tiles outside it.

With M_i the largest logit of row i, α-entmax gives p_ij = [(α−1)(z_ij − M_i) − τ_i]₊^{1/(α−1)} with τ_i ≥ −1
(the row's largest entry has p ≤ 1), so p_ij > 0 needs z_ij > M_i − 1/(α−1). Two bounds decide that:

    z_ij ≤ scale·‖q_i‖·‖k_j‖ − m·dist(i, j)           (Cauchy–Schwarz; dist = P_i − j causal, |P_i − j| not)
    M_i ≥ LB_i = max of z_ij over a few visible keys nearest to P_i (`NEAREST_KEYS` of them)

so every key with scale·‖q_i‖·Kmax − m·dist ≤ LB_i − 1/(α−1) is dead, Kmax being the largest ‖k_j‖ on that
side of P_i among the row's visible keys: the keys at distance ≥ R_i = (scale·‖q_i‖·Kmax − LB_i + 1/(α−1))/m.
The keys on which LB_i is measured, and the row's largest logit, are never dead, so a kernel that visits the
band finds the same max and the same support as one that visits every key.

Kernels compute the logits in finite precision; `ROUNDING_MARGIN` widens the band for that (see its comment).
`alibi_live_keys` computes the band before a kernel runs (the fused CPU kernel's calls). The Triton kernel
applies the same bound inside its max pass instead (`triton_kernels/tiles.py`: `_band_reach` / `_band_dead`, with this
module's `ROUNDING_MARGIN`): walking out from the diagonal it takes for LB_i the row max of the tiles it has
already computed, which costs no extra launch and tightens as it goes; computing the band in torch before each
launch cost more GPU time than it saved (docs/benchmarks.md, "The rewritten Triton kernel on an H200").
Cost: O(B·H·(Nq·NEAREST_KEYS + Nk)·D) arithmetic (the Nk term: every key's norm, which a decoding step pays in
full), no host synchronisation, shapes independent of the data (it may run inside CUDA-graph-captured steps).
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

# Keys nearest to each query's position whose logits give the lower bound LB_i of the row max. The row max of
# an ALiBi row sits next to the diagonal; more keys raise LB_i only on heads with tiny slopes. Measured at
# N = 4096, D = 64, q, k ~ N(0, 1), scale 1/8, causal α = 1.5, one thread: live fraction of the keys on heads
# with slopes 1/h (h = 1…4) 0.0158 with 1 key, 0.0150 with 4, 16 or 64; slopes 2^-h 0.0464 / 0.0434 / 0.0423 /
# 0.0422; each key costs about as much as computing ‖q‖ (~6 ms for 8 heads there).
NEAREST_KEYS = 4

# Query rows per pass of the CPU's window products (B·H·rows·D floats of temporaries: 2 MiB for 4 heads, D = 64).
_ROWS_PER_PASS = 2048

# Relative error allowed, on each side, between the logits this function computes (float32, or float64 for
# float64 inputs) and the ones a kernel computes: every logit bound is widened by ROUNDING_MARGIN·(scale·‖q‖·‖k‖
# + m·dist), and 1/(α−1) by the same fraction plus as much in absolute terms. That covers, with a factor ≥ 2 to
# spare: q and k rounded to bfloat16 by the kernel (2^-9 relative per element, so ≤ 2^-9·‖q‖·‖k‖ on the dot
# product by Cauchy–Schwarz, for each of q and k), float32 accumulation of the dot product (≤ D·2^-24 relative
# to ‖q‖·‖k‖: 2^-16 at D = 256), the bias m·dist rounded to float32 (2^-23 relative, dist exact below 2^24) and
# the kernel's (α−1)(z − M) test taken in float32 (a few 2^-24 relative). The kernel's own τ ≥ −1 needs nothing.
ROUNDING_MARGIN = 2.0**-7


def alibi_live_keys(
    q: Tensor,
    k: Tensor,
    *,
    alibi_slopes: Optional[Tensor],
    alpha: Union[float, Tensor],
    scale: float,
    is_causal: bool,
    key_start: Optional[Tensor] = None,
    key_end: Optional[Tensor] = None,
) -> Optional[Tuple[Tensor, Tensor]]:
    """The band of keys each query row can attend to under α-entmax with ALiBi.

    q (B, H, Nq, D), already multiplied by any per-query q-scale; k (B, Hkv, Nk, D), head h reading kv head
    h // (H // Hkv). Query row i sits at position P_i = i + Nk − Nq; batch row b sees the keys
    key_start[b] ≤ j < key_end[b] ((B,) integers; None: 0 and Nk), and under is_causal only j ≤ P_i.
    Logits: z_ij = scale·q_i·k_j − m_h·dist, dist = P_i − j (causal) or |P_i − j| (not causal).
    alibi_slopes (H,): m_h (0: a head without ALiBi); None returns None. alpha: a float or (H,); heads with
    α ≤ 1 (softmax) and heads whose slope is not positive get their whole visible range.

    Tensors on another device than q are copied to it (for CUDA-graph capture, pass them on q's device).

    Returns (first, last), each (B, H, Nq) int32 on q's device: every visible key j of row i outside
    first ≤ j < last has probability exactly 0 (and first ≤ last, within the visible range); rows that see
    no key get first = last = their clamped key_start.
    """
    if alibi_slopes is None:
        return None
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"alibi_live_keys: q and k must be (B, H, N, D); got {tuple(q.shape)} and {tuple(k.shape)}")
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape[0] != B or k.shape[3] != D or Hkv == 0 or H % Hkv:
        raise ValueError(
            f"alibi_live_keys: k {tuple(k.shape)} must be (B, Hkv, Nk, D) with q's B, D and H a multiple of Hkv "
            f"(q {tuple(q.shape)})"
        )
    if alibi_slopes.shape != (H,):
        raise ValueError(f"alibi_live_keys: alibi_slopes must have shape ({H},); got {tuple(alibi_slopes.shape)}")
    dev = q.device
    if Nq == 0 or Nk == 0:
        empty = torch.zeros((B, H, Nq), dtype=torch.int32, device=dev)
        return empty, empty.clone()
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    G = H // Hkv
    eps = ROUNDING_MARGIN

    # per head: slope m (H,), c = 1/(α−1) (inf for α ≤ 1), whether the head gets a band
    m = alibi_slopes.detach().to(device=dev, dtype=cdt)
    if isinstance(alpha, Tensor):
        al = alpha.detach().to(device=dev, dtype=cdt)
    else:  # a fill on the device, not a copy from the host (allowed while a CUDA graph is captured)
        al = torch.full((H,), float(alpha), dtype=cdt, device=dev)
    if al.numel() not in (1, H):
        raise ValueError(f"alibi_live_keys: alpha must be a float or have {H} elements; got shape {tuple(al.shape)}")
    al = al.reshape(-1).expand(H)
    c = torch.where(al > 1, 1.0 / (al - 1).clamp_min(torch.finfo(cdt).tiny), torch.full_like(al, float("inf")))
    banded = (m > 0) & (al > 1)  # (H,)

    # visible keys of each row: [lo, hi) per batch row, hi cut at P_i + 1 when causal
    lo = _key_bound(key_start, B, 0, Nk, dev)  # (B,)
    hi = torch.maximum(_key_bound(key_end, B, Nk, Nk, dev), lo)
    pos = torch.arange(Nk - Nq, Nk, device=dev)  # P_i (Nq,)
    vis_hi = torch.minimum(hi[:, None], pos + 1).clamp_min(lo[:, None]) if is_causal else hi[:, None].expand(B, Nq)
    vis_lo = lo[:, None].expand(B, Nq)  # (B, Nq)
    sees = vis_hi > vis_lo

    qc, kc = q.detach().to(cdt), k.detach().to(cdt)
    a_q = abs(scale) * torch.linalg.vector_norm(qc, dim=-1)  # scale·‖q_i‖ (B, H, Nq)
    kn = torch.linalg.vector_norm(kc, dim=-1)  # ‖k_j‖ (B, Hkv, Nk)
    j = torch.arange(Nk, device=dev)
    kn_vis = kn.masked_fill(~((j >= lo[:, None]) & (j < hi[:, None]))[:, None, :], 0.0)

    # the window around P_i may miss every visible key only if key_end cuts the keys before some P_i, or when
    # not causal if key_start or Nq > Nk puts some P_i before the first visible key
    anchored = key_end is not None or (not is_causal and (key_start is not None or Nq > Nk))
    lb = _nearest_logit_bound(qc, kc, kn, a_q, m, scale, is_causal, pos, vis_lo, vis_hi, anchored)

    # Kmax on each side of P_i among the row's visible keys: a prefix max for the keys before, a suffix max after
    kpre = kn_vis.cummax(-1).values
    left_idx = torch.minimum(pos[None, :], vis_hi - 1).clamp(0, Nk - 1)  # (B, Nq)
    kmax_left = kpre.gather(2, left_idx[:, None, :].expand(B, Hkv, Nq))
    kmax_left = kmax_left.repeat_interleave(G, dim=1)  # (B, H, Nq)

    mh = m.view(1, H, 1)
    ch = c.view(1, H, 1)

    def reach(kmax: Tensor) -> Tensor:
        """The largest distance at which a key may be live, as an exact integer-valued float in [0, Nk]."""
        num = (1 + eps) * a_q * kmax - lb + ch * (1 + eps) + eps
        r = num / ((1 - eps) * mh)  # keys at dist ≥ r are dead
        return torch.nan_to_num(r, nan=float(Nk), posinf=float(Nk)).clamp(0, Nk).floor()

    first = pos.view(1, 1, Nq) - reach(kmax_left).to(torch.int64)
    if is_causal:
        last = vis_hi[:, None, :].expand(B, H, Nq)
    else:
        ksuf = kn_vis.flip(-1).cummax(-1).values.flip(-1)
        right_idx = torch.maximum(pos[None, :], vis_lo).clamp(0, Nk - 1)
        kmax_right = ksuf.gather(2, right_idx[:, None, :].expand(B, Hkv, Nq)).repeat_interleave(G, dim=1)
        last = pos.view(1, 1, Nq) + reach(kmax_right).to(torch.int64) + 1
    full = ~banded.view(1, H, 1)
    v_lo, v_hi = vis_lo[:, None, :], vis_hi[:, None, :]
    first = torch.where(full, v_lo, torch.maximum(first, v_lo))
    last = torch.where(full, v_hi, torch.minimum(last, v_hi))
    empty = ~sees[:, None, :] | (last <= first)
    first = torch.where(empty, v_lo, first)
    last = torch.where(empty, v_lo, last)
    return first.to(torch.int32), last.to(torch.int32)


def _nearest_logit_bound(qc, kc, kn, a_q, m, scale, is_causal, pos, vis_lo, vis_hi, anchored) -> Tensor:
    """LB_i (B, H, Nq): the largest logit, each lowered by its kernel-rounding allowance, among the visible keys
    of the window of `NEAREST_KEYS` keys ending at P_i (causal) or centred on it; with ``anchored`` also the
    visible key nearest P_i (for rows whose window may hold no visible key: a right-padded row while decoding,
    whose keys end before its position). −inf for rows that see no key.

    Window key P_i − t is the same shift of every row, so its logits are a product of q with a slice of k (no
    gather); the anchor is one gather."""
    B, H, Nq, D = qc.shape
    Hkv, Nk = kc.shape[1], kc.shape[2]
    G = H // Hkv
    W = min(NEAREST_KEYS, Nk)
    q5 = qc.view(B, Hkv, G, Nq, D)
    a5 = a_q.view(B, Hkv, G, Nq)
    slope = m.view(1, Hkv, G, 1)
    lb = torch.full((B, Hkv, G, Nq), float("-inf"), dtype=qc.dtype, device=qc.device)

    def lowered_logits(rows: slice, k_rows: Tensor, kn_rows: Tensor, j: Tensor) -> Tensor:
        """Logits of query rows `rows` against keys k_rows (B, Hkv, n, D) at positions j (B or 1, n), lowered
        by the rounding allowance; −inf where j is not visible to the row."""
        z = (q5[:, :, :, rows] * k_rows[:, :, None]).sum(-1) * scale
        dist = (pos[rows] - j).to(qc.dtype)
        dist = (dist if is_causal else dist.abs())[:, None, None, :]
        low = z - slope * dist - ROUNDING_MARGIN * (a5[:, :, :, rows] * kn_rows[:, :, None] + slope * dist)
        visible = (j >= vis_lo[:, rows]) & (j < vis_hi[:, rows])
        return low.masked_fill(~visible[:, None, None, :], float("-inf"))

    first_offset = 0 if is_causal else W // 2  # window key of row i: P_i − t + first_offset, t < W
    # rows in passes of _ROWS_PER_PASS on the CPU, so that a pass's q rows and products stay in cache
    step = _ROWS_PER_PASS if qc.device.type == "cpu" else Nq
    for c0 in range(0, Nq, step):
        for t in range(W):
            shift = Nk - Nq - t + first_offset  # key = i + shift
            r0, r1 = max(c0, -shift), min(c0 + step, Nq, Nk - shift)  # rows whose window key exists
            if r0 >= r1:
                continue
            rows = slice(r0, r1)
            j = torch.arange(r0 + shift, r1 + shift, device=qc.device)[None, :]
            low = lowered_logits(rows, kc[:, :, r0 + shift : r1 + shift], kn[:, :, r0 + shift : r1 + shift], j)
            lb[..., rows] = torch.maximum(lb[..., rows], low)
    if anchored:
        j = torch.minimum(torch.maximum(pos[None, :], vis_lo), vis_hi - 1).clamp(0, Nk - 1)  # (B, Nq)
        k_a = kc.gather(2, j[:, None, :, None].expand(B, Hkv, Nq, D))
        kn_a = kn.gather(2, j[:, None, :].expand(B, Hkv, Nq))
        lb = torch.maximum(lb, lowered_logits(slice(None), k_a, kn_a, j))
    return lb.view(B, H, Nq)


def _key_bound(t: Optional[Tensor], B: int, default: int, Nk: int, device: torch.device) -> Tensor:
    """key_start / key_end as (B,) int64 on device, clamped to [0, Nk] (None: `default`)."""
    if t is None:
        return torch.full((B,), default, dtype=torch.int64, device=device)
    if t.shape != (B,):
        raise ValueError(f"alibi_live_keys: key_start / key_end must have shape ({B},); got {tuple(t.shape)}")
    return t.to(device=device, dtype=torch.int64).clamp(0, Nk)
