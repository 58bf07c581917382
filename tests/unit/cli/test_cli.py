"""Command line: argument errors (valid choices listed, exit status 2), report from synthetic result JSON,
presets listing, the library's and the experiments' subcommands."""

import json
import subprocess
import sys

import pytest

from longsparse.cli import build_parser, main
from longsparse.report import ReportError, build_report, collect, markdown_table


def _run(*args):
    return subprocess.run([sys.executable, "-m", "longsparse.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["train", "--task", "bogus", "--out", "x"], "invalid choice: bogus"),
        (["train", "--task", "copy", "--method", "bogus", "--out", "x"], "choose from softmax, entmax"),
        (["train", "--task", "copy", "--positions", "bogus", "--out", "x"], "choose from nope, rope, alibi, nape"),
        (["train", "--task", "copy"], "the following arguments are required: --out"),
        (["eval", "runs/x"], "the following arguments are required: --lengths"),
        (["eval", "r", "--lengths", "64", "--checkpoint", "middle"], "choose from best, last"),
        (["report", "--out", "x"], "the following arguments are required: runs"),
    ],
)
def test_argument_errors(args, needle, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err.replace("'", ""), err  # argparse quotes choices on some Python versions


def test_train_errors_exit_2_with_message(tmp_path, capsys):
    assert main(["train", "--task", "copy", "--out", str(tmp_path / "r"), "--set", "train.lr=-1"]) == 2
    assert "train.lr must be a number > 0" in capsys.readouterr().err
    assert main(["train", "--task", "copy", "--out", str(tmp_path / "r"), "--preset", "huge"]) == 2
    assert "available: cpu, paper" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # nothing created on a config error


def test_eval_and_report_errors_exit_2(tmp_path, capsys):
    assert main(["eval", str(tmp_path), "--lengths", "64"]) == 2
    assert "not a longsparse run directory" in capsys.readouterr().err
    assert main(["eval", str(tmp_path), "--lengths", "6x4"]) == 2
    assert "not a length" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "rep")]) == 2
    assert "no evaluation results" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    assert main(["report", str(bad), "--out", str(tmp_path / "rep")]) == 2
    assert "not a longsparse eval result" in capsys.readouterr().err


def test_print_config_and_presets(capsys):
    assert (
        main(
            [
                "train",
                "--task",
                "copy",
                "--method",
                "softmax",
                "--out",
                "unused",
                "--print-config",
                "--set",
                "train.lr=3e-4",
            ]
        )
        == 0
    )
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["train"]["lr"] == 3e-4 and cfg["model"]["attention"]["method"] == "softmax"
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "mqmtar" in out and "cpu, paper" in out


LIBRARY_COMMANDS = {"train", "eval", "report", "presets", "data", "migrate"}
EXPERIMENT_COMMANDS = {"demo", "figures", "findings", "hsa", "lm", "reproduce", "bench"}


def _commands(parser) -> set:
    return set(next(a for a in parser._actions if a.dest == "command").choices)


def test_longsparse_is_one_command_with_every_subcommand():
    from longsparse_experiments import cli as experiments_cli

    assert _commands(build_parser()) == LIBRARY_COMMANDS  # python -m longsparse.cli
    assert _commands(experiments_cli.build_parser()) == LIBRARY_COMMANDS | EXPERIMENT_COMMANDS
    # the library's subcommands keep their flags inside the `longsparse` command
    args = experiments_cli.build_parser().parse_args(["train", "--task", "copy", "--out", "r", "--arch", "hsa"])
    assert args.arch == "hsa" and args.func.__module__ == "longsparse.cli"


def test_experiment_commands_fail_in_one_line_with_exit_2(tmp_path, capsys):
    from longsparse_experiments.cli import main as longsparse

    assert longsparse(["reproduce", "synthetic", "--quick", "--only", "bogus", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("longsparse reproduce: error: --only: unknown ['bogus']") and err.count("\n") == 1
    assert longsparse(["lm", "run", "--config", str(tmp_path / "missing.toml")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit) as e:  # the library alone has no experiment command
        main(["reproduce", "synthetic"])
    assert e.value.code == 2 and "invalid choice: reproduce" in capsys.readouterr().err.replace("'", "")


def test_presets_lists_task_and_experiment_presets(capsys):
    from longsparse_experiments.cli import main as longsparse

    assert longsparse(["presets"]) == 0
    out = capsys.readouterr().out
    tasks, _, experiments = out.partition("experiment presets in ")
    assert "flip_flop" in tasks and "reproduce" not in tasks  # a study is not a task preset
    assert "synthetic, synthetic-quick" in experiments and "cpu, quick" in experiments


def _fake_result(run, method, ems, n=100, created="2026-01-01T00:00:00"):
    from longsparse.stats import wilson_interval

    res = []
    for L, em in ems.items():
        k = round(em * n)
        res.append(
            {
                "length": L,
                "ratio": L / 64,
                "n": n,
                "n_exact": k,
                "exact_match": k / n,
                "exact_match_ci": list(wilson_interval(k, n)),
                "n_tokens": n * 10,
                "n_correct_tokens": k * 10,
                "token_accuracy": k / n,
                "token_accuracy_ci": list(wilson_interval(k * 10, n * 10)),
                "batch_size": 8,
                "seconds": 1.0,
                "seed": 0,
                "split": "test",
            }
        )
    return {
        "format": "longsparse-eval",
        "version": 1,
        "run": f"/runs/{run}",
        "run_name": run,
        "label": f"{method}/nape",
        "task": "copy",
        "task_preset": "cpu",
        "method": method,
        "positions": "nape",
        "checkpoint": "best",
        "checkpoint_step": 100,
        "train_lengths": [32, 64],
        "samples": n,
        "seed": 0,
        "results": res,
        "created": created,
    }


def test_report_from_synthetic_json(tmp_path):
    files = []
    for run, method, ems in (
        ("a", "softmax", {64: 1.0, 128: 0.5, 1024: 0.0}),
        ("b", "asentmax", {64: 1.0, 128: 0.97, 1024: 0.9}),
    ):
        (tmp_path / run / "eval").mkdir(parents=True)
        f = tmp_path / run / "eval" / "eval-1.json"
        f.write_text(json.dumps(_fake_result(run, method, ems)))
        files.append(f)
    # a newer result for one length of run b replaces the older one
    (tmp_path / "b" / "eval" / "eval-2.json").write_text(
        json.dumps(_fake_result("b", "asentmax", {1024: 0.8}, created="2026-02-01T00:00:00"))
    )
    rep = build_report([tmp_path / "a", tmp_path / "b"], tmp_path / "rep", printer=None)
    table = rep["table"]
    lines = table.splitlines()
    assert "| length | × train | softmax/nape | asentmax/nape |" in lines
    assert "| 128 | 2× | 50.0 [40–60] | 97.0 [92–99] |" in lines
    assert "| 1024 | 16× | 0.0 [0–4] | 80.0 [71–87] |" in lines
    assert (tmp_path / "rep" / "results.md").read_text().count("\n|---:|") == 1  # one table (one task)
    merged = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert merged["format"] == "longsparse-report"
    assert [s["name"] for s in merged["series"]] == ["softmax/nape", "asentmax/nape"]
    assert [r["length"] for r in merged["series"][1]["results"]] == [64, 128, 1024]
    # its own results.json is rebuilt; anything else there (a study's archive) is refused, nothing written
    assert build_report([tmp_path / "a"], tmp_path / "rep", printer=None)["series"]
    archive = tmp_path / "study" / "results.json"
    archive.parent.mkdir()
    for text in ('{"format": "longsparse-reproduce", "studies": {}}', "{"):
        archive.write_text(text)
        with pytest.raises(ReportError, match="not a `longsparse report` file"):
            build_report([tmp_path / "a"], archive.parent, printer=None)
        assert archive.read_text() == text and sorted(archive.parent.iterdir()) == [archive]
    try:
        import matplotlib  # noqa: F401

        assert rep["png"].exists() and rep["png"].stat().st_size > 1000
    except ImportError:
        assert rep["png"] is None and "pip install" in rep["png_error"] and "matplotlib" in rep["png_error"]


def test_report_disambiguates_same_label(tmp_path):
    for run in ("s0", "s1"):
        f = tmp_path / f"{run}.json"
        f.write_text(json.dumps(_fake_result(run, "softmax", {64: 1.0})))
    series = collect([tmp_path / "s0.json", tmp_path / "s1.json"])
    assert [s["name"] for s in series] == ["softmax/nape (s0)", "softmax/nape (s1)"]
    assert "softmax/nape (s1)" in markdown_table(series)
    with pytest.raises(ReportError, match="no such run directory or file"):
        collect([tmp_path / "missing"])


def test_cli_subprocess_entry_point():
    p = _run("train", "--task", "sortt", "--out", "x")
    assert p.returncode == 2 and "invalid choice" in p.stderr and "max_retrieval" in p.stderr
