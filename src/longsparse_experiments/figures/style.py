"""The plotting style of the figures, on the project's one matplotlib set-up (``longsparse.report.plotting``:
the Agg backend, atomic PNG writes): the default colour cycle, tight layout at 100 dpi; and the JSON every figure
writes beside its PNG."""

from __future__ import annotations

import json
from pathlib import Path

from longsparse.io import atomic_write_text
from longsparse.report import plotting
from longsparse.report.plotting import pyplot

__all__ = ["color_cycle", "plot_note", "pyplot", "save", "write_json"]


def color_cycle() -> list[str]:
    """The colour cycle every figure draws its series (heads, entries, runs) in."""
    return pyplot().rcParams["axes.prop_cycle"].by_key()["color"]


def save(fig, path: Path, dpi: int = 100, tight: bool = True) -> None:
    """Write ``fig`` to ``path`` (PNG, atomically) and close it."""
    plotting.save(fig, path, dpi=dpi, tight_layout=tight)


def plot_note(data: dict, path: Path) -> None:
    """A figure that only says why there is nothing to plot (``data["summary"]["note"]``)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4, 1.5))
    ax.axis("off")
    ax.text(0.5, 0.5, data["summary"].get("note", "nothing to plot"), ha="center", va="center", fontsize=9)
    save(fig, path)


def write_json(path: Path, data: dict) -> None:
    """A figure's numbers, compact (NaN allowed: a fit with no variance has R² NaN)."""
    atomic_write_text(path, json.dumps(data, separators=(",", ":"), allow_nan=True) + "\n")
