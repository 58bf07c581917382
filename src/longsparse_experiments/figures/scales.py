"""Figure 4, ``scales``: the learned ASEntmax (or SSMax) scale per head vs position in a trained model, fitted by
δ + βn, δ + β log n and δ + β (log n)^γ (least squares; R² and RMSE per head per fit)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import torch

from longsparse.train.config import attention_of
from longsparse_experiments.figures.context import Context, Figure, long_example
from longsparse_experiments.figures.profiles import distance_bins
from longsparse_experiments.figures.style import color_cycle, plot_note, pyplot, save

LENGTH, QUICK_LENGTH = 2048, 128  # the length of the inputs the scales are captured on
SCALED_METHODS = ("asentmax", "ssmax")


def _lstsq(X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.linalg.lstsq(X, y.unsqueeze(-1)).solution.squeeze(-1)


def _fit_stats(y: torch.Tensor, yhat: torch.Tensor) -> dict:
    res = float(((y - yhat) ** 2).sum())
    tot = float(((y - y.mean()) ** 2).sum())
    return {"r2": 1.0 - res / tot if tot > 0 else float("nan"), "rmse": math.sqrt(res / y.numel())}


def fit_scale_curves(n: Sequence[float], s: Sequence[float], gamma_range: tuple = (0.02, 6.0)) -> dict:
    """Least-squares fits of s(n): ``linear`` s = δ + βn (affine: a superset of βn, so never worse than it);
    ``log`` s = δ + β log n; ``power_log``
    s = δ + β (log n)^γ (γ by a log-spaced grid over ``gamma_range`` then golden-section refinement of the
    profile residual, δ and β by linear least squares at each γ). Each with its R² and RMSE."""
    n_t = torch.as_tensor(list(n), dtype=torch.float64)
    y = torch.as_tensor(list(s), dtype=torch.float64)
    L = n_t.log()
    out = {}
    d, b = _lstsq(torch.stack([torch.ones_like(n_t), n_t], -1), y).tolist()
    out["linear"] = {"delta": d, "beta": b, **_fit_stats(y, d + b * n_t)}
    d, b = _lstsq(torch.stack([torch.ones_like(L), L], -1), y).tolist()
    out["log"] = {"delta": d, "beta": b, **_fit_stats(y, d + b * L)}

    def profile(g: float):
        X = torch.stack([torch.ones_like(L), L.pow(g)], -1)
        coef = _lstsq(X, y)
        return float(((X @ coef - y) ** 2).sum()), coef

    lo, hi = math.log(gamma_range[0]), math.log(gamma_range[1])
    grid = [math.exp(lo + (hi - lo) * i / 200) for i in range(201)]
    errs = [profile(g)[0] for g in grid]
    i = min(range(len(grid)), key=errs.__getitem__)
    a, c = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
    phi = (math.sqrt(5) - 1) / 2
    x1, x2 = c - phi * (c - a), a + phi * (c - a)
    f1, f2 = profile(x1)[0], profile(x2)[0]
    for _ in range(80):
        if f1 < f2:
            c, x2, f2 = x2, x1, f1
            x1 = c - phi * (c - a)
            f1 = profile(x1)[0]
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + phi * (c - a)
            f2 = profile(x2)[0]
    g = (a + c) / 2
    if profile(grid[i])[0] < profile(g)[0]:
        g = grid[i]
    _, coef = profile(g)
    d, b = coef.tolist()
    out["power_log"] = {"delta": d, "beta": b, "gamma": g, **_fit_stats(y, d + b * L.pow(g))}
    return out


@torch.no_grad()
def learned_scales(model, batch) -> dict:
    """Per layer and head, the learned per-query scale against n = position + 2 (the argument of the scaler's
    log, docs/method.md §2), from ``capture`` on ``batch`` (a longsparse.tasks.Batch).

    The scale is a function of each query's own hidden state, so it differs by token type; the fits use the
    *target queries* (positions with a label: the queries that carry the task, e.g. flip-flop's reads), one point
    per (example, position). Also stored: the all-query mean in log-spaced position bins and its fits. Heads whose
    scale is identically 1 (NAPE's ALiBi heads) are marked unscaled."""
    from longsparse.nn import capture
    from longsparse.tasks import IGNORE_INDEX

    with capture(model, what=("scale",)) as cap:
        model(batch.input_ids)
    B, N = batch.input_ids.shape
    tgt = (batch.labels != IGNORE_INDEX) & batch.attention_mask
    pos = torch.arange(N).expand(B, N)
    n_t = (pos[tgt] + 2).double()
    bins = distance_bins(N)
    n_bins = [float((lo + hi - 1) / 2 + 2) for lo, hi in bins]
    layers = {}
    for layer in cap.layers:
        sc = cap[layer]["scale"].double()  # (B, H, N)
        heads = []
        for h in range(sc.shape[1]):
            if bool((sc[:, h] == 1).all()):
                heads.append({"head": h, "scaled": False})
                continue
            st = sc[:, h][tgt]
            mean_all = sc[:, h].mean(0)
            binned = [float(mean_all[lo:hi].mean()) for lo, hi in bins]
            heads.append(
                {
                    "head": h,
                    "scaled": True,
                    "target_scale": [round(float(v), 5) for v in st],
                    "fits": fit_scale_curves(n_t.tolist(), st.tolist()),
                    "all_binned": [round(v, 5) for v in binned],
                    "fits_all_binned": fit_scale_curves(n_bins, binned),
                }
            )
        layers[str(layer)] = heads
    return {"target_n": [int(v) for v in n_t], "n_bins": n_bins, "examples": B, "length": N, "layers": layers}


def plot_scales(data: dict, path: Path) -> None:
    plt = pyplot()
    runs = data["runs"]
    panels = [(r, layer) for r in runs for layer in r["layers"]]
    ncol = min(4, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.9 * ncol, 3.3 * nrow), squeeze=False)
    colors = color_cycle()
    for ax, (r, layer) in zip(axes.flat, panels):
        n = r["target_n"]
        grid = sorted(set(n))
        for hd in r["layers"][layer]:
            if not hd["scaled"]:
                continue
            c = colors[hd["head"] % len(colors)]
            f = hd["fits"]["power_log"]
            ax.scatter(n, hd["target_scale"], s=3, color=c, alpha=0.35, lw=0)
            ax.plot(
                grid,
                [f["delta"] + f["beta"] * math.log(x) ** f["gamma"] for x in grid],
                color=c,
                lw=1.2,
                label=f"h{hd['head']}: γ={f['gamma']:.2f} R²={f['r2']:.2f} (log R²={hd['fits']['log']['r2']:.2f})",
            )
        lo, hi = data.get("train_lengths") or (None, None)
        if hi:
            ax.axvspan(2, hi + 2, color="0.9", zorder=0)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("n = position + 2")
        ax.set_title(f"{r['label']}  layer {layer}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    for row in axes:
        row[0].set_ylabel("scale at target queries; fit δ+β(log n)^γ")
    save(fig, path)


def figure(ctx: Context) -> Figure:
    length = QUICK_LENGTH if ctx.quick else LENGTH
    res = []
    for m in ctx.models:
        if attention_of(m["cfg"])["method"] in SCALED_METHODS:
            b = long_example(m["cfg"], length, batch_size=2 if ctx.quick else 4, seed=0, batch=True)
            res.append({"label": m["label"], "run": m["dir"], **learned_scales(m["model"], b)})
    d = {
        "figure": "scales",
        "runs": res,
        "train_lengths": ctx.train_lengths,
        "length": length,
        "models": [x for x in ctx.meta if attention_of(x)["method"] in SCALED_METHODS],
    }
    summ = {}
    for r in res:
        for layer, heads in r["layers"].items():
            for hd in heads:
                if hd["scaled"]:
                    f = hd["fits"]
                    summ[f"{r['label']} L{layer}h{hd['head']}"] = {
                        k: {
                            "r2": round(v["r2"], 3),
                            "rmse": round(v["rmse"], 4),
                            **({"gamma": round(v["gamma"], 3)} if "gamma" in v else {}),
                        }
                        for k, v in f.items()
                    }
    if not res:
        summ = {"note": "no asentmax/ssmax run given: nothing to fit"}
    return Figure("fig4_scales", d, plot_scales if res else plot_note, summ)
