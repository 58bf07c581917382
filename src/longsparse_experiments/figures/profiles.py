"""Figure 5, ``profiles``: mean attention weight (and the fraction of nonzero weights) vs query–key distance
for 1.5-entmax models under NoPE / ALiBi / RoPE / NAPE."""

from __future__ import annotations

from pathlib import Path
from typing import List

import torch

from longsparse.train.config import attention_of
from longsparse_experiments.figures.context import Context, Figure, long_example
from longsparse_experiments.figures.style import color_cycle, plot_note, pyplot, save

LENGTH, QUICK_LENGTH = 1024, 96  # the length of the input the profiles are measured on


def distance_bins(N: int) -> List[tuple]:
    """Exact distances 0..15, then 4 log-spaced bins per octave up to N−1."""
    bins = [(d, d + 1) for d in range(min(16, N))]
    lo = 16
    while lo < N:
        hi = min(N, max(lo + 1, int(round(lo * 2**0.25))))
        bins.append((lo, hi))
        lo = hi
    return bins


def distance_profile(attn: torch.Tensor) -> dict:
    """attn (B, H, N, N) causal maps → per head: mean weight and fraction of nonzero weights at each distance
    d = i − j (over all queries i ≥ d and the batch), then averaged in distance bins; plus the exact
    reach (largest distance with any nonzero weight) and the dead distances (within reach, never nonzero)."""
    B, H, N, _ = attn.shape
    mean_w = torch.zeros(H, N, dtype=torch.float64)
    nz = torch.zeros(H, N, dtype=torch.float64)
    for d in range(N):
        diag = torch.diagonal(attn, offset=-d, dim1=-2, dim2=-1).double()  # (B, H, N − d)
        mean_w[:, d] = diag.mean((0, 2))
        nz[:, d] = (diag > 0).double().mean((0, 2))
    bins = distance_bins(N)
    heads = []
    for h in range(H):
        nonzero_d = torch.nonzero(nz[h] > 0).flatten()
        reach = int(nonzero_d.max()) if nonzero_d.numel() else -1
        dead = int((nz[h, : reach + 1] == 0).sum()) if reach >= 0 else 0
        heads.append(
            {
                "head": h,
                "mean_weight": [float(mean_w[h, lo:hi].mean()) for lo, hi in bins],
                "nonzero_frac": [float(nz[h, lo:hi].mean()) for lo, hi in bins],
                "reach": reach,
                "dead_distances_within_reach": dead,
            }
        )
    return {"bins": [list(b) for b in bins], "bin_center": [(lo + hi - 1) / 2 for lo, hi in bins], "heads": heads}


@torch.no_grad()
def attention_profiles(model, input_ids: torch.Tensor) -> dict:
    from longsparse.nn import capture

    with capture(model, what=("attn",)) as cap:
        model(input_ids)
    return {str(layer): distance_profile(cap[layer]["attn"]) for layer in cap.layers}


def plot_profiles(data: dict, path: Path) -> None:
    plt = pyplot()
    runs = data["runs"]
    fig, axes = plt.subplots(2, len(runs), figsize=(3.5 * len(runs), 5.4), squeeze=False, sharex=True)
    colors = color_cycle()
    for col, r in enumerate(runs):
        top, bot = axes[0][col], axes[1][col]
        k = 0
        for layer, prof in r["layers"].items():
            x = [c + 1 for c in prof["bin_center"]]  # distance + 1 on a log axis
            for hd in prof["heads"]:
                c = colors[k % len(colors)]
                k += 1
                y = [v if v > 0 else float("nan") for v in hd["mean_weight"]]
                top.plot(x, y, color=c, lw=1, label=f"L{layer}h{hd['head']} reach {hd['reach']}")
                bot.plot(x, hd["nonzero_frac"], color=c, lw=1)
        top.set_yscale("log")
        top.set_title(f"{r['label']}  (gaps = exactly 0)", fontsize=9)
        top.legend(fontsize=6, ncol=2)
        bot.set_xscale("log")
        bot.set_xlabel("query–key distance + 1")
        bot.set_ylim(-0.02, 1.02)
        for ax in (top, bot):
            ax.grid(alpha=0.3)
            if data.get("train_lengths"):
                ax.axvline(data["train_lengths"][1] + 1, color="0.5", ls=":", lw=1)
    axes[0][0].set_ylabel("mean attention weight")
    axes[1][0].set_ylabel("fraction of weights > 0")
    save(fig, path, dpi=85)


def figure(ctx: Context) -> Figure:
    length = QUICK_LENGTH if ctx.quick else LENGTH
    res = []
    for m in ctx.models:
        if attention_of(m["cfg"])["method"] == "entmax":
            ids = long_example(m["cfg"], length, batch_size=1, seed=0)
            res.append({"label": m["label"], "run": m["dir"], "layers": attention_profiles(m["model"], ids)})
    d = {
        "figure": "profiles",
        "runs": res,
        "train_lengths": ctx.train_lengths,
        "length": length,
        "models": [x for x in ctx.meta if attention_of(x)["method"] == "entmax"],
    }
    summ = {
        r["label"]: {
            f"L{layer}h{hd['head']}": [hd["reach"], hd["dead_distances_within_reach"]]
            for layer, prof in r["layers"].items()
            for hd in prof["heads"]
        }
        for r in res
    }
    summ["legend"] = "[reach = largest distance with any p > 0, number of dead distances within reach]"
    if not res:
        summ = {"note": "no entmax run given: nothing to profile"}
    return Figure("fig5_profiles", d, plot_profiles if res else plot_note, summ)
