"""The results store (longsparse.report.store): append-only records, the committed stores rendering the committed
tables and findings, the archives written before the store read as they are."""

from __future__ import annotations

import json
import multiprocessing
import shutil

import pytest
from helpers.paths import REPO_ROOT

from longsparse.report import store
from longsparse.train.config import ConfigError
from longsparse_experiments.cli import main
from longsparse_experiments.reproduce import run_study
from longsparse_experiments.study import load_study
from longsparse_experiments.study_records import cell_hash, cell_identities, tables_markdown, update_archive, view

ROOT = REPO_ROOT
TRIAL_STUDIES = ROOT / "results" / "synthetic_trials"  # the trial study files
# (store, study file (None: synthetic.toml), the tables.md that the archive it was migrated from rendered)
MIGRATED = [("synthetic", None, ROOT / "docs" / "results" / "tables.md")] + [
    (name, TRIAL_STUDIES / f"{name}.toml", ROOT / "docs" / "results" / name / "tables.md")
    for name in ("flipflop256x_27", "maxret256x_26", "mqmtar256x_26")
]


def _spec(study_file):
    return load_study("synthetic", path=str(study_file) if study_file else None)


def _record(run="s/softmax-nape-s0", em=0.5, length=64, **kw):
    return store.new_record(
        study="s",
        run=run,
        method="softmax",
        positions="nape",
        seed=0,
        results=[{"checkpoint": "last", "length": length, "n": 10, "exact_match": em}],
        **kw,
    )


@pytest.mark.parametrize("name,study_file,tables", MIGRATED, ids=[m[0] for m in MIGRATED])
def test_migrated_store_renders_the_tables_of_the_archive(name, study_file, tables):
    records = store.read_records(ROOT / "results" / name)
    messages = []
    data = view(_spec(study_file), records, printer=messages.append)
    assert tables_markdown(data) == tables.read_text()
    assert not [m for m in messages if "recorded for config" in m]  # no stored result is stale
    for r in records:  # and each says where it came from
        assert r["source"] and r["results"]


def test_findings_headline_is_rebuilt_from_the_store(tmp_path):
    """Command C1 of docs/findings.md, run on the store, gives the committed analysis byte for byte."""
    pairs = "asentmax-softmax,entmax-softmax,adatemp-softmax,asentmax-adatemp,ssmax-softmax"
    assert (
        main(
            [
                "reproduce",
                "synthetic",
                "--store",
                str(ROOT / "results" / "synthetic"),
                "--only",
                "mqmtar_inline_3l_lr4e-3_4k",
                "--analyse",
                pairs,
                "--endpoint",
                "4096",
                "--analysis-out",
                str(tmp_path),
            ]
        )
        == 0
    )
    for f in ("analysis.json", "analysis.md"):
        assert (tmp_path / f).read_text() == (ROOT / "docs" / "findings" / "mqmtar_headline" / f).read_text()


def test_findings_preregistered_analysis_is_rebuilt_from_the_archive(tmp_path):
    """Command C12 of docs/findings.md (the pre-registered study, on a copy of its archive) gives the committed
    analysis byte for byte."""
    report = tmp_path / "report"
    shutil.copytree(ROOT / "results" / "prereg_mqmtar", report)
    argv = [
        "reproduce",
        "synthetic",
        "--config",
        str(ROOT / "src" / "longsparse_experiments" / "configs" / "reproduce" / "prereg_mqmtar.toml"),
        "--report",
        str(report),
        "--analyse",
        "asentmax-softmax,adatemp-softmax,entmax-softmax,asentmax-adatemp",
        "--endpoint",
        "4096",
        "--analysis-out",
        str(tmp_path / "out"),
    ]
    assert main(argv) == 0
    for f in ("analysis.json", "analysis.md"):
        assert (tmp_path / "out" / f).read_text() == (ROOT / "docs" / "findings" / "prereg_mqmtar" / f).read_text()


def test_rebuild_appends_nothing_and_writes_only_the_report(tmp_path):
    name, study_file, tables = MIGRATED[2]
    st = tmp_path / "store"
    shutil.copytree(ROOT / "results" / name, st)
    before = store.records_path(st).read_bytes()
    data = update_archive(
        _spec(study_file), tmp_path / "no-runs", tmp_path / "report", printer=lambda s: None, store=st
    )
    assert store.records_path(st).read_bytes() == before
    assert sorted(p.name for p in st.iterdir()) == ["records.jsonl"]
    written = json.loads((tmp_path / "report" / "results.json").read_text())
    assert written == data and written[store.VIEW_MARK] is True
    assert tables_markdown(data) == tables.read_text()


def test_append_keeps_every_byte_and_a_later_record_wins(tmp_path):
    assert store.append_records(tmp_path, [_record(em=0.1), _record(em=0.2, length=128)]) == 2
    first = store.records_path(tmp_path).read_bytes()
    assert store.append_records(tmp_path, []) == 0 and store.records_path(tmp_path).read_bytes() == first
    store.append_records(tmp_path, [_record(em=0.3)])
    assert store.records_path(tmp_path).read_bytes().startswith(first)
    records = store.read_records(tmp_path)
    assert [r["results"][0]["exact_match"] for r in records] == [0.1, 0.2, 0.3]
    merged = store.merge_results(records)
    assert {k: v["exact_match"] for k, v in merged.items()} == {("last", 64): 0.3, ("last", 128): 0.2}
    assert not [p for p in tmp_path.iterdir() if p.name != "records.jsonl"]  # no temporaries, no lock file


def test_bad_records_are_refused_whole(tmp_path):
    store.append_records(tmp_path, [_record()])
    before = store.records_path(tmp_path).read_bytes()
    bad = {**_record(), "results": [{"checkpoint": "last", "length": 64}]}
    with pytest.raises(store.StoreError, match="lacks"):
        store.append_records(tmp_path, [_record(em=0.9), bad])
    with pytest.raises(store.StoreError, match="not a longsparse-record"):
        store.append_records(tmp_path, [{"run": "x"}])
    assert store.records_path(tmp_path).read_bytes() == before


def test_torn_and_foreign_lines_are_skipped(tmp_path):
    path = store.records_path(tmp_path)
    path.write_text(json.dumps(_record(em=0.1)) + "\n" + '{"not": "a record"}\n' + json.dumps(_record(em=0.2))[:30])
    warned = []
    assert [r["results"][0]["exact_match"] for r in store.read_records(tmp_path, warn=warned.append)] == [0.1]
    assert len(warned) == 2
    store.append_records(tmp_path, [_record(em=0.3)])  # starts a line of its own after the cut one
    assert [r["results"][0]["exact_match"] for r in store.read_records(tmp_path, warn=None)] == [0.1, 0.3]


def _append_many(args):
    folder, k = args
    for i in range(20):
        store.append_records(folder, [_record(run=f"s/softmax-nape-s{k}-{i}")])


def test_concurrent_appends_all_land(tmp_path):
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(_append_many, [(tmp_path, 0), (tmp_path, 1)])
    runs = [r["run"] for r in store.read_records(tmp_path, warn=None)]
    assert len(runs) == 40 and len(set(runs)) == 40


def test_archive_written_before_the_store_is_read_then_imported(tmp_path, capsys):
    """A results.json archive (what `reproduce` wrote before the store, e.g. results/prereg_mqmtar) is the
    store's content while the folder has no records.jsonl; before a report writes its view over it, it is
    imported, so nothing it held is lost; an archive in a report folder that is not the store is refused."""
    name, study_file, _ = MIGRATED[1]
    spec = _spec(study_file)
    full = view(spec, store.read_records(ROOT / "results" / name), printer=None)
    legacy = json.loads(json.dumps(full))
    legacy["studies"][spec.studies[0].name]["series"]["extra/nape"] = {
        "last": {"99": {"per_seed": {"0": {"exact_match": 1.0, "n": 1}}}}
    }  # a result the study file does not ask for: kept in the store
    (tmp_path / "results.json").write_text(json.dumps(legacy))
    records = store.read_records(tmp_path)
    assert view(spec, records, printer=None)["studies"] == full["studies"]
    assert not store.records_path(tmp_path).exists()
    # a report into another folder holding such an archive refuses before writing anything
    other = tmp_path / "other"
    other.mkdir()
    (other / "results.json").write_text(json.dumps(legacy))
    with pytest.raises(ConfigError, match="not in the store"):
        update_archive(spec, tmp_path / "no-runs", other, printer=lambda s: None, store=tmp_path / "x")
    assert json.loads((other / "results.json").read_text()) == legacy
    # the report written into the archive's own folder imports it first
    update_archive(spec, tmp_path / "no-runs", tmp_path, printer=lambda s: None)
    imported = store.read_records(tmp_path)
    assert len(imported) == len(records) and all(r["source"] == str(tmp_path / "results.json") for r in imported)
    assert any(r["method"] == "extra" for r in imported)
    assert json.loads((tmp_path / "results.json").read_text())[store.VIEW_MARK] is True


def test_running_preregistered_study_snapshot_is_readable():
    """results/prereg_mqmtar/results.json is written by the running study's frozen code: the store reads it as
    it is (reading writes nothing), every run under a config hash its study file gives now."""
    from longsparse_experiments.presets import presets_dir

    folder = ROOT / "results" / "prereg_mqmtar"
    spec = load_study(path=str(presets_dir() / "reproduce" / "prereg_mqmtar.toml"))
    before = sorted(p.name for p in folder.iterdir())
    records = store.read_records(folder)
    # the archive holds no configs: its hashes are the schema-2 hashes of the cells (cell_identities has both)
    hashes = {c.run: cell_identities(s.cell_config(c)) for s in spec.studies for c in s.cells()}
    assert records and all(r["config_hash"] in hashes[r["run"]] for r in records)
    assert all(r["test_seed"] == 20261126 for r in records)
    messages = []
    data = view(spec, records, printer=messages.append, strict=False)
    assert sum(len(sd["runs"]) for sd in data["studies"].values()) == len(records) and not messages
    assert sorted(p.name for p in folder.iterdir()) == before  # reading writes nothing there


def test_run_folder_record_carries_identity_config_commit_and_date(tmp_path):
    """What a run folder holds becomes one record with its config hash, code commit and date; recording the
    same folder again appends nothing; evaluating again appends a record that wins."""
    from longsparse.train.rundir import git_revision

    p = tmp_path / "s.toml"
    p.write_text(
        '[[study]]\nname = "t"\ntask = "flip_flop"\nmethods = ["softmax"]\npositions = ["nape"]\n'
        'seeds = [0]\nlengths = [64, 128]\nsamples = 3\ncheckpoints = ["last"]\n'
        'sets = ["train.steps=4", "train.warmup_steps=1", "train.val_every=2", "train.val_lengths=[64]", '
        '"train.val_samples=2", "train.ckpt_every=2", "train.log_every=2", "train.batch_size=2", '
        '"model.d_model=32", "model.d_ff=64"]\n'
    )
    spec = load_study(path=str(p))
    study, cell = spec.studies[0], spec.studies[0].cells()[0]
    [run] = run_study(spec, tmp_path / "runs", printer=lambda s: None)
    st = tmp_path / "store"
    update_archive(spec, tmp_path / "runs", tmp_path / "report", printer=lambda s: None, store=st)
    [rec] = store.read_records(st)
    evals = [json.loads(f.read_text()) for f in sorted((run / "eval").glob("*.json"))]
    assert rec["run"] == cell.run and rec["config_hash"] == cell_hash(study.cell_config(cell))
    assert rec["code_commit"] == git_revision()["commit"] and rec["date"] == max(d["created"] for d in evals)
    assert rec["train"]["steps"] == 4 and rec["test_seed"] == 0
    assert {(r["length"], r["exact_match"]) for r in rec["results"]} == {
        (r["length"], r["exact_match"]) for d in evals for r in d["results"]
    }
    before = store.records_path(st).read_bytes()
    update_archive(spec, tmp_path / "runs", tmp_path / "report", printer=lambda s: None, store=st)
    assert store.records_path(st).read_bytes() == before
    # a run folder whose result changes (here: a later evaluation file with another number) appends a record
    # that wins, with a message; the earlier record stays
    f = max((run / "eval").glob("*.json"))
    d = json.loads(f.read_text())
    d["created"], d["results"][-1]["n_exact"], d["results"][-1]["exact_match"] = "9999", 0, 0.0
    (run / "eval" / "eval-later.json").write_text(json.dumps(d))
    said = []
    update_archive(spec, tmp_path / "runs", tmp_path / "report", printer=said.append, store=st)
    assert store.records_path(st).read_bytes().startswith(before)
    first, again = store.read_records(st)
    assert first == rec and again["date"] == "9999" and any("replaced by this run folder's 0.0000" in m for m in said)
    L = d["results"][-1]["length"]
    assert store.merge_results([first, again])[("last", L)]["exact_match"] == 0.0
