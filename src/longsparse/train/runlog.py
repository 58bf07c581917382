"""The run's log: plain lines (printed, or written through the progress bar, and appended to ``train.log``),
``metrics.jsonl`` records, the progress bar and the ETA. Rank 0 alone writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable, Optional

from longsparse.io import atomic_write_text, read_jsonl


class RunLog:
    """``log(line)``: print the line (through the progress bar while there is one) and append it to
    ``out/train.log``; ``log.metrics(record)``: append a JSON line to ``out/metrics.jsonl``. Only on the main
    rank; ``out=None`` (a run in memory) prints only."""

    def __init__(self, out: Optional[Path], main: bool, printer: Optional[Callable[[str], None]]):
        self.out, self.main, self.printer = out, main, printer or print
        self.bar = None

    def __call__(self, msg: str) -> None:
        if not self.main:
            return
        if self.bar is not None:
            self.bar.write(msg)
        else:
            self.printer(msg)
        if self.out is not None:
            with open(self.out / "train.log", "a") as f:
                f.write(msg + "\n")

    def metrics(self, rec: dict) -> None:
        if self.main and self.out is not None:
            with open(self.out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")


def progress_bar(total: int, initial: int, enabled: bool):
    """A tqdm bar on a terminal (None when not enabled or stdout is not one)."""
    if not enabled or not sys.stdout.isatty():
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, dynamic_ncols=True, leave=True)


def format_duration(seconds: float) -> str:
    """``1h02m``, ``3m05s``, ``42s``."""
    s = max(0, round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def eta_text(done: int, left: int, elapsed: float) -> str:
    """Remaining time at the rate of this session so far (``?`` before the first step)."""
    return format_duration(elapsed / done * left) if done > 0 else "?"


def trim_metrics(out: Path, step: int) -> None:
    """Drop the ``metrics.jsonl`` records after ``step`` (those of a killed session past its last checkpoint)."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return
    keep = [r for r in read_jsonl(path) if r.get("step", 0) <= step]  # a line torn by a kill is dropped
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in keep))
