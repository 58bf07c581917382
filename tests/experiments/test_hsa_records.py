"""The HSA study's results store (results/hsa/records.jsonl) and ``longsparse_experiments.hsa_tables`` (the
`longsparse hsa` command), which renders the tables of
the study's report (docs/reports/2026-11-21-hsa-development.md) and the report pages docs/hsa/report*/ from it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

from longsparse.report import store
from longsparse.train.config import config_hash
from longsparse_experiments import hsa_tables as tables
from longsparse_experiments.cli import main

ROOT = REPO_ROOT
HSA_STORE = ROOT / "results" / "hsa"


def wilson_by_roots(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Oracle: the Wilson interval as the two roots p of (k/n − p)² = z²·p(1 − p)/n."""
    phat = k / n
    a, b, c = 1 + z * z / n, -(2 * phat + z * z / n), phat * phat
    disc = math.sqrt(b * b - 4 * a * c)
    return max(0.0, (-b - disc) / (2 * a)), min(1.0, (-b + disc) / (2 * a))


def test_page_and_report_tables_are_rebuilt_from_the_store(capsys):
    """Every generated block of the study's report and the table of every report page equal the store's rendering."""
    assert main(["hsa", "check", "--root", str(ROOT)]) == 0, capsys.readouterr().err


def test_write_rerenders_the_committed_page_and_report_pages(tmp_path):
    """`longsparse hsa write` into a copy whose blocks and report pages are emptied gives back the committed
    files byte for byte (the plots too, where this matplotlib made the committed ones)."""
    page = (ROOT / tables.PAGE).read_text(encoding="utf-8")
    emptied, pos = [], 0
    for _, (start, end) in sorted(tables.page_blocks(page).items(), key=lambda kv: kv[1]):
        emptied += [page[pos:start]]
        pos = end
    (tmp_path / tables.PAGE).parent.mkdir(parents=True)
    (tmp_path / tables.PAGE).write_text("".join(emptied + [page[pos:]]), encoding="utf-8")
    assert main(["hsa", "check", "--root", str(tmp_path), "--store", str(HSA_STORE)]) == 1
    assert main(["hsa", "write", "--root", str(tmp_path), "--store", str(HSA_STORE)]) == 0
    assert (tmp_path / tables.PAGE).read_text(encoding="utf-8") == page
    for name in tables.REPORT_PAGES:
        committed, made = ROOT / tables.PAGES_DIR / name, tmp_path / tables.PAGES_DIR / name
        assert (made / "results.md").read_bytes() == (committed / "results.md").read_bytes()
        png = (committed / "accuracy_vs_length.png").read_bytes()
        matplotlib = pytest.importorskip("matplotlib")
        if f"Matplotlib version{matplotlib.__version__},".encode() in png:
            assert (made / "accuracy_vs_length.png").read_bytes() == png
    assert main(["hsa", "check", "--root", str(tmp_path), "--store", str(HSA_STORE)]) == 0


def test_write_never_replaces_a_report_page_it_did_not_write(tmp_path, capsys):
    foreign = tmp_path / tables.PAGES_DIR / "report_dec" / "results.md"
    foreign.parent.mkdir(parents=True)
    foreign.write_text("mine")
    (tmp_path / tables.PAGE).parent.mkdir(parents=True)
    (tmp_path / tables.PAGE).write_text((ROOT / tables.PAGE).read_text(encoding="utf-8"), encoding="utf-8")
    assert main(["hsa", "write", "--root", str(tmp_path), "--store", str(HSA_STORE)]) == 2
    assert "was not written by `longsparse hsa write`" in capsys.readouterr().err
    assert foreign.read_text() == "mine" and not (tmp_path / tables.PAGES_DIR / "report" / "results.md").exists()
    for page in tables.REPORT_PAGES:  # the committed pages are this command's
        manifest = json.loads((ROOT / tables.PAGES_DIR / page / ".longsparse-outputs.json").read_text())
        assert manifest["files"] == {f: tables.WRITER for f in tables.PAGE_FILES}


def test_a_page_without_its_blocks_is_one_line(tmp_path, capsys):
    (tmp_path / tables.PAGE).parent.mkdir(parents=True)
    (tmp_path / tables.PAGE).write_text("no blocks here\n")
    assert main(["hsa", "check", "--root", str(tmp_path), "--store", str(HSA_STORE)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "block stripped missing" in err


def test_an_unknown_block_is_one_line(capsys):
    assert main(["hsa", "tables", "nonesuch", "--root", str(ROOT)]) == 2
    assert "unknown block 'nonesuch'" in capsys.readouterr().err


def test_stored_results_are_consistent_with_their_counts_and_configs():
    records = store.read_records(HSA_STORE)
    assert len(records) == 109 and len({r["run"] for r in records}) == 43
    for rec in records:
        assert rec["source"].startswith("docs/hsa/raw/") and rec["date"] and rec["code_commit"]
        assert rec["config_hash"] == config_hash(rec["config"])
        assert rec["seed"] == rec["config"]["train"]["seed"] and rec["train_hi"] == 256
        for r in rec["results"]:
            assert r["exact_match"] == pytest.approx(r["n_exact"] / r["n"], abs=1e-12)
            assert r["ci"] == pytest.approx(wilson_by_roots(r["n_exact"], r["n"]), abs=1e-9)
            nd = r.get("needles")
            if nd is not None:  # every scored example is either a full-recall example or a miss
                given_recall, given_miss = nd["exact_match_given_recall"], nd["exact_match_given_miss"]
                assert given_recall["n"] + given_miss["n"] == r["n"] == nd["n"]
                assert given_recall["k"] + given_miss["k"] == r["n_exact"]
    # the later of two evaluations of a length wins: full_s0 was scored at 65,536 twice
    view = tables.run_view(records, "hsa", "full_s0")
    result, rec = view["by_length"][65536]
    assert rec["date"] == max(
        r["date"] for r in records if r["run"] == "hsa/full_s0" and any(x["length"] == 65536 for x in r["results"])
    )


def _eval_doc(run_dir: Path, *, created: str, n_exact: int, n: int, needles: bool = True) -> dict:
    cfg = {
        "task": {"name": "passkey", "preset": "cpu", "params": {"value_len": 1}},
        "model": {"arch": "hsa", "method": "softmax", "positions": "rope", "topk": 4},
        "train": {"seed": 1, "steps": 50, "train_lengths": [64, 256]},
    }
    result = {
        "length": 1024,
        "n": n,
        "n_exact": n_exact,
        "exact_match": n_exact / n,
        "exact_match_ci": list(wilson_by_roots(n_exact, n)),
        "token_accuracy": 1.0,
        "seconds": 2.4,
    }
    if needles:  # no query_positions field: the diagnostics of an evaluation before the EOS fix
        result["needles"] = {
            "n": n,
            "recall_at_k": 0.5,
            "full_recall": {"rate": 0.5},
            "mean_rank": float("nan"),
            "mean_needle_weight": 0.25,
            "seconds": 1.3,
            "exact_match_given_recall": {"n": 2, "k": 2, "rate": 1.0},
            "exact_match_given_miss": {"n": n - 2, "k": n_exact - 2, "rate": None},
        }
    return {
        "format": "longsparse-eval",
        "run": str(run_dir),
        "run_name": run_dir.name,
        "label": "hsa[topk=4]",
        "task": "passkey",
        "task_preset": "cpu",
        "method": "softmax",
        "positions": "rope",
        "checkpoint": "last",
        "checkpoint_step": 50,
        "train_lengths": [64, 256],
        "seed": 0,
        "config": cfg,
        "created": created,
        "env": {"git": {"commit": "abc123", "dirty": True}},
        "command": ["/bin/longsparse", "eval", str(run_dir), "--lengths", "1024"],
        "results": [result],
    }


def test_add_stores_a_run_folder_once_and_renders_it(tmp_path, monkeypatch):
    run = tmp_path / "runs" / "toy_s1"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "eval-1.json").write_text(
        json.dumps(_eval_doc(run, created="2026-11-21T10:00:00+00:00", n_exact=3, n=4))
    )
    (run / "metrics.jsonl").write_text(
        "".join(
            json.dumps(m) + "\n"
            for m in [{"step": 25, "loss": 1.5}, {"step": 30, "val_exact_match": 0.5}, {"step": 50, "loss": 0.75}]
        )
    )
    (tmp_path / "runs" / "toy_s1.train.log").write_text("run: toy\ntrain wall 12.5 s\n")
    st = tmp_path / "store"
    assert tables.add_runs("toys", [run], st, printer=lambda *_: None) == 1
    assert tables.add_runs("toys", [run], st, printer=lambda *_: None) == 0  # stored already
    (rec,) = store.read_records(st)
    assert rec["run"] == "toys/toy_s1" and rec["seed"] == 1 and rec["code_dirty"] is True
    assert rec["eval_command"] == f"longsparse eval {run} --lengths 1024"
    assert rec["train"] == {
        "steps": 50,
        "wall_seconds": 12.5,
        "final_loss": 0.75,
        "first_step_loss_below_1": 50,
        "losses": [[25, 1.5], [50, 0.75]],
    }
    assert rec["results"][0]["needles"]["mean_needle_weight"] == 0.25  # every result field is kept

    monkeypatch.setitem(tables.BLOCKS, "toy", tables.Block("toys", ("toy_s1",)))
    lo, hi = wilson_by_roots(3, 4)
    text = tables.render_block("toy", store.read_records(st))
    assert f"| toy_s1 | 75 [{100 * lo:.0f}, {100 * hi:.0f}] n=4 |" in text
    assert "| toy_s1* | 1,024 | 0.50 | 0.50 | - | 0.25 | 100% (2) | -% (2) | 4 |" in text  # NaN rank: '-'
    assert "| toy_s1 | 12.5 | 0.7500 | 50 |" in text

    # a later evaluation of the same length wins, and its diagnostics (written after the fix) are not starred
    (run / "eval" / "eval-2.json").write_text(
        json.dumps(_eval_doc(run, created="2026-11-22T10:00:00+00:00", n_exact=4, n=4))
    )
    assert tables.add_runs("toys", [run], st, printer=lambda *_: None) == 1
    text = tables.render_block("toy", store.read_records(st))
    assert "| toy_s1 | 100 [" in text and "| toy_s1 | 1,024 |" in text and "toy_s1*" not in text


def test_a_run_missing_from_the_store_is_named():
    with pytest.raises(ValueError, match="hsa_full/no_such_run"):
        tables.run_view(store.read_records(HSA_STORE), "hsa_full", "no_such_run")


def test_an_evaluation_by_schema_2_code_is_recorded_in_todays_form_with_the_hash_it_had():
    """`longsparse hsa add` of an eval file whose config older code wrote (the attention settings flat): the
    record holds the config as `longsparse migrate` would rewrite it, its hash now, and the hash it had as
    legacy_hash; an eval file of today's code is recorded with its config as it is."""
    from longsparse.migrate import flat_attention, migrate_run_config, schema2_hash
    from longsparse.train import build_config
    from longsparse.train.rundir import normalise

    cfg = normalise(build_config("passkey", arch="hsa", method="entmax", steps=2))
    old = {**cfg, "schema_version": 2, "model": flat_attention(cfg["model"])}
    result = {"length": 8, "n": 2, "exact_match": 0.5, "exact_match_ci": [0.1, 0.9]}
    doc = {"format": "longsparse-eval", "run_name": "r_s0", "checkpoint": "last", "results": [result]}
    rec = tables.record({**doc, "config": old}, study="s", source="f.json", train=None)
    assert rec["config"] == migrate_run_config(old) and rec["config"]["model"]["attention"]["method"] == "entmax"
    assert rec["config_hash"] == config_hash(cfg) and rec["legacy_hash"] == schema2_hash(cfg) != config_hash(cfg)
    now = tables.record({**doc, "config": cfg}, study="s", source="f.json", train=None)
    assert now["config"] == cfg and now["config_hash"] == config_hash(cfg) and "legacy_hash" not in now
