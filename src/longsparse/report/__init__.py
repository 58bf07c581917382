"""Reports from saved evaluation JSON: a markdown table (length × method, exact match with 95% Wilson interval),
a PNG plot (exact match vs length, log x; needs the optional ``plot`` extra, i.e. matplotlib) and the merged JSON.

    longsparse report runs/a runs/b --out docs/results

Inputs are run directories (all their ``eval/*.json``; for a length evaluated more than once the newest file
wins) or result files directly. Series are labelled ``method/positions``; runs sharing a label get their run
name appended. Everything is rebuilt from the JSON, nothing from models. In a run directory, a result file that
an interrupted writer left empty or cut is skipped with a warning; a file named explicitly must be readable.

A report never overwrites a file it did not write: each output carries a marker (``MD_MARKER`` as the first
line of results.md, ``"format": "longsparse-report"`` in results.json, a ``longsparse`` PNG text chunk in the
plot), and an existing output without it makes the command refuse before writing anything. Outputs are written
atomically (``longsparse.io``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable, Optional

from longsparse.io import atomic_write_text, read_json_or_none, warn_stderr
from longsparse.report import plotting

MERGED_FORMAT = "longsparse-report"
MD_MARKER = "<!-- written by `longsparse report`; it replaces this file when rerun into the same folder -->"
PNG_KEY, PNG_VALUE = "longsparse", "report"
OUTPUTS = ("results.md", "results.json", "accuracy_vs_length.png")


class ReportError(ValueError):
    pass


def _read_result(path: Path) -> dict:
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ReportError(f"{path}: not readable JSON ({e})") from None
    return _check_result(path, d)


# what the tables and plots read from each entry of an eval result's "results" list
RESULT_FIELDS = {
    "length": (int, "an integer"),
    "n": (int, "an integer"),
    "exact_match": ((int, float), "a number"),
    "exact_match_ci": (list, "a [low, high] list"),
}


def _check_result(path: Path, d) -> dict:
    if not isinstance(d, dict) or d.get("format") != "longsparse-eval" or not isinstance(d.get("results"), list):
        raise ReportError(f"{path}: not a longsparse eval result (format tag missing)")
    for i, r in enumerate(d["results"]):
        if not isinstance(r, dict):
            raise ReportError(f"{path}: results[{i}] is not an object")
        for key, (kind, what) in RESULT_FIELDS.items():
            if key not in r:
                raise ReportError(f"{path}: results[{i}] lacks {key!r} (a cut or hand-edited eval file?)")
            if isinstance(r[key], bool) or not isinstance(r[key], kind) or (kind is list and len(r[key]) != 2):
                raise ReportError(f"{path}: results[{i}][{key!r}] must be {what}; got {r[key]!r}")
    return d


def collect(inputs: Iterable[str | Path], warn: Callable[[str], None] | None = warn_stderr) -> list[dict]:
    """One series per run: {label, run_name, task, method, positions, train_lengths, results (by length), files}.
    ``warn`` receives a line for each result file of a run directory skipped as empty or cut."""
    by_run: dict[str, dict] = {}
    inputs = list(inputs)
    if not inputs:
        raise ReportError("no inputs: give run directories or eval JSON files")
    for inp in inputs:
        p = Path(inp)
        if p.is_dir():
            found = sorted((p / "eval").glob("*.json")) if (p / "eval").is_dir() else []
            docs = [(f, read_json_or_none(f, warn)) for f in found]
            docs = [(f, d) for f, d in docs if d is not None]  # what an interrupted evaluation left
            if not docs:
                raise ReportError(
                    f"{p}: no evaluation results in {p / 'eval'} (run `longsparse eval {p}` first)"
                    + (f"; {len(found)} unreadable file(s) skipped" if found else "")
                )
        elif p.is_file():
            docs = [(p, None)]
        else:
            raise ReportError(f"{p}: no such run directory or file")
        for f, d in docs:
            d = _check_result(f, d) if d is not None else _read_result(f)
            key = d.get("run", str(f))
            s = by_run.setdefault(
                key,
                {
                    "label": d.get("label", "?"),
                    "run_name": d.get("run_name", f.stem),
                    "run": key,
                    "task": d.get("task"),
                    "method": d.get("method"),
                    "positions": d.get("positions"),
                    "train_lengths": d.get("train_lengths"),
                    "checkpoint": d.get("checkpoint"),
                    "results": {},
                    "files": [],
                    "_created": {},
                },
            )
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
        out.append(
            f"### {task}: exact match % [95% Wilson interval], n = {', '.join(map(str, n))} per cell"
            + (f"; trained on L ≤ {hi}" if hi else "")
        )
        out.append("")
        out.append("| length | × train | " + " | ".join(s["name"] for s in ss) + " |")
        out.append("|---:|---:|" + "---:|" * len(ss))
        for L in lengths:
            ratio = f"{L / hi:g}×" if hi else ""
            out.append(f"| {L} | {ratio} | " + " | ".join(_cell(s["results"].get(L)) for s in ss) + " |")
        out.append("")
    return "\n".join(out)


def plot(series: list[dict], path: Path) -> Path:
    plt = plotting.pyplot_or_none()
    if plt is None:
        raise ReportError(f"{plotting.MISSING}; the table and JSON were written")
    tasks = sorted({s["task"] for s in series}, key=str)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for s in (s for s in series if s["task"] == task):
            Ls = sorted(s["results"])
            em = [100 * s["results"][L]["exact_match"] for L in Ls]
            lo = [100 * s["results"][L]["exact_match_ci"][0] for L in Ls]
            hi = [100 * s["results"][L]["exact_match_ci"][1] for L in Ls]
            (line,) = ax.plot(Ls, em, marker="o", label=s["name"])
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
    path.parent.mkdir(parents=True, exist_ok=True)
    return plotting.save(fig, path, dpi=120, metadata={PNG_KEY: PNG_VALUE})


def png_text(path: Path) -> dict:
    """The tEXt chunks of a PNG file ({} for anything else)."""
    import struct

    data = path.read_bytes()
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return {}
    out, i = {}, 8
    while i + 8 <= len(data):
        n, kind = struct.unpack(">I4s", data[i : i + 8])
        if kind == b"tEXt":
            key, _, value = data[i + 8 : i + 8 + n].partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        if kind in (b"IDAT", b"IEND"):  # matplotlib writes its text chunks before the image data
            break
        i += 12 + n
    return out


def _written_by_report(path: Path) -> bool:
    """Whether ``path`` carries the marker of `longsparse report` (a report folder written before the markers
    existed gets them from ``longsparse migrate``)."""
    if path.suffix == ".json":
        try:
            return json.loads(path.read_text()).get("format") == MERGED_FORMAT
        except (ValueError, AttributeError):
            return False
    if path.suffix == ".md":
        return path.read_text(encoding="utf-8", errors="replace").split("\n", 1)[0] == MD_MARKER
    return png_text(path).get(PNG_KEY) == PNG_VALUE


def _check_not_foreign(out: Path) -> None:
    """An output file this command did not write (a hand-written docs/results.md, a study's
    results.json view or archive, ...) is never overwritten: refuse before writing anything."""
    for name in OUTPUTS:
        path = out / name
        if path.is_file() and not _written_by_report(path):
            raise ReportError(
                f"{path} exists and is not a `longsparse report` file (it has no report marker); "
                f"nothing was written: choose another --out, or move the file away (a report of older "
                f"longsparse gets its markers from `longsparse migrate {out / 'results.json'}`)"
            )
        if path.exists() and not path.is_file():
            raise ReportError(f"{path} exists and is not a file; nothing was written (choose another --out)")


def build_report(inputs: Iterable[str | Path], out: str | Path, *, printer=print, title: str | None = None) -> dict:
    """Write ``out/results.md``, ``out/results.json`` and (with matplotlib) ``out/accuracy_vs_length.png``.
    Returns {"markdown", "json", "png" (None without matplotlib), "png_error", "table", "series"}."""
    series = collect(inputs, warn=warn_stderr if printer else None)
    out = Path(out)
    if out.exists():
        _check_not_foreign(out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(series)
    md = atomic_write_text(out / "results.md", MD_MARKER + "\n" + (f"# {title}\n\n" if title else "") + table + "\n")
    merged = {
        "format": MERGED_FORMAT,
        "version": 1,
        "series": [{**s, "results": [s["results"][L] for L in sorted(s["results"])]} for s in series],
    }
    js = atomic_write_text(out / "results.json", json.dumps(merged, indent=1) + "\n")
    png, err = None, None
    try:
        png = plot(series, out / "accuracy_vs_length.png")
    except ReportError as e:
        err = str(e)
        if printer:
            printer(f"note: {err}")
    return {"markdown": md, "json": js, "png": png, "png_error": err, "table": table, "series": series}
