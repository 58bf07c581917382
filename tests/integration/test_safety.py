"""Safety of files and errors (issue #38): reports never overwrite what they did not write, result files are
written atomically and readers skip what an interrupted writer left, nothing is created for a refused run,
evaluations that cannot fit in memory are refused up front, file errors are one line naming the path, resume
restores the loss accumulator and cleans temporaries, progress and ETA are shown."""

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.configs import tiny_run_sets
from helpers.paths import REPO_ROOT

from longsparse.models import read_checkpoint
from longsparse.train import build_config, train
from longsparse_experiments.cli import main

TINY = tiny_run_sets({"train.ckpt_every": "2"})
COPY = ["task.params.num_symbols=8", "train.train_lengths=[4, 8]", "train.val_lengths=[8]"]
SRC = REPO_ROOT / "src" / "longsparse"


def _quiet(_msg):
    pass


def _sets(items):
    return [x for s in items for x in ("--set", s)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-step copy run; tests copy it before changing anything in it."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("safety") / "copy"
    train(
        build_config("copy", method="softmax", positions="nape", steps=2, sets=TINY + COPY),
        str(out),
        printer=_quiet,
        progress=False,
    )
    return out


@pytest.fixture
def fresh_run(run, tmp_path):
    import shutil

    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


def _err_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def _fake_eval(path: Path, em: float = 0.5, created: str = "2026-01-01T00:00:00") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    r = {
        "length": 64,
        "ratio": 1.0,
        "n": 10,
        "n_exact": 5,
        "exact_match": em,
        "exact_match_ci": [0.2, 0.8],
        "n_tokens": 100,
        "n_correct_tokens": 50,
        "token_accuracy": 0.5,
        "token_accuracy_ci": [0.4, 0.6],
        "batch_size": 10,
        "seconds": 1.0,
        "seed": 0,
        "split": "test",
    }
    path.write_text(
        json.dumps(
            {
                "format": "longsparse-eval",
                "version": 1,
                "run": str(path.parent.parent),
                "run_name": path.parent.parent.name,
                "label": "softmax/nape",
                "task": "copy",
                "method": "softmax",
                "positions": "nape",
                "checkpoint": "best",
                "train_lengths": [32, 64],
                "samples": 10,
                "seed": 0,
                "results": [r],
                "created": created,
            }
        )
    )


# ---- 7: a report never overwrites a file it did not write ----------------------------------------------------
def test_report_refuses_to_overwrite_foreign_files(tmp_path, capsys):
    _fake_eval(tmp_path / "r" / "eval" / "eval-1.json")
    docs = tmp_path / "docs"
    docs.mkdir()
    mine = docs / "results.md"
    mine.write_text("# my hand-written results\n")
    assert main(["report", str(tmp_path / "r"), "--out", str(docs)]) == 2
    err = _err_line(capsys)
    assert str(mine) in err and "not a `longsparse report` file" in err
    assert mine.read_text() == "# my hand-written results\n" and sorted(docs.iterdir()) == [mine]
    # a PNG of someone else's is protected the same way
    other = tmp_path / "other"
    other.mkdir()
    (other / "accuracy_vs_length.png").write_bytes(b"\x89PNG\r\n\x1a\nnot ours")
    assert main(["report", str(tmp_path / "r"), "--out", str(other)]) == 2
    assert "accuracy_vs_length.png" in _err_line(capsys)
    # its own files (recognised by their markers) are replaced on a rerun
    out = tmp_path / "rep"
    assert main(["report", str(tmp_path / "r"), "--out", str(out), "--title", "first"]) == 0
    assert main(["report", str(tmp_path / "r"), "--out", str(out), "--title", "second"]) == 0
    assert "# second" in (out / "results.md").read_text()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporaries left
    # a report written before the markers existed (results.json of ours, the table heading) is refused until
    # `longsparse migrate` gives it its marker; a hand-written results.md next to it gets none and stays refused
    old = out / "results.md"
    old.write_text("### copy: exact match % [95% Wilson interval], n = 10 per cell\n")
    assert main(["report", str(tmp_path / "r"), "--out", str(out)]) == 2
    assert "longsparse migrate" in _err_line(capsys)
    assert main(["migrate", str(out / "results.json")]) == 0
    assert main(["report", str(tmp_path / "r"), "--out", str(out)]) == 0
    old.write_text("my notes\n")
    assert main(["migrate", str(out)]) == 0 and old.read_text() == "my notes\n"
    capsys.readouterr()
    assert main(["report", str(tmp_path / "r"), "--out", str(out)]) == 2
    assert old.read_text() == "my notes\n" and str(old) in _err_line(capsys)


ROOT = REPO_ROOT
_STUDY_STORE = ROOT / "results" / "mqmtar256x_26"
_STUDY_FILE = ROOT / "results" / "synthetic_trials" / "mqmtar256x_26.toml"


def _reproduce_report(out):
    store = out.parent / "store"
    if not store.exists():
        shutil.copytree(_STUDY_STORE, store)
    return ["reproduce", "synthetic", "--config", str(_STUDY_FILE), "--store", str(store), "--report", str(out)]


# (command writing into the folder OUT, a file it writes there)
REPORT_WRITERS = {
    "reproduce-tables": (lambda out: [*_reproduce_report(out), "--report-only"], "tables.md"),
    "reproduce-plot": (lambda out: [*_reproduce_report(out), "--report-only"], "mqmtar_inline_3l_lr4e-3_4k_256x.png"),
    "reproduce-analysis": (
        lambda out: [
            *_reproduce_report(out.parent / "view"),
            "--analyse",
            "asentmax-softmax",
            "--endpoint",
            "16384",
            "--analysis-out",
            str(out),
        ],
        "analysis.md",
    ),
    "lm-report": (
        lambda out: ["lm", "report", "--store", str(ROOT / "results" / "lm"), "--out", str(out)],
        "lm_results.md",
    ),
    "lm-report-plot": (
        lambda out: ["lm", "report", "--store", str(ROOT / "results" / "lm"), "--out", str(out)],
        "lm_passkey_depth.png",
    ),
    "figures": (lambda out: ["figures", "--quick", "--only", "1", "--out", str(out)], "fig1_zero_crossing.png"),
}


@pytest.mark.parametrize("writer", list(REPORT_WRITERS))
def test_report_writers_replace_only_what_they_wrote(tmp_path, capsys, writer):
    """Every command that renders reports into a folder refuses, before writing anything, a file there that it did
    not write (one line naming it, exit 2); the files it wrote itself it replaces on a rerun."""
    argv, name = REPORT_WRITERS[writer]
    out = tmp_path / "out"
    out.mkdir()
    mine = out / name
    mine.write_bytes(b"my own file\n")
    assert main(argv(out)) == 2
    err = _err_line(capsys)
    assert str(mine) in err and "was not written by" in err
    assert mine.read_bytes() == b"my own file\n" and sorted(out.iterdir()) == [mine]
    mine.unlink()
    assert main(argv(out)) == 0 and mine.is_file()
    capsys.readouterr()
    assert main(argv(out)) == 0  # its own output is replaced


def test_claimed_outputs_survive_concurrent_claims(tmp_path):
    from longsparse.io import ForeignFileError, check_outputs, claim_outputs, written_outputs

    claim_outputs(tmp_path, ["a.md"], "longsparse x")
    claim_outputs(tmp_path, ["b.png"], "longsparse y")
    assert written_outputs(tmp_path) == {"a.md": "longsparse x", "b.png": "longsparse y"}
    (tmp_path / "a.md").write_text("x")
    check_outputs(tmp_path, ["a.md"], "longsparse x")
    with pytest.raises(ForeignFileError, match="a.md exists and was not written by `longsparse y`"):
        claim_outputs(tmp_path, ["a.md", "c.md"], "longsparse y")
    assert "c.md" not in written_outputs(tmp_path)  # a refused claim records nothing


# ---- 9: atomic result files; readers skip what an interrupted writer left ----------------------------------
def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    from longsparse.io import atomic_open, atomic_write_json, is_temp_name

    path = tmp_path / "r.json"
    atomic_write_json(path, {"v": 1})
    with pytest.raises(KeyboardInterrupt), atomic_open(path) as f:
        f.write('{"v": 2, "cut here')
        raise KeyboardInterrupt
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    assert is_temp_name(".r.json.tmp-1a2b") and is_temp_name(".tmp-x1y2.pt") and not is_temp_name(".lock")


def test_interrupted_evaluation_leaves_complete_json_or_nothing(fresh_run, monkeypatch, capsys):
    from longsparse.evaluate import sweep

    real, calls = sweep.score_length, []

    def interrupt_at_second(*a, **k):
        calls.append(a[2])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(sweep, "score_length", interrupt_at_second)
    assert main(["eval", str(fresh_run), "--lengths", "8,16", "--samples", "2"]) == 130
    files = list((fresh_run / "eval").iterdir())
    assert len(files) == 1  # no temporary, no empty file
    assert [r["length"] for r in json.loads(files[0].read_text())["results"]] == [8]
    calls.clear()
    calls.append(None)  # now the first length is interrupted
    assert main(["eval", str(fresh_run), "--lengths", "8,16", "--samples", "2"]) == 130
    assert list((fresh_run / "eval").iterdir()) == files  # nothing new: no 0-byte file


def test_report_skips_files_an_interrupted_evaluation_left(tmp_path, capsys):
    _fake_eval(tmp_path / "r" / "eval" / "eval-1.json")
    (tmp_path / "r" / "eval" / "eval-2.json").write_text("")  # killed before its first length
    (tmp_path / "r" / "eval" / "eval-3.json").write_text('{"format": "longsparse-eval", "resu')  # cut
    assert main(["report", str(tmp_path / "r"), "--out", str(tmp_path / "rep")]) == 0
    err = capsys.readouterr().err
    assert "eval-2.json" in err and "eval-3.json" in err and "warning" in err
    assert json.loads((tmp_path / "rep" / "results.json").read_text())["series"][0]["results"][0]["length"] == 64


def test_lm_token_cache_cut_by_a_kill_is_rebuilt(tmp_path):
    from longsparse.lm.streams import SAMPLE_DIR, prepare

    data = {"dir": str(SAMPLE_DIR), "tokenizer": "bytes", "vocab_size": 258}
    (tmp_path / "tokens-bytes.pt").write_bytes(b"PK\x03\x04 cut")
    msgs = []
    _, tokens = prepare(data, cache_dir=str(tmp_path), printer=msgs.append)
    assert any("unreadable token cache" in m for m in msgs)
    assert torch.load(tmp_path / "tokens-bytes.pt", weights_only=True)["test"].equal(tokens["test"])


def test_result_writers_go_through_the_atomic_helper():
    """Every file the report / evaluation / LM / training code and the experiments write goes through
    longsparse.io (appended logs aside): a raw write_text, savefig or torch.save there could leave a cut file on
    Ctrl-C."""
    raw = re.compile(r"\.write_text\(|\.write_bytes\(|\bfig\.savefig\(|\btorch\.save\(|\.tok\.save\(")
    experiments = SRC.parent / "longsparse_experiments"
    files = [
        SRC / "report" / "__init__.py",
        *(SRC / "evaluate").glob("*.py"),
        *(SRC / "lm").glob("*.py"),
        SRC / "train" / "loop.py",
        SRC / "train" / "rundir.py",
        SRC / "cli.py",
        *experiments.rglob("*.py"),
    ]
    assert experiments / "figures" / "style.py" in files
    offenders = [
        f"{f.name}:{i}" for f in files for i, line in enumerate(f.read_text().splitlines(), 1) if raw.search(line)
    ]
    assert offenders == []


# ---- 10: nothing is created for a refused run ---------------------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    ["train.lr=inf", "train.lr=nan", "model.attention.alpha=inf"]
    + ([] if torch.cuda.is_available() else ["train.device=cuda"]),
)
def test_refused_run_creates_no_folder(tmp_path, capsys, bad):
    out = tmp_path / "run"
    args = ["train", "--task", "copy", "--method", "entmax", "--steps", "2", "--out", str(out)]
    assert main([*args, *_sets(TINY + COPY + [bad])]) == 2
    err = _err_line(capsys)
    assert bad.split("=")[0] in err or "CUDA is not available" in err
    assert not out.exists()


# ---- 11: memory is estimated before anything is allocated ---------------------------------------------------
def test_eval_refuses_lengths_that_cannot_fit(run, capsys):
    import time

    t0 = time.perf_counter()
    assert main(["eval", str(run), "--lengths", "1000000000"]) == 2
    err = _err_line(capsys)
    assert "does not fit in memory" in err and re.search(r"the largest length that fits is \d+", err), err
    assert time.perf_counter() - t0 < 20
    assert main(["eval", str(run), "--lengths", "99999999999999999999k"]) == 2
    assert "too long" in _err_line(capsys)
    assert not (run / "eval").exists()


def test_largest_fitting_length_is_the_boundary(run):
    from longsparse.evaluate import load_run_model
    from longsparse.evaluate.memory import check_lengths_fit
    from longsparse.train.config import make_task

    model, cfg, _ = load_run_model(run, "last")
    task = make_task(cfg["task"])
    avail = {"host": 2 << 30}
    with pytest.raises(ValueError, match="largest length that fits is") as e:
        check_lengths_fit(model, task, [10**8], 100, None, torch.device("cpu"), available=avail)
    largest = int(re.search(r"fits is (\d+)", str(e.value)).group(1))
    assert 1000 < largest < 10**8
    check_lengths_fit(model, task, [largest], 100, None, torch.device("cpu"), available=avail)
    with pytest.raises(ValueError):
        check_lengths_fit(model, task, [largest + 1], 100, None, torch.device("cpu"), available=avail)


# ---- 12: file errors are one line naming the path -----------------------------------------------------------
def test_file_errors_are_one_line_naming_the_path(tmp_path, run, capsys, monkeypatch):
    _fake_eval(tmp_path / "r" / "eval" / "eval-1.json")
    (tmp_path / "afile").write_text("x")
    bad = str(tmp_path / "afile" / "sub")
    assert main(["report", str(tmp_path / "r"), "--out", bad]) == 2
    assert bad in _err_line(capsys)
    assert main(["train", "--task", "copy", "--steps", "1", "--out", bad]) == 2
    assert bad in _err_line(capsys)
    assert main(["figures", "--out", bad, "--only", "1", "--quick"]) == 2
    assert bad in _err_line(capsys)
    # a cut JSON file read deep inside a command is named too
    cut = tmp_path / "lm_results.json"
    cut.write_text('{"runs": [')
    assert main(["lm", "report", str(cut), "--out", str(tmp_path / "lmrep")]) == 2
    assert f"{cut}: not valid JSON" in _err_line(capsys)
    # a read-only folder (root ignores permission bits, so the refusal is made at the os.open level)
    ro = tmp_path / "ro"
    ro.mkdir()
    real_open = os.open

    def no_write(path, flags, *a, **k):
        if Path(os.fsdecode(path)).parent == ro and flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(13, "Permission denied", os.fsdecode(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", no_write)
    assert main(["report", str(tmp_path / "r"), "--out", str(ro)]) == 2
    err = _err_line(capsys)
    assert f"{ro / 'results.md'}: Permission denied" in err, err


# ---- 13: device, batch tokens, archive path, temporaries, empty folders, loss accumulator -------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_eval_device_cuda_without_cuda_says_so(run, capsys):
    assert main(["eval", str(run), "--lengths", "8", "--device", "cuda"]) == 2
    err = _err_line(capsys)
    assert "CUDA is not available" in err and "checkpoint" not in err


def test_batch_tokens_must_be_positive(run, capsys):
    from longsparse.evaluate import evaluate_run

    with pytest.raises(SystemExit) as e:
        main(["eval", str(run), "--lengths", "8", "--batch-tokens", "0"])
    assert e.value.code == 2 and "--batch-tokens" in capsys.readouterr().err
    with pytest.raises(ValueError, match="batch-tokens must be a positive integer"):
        evaluate_run(run, "8", batch_tokens=0, printer=None)


def test_data_archive_path_is_checked_before_downloading(tmp_path, capsys, monkeypatch):
    def no_download(*a, **k):
        raise AssertionError("downloaded although --archive was given")

    monkeypatch.setattr(subprocess, "run", no_download)
    missing = tmp_path / "nope.tar.gz"
    assert main(["data", "shakespeare", "--archive", str(missing), "--dir", str(tmp_path / "d")]) == 2
    assert str(missing) in _err_line(capsys)
    assert not (tmp_path / "d").exists()


def test_resume_removes_temporaries_of_killed_writes(fresh_run):
    (fresh_run / "checkpoints" / ".tmp-k1ll3d.pt").write_bytes(b"half a checkpoint")
    (fresh_run / ".metrics.jsonl.tmp-0bad").write_text("{")
    logs = []
    cfg = build_config("copy", method="softmax", positions="nape", steps=2, sets=TINY + COPY)
    assert train(cfg, str(fresh_run), printer=logs.append, progress=False)["step"] == 2
    assert not (fresh_run / "checkpoints" / ".tmp-k1ll3d.pt").exists()
    assert not (fresh_run / ".metrics.jsonl.tmp-0bad").exists()
    assert any("removed 2 temporary file(s)" in m for m in logs)


def test_folder_of_a_run_killed_before_config_json_is_recovered(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)  # what a kill right after the first mkdir left
    (out / ".lock").write_text("")
    (out / ".config.json.tmp-dead").write_text('{"task"')
    cfg = build_config("copy", method="softmax", positions="nape", steps=2, sets=TINY + COPY)
    assert train(cfg, str(out), printer=_quiet, progress=False)["step"] == 2
    assert json.loads((out / "config.json").read_text())["train"]["steps"] == 2


def test_resume_logs_the_same_losses_as_an_uninterrupted_run(tmp_path):
    sets = TINY + COPY + ["train.log_every=4", "train.ckpt_every=3"]
    cfg = build_config("copy", method="softmax", positions="nape", steps=8, sets=sets)
    train(cfg, str(tmp_path / "ref"), printer=_quiet, progress=False)
    killed = tmp_path / "killed"

    class Killed(BaseException):
        pass

    def kill_after_5(step):  # stands for a SIGKILL after step 5: nothing after the kill point runs
        if step == 5:
            raise Killed

    with pytest.raises(Killed):  # last checkpoint at step 3, between the logged steps 1 and 4
        train(cfg, str(killed), printer=_quiet, progress=False, callbacks=[kill_after_5])
    train(cfg, str(killed), printer=_quiet, progress=False)

    def losses(run):
        return [
            (r["step"], r["loss"], r["lr"], r["grad_norm"])
            for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "loss" in r
        ]

    assert [s for s, *_ in losses(killed)] == [1, 4, 8]
    assert losses(killed) == losses(tmp_path / "ref")


# ---- 17: progress and ETA -----------------------------------------------------------------------------------
def test_tqdm_is_a_required_dependency():
    text = (REPO_ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*)\]$", text, re.MULTILINE).group(1)
    names = [re.match(r"\s*[\"']([A-Za-z0-9_.-]+)", d).group(1) for d in deps.split(",")]
    assert names[0] == "torch" and "tqdm" in names


class _TTY(io.StringIO):
    def isatty(self):
        return True


def test_evaluation_progress_on_a_terminal_only(run, monkeypatch):
    import time

    from longsparse.evaluate import load_run_model
    from longsparse.tasks import scoring
    from longsparse.tasks.scoring import score_length
    from longsparse.train.config import make_task

    model, cfg, _ = load_run_model(run, "last")
    task = make_task(cfg["task"])
    real = scoring.predict

    def slow_predict(*a, **k):  # tqdm redraws at most every 0.1 s
        time.sleep(0.12)
        return real(*a, **k)

    monkeypatch.setattr(scoring, "predict", slow_predict)
    tty = _TTY()
    monkeypatch.setattr(sys, "stderr", tty)
    score_length(model, task, 8, 4, batch_size=1, progress=True)
    shown = tty.getvalue()
    assert "4/4" in shown and "ex/s" in shown and "<" in shown, shown  # done / total, rate, ETA
    tty.seek(0)
    tty.truncate()
    score_length(model, task, 8, 4, batch_size=1, progress=False)
    assert tty.getvalue() == ""
    pipe = io.StringIO()  # not a terminal: nothing
    monkeypatch.setattr(sys, "stderr", pipe)
    score_length(model, task, 8, 4, batch_size=1, progress=True)
    assert pipe.getvalue() == ""


def test_training_log_lines_have_an_eta(tmp_path):
    logs = []
    train(
        build_config("copy", method="softmax", positions="nape", steps=4, sets=TINY + COPY),
        str(tmp_path / "r"),
        printer=logs.append,
        progress=True,
    )  # stdout is not a terminal under pytest: no tqdm bar
    steps = [m for m in logs if m.startswith("step") and "loss" in m]
    assert steps and all(re.search(r"ETA (\d+[hms]|\?)", m) for m in steps), steps


# ---- out of memory: one line, nothing left behind; the process's own limits count ---------------------------
_LIMITED = """
import resource, sys
from pathlib import Path
import torch
from longsparse.cli import main
vm = next(int(l.split()[1]) * 1024 for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (int(sys.argv[1]) << 20), resource.RLIM_INFINITY))
if sys.argv[2] == "room":
    from longsparse.evaluate.memory import available_bytes
    print(available_bytes())
    sys.exit(0)
sys.exit(main(sys.argv[2:]))
"""


def _limited(mib: int, *argv: str) -> subprocess.CompletedProcess:
    """``longsparse.cli`` (or ``room``: print ``available_bytes()``) in a child whose RLIMIT_AS leaves ``mib`` MiB
    beyond what it has mapped after importing torch."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", _LIMITED, str(mib), *argv], capture_output=True, text=True, env=env, timeout=300
    )


def test_free_memory_counts_the_process_limit():
    """Under `ulimit -v` the memory check sees the room the limit leaves, not the machine's free RAM."""
    got = _limited(512, "room")
    assert got.returncode == 0, got.stderr
    assert int(got.stdout) <= 512 << 20


def test_eval_refuses_a_length_beyond_the_process_limit(run, tmp_path):
    out = _limited(1024, "eval", str(run), "--lengths", "1000000", "--samples", "1")
    err = out.stderr.strip()
    assert out.returncode == 2 and len(err.splitlines()) == 1, out.stderr
    assert "does not fit in memory" in err and "Traceback" not in err
    assert not (run / "eval").exists() or not any((run / "eval").iterdir())


def test_train_out_of_memory_is_one_line_and_leaves_no_folder(tmp_path):
    out = tmp_path / "big"
    got = _limited(2048, "train", "--task", "copy", "--set", "model.d_model=65536", "--steps", "2", "--out", str(out))
    err = got.stderr.strip()
    assert got.returncode == 2 and len(err.splitlines()) == 1, got.stderr
    assert err.startswith("longsparse train: error: out of memory (an allocation of") and "GiB failed" in err
    assert not out.exists()


def test_a_run_failing_before_its_first_checkpoint_leaves_no_folder(tmp_path, capsys, monkeypatch):
    """Out of memory at the first step (after the run folder got its config): the folder this call created goes;
    one line says what happened. A run that wrote a checkpoint keeps its folder, to resume."""
    from longsparse.train import loop

    def no_memory(*a, **k):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1073741824 bytes.")

    monkeypatch.setattr(loop, "train_step", no_memory)
    out = tmp_path / "r"
    argv = ["train", "--task", "copy", "--steps", "2", "--out", str(out), *_sets(TINY + COPY)]
    assert main(argv) == 2
    assert _err_line(capsys) == (
        "longsparse train: error: out of memory (an allocation of 1 GiB failed); try a smaller model or batch, "
        "shorter lengths or a smaller --batch-tokens"
    )
    assert not out.exists()
    # failing at step 3 of a run that checkpoints every step: its folder (and step 2's checkpoint) stays, to resume
    monkeypatch.undo()
    real, calls = loop.train_step, []

    def no_memory_at_third(*a, **k):
        calls.append(1)
        return no_memory() if len(calls) == 3 else real(*a, **k)

    monkeypatch.setattr(loop, "train_step", no_memory_at_third)
    assert main([*argv[:4], "4", *argv[5:], "--set", "train.ckpt_every=1"]) == 2
    assert "out of memory" in _err_line(capsys)
    assert read_checkpoint(str(out / "checkpoints" / "last.pt"))["extra"]["step"] == 2


# ---- unclear errors: each a one-line message naming the file or the setting -----------------------------------
def test_report_names_the_eval_file_whose_entry_lacks_a_length(tmp_path, capsys):
    f = tmp_path / "r" / "eval" / "eval-1.json"
    _fake_eval(f)
    doc = json.loads(f.read_text())
    del doc["results"][0]["length"]
    f.write_text(json.dumps(doc))
    assert main(["report", str(f), "--out", str(tmp_path / "rep")]) == 2
    assert (
        _err_line(capsys)
        == f"longsparse report: error: {f}: results[0] lacks 'length' (a cut or hand-edited eval file?)"
    )


def test_lm_token_cache_with_a_cut_zip_directory_is_rebuilt(tmp_path):
    """A cut near the end of the zip reads as OSError EINVAL ("[Errno 22] Invalid argument", no file name)."""
    from longsparse.lm.streams import SAMPLE_DIR, prepare

    data = {"dir": str(SAMPLE_DIR), "tokenizer": "bytes", "vocab_size": 258}
    _, tokens = prepare(data, cache_dir=str(tmp_path), printer=lambda *_: None)
    whole = (tmp_path / "tokens-bytes.pt").read_bytes()
    for cut in range(len(whole) - 1, 0, -1):  # the longest cut that torch reads as EINVAL
        (tmp_path / "tokens-bytes.pt").write_bytes(whole[:cut])
        try:
            torch.load(tmp_path / "tokens-bytes.pt", weights_only=True)
        except OSError:
            break
        except Exception:  # noqa: BLE001 - other cuts fail otherwise; keep looking
            continue
    else:
        pytest.fail("no cut of the token cache reads as OSError")
    msgs = []
    _, again = prepare(data, cache_dir=str(tmp_path), printer=msgs.append)
    assert any("unreadable token cache (OSError); rebuilding it" in m for m in msgs)
    assert again["test"].equal(tokens["test"])


def test_a_binary_records_file_is_named(tmp_path, capsys):
    store = tmp_path / "store"
    store.mkdir()
    (store / "records.jsonl").write_bytes(b"\x80\x81\xfe binary")
    argv = ["reproduce", "synthetic", "--config", str(_STUDY_FILE), "--store", str(store), "--report-only"]
    assert main([*argv, "--report", str(tmp_path / "rep")]) == 2
    err = _err_line(capsys)
    assert f"{store / 'records.jsonl'}: not a JSON-lines text file" in err


def test_report_only_on_an_empty_store_is_an_error(tmp_path, capsys):
    argv = ["reproduce", "synthetic", "--config", str(_STUDY_FILE), "--store", str(tmp_path / "empty")]
    assert main([*argv, "--report", str(tmp_path / "rep"), "--out", str(tmp_path / "runs"), "--report-only"]) == 2
    err = _err_line(capsys)
    assert "records.jsonl: no stored results" in err and "nothing was written" in err
    assert not (tmp_path / "rep").exists() or not any((tmp_path / "rep").iterdir())


def test_nan_weights_are_a_bad_checkpoint_not_a_nan_query(fresh_run, capsys):
    from longsparse.io import atomic_torch_save

    path = fresh_run / "checkpoints" / "last.pt"
    payload = torch.load(path, weights_only=True)
    name = next(k for k, v in payload["model"].items() if v.is_floating_point())
    payload["model"][name] = torch.full_like(payload["model"][name], float("nan"))
    atomic_torch_save(payload, path)
    assert main(["eval", str(fresh_run), "--lengths", "8", "--samples", "2", "--checkpoint", "last"]) == 2
    err = _err_line(capsys)
    assert f"{path}: not a usable checkpoint: weight {name!r} holds NaN or inf" in err


@pytest.mark.parametrize(
    "setting, message",
    [
        ("model.attention.method=hsa", "'hsa' is an architecture, not a method: use --arch hsa"),
        ("model.d_model=abc", "invalid model config: d_model must be an integer, got 'abc'"),
        ("model.n_heads=[1, 2]", "invalid model config: n_heads must be an integer, got [1, 2]"),
        ("model.attention.learn_alpha=1", "invalid model config: attention.learn_alpha must be true or false, got 1"),
        (
            "model.attention.asentmax_delta=-1",
            "invalid model config: attention.asentmax_delta must be a finite number >= 0, got -1",
        ),
        ("model.alpha=1.3", "model.alpha is now model.attention.alpha"),
        ("model.attention=3", "model.attention must be a table of attention settings, got 3"),
    ],
)
def test_set_errors_name_the_setting(tmp_path, capsys, setting, message):
    out = tmp_path / "r"
    assert main(["train", "--task", "copy", "--set", setting, "--out", str(out)]) == 2
    assert message in _err_line(capsys)
    assert not out.exists()


# ---- the CPU kernel build: said while it runs, left out of the ETA, cached across checkouts and venvs ----------
def test_a_kernel_build_is_left_out_of_the_eta(monkeypatch):
    """A first step that includes the kernel build (a minute) would put hours into the ETA of a long run."""
    from longsparse import cpu_kernel  # where the training loop reads the build time
    from longsparse.train import loop

    real_step, built = loop.train_step, [0.0]

    def step_with_a_build(*a, **k):
        if not built[0]:
            time.sleep(2.0)  # what the build costs the first step, recorded as build time
            built[0] = 2.0
        return real_step(*a, **k)

    class Stop(Exception):
        pass

    def stop(step):
        if step == 1:
            raise Stop

    monkeypatch.setattr(loop, "train_step", step_with_a_build)
    monkeypatch.setattr(cpu_kernel, "build_seconds", lambda: built[0])
    logs = []
    cfg = build_config("copy", method="softmax", positions="nape", steps=10_000, sets=TINY + COPY)
    with pytest.raises(Stop):
        train(cfg, None, printer=logs.append, progress=False, callbacks=[stop])
    (line,) = [m for m in logs if m.startswith("step")]
    eta = re.search(r"ETA (\S+)", line).group(1)
    assert "h" not in eta, line  # 2 s x 9,999 steps would be 5h33m


def test_the_kernel_build_says_what_it_builds(monkeypatch, tmp_path, capsys):
    from torch.utils import cpp_extension

    from longsparse import cpu_kernel

    monkeypatch.setenv("LONGSPARSE_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_kernel, "_module", None)
    monkeypatch.setattr(cpu_kernel, "_failed", False)
    monkeypatch.setattr(cpu_kernel, "_build_seconds", 0.0)
    calls = []

    def fake_load(**kw):
        calls.append(kw)
        return object()

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    assert cpu_kernel.get() is not None and len(calls) == 1
    folder = tmp_path / cpu_kernel._build_name()
    assert calls[0]["build_directory"] == str(folder)
    assert calls[0]["sources"] == [str(folder / rel) for rel in cpu_kernel.SOURCES]
    assert all((folder / rel).read_bytes() == (SRC / rel).read_bytes() for rel in cpu_kernel.FILES)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"longsparse: building the fused CPU kernel in {folder} (once per machine")
    assert re.fullmatch(r"longsparse: kernel built in \d+ s", err[1]) and cpu_kernel.build_seconds() > 0


def test_the_kernel_build_name_covers_every_source(tmp_path, monkeypatch):
    """An edit of any source or header (a header of the row solver included) names a new build: the old name
    would load a binary compiled from the old sources."""
    from longsparse import cpu_kernel

    shutil.copytree(SRC, tmp_path / "longsparse", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cpu_kernel, "_PACKAGE", tmp_path / "longsparse")
    names = {cpu_kernel._build_name()}
    for rel in cpu_kernel.FILES:
        with open(tmp_path / "longsparse" / rel, "a") as f:
            f.write("\n")
        names.add(cpu_kernel._build_name())
    assert len(names) == len(cpu_kernel.FILES) + 1


def test_a_built_kernel_is_reused_from_another_checkout(tmp_path):
    """Another checkout (or a venv with the same torch and Python) finds the finished build and imports it, no
    compiler run: torch's loader rebuilt whenever the source's or torch's absolute paths changed."""
    from longsparse import cpu_kernel

    if cpu_kernel.get() is None:
        pytest.skip("the kernel cannot be built here")
    name = cpu_kernel._build_name()
    shutil.copytree(cpu_kernel.cache_root() / name, tmp_path / "cache" / name)
    shutil.copytree(SRC, tmp_path / "other" / "longsparse", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "other"), "LONGSPARSE_KERNEL_CACHE": str(tmp_path / "cache")}
    probe = "from longsparse import cpu_kernel; m = cpu_kernel.get(); print(cpu_kernel.__file__, m.__file__, cpu_kernel.build_seconds())"
    res = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    where, lib, seconds = res.stdout.split()
    assert where.startswith(str(tmp_path / "other")) and lib.startswith(str(tmp_path / "cache" / name))
    assert float(seconds) == 0 and "building" not in res.stderr
