"""``longsparse findings per-method-lr`` against the protocol's wording (docs/reports/2026-11-27-per-method-lr.md):
the selection rule clause by clause (fit bar, 16x criterion, tie, flagged fallback, pending), reading the store
(later record wins, last checkpoint only), the confirmation stage's pairs and each branch of its decision rule, and
the command's outputs, and the committed analysis re-rendered from the committed store."""

import json

import pytest
from helpers.paths import REPO_ROOT

from longsparse.stats import wilson_interval
from longsparse_experiments.cli import main
from longsparse_experiments.findings import per_method_lr as plr


def record(study, method, seed, em, *, n=200, checkpoint="last", final_loss=0.001):
    """A store record of one run: ``em`` {length: exact match %}; Wilson intervals at ``n`` examples."""
    results = []
    for L, x in em.items():
        k = round(x / 100 * n)
        results.append(
            {"checkpoint": checkpoint, "length": L, "exact_match": k / n, "ci": list(wilson_interval(k, n)), "n": n}
        )
    run = f"{study}/{method}-nape-s{seed}"
    return {"study": study, "run": run, "method": method, "seed": seed, "results": results,
            "train": {"final_loss": final_loss}}  # fmt: skip


def selection(method, cells):
    """Records of one method's selection stage from {lr: ((1x s400, 16x s400), (1x s401, 16x s401))}."""
    return [
        record(f"lr_select_{plr.lr_text(lr)}", method, s, {64: a, 1024: b})
        for lr, pair in cells.items()
        for s, (a, b) in zip((400, 401), pair)
    ]


def chosen(cells, method="softmax"):
    return plr.select(plr.selection_table(plr.runs_of(selection(method, cells)), method))


def test_the_best_16x_among_the_lrs_that_fit_1x_wins_over_a_better_lr_that_does_not():
    s = chosen({2e-3: ((99.5, 60), (99.5, 62)), 4e-3: ((99.0, 70), (100, 71)), 8e-3: ((98.5, 95), (100, 95))})
    assert s["lr"] == "4e-3" and "FLAGGED" not in s["how"] and s["fits"] == ["2e-3", "4e-3"]


def test_a_tie_within_half_a_point_goes_to_4e3_then_to_the_lower_lr():
    assert (
        chosen({2e-3: ((100, 80.5), (100, 80.5)), 4e-3: ((100, 80), (100, 80)), 8e-3: ((100, 80.5), (100, 80.5))})["lr"]
        == "4e-3"
    )  # 80.5 best; 80.0 within 0.5 of it
    s = chosen({2e-3: ((100, 80), (100, 80)), 4e-3: ((100, 70), (100, 70)), 8e-3: ((100, 80.5), (100, 80.5))})
    assert s["lr"] == "2e-3" and "2e-3, 8e-3" in s["how"]  # a factor 2 either side of 4e-3: the lower one
    s = chosen({2e-3: ((100, 80), (100, 80)), 4e-3: ((100, 70), (100, 70)), 8e-3: ((100, 81), (100, 81))})
    assert s["lr"] == "8e-3" and "tie" not in s["how"]  # a point apart is no tie


def test_no_lr_fitting_1x_falls_back_to_the_best_16x_and_says_so():
    s = chosen({2e-3: ((98, 60), (99.5, 62)), 4e-3: ((99.5, 70), (97, 71)), 8e-3: ((90, 50), (99, 50))})
    assert s["lr"] == "4e-3" and s["how"].startswith("FLAGGED") and s["fits"] == []


def test_a_missing_cell_or_length_leaves_the_method_pending():
    recs = selection(
        "softmax", {2e-3: ((100, 60), (100, 62)), 4e-3: ((100, 70), (100, 71)), 8e-3: ((100, 5), (100, 5))}
    )
    assert plr.select(plr.selection_table(plr.runs_of(recs), "asentmax"))["lr"] is None
    recs[-1]["results"] = recs[-1]["results"][:1]  # 8e-3 s401 without its 16x result
    s = plr.select(plr.selection_table(plr.runs_of(recs), "softmax"))
    assert s["lr"] is None and s["how"] == "pending" and s["mean16"]["8e-3"] is None and s["mean16"]["2e-3"] == 61


def test_a_later_record_wins_and_only_the_last_checkpoint_counts():
    recs = [
        record("lr_select_8e-3", "adatemp", 400, {64: 50, 1024: 25}, final_loss=0.5),
        record("lr_select_8e-3", "adatemp", 400, {64: 99, 1024: 75}, final_loss=0.25),
        record("lr_select_8e-3", "adatemp", 401, {64: 10, 1024: 10}, checkpoint="best"),
    ]
    runs = plr.runs_of(recs)
    assert runs["lr_select_8e-3", "adatemp", 400]["final_loss"] == 0.25
    assert plr._em(runs["lr_select_8e-3", "adatemp", 400], 1024) == 75
    assert runs["lr_select_8e-3", "adatemp", 401]["by_length"] == {}
    table = plr.selection_table(runs, "adatemp")
    assert table["8e-3"]["400"] == {"1x": 99.0, "16x": 75.0, "final_loss": 0.25}
    assert table["8e-3"]["401"] == {"1x": None, "16x": None, "final_loss": 0.001}


def confirmation(softmax64, asentmax64, seeds=(402, 403, 404), n=200):
    recs = []
    for s, a, b in zip(seeds, asentmax64, softmax64):
        recs.append(record("lr_confirm", "asentmax", s, {64: 99.9, 1024: 90, 4096: a, 16384: 10}, n=n))
        recs.append(record("lr_confirm", "softmax", s, {64: 99.5, 1024: 70, 4096: b, 16384: 5}, n=n))
    return plr.analyse(recs)["confirmation"]


@pytest.mark.parametrize(
    "softmax64, asentmax64, decision",
    [
        ((20, 30, 25), (70, 80, 60), "ASEntmax ahead at per-method lrs"),
        ((70, 80, 60), (20, 30, 25), "softmax ahead at per-method lrs"),
        ((50, 52, 48), (51, 50, 50), "no difference of practical size"),
        ((20, 50, 48), (70, 51, 50), "inconclusive"),  # robust only in one seed
        ((40, 40, 40), (45, 46, 47), "inconclusive"),  # every interval overlaps, but the mean is 6 points
    ],
)
def test_each_branch_of_the_decision_rule(softmax64, asentmax64, decision):
    assert confirmation(softmax64, asentmax64)["decision"] == decision


def test_the_decision_waits_for_every_seed_and_the_pair_is_per_seed():
    conf = confirmation((20, 30), (70, 80), seeds=(402, 403))
    assert conf["decision"].startswith("pending: 2 of 3")
    p = conf["asentmax_softmax"]["4096"]
    assert [r["seed"] for r in p["per_seed"]] == [402, 403] and p["mean"] == pytest.approx(50)
    assert all(r["disjoint"] for r in p["per_seed"]) and p["robust"]
    assert conf["adatemp_softmax"]["4096"]["n"] == 0


def test_the_command_prints_and_writes_the_analysis_and_bad_input_is_one_line(tmp_path, capsys):
    store = tmp_path / "store"
    store.mkdir()
    recs = selection(
        "softmax", {2e-3: ((100, 60), (100, 62)), 4e-3: ((100, 70), (100, 71)), 8e-3: ((100, 5), (100, 5))}
    )
    for r in recs:  # a complete store record
        r.update(format="longsparse-record", version=2, task="mqmtar_inline", preset="cpu", positions="nape",
                 config_hash="0", code_commit=None, date=None, test_seed=20261128, train_hi=64, source="test")  # fmt: skip
    (store / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "out"
    assert main(["findings", "per-method-lr", "--store", str(store), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "- softmax: **4e-3** (the best 16× among the lrs fitting 1×)" in printed
    assert "- asentmax: pending" in printed and "not run yet." in printed
    a = json.loads((out / "analysis.json").read_text())
    assert a["format"] == "longsparse-per-method-lr-analysis" and a["selection"]["selected"]["softmax"]["lr"] == "4e-3"
    assert (out / "analysis.md").read_text().endswith(printed.split("wrote ")[0])
    assert main(["findings", "per-method-lr", "--store", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no records in the store" in err


def test_the_committed_analysis_rerenders(tmp_path, monkeypatch):
    """`longsparse findings per-method-lr --out docs/findings/per_method_lr` made the committed files from the
    committed store; the same command today makes them byte for byte, with every run of both stages in it."""
    monkeypatch.chdir(REPO_ROOT)
    assert main(["findings", "per-method-lr", "--out", str(tmp_path)]) == 0
    for name in ("analysis.json", "analysis.md"):
        committed = REPO_ROOT / "docs" / "findings" / "per_method_lr" / name
        assert (tmp_path / name).read_bytes() == committed.read_bytes(), f"{committed} differs from its re-rendering"
    a = json.loads((tmp_path / "analysis.json").read_text())
    assert sum(len(seeds) for seeds in a["confirmation"]["runs"].values()) == 9
    assert a["confirmation"]["decision"] == "inconclusive"
