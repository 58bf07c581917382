"""``longsparse findings hsa-seeds``: the HSA six-seed study's analysis (protocol
docs/reports/2026-11-28-hsa-seeds.md) on hand-made records, each number checked by hand; the committed analysis
re-rendered byte for byte; bad input in one line."""

from __future__ import annotations

import json
import math

import pytest
from helpers.paths import REPO_ROOT

from longsparse.report import store
from longsparse.stats import wilson_interval
from longsparse_experiments.cli import main
from longsparse_experiments.findings import hsa_seeds


def _record(variant: str, seed: int, by_length: dict[int, tuple[int, int]]) -> dict:
    """A store record of run hsa_seeds/<variant>_s<seed>: {length: (right, n)}."""
    return {
        "format": store.RECORD_FORMAT,
        "study": f"hsa_seeds-{variant}",
        "run": f"hsa_seeds/{variant}_s{seed}",
        "method": "softmax",
        "positions": "rope",
        "seed": seed,
        "results": [
            {"checkpoint": "last", "length": L, "exact_match": k / n, "n": n} for L, (k, n) in by_length.items()
        ],
    }


def _full_and_decoder() -> list[dict]:
    """full: trains in 4 of 5 seeds (s3 at chance); dec_softmax: trains in all 5, near chance at 64×."""
    recs = []
    for s in range(5):
        ok = s != 3
        recs.append(_record("full", s, {256: (100 if ok else 6, 100), 16384: ((99 - s) if ok else 7, 100)}))
        recs.append(_record("dec_softmax", s, {256: (100, 100), 16384: (s, 100)}))
    return recs


def test_runs_by_variant_keeps_the_later_evaluation_and_only_the_study_runs():
    recs = [
        _record("full", 600, {256: (10, 100)}),
        _record("full", 600, {256: (90, 100), 16384: (80, 100)}),
        {**_record("full", 0, {256: (8, 8)}), "run": "hsa_full/fl_full_s0"},
        _record("entmax", 601, {256: (4, 8)}),
    ]
    runs = hsa_seeds.runs_by_variant(recs)
    assert list(runs) == ["full", "entmax"]  # the study file's order; other folders ignored
    assert runs["full"][600][256]["exact_match"] == 0.9 and runs["full"][600][16384]["n"] == 100
    assert hsa_seeds.trains(runs["full"][600]) is True and hsa_seeds.trains(runs["entmax"][601]) is True  # 50 %
    assert hsa_seeds.trains({16384: {"exact_match": 1.0, "n": 1}}) is None  # 1× not evaluated yet


def test_training_rate_and_pooled_over_the_seeds_that_train():
    runs = hsa_seeds.runs_by_variant(_full_and_decoder())
    rate = hsa_seeds.training_rate(runs["full"])
    lo, hi = wilson_interval(4, 5)
    assert rate == {"k": 4, "n": 5, "wilson": [100 * lo, 100 * hi]}
    p = hsa_seeds.pooled(runs["full"], 16384)
    assert sorted(p["per_seed"]) == [0, 1, 2, 4]  # s3 does not train
    right = 99 + 98 + 97 + 95
    assert p["pooled"]["n"] == 400 and p["pooled"]["seeds"] == 4
    assert math.isclose(p["pooled"]["exact_match"], 100 * right / 400)
    assert p["pooled"]["wilson"] == [100 * x for x in wilson_interval(right, 400)]


def test_a_row_by_hand_over_all_seeds_and_where_both_train():
    runs = hsa_seeds.runs_by_variant(_full_and_decoder())
    row = hsa_seeds.compare_row(runs, "full", "dec_softmax")
    d_all = [99 - 0, 98 - 1, 97 - 2, 7 - 3, 95 - 4]
    assert [r["d"] for r in row["per_seed"]] == pytest.approx(d_all)
    a = row["all_seeds"]
    assert a["n"] == 5 and a["mean"] == pytest.approx(sum(d_all) / 5) and a["positive"] == 5
    assert a["p"] == pytest.approx(2 / 32)  # all five positive: only the two all-same-sign patterns reach |Σ|
    assert a["t_ci"][0] > 0  # the interval excludes 0, but five seeds cannot reach p < 0.05
    assert row["verdict"] == "not significant"
    both = row["both_train"]
    assert both["seeds"] == [0, 1, 2, 4] and both["mean"] == pytest.approx((99 + 97 + 95 + 91) / 4)
    assert row["robust"] is True  # 4 seeds where both train, all positive, all disjoint
    assert row["training"]["a"]["k"] == 4 and row["training"]["b"]["k"] == 5


def test_six_seeds_all_one_sign_are_supported_and_overlapping_intervals_are_not_robust():
    recs = []
    for s in range(6):
        recs.append(_record("full", s, {256: (100, 100), 16384: (60, 100)}))
        recs.append(_record("dense16", s, {256: (100, 100), 16384: (55, 100)}))
    row = hsa_seeds.compare_row(hsa_seeds.runs_by_variant(recs), "full", "dense16")
    assert row["all_seeds"]["p"] == pytest.approx(2 / 64)
    assert row["all_seeds"]["t_ci"] == pytest.approx((5.0, 5.0))  # no spread
    assert row["verdict"] == "supported"
    assert row["robust"] is False  # 60 % vs 55 % of 100: the Wilson intervals overlap
    flipped = hsa_seeds.compare_row(hsa_seeds.runs_by_variant(recs), "dense16", "full")
    assert flipped["verdict"] == "reversed"


def test_robust_needs_three_seeds_where_both_train():
    recs = []
    for s in range(6):
        recs.append(_record("full", s, {256: (100, 100), 16384: (100, 100)}))
        recs.append(_record("mean", s, {256: ((100, 100) if s < 2 else (5, 100)), 16384: (0, 100)}))
    row = hsa_seeds.compare_row(hsa_seeds.runs_by_variant(recs), "full", "mean")
    assert row["both_train"]["n"] == 2 and row["robust"] is False
    assert row["verdict"] == "supported"  # six seeds, every difference +100


def test_analyse_and_markdown_on_a_partial_study():
    recs = _full_and_decoder() + [_record("swa", 0, {256: (5, 100), 16384: (9, 100)})]
    a = hsa_seeds.analyse(recs)
    assert [r["row"] for r in a["rows"]] == ["B1", "B2"]  # rows whose variants have records
    b2 = a["rows"][1]
    assert b2["all_seeds"]["n"] == 1 and b2["all_seeds"]["t_ci"] is None and b2["both_train"]["n"] == 0
    text = hsa_seeds.markdown(a)
    assert "| full | 4 of 5 |" in text and "| swa | 0 of 1 |" in text
    assert "| full s3 | 6.0 | 7.0 |" in text
    assert "| B2 | full − swa" in text and "no seeds" in text


def test_the_command_writes_both_files_and_refuses_a_foreign_one(tmp_path, capsys):
    st = tmp_path / "store"
    store.append_records(st, _full_and_decoder())
    out = tmp_path / "out"
    assert main(["findings", "hsa-seeds", "--store", str(st), "--out", str(out)]) == 0
    a = json.loads((out / "analysis.json").read_text())
    assert a["format"] == "longsparse-hsa-seeds-analysis" and a["rows"][0]["row"] == "B1"
    assert "| B1 | full − dec_softmax" in (out / "analysis.md").read_text()
    assert "| B1 |" in capsys.readouterr().out
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "analysis.md").write_text("mine")
    assert main(["findings", "hsa-seeds", "--store", str(st), "--out", str(foreign)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "was not written by `longsparse findings hsa-seeds`" in err
    assert (foreign / "analysis.md").read_text() == "mine" and not (foreign / "analysis.json").exists()


def test_bad_input_is_one_line(tmp_path, capsys):
    assert main(["findings", "hsa-seeds", "--store", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no records in" in err
    st = tmp_path / "other"
    store.append_records(st, [{**_record("full", 0, {256: (1, 1)}), "run": "elsewhere/full_s0"}])
    assert main(["findings", "hsa-seeds", "--store", str(st)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no hsa_seeds/<variant>_s<seed> runs" in err


@pytest.mark.parametrize(
    "t_ci, p, expected",
    [
        ((2.0, 9.0), 0.031, "supported"),
        ((-9.0, -2.0), 0.031, "reversed"),
        ((-1.0, 9.0), 0.031, "inconclusive"),  # every seed positive, yet the interval allows both signs
        ((0.0, 9.0), 0.031, "inconclusive"),  # an interval that reaches 0 does not exclude it
        ((2.0, 9.0), 0.0625, "not significant"),  # excludes 0, but the sign-flip test stays at 0.0625
        ((-9.0, -2.0), 0.5, "not significant"),
        (None, None, "inconclusive"),  # one seed: no interval
    ],
)
def test_verdict_by_hand(t_ci, p, expected):
    assert hsa_seeds.verdict(t_ci, p) == expected


def test_the_committed_analysis_rerenders(tmp_path, monkeypatch):
    """`longsparse findings hsa-seeds --out docs/findings/hsa_seeds` made the committed files from the committed
    store; the same command today makes them byte for byte."""
    monkeypatch.chdir(REPO_ROOT)
    assert main(["findings", "hsa-seeds", "--out", str(tmp_path)]) == 0
    for name in ("analysis.json", "analysis.md"):
        committed = REPO_ROOT / "docs" / "findings" / "hsa_seeds" / name
        assert (tmp_path / name).read_bytes() == committed.read_bytes(), f"{committed} differs from its re-rendering"
