#!/usr/bin/env python3
"""The GPU-scale study as one time-limited job on one GPU (docs/gpu.md): a thin wrapper over `longsparse
reproduce`, which does the work.

    python3 benchmarks/gpu_scale.py run --out OUTDIR [--seconds 420] [--resume DIR] [--device cuda|cpu] [--study FILE]
    python3 benchmarks/gpu_scale.py summary FILE     # a job's cells and evaluation times (its OUTDIR/manifest.json)

Usually through ``[STUDY=FILE] bash benchmarks/gpu_scale.sh OUTDIR [SECONDS] [RESUME_DIR]``. ``run`` is

    longsparse reproduce synthetic --config STUDY --out RUNS --report RUNS/report --time-budget SECONDS
        --workers N --bundle-out OUTDIR [--resume-from DIR] (with the bundle caps below)

(`longsparse_experiments.reproduce`: trainings stop at a resumable checkpoint before the budget, what finished is
evaluated, long lengths resumably, and OUTDIR gets the records and a bundle per run folder with work left; a
later job given OUTDIR as ``--resume`` continues there). This script adds what is particular to the GPU study:

* the study file (``--study``, default the preset ``gpu_scale.toml``) and one run root per study file,
  ``runs/<study file name>`` (``--runs``, ``$GPU_SCALE_RUNS``), so two studies never share a store;
* one worker process per cell by default, so all trainings share the GPU at once;
* caps on OUTDIR for a transport with limits: ``--max-files`` (8), ``--max-bytes`` (60 MiB), ``--part`` (15 MiB);
* ``env.txt`` (the machine) and, on CUDA, ``gpu.csv`` (``nvidia-smi`` every 5 s) in the run root, so in
  ``records.tar.gz``;
* ``--device cpu``: the dry run, the same cells at a tiny size (``dry_study``), one worker, on the CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # a GPU machine may have the source tree, not an installed package
    sys.path.insert(0, str(REPO / "src"))

from longsparse.io import atomic_write_text  # noqa: E402
from longsparse.train.config import deep_merge  # noqa: E402
from longsparse_experiments.jobs import SUMMARY_FORMAT, summary_markdown  # noqa: E402
from longsparse_experiments.presets import presets_dir  # noqa: E402
from longsparse_experiments.study import load_study  # noqa: E402

STUDY_NAME = "gpu_scale"
# The dry run: the study's cells with a tiny model (2 layers, d 32, 6 steps) and three short lengths; the last
# one is the "long" length, so the long-length phase and the resumable evaluations run too.
DRY_OVERRIDES = {
    "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "head_dim": 16, "d_ff": 64},
    "train": {
        "steps": 6,
        "warmup_steps": 2,
        "batch_size": 4,
        "val_samples": 2,
        "val_every": 3,
        "ckpt_every": 3,
        "log_every": 3,
        "device": "cpu",
        "threads": 1,
    },
}
DRY = {"lengths": [64, 256, 1024], "id_samples": 8, "samples": 4, "long_from": 1024, "long_samples": 3}


def study_path() -> Path:
    return presets_dir() / "reproduce" / f"{STUDY_NAME}.toml"


def _shown(p: Path) -> str:
    """A path relative to the repository where it lies inside (the store records it; absolute paths differ
    between machines)."""
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return str(p)


# ---- the dry-run study ---------------------------------------------------------------------------------------
def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table (a study's samples_at: {length: samples})
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML form for {v!r}")


def toml_table(name: str, table: dict) -> list[str]:
    """The lines of the TOML table ``[name]`` holding the nested ``table`` as dotted keys (``model.d_model = 32``)."""
    lines = [f"[{name}]"]

    def add(node: dict, prefix: str) -> None:
        for k, v in node.items():
            if isinstance(v, dict):
                add(v, f"{prefix}{k}.")
            else:
                lines.append(f"{prefix}{k} = {_toml_value(v)}")

    add(table, "")
    return lines


def dry_study(src: Path, dest: Path) -> Path:
    """``src`` (a study file) with the dry run's tiny settings, written to ``dest``: the same cells (methods,
    positions, seeds, task, test stream), DRY_OVERRIDES merged over each study's overrides (the dry run's
    setting of a key wins), DRY's lengths and sample counts, and ``_cpu_dry`` appended to each study's name."""
    spec = load_study(path=str(src))
    lines = [f"# The CPU dry run of {_shown(src)} (benchmarks/gpu_scale.py --device cpu); written by the script."]
    for s in spec.studies:
        s = dataclasses.replace(
            s,
            **DRY,
            name=s.name + "_cpu_dry",
            overrides=deep_merge(s.overrides, DRY_OVERRIDES),
            description=f"CPU dry run of {s.name} (tiny model and lengths; tests the script, not the task)",
        )
        lines.append("\n[[study]]")
        for f in dataclasses.fields(s):  # the settings, then the overrides as tables
            if f.name not in ("overrides", "method_overrides"):
                lines.append(f"{f.name} = {_toml_value(getattr(s, f.name))}")
        lines += toml_table("study.overrides", s.overrides)
        for m, over in s.method_overrides.items():
            lines += toml_table(f"study.method_overrides.{m}", over)
    dest.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(dest, "\n".join(lines) + "\n")
    return dest


# ---- the job -------------------------------------------------------------------------------------------------
def _env_info(dest: Path, device: str) -> None:
    """This job's machine: date, Python, CPUs, torch and CUDA, and the GPUs (``nvidia-smi -L``)."""
    lines = [time.strftime("%Y-%m-%d %H:%M:%S %Z"), f"python {sys.version.split()[0]}", f"cpus {os.cpu_count()}"]
    import torch

    lines.append(f"torch {torch.__version__} cuda {torch.version.cuda}")
    if device == "cuda" and shutil.which("nvidia-smi"):
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        lines.append(r.stdout.strip())
    atomic_write_text(dest, "\n".join(lines) + "\n")


def reproduce_args(args, study: str, runs: Path, seconds: float, workers: int) -> list[str]:
    """The `longsparse` command line of the job."""
    argv = ["reproduce", "synthetic", "--config", study, "--out", str(runs), "--report", str(runs / "report")]
    argv += ["--time-budget", f"{seconds:.1f}", "--workers", str(workers), "--bundle-out", str(args.out)]
    argv += ["--bundle-files", str(args.max_files), "--bundle-max", args.max_bytes, "--bundle-part", args.part]
    if args.resume:
        argv += ["--resume-from", str(args.resume)]
    if args.max_examples is not None:
        argv += ["--max-examples", str(args.max_examples)]
    return argv


def cmd_run(args) -> int:
    from longsparse_experiments.cli import main as longsparse

    t0 = time.time()
    dev, dry = args.device, args.device == "cpu"
    if dev == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("gpu_scale: CUDA is not available (--device cpu runs the dry run)")
    study = Path(args.study).resolve() if args.study else study_path()
    if not study.is_file():
        raise SystemExit(f"gpu_scale: --study {args.study}: no such file")
    runs = Path(
        args.runs or os.environ.get("GPU_SCALE_RUNS") or REPO / "runs" / (study.stem + ("_cpu_dry" if dry else ""))
    ).resolve()
    args.out = Path(args.out).resolve()
    args.resume = Path(args.resume).resolve() if args.resume else None
    os.chdir(REPO)  # the store records the study file relative to the repository
    if dry:
        study = dry_study(study, runs / "study-cpu-dry.toml")
    runs.mkdir(parents=True, exist_ok=True)
    _env_info(runs / "env.txt", dev)
    workers = args.workers or (1 if dry else sum(len(s.cells()) for s in load_study(path=str(study)).studies))
    monitor = None
    if dev == "cuda" and shutil.which("nvidia-smi"):
        query = "--query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used"
        with open(runs / "gpu.csv", "w") as f:
            monitor = subprocess.Popen(
                ["nvidia-smi", query, "--format=csv", "-l", "5"], stdout=f, stderr=subprocess.DEVNULL
            )
    try:
        argv = reproduce_args(args, _shown(study), runs, args.seconds - (time.time() - t0), workers)
        print("longsparse " + " ".join(argv), flush=True)
        return longsparse(argv)
    finally:
        if monitor is not None:
            monitor.terminate()
            monitor.wait()


def cmd_summary(args) -> int:
    """A job's summary: OUTDIR/manifest.json (its ``summary``), a job summary, or the first GPU call's
    ``summary.json`` (results/gpu_scale/call-2026-11-27), as markdown tables."""
    path = Path(args.summary)
    try:
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("format") == "longsparse-bundles":
            data = data.get("summary") or {}
        if isinstance(data, dict) and data.get("format") == "longsparse-gpu-scale-summary":
            lengths = sorted({int(L) for c in data["cells"] for L in c["lengths"]})
            data = {"studies": {STUDY_NAME: {"checkpoint": "last", "lengths": lengths, "cells": data["cells"]}}}
        elif not isinstance(data, dict) or data.get("format") != SUMMARY_FORMAT:
            raise ValueError("not a job summary (a --bundle-out manifest.json or a job's summary.json)")
    except (OSError, ValueError) as e:
        print(f"gpu_scale summary: cannot read {path}: {e}", file=sys.stderr)
        return 2
    print(summary_markdown(data))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train, evaluate, bundle: one time-limited job")
    r.add_argument("--out", required=True, help="a new or empty folder: the records and the bundles")
    r.add_argument("--seconds", type=float, default=420, help="the job's wall clock from this script's start")
    r.add_argument("--resume", default=None, help="the OUTDIR of an earlier job (its bundles are restored first)")
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu = the dry run (tiny settings)")
    r.add_argument("--runs", default=None, help="run folder root (default runs/<study file name>, $GPU_SCALE_RUNS)")
    r.add_argument("--workers", type=int, default=None, help="worker processes (default: one per cell; dry run 1)")
    r.add_argument("--study", default=None, help="another study file (default the gpu_scale study; $STUDY in the .sh)")
    r.add_argument("--max-files", type=int, default=8, help="at most this many files in OUTDIR (default 8)")
    r.add_argument("--max-bytes", default="60MiB", help="OUTDIR's files together at most this (default 60MiB)")
    r.add_argument("--part", default="15MiB", help="bundles larger than this are split into parts (default 15MiB)")
    r.add_argument("--max-examples", type=int, default=None, help="evaluate at most N examples per length (tests)")
    r.set_defaults(func=cmd_run)
    m = sub.add_parser("summary", help="a job's cells and evaluation times as markdown tables")
    m.add_argument("summary", help="OUTDIR/manifest.json of a job (or a job summary file)")
    m.set_defaults(func=cmd_summary)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
