"""`longsparse reproduce synthetic --quick`: the whole study pipeline end to end, resumability, bad study files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.paths import REPO_ROOT

from longsparse.train import build_config
from longsparse.train.config import ConfigError
from longsparse_experiments.cli import main
from longsparse_experiments.study import load_study

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def quick_study(tmp_path_factory):
    """The quick study trained, evaluated and reported once: (run folder, report folder). One thread, as in the
    tests that retrain a cell of it and expect the same numbers."""
    tmp = tmp_path_factory.mktemp("quick")
    out, rep = tmp / "runs", tmp / "report"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["reproduce", "synthetic", "--quick", "--out", str(out), "--report", str(rep)]) == 0
    finally:
        torch.set_num_threads(n)
    return out, rep


def test_quick_study_end_to_end_and_resume(quick_study, capsys):
    out, rep = quick_study
    spec = load_study("synthetic", quick=True)
    data = json.loads((rep / "results.json").read_text())
    for study in spec.studies:
        sd = data["studies"][study.name]
        assert sd["train_hi"] == 64
        assert set(sd["series"]) == {f"{m}/{p}" for m in study.methods for p in study.positions}
        for key, by_ck in sd["series"].items():
            for ck in ("best", "last"):
                assert sorted(int(L) for L in by_ck[ck]) == list(study.lengths)
                for L, r in by_ck[ck].items():
                    ems = [v["exact_match"] for v in r["per_seed"].values()]
                    assert r["seeds"] == len(study.seeds) == len(ems)
                    assert r["mean"] == pytest.approx(sum(ems) / len(ems)) and r["min"] == min(ems)
                    assert all(v["n"] == study.samples_for(int(L)) for v in r["per_seed"].values())
        for c in study.cells():
            rec = sd["runs"][c.run]
            assert rec["steps"] == 6 and rec["train_seconds"] >= 0
            # evaluation wall clock: the sum of the eval JSON's per-length seconds at the study's lengths
            evals = [json.loads(f.read_text()) for f in (out / c.run / "eval").glob("*.json")]
            assert rec["eval_seconds"] == pytest.approx(sum(r["seconds"] for d in evals for r in d["results"]), abs=0.1)
    tables = (rep / "tables.md").read_text()
    assert tables.count("| 64 | 1 |") == 4 * len(spec.studies)  # mean and per-seed, best and last
    assert "per seed: s0 / s1)" in tables
    files = sorted(out.rglob("eval/*.json"))
    capsys.readouterr()
    # a second call trains nothing and evaluates nothing: every result file is still the same set
    assert main(["reproduce", "synthetic", "--quick", "--out", str(out), "--report", str(rep)]) == 0
    assert sorted(out.rglob("eval/*.json")) == files
    printed = capsys.readouterr().out
    assert "trained to step" not in printed and "store updated" not in printed
    # and a dry run says so: every cell trained already, nothing left to evaluate
    n_cells = sum(len(s.cells()) for s in load_study("synthetic", quick=True).studies)
    assert main(["reproduce", "synthetic", "--quick", "--out", str(out), "--report", str(rep), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("trained already") == n_cells and "would train" not in printed
    assert printed.count("would evaluate 0 (checkpoint, length) pairs") == n_cells
    # an evaluation killed before its first length leaves an empty file: the report skips it
    (files[0].parent / "eval-killed.json").write_text("")
    assert main(["reproduce", "synthetic", "--quick", "--out", str(out), "--report", str(rep), "--report-only"]) == 0
    assert json.loads((rep / "results.json").read_text()) == data


def _rewrite_store(rep, edit):
    """Test setup: the store in ``rep`` holding ``edit(its records)`` instead (the library only ever appends to a
    store; a test writes the state it needs)."""
    from longsparse.report.store import read_records, records_path

    records = edit(json.loads(json.dumps(read_records(rep))))
    records_path(rep).write_text("".join(json.dumps(r) + "\n" for r in records))


def test_report_keeps_archived_results_when_run_folders_are_gone(quick_study, tmp_path, capsys):
    """A fresh machine has the committed store (records.jsonl) but none of the run folders: rebuilding or
    resuming the study there must keep every stored result, train nothing that is stored, and retrain only what
    is not."""
    _, rep0 = quick_study
    data = json.loads((rep0 / "results.json").read_text())
    spec = load_study("synthetic", quick=True)
    rep, out = tmp_path / "report", tmp_path / "runs"
    shutil.copytree(rep0, rep)
    capsys.readouterr()
    # a dry run against an empty archive plans every cell, against the full one none; it writes nothing
    n_cells = sum(len(s.cells()) for s in spec.studies)
    assert (
        main(["reproduce", "synthetic", "--quick", "--out", str(out), "--report", str(tmp_path / "none"), "--dry-run"])
        == 0
    )
    assert capsys.readouterr().out.count("would train") == n_cells
    assert main(["reproduce", "synthetic", "--quick", "--out", str(out), "--report", str(rep), "--dry-run"]) == 0
    assert capsys.readouterr().out.count("every result is in the archive") == n_cells
    assert not out.exists() and not (tmp_path / "none").exists()
    assert main(["reproduce", "synthetic", "--quick", "--out", str(out), "--report", str(rep)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("every result is in the archive") == n_cells and "training" not in printed
    assert not out.exists()
    assert json.loads((rep / "results.json").read_text()) == data

    # one archived number missing: only that cell is trained again; training and evaluation are seeded, so the
    # rebuilt report equals the original
    study = spec.studies[0]
    cell = study.cells()[-1]
    key, L = f"{cell.method}/{cell.positions}", str(study.lengths[-1])

    def drop_one(records):
        for r in records:
            if r["run"] == cell.run:
                r["results"] = [x for x in r["results"] if (x["checkpoint"], str(x["length"])) != ("last", L)]
        return records

    _rewrite_store(rep, drop_one)
    assert main(["reproduce", "synthetic", "--quick", "--out", str(out), "--report", str(rep)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("training (") == 1 and f"{cell.run}: training" in printed
    assert [p.relative_to(out).as_posix() for p in out.glob("*/*")] == [cell.run]
    rebuilt = json.loads((rep / "results.json").read_text())
    sd, sd0 = rebuilt["studies"][study.name], data["studies"][study.name]
    assert sd["series"] == sd0["series"]
    timing = ("train_seconds", "eval_seconds")
    assert {k: v for k, v in sd["runs"][cell.run].items() if k not in timing} == {
        k: v for k, v in sd0["runs"][cell.run].items() if k not in timing
    }

    # a stored cell recorded under another config is left out, with a message, not mixed in
    good = (rep / "records.jsonl").read_text()

    def stale(records):
        for r in records:
            if r["run"] == study.cells()[0].run:
                r["config_hash"] = "0" * 16
        return records

    _rewrite_store(rep, stale)
    shutil.rmtree(out)
    assert main(["reproduce", "synthetic", "--quick", "--out", str(out), "--report", str(rep), "--report-only"]) == 0
    assert "stored results left out: recorded for config 0000" in capsys.readouterr().out
    series = json.loads((rep / "results.json").read_text())["studies"][study.name]["series"]
    c0 = study.cells()[0]
    assert str(c0.seed) not in series[f"{c0.method}/{c0.positions}"]["last"][L]["per_seed"]

    # so are stored results at a sample count the study file no longer asks for
    (rep / "records.jsonl").write_text(good)
    toml = tmp_path / "quick.toml"
    text = Path(spec.path).read_text()
    assert "long_samples = 2\n" in text
    toml.write_text(text.replace("long_samples = 2\n", "long_samples = 3\n", 1))
    assert (
        main(
            ["reproduce", "synthetic", "--config", str(toml), "--out", str(out), "--report", str(rep), "--report-only"]
        )
        == 0
    )
    assert (
        "stored results are at checkpoints, lengths or sample counts the study does not ask for"
        in capsys.readouterr().out
    )
    series = json.loads((rep / "results.json").read_text())["studies"][study.name]["series"]
    assert L not in series[key]["last"]

    # a results.json that is not a report is refused before anything is written over it
    for text in ("{", json.dumps({"format": "something-else"})):
        (rep / "results.json").write_text(text)
        assert main(["reproduce", "synthetic", "--quick", "--out", str(out), "--report", str(rep)]) == 2
        assert "results.json" in capsys.readouterr().err
        assert (rep / "results.json").read_text() == text


def test_archive_is_updated_after_every_cell(tmp_path, monkeypatch, capsys):
    """Run folders do not outlive a session: a study stopped between cells (here: training of the second cell
    fails) must already have the first cell's results in the store (and the report's results.json)."""
    import longsparse.train as train_mod

    real_train, calls = train_mod.train, []

    def train_then_fail(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 2:
            raise KeyboardInterrupt("session over")
        return real_train(*args, **kwargs)

    monkeypatch.setattr(train_mod, "train", train_then_fail)
    out, rep = tmp_path / "runs", tmp_path / "report"
    assert (
        main(
            ["reproduce", "synthetic", "--quick", "--only", "flip_flop-quick", "--out", str(out), "--report", str(rep)]
        )
        == 130
    )
    printed = capsys.readouterr()
    assert printed.out.count("store updated") == 1 and "interrupted" in printed.err
    study = next(s for s in load_study("synthetic", quick=True).studies if s.name == "flip_flop-quick")
    first = study.cells()[0]
    series = json.loads((rep / "results.json").read_text())["studies"]["flip_flop-quick"]["series"]
    key = f"{first.method}/{first.positions}"
    assert set(series) == {key}  # the finished cell only; the interrupted one has nothing yet
    for ck in ("best", "last"):
        assert sorted(int(L) for L in series[key][ck]) == list(study.lengths)
    assert not list(rep.glob("*.tmp"))


def test_long_lengths_use_their_own_sample_count():
    s = load_study("synthetic", quick=True).studies[0]
    assert s.samples_for(s.long_from) == s.long_samples != s.samples_for(s.lengths[1]) == s.samples
    assert s.samples_for(s.lengths[0]) == s.id_samples != s.samples  # the in-distribution length


def test_committed_study_file_is_valid():
    spec = load_study("synthetic")
    for study in spec.studies:
        assert study.cells() and all(L >= 64 for L in study.lengths)
    by = {s.name: s for s in spec.studies}
    rope = by["mqmtar_inline_rope"]  # `like` copies the recipe, the study's own keys override
    assert rope.overrides == by["mqmtar_inline"].overrides and rope.positions == ("rope",)
    assert rope.description == ""  # not inherited
    fast = by["mqmtar_inline_3l_lr4e-3_4k"]  # `more_overrides` merges over the inherited table; the later wins
    base = by["mqmtar_inline_3l"].overrides
    assert fast.overrides == {**base, "train": {**base["train"], "lr": 4e-3, "steps": 4000}}
    cfg = build_config(
        fast.task, preset=fast.preset, method="softmax", positions="nape", seed=0, overrides=fast.overrides
    )
    assert cfg["train"]["lr"] == 4e-3 and cfg["train"]["steps"] == 4000 and cfg["model"]["n_layers"] == 3


def test_only_picks_a_study_by_name_before_its_task():
    spec = load_study("synthetic")
    pick = lambda only: [s.name for s in spec.select(only).studies]  # noqa: E731
    assert pick(["mqmtar_inline"]) == ["mqmtar_inline"]  # a study name, not every mqmtar_inline study
    assert pick(["mqmtar_inline_3l", "flip_flop"]) == ["flip_flop", "mqmtar_inline_3l"]
    quick = load_study("synthetic", quick=True)
    assert [s.name for s in quick.select(["flip_flop"]).studies] == ["flip_flop-quick"]


def test_bad_study_files(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('[[study]]\nname = "a"\ntask = "copy"\n')
    with pytest.raises(ConfigError, match="lacks"):
        load_study(path=str(p))
    p.write_text(
        '[[study]]\nname = "a"\ntask = "copy"\nmethods = ["softmax"]\npositions = ["nape"]\nseeds = [0]\n'
        "lengths = [64]\nsamples = 2\nbogus = 1\n"
    )
    with pytest.raises(ConfigError, match="unknown key"):
        load_study(path=str(p))
    base = '[[study]]\nname = "a"\npositions = ["nape"]\nseeds = [0]\nsamples = 2\n'
    for body, msg in (
        ('task = "nope"\nmethods = ["softmax"]\nlengths = [64]', "unknown task"),
        ('task = "copy"\nmethods = ["softmaxx"]\nlengths = [64]', "unknown methods"),
        ('task = "mqmtar"\nmethods = ["softmax"]\nlengths = [4]', "too short"),
        ('task = "copy"\nmethods = ["softmax"]\nlengths = [128, 64]', "increasing"),
        ('task = "copy"\nmethods = ["softmax"]\nlengths = [64]\nid_samples = 0', "id_samples"),
    ):
        p.write_text(base + body + "\n")
        with pytest.raises(ConfigError, match=msg):
            load_study(path=str(p))
    p.write_text('[[study]]\nname = "b"\nlike = "a"\n')
    with pytest.raises(ConfigError, match="names no earlier study"):
        load_study(path=str(p))
    with pytest.raises(ConfigError, match="no study file"):
        load_study(path=str(tmp_path / "missing.toml"))


def test_study_checkpoints_and_test_seed(tmp_path):
    """A study may evaluate only some checkpoints, on its own test stream: only those are evaluated, read back
    and archived (an evaluation of the same run on another test seed is never mixed in)."""
    from longsparse.evaluate import evaluate_run
    from longsparse_experiments.reproduce import run_study
    from longsparse_experiments.study_records import collect, plot, tables_markdown

    p = tmp_path / "s.toml"
    p.write_text(
        '[[study]]\nname = "t"\ntask = "flip_flop"\nmethods = ["softmax"]\npositions = ["nape"]\n'
        'seeds = [0]\nlengths = [64, 128]\nsamples = 3\ncheckpoints = ["last"]\ntest_seed = 7\n'
        "[study.overrides]\ntrain.steps = 4\ntrain.warmup_steps = 1\ntrain.val_every = 2\n"
        "train.val_lengths = [64]\ntrain.val_samples = 2\ntrain.ckpt_every = 2\ntrain.log_every = 2\n"
        "train.batch_size = 2\nmodel.d_model = 32\nmodel.d_ff = 64\n"
    )
    spec = load_study(path=str(p))
    [run] = run_study(spec, tmp_path / "runs", printer=lambda s: None)
    evals = [json.loads(f.read_text()) for f in (run / "eval").glob("*.json")]
    assert {(d["checkpoint"], d["seed"]) for d in evals} == {("last", 7)}
    evaluate_run(run, [64], samples=3, checkpoint="last", seed=0, printer=lambda s: None)  # another test stream
    view = collect(spec, tmp_path / "runs", printer=lambda s: None)
    data = view["studies"]["t"]
    assert data["test_seed"] == 7 and set(data["series"]["softmax/nape"]) == {"last"}
    tables = tables_markdown(view)  # no empty table for the checkpoint the study does not evaluate
    assert "(last checkpoint;" in tables and "(best checkpoint;" not in tables
    assert [p.name for p in plot(view, tmp_path)] == ["t.png"]
    [mine] = [d for d in evals if d["results"][0]["length"] == 64]
    assert (
        data["series"]["softmax/nape"]["last"]["64"]["per_seed"]["0"]["exact_match"]
        == mine["results"][0]["exact_match"]
    )
    for bad, msg in (('checkpoints = ["first"]', "unknown checkpoints"), ("test_seed = -1", "test_seed")):
        p.write_text(
            '[[study]]\nname = "a"\ntask = "copy"\nmethods = ["softmax"]\npositions = ["nape"]\n'
            f"seeds = [0]\nlengths = [64]\nsamples = 2\n{bad}\n"
        )
        with pytest.raises(ConfigError, match=msg):
            load_study(path=str(p))


def test_preregistered_study_is_the_headline_recipe():
    """The pre-registered study trains exactly the headline cell of synthetic.toml, seed aside."""
    from longsparse_experiments.presets import presets_dir

    pre = load_study(path=str(presets_dir() / "reproduce" / "prereg_mqmtar.toml")).studies
    head = next(s for s in load_study("synthetic").studies if s.name == "mqmtar_inline_3l_lr4e-3_4k")
    assert [m for s in pre for m in s.methods] == ["softmax", "asentmax", "adatemp", "entmax"]
    for s in pre:
        assert s.checkpoints == ("last",) and s.seeds == (100, 101, 102, 103, 104, 105)
        for c in s.cells():
            ref = next(x for x in head.cells() if x.method == c.method)
            a, b = s.cell_config(c), head.cell_config(ref)
            a["train"]["seed"] = b["train"]["seed"]
            assert a == b


def test_archived_cells_keep_their_identity():
    """Every stored cell's recorded config hash is still a hash its study file gives (its hash now, or, for a
    record written without its config in run config schema 2, the hash of its config in that schema's flat form):
    a new config setting that changes no result (such as the attention backend) must not turn the store stale."""
    import json as _json

    from longsparse.report.store import read_records
    from longsparse.train.config import config_hash
    from longsparse_experiments.study_records import cell_identities

    records = read_records(REPO_ROOT / "results" / "synthetic")
    stale = []
    for study in load_study("synthetic").studies:
        recorded = {
            (r["run"], r["config_hash"]) for r in records if r["study"] == study.name and r["config_hash"] is not None
        }
        hashes = {c.run: cell_identities(study.cell_config(c)) for c in study.cells()}
        stale += [run for run, h in recorded if h not in hashes[run]]
    assert recorded and not stale
    cfg = build_config("copy", preset="cpu", method="softmax", positions="nape", seed=0)
    other = _json.loads(_json.dumps(cfg))
    other["model"]["attention"]["attn_backend"] = "reference"
    del cfg["model"]["attention"]["attn_backend"]
    assert config_hash(cfg) == config_hash(other)
