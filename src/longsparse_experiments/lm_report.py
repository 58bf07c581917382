"""The LM study's report and results store: the evaluations of LM runs (their ``eval.json``, or the store's
records) aggregated over seeds per method/positions, rendered as tables (``lm_results.md``), the report JSON
(``lm_results.json``) and plots; and the records of the results store ``results/lm`` (one per evaluated run, the
whole evaluation under ``lm_eval``). ``longsparse lm report`` and the report step of ``longsparse reproduce lm``
(``lm_study``) are this module; the runs themselves are made by ``lm_study``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch

from longsparse.io import atomic_write_text, claim_outputs, read_json, read_json_or_none, warn_stderr
from longsparse.lm.evaluate import bucket_positions
from longsparse.report import plotting

# ---- report -----------------------------------------------------------------------------------------------
METHOD_ORDER = ["softmax", "ssmax", "adatemp", "topk", "entmax", "sparsemax", "asentmax"]


def eval_files(paths: Sequence) -> List[tuple]:
    """[(eval.json path, its evaluation)] of the study folders, run folders or eval.json files ``paths``."""
    res = []
    for p in paths:
        p = Path(p)
        files = (
            [p]
            if p.is_file()
            else sorted(p.glob("*/eval.json")) + ([p / "eval.json"] if (p / "eval.json").exists() else [])
        )
        for f in files:
            d = read_json_or_none(f, warn_stderr if p.is_dir() else None)  # skip what an interrupted run left
            if d is None and not p.is_dir():
                raise ValueError(f"{f}: not readable JSON")
            if d is not None:
                res.append((f, d))
    if not res:
        raise FileNotFoundError(f"no eval.json found under {', '.join(map(str, paths))}")
    return res


def collect(paths: Sequence) -> List[dict]:
    """The evaluations (eval.json) of the study folders, run folders or eval.json files ``paths``."""
    return [d for _, d in eval_files(paths)]


def _mean(xs):
    return sum(xs) / len(xs)


def aggregate(results: List[dict]) -> Dict[str, dict]:
    groups: Dict[str, List[dict]] = {}
    for r in results:
        groups.setdefault(f"{r['method']}/{r['positions']}", []).append(r)

    def key(k: str):  # positions first, then the methods in METHOD_ORDER (others last)
        method, positions = k.split("/")
        return positions, METHOD_ORDER.index(method) if method in METHOD_ORDER else 99

    agg = {}
    for k in sorted(groups, key=key):
        rs = sorted(groups[k], key=lambda r: r["seed"])
        Ls = sorted(rs[0]["perplexity"], key=int)
        PLs = sorted(rs[0]["passkey"], key=int)
        n = min(len(r["per_position_nll"]) for r in rs)
        agg[k] = {
            "method": rs[0]["method"],
            "positions": rs[0]["positions"],
            "seeds": [r["seed"] for r in rs],
            "seq_len": rs[0]["seq_len"],
            "ppl": {
                L: {
                    "mean": _mean([r["perplexity"][L]["ppl"] for r in rs]),
                    "per_seed": [r["perplexity"][L]["ppl"] for r in rs],
                }
                for L in Ls
            },
            "passkey": {
                L: {
                    "mean": _mean([r["passkey"][L]["accuracy"] for r in rs]),
                    "per_seed": [r["passkey"][L]["accuracy"] for r in rs],
                }
                for L in PLs
            },
            "passkey_digit_accuracy": {
                L: _mean([r["passkey"][L].get("digit_accuracy", float("nan")) for r in rs]) for L in PLs
            },
            "passkey_answer_nll": {
                L: _mean([r["passkey"][L].get("answer_nll", float("nan")) for r in rs]) for L in PLs
            },
            "passkey_by_depth": {
                L: {d: _mean([r["passkey"][L]["by_depth"][d] for r in rs]) for d in rs[0]["passkey"][L]["by_depth"]}
                for L in PLs
            },
            "buckets": [
                {
                    "start": b["start"],
                    "end": b["end"],
                    "ppl": math.exp(_mean([r["position_buckets"][i]["nll"] for r in rs])),
                }
                for i, b in enumerate(rs[0]["position_buckets"])
            ],
            "per_position_nll": [_mean([r["per_position_nll"][p] for r in rs]) for p in range(n)],
            "per_position_delta_nll": (
                [_mean([r["per_position_delta_nll"][p] for r in rs]) for p in range(n)]
                if all(r.get("per_position_delta_nll") for r in rs)
                else None
            ),
            "train_wall_s": [r["train_wall_s"] for r in rs],
            "eval_wall_s": [r["eval_wall_s"]["total"] for r in rs],
            "params": rs[0]["params"],
            "steps": rs[0]["steps"],
        }
    return agg


def _fmt_mult(L: int, T: int) -> str:
    m = L / T
    return f"{m:g}×" if m >= 1 else f"T/{round(1 / m)}"


def markdown_tables(agg: Dict[str, dict]) -> str:
    any_ = next(iter(agg.values()))
    T = any_["seq_len"]
    Ls = list(any_["ppl"])
    ratio_Ls = [L for L in Ls if int(L) in (8 * T, 16 * T)]
    lines = [
        f"**Perplexity vs context length** (test plays, same target tokens for every length; T = {T}; "
        f"mean over seeds, per-seed in brackets; last columns: ppl(L) / ppl(T), < 1 = longer context helps)",
        "",
        "| method | "
        + " | ".join(f"{L} ({_fmt_mult(int(L), T)})" for L in Ls)
        + "".join(f" | {_fmt_mult(int(L), T)} / 1×" for L in ratio_Ls)
        + " |",
        "|---|" + "---|" * (len(Ls) + len(ratio_Ls)),
    ]
    for k, a in agg.items():
        cells = []
        for L in Ls:
            v = a["ppl"][L]
            cells.append(
                f"{v['mean']:.2f}"
                + (f" [{', '.join(f'{x:.1f}' for x in v['per_seed'])}]" if len(v["per_seed"]) > 1 else "")
            )
        if str(T) in a["ppl"]:
            cells += [f"{a['ppl'][L]['mean'] / a['ppl'][str(T)]['mean']:.3f}" for L in ratio_Ls]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    B = any_["buckets"]
    lines += [
        "",
        f"**Perplexity by position** inside the {int(Ls[-1])}-token windows (mean over seeds)",
        "",
        "| method | " + " | ".join(f"{b['start']}–{b['end']}" for b in B) + " |",
        "|---|" + "---|" * len(B),
    ]
    for k, a in agg.items():
        lines.append(f"| {k} | " + " | ".join(f"{b['ppl']:.2f}" for b in a["buckets"]) + " |")
    if all(a["per_position_delta_nll"] for a in agg.values()):
        lines += [
            "",
            f"**Effect of the extra context by position**: mean over the {int(Ls[-1])}-token windows of "
            f"NLL(token at that position) − NLL(same token scored in {T}-token windows), in nats "
            f"(< 0: the context beyond what a {T}-window has helps; > 0: it hurts; mean over seeds)",
            "",
            "| method | " + " | ".join(f"{b['start']}–{b['end']}" for b in B[3:]) + " |",
            "|---|" + "---|" * len(B[3:]),
        ]
        for k, a in agg.items():
            bd = bucket_positions(a["per_position_delta_nll"], T)[3:]
            lines.append(f"| {k} | " + " | ".join(f"{b['nll']:+.3f}" for b in bd) + " |")
    PLs = list(any_["passkey"])
    lines += [
        "",
        "**Passkey retrieval** (exact match of the 5 digits, all depths pooled; mean over seeds, per-seed in brackets)",
        "",
        "| method | " + " | ".join(f"{L} ({_fmt_mult(int(L), T)})" for L in PLs) + " |",
        "|---|" + "---|" * len(PLs),
    ]
    for k, a in agg.items():
        cells = []
        for L in PLs:
            v = a["passkey"][L]
            cells.append(
                f"{100 * v['mean']:.0f}%"
                + (f" [{', '.join(f'{100 * x:.0f}' for x in v['per_seed'])}]" if len(v["per_seed"]) > 1 else "")
            )
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "**Passkey, graded**: per-digit accuracy % / mean NLL of the 5 answer digits (chance: 10 % / "
        f"{math.log(10):.2f}; mean over seeds)",
        "",
        "| method | " + " | ".join(f"{L} ({_fmt_mult(int(L), T)})" for L in PLs) + " |",
        "|---|" + "---|" * len(PLs),
    ]
    for k, a in agg.items():
        lines.append(
            f"| {k} | "
            + " | ".join(f"{100 * a['passkey_digit_accuracy'][L]:.0f} / {a['passkey_answer_nll'][L]:.2f}" for L in PLs)
            + " |"
        )
    lines += [
        "",
        "**Wall clock** (training excludes checkpoint I/O; evaluation = perplexity + passkey)",
        "",
        "| method | params | steps | train s (per seed) | eval s (per seed) |",
        "|---|---|---|---|---|",
    ]
    for k, a in agg.items():
        lines.append(
            f"| {k} | {a['params']:,} | {a['steps']} | {', '.join(f'{x:.0f}' for x in a['train_wall_s'])} | "
            f"{', '.join(f'{x:.0f}' for x in a['eval_wall_s'])} |"
        )
    return "\n".join(lines) + "\n"


def plot(agg: Dict[str, dict], out: Path) -> List[str]:
    plt = plotting.pyplot_or_none()
    if plt is None:
        return []
    any_ = next(iter(agg.values()))
    T = any_["seq_len"]
    made = []
    fig, axes = plt.subplots(1, 4, figsize=(21, 4.5))
    ax = axes[0]
    for k, a in agg.items():
        Ls = [int(L) for L in a["ppl"]]
        ax.plot(Ls, [a["ppl"][str(L)]["mean"] for L in Ls], marker="o", label=k)
    ax.axvline(T, color="grey", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length L (tokens)")
    ax.set_ylabel("test perplexity")
    ax.set_title(f"perplexity vs context length (T = {T})")
    ax.legend(fontsize=8)
    ax = axes[1]
    for k, a in agg.items():
        y = torch.tensor(a["per_position_nll"])
        # smooth: mean over log-spaced bins
        edges = sorted({0, len(y)} | {int(round(2 ** (i / 4))) for i in range(0, int(4 * math.log2(len(y))) + 1)})
        xs, ys = [], []
        for lo, hi in zip(edges, edges[1:]):
            if hi > lo:
                xs.append((lo + hi) / 2)
                ys.append(float(y[lo:hi].mean()))
        ax.plot(xs, [math.exp(v) for v in ys], label=k)
    ax.axvline(T, color="grey", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("position in the window")
    ax.set_ylabel("perplexity at that position")
    ax.set_title("per-position loss (longest windows, log bins)")
    ax = axes[2]
    for k, a in agg.items():
        if not a["per_position_delta_nll"]:
            continue
        y = torch.tensor(a["per_position_delta_nll"])
        edges = list(range(0, T + 1, max(1, T // 4)))  # linear bins up to T, then log-spaced
        while edges[-1] < len(y):
            edges.append(min(len(y), int(edges[-1] * 2**0.25) + 1))
        xs = [(lo + hi) / 2 for lo, hi in zip(edges, edges[1:])]
        ys = [float(y[lo:hi].mean()) for lo, hi in zip(edges, edges[1:])]
        ax.plot(xs, ys, marker=".", label=k)
    ax.axhline(0, color="black", lw=0.8)
    ax.axvline(T, color="grey", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position in the window")
    ax.set_ylabel("Δ NLL (nats) vs the same token in T-windows")
    ax.set_title("effect of context beyond T, by position")
    ax = axes[3]
    for k, a in agg.items():
        Ls = [int(L) for L in a["passkey"]]
        ax.plot(Ls, [100 * a["passkey"][str(L)]["mean"] for L in Ls], marker="o", label=k)
    ax.axvline(T, color="grey", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_ylim(-3, 103)
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("passkey exact match (%)")
    ax.set_title("passkey retrieval")
    made.append(str(plotting.save(fig, out / "lm_results.png", dpi=110)))
    # passkey heatmaps (length × depth) per method
    n = len(agg)
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 3.2), squeeze=False)
    for ax, (k, a) in zip(axes[0], agg.items()):
        Ls = list(a["passkey_by_depth"])
        ds = list(a["passkey_by_depth"][Ls[0]])
        m = [[a["passkey_by_depth"][L][d] for L in Ls] for d in ds]
        ax.imshow(m, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(len(Ls)), [_fmt_mult(int(L), T) for L in Ls])
        ax.set_yticks(range(len(ds)), [f"{float(d):.0%}" for d in ds])
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("length")
        for i in range(len(ds)):
            for j in range(len(Ls)):
                ax.text(
                    j,
                    i,
                    f"{m[i][j]:.0%}".replace("%", ""),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if m[i][j] < 0.5 else "black",
                )
    axes[0][0].set_ylabel("needle depth")
    made.append(str(plotting.save(fig, out / "lm_passkey_depth.png", dpi=110)))
    return made


def _round(x, digits: int = 5):
    """Floats to ``digits`` significant digits (keeps the results JSON small; full precision is in eval.json)."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    if isinstance(x, dict):
        return {k: _round(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v, digits) for v in x]
    return x


# ---- the results store (longsparse.report.store): one record per evaluated LM run ------------------------------
LM_STUDY = "lm"
PER_POSITION = ("per_position_nll", "per_position_delta_nll")


def lm_record(result: dict, *, source: str, config_hash: Optional[str] = None) -> dict:
    """The store record of one LM run's evaluation ``result`` (its eval.json): the passkey exact match per length
    (n examples each) as the record's results, and the whole evaluation under ``lm_eval`` (perplexity by length,
    position buckets, passkey by depth and graded, wall clocks; the per-position arrays rounded to 6 significant
    digits, as in the report's aggregate). The evaluation names no commit or date, so the record has none."""
    from longsparse.report import store

    lm_eval = {**result, **{f: _round(result[f], 6) for f in PER_POSITION if result.get(f) is not None}}
    passkey = sorted(result["passkey"].items(), key=lambda kv: int(kv[0]))
    results = [
        {
            "checkpoint": "last",
            "length": int(L),
            "n": v["n"],
            "exact_match": v["accuracy"],
            "checkpoint_step": result.get("steps"),
        }
        for L, v in passkey
    ]
    return store.new_record(
        study=LM_STUDY,
        run=f"{LM_STUDY}/{result['run']}",
        task="lm",
        method=result["method"],
        positions=result["positions"],
        seed=result["seed"],
        config_hash=config_hash,
        train_hi=result["seq_len"],
        results=results,
        source=source,
        train={"steps": result.get("steps"), "train_seconds": result.get("train_wall_s"), "final_loss": None},
        eval_seconds=(result.get("eval_wall_s") or {}).get("total"),
        lm_eval=lm_eval,
    )


def records_from_saved_report(saved: dict, source: str) -> List[dict]:
    """The records of a saved report (``lm_results.json``), which kept no per-run per-position arrays: each run's
    record carries its method/positions group's seed-mean arrays from the report's aggregate instead, marked in
    ``lm_eval.per_position_source``, so that the seed mean of a group's records is that aggregate again."""
    out = []
    for r in saved["runs"]:
        group = saved["aggregate"][f"{r['method']}/{r['positions']}"]
        mean = {f: group[f] for f in PER_POSITION}
        seeds = ", ".join(map(str, group["seeds"]))
        out.append(
            lm_record(
                {
                    **r,
                    **mean,
                    "per_position_source": f"mean over seeds {seeds} of {r['method']}/"
                    f"{r['positions']} (the per-run arrays were not kept)",
                },
                source=source,
            )
        )
    return out


def store_lm_results(paths: Sequence, store_dir, printer: Callable = print) -> int:
    """Append to the results store ``store_dir`` the records of the LM evaluations under ``paths`` (study or run
    folders, eval.json files, or a saved ``lm_results.json``) that it does not hold yet (an evaluation equal to
    a stored one of the same run is skipped); returns how many were appended."""
    from longsparse.report import store
    from longsparse.train.config import config_hash

    if _is_saved_report(paths):
        new = records_from_saved_report(read_json(paths[0]), source=str(paths[0]))
    else:  # a run folder's config.json is its resolved config: hashed as stored (resolving needs the corpus)
        new = [
            lm_record(
                d,
                source=str(f),
                config_hash=config_hash(read_json(f.parent / "config.json"))
                if (f.parent / "config.json").is_file()
                else None,
            )
            for f, d in eval_files(paths)
        ]
    stored = {}
    for rec in store.read_records(store_dir):
        stored.setdefault(rec["run"], []).append(rec.get("lm_eval"))
    new = [r for r in new if r["lm_eval"] not in stored.get(r["run"], [])]
    store.append_records(store_dir, new)
    printer(f"appended {len(new)} record(s) to {store.records_path(store_dir)}")
    return len(new)


def stored_lm_results(store_dir) -> List[dict]:
    """The evaluation of each LM run of the results store ``store_dir`` (its latest record), in store order."""
    from longsparse.report import store

    latest: Dict[str, dict] = {}
    for rec in store.read_records(store_dir):
        if "lm_eval" in rec:
            latest[rec["run"]] = rec["lm_eval"]
    if not latest:
        raise FileNotFoundError(f"no LM record in the results store {store_dir}")
    return list(latest.values())


def _is_saved_report(paths: Sequence) -> bool:
    return len(paths) == 1 and Path(paths[0]).is_file() and Path(paths[0]).name == "lm_results.json"


LM_REPORT_WRITER = "longsparse lm report"
LM_REPORT_OUTPUTS = ("lm_results.md", "lm_results.json", "lm_results.png", "lm_passkey_depth.png")


def build_lm_report(paths: Sequence, out_dir, printer: Callable = print, store_dir=None) -> dict:
    """Tables (``lm_results.md``), the report JSON (``lm_results.json``) and plots of the LM runs into
    ``out_dir``: from ``paths`` (study or run folders, eval.json files, or one saved ``lm_results.json``), whose
    evaluations are also appended to the results store ``store_dir`` when given; with no ``paths``, from the
    latest record of each run in ``store_dir``."""
    if not paths and store_dir is None:
        raise ValueError("no LM results to report: give study/run folders, eval.json files or a results store")
    out = Path(out_dir)
    claim_outputs(out, LM_REPORT_OUTPUTS, LM_REPORT_WRITER)
    if paths and store_dir is not None:
        store_lm_results(paths, store_dir, printer=printer)
    if not paths:
        results = stored_lm_results(store_dir)
        agg = aggregate(results)
        note = f"a view of the results store {store_dir}; the per-position arrays are in its records"
    elif _is_saved_report(paths):
        saved = read_json(paths[0])  # rebuild tables/plots from a saved report
        results, agg = saved["runs"], saved["aggregate"]
        note = saved.get("note", "")
    else:
        results = collect(paths)
        agg = aggregate(results)
        note = "per-run per-position arrays are in runs/<run>/eval.json; the aggregate keeps the seed means"
    table = markdown_tables(agg)
    atomic_write_text(out / "lm_results.md", table)
    slim = [{k: v for k, v in r.items() if k not in (*PER_POSITION, "per_position_source")} for r in results]
    agg_small = {
        k: {**a, **{f: _round(a[f], 6) for f in PER_POSITION}} for k, a in agg.items()
    }  # only the plotted arrays are rounded; table numbers stay exact
    atomic_write_text(out / "lm_results.json", json.dumps({"note": note, "runs": slim, "aggregate": agg_small}) + "\n")
    pngs = plot(agg, out)
    printer(table)
    printer(f"wrote {out / 'lm_results.md'}, {out / 'lm_results.json'}" + "".join(f", {p}" for p in pngs))
    return {"table": table, "aggregate": agg, "png": pngs, "json": str(out / "lm_results.json")}
