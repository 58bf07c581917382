"""How often the seed-level intervals of docs/findings.md cover the true mean difference, at the seed counts the
page uses (2-6), by simulation (row command C14): the 95 % percentile bootstrap of ``longsparse.report.paired``
(10,000 resamples, the same percentile positions) and its 95 % Student-t interval, for differences drawn from a
normal distribution (both intervals shift and scale with the data, so the mean and spread do not matter).

    longsparse findings interval-coverage [--out docs/findings]   # about 1.5 CPU-minutes; needs numpy

Seeded; writes ``<out>/interval_coverage/analysis.{json,md}``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

from longsparse.io import atomic_write_text, claim_outputs
from longsparse.report import paired

WRITER = "longsparse findings interval-coverage"
NAME = "interval_coverage"
OUTPUTS = ("analysis.json", "analysis.md")
SEEDS = (2, 3, 4, 5, 6)
TRIALS = 20_000
RESAMPLES = paired.BOOTSTRAP_RESAMPLES
CHUNK = 500  # simulated studies per batch: bounds the (CHUNK, RESAMPLES, n) index array


def _numpy():
    try:
        import numpy as np
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the interval-coverage simulation needs numpy: pip install numpy") from e
    return np


def covers_zero(x, idx) -> tuple:
    """Whether each simulated study's two 95 % intervals cover 0 (the true mean).

    ``x``: (k, n) seed differences of k studies; ``idx``: (k, RESAMPLES, n) integer resampling indices into the
    n seeds. Returns two boolean (k,) arrays: the percentile bootstrap interval (sorted resample means at positions
    ``int(0.025 R)`` and ``min(R - 1, int(0.975 R))``, as ``paired.bootstrap_mean_interval``) and the t-interval
    mean ± t(0.975, n − 1) · sd / √n."""
    np = _numpy()
    k, n = x.shape
    resamples = idx.shape[1]
    lo_i, hi_i = int(0.025 * resamples), min(resamples - 1, int(0.975 * resamples))
    means = np.sort(np.take_along_axis(x[:, None, :].repeat(resamples, 1), idx, 2).mean(2), axis=1)
    boot = (means[:, lo_i] <= 0) & (means[:, hi_i] >= 0)
    half = paired.t_quantile(0.975, n - 1) * x.std(1, ddof=1) / math.sqrt(n)
    m = x.mean(1)
    return boot, (m - half <= 0) & (m + half >= 0)


def coverage(n: int, rng, trials: int = TRIALS) -> dict:
    """The fraction of ``trials`` simulated studies of ``n`` standard-normal seed differences (true mean 0) whose
    bootstrap and t-intervals cover 0; ``rng``: a ``numpy.random.Generator``, drawn from in chunks of ``CHUNK``."""
    boot = tcov = 0
    for start in range(0, trials, CHUNK):
        k = min(CHUNK, trials - start)
        x = rng.standard_normal((k, n))
        idx = rng.integers(0, n, size=(k, RESAMPLES, n))
        b, t = covers_zero(x, idx)
        boot += int(b.sum())
        tcov += int(t.sum())
    return {"seeds": n, "bootstrap": boot / trials, "t": tcov / trials, "t_quantile": paired.t_quantile(0.975, n - 1)}


def markdown(note: str, rows: list[dict]) -> str:
    lines = [note, "", "| seeds | bootstrap covers | t-interval covers | t(0.975, n − 1) |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['seeds']} | {100 * r['bootstrap']:.1f} % | {100 * r['t']:.1f} % | {r['t_quantile']:.3f} |")
    return "\n".join(lines) + "\n"


def run_interval_coverage(out: str | Path = "docs/findings", log: Callable[[str], None] = print) -> Path:
    """Simulate every seed count of ``SEEDS`` (numpy generator seeded with 0, ``TRIALS`` studies each) and write
    ``<out>/interval_coverage/analysis.{json,md}``; returns that folder."""
    np = _numpy()
    d = Path(out) / NAME
    claim_outputs(d, OUTPUTS, WRITER)
    rng = np.random.default_rng(0)
    rows = [coverage(n, rng) for n in SEEDS]
    note = (
        f"Coverage of the nominal 95 % seed-level intervals, {TRIALS:,} simulated studies per seed count, "
        f"differences ~ normal (numpy generator seeded with 0); bootstrap: percentile, {RESAMPLES:,} resamples "
        "(longsparse.report.paired); t: mean ± t(0.975, n − 1) · sd / √n. Simulation error ≈ ±0.3 points."
    )
    atomic_write_text(d / "analysis.json", json.dumps({"note": note, "rows": rows}, indent=1) + "\n")
    text = markdown(note, rows)
    atomic_write_text(d / "analysis.md", text)
    log(text)
    return d
