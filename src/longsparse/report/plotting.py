"""The one matplotlib set-up of the project: every plot (the report's, the paired analysis's, the experiments'
figures, demo, study and LM plots) gets pyplot here and is written here.

* ``pyplot()``: matplotlib on the Agg backend (files only: no display is needed or opened), or an ImportError
  naming the ``plot`` extra; ``pyplot_or_none()`` for a plot that is optional beside a table.
* ``save(fig, path, dpi=...)``: the figure written atomically (``longsparse.io.atomic_savefig``) and closed.

matplotlib is optional (the ``plot`` extra); nothing here imports it before a plot is asked for.
"""

from __future__ import annotations

from pathlib import Path

from longsparse.io import atomic_savefig

MISSING = "plots need matplotlib, which is not installed: pip install 'longsparse[plot]' (or pip install matplotlib)"


def pyplot():
    """matplotlib.pyplot on the Agg backend; ImportError (``MISSING``) without matplotlib."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError(MISSING) from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pyplot_or_none():
    """``pyplot()``, or None without matplotlib."""
    try:
        return pyplot()
    except ImportError:
        return None


def save(fig, path: str | Path, *, dpi: int, tight_layout: bool = True, **savefig_kwargs) -> Path:
    """Lay ``fig`` out (``tight_layout``), write it to ``path`` (PNG by the suffix, atomically) and close it.
    ``savefig_kwargs``: e.g. ``bbox_inches="tight"`` (crop to the drawing) or ``metadata`` (PNG text chunks)."""
    if tight_layout:
        fig.tight_layout()
    path = Path(path)
    atomic_savefig(fig, path, dpi=dpi, **savefig_kwargs)
    pyplot().close(fig)
    return path
