"""`longsparse reproduce synthetic`: the length-generalisation study of docs/results.md, rerunnable.

    longsparse reproduce synthetic [--quick] [--out runs/reproduce] [--report docs/results] [--only sort,copy]

The study is ``configs/reproduce/synthetic.toml`` of this package (``--quick``: ``synthetic-quick.toml``), read
by ``longsparse_experiments.study.load_study`` into typed ``Study`` objects: a list of cells (task × method ×
positions × seed), each trained with ``longsparse train``'s loop from the task's preset (the library's) plus the
cell's ``overrides``, then evaluated at every length with the study's checkpoints (best and last by default).
Everything is resumable: a finished training is not redone (an interrupted one resumes from its last checkpoint),
an evaluation whose (checkpoint, length, samples, seed) already has a result file is skipped. The report
(markdown tables, JSON, PNG per study) is rendered from the study's results store, never from anything else.

The store (``--store``, default: the report folder; ``longsparse.report.store``) is an append-only file of result
records, one per run evaluation: run folders (checkpoints, eval files) live outside git and are gone on a fresh
machine, so what a run folder holds is appended to the store as a record (only when it is new or changed), a
cell whose results are all in the store is not trained again, and nothing is ever removed from the store. A
record whose config hash differs from the study file's current one for its cell is left out of the report (with
a message), never mixed in. The CLI appends after every cell that trained or evaluated something, so the store
holds every cell a session finished. The report folder gets ``tables.md``, a PNG per study and ``results.json``,
the rendered view (per study, method/positions, checkpoint, length and seed) that the tables are drawn from;
rendering rewrites them and never the store.

    longsparse reproduce synthetic --store results/synthetic --report docs/results --report-only   # the tables

A job with a wall-clock limit (a cluster, or any machine that ends jobs at a set time):

    longsparse reproduce synthetic --config STUDY.toml --time-budget 420 --workers 6 --bundle-out DIR
    longsparse reproduce synthetic --config STUDY.toml --time-budget 420 --workers 6 --resume-from DIR --bundle-out DIR2

``--time-budget`` stops trainings at a resumable checkpoint and evaluations at a saved stream position before
the limit (``jobs.TimeBudget`` splits it), ``--workers`` runs that many cells at once in worker processes
(``jobs.WorkerPool``), ``--bundle-out`` writes the run folders with work left, checkpoints included, as files of
bounded size and ``--resume-from`` restores them (``bundles``); the next job continues where this one stopped
and ends with the numbers of one uninterrupted run. ``--max-examples N`` evaluates at most N examples per length
and job (the rest continue in the next), so an evaluation can also be spread over jobs by count.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from longsparse.io import atomic_write_text, check_outputs, claim_outputs, read_jsonl
from longsparse.report import store as result_store
from longsparse.train.config import ConfigError
from longsparse_experiments.jobs import SUMMARY_FORMAT, TimeBudget, summary_markdown
from longsparse_experiments.study import Cell, Study, StudyFile, load_study
from longsparse_experiments.study_records import (
    REPORT_WRITER,
    archived,
    build_report,
    cell_identities,
    check_report_folder,
    load_store,
    new_records,
    report_outputs,
    train_record,
    update_archive,
    view,
)


def parse_shard(text: Optional[str]) -> tuple[int, int]:
    """``"K/N"`` -> (K, N): this process takes every N-th cell starting at the K-th (0-based)."""
    if not text:
        return 0, 1
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard must look like K/N (e.g. 0/2), got {text!r}") from None
    if n < 1 or not 0 <= k < n:
        raise ValueError(f"--shard K/N needs 0 <= K < N, got {text!r}")
    return k, n


def _evaluated(run: Path, seed: int = 0) -> set[tuple[str, int, int]]:
    """(checkpoint, length, samples) already evaluated on test seed ``seed`` in ``run/eval`` (one read per file)."""
    done = set()
    for f in sorted((run / "eval").glob("*.json")) if (run / "eval").is_dir() else []:
        try:
            d = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):  # an evaluation killed before its first length
            continue
        if d.get("seed") == seed:
            done.update((d.get("checkpoint"), int(r["length"]), d.get("samples")) for r in d.get("results", []))
    return done


def _to_evaluate(study: Study, run: Path) -> list[tuple[str, int, list[int]]]:
    """(checkpoint, samples, lengths) still to evaluate in ``run`` on the study's test stream: one entry per
    evaluation call."""
    done, out = _evaluated(run, study.test_seed), []
    for ck in study.checkpoints:
        by_n: dict[int, list[int]] = {}
        for L in study.lengths:
            n = study.samples_for(L)
            if (ck, L, n) not in done:
                by_n.setdefault(n, []).append(L)
        out += [(ck, n, lengths) for n, lengths in by_n.items()]
    return out


def run_study(
    spec: StudyFile,
    out: str | Path,
    *,
    shard: tuple[int, int] = (0, 1),
    archive: Optional[list[dict]] = None,
    dry_run: bool = False,
    after_cell: Optional[Callable[[], None]] = None,
    printer: Callable[[str], None] = print,
    budget: Optional[TimeBudget] = None,
    workers: int = 1,
    journal: Optional[list[dict]] = None,
    max_examples: Optional[int] = None,
) -> list[Path]:
    """Train and evaluate every cell of ``spec`` (resumable; ``StudyFile.select`` narrows it to some studies);
    returns the run folders. ``shard=(K, N)`` takes every N-th of its cells from the K-th, so N processes (one per
    core) can share a study; the same run is never trained by two processes at once (run directories are locked).
    A cell whose every evaluation is in ``archive`` (the store's records, see ``load_store``) and that has no run
    folder here is skipped: it was run on another machine. A cell that is trained again is evaluated again at every length, so
    each seed's numbers come from one model (recording prints any stored number that changes).
    ``dry_run``: only print what would be done. ``after_cell`` is called after each cell that trained or evaluated
    anything (the CLI appends to the store there, so a session that ends mid-study keeps its finished cells).

    ``workers``: cells run in that many worker processes at once (one intra-op thread each), ``after_cell``
    still in this process. ``budget`` (``jobs.TimeBudget``; a job with a wall-clock limit): trainings stop at a
    checkpoint by ``budget.train_until``; each cell whose training finished is then evaluated at its lengths
    below the study's ``long_from``, and once every cell's training has ended the long lengths, shortest first,
    each but a cell's last using at most LONG_SHARE of the evaluation time left; evaluations stop by
    ``budget.eval_until`` and resume in the next job (``longsparse.evaluate.sweep``), and workers still busy at
    ``budget.stop_at`` are stopped. ``max_examples``: evaluations score at most that many examples per length
    and call, resumably (the rest in a later call). ``journal`` receives one entry per job that ended (what it
    did)."""
    out = Path(out)
    stored = result_store.by_run(archive or [])
    plan, index = [], -1
    for study in spec.studies:
        for c in study.cells():
            index += 1
            if index % shard[1] != shard[0]:
                continue
            run = out / c.run
            cfg = study.cell_config(c)
            old = archived(stored, study, c, cell_identities(cfg))["kept"]
            if not run.exists() and len(old) == len(study.checkpoints) * len(study.lengths):
                printer(f"{c.run}: every result is in the archive (run elsewhere); skipped")
                continue
            if dry_run:
                pairs = sum(len(lengths) for _, _, lengths in _to_evaluate(study, run))
                steps = cfg["train"]["steps"]
                # the loop always logs the loss of its last step, so metrics.jsonl tells a finished run
                done = train_record(run)["steps"] if run.exists() else None
                if done is not None and done >= steps:
                    plan_text = f"trained already ({done} steps)"
                elif run.exists():  # stopped, or still training in another process
                    plan_text = (
                        f"partly trained ({done or 0} of {steps} steps logged); would resume from its last checkpoint"
                    )
                else:
                    plan_text = f"would train ({steps} steps; new)"
                printer(f"{c.run}: {plan_text} and would evaluate {pairs} (checkpoint, length) pairs")
                continue
            plan.append((study, c))
    if dry_run:
        if budget is not None:
            printer(budget.describe())
        return []
    journal = journal if journal is not None else []
    if budget is None and workers == 1:  # in this process, one cell after the other
        for study, c in plan:
            rec = cell_job(study, c, out, printer=printer, max_examples=max_examples)
            journal.append(rec)
            if after_cell is not None and rec["saved"]:  # only when something new is saved
                after_cell()
        return [out / c.run for _, c in plan]
    return _run_in_workers(plan, out, budget, workers, after_cell, printer, journal, max_examples)


# With --bundle-out, the records are copied there after a job that saved something, at most this often (seconds).
SNAPSHOT_SECONDS = 30.0
# A long length that is not a cell's last may use at most this share of the evaluation time left when it
# starts, so that the longest length gets time even when a shorter long one cannot finish.
LONG_SHARE = 0.5


def _trained_steps(run: Path) -> Optional[int]:
    """The last logged step of ``run``'s training (None without a log): the loop always logs the last step of
    a finished training, so this tells a finished run; a training a deadline stopped may be ahead of it."""
    return train_record(run)["steps"] if run.is_dir() else None


def _steps_per_s(run: Path, since: float) -> Optional[float]:
    """Training steps per second from ``since`` (a ``time.time()`` value) on: between the first and the last loss
    records of ``run``'s metrics.jsonl logged since then (updates with their validations and checkpoints, not
    the start-up), or None with fewer than two such records a second or more apart."""
    from datetime import datetime

    recs = [
        r
        for r in read_jsonl(run / "metrics.jsonl")
        if "loss" in r and datetime.fromisoformat(r["time"]).timestamp() >= since - 1
    ]
    if len(recs) < 2:
        return None
    seconds = datetime.fromisoformat(recs[-1]["time"]).timestamp() - datetime.fromisoformat(recs[0]["time"]).timestamp()
    return round((recs[-1]["step"] - recs[0]["step"]) / seconds, 2) if seconds >= 1 else None


def cell_job(
    study: Study,
    cell: Cell,
    out: Path,
    train_until: Optional[float] = None,
    eval_until: Optional[float] = None,
    short_only: bool = False,
    printer: Callable[[str], None] = print,
    max_examples: Optional[int] = None,
) -> dict:
    """Train one cell (resuming; stopped at ``train_until`` if given) and, if its training is finished, evaluate
    what is left of it (lengths below the study's ``long_from`` only when ``short_only``; resumable evaluations
    stopped at ``eval_until`` or after ``max_examples`` examples per length when given). Runs in this process or
    in a worker; returns what it did (JSON-able; ``saved``: whether it trained or completed an evaluation)."""
    from longsparse.evaluate import evaluate_run
    from longsparse.train import train

    run = out / cell.run
    cfg = study.cell_config(cell)
    steps = cfg["train"]["steps"]
    before = _trained_steps(run)
    rec = {"run": cell.run, "phase": "cell", "steps": steps, "step_before": before, "saved": False}
    t0, started = time.perf_counter(), time.time()
    if train_until is not None and (before or 0) < steps and train_until - time.time() < 1:
        rec.update(status="not started: no training time left", step_after=before, trained_steps=0)
    else:
        printer(f"{cell.run}: training ({steps} steps; log in {run / 'train.log'})")
        res = train(cfg, str(run), progress=False, printer=lambda s: None, deadline=train_until)
        seconds = time.perf_counter() - t0
        if res["trained_steps"]:
            printer(
                f"{cell.run}: trained to step {res['step']} in {seconds:.0f} s, "
                f"loss {res['first_loss']:.3f} -> {res['last_loss']:.3f}"
                + ("; stopped at the training deadline (resumes from last.pt)" if res["stopped_at_deadline"] else "")
            )
        status = (
            "stopped at the training deadline"
            if res["stopped_at_deadline"]
            else ("complete" if res["trained_steps"] else "complete before this job")
        )
        rec.update(
            status=status,
            step_after=res["step"],
            trained_steps=res["trained_steps"],
            seconds=round(seconds, 1),
            steps_per_s=_steps_per_s(run, started) if res["trained_steps"] else None,
            saved=bool(res["trained_steps"]),
        )
    if (rec["step_after"] or 0) < steps:
        if train_until is not None:
            printer(f"{cell.run}: training unfinished (step {rec['step_after'] or 0} of {steps}); not evaluated")
        return rec
    rec["evaluated"] = []
    for ck, n, lengths in _to_evaluate(study, run):
        if short_only:
            lengths = [L for L in lengths if L < study.long_from]
        if not lengths:
            continue
        _, res = evaluate_run(
            run,
            lengths,
            samples=n,
            checkpoint=ck,
            seed=study.test_seed,
            printer=printer,
            until=eval_until,
            max_examples=max_examples,
            resumable=True,
        )
        rec["evaluated"] += [(ck, r["length"]) for r in res["results"]]
        rec["saved"] = rec["saved"] or bool(res["results"])
    return rec


def length_job(
    study: Study,
    cell: Cell,
    out: Path,
    checkpoint: str,
    length: int,
    eval_until: float,
    last: bool,
    max_examples: Optional[int] = None,
) -> dict:
    """Evaluate (or continue) one long length of a trained cell by ``eval_until`` (and at most ``max_examples``
    examples), using at most LONG_SHARE of the time left unless it is the cell's ``last`` length. Returns what it
    did."""
    from longsparse.evaluate import evaluate_run

    run = out / cell.run
    rec = {"run": cell.run, "phase": "long", "checkpoint": checkpoint, "length": length, "saved": False}
    left = eval_until - time.time()
    if left < 1:
        return {**rec, "status": "no evaluation time left"}
    until = eval_until if last else time.time() + LONG_SHARE * left
    n = study.samples_for(length)
    _, res = evaluate_run(
        run,
        [length],
        samples=n,
        checkpoint=checkpoint,
        seed=study.test_seed,
        until=until,
        max_examples=max_examples,
        progress=False,
    )
    rec["saved"] = bool(res["results"])
    return {**rec, "status": "complete" if res["results"] else "unfinished"}


def _run_in_workers(plan, out, budget, workers, after_cell, printer, journal, max_examples=None) -> list[Path]:
    """``run_study``'s cells in a pool of worker processes (its docstring)."""
    from longsparse_experiments.jobs import WorkerPool

    n = max(1, min(workers, len(plan)))
    until = budget.stop_at if budget is not None else None
    failed = []
    if budget is not None:
        printer(budget.describe())
    printer(f"{len(plan)} cell(s) in {n} worker process(es)")

    def entry(key) -> dict:  # a cell job's key is its run, a long length's (run, checkpoint, length)
        return {"run": key[0], "phase": "long"} if isinstance(key, tuple) else {"run": key, "phase": "cell"}

    def on_result(key, ok, value) -> None:
        if not ok:
            first = value.strip().splitlines()[0] if value.strip() else "no message"
            failed.append((key, first))
            printer(f"{key}: failed: {first}")
            print(value, file=sys.stderr)  # the worker's traceback
            journal.append({**entry(key), "status": f"failed: {first}"})
            return
        journal.append(value)
        if after_cell is not None and value["saved"]:
            after_cell()

    train_until, eval_until = (budget.train_until, budget.eval_until) if budget is not None else (None, None)
    cell_args = [
        (c.run, cell_job, (study, c, out, train_until, eval_until, budget is not None, print, max_examples))
        for study, c in plan
    ]
    with WorkerPool(n) as pool:
        left = pool.run(cell_args, on_result, until=until)
        if budget is not None:  # the long lengths of the cells whose training finished
            trained = {r["run"] for r in journal if (r.get("step_after") or 0) >= r.get("steps", 1 << 62)}
            long_jobs = []
            for study, c in plan:
                if c.run not in trained:
                    continue
                todo = [(ck, L) for ck, _, lengths in _to_evaluate(study, out / c.run) for L in lengths]
                todo = [(ck, L) for ck, L in todo if L >= study.long_from]
                for i, (ck, L) in enumerate(todo):
                    last = i == len(todo) - 1
                    long_jobs.append(((L, study.checkpoints.index(ck), c.run), study, c, ck, L, last))
            long_jobs.sort(key=lambda j: j[0])
            args = [
                ((c.run, ck, L), length_job, (study, c, out, ck, L, eval_until, last, max_examples))
                for _, study, c, ck, L, last in long_jobs
            ]
            left += pool.run(args, on_result, until=until)
    for key in left:
        printer(f"{key if isinstance(key, str) else ' '.join(map(str, key))}: stopped at the job's stop time")
        journal.append({**entry(key), "status": "stopped at the stop time"})
    if failed:
        raise JobsFailed(f"{len(failed)} job(s) failed; the first: {failed[0][0]}: {failed[0][1]}")
    return [out / c.run for _, c in plan]


class JobsFailed(RuntimeError):
    """Jobs of a study failed in worker processes (each said why as it ended; the others' results are kept)."""


def _length_status(run: Path, study: Study, checkpoint: str, length: int, stored: Optional[dict]) -> dict:
    """Where one (checkpoint, length) of a cell stands: "complete" (a result file in the run folder), "partial"
    (examples done so far of an unfinished evaluation), "stored" (only in the store), or "none"."""
    from longsparse.evaluate.sweep import read_partial

    n = study.samples_for(length)
    best = None
    for f in sorted((run / "eval").glob("*.json")) if (run / "eval").is_dir() else []:
        try:
            d = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):  # an evaluation killed before its first length
            continue
        if (d.get("checkpoint"), d.get("seed"), d.get("samples")) != (checkpoint, study.test_seed, n):
            continue
        for r in d.get("results", []):
            if r["length"] == length and (best is None or d.get("created", "") >= best[0]):
                best = (d.get("created", ""), r)
    if best is not None:
        r = best[1]
        x = {"status": "complete", "n": r["n"], "exact_match": r["exact_match"], "ci": r["exact_match_ci"]}
        x["seconds"] = r.get("seconds")
    else:
        part = read_partial(run, checkpoint, length, n, study.test_seed) if run.is_dir() else None
        if part is not None and part.get("done"):
            x = {
                "status": "partial",
                "n": part["done"],
                "target": n,
                "exact_match": part["n_exact"] / part["done"],
                "seconds": round(part["seconds"], 2),
            }
        elif stored is not None:
            x = {"status": "stored", "n": stored["n"], "exact_match": stored["exact_match"], "ci": stored.get("ci")}
        else:
            x = {"status": "none", "target": n}
    if x.get("n") and x.get("seconds"):
        x["s_per_example"] = round(x["seconds"] / x["n"], 4)
    return x


def job_summary(
    spec: StudyFile, out: str | Path, journal: Sequence[dict], records: Sequence[dict] = (), budget=None
) -> dict:
    """What a job left, per study and cell (``jobs.SUMMARY_FORMAT``): the training's step of its total
    (``checkpoint_step``: where this job's training ended, else the last logged step), this job's training (``train_this_call``: the journal entry of ``run_study``) and steps/s, the final loss, and at
    the study's last checkpoint each length's status (``_length_status``; ``records``: the store's)."""
    out, index = Path(out), result_store.by_run(records)
    data = {"format": SUMMARY_FORMAT, "study_file": spec.path, "studies": {}}
    if budget is not None:
        data["budget"] = {
            k: round(getattr(budget, k) - budget.start) for k in ("train_until", "eval_until", "stop_at", "end")
        }
    for study in spec.studies:
        ck = study.checkpoints[-1]
        cells = []
        for c in study.cells():
            run = out / c.run
            cfg = study.cell_config(c)
            tr = train_record(run) if run.is_dir() else {}
            this = next(
                (j for j in reversed(journal) if j.get("run") == c.run and j.get("phase", "cell") == "cell"), None
            )
            kept = archived(index, study, c, cell_identities(cfg))["kept"]
            step = this["step_after"] if this and this.get("step_after") is not None else tr.get("steps")
            cells.append(
                {
                    "run": c.run,
                    "method": c.method,
                    "positions": c.positions,
                    "seed": c.seed,
                    "steps": cfg["train"]["steps"],
                    "checkpoint_step": step,
                    "run_folder": run.is_dir(),
                    "final_loss": tr.get("final_loss"),
                    "steps_per_s_this_call": this.get("steps_per_s") if this else None,
                    "train_this_call": this,
                    "lengths": {str(L): _length_status(run, study, ck, L, kept.get((ck, L))) for L in study.lengths},
                }
            )
        data["studies"][study.name] = {"checkpoint": ck, "lengths": list(study.lengths), "cells": cells}
    return data


def work_left(spec: StudyFile, out: str | Path) -> list[dict]:
    """The cells of ``spec`` with a run folder under ``out`` and work left in it (training unfinished, or an
    evaluation missing), in cell order, as ``bundles.write_bundles`` takes them."""
    out, todo = Path(out), []
    for study in spec.studies:
        for c in study.cells():
            run = out / c.run
            if not run.is_dir():
                continue
            finished = (_trained_steps(run) or 0) >= study.cell_config(c)["train"]["steps"]
            if not finished or _to_evaluate(study, run):
                todo.append({"run": c.run, "finished": finished, "checkpoints": list(study.checkpoints)})
    return todo


# ---- CLI ---------------------------------------------------------------------------------------------------
def add_cli(sub) -> None:
    r = sub.add_parser(
        "reproduce", help="rerun a study from src/longsparse_experiments/configs/reproduce (train + evaluate + report)"
    )
    r.add_argument(
        "study", choices=["synthetic", "hsa", "lm"], help="src/longsparse_experiments/configs/reproduce/<study>.toml"
    )
    r.add_argument("--quick", action="store_true", help="the tiny smoke version (<study>-quick.toml)")
    r.add_argument(
        "--config",
        default=None,
        help="a study TOML file instead of src/longsparse_experiments/configs/reproduce/<study>.toml",
    )
    r.add_argument("--out", default=None, help="run folder (default runs/reproduce[-quick])")
    r.add_argument(
        "--report",
        default=None,
        help="tables.md, a PNG per study and results.json (the rendered view) here (default OUT/report)",
    )
    r.add_argument(
        "--store",
        default=None,
        help="the results store: a folder whose records.jsonl the run folders' results are appended to "
        "and the report is rendered from (default: the --report folder); cells whose results are "
        "all stored are not retrained. The repository's: results/<study>",
    )
    r.add_argument(
        "--only",
        default=None,
        help="comma list of study names, or tasks (every study of the task) where no study has that name",
    )
    r.add_argument("--shard", default=None, help="K/N: run every N-th cell from the K-th (one process per core)")
    r.add_argument("--report-only", action="store_true", help="rebuild the report from saved results")
    r.add_argument(
        "--dry-run",
        action="store_true",
        help="print which cells would be trained / evaluated / skipped as stored; change nothing",
    )
    r.add_argument(
        "--analyse",
        default=None,
        metavar="A-B[,A-B...]",
        help="only the paired seed-level analysis of the store's records: method pairs A - B, the "
        "first one primary (decision at --endpoint); writes analysis.json/.md and forest.png there",
    )
    r.add_argument(
        "--endpoint",
        type=int,
        default=None,
        help="the primary endpoint's test length for --analyse (default: the study's third length)",
    )
    r.add_argument(
        "--analysis-out",
        default=None,
        help="--analyse: write analysis.json/.md and forest.png here (default: the --report folder)",
    )
    r.add_argument(
        "--margin",
        type=float,
        default=5.0,
        help="--analyse: a difference within +-margin points is of no practical size (default 5)",
    )
    job = r.add_argument_group(
        "a job with a wall-clock limit",
        "time-box the study, run cells in parallel, hand unfinished runs to the next job (docs/training.md)",
    )
    job.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the job's wall clock from the start of this command: trainings stop at a resumable checkpoint, "
        "what finished is evaluated (long lengths resumably, continued by the next job), then the report "
        "and the bundles; a budget too small to train anything is refused",
    )
    job.add_argument(
        "--eval-seconds",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --time-budget: evaluation time kept after the training deadline (default 12%% of the budget)",
    )
    job.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="run N cells at once on the one device, each in its own process with one CPU thread (default 1)",
    )
    job.add_argument(
        "--max-examples",
        type=int,
        default=None,
        metavar="N",
        help="evaluate at most N examples per length in this job; the rest continue in the next (resumable)",
    )
    job.add_argument(
        "--bundle-out",
        default=None,
        metavar="DIR",
        help="at the end, write to DIR (new or empty) the records and one bundle per run folder with work "
        "left (its last.pt), each split into parts of --bundle-part, within --bundle-max and --bundle-files",
    )
    job.add_argument("--bundle-part", default="15MiB", metavar="SIZE", help="largest bundle file (default 15MiB)")
    job.add_argument("--bundle-max", default=None, metavar="SIZE", help="all bundle files together at most SIZE")
    job.add_argument("--bundle-files", type=int, default=None, metavar="N", help="at most N bundle files in all")
    job.add_argument(
        "--resume-from",
        default=None,
        metavar="DIR",
        help="first restore a --bundle-out folder of an earlier job (verified; run folders and a store that "
        "exist here are kept), so trainings resume and unfinished evaluations continue",
    )
    r.set_defaults(func=_cli)


def _job_options(args, started: float) -> dict:
    """The job options of the CLI, checked before anything runs (one-line errors); the budget counts from
    ``started``."""
    from longsparse_experiments.bundles import check_destination, parse_size

    if args.eval_seconds is not None and args.time_budget is None:
        raise ConfigError("--eval-seconds is part of --time-budget's split: give --time-budget too")
    budget = (
        TimeBudget.split(args.time_budget, start=started, eval_seconds=args.eval_seconds)
        if args.time_budget is not None
        else None
    )
    if args.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {args.workers}")
    if args.max_examples is not None and args.max_examples < 1:
        raise ConfigError(f"--max-examples must be at least 1, got {args.max_examples}")
    given = [f for f, v in (("--bundle-max", args.bundle_max), ("--bundle-files", args.bundle_files)) if v is not None]
    if given and not args.bundle_out:
        raise ConfigError(f"{', '.join(given)} limit(s) the bundles of --bundle-out: give --bundle-out too")
    if args.bundle_files is not None and args.bundle_files < 3:
        raise ConfigError(
            f"--bundle-files must be at least 3 (the records, the manifest and a bundle), got {args.bundle_files}"
        )
    opts = {
        "budget": budget,
        "part": parse_size(args.bundle_part, "--bundle-part"),
        "max_bytes": parse_size(args.bundle_max, "--bundle-max") if args.bundle_max is not None else None,
    }
    if args.resume_from and args.bundle_out and Path(args.resume_from).resolve() == Path(args.bundle_out).resolve():
        raise ConfigError("--resume-from and --bundle-out name the same folder; give the new bundles a new one")
    if args.bundle_out:
        check_destination(args.bundle_out)
    job = budget is not None or args.workers > 1 or args.bundle_out or args.resume_from or args.max_examples
    if job and (args.report_only or args.analyse):
        raise ConfigError(
            "--time-budget, --workers, --max-examples, --bundle-out and --resume-from run a study: not with "
            "--report-only or --analyse"
        )
    return opts


def _cli(args) -> int:
    started = time.time()
    spec = load_study(args.study, quick=args.quick, path=args.config)
    if spec.report != "tables":  # a study recorded and rendered its own way
        from longsparse_experiments import hsa_study, lm_study

        return {"hsa": hsa_study, "lm": lm_study}[spec.report].run_reproduce(args, spec)
    out = Path(args.out or ("runs/reproduce-quick" if args.quick else "runs/reproduce"))
    only = [s for s in args.only.split(",") if s] if args.only else None
    picked = spec.select(only)  # the studies to run or analyse; reports cover the whole file
    shard = parse_shard(args.shard)
    report = Path(args.report or out / "report")
    store = Path(args.store) if args.store else report
    opts = _job_options(args, started)  # before any work: a job that cannot run as asked is refused whole
    if args.analyse:
        return _analyse(
            picked,
            store,
            Path(args.analysis_out or report),
            args.analyse,
            args.endpoint,
            args.margin,
        )
    check_report_folder(report, store)
    check_outputs(report, report_outputs(spec), REPORT_WRITER)
    if args.resume_from:
        from longsparse_experiments.bundles import read_manifest, restore_bundles

        if args.dry_run:
            runs = [b["run"] for b in read_manifest(args.resume_from)["bundles"]]
            print(f"would restore from {args.resume_from} (verified): {', '.join(runs) or 'no run folders'}")
        else:
            restore_bundles(args.resume_from, out, store)
    if args.dry_run:
        run_study(picked, out, shard=shard, archive=load_store(store), dry_run=True, budget=opts["budget"])
        return 0
    journal, failure, report_error = [], None, None
    study_dirs = [st.name for st in picked.studies]
    if not args.report_only:
        snapped = [0.0]

        def after_cell() -> None:  # the store and the view only (cheap); tables and plots once, below
            if not _results_yet(spec, out, store):
                return
            update_archive(spec, out, report, printer=lambda s: None, store=store)
            print(f"store updated: {result_store.records_path(store)}")
            if args.bundle_out and time.time() - snapped[0] >= SNAPSHOT_SECONDS:
                from longsparse_experiments.bundles import snapshot_records

                try:
                    snapshot_records(args.bundle_out, out, study_dirs, store, report)
                except OSError as e:  # the job goes on; its end packs the records again
                    print(f"records snapshot in {args.bundle_out} skipped: {e}", file=sys.stderr)
                snapped[0] = time.time()

        try:
            run_study(
                picked,
                out,
                shard=shard,
                archive=load_store(store),
                after_cell=after_cell,
                budget=opts["budget"],
                workers=args.workers,
                journal=journal,
                max_examples=args.max_examples,
            )
        except JobsFailed as e:  # the report and the bundles still keep what the other jobs did
            failure = e
    try:
        if args.report_only or _results_yet(spec, out, store):
            build_report(spec, out, report, store=store)
        else:
            print("no evaluation has finished yet: the store and the report wait for one (the next job continues)")
    except Exception as e:
        if not args.bundle_out:
            raise
        report_error = e  # the bundles first (they hold the job's work), then the error
    if report_error is None and (opts["budget"] is not None or args.workers > 1 or args.bundle_out):
        summary = job_summary(picked, out, journal, load_store(store), opts["budget"])
        print(summary_markdown(summary))
    if args.bundle_out:
        from longsparse_experiments.bundles import write_bundles

        manifest = write_bundles(
            args.bundle_out,
            out,
            work_left(picked, out),
            study_dirs=study_dirs,
            store=store,
            report=report,
            summary=summary if report_error is None else None,
            max_bytes=opts["max_bytes"],
            max_files=args.bundle_files,
            part_bytes=opts["part"],
        )
        print(
            f"wrote {args.bundle_out}: {len(manifest['files']) + 1} files, "
            f"{sum(f['bytes'] for f in manifest['files']) / 1e6:.1f} MB"
            + (f"; {len(manifest['left_out'])} bundle(s) left out by the caps" if manifest["left_out"] else "")
        )
    if report_error is not None:
        raise report_error
    if failure is not None:
        print(f"longsparse reproduce: error: {failure}", file=sys.stderr)
        return 1
    return 0


def _results_yet(spec: StudyFile, out: Path, store: Path) -> bool:
    """Whether the store or the run folders under ``out`` hold a result (a job with a time budget or
    --max-examples may end before its first evaluation is complete)."""
    return bool(load_store(store)) or bool(new_records(spec, out, (), printer=lambda s: None))


ANALYSIS_OUTPUTS = ("analysis.json", "analysis.md", "forest.png")


def _analyse(spec: StudyFile, store: Path, out: Path, pairs_text: str, endpoint: Optional[int], margin: float) -> int:
    """``--analyse``: the paired analysis (longsparse.report.paired) of the studies of ``spec`` from the records in
    ``store`` (lengths, checkpoint and in-distribution length from the first study), written to ``out``."""
    from longsparse.report import paired

    records = load_store(store)
    if not records:
        raise ConfigError(f"{store}: no stored results to analyse (run the study first)")
    archive = view(spec, records, strict=False)
    studies = spec.studies
    pairs = []
    for item in pairs_text.split(","):
        a, sep, b = item.strip().partition("-")
        if not sep or not a or not b:
            raise ConfigError(f"--analyse: each pair must look like A-B (method names), got {item!r}")
        pairs.append((a, b))
    first = studies[0]
    lengths = list(first.lengths[1:])
    endpoint = endpoint if endpoint is not None else lengths[min(1, len(lengths) - 1)]
    if endpoint not in first.lengths:
        raise ConfigError(f"--endpoint {endpoint} is not a length of the study ({list(first.lengths)})")
    ck = first.checkpoints[-1]
    result = paired.analyse(
        archive, pairs, endpoint=endpoint, lengths=lengths, id_length=first.lengths[0], margin=margin, checkpoint=ck
    )
    text = paired.markdown(result, train_length=first.lengths[0])
    claim_outputs(out, ANALYSIS_OUTPUTS, REPORT_WRITER)
    atomic_write_text(out / "analysis.json", json.dumps(result, indent=1) + "\n")
    atomic_write_text(out / "analysis.md", text)
    png = paired.forest_plot(result, out / "forest.png", train_length=first.lengths[0])
    print(text)
    print(f"wrote {out / 'analysis.json'}, {out / 'analysis.md'}" + (f", {png}" if png else ""))
    return 0
