"""`longsparse reproduce lm`: the LM study of docs/lm.md as the cells of a study file (configs/reproduce/lm.toml),
each run trained, evaluated and appended to the results store, the report rendered from the store
(``longsparse_experiments.lm_study.run_reproduce``, ``lm_report``)."""

from __future__ import annotations

import json

import pytest
from helpers.paths import REPO_ROOT
from helpers.records import NOT_COMPARED

from longsparse.report import store
from longsparse.train.config import ConfigError, config_hash
from longsparse_experiments.cli import main
from longsparse_experiments.lm_study import load_lm_study
from longsparse_experiments.presets import presets_dir

ROOT = REPO_ROOT
LM_STORE = ROOT / "results" / "lm"
STUDY_FILES = presets_dir() / "reproduce"


def test_the_study_file_cells_are_the_stored_runs_and_render_the_committed_tables(tmp_path, capsys):
    """Against the repository's store every cell is stored (same evaluation config, length and steps), so the
    command trains nothing and renders docs/lm/lm_results.md byte for byte."""
    study = load_lm_study(STUDY_FILES / "lm.toml")
    assert {f"lm/{c.run}" for c in study.cells} == {r["run"] for r in store.read_records(LM_STORE)}
    args = ["reproduce", "lm", "--store", str(LM_STORE), "--out", str(tmp_path / "runs"), "--report", str(tmp_path)]
    assert main(args) == 0
    assert capsys.readouterr().out.count("its evaluation is in the store; skipped") == 16
    assert not (tmp_path / "runs").exists()
    assert (tmp_path / "lm_results.md").read_bytes() == (ROOT / "docs" / "lm" / "lm_results.md").read_bytes()


def test_dry_run_lists_each_run_as_its_lm_run_command(tmp_path, capsys):
    out = tmp_path / "runs"
    args = ["reproduce", "lm", "--dry-run", "--out", str(out), "--store", str(tmp_path / "s")]
    assert main([*args, "--only", "rope"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 8 and all("-rope-s" in line for line in lines)
    assert lines[0] == (
        "lm/softmax-rope-s0: would train (600 steps) and evaluate, as `longsparse lm run --preset cpu --methods "
        "softmax --positions rope --seeds 0`"
    )
    assert not out.exists() and not (tmp_path / "s").exists()


def test_quick_study_gives_the_numbers_of_lm_run_quick_and_resumes(tmp_path, capsys, monkeypatch):
    """`longsparse reproduce lm --quick` trains the runs of `longsparse lm run --quick` (the same numbers; wall
    clocks aside), appends each evaluation once with its config hash, and renders the report from the store; a
    second call trains nothing and appends nothing. Its default folders are its own, not the synthetic study's
    runs/reproduce-quick, whose store it would mix its records into."""
    assert main(["lm", "run", "--quick", "--out", str(tmp_path / "lm")]) == 0
    monkeypatch.chdir(tmp_path)  # the default folders: its own, not the synthetic study's store
    out = tmp_path / "runs" / "reproduce-lm-quick"
    st = rep = out / "report"
    args = ["reproduce", "lm", "--quick"]
    assert main(args) == 0
    records = store.read_records(st)
    assert sorted(r["run"] for r in records) == ["lm/asentmax-nape-s0", "lm/softmax-nape-s0"]
    for rec in records:
        cfg = json.loads((out / rec["run"] / "config.json").read_text())
        assert rec["config_hash"] == config_hash(cfg)
    want, got = (json.loads((d / "lm_results.json").read_text()) for d in (tmp_path / "lm" / "report", rep))
    by_run = [sorted(x["runs"], key=lambda r: r["run"]) for x in (want, got)]
    for w, g in zip(*by_run, strict=True):
        assert {k: v for k, v in w.items() if k not in NOT_COMPARED} == {
            k: v for k, v in g.items() if k not in NOT_COMPARED
        }
    table = (rep / "lm_results.md").read_text()
    capsys.readouterr()
    assert main(args) == 0
    assert capsys.readouterr().out.count("skipped") == 2
    assert len(store.read_records(st)) == 2 and (rep / "lm_results.md").read_text() == table


@pytest.mark.parametrize(
    "text, message",
    [
        (
            'report = "lm"\n[[study]]\nname = "a"\nmethods = ["softmax"]\npositions = ["nape"]\nseeds = [0]\n',
            "needs preset",
        ),
        ('report = "lm"\npreset = "quick"\nwindow = 3\n', "unknown key(s) ['window']"),
        ('report = "lm"\npreset = "quick"\nstudy = [1]\n', "study #1: must be a [[study]] table"),
        ('report = "lm"\npreset = "nope"\n[[study]]\nname = "a"\n', "no LM preset 'nope'"),
        (
            'report = "lm"\npreset = "quick"\n[[study]]\nname = "a"\nmethods = ["softmax"]\npositions = ["nape"]\n',
            "missing key(s) ['seeds']",
        ),
        (
            'report = "lm"\npreset = "quick"\n[[study]]\nname = "a"\nmethods = ["sofmax"]\npositions = ["nape"]\n'
            "seeds = [0]\n",
            "unknown methods ['sofmax']",
        ),
        (
            'report = "lm"\npreset = "quick"\n'
            + '[[study]]\nname = "a"\nmethods = ["softmax"]\npositions = ["nape"]\nseeds = [0]\n'
            + '[[study]]\nname = "b"\nmethods = ["softmax", "entmax"]\npositions = ["nape"]\nseeds = [0]\n',
            "share the run(s) ['softmax-nape-s0']",
        ),
    ],
)
def test_bad_lm_study_files_are_refused_naming_the_problem(tmp_path, text, message):
    f = tmp_path / "lm.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_lm_study(f)


def test_job_options_and_unknown_studies_are_refused(tmp_path, capsys):
    out = ["--out", str(tmp_path / "runs"), "--report", str(tmp_path / "rep")]
    assert main(["reproduce", "lm", "--quick", "--shard", "0/2", *out]) == 2
    assert "--shard: not for a study with report = 'lm'" in capsys.readouterr().err
    assert main(["reproduce", "lm", "--quick", "--only", "alibi", *out]) == 2
    assert "--only: unknown ['alibi']" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "rep").exists()
