"""`longsparse reproduce` as a job with a wall-clock limit: --time-budget (trainings stopped at a checkpoint that
resumes exactly, evaluations continued to the numbers of one call), --workers, --max-examples, portable bundles
(--bundle-out / --resume-from: size caps, parts, verification) and the refusals before any work."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from helpers.paths import SRC

from longsparse.models import read_checkpoint
from longsparse.report import store as result_store
from longsparse.train.config import ConfigError
from longsparse_experiments import bundles
from longsparse_experiments.cli import main
from longsparse_experiments.jobs import MIN_TRAIN_SECONDS, TimeBudget, WorkerPool
from longsparse_experiments.reproduce import cell_job, work_left
from longsparse_experiments.study import load_study

pytestmark = pytest.mark.usefixtures("one_thread")

# Two cells of 6 steps; 128 is the study's one "long" length, so a time-budgeted job has a long-length phase.
STUDY = """
[defaults]
preset = "cpu"
checkpoints = ["last"]
test_seed = 11
[defaults.overrides]
train.steps = 6
train.warmup_steps = 2
train.val_every = 3
train.val_lengths = [32]
train.val_samples = 2
train.ckpt_every = 3
train.log_every = 3
train.batch_size = 4
train.threads = 1
model.d_model = 32
model.d_ff = 64
model.n_heads = 2

[[study]]
name = "tiny"
task = "flip_flop"
methods = ["softmax", "entmax"]
positions = ["nape"]
seeds = [0]
lengths = [64, 128]
id_samples = 6
samples = 4
long_from = 128
long_samples = 4
"""


def _reproduce(study: Path, out: Path, *extra: str) -> int:
    return main(["reproduce", "synthetic", "--config", str(study), "--out", str(out), *extra])


def _results(store: Path) -> dict:
    """Per run: the store's latest result per (checkpoint, length) without its timings, and the training's
    steps and final loss."""
    got = {}
    for (_, run), recs in result_store.by_run(result_store.read_records(store)).items():
        merged = result_store.merge_results(recs)
        train = next(r["train"] for r in reversed(recs) if r.get("train") is not None)
        got[run] = {
            "train": (train["steps"], train["final_loss"]),
            **{
                f"{ck}/{L}": (r["n"], r["exact_match"], r["token_accuracy"], r["ci"], r["checkpoint_step"])
                for (ck, L), r in merged.items()
            },
        }
    return got


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    """The study run once, in one call with no job flags: (study file, run root, its results)."""
    tmp = tmp_path_factory.mktemp("ref")
    study = tmp / "tiny.toml"
    study.write_text(STUDY)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert _reproduce(study, tmp / "runs") == 0
    finally:
        torch.set_num_threads(n)
    return study, tmp / "runs", _results(tmp / "runs" / "report")


def _model_equal(a: Path, b: Path) -> None:
    x, y = read_checkpoint(str(a))["model"], read_checkpoint(str(b))["model"]
    assert x.keys() == y.keys()
    for k in x:
        assert torch.equal(x[k], y[k]), k


# ---- the time budget --------------------------------------------------------------------------------------------
def test_budget_split_and_the_least_budget():
    b = TimeBudget.split(400, start=1000.0)
    assert b.start < b.train_until < b.eval_until < b.stop_at < b.end == 1400.0
    assert "training until +" in b.describe()
    with pytest.raises(ConfigError, match=r"--time-budget 15 s leaves .* give at least (\d+) s"):
        TimeBudget.split(15)
    need = int(str(pytest.raises(ConfigError, TimeBudget.split, 15).value).rsplit("at least ", 1)[1].split()[0])
    assert TimeBudget.split(need).train_seconds >= MIN_TRAIN_SECONDS
    with pytest.raises(ConfigError):
        TimeBudget.split(need - 1)
    for bad in (0, -5, math.nan, math.inf):
        with pytest.raises(ConfigError, match="--time-budget"):
            TimeBudget.split(bad)
    with pytest.raises(ConfigError, match="--eval-seconds"):
        TimeBudget.split(400, eval_seconds=-1)
    with pytest.raises(ConfigError, match="give at least 1000000085 s"):  # found at once, however large
        TimeBudget.split(400, eval_seconds=1e9)


def test_bad_job_options_are_refused_before_any_work(tmp_path, capsys):
    study = tmp_path / "tiny.toml"
    study.write_text(STUDY)
    out = tmp_path / "runs"
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("an earlier job's file")
    cases = [
        (["--time-budget", "15"], "--time-budget 15 s leaves"),
        (["--time-budget", "nan"], "--time-budget must be"),
        (["--eval-seconds", "10"], "--eval-seconds is part of --time-budget"),
        (["--workers", "0"], "--workers must be at least 1"),
        (["--max-examples", "0"], "--max-examples must be at least 1"),
        (["--bundle-out", str(taken)], "not an empty folder"),
        (["--bundle-max", "10MiB"], "give --bundle-out too"),
        (["--bundle-out", str(tmp_path / "b"), "--bundle-part", "15XB"], "--bundle-part '15XB'"),
        (["--bundle-out", str(tmp_path / "b"), "--bundle-files", "2"], "--bundle-files must be at least 3"),
        (["--resume-from", str(taken), "--bundle-out", str(taken)], "name the same folder"),
        (["--workers", "2", "--report-only"], "not with --report-only or --analyse"),
        (["--resume-from", str(tmp_path / "none")], "no such folder"),
        (["--resume-from", str(taken)], "no manifest.json"),
    ]
    for extra, message in cases:
        assert _reproduce(study, out, *extra) == 2, extra
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (extra, err)
        assert not out.exists() and not (tmp_path / "b").exists(), extra
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]


def test_workers_and_a_budget_give_the_records_of_one_call(ref, tmp_path, capsys):
    """Two cells in two worker processes under a generous budget: the same numbers as one sequential call, the
    long length evaluated in the job's second phase, and a bundle folder with the records and no bundles
    (nothing is left to do)."""
    study, _, want = ref
    out, dest = tmp_path / "runs", tmp_path / "bundles"
    assert _reproduce(study, out, "--workers", "2", "--time-budget", "300", "--bundle-out", str(dest)) == 0
    printed = capsys.readouterr().out
    assert "2 cell(s) in 2 worker process(es)" in printed and "time budget 300 s" in printed
    assert _results(out / "report") == want
    assert "| softmax-nape-s0 | 6/6 |" in printed  # the job's summary
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["bundles"] == [] and [f["name"] for f in manifest["files"]] == ["records.tar.gz"]
    statuses = {c["run"]: c["lengths"] for c in manifest["summary"]["studies"]["tiny"]["cells"]}
    assert all(x["status"] == "complete" for lengths in statuses.values() for x in lengths.values())
    # the long length came from the resumable path (its result file lists the job's piece)
    files = [json.loads(f.read_text()) for f in (out / "tiny" / "softmax-nape-s0" / "eval").glob("*.json")]
    (long,) = [d for d in files if [r["length"] for r in d["results"]] == [128]]
    assert [p["examples"] for p in long["results"][0]["pieces"]] == [4]


@pytest.mark.slow
def test_workers_without_a_budget_equal_one_call(ref, tmp_path):
    study, _, want = ref
    assert _reproduce(study, tmp_path / "runs", "--workers", "2") == 0
    assert _results(tmp_path / "runs" / "report") == want


def _sleep_after(step: int, seconds: float):
    def callback(done: int) -> None:
        if done == step:
            time.sleep(seconds)

    return callback


def test_training_stopped_by_the_budget_resumes_elsewhere_to_one_call(ref, tmp_path, monkeypatch):
    """A cell's training stopped by the training deadline mid-way (between checkpoints) is not evaluated, is
    bundled with its whole last.pt, and a job on a fresh run root given that bundle finishes it: the weights
    bit for bit, and the records, of the uninterrupted call."""
    import longsparse.train as train_mod

    study, ref_runs, want = ref
    (s,) = load_study(path=str(study)).studies
    cell = s.cells()[0]
    real = train_mod.train

    def slow_train(cfg, out, **kw):  # the deadline passes during a pause after update 2
        return real(cfg, out, **kw, callbacks=[_sleep_after(2, 3.0)])

    monkeypatch.setattr(train_mod, "train", slow_train)
    out = tmp_path / "runs"
    rec = cell_job(s, cell, out, train_until=time.time() + 3.0, eval_until=time.time() + 60, short_only=True)
    monkeypatch.setattr(train_mod, "train", real)
    assert rec["status"] == "stopped at the training deadline" and 1 <= rec["step_after"] <= 2
    run = out / cell.run
    assert read_checkpoint(str(run / "checkpoints" / "last.pt"))["extra"]["step"] == rec["step_after"]
    assert not (run / "eval").exists()
    (todo,) = work_left(load_study(path=str(study)), out)
    assert todo == {"run": cell.run, "finished": False, "checkpoints": ["last"]}
    dest = tmp_path / "bundles"
    manifest = bundles.write_bundles(dest, out, [todo], study_dirs=["tiny"], printer=lambda s: None)
    assert manifest["bundles"][0]["checkpoint"] == "last.pt whole (training unfinished)"

    fresh = tmp_path / "fresh"
    assert _reproduce(study, fresh, "--resume-from", str(dest), "--only", "tiny") == 0
    _model_equal(fresh / cell.run / "checkpoints" / "last.pt", ref_runs / cell.run / "checkpoints" / "last.pt")
    assert _results(fresh / "report") == want
    assert "resuming" in (fresh / cell.run / "train.log").read_text()


# Loaded by every Python process of the job below (the CLI and its spawned workers): a training given a deadline
# pauses after update 3 until just past it, so the budget's training deadline stops it there, deterministically.
PAUSE_AT_THE_DEADLINE = """
import time

import longsparse.train

_train = longsparse.train.train


def _paused(cfg, out=None, **kw):
    deadline = kw.get("deadline")
    if deadline is not None:
        def pause(step):
            if step == 3:
                time.sleep(max(0.0, deadline - time.time()) + 0.5)

        kw["callbacks"] = [*kw.get("callbacks", ()), pause]
    return _train(cfg, out, **kw)


longsparse.train.train = _paused
"""


@pytest.mark.slow
def test_time_budget_stops_a_training_that_a_second_job_finishes_as_one_call(ref, tmp_path):
    """The whole path through the command line: a job whose training deadline passes mid-training stops it at
    a checkpoint (not evaluated, bundled whole); a second job without a budget, on a fresh run root given that
    bundle folder, finishes it with the weights, bit for bit, and the records of one uninterrupted call."""
    import subprocess
    import sys

    study, ref_runs, want = ref
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(PAUSE_AT_THE_DEADLINE)
    src = SRC
    env = {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{src}", "OMP_NUM_THREADS": "1"}

    def job(out: Path, *extra: str) -> subprocess.CompletedProcess:
        argv = ["reproduce", "synthetic", "--config", str(study), "--out", str(out), *extra]
        return subprocess.run(
            [sys.executable, "-m", "longsparse_experiments.cli", *argv], env=env, capture_output=True, text=True
        )

    first = job(tmp_path / "runs1", "--time-budget", "30", "--workers", "2", "--bundle-out", str(tmp_path / "b1"))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "no evaluation has finished yet" in first.stdout
    manifest = json.loads((tmp_path / "b1" / "manifest.json").read_text())
    assert [b["checkpoint"] for b in manifest["bundles"]] == ["last.pt whole (training unfinished)"] * 2
    for cell in manifest["summary"]["studies"]["tiny"]["cells"]:
        assert cell["train_this_call"]["status"] == "stopped at the training deadline"
        assert cell["checkpoint_step"] == 3 and all(x["status"] == "none" for x in cell["lengths"].values())
    second = job(tmp_path / "runs2", "--resume-from", str(tmp_path / "b1"))
    assert second.returncode == 0, second.stdout + second.stderr
    assert _results(tmp_path / "runs2" / "report") == want
    for run in ("tiny/softmax-nape-s0", "tiny/entmax-nape-s0"):
        _model_equal(tmp_path / "runs2" / run / "checkpoints" / "last.pt", ref_runs / run / "checkpoints" / "last.pt")
        assert "resuming" in (tmp_path / "runs2" / run / "train.log").read_text()


def test_partial_evaluations_resume_across_bundled_jobs_to_one_call(ref, tmp_path, capsys):
    """Three jobs, each on a fresh run root restored from the previous job's bundles, evaluating at most 2
    examples per length: the first two leave partial evaluations (bundled with slimmed checkpoints), the third
    finishes them, and the numbers are those of one call; nothing is trained twice."""
    study, _, want = ref
    runs = [tmp_path / f"runs{k}" for k in range(3)]
    dest = [tmp_path / f"bundles{k}" for k in range(3)]
    assert _reproduce(study, runs[0], "--max-examples", "2", "--bundle-out", str(dest[0])) == 0
    run0 = runs[0] / "tiny" / "softmax-nape-s0"
    part = json.loads((run0 / "eval_partial" / "last-L64-n6-seed11.json").read_text())
    assert part["done"] == 2 and not list((run0 / "eval").glob("*.json"))
    m0 = json.loads((dest[0] / "manifest.json").read_text())
    assert [b["run"] for b in m0["bundles"]] == ["tiny/softmax-nape-s0", "tiny/entmax-nape-s0"]
    assert all(b["checkpoint"].startswith("last.pt without AdamW moments") for b in m0["bundles"])
    capsys.readouterr()

    assert (
        _reproduce(study, runs[1], "--resume-from", str(dest[0]), "--max-examples", "2", "--bundle-out", str(dest[1]))
        == 0
    )
    assert "trained to step" not in capsys.readouterr().out
    m1 = json.loads((dest[1] / "manifest.json").read_text())
    assert len(m1["bundles"]) == 2  # 64 (6 examples) still unfinished; 128 (4) done
    assert _reproduce(study, runs[2], "--resume-from", str(dest[1]), "--bundle-out", str(dest[2])) == 0
    assert "trained to step" not in capsys.readouterr().out
    assert _results(runs[2] / "report") == want
    assert json.loads((dest[2] / "manifest.json").read_text())["bundles"] == []
    assert (run0 / "metrics.jsonl").read_bytes() == (
        runs[2] / "tiny" / "softmax-nape-s0" / "metrics.jsonl"
    ).read_bytes()
    files = [json.loads(f.read_text()) for f in (runs[2] / "tiny" / "softmax-nape-s0" / "eval").glob("*.json")]
    (d64,) = [d for d in files if [r["length"] for r in d["results"]] == [64]]
    assert [p["examples"] for p in d64["results"][0]["pieces"]] == [2, 2, 2]


# ---- bundles ----------------------------------------------------------------------------------------------------
def test_bundles_split_into_parts_restore_whole_and_refuse_damage(ref, tmp_path, capsys):
    study, ref_runs, _ = ref
    runs = tmp_path / "runs"
    shutil.copytree(ref_runs, runs)
    todo = [
        {"run": r, "finished": True, "checkpoints": ["last"]} for r in ("tiny/softmax-nape-s0", "tiny/entmax-nape-s0")
    ]
    size = bundles.pack_run(runs / todo[0]["run"], runs, tmp_path / "one.tar.gz", finished=True, checkpoints=["last"])[
        1
    ]
    part = size // 3 + 1
    dest = tmp_path / "b"
    manifest = bundles.write_bundles(dest, runs, todo, study_dirs=["tiny"], part_bytes=part, printer=lambda s: None)
    first = manifest["bundles"][0]
    assert len(first["files"]) >= 3 and all(
        n.startswith("resume-tiny-softmax-nape-s0.tar.gz.part") for n in first["files"]
    )
    assert sum((dest / n).stat().st_size for n in first["files"]) == first["bytes"]

    fresh = tmp_path / "fresh"
    assert bundles.restore_bundles(dest, fresh, printer=lambda s: None) == [t["run"] for t in todo]
    for t in todo:
        for f in ("config.json", "metrics.jsonl", "train.log"):
            assert (fresh / t["run"] / f).read_bytes() == (runs / t["run"] / f).read_bytes()
        _model_equal(fresh / t["run"] / "checkpoints" / "last.pt", runs / t["run"] / "checkpoints" / "last.pt")
        slim = read_checkpoint(str(fresh / t["run"] / "checkpoints" / "last.pt"))
        assert slim["optimizer"]["state"] == {}  # a finished training's moments are never read again
    # a restored folder is kept as it is: nothing is written over a local run folder
    (fresh / todo[0]["run"] / "note.txt").write_text("local")
    assert bundles.restore_bundles(dest, fresh, printer=lambda s: None) == []
    assert (fresh / todo[0]["run"] / "note.txt").read_text() == "local"
    # and a finished training restored slim trains nothing
    assert _reproduce(study, fresh, "--only", "tiny") == 0
    assert "trained to step" not in capsys.readouterr().out

    # caps: a bundle that does not fit is left out, named in the manifest
    capped = bundles.write_bundles(
        tmp_path / "c",
        runs,
        todo,
        study_dirs=["tiny"],
        part_bytes=part,
        max_files=3 + len(first["files"]),
        printer=lambda s: None,
    )
    assert [b["run"] for b in capped["bundles"]] == [todo[0]["run"]]
    assert [b["run"] for b in capped["left_out"]] == [todo[1]["run"]]
    assert len(list((tmp_path / "c").iterdir())) <= 3 + len(first["files"])

    # damage: a changed byte or a missing part is refused in one line before anything is restored
    p1 = dest / first["files"][1]
    data = bytearray(p1.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p1.write_bytes(bytes(data))
    for broken, message in ((None, "size or SHA-256 differs"), (p1, "missing")):
        if broken is not None:
            broken.unlink()
        target = tmp_path / "target"
        assert _reproduce(study, target, "--resume-from", str(dest)) == 2
        err = capsys.readouterr().err
        assert message in err and first["files"][1] in err and err.count("\n") == 1
        assert not target.exists()


def test_a_records_snapshot_is_replaced_by_the_bundles(ref, tmp_path):
    _, ref_runs, _ = ref
    dest = tmp_path / "b"
    bundles.snapshot_records(dest, ref_runs, ["tiny"], ref_runs / "report", ref_runs / "report")
    assert [p.name for p in dest.iterdir()] == ["records.tar.gz"]
    bundles.snapshot_records(dest, ref_runs, ["tiny"], ref_runs / "report")  # refreshed in place
    manifest = bundles.write_bundles(dest, ref_runs, [], study_dirs=["tiny"], printer=lambda s: None)
    assert sorted(p.name for p in dest.iterdir()) == ["manifest.json", "records.tar.gz"]
    assert manifest["files"][0]["sha256"] == bundles.sha256_file(dest / "records.tar.gz")
    with pytest.raises(bundles.BundleError, match="not an empty folder"):  # a finished bundle folder stays
        bundles.snapshot_records(dest, ref_runs, ["tiny"])


def test_records_are_packed_while_a_worker_replaces_and_removes_files(ref, tmp_path, monkeypatch):
    """A snapshot runs while workers write: a file removed after it was listed (a finished evaluation's state)
    is left out, and a file replaced meanwhile goes in whole, as read."""
    _, ref_runs, _ = ref
    runs = tmp_path / "runs"
    shutil.copytree(ref_runs, runs)
    run = runs / "tiny" / "softmax-nape-s0"
    (run / "eval_partial").mkdir()
    gone = run / "eval_partial" / "last-L64-n6-seed11.json"
    gone.write_text("{}")
    real = bundles._skipped

    def skipped(p: Path) -> bool:  # called on each listed file just before it is added
        if p == gone:
            p.unlink()
        if p.name == "metrics.jsonl":
            p.write_text("replaced\n")
        return real(p)

    monkeypatch.setattr(bundles, "_skipped", skipped)
    bundles.snapshot_records(tmp_path / "b", runs, ["tiny"])
    import tarfile

    with tarfile.open(tmp_path / "b" / "records.tar.gz") as tf:
        names = tf.getnames()
        assert tf.extractfile("runs/tiny/softmax-nape-s0/metrics.jsonl").read() == b"replaced\n"
    assert "runs/tiny/softmax-nape-s0/eval_partial/last-L64-n6-seed11.json" not in names
    assert "runs/tiny/softmax-nape-s0/config.json" in names


# ---- worker processes -------------------------------------------------------------------------------------------
def test_worker_pool_reports_failures_replaces_dead_workers_and_stops_on_time():
    got = {}
    with WorkerPool(2, initializer=None) as pool:
        left = pool.run(
            [
                ("sqrt", math.sqrt, (4.0,)),
                ("bad", int, ("x",)),
                ("dies", os._exit, (3,)),
                ("after", math.sqrt, (9.0,)),
            ],
            lambda key, ok, value: got.__setitem__(key, (ok, value)),
        )
        assert left == []
        left = pool.run(
            [("slow", time.sleep, (60,)), ("queued", math.sqrt, (1.0,))],
            lambda key, ok, value: got.__setitem__(key, (ok, value)),
            until=time.time() + 1.0,
        )
        assert pool.run([("late", math.sqrt, (1.0,))], lambda *a: None) == ["late"]  # stopped for good
    assert got["sqrt"] == (True, 2.0) and got["after"] == (True, 3.0)
    assert got["bad"][0] is False and got["bad"][1].startswith("ValueError: invalid literal")
    assert got["dies"] == (False, "worker process ended (exit code 3)")
    assert set(left) == {"slow"} or set(left) == {"slow", "queued"}
