"""`longsparse reproduce hsa`: the HSA study of docs/hsa.md as the cells of a study file (configs/reproduce/hsa.toml),
recorded into the HSA store and rendered as its tables (``longsparse_experiments.hsa_study``)."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

from longsparse.io import claim_outputs
from longsparse.report import store
from longsparse.train.config import ConfigError, build_config, config_hash
from longsparse_experiments import hsa_study, hsa_tables
from longsparse_experiments.cli import main
from longsparse_experiments.study import load_study

ROOT = REPO_ROOT
HSA_STORE = ROOT / "results" / "hsa"


def _latest(records: list[dict]) -> dict[str, dict]:
    return {r["run"]: r for r in records}


def test_every_stored_run_is_a_cell_of_the_study_file_with_its_config_and_evaluations():
    """The study file trains exactly the stored runs: one cell per stored run folder, whose config is the stored
    one (its current form: records written before the `--arch hsa` schema keep their stored hash) and whose
    lengths and example counts are those of the stored evaluations (so nothing is left to run)."""
    spec = load_study("hsa")
    records = store.read_records(HSA_STORE)
    latest = _latest(records)
    cells = {c.run: (s, c) for s in spec.studies for c in s.cells()}
    assert set(cells) == set(latest)
    for run, (study, cell) in cells.items():
        assert config_hash(study.cell_config(cell)) == hsa_study.stored_identity(latest[run]), run
        assert hsa_study.missing_lengths(study, cell, records) == [], run
        assert latest[run]["study"] == run.split("/")[0]
    for block in hsa_tables.BLOCKS.values():  # every run a table shows is rebuilt by the study
        assert {f"{block.study}/{n}" for n in block.runs} <= set(cells)


def test_dry_run_skips_the_stored_cells_and_lists_the_train_commands_of_the_rest(tmp_path, capsys):
    """Against the repository's store every cell is stored (skipped, nothing written); against an empty one each
    cell prints the `longsparse train` command of docs/hsa.md that trains it, and that command's config is the
    cell's (the ablations by their --set, the decoders without --arch)."""
    out = tmp_path / "runs"
    args = ["reproduce", "hsa", "--out", str(out), "--dry-run", "--report", str(tmp_path / "rep")]
    assert main([*args, "--store", str(HSA_STORE)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 43 and all(line.endswith("every result is in the store; skipped") for line in lines)
    assert main([*args, "--store", str(tmp_path / "empty")]) == 0
    printed = capsys.readouterr().out
    assert not out.exists() and not (tmp_path / "empty").exists() and not (tmp_path / "rep").exists()
    commands = dict(line.split(": ", 1) for line in printed.splitlines() if ": longsparse train " in line)
    assert commands["hsa_full/fl_dense16_s1"] == (
        "longsparse train --task passkey --preset cpu_full --arch hsa --method softmax --positions rope --seed 1 "
        "--set model.topk=16"
    )
    assert commands["hsa_full/dec_asentmax_s0"] == (
        "longsparse train --task passkey --preset cpu_full --method asentmax --positions nape --seed 0"
    )
    assert "hsa_full/fl_dense16_s1: would train (600 steps; new) and would evaluate 6" in printed
    latest = _latest(store.read_records(HSA_STORE))
    assert set(commands) == set(latest)
    for run, command in commands.items():
        words = shlex.split(command)[2:]
        opts = dict(zip(words[0:-1:2], words[1::2]))  # every flag has a value
        sets = [v for k, v in zip(words[0:-1:2], words[1::2]) if k == "--set"]
        cfg = build_config(
            opts["--task"],
            preset=opts["--preset"],
            arch=opts.get("--arch"),
            method=opts["--method"],
            positions=opts["--positions"],
            seed=int(opts["--seed"]),
            sets=sets,
        )
        assert config_hash(cfg) == hsa_study.stored_identity(latest[run]), run


def test_quick_study_trains_evaluates_records_and_renders(tmp_path, capsys, monkeypatch):
    """`longsparse reproduce hsa --quick`: three tiny runs trained and evaluated into its own folder (not the
    synthetic study's runs/reproduce-quick, whose store and tables.md it would mix into), every evaluation in the
    store whole (needle diagnostics of the HSA runs, the config, the training record), the tables rendered from
    the store; a second call finds everything stored and appends nothing."""
    monkeypatch.chdir(tmp_path)
    out = Path("runs") / "reproduce-hsa-quick"  # relative: the store as the tables name it
    st = rep = out / "report"
    args = ["reproduce", "hsa", "--quick"]
    assert main(args) == 0
    capsys.readouterr()
    records = store.read_records(st)
    assert {r["run"] for r in records} == {"hsa_full/fl_full_s0", "hsa_full/fl_dense16_s0", "hsa_full/dec_softmax_s0"}
    by_run = _latest(records)
    spec = load_study("hsa", quick=True)
    for study in spec.studies:
        for cell in study.cells():
            rec = by_run[cell.run]
            assert rec["study"] == "hsa_full" and rec["config_hash"] == config_hash(study.cell_config(cell))
            assert [(r["length"], r["n"], r["checkpoint"]) for r in rec["results"]] == [
                (64, 2, "last"),
                (128, 2, "last"),
            ]
            assert ("needles" in rec["results"][0]) == (rec["config"]["model"].get("arch") == "hsa")
            assert rec["train"]["steps"] == 4 and rec["train"]["wall_note"] == "first to last logged step"
    assert by_run["hsa_full/fl_dense16_s0"]["config"]["model"]["topk"] == 16
    text = (rep / "tables.md").read_text()
    assert text == hsa_study.report_text(records, str(store.records_path(st)))
    full = hsa_tables.render_block(
        "full", records, runs=("fl_full_s0", "fl_dense16_s0"), source=str(st / "records.jsonl")
    )
    assert full in text and "| fl_full_s0 | 0 [0, 66] n=2 | 0 [0, 66] n=2 |" in full
    assert "Not in the store yet: fl_full_s1," in text
    assert "No run of this block is in the store yet (hsa/:" in text
    # everything stored: nothing trained, nothing appended, the same tables
    assert main(args) == 0
    again = capsys.readouterr().out
    assert again.count("every result is in the store; skipped") == 3 and ": training (" not in again
    assert len(store.read_records(st)) == len(records)
    assert (rep / "tables.md").read_text() == text


def test_report_only_renders_the_repository_store(tmp_path, capsys):
    """`--report-only` against the repository's store: every block complete, equal to `longsparse hsa tables`."""
    rep = tmp_path / "rep"
    args = ["reproduce", "hsa", "--report-only", "--store", str(HSA_STORE), "--report", str(rep)]
    assert main([*args, "--out", str(tmp_path / "runs")]) == 0
    text = (rep / "tables.md").read_text()
    records = store.read_records(HSA_STORE)
    source = str(store.records_path(HSA_STORE))
    for name in hsa_tables.BLOCKS:
        assert hsa_tables.render_block(name, records, source=source) in text
    assert "Not in the store yet" not in text and "No run of this block" not in text


def test_render_block_with_some_runs_is_the_full_block_without_the_others():
    records = store.read_records(HSA_STORE)
    whole = hsa_tables.render_block("decoders4", records).splitlines()
    part = hsa_tables.render_block("decoders4", records, runs=("dec4_softmax_s1", "dec4_asentmax_s0")).splitlines()
    assert part == [line for line in whole if not line.startswith(("| dec4_softmax_s0 ", "| dec4_asentmax_s1 "))]


def test_bad_hsa_study_options_and_files(tmp_path, capsys):
    out = ["--out", str(tmp_path / "runs"), "--report", str(tmp_path / "rep")]
    # the tables.md of another study's report is never written over
    claim_outputs(tmp_path / "rep", ["tables.md"], "longsparse reproduce")
    (tmp_path / "rep" / "tables.md").write_text("the synthetic study's tables")
    assert main(["reproduce", "hsa", "--quick", *out]) == 2
    assert "was not written by `longsparse reproduce hsa`" in capsys.readouterr().err
    assert (tmp_path / "rep" / "tables.md").read_text() == "the synthetic study's tables"
    assert main(["reproduce", "hsa", "--quick", "--workers", "2", *out]) == 2
    assert "--workers: not for a study with report = 'hsa'" in capsys.readouterr().err
    assert main(["reproduce", "hsa", "--quick", "--time-budget", "60", *out]) == 2
    assert "--time-budget" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    base = (ROOT / "src/longsparse_experiments/configs/reproduce/hsa-quick.toml").read_text()
    cases = {
        'report = "hsa"': ('report = "plots"', "report must be one of tables, hsa"),
        'run_name = "fl_dense16_s{seed}"': ('run_name = "fl_full_s{seed}"', "share the run folder(s)"),
        'run_name = "dec_softmax_s{seed}"': ('run_name = "dec_{lr}"', "may use only {method}, {positions}, {seed}"),
        'run_name = "fl_full_s{seed}"': ('run_name = "fl_{seed.real.x}"', "may use only {method}, {positions}, {seed}"),
        'folder = "hsa_full"': ('folder = "a/b"', "folder must give a folder name"),
        "samples = 2": (
            'samples = 2\nsamples_at = { "4096" = 3 }',
            "samples_at must be a table of the study's lengths",
        ),
    }
    for old, (new, message) in cases.items():
        assert old in base
        bad = tmp_path / "bad.toml"
        bad.write_text(base.replace(old, new, 1))
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("{", r"\{")):
            load_study(path=str(bad))


def test_train_command_gives_nested_overrides_as_set_strings():
    spec = load_study("hsa", quick=True)
    study = dataclasses.replace(spec.studies[0], overrides={"model": {"arch": "hsa"}, "task": {"params": {"x": [1]}}})
    cell = study.cells()[0]
    assert hsa_study.train_command(study, cell).endswith(
        "--arch hsa --method softmax --positions rope --seed 0 --set task.params.x=[1]"
    )


def test_samples_at_overrides_the_sample_tiers(tmp_path):
    base = (ROOT / "src/longsparse_experiments/configs/reproduce/hsa-quick.toml").read_text()
    f = tmp_path / "s.toml"
    f.write_text(base.replace("lengths = [64, 128]", 'lengths = [64, 128, 256]\nsamples_at = { "128" = 5 }'))
    study = load_study(path=str(f)).studies[0]
    assert [study.samples_for(L) for L in study.lengths] == [2, 5, 2]


def test_training_record_without_a_timed_log_uses_the_logged_steps(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    lines = [
        {"step": 2, "loss": 2.0, "time": "2026-11-28T01:00:00+00:00"},
        {"step": 4, "loss": 0.5, "time": "2026-11-28T01:00:42+00:00"},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rec = hsa_tables.training_record(run)
    assert (rec["wall_seconds"], rec["wall_note"], rec["first_step_loss_below_1"]) == (
        42,
        "first to last logged step",
        4,
    )
    (run / "train.log").write_text("train wall 57.0 s\n")
    assert (
        "wall_note" not in hsa_tables.training_record(run) and hsa_tables.training_record(run)["wall_seconds"] == 57.0
    )
