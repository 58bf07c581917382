"""Figure 2, ``p0_grid``: p₀ of z = [0, z₁, z₂] over a grid, per α, plus top-2 softmax, in float64."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

import longsparse as ls
from longsparse_experiments.figures.context import ALPHAS, Context, Figure
from longsparse_experiments.figures.style import pyplot, save


def p0_grid_data(lim: float = 5.0, points: int = 121, alphas: Sequence[float] = (1.0, *ALPHAS)) -> dict:
    g = torch.linspace(-lim, lim, points, dtype=torch.float64)
    z1, z2 = torch.meshgrid(g, g, indexing="xy")  # [row = z2 index, col = z1 index]
    z = torch.stack([torch.zeros_like(z1), z1, z2], dim=-1)
    panels = []
    for a in alphas:
        panels.append(("softmax" if a == 1 else f"{a:g}-entmax", float(a), ls.entmax(z, float(a))[..., 0]))
    from longsparse.attention import map_scores

    panels.append(("top-2 softmax", None, map_scores(z, "topk", topk=2)[..., 0]))
    out = []
    for label, a, p0 in panels:
        out.append(
            {
                "label": label,
                "alpha": a,
                "p0": [[round(float(v), 4) for v in row] for row in p0],
                "frac_exact_zero": float((p0 == 0).double().mean()),
                "frac_exact_one": float((p0 == 1).double().mean()),
            }
        )
    return {
        "figure": "p0_grid",
        "axis": [float(v) for v in g],
        "layout": "p0[i][j] is z2 = axis[i], z1 = axis[j]",
        "panels": out,
    }


def plot_p0_grid(data: dict, path: Path) -> None:
    plt = pyplot()
    import numpy as np

    panels = data["panels"]
    lim = data["axis"][-1]
    fig, axes = plt.subplots(1, len(panels), figsize=(2.9 * len(panels), 3.5), sharey=True, layout="constrained")
    im = None
    for ax, pan in zip(axes, panels):
        arr = np.array(pan["p0"])
        im = ax.imshow(arr, origin="lower", extent=(-lim, lim, -lim, lim), vmin=0, vmax=1, cmap="viridis")
        ax.contour(
            np.array(data["axis"]),
            np.array(data["axis"]),
            (arr > 0).astype(float),
            levels=[0.5],
            colors="white",
            linewidths=0.8,
        )
        ax.set_title(f"{pan['label']}\np0=0 on {100 * pan['frac_exact_zero']:.0f}%", fontsize=9)
        ax.set_xlabel("z1")
    axes[0].set_ylabel("z2")
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="p0 for z = [0, z1, z2]")
    save(fig, path, tight=False)


def figure(ctx: Context) -> Figure:
    d = p0_grid_data(points=21 if ctx.quick else 81)
    summ = {
        p["label"]: {
            "frac_p0_exact_zero": round(p["frac_exact_zero"], 4),
            "frac_p0_exact_one": round(p["frac_exact_one"], 4),
        }
        for p in d["panels"]
    }
    return Figure("fig2_p0_grid", d, plot_p0_grid, summ)
