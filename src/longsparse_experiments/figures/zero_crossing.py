"""Figure 1, ``zero_crossing``: α-entmax(z/θ) on z = [2.0, 1.8, 1.6, 1.4, 1.2] as 1/θ grows; the inverse
temperature at which each entry reaches exactly zero, in closed form (checked by bisection on ``ls.entmax``),
in float64."""

from __future__ import annotations

import math
from pathlib import Path
from typing import List, Optional, Sequence

import torch

import longsparse as ls
from longsparse_experiments.figures.context import ALPHAS, Context, Figure
from longsparse_experiments.figures.style import color_cycle, pyplot, save

Z_DEMO = (2.0, 1.8, 1.6, 1.4, 1.2)


def zero_crossing_inv_temperature(z: Sequence[float], alpha: float) -> List[Optional[float]]:
    """For each entry j of z, the inverse temperature t = 1/θ at which entry j of α-entmax(t·z) reaches zero
    (and stays zero for every larger t); None if it never does (a maximal entry, or α = 1).

    With s = t·z, p_j = [(α−1) t z_j − τ]₊^{1/(α−1)}, so p_j = 0 exactly when τ ≥ (α−1) t z_j. At the boundary
    τ = (α−1) t z_j, and Σ p = 1 over the entries above z_j gives ((α−1) t)^{1/(α−1)} S_j = 1 with
    S_j = Σ_{i: z_i > z_j} (z_i − z_j)^{1/(α−1)}, hence t_j = 1 / ((α−1) S_j^{α−1})."""
    out: List[Optional[float]] = []
    for zj in z:
        if alpha <= 1.0:
            out.append(None)
            continue
        s = sum((zi - zj) ** (1.0 / (alpha - 1.0)) for zi in z if zi > zj)
        out.append(None if s == 0 else 1.0 / ((alpha - 1.0) * s ** (alpha - 1.0)))
    return out


def zero_crossing_bisection(
    z: Sequence[float], alpha: float, j: int, lo: float = 1e-3, hi: float = 1e4, iters: int = 200
) -> Optional[float]:
    """Brute force: the smallest t with ls.entmax(t·z)_j == 0, by bisection on the exact float64 mapping."""
    zt = torch.tensor(list(z), dtype=torch.float64)

    def zero(t: float) -> bool:
        return bool(ls.entmax(zt * t, alpha)[j] == 0)

    if zero(lo) or not zero(hi):
        return None
    for _ in range(iters):
        mid = math.sqrt(lo * hi)
        if zero(mid):
            hi = mid
        else:
            lo = mid
        if hi / lo - 1 < 1e-14:
            break
    return hi


def zero_crossing_data(
    z: Sequence[float] = Z_DEMO,
    alphas: Sequence[float] = (1.0, *ALPHAS),
    t_min: float = 0.1,
    t_max: float = 100.0,
    points: int = 241,
) -> dict:
    ts = torch.logspace(math.log10(t_min), math.log10(t_max), points, dtype=torch.float64)
    zt = torch.tensor(list(z), dtype=torch.float64)
    panels = []
    for a in alphas:
        p = ls.entmax(ts[:, None] * zt[None, :], float(a))  # (points, n)
        closed = zero_crossing_inv_temperature(z, float(a))
        crossings = []
        for j, tj in enumerate(closed):
            bf = zero_crossing_bisection(z, float(a), j) if tj is not None else None
            crossings.append(
                {
                    "index": j,
                    "z": z[j],
                    "inv_temperature": tj,
                    "temperature": None if tj is None else 1.0 / tj,
                    "inv_temperature_bisection": bf,
                    "rel_error": None if tj is None or bf is None else abs(bf - tj) / tj,
                }
            )
        panels.append(
            {
                "alpha": float(a),
                "label": "softmax" if a == 1 else f"{a:g}-entmax",
                "probabilities": [[round(float(v), 7) for v in row] for row in p.T],
                "support_size": [int(v) for v in (p > 0).sum(-1)],
                "zero_crossings": crossings,
            }
        )
    return {
        "figure": "zero_crossing",
        "z": list(z),
        "inv_temperature": [float(t) for t in ts],
        "formula": "t_j = 1/((alpha-1) * S_j^(alpha-1)), S_j = sum_{z_i > z_j} (z_i - z_j)^(1/(alpha-1))",
        "panels": panels,
    }


def plot_zero_crossing(data: dict, path: Path) -> None:
    plt = pyplot()
    panels = data["panels"]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.2), sharey=True)
    ts = data["inv_temperature"]
    colors = color_cycle()
    for ax, pan in zip(axes, panels):
        for j, row in enumerate(pan["probabilities"]):
            ax.plot(ts, row, color=colors[j % len(colors)], label=f"z={data['z'][j]:g}")
        for c in pan["zero_crossings"]:
            if c["inv_temperature"] is not None:
                ax.axvline(c["inv_temperature"], color=colors[c["index"] % len(colors)], ls=":", lw=1)
                ax.annotate(
                    f"{c['inv_temperature']:.3g}",
                    (c["inv_temperature"], 0.02 + 0.07 * c["index"]),
                    fontsize=7,
                    color=colors[c["index"] % len(colors)],
                    rotation=90,
                    ha="right",
                )
        ax.set_xscale("log")
        ax.set_title(pan["label"])
        ax.set_xlabel("1/θ")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("p_j of α-entmax(z/θ)")
    axes[0].legend(fontsize=7, loc="center left")
    fig.suptitle("Entries reach exactly 0 at 1/θ = 1/((α−1)·S_j^(α−1)) (dotted); softmax never", fontsize=10)
    save(fig, path)


def figure(ctx: Context) -> Figure:
    d = zero_crossing_data(points=61 if ctx.quick else 241)
    summ = {p["label"]: {str(c["z"]): c["inv_temperature"] for c in p["zero_crossings"]} for p in d["panels"]}
    summ["max_rel_error_vs_bisection"] = max((c["rel_error"] or 0.0) for p in d["panels"] for c in p["zero_crossings"])
    return Figure("fig1_zero_crossing", d, plot_zero_crossing, summ)
