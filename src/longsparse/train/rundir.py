"""Run directories.

    RUN/config.json        resolved run config (longsparse.train.config) — the identity of the run
    RUN/env.json           versions (python, torch, longsparse), git revision, host, world size of the first session
    RUN/sessions.jsonl     one line per start/resume of the training command
    RUN/metrics.jsonl      training log: {"step", "loss", "lr", ...} and {"step", "val": {...}} records
    RUN/train.log          the plain log lines
    RUN/checkpoints/last.pt   model + optimizer + step + RNG / data-stream state (resume)
    RUN/checkpoints/best.pt   model at the best mean validation exact match
    RUN/eval/*.json        `longsparse eval` results, one new file per call
    RUN/.lock              locked while a process trains here: a second training process is refused

A directory that holds a *different* config is refused (nothing is written); the same config resumes. config.json
is written first and atomically, so a folder without it holds at most the lock and temporaries of a killed
start, and is started afresh.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from longsparse.io import atomic_write_text, is_temp_name, remove_stale_temps
from longsparse.train.config import ConfigError, config_diff, resolve, run_identity
from longsparse.train.config.identity import FORM_KEYS, SCHEMA_VERSION

CHECKPOINTS = ("best", "last")
LOCK_NAME = ".lock"  # flock'ed while a process trains into the folder (run_lock)


class RunDirError(ValueError):
    pass


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def git_revision() -> dict:
    here = Path(__file__).resolve().parent
    out = {"commit": None, "dirty": None}
    try:
        rev = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if rev.returncode == 0:
            out["commit"] = rev.stdout.strip()
            st = subprocess.run(
                ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=5,
            )
            out["dirty"] = bool(st.stdout.strip()) if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def environment(world_size: int = 1, device: str = "cpu") -> dict:
    import torch

    import longsparse

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "longsparse": longsparse.__version__,
        "git": git_revision(),
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "world_size": world_size,
        "device": device,
        "time": now(),
    }


def read_config(run: str | os.PathLike) -> dict:
    path = Path(run) / "config.json"
    if not path.is_file():
        raise RunDirError(f"{run} is not a longsparse run directory (no config.json)")
    try:
        return resolve(json.loads(path.read_text()))
    except (json.JSONDecodeError, ConfigError) as e:
        raise RunDirError(f"{path}: unreadable or invalid run config: {e}") from None


def checkpoint_path(run: str | os.PathLike, which: str = "last") -> Path:
    if which not in CHECKPOINTS:
        raise RunDirError(f"unknown checkpoint {which!r}; choose one of {', '.join(CHECKPOINTS)}")
    return Path(run) / "checkpoints" / f"{which}.pt"


def normalise(cfg: Mapping) -> dict:
    """What config.json holds: the run's identity and the keys of its form (``FORM_KEYS``)."""
    return {**run_identity(cfg), **{k: cfg[k] for k in FORM_KEYS if k in cfg}}


def check_run_dir(out: str | os.PathLike, cfg: Mapping) -> str:
    """'new' (absent or empty folder) or 'resume' (same config); RunDirError otherwise. Writes nothing."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RunDirError(f"{out} exists and is not a directory")
    if not out.exists() or not _foreign_entries(out):
        return "new"
    cfg_path = out / "config.json"
    if not cfg_path.is_file():
        raise RunDirError(
            f"{out} is not empty and holds no config.json: not a longsparse run directory; "
            f"refusing to write into it (choose another --out)"
        )
    try:
        old = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise RunDirError(f"{cfg_path} is not valid JSON ({e}); refusing to touch the run") from None
    if isinstance(old, dict) and old.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise RunDirError(
            f"{cfg_path} is a run config of schema_version {old['schema_version']!r}; this longsparse reads "
            f"{SCHEMA_VERSION}: rewrite it once with `longsparse migrate {cfg_path}`; nothing was changed"
        )
    new = run_identity(cfg)
    if run_identity(old) != new:
        diff = config_diff(run_identity(old), new)
        raise RunDirError(
            f"{out} holds a run with a DIFFERENT config; nothing was changed. Differences "
            f"(stored -> requested):\n  "
            + "\n  ".join(diff[:20])
            + ("\n  ..." if len(diff) > 20 else "")
            + "\nUse another --out, or the same settings to resume this run."
        )
    return "resume"


@contextlib.contextmanager
def run_lock(out: str | os.PathLike):
    """Hold an exclusive lock on run directory ``out`` while training into it; a second process gets a clear
    RunDirError instead of interleaving its checkpoints and metrics with the first. The OS drops the lock when
    the holder dies (even by SIGKILL), so an interrupted run can always be resumed."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LOCK_NAME, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirError(
                f"{out} is being trained by another process right now; nothing was changed "
                f"(wait for it to finish, or use another --out)"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _foreign_entries(out: Path) -> list[Path]:
    """What in ``out`` makes it more than the leftovers of a training killed before it wrote config.json: anything
    but the lock file, temporaries of atomic writes, and an empty ``checkpoints/`` (made before config.json by
    earlier versions). A folder with nothing else is recovered as a new run."""
    keep = []
    for p in out.iterdir():
        if p.name == LOCK_NAME or (p.is_file() and is_temp_name(p.name)):
            continue
        if p.name == "checkpoints" and p.is_dir() and all(is_temp_name(q.name) for q in p.iterdir()):
            continue
        keep.append(p)
    return keep


def init_run_dir(out: str | os.PathLike, cfg: Mapping, env: Mapping) -> None:
    """config.json first and atomically: a folder either holds the full config (resumable) or is recognised by
    ``check_run_dir`` as the leftovers of a run killed before it started."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "config.json").exists():
        atomic_write_text(out / "config.json", json.dumps(normalise(cfg), indent=2, sort_keys=True) + "\n")
    (out / "checkpoints").mkdir(exist_ok=True)
    if not (out / "env.json").exists():
        atomic_write_text(out / "env.json", json.dumps(env, indent=2) + "\n")
    with open(out / "sessions.jsonl", "a") as f:
        f.write(json.dumps(dict(env)) + "\n")


def remove_stale_temps_in_run(out: str | os.PathLike) -> list[Path]:
    """Temporaries of killed writers (checkpoint ``.tmp-*.pt``, config / metrics temporaries) in the run folder and
    its checkpoints/. Call under ``run_lock`` only: then no other process writes there (``longsparse eval`` writes
    into eval/, which is not touched)."""
    out = Path(out)
    return remove_stale_temps(out) + remove_stale_temps(out / "checkpoints")


def new_result_path(folder: str | os.PathLike, stem: str) -> Path:
    """A path ``folder/stem-<time>[-k].json`` that did not exist, created exclusively (never overwrites) and empty
    until the caller writes it; ``longsparse.io.write_new`` creates a new file with its content in one step."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ts = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    k = 0
    while True:
        path = folder / (f"{stem}-{ts}.json" if k == 0 else f"{stem}-{ts}-{k}.json")
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
            return path
        except FileExistsError:
            k += 1
