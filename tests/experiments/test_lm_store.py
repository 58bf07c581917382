"""The LM study's results store (results/lm/records.jsonl): `longsparse lm report` appends run folders'
evaluations to it and renders docs/lm from it."""

from __future__ import annotations

import json
import math

from helpers.paths import REPO_ROOT

from longsparse.lm.evaluate import bucket_positions
from longsparse.report import store
from longsparse.train.config import config_hash
from longsparse_experiments.cli import main
from longsparse_experiments.lm_config import load_study_config
from longsparse_experiments.lm_report import aggregate, build_lm_report, stored_lm_results

ROOT = REPO_ROOT
LM_STORE = ROOT / "results" / "lm"


def quiet(*_):
    pass


def test_store_renders_the_committed_lm_tables(tmp_path):
    """docs/lm/lm_results.md, and the tables docs/lm.md quotes, are the store's rendering byte for byte."""
    rep = build_lm_report([], tmp_path, printer=quiet, store_dir=LM_STORE)
    table = (tmp_path / "lm_results.md").read_text()
    assert table == rep["table"] == (ROOT / "docs" / "lm" / "lm_results.md").read_text()
    assert table in (ROOT / "docs" / "lm.md").read_text()


def test_imported_records_carry_their_groups_seed_mean_curves():
    """The saved report kept per-position curves only as seed means: both seeds' records of a group carry the
    same marked curve, so the group mean the report plots is that curve."""
    records = store.read_records(LM_STORE)
    assert len(records) == 16 and all(r["source"] == "docs/lm/lm_results.json" for r in records)
    agg = aggregate(stored_lm_results(LM_STORE))
    for rec in records:
        ev = rec["lm_eval"]
        group = agg[f"{rec['method']}/{rec['positions']}"]
        assert ev["per_position_nll"] == group["per_position_nll"] and len(ev["per_position_nll"]) == 2048
        assert ev["per_position_source"].startswith("mean over seeds 0, 1 of")
        assert [r["exact_match"] for r in rec["results"]] == [
            ev["passkey"][str(r["length"])]["accuracy"] for r in rec["results"]
        ]


def _eval(run: str, method: str, seed: int, T: int = 4) -> dict:
    """A small LM evaluation (the fields of eval.json), with values exact in 6 significant digits."""
    per_pos = [2.0 + 0.125 * ((p * (seed + 3)) % 5) for p in range(4 * T)]
    delta = [0.0] * T + [0.0625 * ((p + seed) % 3 - 1) for p in range(T, 4 * T)]
    ppl = {
        str(L): {"nll": 2.5 + 0.25 * seed - 0.125 * i, "ppl": math.exp(2.5 + 0.25 * seed - 0.125 * i), "n_targets": 16}
        for i, L in enumerate((2, 4, 8, 16))
    }
    passkey = {
        str(L): {
            "accuracy": 0.5 * (seed + i) % 1,
            "by_depth": {"0.0": 0.5, "1.0": 0.0},
            "n": 2,
            "digit_accuracy": 0.25,
            "answer_nll": 2.25,
        }
        for i, L in enumerate((4, 8, 16))
    }
    return {
        "run": run,
        "method": method,
        "positions": "nape",
        "seed": seed,
        "seq_len": T,
        "split": "test",
        "eval_config": {},
        "train_wall_s": 10.0 + seed,
        "params": 100,
        "steps": 5,
        "perplexity": ppl,
        "per_position_nll": per_pos,
        "position_buckets": bucket_positions(per_pos, T),
        "per_position_delta_nll": delta,
        "position_delta_buckets": [
            {"start": b["start"], "end": b["end"], "delta_nll": b["nll"]} for b in bucket_positions(delta, T)
        ],
        "passkey": passkey,
        "eval_wall_s": {"perplexity": 1.0, "total": 2.0},
    }


def test_report_from_run_folders_stores_them_once_and_renders_the_same_from_the_store(tmp_path):
    runs = tmp_path / "runs"
    for method in ("softmax", "asentmax"):
        for seed in (0, 1):
            d = runs / f"{method}-nape-s{seed}"
            d.mkdir(parents=True)
            (d / "eval.json").write_text(json.dumps(_eval(d.name, method, seed)))
    (runs / "softmax-nape-s0" / "config.json").write_text(
        json.dumps({"task": {"name": "lm"}, "model": {}, "train": {"seed": 0}})
    )
    st = tmp_path / "store"
    assert main(["lm", "report", str(runs), "--out", str(tmp_path / "a"), "--store", str(st)]) == 0
    assert main(["lm", "report", str(runs), "--out", str(tmp_path / "a"), "--store", str(st)]) == 0
    records = store.read_records(st)
    assert sorted(r["run"] for r in records) == [
        "lm/asentmax-nape-s0",
        "lm/asentmax-nape-s1",
        "lm/softmax-nape-s0",
        "lm/softmax-nape-s1",
    ]  # stored once
    by_run = {r["run"]: r for r in records}
    assert by_run["lm/softmax-nape-s0"]["config_hash"] == config_hash(
        {"task": {"name": "lm"}, "model": {}, "train": {"seed": 0}}
    )
    assert by_run["lm/softmax-nape-s1"]["config_hash"] is None  # that run folder has no config.json
    assert by_run["lm/asentmax-nape-s1"]["train"]["train_seconds"] == 11.0
    assert main(["lm", "report", "--store", str(st), "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "b" / "lm_results.md").read_text() == (tmp_path / "a" / "lm_results.md").read_text()

    # a run evaluated again (another result) appends a record, and the report shows the later one
    again = _eval("softmax-nape-s1", "softmax", 1)
    again["perplexity"]["16"]["ppl"] = 99.0
    (runs / "softmax-nape-s1" / "eval.json").write_text(json.dumps(again))
    assert main(["lm", "report", str(runs / "softmax-nape-s1"), "--out", str(tmp_path / "c"), "--store", str(st)]) == 0
    assert len(store.read_records(st)) == 5
    assert main(["lm", "report", "--store", str(st), "--out", str(tmp_path / "d")]) == 0
    assert "99.0" in (tmp_path / "d" / "lm_results.md").read_text()


def test_report_without_runs_or_store_is_refused(tmp_path, capsys):
    assert main(["lm", "report", "--out", str(tmp_path)]) == 2
    assert "no LM results to report" in capsys.readouterr().err


def test_quick_study_into_the_store_renders_its_report(tmp_path):
    """`lm run --store` on real (quick) runs: the store holds each run once, with its config hash, and renders
    the tables the run folders rendered."""
    out, st = tmp_path / "lmq", tmp_path / "store"
    assert main(["lm", "run", "--quick", "--out", str(out), "--store", str(st)]) == 0
    records = store.read_records(st)
    assert len(records) == len({r["run"] for r in records}) >= 2
    T = load_study_config("quick").train.seq_len
    for rec in records:
        cfg = json.loads((out / rec["run"].split("/", 1)[1] / "config.json").read_text())
        assert rec["config_hash"] == config_hash(cfg) and len(rec["lm_eval"]["per_position_nll"]) == 16 * T
    assert main(["lm", "report", "--store", str(st), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "lm_results.md").read_text() == (out / "report" / "lm_results.md").read_text()
