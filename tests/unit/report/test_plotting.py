"""The project's one matplotlib set-up (longsparse.report.plotting): no other module imports matplotlib, a plot
without matplotlib is refused with the extra's name (or skipped where it is optional), and a saved figure is
written whole and closed."""

from __future__ import annotations

import re
import sys

import pytest
from helpers.paths import REPO_ROOT

from longsparse.report import plotting

ROOT = REPO_ROOT
MATPLOTLIB = re.compile(r"^\s*(import matplotlib|from matplotlib\b)|\brcParams\[.*\]\s*=|matplotlib\.use\(", re.M)


def test_only_the_plotting_module_sets_matplotlib_up():
    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    assert ROOT / "src" / "longsparse" / "report" / "plotting.py" in files
    found = sorted(str(f.relative_to(ROOT)) for f in files if MATPLOTLIB.search(f.read_text()))
    assert found == ["src/longsparse/report/plotting.py"]


def test_without_matplotlib_a_plot_is_refused_or_skipped(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'longsparse\[plot\]'"):
        plotting.pyplot()
    assert plotting.pyplot_or_none() is None


def test_save_writes_the_png_and_closes_the_figure(tmp_path):
    plt = pytest.importorskip("matplotlib.pyplot")
    plt.close("all")
    fig, ax = plotting.pyplot().subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    path = plotting.save(fig, tmp_path / "x.png", dpi=50)
    assert path == tmp_path / "x.png" and path.read_bytes().startswith(b"\x89PNG")
    assert plt.get_fignums() == [] and sorted(p.name for p in tmp_path.iterdir()) == ["x.png"]  # no temp left
