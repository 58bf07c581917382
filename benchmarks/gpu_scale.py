#!/usr/bin/env python3
"""The GPU-scale run (docs/gpu.md): train every cell of a study as parallel processes on one GPU, evaluate each
with a time guard per length, and hand back the result records and the checkpoints that a later call resumes from.

    python3 benchmarks/gpu_scale.py run --out OUTDIR [--seconds 420] [--resume DIR] [--device cuda|cpu] [--study FILE]
    python3 benchmarks/gpu_scale.py restore --resume DIR [--runs RUNS]
    python3 benchmarks/gpu_scale.py summary SUMMARY.json     # a call's results and evaluation times as tables

Usually through ``[STUDY=FILE] bash benchmarks/gpu_scale.sh OUTDIR [SECONDS] [RESUME_DIR]``. The study file
(``--study``) defaults to the preset ``gpu_scale.toml``; run folders go to ``runs/<study file name>``. ``run``
starts one ``worker`` process per shard (``--shard K/N`` over the study's cells in `longsparse reproduce`'s
order), each of which

* trains its cells with `longsparse.train.train` into the run folders `longsparse reproduce` uses (same config,
  same path), stopped by a training time guard (the last checkpoint then holds what was reached);
* evaluates the last checkpoint of every *finished* training at every study length, shortest first, examples in
  batches, with a time guard per length. A length finished in one or more calls is written as an ordinary
  ``longsparse-eval`` file in ``RUN/eval/`` (so `reproduce` and its archive count it); a length cut short keeps its
  counts and the test stream's position in ``RUN/eval_partial/`` and continues there in the next call. The
  examples are one seeded stream whatever the batch size, so a length finished over several calls scores
  exactly the examples a single `longsparse eval` call scores.

Lengths from the study's ``long_from`` on wait until every training has ended (or the training guard has passed),
so that expensive evaluations do not slow down trainings that are still running.

Outputs in OUTDIR (at most 8 files, each under 16 MiB, 64 MiB together: the device tool's limits):
``records.tar.gz`` (run folders without checkpoints, the report with its archive ``results.json``, logs,
``summary.json``), ``results.json`` (the study archive) and ``resume-<study>-<cell>.tar.gz`` for each cell
that still has work left, as many as fit. A finished training's ``last.pt`` goes into its bundle without the
AdamW moments: `train` then loads it, finds the run complete and trains nothing, and those moments are never
read again; an unfinished one goes whole (it resumes exactly), split into ``.partK`` files over 15 MiB.
Given such files (``--resume DIR``), the run folders and the archive are restored first, except where a local
copy exists (a warm machine keeps ``runs/``, which is newer).

``--device cpu`` is the dry run: the study with a tiny model, few steps and short lengths (``dry_study``), one
worker, the whole path end to end in about a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # the GPU machine has the source tree, not an installed package
    sys.path.insert(0, str(REPO / "src"))

from longsparse.io import atomic_write_text, is_temp_name, read_jsonl, write_new  # noqa: E402
from longsparse.train.config import deep_merge  # noqa: E402
from longsparse_experiments.presets import presets_dir  # noqa: E402
from longsparse_experiments.reproduce import build_report, parse_shard, update_archive  # noqa: E402
from longsparse_experiments.study import Cell, Study, StudyFile, load_study  # noqa: E402

STUDY_NAME = "gpu_scale"
CHECKPOINT = "last"
# Tokens per evaluation batch. Long lengths go one to three examples at a time: small batches keep the time
# guard's granularity fine, and at those lengths the attention's cost per example does not shrink with the batch.
EVAL_BATCH_TOKENS = 1 << 16
# A long length (from the study's long_from) that is not the last one a worker evaluates may use at most this share
# of the time left when it starts, so that 1,024x gets time even when 256x cannot finish. Shorter lengths have no
# such cap: they are the ones a study evaluates in full, before any long length.
LENGTH_SHARE = 0.5
# The device tool's limits on what comes back from one call.
MAX_FILES, MAX_FILE_BYTES, MAX_BYTES = 8, 16 << 20, 64 << 20
PART_BYTES = 15 << 20
RESERVE_BYTES = 1 << 20  # headroom for the records growing by the summary written after sizing
# Time split of one call (seconds): after training and evaluation, workers still running are stopped at
# `end - pack`, leaving `pack` for the report, the checks and the files; a worker's own evaluation deadline
# is `grace` before that; training must end `eval_min` before the evaluation deadline.
SPLIT = {"cuda": {"pack": 35, "grace": 15, "eval_min": 45}, "cpu": {"pack": 20, "grace": 5, "eval_min": 15}}
# The dry run: the study's cells with a tiny model (2 layers, d 32, 6 steps) and three short lengths; the last
# one is the "long" length, so the barrier and the partial-evaluation path run too.
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
CAP_ENV = "GPU_SCALE_EVAL_CAP"  # tests: at most this many examples per long length and call


def study_path() -> Path:
    return presets_dir() / "reproduce" / f"{STUDY_NAME}.toml"


def _shown(p: Path) -> str:
    """A path relative to the repository where it lies inside (the archive records it; absolute paths differ
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


def all_cells(spec: StudyFile) -> list[tuple[int, Study, Cell]]:
    """(index, study, cell) of every cell, indexed as `longsparse reproduce` indexes them for --shard."""
    out = []
    for study in spec.studies:
        for c in study.cells():
            out.append((len(out), study, c))
    return out


# ---- checkpoints --------------------------------------------------------------------------------------------
def checkpoint_step(run: Path):
    """The step of ``run``'s last checkpoint (None without one)."""
    from longsparse.models import read_checkpoint

    p = run / "checkpoints" / f"{CHECKPOINT}.pt"
    if not p.is_file():
        return None
    return int(read_checkpoint(str(p))["extra"]["step"])


def slim_checkpoint(src: Path, dest: Path) -> None:
    """A finished run's last.pt without the AdamW moments: the model, the step, the RNG states and an optimizer
    state with no per-parameter entries (AdamW loads it; `train` stops at once because step == steps)."""
    import torch

    from longsparse.models import read_checkpoint

    payload = read_checkpoint(str(src))
    opt = payload.get("optimizer") or {}
    payload["optimizer"] = {"state": {}, "param_groups": opt.get("param_groups", [])}
    torch.save(payload, dest)


# ---- evaluation records -------------------------------------------------------------------------------------
def completed(run: Path, seed: int) -> set:
    """(checkpoint, length, samples) with a result in ``run/eval`` on test seed ``seed`` (as `reproduce` reads it)."""
    done = set()
    for f in sorted((run / "eval").glob("*.json")) if (run / "eval").is_dir() else []:
        try:
            d = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if d.get("seed") == seed:
            done.update((d.get("checkpoint"), int(r["length"]), d.get("samples")) for r in d.get("results", []))
    return done


def latest_result(run: Path, seed: int, length: int, n: int):
    """The newest full result of ``length`` with ``n`` examples on test seed ``seed`` in ``run/eval`` (or None)."""
    best = None
    for f in sorted((run / "eval").glob("*.json")) if (run / "eval").is_dir() else []:
        try:
            d = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if d.get("seed") != seed or d.get("checkpoint") != CHECKPOINT or d.get("samples") != n:
            continue
        for r in d.get("results", []):
            if int(r["length"]) == length and (best is None or d.get("created", "") >= best[0]):
                best = (d.get("created", ""), r, d.get("checkpoint_step"))
    return None if best is None else {**best[1], "checkpoint_step": best[2]}


def partial_path(run: Path, length: int, n: int, seed: int) -> Path:
    return run / "eval_partial" / f"{CHECKPOINT}-L{length}-n{n}-seed{seed}.json"


def read_partial(run: Path, length: int, n: int, seed: int):
    p = partial_path(run, length, n, seed)
    try:
        return json.loads(p.read_text()) if p.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None


def _counts(st: dict) -> dict:
    from longsparse.evaluate.core import wilson_interval

    lo, hi = wilson_interval(st["n_exact"], st["done"])
    tlo, thi = wilson_interval(st["n_correct_tokens"], st["n_tokens"])
    return {
        "n": st["done"],
        "n_exact": st["n_exact"],
        "exact_match": st["n_exact"] / st["done"] if st["done"] else float("nan"),
        "exact_match_ci": [lo, hi],
        "n_tokens": st["n_tokens"],
        "n_correct_tokens": st["n_correct_tokens"],
        "token_accuracy": st["n_correct_tokens"] / st["n_tokens"] if st["n_tokens"] else float("nan"),
        "token_accuracy_ci": [tlo, thi],
    }


# ---- worker -------------------------------------------------------------------------------------------------
def length_budget(left: float, *, last: bool, long: bool) -> float:
    """Seconds one length may use of the ``left`` seconds before the evaluation deadline: all of them for a
    worker's last length and for a length below the study's ``long_from``, else LENGTH_SHARE of them."""
    return left if last or not long else LENGTH_SHARE * left


class TimeUp(BaseException):
    """Raised by the training time guard. A BaseException, so that no `except Exception` on the way swallows it;
    the checkpoint writer removes its temporary on any exception, so the last complete checkpoint stays."""


_NO_INTERRUPT = (os.path.join("torch", "serialization.py"), os.path.join("longsparse", "io.py"))


@contextlib.contextmanager
def alarm(seconds: float):
    def _raise(signum, frame):
        # never inside an import (a module left half-initialised would break everything after it in this process;
        # torch imports parts of itself lazily, e.g. when the first optimizer is built) nor inside a file write
        # (torch.save's zip writer, interrupted, raises its own error from its cleanup instead of TimeUp): retry
        # shortly after
        f = frame
        while f is not None:
            name = f.f_code.co_filename
            if name.startswith("<frozen importlib") or name.endswith(_NO_INTERRUPT):
                signal.setitimer(signal.ITIMER_REAL, 0.2)
                return
            f = f.f_back
        raise TimeUp()

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Worker:
    def __init__(self, args):
        self.args = args
        self.runs = Path(args.runs)
        self.state = Path(args.state)
        self.k, self.n = parse_shard(args.shard)
        self.spec = load_study(path=args.study)
        self.entries = all_cells(self.spec)
        self.mine = [e for e in self.entries if e[0] % self.n == self.k]
        self.events = self.state / f"events-{self.k}.jsonl"
        cap = os.environ.get(CAP_ENV)
        self.cap = int(cap) if cap else None
        self.models: dict = {}
        self.per_example: dict = {}  # run -> (length, tokens per example, seconds per example) last measured

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] shard {self.k}/{self.n}: {msg}", flush=True)

    def event(self, rec: dict) -> None:
        with open(self.events, "a") as f:
            f.write(json.dumps({**rec, "time": time.time()}) + "\n")

    def main(self) -> int:
        for idx, study, c in self.mine:
            try:
                self.train_cell(study, c)
            finally:  # the barrier of the long lengths counts ended trainings, whatever the outcome
                (self.state / f"trained-{idx}").touch()
        items = []
        for idx, study, c in self.mine:
            run = self.runs / c.run
            cfg = study.cell_config(c)
            step = checkpoint_step(run)
            if step is None or step < cfg["train"]["steps"]:
                self.log(f"{c.run}: training unfinished (checkpoint step {step}); not evaluated")
                continue
            items += [
                (L, idx, study, c)
                for L in study.lengths
                if (CHECKPOINT, L, study.samples_for(L)) not in completed(run, study.test_seed)
            ]
        items.sort(key=lambda x: (x[0], x[1]))
        for i, (L, idx, study, c) in enumerate(items):
            if L >= study.long_from:
                self.wait_for_trainings()
            left = self.args.eval_until - time.time()
            if left <= 1:
                self.event({"phase": "eval", "run": c.run, "length": L, "stop": "no evaluation time left"})
                continue
            share = length_budget(left, last=i == len(items) - 1, long=L >= study.long_from)
            try:
                self.eval_item(study, c, L, time.time() + share)
            except Exception as e:  # one length's failure (e.g. out of memory) must not stop the others
                self.log(f"{c.run} L={L}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
                self.event({"phase": "eval", "run": c.run, "length": L, "stop": f"error: {type(e).__name__}: {e}"})
        return 0

    # -- training
    def train_cell(self, study: Study, c: Cell) -> None:
        from longsparse.train import train

        run = self.runs / c.run
        cfg = study.cell_config(c)
        before = checkpoint_step(run)
        t0 = time.time()
        left = self.args.train_until - t0
        status = "complete"
        if before is not None and before >= cfg["train"]["steps"]:
            status = "complete before this call"
        elif left <= 1:
            status = "not started: no training time left"
        else:
            self.log(
                f"{c.run}: training ({cfg['train']['steps']} steps, from checkpoint step {before}); "
                f"time guard {left:.0f} s"
            )
            try:
                with alarm(left):
                    train(cfg, str(run), progress=False, printer=lambda s: self.log(f"{c.run}: {s}"))
            except TimeUp:
                status = "stopped by the training time guard"
            except Exception as e:
                status = f"error: {type(e).__name__}: {e}"
                self.log(f"{c.run}: {status}\n{traceback.format_exc()}")
        after = checkpoint_step(run)
        if status == "complete" and (after is None or after < cfg["train"]["steps"]):
            status = "stopped by the training time guard"  # the guard fired as train() returned
        self.log(f"{c.run}: {status}; checkpoint step {before} -> {after} in {time.time() - t0:.0f} s")
        self.event(
            {
                "phase": "train",
                "run": c.run,
                "status": status,
                "seconds": round(time.time() - t0, 1),
                "step_before": before,
                "step_after": after,
                "steps": cfg["train"]["steps"],
            }
        )

    def wait_for_trainings(self) -> None:
        marks = [self.state / f"trained-{i}" for i, _, _ in self.entries]
        t0 = time.time()
        while time.time() < self.args.train_until and not all(m.exists() for m in marks):
            time.sleep(1.0)
        if time.time() - t0 > 1:
            self.log(f"waited {time.time() - t0:.0f} s for the other trainings before the long lengths")

    # -- evaluation
    def model(self, run: Path):
        if run not in self.models:
            import torch

            from longsparse.evaluate.sweep import load_run_model
            from longsparse.train.config import make_task

            dev = torch.device(self.args.device)
            model, cfg, extra = load_run_model(run, CHECKPOINT, dev)
            self.models = {run: (model, cfg, int(extra["step"]), make_task(cfg["task"]), dev)}  # one at a time
        return self.models[run]

    def eval_item(self, study: Study, c: Cell, L: int, until: float) -> None:
        from longsparse.evaluate.core import predict, sequence_tokens

        run = self.runs / c.run
        n, seed = study.samples_for(L), study.test_seed
        model, cfg, step, task, dev = self.model(run)
        tokens = sequence_tokens(task, L)
        bs_full = max(1, min(n, EVAL_BATCH_TOKENS // tokens))
        st = read_partial(run, L, n, seed)
        if st is not None and st.get("checkpoint_step") != step:
            os.replace(partial_path(run, L, n, seed), partial_path(run, L, n, seed).with_suffix(".stale.json"))
            self.log(
                f"{c.run} L={L}: partial evaluation of checkpoint step {st.get('checkpoint_step')} set aside "
                f"(the checkpoint is at step {step})"
            )
            st = None
        rng = task.rng(seed, "test")
        if st is None:
            st = {
                "checkpoint": CHECKPOINT,
                "checkpoint_step": step,
                "length": L,
                "samples": n,
                "seed": seed,
                "done": 0,
                "n_exact": 0,
                "n_tokens": 0,
                "n_correct_tokens": 0,
                "seconds": 0.0,
                "batch_size": bs_full,
                "pieces": [],
            }
        else:
            v, state, g = st["rng"]
            rng.setstate((v, tuple(state), g))
        # seconds per example: measured at this length (this call or earlier ones), else extrapolated from a
        # shorter length of the same cell (the attention's cost grows with the square of the length)
        est = st["seconds"] / st["done"] if st["done"] else None
        prev = self.per_example.get(run) or self.known_rate(study, run, L)
        if est is None and prev is not None and prev[0] < L:
            est = prev[2] * (tokens / prev[1]) ** 2
        capped = self.cap is not None and L >= study.long_from
        piece = {"examples": 0, "seconds": 0.0, "device": str(dev), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        st["pieces"].append(piece)  # this call's piece, updated in place as batches finish
        stop = None
        while st["done"] < n:
            bs = min(bs_full, n - st["done"])
            if capped:
                if piece["examples"] >= self.cap:
                    stop = f"example cap {self.cap} ({CAP_ENV})"
                    break
                bs = min(bs, self.cap - piece["examples"])
            if est is None and L >= study.long_from:
                bs = 1  # a probe: its time sizes the next batches
            left = until - time.time()
            if est is not None and est * bs > left:
                bs = int(left // est)
                if bs < 1:
                    stop = f"time guard ({est:.1f} s per example, {max(left, 0):.0f} s left)"
                    break
            t0 = time.perf_counter()
            batch = task.batch(L, bs, rng=rng)
            sc = task.score(predict(model, task, batch).cpu(), batch)
            dt = time.perf_counter() - t0
            v, state, g = rng.getstate()
            st.update(
                done=st["done"] + bs,
                n_exact=st["n_exact"] + sc.n_exact,
                n_tokens=st["n_tokens"] + sc.n_tokens,
                n_correct_tokens=st["n_correct_tokens"] + sc.n_correct_tokens,
                seconds=st["seconds"] + dt,
                rng=[v, list(state), g],
            )
            piece["examples"] += bs
            piece["seconds"] = round(piece["seconds"] + dt, 3)
            est = piece["seconds"] / piece["examples"]
            if st["done"] < n:  # the stream's position after every batch: a kill loses one batch at most
                partial_path(run, L, n, seed).parent.mkdir(exist_ok=True)
                atomic_write_text(partial_path(run, L, n, seed), json.dumps(st) + "\n")
        if piece["examples"]:
            self.per_example[run] = (L, tokens, piece["seconds"] / piece["examples"])
        else:
            st["pieces"].pop()
        if st["done"] >= n:
            self.write_result(run, cfg, step, st, dev)
            partial_path(run, L, n, seed).unlink(missing_ok=True)
            stop = "complete"
        res = _counts(st)
        self.log(
            f"{c.run} L={L}: {st['done']}/{n} ({piece['examples']} in {piece['seconds']:.1f} s this call); "
            f"exact match so far {100 * res['exact_match']:.1f} %; {stop}"
        )
        self.event(
            {
                "phase": "eval",
                "run": c.run,
                "length": L,
                "target": n,
                "done": st["done"],
                "examples": piece["examples"],
                "seconds": round(piece["seconds"], 2),
                "s_per_example": round(piece["seconds"] / piece["examples"], 4) if piece["examples"] else None,
                "batch_size": bs_full,
                "stop": stop,
            }
        )

    def known_rate(self, study: Study, run: Path, L: int):
        """(length, tokens per example, seconds per example) of the longest shorter length of ``run`` evaluated in
        an earlier call (a finished result or a partial one), or None."""
        from longsparse.evaluate.core import sequence_tokens

        for M in sorted((x for x in study.lengths if x < L), reverse=True):
            n = study.samples_for(M)
            r = latest_result(run, study.test_seed, M, n)
            secs, done = (r.get("seconds"), r["n"]) if r else (None, 0)
            if not secs:
                part = read_partial(run, M, n, study.test_seed)
                secs, done = (part["seconds"], part["done"]) if part else (None, 0)
            if secs and done:
                return M, sequence_tokens(self.model(run)[3], M), secs / done
        return None

    def write_result(self, run: Path, cfg: dict, step: int, st: dict, dev) -> Path:
        """The finished length as an ordinary `longsparse eval` result file (the fields `evaluate_run` writes)."""
        from longsparse.train.config import run_label
        from longsparse.train.rundir import environment, now

        L = st["length"]
        r = {
            "length": L,
            **_counts(st),
            "batch_size": st["batch_size"],
            "seconds": round(st["seconds"], 3),
            "seed": st["seed"],
            "split": "test",
            "ratio": L / cfg["train"]["train_lengths"][1],
        }
        res = {
            "format": "longsparse-eval",
            "version": 1,
            "run": str(run.resolve()),
            "run_name": run.name,
            "label": run_label(cfg),
            "task": cfg["task"]["name"],
            "task_preset": cfg["task"].get("preset"),
            "method": cfg["model"]["method"],
            "positions": cfg["model"]["positions"],
            "checkpoint": CHECKPOINT,
            "checkpoint_step": step,
            "train_lengths": cfg["train"]["train_lengths"],
            "samples": st["samples"],
            "seed": st["seed"],
            "results": [r],
            "config": cfg,
            "env": environment(1, str(dev)),
            "created": now(),
            "command": sys.argv,
            "evaluated_by": "benchmarks/gpu_scale.py: batches under a time guard, continued across calls from "
            "the saved stream position; pieces = one entry per call",
            "pieces": st["pieces"],
        }
        return write_new(run / "eval", "eval", json.dumps(res, indent=1) + "\n")


# ---- restore and pack ---------------------------------------------------------------------------------------
def _bundle_name(run_rel: str) -> str:
    return "resume-" + run_rel.replace("/", "-") + ".tar.gz"


def restore(resume: Path, runs: Path, report: Path, log=print) -> list[str]:
    """Unpack the ``resume-*.tar.gz[.partK]`` bundles and the archive ``results.json`` in ``resume`` into ``runs`` /
    ``report``; a run folder or archive that exists here already is kept (a warm machine's copy is newer)."""
    resume, done = Path(resume), []
    if not resume.is_dir():
        raise SystemExit(f"gpu_scale: --resume {resume}: no such folder")
    groups: dict[str, list[tuple[int, Path]]] = {}
    for f in sorted(resume.glob("resume-*.tar.gz*")):
        base, _, part = f.name.partition(".tar.gz")
        k = int(part[len(".part") :]) if part.startswith(".part") else -1
        groups.setdefault(base, []).append((k, f))
    runs.mkdir(parents=True, exist_ok=True)
    for base, parts in sorted(groups.items()):
        parts.sort()
        ks = [k for k, _ in parts]
        if ks != [-1] and ks != list(range(len(ks))):
            log(f"restore: {base}: parts {ks} are incomplete; skipped")
            continue
        with tempfile.TemporaryDirectory(dir=runs, prefix=".restore-") as tmp:
            whole = Path(tmp) / "bundle.tar.gz"
            with open(whole, "wb") as out:
                for _, f in parts:
                    with open(f, "rb") as src:
                        shutil.copyfileobj(src, out)
            with tarfile.open(whole, "r:gz") as tf:
                tops = {"/".join(Path(m.name).parts[:2]) for m in tf.getmembers()}
                if len(tops) != 1:
                    log(f"restore: {base}: not one run folder ({sorted(tops)}); skipped")
                    continue
                top = tops.pop()
                if (runs / top).exists():
                    log(f"restore: {top}: a local run folder exists; kept it")
                    continue
                tf.extractall(Path(tmp) / "x", filter="data")
            (runs / top).parent.mkdir(parents=True, exist_ok=True)
            os.replace(Path(tmp) / "x" / top, runs / top)  # whole or not at all
            done.append(top)
            log(f"restore: {top} from {', '.join(f.name for _, f in parts)}")
    arch = resume / "results.json"
    if arch.is_file():
        if (report / "results.json").exists():
            log(f"restore: {report / 'results.json'} exists; kept it")
        else:
            report.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(arch, report / "results.json")
            done.append("archive")
            log(f"restore: archive {report / 'results.json'}")
    return done


def _make_bundle(run: str, runs: str, dest: str, finished: bool) -> tuple[str, int]:
    """Pack one run folder (no best.pt, lock or temporaries; last.pt slimmed when the training is finished)."""
    run_p, runs_p = Path(run), Path(runs)
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(dest, "w:gz", compresslevel=6) as tf:
        for p in sorted(run_p.rglob("*")):
            if p.is_dir() or p.name == ".lock" or is_temp_name(p.name):
                continue
            rel = p.relative_to(runs_p).as_posix()
            if p.parent.name == "checkpoints":
                if p.name != f"{CHECKPOINT}.pt":
                    continue
                if finished:
                    slim = Path(tmp) / "last.pt"
                    slim_checkpoint(p, slim)
                    tf.add(slim, arcname=rel)
                    continue
            tf.add(p, arcname=rel)
    return dest, os.path.getsize(dest)


def records_tar(dest: Path, runs: Path, study_dirs: list[str], extra: list[Path]) -> int:
    """Every file of the run folders but checkpoints, lock and temporaries, plus ``extra`` paths (folders
    included whole), named relative to ``runs``."""
    with tarfile.open(dest, "w:gz") as tf:
        for d in study_dirs:
            for p in sorted((runs / d).rglob("*")) if (runs / d).is_dir() else []:
                if p.is_dir() or p.name == ".lock" or is_temp_name(p.name) or p.suffix == ".pt":
                    continue
                tf.add(p, arcname=p.relative_to(runs).as_posix())
        for p in extra:
            if p.exists():
                tf.add(p, arcname=p.relative_to(runs).as_posix().replace(".driver", "driver"))
    return dest.stat().st_size


def place_bundles(made: list, out: Path, files: int, total: int, part_bytes: int = PART_BYTES) -> dict:
    """Move the bundles ``made`` ((run, path, bytes, training finished), in priority order) into ``out`` while the
    return limits allow, given ``files`` files and ``total`` bytes already there; a bundle over the per-file limit
    is split into ``.partK`` files of ``part_bytes``. Returns the manifest (placed and left-out bundles)."""
    manifest = {"bundles": [], "left_out": []}
    for run, path, size, trained in made:
        nparts = 1 if size <= MAX_FILE_BYTES else math.ceil(size / part_bytes)
        if files + nparts > MAX_FILES or total + size > MAX_BYTES:
            manifest["left_out"].append({"run": run, "bytes": size, "trained": trained})
            continue
        names = []
        if nparts == 1:
            shutil.move(str(path), out / path.name)
            names.append(path.name)
        else:
            with open(path, "rb") as src:
                for k in range(nparts):
                    names.append(f"{path.name}.part{k}")
                    (out / names[-1]).write_bytes(src.read(part_bytes))
        files += nparts
        total += size
        manifest["bundles"].append(
            {
                "run": run,
                "files": names,
                "bytes": size,
                "checkpoint": "last.pt without AdamW moments (training finished)"
                if trained
                else "last.pt whole (training unfinished)",
            }
        )
    return manifest


# ---- summary ------------------------------------------------------------------------------------------------
def summarize(spec: StudyFile, runs: Path, state: Path, t_call: float) -> list[dict]:
    """Per cell: training state (checkpoint step, loss, this call's steps/s, last validation) and per length the
    finished result, the partial counts, or the archived result of a cell whose run folder is not here."""
    from datetime import datetime

    arch_path = runs / "report" / "results.json"
    arch = json.loads(arch_path.read_text()).get("studies", {}) if arch_path.is_file() else {}
    events = []
    for f in sorted(state.glob("events-*.jsonl")):
        events += read_jsonl(f)
    out = []
    for idx, study, c in all_cells(spec):
        run = runs / c.run
        cfg = study.cell_config(c)
        rec = {
            "run": c.run,
            "method": c.method,
            "positions": c.positions,
            "seed": c.seed,
            "steps": cfg["train"]["steps"],
            "checkpoint_step": checkpoint_step(run) if run.exists() else None,
            "run_folder": run.exists(),
        }
        rec["trained"] = rec["checkpoint_step"] is not None and rec["checkpoint_step"] >= rec["steps"]
        lines = read_jsonl(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
        tr = [x for x in lines if "loss" in x]
        val = [x for x in lines if "val" in x]
        if tr:
            rec["final_loss"] = round(tr[-1]["loss"], 5)
            rec["logged_step"] = tr[-1]["step"]
            now_ = [x for x in tr if datetime.fromisoformat(x["time"]).timestamp() >= t_call - 1]
            if len(now_) >= 2:
                t_a, t_b = (datetime.fromisoformat(now_[i]["time"]) for i in (0, -1))
                dt = (t_b - t_a).total_seconds()
                if dt > 0:
                    rec["steps_per_s_this_call"] = round((now_[-1]["step"] - now_[0]["step"]) / dt, 2)
        if val:
            rec["last_val"] = {"step": val[-1]["step"], "exact_match": val[-1]["val_mean_exact_match"]}
        rec["train_this_call"] = next(
            (e for e in reversed(events) if e.get("phase") == "train" and e["run"] == c.run), None
        )
        rec["lengths"] = {}
        for L in study.lengths:
            n = study.samples_for(L)
            ev = next(
                (e for e in reversed(events) if e.get("phase") == "eval" and e["run"] == c.run and e["length"] == L),
                None,
            )
            full = latest_result(run, study.test_seed, L, n) if run.exists() else None
            part = read_partial(run, L, n, study.test_seed) if run.exists() else None
            old = (
                arch.get(study.name, {})
                .get("series", {})
                .get(f"{c.method}/{c.positions}", {})
                .get(CHECKPOINT, {})
                .get(str(L), {})
                .get("per_seed", {})
                .get(str(c.seed))
            )
            if full is None and part is None and old is not None and old.get("n") == n:
                x = {
                    "status": "archived",
                    "n": old["n"],
                    "exact_match": old["exact_match"],
                    "ci": old["ci"],
                    "token_accuracy": old.get("token_accuracy"),
                    "checkpoint_step": old.get("checkpoint_step"),
                }
            elif full is not None:
                x = {
                    "status": "complete",
                    "n": full["n"],
                    "exact_match": full["exact_match"],
                    "ci": full["exact_match_ci"],
                    "token_accuracy": full["token_accuracy"],
                    "seconds": full.get("seconds"),
                    "checkpoint_step": full.get("checkpoint_step"),
                }
            elif part is not None and part["done"]:
                r = _counts(part)
                x = {
                    "status": "partial",
                    "n": part["done"],
                    "target": n,
                    "exact_match": r["exact_match"],
                    "ci": r["exact_match_ci"],
                    "token_accuracy": r["token_accuracy"],
                    "seconds": round(part["seconds"], 2),
                    "checkpoint_step": part["checkpoint_step"],
                }
            else:
                x = {"status": "none", "target": n}
            if x.get("n") and x.get("seconds"):
                x["s_per_example"] = round(x["seconds"] / x["n"], 4)
            x["this_call"] = ev
            rec["lengths"][str(L)] = x
        out.append(rec)
    return out


def table(cells_: list[dict], lengths: list[int]) -> str:
    """One row per cell: checkpoint step, this call's steps/s, final loss, exact match % per length (with n, or
    with how many of the examples are done so far)."""
    head = "| cell | steps | steps/s | loss | " + " | ".join(f"{L / lengths[0]:g}x" for L in lengths) + " |"
    rows = [head, "|---" * (4 + len(lengths)) + "|"]
    for r in cells_:
        ck = r["checkpoint_step"]
        parts = [
            r["run"].split("/")[-1],
            f"{ck if ck is not None else '-'}/{r['steps']}",
            str(r.get("steps_per_s_this_call", "-")),
            str(r.get("final_loss", "-")),
        ]
        for L in lengths:
            x = r["lengths"].get(str(L), {})
            if x.get("status") in ("complete", "archived"):
                parts.append(f"{100 * x['exact_match']:.1f} (n={x['n']})")
            elif x.get("status") == "partial":
                parts.append(f"{100 * x['exact_match']:.1f} ({x['n']}/{x['target']} so far)")
            else:
                parts.append("-")
        rows.append("| " + " | ".join(parts) + " |")
    return "\n".join(rows)


def eval_time_table(cells_: list[dict], lengths: list[int]) -> str:
    """One row per cell: seconds per evaluated example at each length (this call's, or the stored result's)."""
    head = "| cell | " + " | ".join(f"{L / lengths[0]:g}x" for L in lengths) + " |"
    rows = [head, "|---" * (1 + len(lengths)) + "|"]
    for r in cells_:
        parts = [r["run"].split("/")[-1]]
        for L in lengths:
            x = r["lengths"].get(str(L), {})
            parts.append(f"{x['s_per_example']:.4g}" if x.get("s_per_example") is not None else "-")
        rows.append("| " + " | ".join(parts) + " |")
    return "\n".join(rows)


# ---- driver -------------------------------------------------------------------------------------------------
def _env_info(dest: Path, device: str) -> None:
    lines = [time.strftime("%Y-%m-%d %H:%M:%S %Z"), f"python {sys.version.split()[0]}", f"cpus {os.cpu_count()}"]
    try:
        import torch

        lines.append(f"torch {torch.__version__} cuda {torch.version.cuda}")
    except Exception as e:  # the record says what failed; the run decides below whether it can go on
        lines.append(f"torch: {type(e).__name__}: {e}")
    if device == "cuda" and shutil.which("nvidia-smi"):
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        lines.append(r.stdout.strip())
    dest.write_text("\n".join(lines) + "\n")


def cmd_run(args) -> int:
    t0 = time.time()
    dev = args.device
    dry = dev == "cpu"
    split = SPLIT[dev]
    end = t0 + args.seconds
    kill_at = end - split["pack"]
    eval_until = kill_at - split["grace"]
    train_until = eval_until - split["eval_min"]
    if args.train_seconds is not None:
        train_until = min(train_until, t0 + args.train_seconds)
    if train_until - t0 < 10:
        raise SystemExit(
            f"gpu_scale: --seconds {args.seconds} leaves no training time "
            f"(pack {split['pack']} + grace {split['grace']} + eval_min {split['eval_min']} s)"
        )
    if dev == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("gpu_scale: CUDA is not available (DEVICE=cpu runs the dry run)")
    study = Path(args.study).resolve() if args.study else study_path()
    if not study.is_file():
        raise SystemExit(f"gpu_scale: --study {args.study}: no such file")
    # one run root per study file (runs/gpu_scale for the default one), so two studies never share an archive
    runs = Path(
        args.runs or os.environ.get("GPU_SCALE_RUNS") or REPO / "runs" / (study.stem + ("_cpu_dry" if dry else ""))
    ).resolve()
    report, state, out = runs / "report", runs / ".driver", Path(args.out).resolve()
    resume = Path(args.resume).resolve() if args.resume else None
    os.chdir(REPO)  # study paths are recorded relative to the repository, and workers run there
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise SystemExit(f"gpu_scale: {out} is not empty; give an empty OUTDIR")
    shutil.rmtree(state, ignore_errors=True)  # per-call logs; the last call's came back in its records
    state.mkdir(parents=True)
    log_f = open(state / "driver.log", "a")

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] +{time.time() - t0:.0f}s {msg}"
        print(line, flush=True)
        log_f.write(line + "\n")
        log_f.flush()

    if dry:
        study = dry_study(study, runs / "study-cpu-dry.toml")
    restored = restore(resume, runs, report, log) if resume else []
    spec = load_study(path=_shown(study))
    entries = all_cells(spec)
    jobs = args.jobs or (1 if dry else len(entries))
    _env_info(state / "env.txt", dev)
    log(
        f"study {spec.path}: {len(entries)} cells, {jobs} worker(s) on {dev}; "
        f"training until +{train_until - t0:.0f} s, evaluation until +{eval_until - t0:.0f} s, "
        f"stop at +{kill_at - t0:.0f} s, end +{args.seconds:.0f} s"
    )
    mon = None
    if dev == "cuda" and shutil.which("nvidia-smi"):
        mon = subprocess.Popen(
            [
                "nvidia-smi",
                "--query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used",
                "--format=csv",
                "-l",
                "5",
            ],
            stdout=open(state / "gpu.csv", "w"),
            stderr=subprocess.DEVNULL,
        )
    procs = []
    for k in range(jobs):
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "worker",
            "--study",
            spec.path,
            "--runs",
            str(runs),
            "--state",
            str(state),
            "--shard",
            f"{k}/{jobs}",
            "--device",
            dev,
            "--train-until",
            repr(train_until),
            "--eval-until",
            repr(eval_until),
        ]
        procs.append(
            subprocess.Popen(cmd, stdout=open(state / f"worker-{k}.log", "w"), stderr=subprocess.STDOUT, cwd=REPO)
        )
    snap = time.time() + 60
    while any(p.poll() is None for p in procs) and time.time() < kill_at:
        time.sleep(1.0)
        if time.time() >= snap:  # a copy of the records in case the call is cut off before the end
            snap = time.time() + 60
            try:
                update_archive(spec, runs, report, printer=lambda s: None)
                records_tar(out / "records.tar.gz", runs, [s.name for s in spec.studies], [report, state])
            except Exception as e:
                log(f"progress snapshot failed: {type(e).__name__}: {e}")
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    log("workers ended: exit codes " + ", ".join(str(p.returncode) for p in procs))
    if mon is not None:
        mon.terminate()
    t_work = time.time()

    try:
        build_report(spec, runs, report, printer=lambda s: None)
    except Exception as e:
        log(f"report failed: {type(e).__name__}: {e}")
    # what `longsparse reproduce` would do with these run folders: the check that it resumes instead of retraining
    try:
        chk = subprocess.run(
            [
                sys.executable,
                "-m",
                "longsparse_experiments.cli",
                "reproduce",
                "synthetic",
                "--config",
                spec.path,
                "--out",
                str(runs),
                "--report",
                str(report),
                "--dry-run",
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=max(10.0, end - time.time() - 15),
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]),
            },
        )
        dry_out = chk.stdout + chk.stderr
    except subprocess.TimeoutExpired:
        dry_out = "reproduce --dry-run: timed out\n"
    (state / "reproduce-dry-run.txt").write_text(dry_out)

    # bundles of the cells with work left, in the study's cell order, as many as the limits allow
    cells_ = summarize(spec, runs, state, t0)
    studies = [s.name for s in spec.studies]
    extra = [report, state, *([study] if dry else [])]
    records_tar(out / "records.tar.gz", runs, studies, extra)
    if (report / "results.json").is_file():
        shutil.copyfile(report / "results.json", out / "results.json")
    fixed = sum(f.stat().st_size for f in out.iterdir()) + RESERVE_BYTES
    todo = [
        r
        for r in cells_
        if r["run_folder"]
        and (not r["trained"] or any(x["status"] not in ("complete", "archived") for x in r["lengths"].values()))
    ]
    manifest = {"bundles": [], "left_out": []}
    if todo:
        tmp = Path(tempfile.mkdtemp(dir=runs, prefix=".bundles-"))
        # fork: the children only read and write files, on the CPU
        with ProcessPoolExecutor(max_workers=min(6, len(todo)), mp_context=multiprocessing.get_context("fork")) as ex:
            made = list(
                ex.map(
                    _make_bundle,
                    [str(runs / r["run"]) for r in todo],
                    [str(runs)] * len(todo),
                    [str(tmp / _bundle_name(r["run"])) for r in todo],
                    [r["trained"] for r in todo],
                )
            )
        manifest = place_bundles(
            [(r["run"], Path(path), size, r["trained"]) for r, (path, size) in zip(todo, made)],
            out,
            len(list(out.iterdir())),
            fixed,
        )
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {
        "format": "longsparse-gpu-scale-summary",
        "study_file": spec.path,
        "device": dev,
        "dry_run": dry,
        "seconds": args.seconds,
        "jobs": jobs,
        "restored": restored,
        "timeline_s": {
            "train_until": round(train_until - t0),
            "eval_until": round(eval_until - t0),
            "stop_workers": round(kill_at - t0),
            "workers_ended": round(t_work - t0),
            "packed": round(time.time() - t0),
        },
        "cells": cells_,
        "pack": manifest,
        "reproduce_dry_run": dry_out.strip().splitlines(),
    }
    atomic_write_text(state / "summary.json", json.dumps(summary, indent=1) + "\n")
    lengths = list(spec.studies[0].lengths)
    md = table(cells_, lengths)
    atomic_write_text(state / "summary.md", md + "\n")
    records_tar(out / "records.tar.gz", runs, studies, extra)
    sizes = {f.name: f.stat().st_size for f in sorted(out.iterdir())}
    over = len(sizes) > MAX_FILES or sum(sizes.values()) > MAX_BYTES or max(sizes.values()) > MAX_FILE_BYTES
    print(md)
    for r in cells_:
        t = r["train_this_call"]
        if t:
            print(
                f"{r['run']}: training {t['status']} ({t['seconds']} s, step {t['step_before']} -> {t['step_after']})"
            )
    for b in manifest["bundles"]:
        print(f"bundle {b['run']}: {', '.join(b['files'])} ({b['bytes'] / 1e6:.1f} MB; {b['checkpoint']})")
    for b in manifest["left_out"]:
        print(f"NOT RETURNED (limits): {b['run']} ({b['bytes'] / 1e6:.1f} MB); resume it on the warm machine")
    print("reproduce --dry-run: " + " | ".join(summary["reproduce_dry_run"][-len(entries) :]))
    print(
        f"files in {out}: "
        + ", ".join(f"{k} ({v / 1e6:.2f} MB)" for k, v in sizes.items())
        + ("  -- OVER THE RETURN LIMITS" if over else "")
    )
    log(f"done after {time.time() - t0:.0f} s")
    return 1 if over else 0


def cmd_worker(args) -> int:
    return Worker(args).main()


def cmd_restore(args) -> int:
    runs = Path(args.runs or "runs/gpu_scale").resolve()
    restore(Path(args.resume), runs, runs / "report")
    return 0


def cmd_summary(args) -> int:
    path = Path(args.summary)
    try:
        data = json.loads(path.read_text())
        if data.get("format") != "longsparse-gpu-scale-summary":
            raise ValueError("not a gpu_scale summary.json (its format field differs)")
    except (OSError, ValueError) as e:
        print(f"gpu_scale summary: cannot read {path}: {e}", file=sys.stderr)
        return 2
    lengths = sorted({int(L) for c in data["cells"] for L in c["lengths"]})
    print(table(data["cells"], lengths))
    print("\nSeconds per evaluated example:\n")
    print(eval_time_table(data["cells"], lengths))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train, evaluate, pack (one device call)")
    r.add_argument("--out", required=True, help="an empty folder: the files that come back")
    r.add_argument("--seconds", type=float, default=420, help="wall-clock budget of the whole call (default 420)")
    r.add_argument("--resume", default=None, help="a folder holding the resume-*.tar.gz* bundles and results.json")
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu = the dry run (tiny settings)")
    r.add_argument("--runs", default=None, help="run folder root (default runs/<study file name>, $GPU_SCALE_RUNS)")
    r.add_argument("--jobs", type=int, default=None, help="worker processes (default: one per cell; dry run 1)")
    r.add_argument("--train-seconds", type=float, default=None, help="end training earlier than the split says")
    r.add_argument("--study", default=None, help="another study file (default the gpu_scale study; $STUDY in the .sh)")
    r.set_defaults(func=cmd_run)
    w = sub.add_parser("worker", help=argparse.SUPPRESS)
    for a in ("--study", "--runs", "--state", "--shard", "--device"):
        w.add_argument(a, required=True)
    w.add_argument("--train-until", type=float, required=True)
    w.add_argument("--eval-until", type=float, required=True)
    w.set_defaults(func=cmd_worker)
    s = sub.add_parser("restore", help="only unpack resume bundles into the run folders")
    s.add_argument("--resume", required=True)
    s.add_argument("--runs", default=None)
    s.set_defaults(func=cmd_restore)
    m = sub.add_parser("summary", help="a call's summary.json as markdown tables (results, seconds per example)")
    m.add_argument("summary", help="the summary.json of a call (records.tar.gz: driver/summary.json)")
    m.set_defaults(func=cmd_summary)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
