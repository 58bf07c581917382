"""The kinds of benchmark result (`Bench`, registered in `BENCHES`), their JSON files (`write_result`: the
environment and the commit measured, never overwriting) and their tables (`markdown`)."""

from __future__ import annotations

import argparse
import json
import platform
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

import torch

from longsparse.io import atomic_write_json


def markdown(path: str) -> str:
    """The markdown table of a saved benchmark JSON (what docs/benchmarks.md shows), by its kind's `Bench`."""
    data = json.loads(Path(path).read_text())
    kind = data["benchmark"]
    if kind not in BENCHES:
        raise ValueError(f"{path}: benchmark kind {kind!r} has no table (known: {', '.join(sorted(BENCHES))})")
    out = BENCHES[kind].table(data["rows"])
    env = data["env"]
    out.append(f"\n_{path}: torch {env['torch']}, {env['threads']} threads, {env['time']}_")
    return "\n".join(out)


def environment() -> dict:
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _device() -> str:
    """What the measurements ran on, for the default file name: "cpu", or the CUDA device's name."""
    if torch.cuda.is_available():
        return "".join(c if c.isalnum() else "-" for c in torch.cuda.get_device_name().lower()).strip("-")
    return "cpu"


def _commit() -> Optional[str]:
    """The checkout's commit (with "+changes" when the tree differs from it), or None outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[3]  # src/longsparse_experiments/bench/ -> the checkout
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True)
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def write_result(kind: str, rows: list[dict], out: str | None, config: dict) -> Path:
    """Writes a result of a registered kind (`BENCHES`: so `markdown` can print it) to ``out``, by default
    benchmarks/results/<kind>-<device>-<date>.json, with the environment and the commit measured. Never
    overwrites a file."""
    if kind not in BENCHES:
        raise ValueError(f"benchmark kind {kind!r} is not registered (register_bench); known: {', '.join(BENCHES)}")
    default = Path("benchmarks/results") / f"{kind}-{_device()}-{datetime.now(timezone.utc):%Y-%m-%d}.json"
    path = Path(out) if out else default
    if path.exists():
        raise FileExistsError(f"{path} exists; choose another --out (results are never overwritten)")
    path.parent.mkdir(parents=True, exist_ok=True)
    env = {**environment(), "commit": _commit()}
    atomic_write_json(path, {"benchmark": kind, "config": config, "env": env, "rows": rows}, indent=1)
    return path


@dataclass(frozen=True)
class Bench:
    """One kind of benchmark result: ``table`` turns its rows into markdown lines; ``run`` (None for the kinds
    that a script in benchmarks/ writes) measures them for ``longsparse bench NAME`` from the parsed flags and
    the lengths, adding what it used to ``config``; ``lengths`` is its default --lengths."""

    name: str
    table: Callable[[list[dict]], list[str]]
    run: Optional[Callable[[argparse.Namespace, list[int], dict], list[dict]]] = None
    lengths: str = "512,1024,2048,4096,8192,16384"
    help: str = ""


BENCHES: dict[str, Bench] = {}


def register_bench(bench: Bench) -> Bench:
    """Adds a kind: its table to `markdown`, and with a ``run`` a choice of ``longsparse bench``."""
    if bench.name in BENCHES or bench.name == "table":
        raise ValueError(f"benchmark {bench.name!r} is already registered")
    BENCHES[bench.name] = bench
    return bench
