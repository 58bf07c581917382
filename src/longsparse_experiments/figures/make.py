"""The driver: compute each analysis asked for, write its numbers (JSON) and its plot (PNG), index them in
``figures.json``; and the ``longsparse figures`` command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Dict, Iterable, Optional

import torch

from longsparse.io import atomic_write_text, claim_outputs
from longsparse_experiments.figures import dispersion, p0_grid, profiles, scales, threshold, zero_crossing
from longsparse_experiments.figures.context import Context, load_models
from longsparse_experiments.figures.style import write_json

#: The analyses in figure order (``--only 3`` is the third); each module's ``figure(ctx)`` returns its Figure.
ANALYSES = {
    "zero_crossing": zero_crossing,
    "p0_grid": p0_grid,
    "dispersion": dispersion,
    "scales": scales,
    "profiles": profiles,
    "threshold": threshold,
}
FIGURES = tuple(ANALYSES)
#: The analyses that measure trained models (the others are computed from formulas).
NEED_MODELS = {"dispersion", "scales", "profiles"}


def parse_only(only) -> set:
    """``--only``: a comma list (or sequence) of figure numbers 1-6 or names -> the set of names (all if empty)."""
    if not only:
        return set(FIGURES)
    out = set()
    for item in only.split(",") if isinstance(only, str) else only:
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


FIGURES_WRITER = "longsparse figures"


def stem(name: str) -> str:
    """An analysis's file stem: ``fig<its figure number>_<name>``."""
    return f"fig{FIGURES.index(name) + 1}_{name}"


def figure_outputs(names: Iterable[str]) -> list[str]:
    """The files the analyses ``names`` write (JSON, PNG, any extra a module declares) and the index."""
    out = ["figures.json"]
    for name in names:
        out += [f"{stem(name)}.json", f"{stem(name)}.png", *getattr(ANALYSES[name], "EXTRA_OUTPUTS", ())]
    return out


def make_figures(
    out: str | Path,
    runs: Optional[Iterable[str | Path]] = None,
    *,
    quick: bool = False,
    only=None,
    log: Callable[[str], None] = print,
) -> dict:
    """Compute, save (JSON) and plot (PNG) the figures into ``out``; returns {name: {png, json, summary}}.

    ``quick``: small grids and, without ``runs``, 8-step models at length 128 (a smoke test, not a result)."""
    out = Path(out)
    want = parse_only(only)
    claim_outputs(out, figure_outputs(n for n in FIGURES if n in want), FIGURES_WRITER)
    torch.manual_seed(0)
    ctx = Context(out=out, quick=quick)
    made: Dict[str, dict] = {}
    for name, analysis in ANALYSES.items():
        if name not in want:
            continue
        if name in NEED_MODELS and not ctx.models:
            load_models(ctx, runs, log=log)
        fig = analysis.figure(ctx)
        assert fig.stem == stem(name), (fig.stem, name)  # the names claimed above
        js, png = out / f"{fig.stem}.json", out / f"{fig.stem}.png"
        data = {**fig.data, "summary": fig.summary, "quick": quick}
        write_json(js, data)
        fig.plot(data, png)
        made[name] = {"png": str(png), "json": str(js), "summary": fig.summary, **(fig.extra or {})}
        log(f"  {png.name}: {json.dumps(fig.summary)[:300]}")

    idx_path = out / "figures.json"
    index = {"quick": quick, "runs": ctx.meta, "figures": {}}
    if idx_path.exists():  # --only: keep the other figures' entries
        try:
            old = json.loads(idx_path.read_text())
            if old.get("quick") == quick:
                index["figures"] = old.get("figures", {})
                index["runs"] = ctx.meta or old.get("runs", [])
        except (OSError, json.JSONDecodeError):
            pass
    index["figures"].update(made)
    atomic_write_text(idx_path, json.dumps(index, indent=1) + "\n")
    return made


# ---- command line ------------------------------------------------------------------------------------------
def add_cli(sub) -> None:
    """Register ``longsparse figures`` on the top-level subparsers."""
    f = sub.add_parser("figures", help="the paper's analyses as PNG + JSON (needs the plot extra, matplotlib)")
    f.add_argument("--out", default="docs/figures", help="output folder (default docs/figures)")
    f.add_argument(
        "--runs",
        nargs="+",
        default=None,
        metavar="RUN",
        help="run directories for the trained-model figures (default: train small ones into OUT/runs)",
    )
    f.add_argument("--quick", action="store_true", help="small grids and 8-step models (a smoke test)")
    f.add_argument("--only", default=None, help="comma list of figure numbers or names (default: all)")
    f.set_defaults(func=_cli)


def _cli(args) -> int:
    made = make_figures(args.out, args.runs or None, quick=args.quick, only=args.only)
    print(f"wrote {len(made)} figure(s) to {args.out}: " + ", ".join(sorted(v["png"] for v in made.values())))
    return 0
