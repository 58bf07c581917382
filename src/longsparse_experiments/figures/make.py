"""The analyses of paper [A] as figures (docs/method.md §7), each a PNG with its numbers in a JSON file next to it.

    longsparse figures --out docs/figures [--runs RUN ...] [--quick] [--only 1,3,6]

1. ``zero_crossing``  α-entmax(z/θ), z = [2.0, 1.8, 1.6, 1.4, 1.2], as 1/θ grows; the inverse temperature at which
                      each entry reaches exactly zero, in closed form (checked by bisection on ``ls.entmax``).
2. ``p0_grid``        p₀ of z = [0, z₁, z₂] over a grid, per α, plus top-2 softmax.
3. ``dispersion``     normalised entropy H(p)/log n and support size vs n: (a) synthetic logits (one signal logit
                      + n−1 Gaussian noise logits), (b) measured inside trained models on long inputs.
4. ``scales``         learned ASEntmax scale per head vs position in a trained model, fitted by βn, δ + β log n
                      and δ + β (log n)^γ (least squares; R² and RMSE per head per fit).
5. ``profiles``       mean attention weight vs query–key distance for 1.5-entmax under NoPE / ALiBi / RoPE.
6. ``threshold``      appending tokens whose logits are below the entmax threshold leaves every existing weight
                      exactly unchanged; softmax always leaks mass to them.

Figures 3b, 4 and 5 need trained models: the run directories given with ``--runs`` (``longsparse train``), or,
without ``--runs``, small flip-flop models trained here and cached in ``<out>/runs/`` (``--quick``: ``<out>/runs/quick/``) (``DEFAULT_RUNS``; a rerun
finds them complete and only reloads them). Everything is seeded. The numbers are computed in float64 where the
figure is about exactness (1, 2, 6) and in the models' own float32 otherwise.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import torch

import longsparse as ls
from longsparse.io import atomic_savefig, atomic_write_text, read_jsonl

FIGURES = ("zero_crossing", "p0_grid", "dispersion", "scales", "profiles", "threshold")
Z_DEMO = (2.0, 1.8, 1.6, 1.4, 1.2)
ALPHAS = (1.25, 1.5, 2.0)

# ---- trained models --------------------------------------------------------------------------------------
#: The models trained when no --runs are given: flip-flop (docs/method.md §5, write prob 0.1), the repository's cpu preset
#: (src/longsparse/configs/flip_flop/cpu.toml: 2 layers, d_model 64, 4 heads × 16, GeGLU 128, AdamW lr 1e-3, 400 steps, 40 warm-up,
#: batch 32, train lengths U[32, 64], seed 0, 1 thread) with one validation at the end.
DEFAULT_RUNS = (
    ("softmax-nape", "softmax", "nape"),
    ("entmax-nape", "entmax", "nape"),
    ("asentmax-nape", "asentmax", "nape"),
    ("softmax-nope", "softmax", "nope"),
    ("entmax-nope", "entmax", "nope"),
    ("asentmax-nope", "asentmax", "nope"),
    ("entmax-alibi", "entmax", "alibi"),
    ("entmax-rope", "entmax", "rope"),
)
DEFAULT_TASK = "flip_flop"
DEFAULT_SETS = ("train.val_every=0", "train.val_lengths=[64, 256]", "train.val_samples=64")
QUICK_STEPS = 8


def default_run_configs(quick: bool = False) -> Dict[str, dict]:
    from longsparse.train import build_config

    out = {}
    for name, method, positions in DEFAULT_RUNS:
        sets = list(DEFAULT_SETS)
        if quick:
            sets += ["train.val_lengths=[64]", "train.val_samples=8", f"train.warmup_steps={QUICK_STEPS}"]
        out[name] = build_config(DEFAULT_TASK, preset="cpu", method=method, positions=positions, seed=0,
                                 steps=QUICK_STEPS if quick else None, sets=sets)
    return out


def ensure_default_runs(cache: Path, quick: bool = False, log: Callable[[str], None] = print) -> List[Path]:
    """Train (or find complete) the DEFAULT_RUNS under ``cache``; returns their run directories."""
    from longsparse.train import train

    dirs = []
    for name, cfg in default_run_configs(quick).items():
        d = Path(cache) / name
        t0 = time.perf_counter()
        res = train(cfg, str(d), printer=lambda s: None, progress=False)
        state = "found complete" if res.get("resumed") else "trained"
        log(f"  run {d}: {state} in {time.perf_counter() - t0:.0f} s (step {res['step']})")
        dirs.append(d)
    return dirs


def _load_run(run: Path):
    """(model in eval mode, config dict, checkpoint name, validation record) of a run directory."""
    from longsparse.nn import load_checkpoint
    from longsparse.train import checkpoint_path, read_config

    cfg = read_config(run)
    which = "best" if checkpoint_path(run, "best").exists() else "last"
    model, extra = load_checkpoint(str(checkpoint_path(run, which)))
    model.eval()
    val = extra.get("val")
    if val is None:
        mpath = Path(run) / "metrics.jsonl"
        if mpath.exists():
            recs = read_jsonl(mpath)          # tolerates a line torn by a killed training
            vals = [r["val"] for r in recs if "val" in r]
            val = vals[-1] if vals else None
    return model, cfg, which, val


def _run_label(cfg: Mapping) -> str:
    m = cfg["model"]
    lab = f"{m['method']}/{m['positions']}"
    if m["method"] in ("entmax", "asentmax") and float(m.get("alpha", 1.5)) != 1.5:
        lab += f" (α={m['alpha']})"
    return lab


def _long_example(cfg: Mapping, length: int, batch_size: int = 1, seed: int = 0, batch: bool = False):
    """Test-split example(s) of the run's task at ``length``: the input ids, or the whole Batch."""
    from longsparse.train import make_task

    task = make_task(cfg["task"])
    b = task.batch(length, batch_size=batch_size, seed=seed, split="test")
    return b if batch else b.input_ids


# ---- 1. zero crossings -------------------------------------------------------------------------------------
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


def zero_crossing_bisection(z: Sequence[float], alpha: float, j: int, lo: float = 1e-3, hi: float = 1e4,
                            iters: int = 200) -> Optional[float]:
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


def zero_crossing_data(z: Sequence[float] = Z_DEMO, alphas: Sequence[float] = (1.0, *ALPHAS),
                       t_min: float = 0.1, t_max: float = 100.0, points: int = 241) -> dict:
    ts = torch.logspace(math.log10(t_min), math.log10(t_max), points, dtype=torch.float64)
    zt = torch.tensor(list(z), dtype=torch.float64)
    panels = []
    for a in alphas:
        p = ls.entmax(ts[:, None] * zt[None, :], float(a))        # (points, n)
        closed = zero_crossing_inv_temperature(z, float(a))
        crossings = []
        for j, tj in enumerate(closed):
            bf = zero_crossing_bisection(z, float(a), j) if tj is not None else None
            crossings.append({"index": j, "z": z[j], "inv_temperature": tj,
                              "temperature": None if tj is None else 1.0 / tj,
                              "inv_temperature_bisection": bf,
                              "rel_error": None if tj is None or bf is None else abs(bf - tj) / tj})
        panels.append({"alpha": float(a), "label": "softmax" if a == 1 else f"{a:g}-entmax",
                       "probabilities": [[round(float(v), 7) for v in row] for row in p.T],
                       "support_size": [int(v) for v in (p > 0).sum(-1)],
                       "zero_crossings": crossings})
    return {"figure": "zero_crossing", "z": list(z), "inv_temperature": [float(t) for t in ts],
            "formula": "t_j = 1/((alpha-1) * S_j^(alpha-1)), S_j = sum_{z_i > z_j} (z_i - z_j)^(1/(alpha-1))",
            "panels": panels}


def plot_zero_crossing(data: dict, path: Path) -> None:
    plt = _plt()
    panels = data["panels"]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.2), sharey=True)
    ts = data["inv_temperature"]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, pan in zip(axes, panels):
        for j, row in enumerate(pan["probabilities"]):
            ax.plot(ts, row, color=colors[j % len(colors)], label=f"z={data['z'][j]:g}")
        for c in pan["zero_crossings"]:
            if c["inv_temperature"] is not None:
                ax.axvline(c["inv_temperature"], color=colors[c["index"] % len(colors)], ls=":", lw=1)
                ax.annotate(f"{c['inv_temperature']:.3g}", (c["inv_temperature"], 0.02 + 0.07 * c["index"]),
                            fontsize=7, color=colors[c["index"] % len(colors)], rotation=90, ha="right")
        ax.set_xscale("log")
        ax.set_title(pan["label"])
        ax.set_xlabel("1/θ")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("p_j of α-entmax(z/θ)")
    axes[0].legend(fontsize=7, loc="center left")
    fig.suptitle("Entries reach exactly 0 at 1/θ = 1/((α−1)·S_j^(α−1)) (dotted); softmax never", fontsize=10)
    _save(fig, path)


# ---- 2. p0 over a grid -------------------------------------------------------------------------------------
def p0_grid_data(lim: float = 5.0, points: int = 121, alphas: Sequence[float] = (1.0, *ALPHAS)) -> dict:
    g = torch.linspace(-lim, lim, points, dtype=torch.float64)
    z1, z2 = torch.meshgrid(g, g, indexing="xy")                   # [row = z2 index, col = z1 index]
    z = torch.stack([torch.zeros_like(z1), z1, z2], dim=-1)
    panels = []
    for a in alphas:
        panels.append(("softmax" if a == 1 else f"{a:g}-entmax", float(a), ls.entmax(z, float(a))[..., 0]))
    from longsparse.attention import map_scores
    panels.append(("top-2 softmax", None, map_scores(z, "topk", topk=2)[..., 0]))
    out = []
    for label, a, p0 in panels:
        out.append({"label": label, "alpha": a, "p0": [[round(float(v), 4) for v in row] for row in p0],
                    "frac_exact_zero": float((p0 == 0).double().mean()),
                    "frac_exact_one": float((p0 == 1).double().mean())})
    return {"figure": "p0_grid", "axis": [float(v) for v in g], "layout": "p0[i][j] is z2 = axis[i], z1 = axis[j]",
            "panels": out}


def plot_p0_grid(data: dict, path: Path) -> None:
    plt = _plt()
    import numpy as np

    panels = data["panels"]
    lim = data["axis"][-1]
    fig, axes = plt.subplots(1, len(panels), figsize=(2.9 * len(panels), 3.5), sharey=True,
                             layout="constrained")
    im = None
    for ax, pan in zip(axes, panels):
        arr = np.array(pan["p0"])
        im = ax.imshow(arr, origin="lower", extent=(-lim, lim, -lim, lim), vmin=0, vmax=1, cmap="viridis")
        ax.contour(np.array(data["axis"]), np.array(data["axis"]), (arr > 0).astype(float), levels=[0.5],
                   colors="white", linewidths=0.8)
        ax.set_title(f"{pan['label']}\np0=0 on {100 * pan['frac_exact_zero']:.0f}%", fontsize=9)
        ax.set_xlabel("z1")
    axes[0].set_ylabel("z2")
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="p0 for z = [0, z1, z2]")
    _save(fig, path, tight=False)


# ---- 3a. dispersion on synthetic logits --------------------------------------------------------------------
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


def synthetic_dispersion_data(ns: Sequence[int] = tuple(2 ** k for k in range(3, 17)), signal: float = 4.0,
                              noise_std: float = 1.0, draws: int = 16, seed: int = 0) -> dict:
    """Logits: one signal logit ``signal`` at index 0 and n−1 N(0, noise_std²) noise logits; ``draws`` seeded
    rows per n. Per mapping: mean (± std) normalised entropy H(p)/log n, support size and signal weight."""
    gen = torch.Generator().manual_seed(seed)
    series = {name: {"entropy": [], "entropy_std": [], "support": [], "support_std": [], "signal_weight": []}
              for name in SYNTH_MAPPINGS}
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
    return {"figure": "dispersion_synthetic", "n": list(ns), "signal": signal, "noise_std": noise_std,
            "draws": draws, "seed": seed, "series": series}


# ---- 3b. dispersion measured in trained models -------------------------------------------------------------
def _log2_bins(n_max: int) -> List[tuple]:
    """[lo, hi) bins of the number of visible keys n: [1,2), [2,4), [4,8), ... up to n_max."""
    bins, lo = [], 1
    while lo <= n_max:
        bins.append((lo, min(2 * lo, n_max + 1)))
        lo *= 2
    if len(bins) > 1 and bins[-1][1] - bins[-1][0] < bins[-1][0] // 2:    # fold a sliver into the last octave
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
        ent = rec["entropy"].float().mean(0)      # (H, N) mean over the batch
        sup = rec["support"].float().mean(0)
        e_b, s_b = [], []
        for lo, hi in bins:
            m = (n >= lo) & (n < hi)
            e_b.append([float(v) for v in ent[:, m].mean(-1)])
            s_b.append([float(v) for v in sup[:, m].mean(-1)])
        layers[str(layer)] = {"entropy": e_b, "support": s_b}     # [bin][head]
    mean_e = [sum(sum(layers[k]["entropy"][i]) / len(layers[k]["entropy"][i]) for k in layers) / len(layers)
              for i in range(len(bins))]
    mean_s = [sum(sum(layers[k]["support"][i]) / len(layers[k]["support"][i]) for k in layers) / len(layers)
              for i in range(len(bins))]
    return {"bins": [list(b) for b in bins], "bin_center": [math.sqrt(lo * (hi - 1)) for lo, hi in bins],
            "layers": layers, "mean_entropy": mean_e, "mean_support": mean_s}


def plot_dispersion(synth: dict, measured: Optional[dict], path: Path) -> None:
    plt = _plt()
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
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        methods = sorted({r["label"].split("/")[0] for r in measured["runs"]})
        styles = {"nape": "-", "nope": "--", "alibi": ":", "rope": "-."}
        for r in measured["runs"]:
            meth, _, pos = r["label"].partition("/")
            kw = dict(marker="o", ms=3, label=r["label"], color=colors[methods.index(meth) % len(colors)],
                      ls=styles.get(pos.split(" ")[0], "-"))
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
    _save(fig, path)


# ---- 4. learned scales and their fits ----------------------------------------------------------------------
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
    bins = _distance_bins(N)
    n_bins = [float((lo + hi - 1) / 2 + 2) for lo, hi in bins]
    layers = {}
    for layer in cap.layers:
        sc = cap[layer]["scale"].double()          # (B, H, N)
        heads = []
        for h in range(sc.shape[1]):
            if bool((sc[:, h] == 1).all()):
                heads.append({"head": h, "scaled": False})
                continue
            st = sc[:, h][tgt]
            mean_all = sc[:, h].mean(0)
            binned = [float(mean_all[lo:hi].mean()) for lo, hi in bins]
            heads.append({"head": h, "scaled": True,
                          "target_scale": [round(float(v), 5) for v in st],
                          "fits": fit_scale_curves(n_t.tolist(), st.tolist()),
                          "all_binned": [round(v, 5) for v in binned],
                          "fits_all_binned": fit_scale_curves(n_bins, binned)})
        layers[str(layer)] = heads
    return {"target_n": [int(v) for v in n_t], "n_bins": n_bins, "examples": B, "length": N, "layers": layers}


def plot_scales(data: dict, path: Path) -> None:
    plt = _plt()
    runs = data["runs"]
    panels = [(r, layer) for r in runs for layer in r["layers"]]
    ncol = min(4, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.9 * ncol, 3.3 * nrow), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (r, layer) in zip(axes.flat, panels):
        n = r["target_n"]
        grid = sorted(set(n))
        for hd in r["layers"][layer]:
            if not hd["scaled"]:
                continue
            c = colors[hd["head"] % len(colors)]
            f = hd["fits"]["power_log"]
            ax.scatter(n, hd["target_scale"], s=3, color=c, alpha=0.35, lw=0)
            ax.plot(grid, [f["delta"] + f["beta"] * math.log(x) ** f["gamma"] for x in grid], color=c, lw=1.2,
                    label=f"h{hd['head']}: γ={f['gamma']:.2f} R²={f['r2']:.2f} (log R²={hd['fits']['log']['r2']:.2f})")
        lo, hi = data.get("train_lengths") or (None, None)
        if hi:
            ax.axvspan(2, hi + 2, color="0.9", zorder=0)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("n = position + 2")
        ax.set_title(f"{r['label']}  layer {layer}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    for row in axes:
        row[0].set_ylabel("scale at target queries; fit δ+β(log n)^γ")
    _save(fig, path)


# ---- 5. attention profiles vs distance ---------------------------------------------------------------------
def _distance_bins(N: int) -> List[tuple]:
    """Exact distances 0..15, then 4 log-spaced bins per octave up to N−1."""
    bins = [(d, d + 1) for d in range(min(16, N))]
    lo = 16
    while lo < N:
        hi = min(N, max(lo + 1, int(round(lo * 2 ** 0.25))))
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
        diag = torch.diagonal(attn, offset=-d, dim1=-2, dim2=-1).double()    # (B, H, N − d)
        mean_w[:, d] = diag.mean((0, 2))
        nz[:, d] = (diag > 0).double().mean((0, 2))
    bins = _distance_bins(N)
    heads = []
    for h in range(H):
        nonzero_d = torch.nonzero(nz[h] > 0).flatten()
        reach = int(nonzero_d.max()) if nonzero_d.numel() else -1
        dead = int(((nz[h, : reach + 1] == 0)).sum()) if reach >= 0 else 0
        heads.append({"head": h,
                      "mean_weight": [float(mean_w[h, lo:hi].mean()) for lo, hi in bins],
                      "nonzero_frac": [float(nz[h, lo:hi].mean()) for lo, hi in bins],
                      "reach": reach, "dead_distances_within_reach": dead})
    return {"bins": [list(b) for b in bins], "bin_center": [(lo + hi - 1) / 2 for lo, hi in bins], "heads": heads}


@torch.no_grad()
def attention_profiles(model, input_ids: torch.Tensor) -> dict:
    from longsparse.nn import capture

    with capture(model, what=("attn",)) as cap:
        model(input_ids)
    return {str(layer): distance_profile(cap[layer]["attn"]) for layer in cap.layers}


def plot_profiles(data: dict, path: Path) -> None:
    plt = _plt()
    runs = data["runs"]
    fig, axes = plt.subplots(2, len(runs), figsize=(3.5 * len(runs), 5.4), squeeze=False, sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for col, r in enumerate(runs):
        top, bot = axes[0][col], axes[1][col]
        k = 0
        for layer, prof in r["layers"].items():
            x = [c + 1 for c in prof["bin_center"]]          # distance + 1 on a log axis
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
    _save(fig, path, dpi=85)


# ---- 6. the threshold property -----------------------------------------------------------------------------
def entmax_logit_threshold(z: torch.Tensor, alpha: float) -> float:
    """τ/(α−1) in logit units: entries of z above it get p > 0, entries at or below it get exactly 0."""
    p = ls.entmax(z, alpha)
    j = int(p.argmax())
    return float(z[j] - p[j] ** (alpha - 1) / (alpha - 1))


def threshold_data(n: int = 16, appended: Sequence[int] = (1, 10, 100, 1000, 10000, 100000),
                   alphas: Sequence[float] = ALPHAS, gaps: Sequence[float] = (0.01, 1.0, 3.0), seed: int = 0) -> dict:
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
                    rows.append({"mapping": name, "alpha_threshold": a, "gap": gap, "appended": m,
                                 "max_abs_change": float((q[:n] - base).abs().max()),
                                 "leaked_mass": float(q[n:].sum()),
                                 "support_before": int((base > 0).sum()), "support_after": int((q > 0).sum())})
    return {"figure": "threshold", "n": n, "z": [float(v) for v in z], "seed": seed,
            "thresholds": {f"{a:g}": entmax_logit_threshold(z, a) for a in alphas}, "rows": rows}


def threshold_markdown(data: dict) -> str:
    ms = sorted({r["appended"] for r in data["rows"]})
    lines = ["| mapping | gap below threshold | " + " | ".join(f"m={m:,}" for m in ms) + " |",
             "|---|---|" + "---|" * len(ms)]
    keys = sorted({(r["mapping"], r["gap"]) for r in data["rows"]},
                  key=lambda k: (k[0] == "softmax", k[0], k[1]))
    for mapping, gap in keys:
        cells = []
        for m in ms:
            r = next(x for x in data["rows"] if x["mapping"] == mapping and x["gap"] == gap and x["appended"] == m)
            cells.append("0 (exact)" if r["max_abs_change"] == 0 and r["leaked_mass"] == 0
                         else f"{r['max_abs_change']:.2e} / {r['leaked_mass']:.2e}")
        lines.append(f"| {mapping} | {gap:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_threshold(data: dict, path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    ms = sorted({r["appended"] for r in data["rows"]})
    floor = 1e-20
    for key, ax, title in (("leaked_mass", axes[0], "mass on appended tokens"),
                           ("max_abs_change", axes[1], "max |Δp| of existing weights")):
        seen = set()
        for r in data["rows"]:
            lab = (r["mapping"], r["gap"])
            if lab in seen:
                continue
            seen.add(lab)
            ys = [next(x[key] for x in data["rows"] if (x["mapping"], x["gap"]) == lab and x["appended"] == m)
                  for m in ms]
            if r["mapping"] == "softmax":
                ax.plot(ms, ys, marker="o", ms=3, label=f"softmax, gap {r['gap']:g}")
            elif r["gap"] == min(x["gap"] for x in data["rows"]):
                ax.plot(ms, [max(v, floor) for v in ys], marker="x", ls="none",
                        label=f"{r['mapping']}: exactly 0" if max(ys) == 0 else r["mapping"])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(floor / 10, 2)
        ax.axhline(floor, color="0.6", lw=0.8, ls=":")
        ax.set_xlabel("appended tokens m (logits below entmax threshold)")
        ax.set_title(title + f" (0 drawn at {floor:g})", fontsize=9)
        ax.grid(alpha=0.3)
    axes[1].annotate("α=1.25 (iterative τ): ≤ 1 ulp; α=1.5, 2 (closed-form τ): exactly 0",
                     (0.02, 0.42), xycoords="axes fraction", fontsize=7)
    axes[0].legend(fontsize=7)
    _save(fig, path)


# ---- driver ------------------------------------------------------------------------------------------------
def _plt():
    try:
        import matplotlib
    except ImportError as e:   # pragma: no cover - depends on the environment
        raise ImportError("figures need matplotlib: pip install 'longsparse[plot]'") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, dpi: int = 100, tight: bool = True) -> None:
    if tight:
        fig.tight_layout()
    atomic_savefig(fig, path, dpi=dpi)
    _plt().close(fig)


def _write_json(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, separators=(",", ":"), allow_nan=True) + "\n")


def _parse_only(only) -> set:
    if not only:
        return set(FIGURES)
    out = set()
    for item in (only.split(",") if isinstance(only, str) else only):
        item = str(item).strip()
        if not item:
            continue
        if item.isdigit() and 1 <= int(item) <= len(FIGURES):
            out.add(FIGURES[int(item) - 1])
        elif item in FIGURES:
            out.add(item)
        else:
            raise ValueError(f"unknown figure {item!r}; use 1-{len(FIGURES)} or one of {', '.join(FIGURES)}")
    return out


def make_figures(out: str | Path, runs: Optional[Iterable[str | Path]] = None, *, quick: bool = False,
                 only=None, log: Callable[[str], None] = print) -> dict:
    """Compute, save (JSON) and plot (PNG) the figures into ``out``; returns {name: {png, json, summary}}.

    ``quick``: small grids and, without ``runs``, 8-step models at length 128 (a smoke test, not a result)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    want = _parse_only(only)
    torch.manual_seed(0)
    made: Dict[str, dict] = {}

    def done(key: str, stem: str, data: dict, plot: Callable, summary: dict, extra: Optional[dict] = None):
        js, png = out / f"{stem}.json", out / f"{stem}.png"
        data = {**data, "summary": summary, "quick": quick}
        _write_json(js, data)
        plot(data, png)
        made[key] = {"png": str(png), "json": str(js), "summary": summary, **(extra or {})}
        log(f"  {png.name}: {json.dumps(summary)[:300]}")

    if "zero_crossing" in want:
        d = zero_crossing_data(points=61 if quick else 241)
        summ = {p["label"]: {str(c["z"]): c["inv_temperature"] for c in p["zero_crossings"]} for p in d["panels"]}
        summ["max_rel_error_vs_bisection"] = max((c["rel_error"] or 0.0) for p in d["panels"]
                                                 for c in p["zero_crossings"])
        done("zero_crossing", "fig1_zero_crossing", d, plot_zero_crossing, summ)

    if "p0_grid" in want:
        d = p0_grid_data(points=21 if quick else 81)
        summ = {p["label"]: {"frac_p0_exact_zero": round(p["frac_exact_zero"], 4),
                             "frac_p0_exact_one": round(p["frac_exact_one"], 4)} for p in d["panels"]}
        done("p0_grid", "fig2_p0_grid", d, plot_p0_grid, summ)

    need_models = want & {"dispersion", "scales", "profiles"}
    models = []
    if need_models:
        if runs:
            run_dirs = [Path(r) for r in runs]
        else:
            cache = out / "runs" / "quick" if quick else out / "runs"
            log(f"training/loading the default models in {cache} ({DEFAULT_TASK}, cpu preset"
                f"{', quick' if quick else ''})")
            run_dirs = ensure_default_runs(cache, quick=quick, log=log)
        for r in run_dirs:
            model, cfg, which, val = _load_run(r)
            models.append({"dir": str(r), "label": _run_label(cfg), "cfg": cfg, "model": model,
                           "checkpoint": which, "val": val})
    meta = [{"run": m["dir"], "label": m["label"], "checkpoint": m["checkpoint"], "validation": m["val"],
             "task": m["cfg"]["task"]["name"], "model": m["cfg"]["model"],
             "train": {k: m["cfg"]["train"][k] for k in ("steps", "batch_size", "lr", "seed", "train_lengths")}}
            for m in models]
    train_lengths = models[0]["cfg"]["train"]["train_lengths"] if models else None
    L_disp, L_prof = (128, 96) if quick else (2048, 1024)

    if "dispersion" in want:
        synth = synthetic_dispersion_data(ns=tuple(2 ** k for k in range(3, 11 if quick else 17)),
                                          draws=4 if quick else 16)
        measured = {"task": models[0]["cfg"]["task"]["name"] if models else None, "length": L_disp,
                    "train_lengths": train_lengths, "runs": []}
        for m in models:
            ids = _long_example(m["cfg"], L_disp, batch_size=1, seed=0)
            measured["runs"].append({"label": m["label"], "run": m["dir"], **measured_dispersion(m["model"], ids)})
        d = {"figure": "dispersion", "synthetic": synth, "measured": measured, "runs": meta}
        last = {k: {"entropy": round(v["entropy"][-1], 4), "support": round(v["support"][-1], 1),
                    "signal_weight": round(v["signal_weight"][-1], 4)} for k, v in synth["series"].items()}
        summ = {f"synthetic_n={synth['n'][-1]}": last}
        for r in measured["runs"]:
            summ[f"measured {r['label']}"] = {
                f"n~{r['bins'][0][0]}-{r['bins'][0][1] - 1}": [round(r["mean_entropy"][0], 3),
                                                               round(r["mean_support"][0], 1)],
                f"n~{r['bins'][-1][0]}-{r['bins'][-1][1] - 1}": [round(r["mean_entropy"][-1], 3),
                                                                 round(r["mean_support"][-1], 1)]}
        done("dispersion", "fig3_dispersion", d, lambda dd, p: plot_dispersion(dd["synthetic"], dd["measured"], p),
             summ)

    if "scales" in want:
        sruns = [m for m in models if m["cfg"]["model"]["method"] in ("asentmax", "ssmax")]
        res = []
        for m in sruns:
            b = _long_example(m["cfg"], L_disp, batch_size=2 if quick else 4, seed=0, batch=True)
            res.append({"label": m["label"], "run": m["dir"], **learned_scales(m["model"], b)})
        d = {"figure": "scales", "runs": res, "train_lengths": train_lengths, "length": L_disp,
             "models": [x for x in meta if x["model"]["method"] in ("asentmax", "ssmax")]}
        summ = {}
        for r in res:
            for layer, heads in r["layers"].items():
                for hd in heads:
                    if hd["scaled"]:
                        f = hd["fits"]
                        summ[f"{r['label']} L{layer}h{hd['head']}"] = {
                            k: {"r2": round(v["r2"], 3), "rmse": round(v["rmse"], 4),
                                **({"gamma": round(v["gamma"], 3)} if "gamma" in v else {})} for k, v in f.items()}
        if not res:
            summ = {"note": "no asentmax/ssmax run given: nothing to fit"}
        done("scales", "fig4_scales", d, plot_scales if res else _plot_note, summ)

    if "profiles" in want:
        pruns = [m for m in models if m["cfg"]["model"]["method"] == "entmax"]
        res = []
        for m in pruns:
            ids = _long_example(m["cfg"], L_prof, batch_size=1, seed=0)
            res.append({"label": m["label"], "run": m["dir"], "layers": attention_profiles(m["model"], ids)})
        d = {"figure": "profiles", "runs": res, "train_lengths": train_lengths, "length": L_prof,
             "models": [x for x in meta if x["model"]["method"] == "entmax"]}
        summ = {r["label"]: {f"L{layer}h{hd['head']}": [hd["reach"], hd["dead_distances_within_reach"]]
                             for layer, prof in r["layers"].items() for hd in prof["heads"]} for r in res}
        summ["legend"] = "[reach = largest distance with any p > 0, number of dead distances within reach]"
        if not res:
            summ = {"note": "no entmax run given: nothing to profile"}
        done("profiles", "fig5_profiles", d, plot_profiles if res else _plot_note, summ)

    if "threshold" in want:
        d = threshold_data(appended=(1, 10, 100) if quick else (1, 10, 100, 1000, 10000, 100000))
        table = threshold_markdown(d)
        atomic_write_text(
            out / "fig6_threshold.md",
            "Max |Δp| of the existing weights / mass on the appended tokens, after appending m tokens whose logits "
            "lie `gap` below α-entmax's threshold τ/(α−1) (softmax: same tokens as 1.5-entmax).\n\n" + table + "\n")
        summ = {"entmax_max_abs_change": max(r["max_abs_change"] for r in d["rows"] if r["mapping"] != "softmax"),
                "entmax_max_leaked_mass": max(r["leaked_mass"] for r in d["rows"] if r["mapping"] != "softmax"),
                "softmax_min_leaked_mass": min(r["leaked_mass"] for r in d["rows"] if r["mapping"] == "softmax"),
                "softmax_max_leaked_mass": max(r["leaked_mass"] for r in d["rows"] if r["mapping"] == "softmax")}
        done("threshold", "fig6_threshold", d, plot_threshold, summ, {"markdown": str(out / "fig6_threshold.md")})

    idx_path = out / "figures.json"
    index = {"quick": quick, "runs": meta, "figures": {}}
    if idx_path.exists():                      # --only: keep the other figures' entries
        try:
            old = json.loads(idx_path.read_text())
            if old.get("quick") == quick:
                index["figures"] = old.get("figures", {})
                index["runs"] = meta or old.get("runs", [])
        except (OSError, json.JSONDecodeError):
            pass
    index["figures"].update(made)
    atomic_write_text(idx_path, json.dumps(index, indent=1) + "\n")
    return made


def _plot_note(data: dict, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4, 1.5))
    ax.axis("off")
    ax.text(0.5, 0.5, data["summary"].get("note", "nothing to plot"), ha="center", va="center", fontsize=9)
    _save(fig, path)
