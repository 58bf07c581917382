"""Figure 3, ``dispersion``: normalised entropy H(p)/log n and support size vs n: (a) synthetic logits (one
signal logit + n−1 Gaussian noise logits, float64), (b) measured inside trained models on long inputs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import List, Optional, Sequence

import torch

import longsparse as ls
from longsparse_experiments.figures.context import Context, Figure, long_example
from longsparse_experiments.figures.style import color_cycle, pyplot, save

LENGTH, QUICK_LENGTH = 2048, 128  # the length of the input the trained models are measured on


# ---- (a) synthetic logits ------------------------------------------------------------------------------------
def _entropy_support(p: torch.Tensor) -> tuple:
    n = p.shape[-1]
    h = -torch.where(p > 0, p * p.clamp_min(1e-300).log(), p.new_zeros(())).sum(-1)
    return h / math.log(n), (p > 0).sum(-1).to(p.dtype)


SYNTH_MAPPINGS = {
    "softmax": lambda z, ln: ls.entmax(z, 1.0),
    "softmax(z·log n) (SSMax-style)": lambda z, ln: ls.entmax(z * ln, 1.0),
    "1.5-entmax": lambda z, ln: ls.entmax(z, 1.5),
    "1.5-entmax(z·log n) (ASEntmax-style)": lambda z, ln: ls.entmax(z * ln, 1.5),
}


def synthetic_dispersion_data(
    ns: Sequence[int] = tuple(2**k for k in range(3, 17)),
    signal: float = 4.0,
    noise_std: float = 1.0,
    draws: int = 16,
    seed: int = 0,
) -> dict:
    """Logits: one signal logit ``signal`` at index 0 and n−1 N(0, noise_std²) noise logits; ``draws`` seeded
    rows per n. Per mapping: mean (± std) normalised entropy H(p)/log n, support size and signal weight."""
    gen = torch.Generator().manual_seed(seed)
    series = {
        name: {"entropy": [], "entropy_std": [], "support": [], "support_std": [], "signal_weight": []}
        for name in SYNTH_MAPPINGS
    }
    for n in ns:
        z = torch.randn(draws, n, generator=gen, dtype=torch.float64) * noise_std
        z[:, 0] = signal
        for name, f in SYNTH_MAPPINGS.items():
            p = f(z, math.log(n))
            ent, sup = _entropy_support(p)
            s = series[name]
            s["entropy"].append(float(ent.mean()))
            s["entropy_std"].append(float(ent.std()))
            s["support"].append(float(sup.mean()))
            s["support_std"].append(float(sup.std()))
            s["signal_weight"].append(float(p[:, 0].mean()))
    return {
        "figure": "dispersion_synthetic",
        "n": list(ns),
        "signal": signal,
        "noise_std": noise_std,
        "draws": draws,
        "seed": seed,
        "series": series,
    }


# ---- (b) measured in trained models --------------------------------------------------------------------------
def _log2_bins(n_max: int) -> List[tuple]:
    """[lo, hi) bins of the number of visible keys n: [1,2), [2,4), [4,8), ... up to n_max."""
    bins, lo = [], 1
    while lo <= n_max:
        bins.append((lo, min(2 * lo, n_max + 1)))
        lo *= 2
    if len(bins) > 1 and bins[-1][1] - bins[-1][0] < bins[-1][0] // 2:  # fold a sliver into the last octave
        bins[-2:] = [(bins[-2][0], bins[-1][1])]
    return bins


@torch.no_grad()
def measured_dispersion(model, input_ids: torch.Tensor) -> dict:
    """Normalised entropy and support size of every layer/head, binned by the number n of keys a query sees
    (n = position + 1, causal), from ``longsparse.nn.capture`` on one forward pass of ``input_ids``."""
    from longsparse.nn import capture

    with capture(model, what=("support", "entropy")) as cap:
        model(input_ids)
    N = input_ids.shape[1]
    n = torch.arange(1, N + 1)
    bins = [b for b in _log2_bins(N) if b[0] >= 2]
    layers = {}
    for layer in cap.layers:
        rec = cap[layer]
        ent = rec["entropy"].float().mean(0)  # (H, N) mean over the batch
        sup = rec["support"].float().mean(0)
        e_b, s_b = [], []
        for lo, hi in bins:
            m = (n >= lo) & (n < hi)
            e_b.append([float(v) for v in ent[:, m].mean(-1)])
            s_b.append([float(v) for v in sup[:, m].mean(-1)])
        layers[str(layer)] = {"entropy": e_b, "support": s_b}  # [bin][head]
    mean_e = [
        sum(sum(layers[k]["entropy"][i]) / len(layers[k]["entropy"][i]) for k in layers) / len(layers)
        for i in range(len(bins))
    ]
    mean_s = [
        sum(sum(layers[k]["support"][i]) / len(layers[k]["support"][i]) for k in layers) / len(layers)
        for i in range(len(bins))
    ]
    return {
        "bins": [list(b) for b in bins],
        "bin_center": [math.sqrt(lo * (hi - 1)) for lo, hi in bins],
        "layers": layers,
        "mean_entropy": mean_e,
        "mean_support": mean_s,
    }


def plot_dispersion(synth: dict, measured: Optional[dict], path: Path) -> None:
    plt = pyplot()
    ncols = 4 if measured and measured.get("runs") else 2
    fig, axes = plt.subplots(1, ncols, figsize=(3.6 * ncols, 3.3))
    for name, s in synth["series"].items():
        axes[0].plot(synth["n"], s["entropy"], marker="o", ms=3, label=name)
        axes[1].plot(synth["n"], s["support"], marker="o", ms=3, label=name)
    axes[0].set_title(f"synthetic: 1 signal ({synth['signal']:g}) + N(0,1) noise", fontsize=9)
    axes[1].set_title("synthetic: support size (softmax = SSMax = n)", fontsize=9)
    axes[0].set_ylabel("H(p) / log n")
    axes[1].set_ylabel("support size (p > 0)")
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    if ncols == 4:
        colors = color_cycle()
        methods = sorted({r["label"].split("/")[0] for r in measured["runs"]})
        styles = {"nape": "-", "nope": "--", "alibi": ":", "rope": "-."}
        for r in measured["runs"]:
            meth, _, pos = r["label"].partition("/")
            kw = dict(
                marker="o",
                ms=3,
                label=r["label"],
                color=colors[methods.index(meth) % len(colors)],
                ls=styles.get(pos.split(" ")[0], "-"),
            )
            axes[2].plot(r["bin_center"], r["mean_entropy"], **kw)
            axes[3].plot(r["bin_center"], r["mean_support"], **kw)
        lo, hi = measured.get("train_lengths") or (None, None)
        for ax in axes[2:]:
            if hi:
                ax.axvspan(1, hi, color="0.9", zorder=0)
        axes[2].set_title(f"trained ({measured['task']}, len {measured['length']}): entropy", fontsize=9)
        axes[3].set_title("trained: support size (mean over layers, heads)", fontsize=9)
        axes[2].set_ylabel("H(p) / log n")
        axes[3].set_ylabel("support size")
        axes[3].set_yscale("log")
        axes[3].legend(fontsize=7, loc="upper left")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("n (keys)")
        ax.grid(alpha=0.3)
    save(fig, path)


def figure(ctx: Context) -> Figure:
    length = QUICK_LENGTH if ctx.quick else LENGTH
    synth = synthetic_dispersion_data(
        ns=tuple(2**k for k in range(3, 11 if ctx.quick else 17)), draws=4 if ctx.quick else 16
    )
    measured = {
        "task": ctx.models[0]["cfg"]["task"]["name"] if ctx.models else None,
        "length": length,
        "train_lengths": ctx.train_lengths,
        "runs": [],
    }
    for m in ctx.models:
        ids = long_example(m["cfg"], length, batch_size=1, seed=0)
        measured["runs"].append({"label": m["label"], "run": m["dir"], **measured_dispersion(m["model"], ids)})
    d = {"figure": "dispersion", "synthetic": synth, "measured": measured, "runs": ctx.meta}
    last = {
        k: {
            "entropy": round(v["entropy"][-1], 4),
            "support": round(v["support"][-1], 1),
            "signal_weight": round(v["signal_weight"][-1], 4),
        }
        for k, v in synth["series"].items()
    }
    summ = {f"synthetic_n={synth['n'][-1]}": last}
    for r in measured["runs"]:
        summ[f"measured {r['label']}"] = {
            f"n~{r['bins'][0][0]}-{r['bins'][0][1] - 1}": [
                round(r["mean_entropy"][0], 3),
                round(r["mean_support"][0], 1),
            ],
            f"n~{r['bins'][-1][0]}-{r['bins'][-1][1] - 1}": [
                round(r["mean_entropy"][-1], 3),
                round(r["mean_support"][-1], 1),
            ],
        }
    return Figure("fig3_dispersion", d, lambda dd, p: plot_dispersion(dd["synthetic"], dd["measured"], p), summ)
