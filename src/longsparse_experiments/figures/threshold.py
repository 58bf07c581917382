"""Figure 6, ``threshold``: appending tokens whose logits are below the entmax threshold leaves every existing
weight exactly unchanged; softmax always leaks mass to them (float64)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

import longsparse as ls
from longsparse.io import atomic_write_text
from longsparse_experiments.figures.context import ALPHAS, Context, Figure
from longsparse_experiments.figures.style import pyplot, save


def entmax_logit_threshold(z: torch.Tensor, alpha: float) -> float:
    """τ/(α−1) in logit units: entries of z above it get p > 0, entries at or below it get exactly 0."""
    p = ls.entmax(z, alpha)
    j = int(p.argmax())
    return float(z[j] - p[j] ** (alpha - 1) / (alpha - 1))


def threshold_data(
    n: int = 16,
    appended: Sequence[int] = (1, 10, 100, 1000, 10000, 100000),
    alphas: Sequence[float] = ALPHAS,
    gaps: Sequence[float] = (0.01, 1.0, 3.0),
    seed: int = 0,
) -> dict:
    """Base logits z ~ N(0, 2²) (n of them, float64). For each α, append m logits drawn uniformly from
    [thr − gap − 1, thr − gap] where thr = τ/(α−1) is α-entmax's threshold on z; record the largest change of any
    existing weight and the mass on the appended tokens. Softmax gets the same appended logits (α = 1.5's
    threshold), so it is compared on exactly the tokens entmax ignores."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, generator=gen, dtype=torch.float64) * 2.0
    rows = []
    for a in alphas:
        thr = entmax_logit_threshold(z, a)
        p = ls.entmax(z, a)
        for gap in gaps:
            for m in appended:
                g2 = torch.Generator().manual_seed(seed * 7919 + m)
                extra = thr - gap - torch.rand(m, generator=g2, dtype=torch.float64)
                for name, alpha in ((f"{a:g}-entmax", a), ("softmax", 1.0)):
                    if name == "softmax" and a != 1.5:
                        continue
                    base = p if alpha == a else ls.entmax(z, 1.0)
                    q = ls.entmax(torch.cat([z, extra]), alpha)
                    rows.append(
                        {
                            "mapping": name,
                            "alpha_threshold": a,
                            "gap": gap,
                            "appended": m,
                            "max_abs_change": float((q[:n] - base).abs().max()),
                            "leaked_mass": float(q[n:].sum()),
                            "support_before": int((base > 0).sum()),
                            "support_after": int((q > 0).sum()),
                        }
                    )
    return {
        "figure": "threshold",
        "n": n,
        "z": [float(v) for v in z],
        "seed": seed,
        "thresholds": {f"{a:g}": entmax_logit_threshold(z, a) for a in alphas},
        "rows": rows,
    }


def threshold_markdown(data: dict) -> str:
    ms = sorted({r["appended"] for r in data["rows"]})
    lines = [
        "| mapping | gap below threshold | " + " | ".join(f"m={m:,}" for m in ms) + " |",
        "|---|---|" + "---|" * len(ms),
    ]
    keys = sorted({(r["mapping"], r["gap"]) for r in data["rows"]}, key=lambda k: (k[0] == "softmax", k[0], k[1]))
    for mapping, gap in keys:
        cells = []
        for m in ms:
            r = next(x for x in data["rows"] if x["mapping"] == mapping and x["gap"] == gap and x["appended"] == m)
            cells.append(
                "0 (exact)"
                if r["max_abs_change"] == 0 and r["leaked_mass"] == 0
                else f"{r['max_abs_change']:.2e} / {r['leaked_mass']:.2e}"
            )
        lines.append(f"| {mapping} | {gap:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_threshold(data: dict, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    ms = sorted({r["appended"] for r in data["rows"]})
    floor = 1e-20
    for key, ax, title in (
        ("leaked_mass", axes[0], "mass on appended tokens"),
        ("max_abs_change", axes[1], "max |Δp| of existing weights"),
    ):
        seen = set()
        for r in data["rows"]:
            lab = (r["mapping"], r["gap"])
            if lab in seen:
                continue
            seen.add(lab)
            ys = [
                next(x[key] for x in data["rows"] if (x["mapping"], x["gap"]) == lab and x["appended"] == m) for m in ms
            ]
            if r["mapping"] == "softmax":
                ax.plot(ms, ys, marker="o", ms=3, label=f"softmax, gap {r['gap']:g}")
            elif r["gap"] == min(x["gap"] for x in data["rows"]):
                ax.plot(
                    ms,
                    [max(v, floor) for v in ys],
                    marker="x",
                    ls="none",
                    label=f"{r['mapping']}: exactly 0" if max(ys) == 0 else r["mapping"],
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(floor / 10, 2)
        ax.axhline(floor, color="0.6", lw=0.8, ls=":")
        ax.set_xlabel("appended tokens m (logits below entmax threshold)")
        ax.set_title(title + f" (0 drawn at {floor:g})", fontsize=9)
        ax.grid(alpha=0.3)
    axes[1].annotate(
        "α=1.25 (iterative τ): ≤ 1 ulp; α=1.5, 2 (closed-form τ): exactly 0",
        (0.02, 0.42),
        xycoords="axes fraction",
        fontsize=7,
    )
    axes[0].legend(fontsize=7)
    save(fig, path)


#: written besides the figure's JSON and PNG (figures/make.py claims it before any figure is computed)
EXTRA_OUTPUTS = ("fig6_threshold.md",)


def figure(ctx: Context) -> Figure:
    d = threshold_data(appended=(1, 10, 100) if ctx.quick else (1, 10, 100, 1000, 10000, 100000))
    table = threshold_markdown(d)
    md = ctx.out / EXTRA_OUTPUTS[0]
    atomic_write_text(
        md,
        "Max |Δp| of the existing weights / mass on the appended tokens, after appending m tokens whose logits "
        "lie `gap` below α-entmax's threshold τ/(α−1) (softmax: same tokens as 1.5-entmax).\n\n" + table + "\n",
    )
    summ = {
        "entmax_max_abs_change": max(r["max_abs_change"] for r in d["rows"] if r["mapping"] != "softmax"),
        "entmax_max_leaked_mass": max(r["leaked_mass"] for r in d["rows"] if r["mapping"] != "softmax"),
        "softmax_min_leaked_mass": min(r["leaked_mass"] for r in d["rows"] if r["mapping"] == "softmax"),
        "softmax_max_leaked_mass": max(r["leaked_mass"] for r in d["rows"] if r["mapping"] == "softmax"),
    }
    return Figure("fig6_threshold", d, plot_threshold, summ, {"markdown": str(md)})
