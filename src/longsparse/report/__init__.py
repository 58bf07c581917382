"""Reports from saved evaluation JSON: a markdown table (length × method, exact match with 95% Wilson interval),
a PNG plot (exact match vs length, log x; needs the optional ``plot`` extra, i.e. matplotlib) and the merged JSON.

    longsparse report runs/a runs/b --out docs/results

Inputs are run directories (all their ``eval/*.json``; for a length evaluated more than once the newest file
wins) or result files directly. Series are labelled ``method/positions``; runs sharing a label get their run
name appended. Everything is rebuilt from the JSON, nothing from models.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Optional

MERGED_FORMAT = "longsparse-report"


class ReportError(ValueError):
    pass


def _read_result(path: Path) -> dict:
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ReportError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(d, dict) or d.get("format") != "longsparse-eval" or not isinstance(d.get("results"), list):
        raise ReportError(f"{path}: not a longsparse eval result (format tag missing)")
    return d


def collect(inputs: Iterable[str | Path]) -> list[dict]:
    """One series per run: {label, run_name, task, method, positions, train_lengths, results (by length), files}."""
    by_run: dict[str, dict] = {}
    inputs = list(inputs)
    if not inputs:
        raise ReportError("no inputs: give run directories or eval JSON files")
    for inp in inputs:
        p = Path(inp)
        if p.is_dir():
            files = sorted((p / "eval").glob("*.json")) if (p / "eval").is_dir() else []
            if not files:
                raise ReportError(f"{p}: no evaluation results in {p / 'eval'} (run `longsparse eval {p}` first)")
        elif p.is_file():
            files = [p]
        else:
            raise ReportError(f"{p}: no such run directory or file")
        for f in files:
            d = _read_result(f)
            key = d.get("run", str(f))
            s = by_run.setdefault(key, {"label": d.get("label", "?"), "run_name": d.get("run_name", f.stem),
                                        "run": key, "task": d.get("task"), "method": d.get("method"),
                                        "positions": d.get("positions"), "train_lengths": d.get("train_lengths"),
                                        "checkpoint": d.get("checkpoint"), "results": {}, "files": [],
                                        "_created": {}})
            s["files"].append(str(f))
            for r in d["results"]:
                L = int(r["length"])
                created = d.get("created", "")
                if L not in s["results"] or created >= s["_created"][L]:
                    s["results"][L] = r
                    s["_created"][L] = created
    series = list(by_run.values())
    labels = [s["label"] for s in series]
    for s in series:
        s.pop("_created")
        s["name"] = s["label"] if labels.count(s["label"]) == 1 else f"{s['label']} ({s['run_name']})"
    return series


def _cell(r: Optional[dict]) -> str:
    if r is None:
        return "–"
    lo, hi = r["exact_match_ci"]
    return f"{100 * r['exact_match']:.1f} [{100 * lo:.0f}–{100 * hi:.0f}]"


def markdown_table(series: list[dict]) -> str:
    """One table per task: rows = length (and × training length), columns = series."""
    out = []
    for task in sorted({s["task"] for s in series}, key=str):
        ss = [s for s in series if s["task"] == task]
        lengths = sorted({L for s in ss for L in s["results"]})
        hi = max((s["train_lengths"] or [0, 0])[1] for s in ss) or None
        n = sorted({r["n"] for s in ss for r in s["results"].values()})
        out.append(f"### {task}: exact match % [95% Wilson interval], n = {', '.join(map(str, n))} per cell"
                   + (f"; trained on L ≤ {hi}" if hi else ""))
        out.append("")
        out.append("| length | × train | " + " | ".join(s["name"] for s in ss) + " |")
        out.append("|---:|---:|" + "---:|" * len(ss))
        for L in lengths:
            ratio = f"{L / hi:g}×" if hi else ""
            out.append(f"| {L} | {ratio} | " + " | ".join(_cell(s["results"].get(L)) for s in ss) + " |")
        out.append("")
    return "\n".join(out)


def plot(series: list[dict], path: Path) -> Path:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ReportError("the plot needs matplotlib, which is not installed: pip install 'longsparse[plot]' "
                          "(or pip install matplotlib); the table and JSON were written") from None
    tasks = sorted({s["task"] for s in series}, key=str)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for s in (s for s in series if s["task"] == task):
            Ls = sorted(s["results"])
            em = [100 * s["results"][L]["exact_match"] for L in Ls]
            lo = [100 * s["results"][L]["exact_match_ci"][0] for L in Ls]
            hi = [100 * s["results"][L]["exact_match_ci"][1] for L in Ls]
            line, = ax.plot(Ls, em, marker="o", label=s["name"])
            ax.fill_between(Ls, lo, hi, alpha=0.15, color=line.get_color())
        tl = [s["train_lengths"] for s in series if s["task"] == task and s["train_lengths"]]
        if tl:
            ax.axvline(max(t[1] for t in tl), color="grey", ls=":", lw=1, label="max train length")
        ax.set_xscale("log", base=2)
        ax.set_ylim(-3, 103)
        ax.set_xlabel("test length")
        ax.set_ylabel("exact match (%)")
        ax.set_title(str(task))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _check_not_foreign(path: Path) -> None:
    """A results.json that this command did not write (e.g. a study's archive, docs/results/results.json) is
    never overwritten: refuse before writing anything."""
    if not path.exists():
        return
    try:
        fmt = json.loads(path.read_text()).get("format")
    except (OSError, ValueError, AttributeError):
        fmt = None
    if fmt != MERGED_FORMAT:
        raise ReportError(f"{path} exists and is not a `longsparse report` file (format {fmt!r}); nothing was "
                          "written: choose another --out")


def build_report(inputs: Iterable[str | Path], out: str | Path, *, printer=print, title: str | None = None) -> dict:
    """Write ``out/results.md``, ``out/results.json`` and (with matplotlib) ``out/accuracy_vs_length.png``.
    Returns {"markdown", "json", "png" (None without matplotlib), "png_error", "table", "series"}."""
    series = collect(inputs)
    out = Path(out)
    _check_not_foreign(out / "results.json")
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(series)
    md = out / "results.md"
    md.write_text((f"# {title}\n\n" if title else "") + table + "\n")
    merged = {"format": MERGED_FORMAT, "version": 1,
              "series": [{**s, "results": [s["results"][L] for L in sorted(s["results"])]} for s in series]}
    js = out / "results.json"
    js.write_text(json.dumps(merged, indent=1) + "\n")
    png, err = None, None
    try:
        png = plot(series, out / "accuracy_vs_length.png")
    except ReportError as e:
        err = str(e)
        if printer:
            printer(f"note: {err}")
    return {"markdown": md, "json": js, "png": png, "png_error": err, "table": table, "series": series}
