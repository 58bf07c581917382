"""``longsparse findings matched-convergence``: matched runs, the paired differences at equal fit, the gains from
more training and the protocol's decision (docs/reports/2026-11-27-matched-convergence.md), on hand-made archives
checked by hand; the committed archives read; bad input in one line."""

from __future__ import annotations

import json

import pytest
from helpers.paths import REPO_ROOT

from longsparse.stats import wilson_interval
from longsparse_experiments.cli import main
from longsparse_experiments.findings import matched_convergence as mc

N = {64: 1000, 1024: 200, 4096: 200, 16384: 100}


def _archive(study: str, runs: dict) -> dict:
    """An archive of one study: runs {(method, seed): (steps, {length: exact match %})}."""
    series: dict = {}
    infos = {}
    for (method, seed), (steps, ems) in runs.items():
        infos[f"{study}/{method}-nape-s{seed}"] = {"steps": steps, "final_loss": steps * 1e-7}
        for L, em in ems.items():
            k = round(em * N[L] / 100)
            rec = {"exact_match": k / N[L], "ci": list(wilson_interval(k, N[L])), "n": N[L]}
            series.setdefault(f"{method}/nape", {"last": {}})["last"].setdefault(str(L), {"per_seed": {}})["per_seed"][
                str(seed)
            ] = rec
    return {"studies": {study: {"series": series, "runs": infos}}}


def _ems(one: float, x64: float) -> dict:
    return {64: one, 1024: x64 + 10, 4096: x64, 16384: x64 / 2}


def _prereg(seeds=(0, 1, 2)) -> dict:
    runs = {}
    for s in seeds:
        runs[("softmax", s)] = (4000, _ems(98.0, 10.0 + s))
        runs[("asentmax", s)] = (4000, _ems(99.5 if s else 99.0, 50.0 + s))
        runs[("adatemp", s)] = (4000, _ems(99.6, 60.0))
    return _archive("prereg", runs)


def test_matched_is_the_smallest_budget_at_the_bar_and_pending_below_the_cap():
    fit = {"by_length": {64: {"exact_match": 0.995}}}
    under = {"by_length": {64: {"exact_match": 0.994}}}
    assert mc.matched({4000: under, 8000: fit, 16000: fit}) == {"status": "matched", "steps": 8000}
    assert mc.matched({4000: under, 8000: under}) == {"status": "pending", "steps": 8000}
    assert mc.matched({4000: under, 8000: under, 16000: under}) == {"status": "never matched", "steps": 16000}
    assert mc.fits({"by_length": {}}) is None


def test_a_complete_study_by_hand():
    """softmax: s0 matched at 8,000, s1 at 16,000, s2 never; ASEntmax s0 retrained to 8,000, s1 and s2 as recorded."""
    retrained = _archive(
        "matched",
        {
            ("softmax", 0): (8000, _ems(99.5, 30.0)),
            ("softmax", 1): (8000, _ems(99.0, 20.0)),
            ("softmax", 2): (8000, _ems(99.0, 20.0)),
            ("asentmax", 0): (8000, _ems(100.0, 80.0)),
        },
    )
    retrained["studies"].update(
        _archive("stage2", {("softmax", 1): (16000, _ems(99.7, 40.0)), ("softmax", 2): (16000, _ems(99.2, 45.0))})[
            "studies"
        ]
    )
    a = mc.analyse(_prereg(), retrained)
    st = {s: a["runs"]["softmax"][s]["status"] for s in ("0", "1", "2")}
    assert st == {
        "0": {"status": "matched", "steps": 8000},
        "1": {"status": "matched", "steps": 16000},
        "2": {"status": "never matched", "steps": 16000},
    }
    p = a["primary"]  # ASEntmax − softmax at 64x over s0, s1 (s2: softmax never matched)
    assert [r["seed"] for r in p["per_seed"]] == [0, 1]
    assert [r["d"] for r in p["per_seed"]] == pytest.approx([80.0 - 30.0, 51.0 - 40.0])
    assert p["mean"] == pytest.approx((50.0 + 11.0) / 2) and p["p"] == pytest.approx(0.5)
    assert a["pending"] == []
    # softmax's gain at 64x: reported run − 4,000 steps, every retrained seed (s2 with its 16,000-step run)
    g = a["gain"]["softmax"]["4096"]
    assert [r["d"] for r in g["per_seed"]] == pytest.approx([30.0 - 10.0, 40.0 - 11.0, 45.0 - 12.0])
    assert a["gain"]["asentmax"]["4096"]["n"] == 1  # s1, s2 matched at 4,000: not retrained
    # D(64x) = +50, +11: t-interval ±248 around +30.5 covers 0; the gain +20, +29, +33: 27.3 ± 4.30 · 6.66 / √3
    # = [+10.8, +43.8], above 0
    assert g["t_ci"] == pytest.approx((10.8, 43.8), abs=0.1)
    assert a["decision"] == "explained by convergence"
    assert a["adatemp_softmax"]["4096"]["n"] == 2
    # robust: D(64x) positive in both seeds (+50, +11) with disjoint Wilson intervals only in s0 (n = 200 each)
    assert [r["disjoint"] for r in p["per_seed"]] == [True, False] and not p["robust"]


def test_one_seed_is_never_robust():
    """While the other seeds are pending, a pair over one matched seed has no seed-level evidence."""
    retrained = _archive(
        "matched", {("softmax", 0): (8000, _ems(99.5, 10.0)), ("asentmax", 0): (8000, _ems(100.0, 90.0))}
    )
    p = mc.analyse(_prereg(), retrained)["primary"]
    assert p["n"] == 1 and p["per_seed"][0]["disjoint"] and not p["robust"]


def test_decisions():
    pos = {"n": 6, "t_ci": (5.0, 20.0), "p": 0.031}
    cover = {"n": 6, "t_ci": (-5.0, 20.0), "p": 0.2}
    gain_up, gain_flat = {"t_ci": (1.0, 9.0)}, {"t_ci": (-1.0, 9.0)}
    assert mc.decide(pos, gain_flat, []) == "extrapolates better at equal fit"
    assert mc.decide({"n": 6, "t_ci": (-20.0, -5.0), "p": 0.031}, gain_flat, []) == "softmax ahead at equal fit"
    assert mc.decide(cover, gain_up, []) == "explained by convergence"
    assert mc.decide(cover, gain_flat, []) == "inconclusive"
    assert mc.decide({"n": 1, "t_ci": None}, gain_up, []) == "inconclusive (fewer than 2 matched pairs)"
    assert mc.decide(pos, gain_up, ["softmax s1"]).startswith("pending: softmax s1")
    assert mc.decide({"n": 5, "t_ci": (5.0, 20.0), "p": 0.0625}, gain_flat, []) == "inconclusive"


def test_the_committed_archives_are_read_and_no_run_is_pending():
    a = mc.analyse(
        json.loads((REPO_ROOT / "results/prereg_mqmtar/results.json").read_text()),
        json.loads((REPO_ROOT / "results/matched_convergence/results.json").read_text()),
    )
    assert set(a["runs"]) == {"softmax", "asentmax", "adatemp"}
    assert all(len(seeds) == 6 for seeds in a["runs"].values())
    assert a["runs"]["asentmax"]["102"]["status"] == {"status": "matched", "steps": 4000}  # at the bar as recorded
    # stage 2 is complete: every softmax seed is matched or, at the 16,000-step cap, never matched
    assert {r["status"]["status"] for r in a["runs"]["softmax"].values()} <= {"matched", "never matched"}
    assert not a["decision"].startswith("pending:")


def test_the_command_writes_its_files_and_bad_input_is_one_line(tmp_path, capsys):
    pre, ret = tmp_path / "pre", tmp_path / "ret"
    pre.mkdir(), ret.mkdir()
    (pre / "results.json").write_text(json.dumps(_prereg()))
    (ret / "results.json").write_text(json.dumps(_archive("m", {("softmax", 0): (8000, _ems(99.6, 30.0))})))
    out = tmp_path / "out"
    assert (
        main(["findings", "matched-convergence", "--prereg", str(pre), "--matched", str(ret), "--out", str(out)]) == 0
    )
    assert json.loads((out / "analysis.json").read_text())["format"] == "longsparse-matched-convergence-analysis"
    assert "**Decision**" in (out / "analysis.md").read_text() and "| softmax | 0 | 8,000 |" in capsys.readouterr().out
    assert main(["findings", "matched-convergence", "--prereg", str(tmp_path / "none"), "--matched", str(ret)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no study archive" in err
    (pre / "results.json").write_text(json.dumps({"studies": {}}))
    assert main(["findings", "matched-convergence", "--prereg", str(pre), "--matched", str(ret)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no softmax and ASEntmax runs" in err


def test_the_committed_analysis_rerenders(tmp_path, monkeypatch):
    """`longsparse findings matched-convergence --out docs/findings/matched_convergence` made the committed files
    from the committed archives; the same command today makes them byte for byte."""
    monkeypatch.chdir(REPO_ROOT)
    assert main(["findings", "matched-convergence", "--out", str(tmp_path)]) == 0
    for name in ("analysis.json", "analysis.md"):
        committed = REPO_ROOT / "docs" / "findings" / "matched_convergence" / name
        assert (tmp_path / name).read_bytes() == committed.read_bytes(), f"{committed} differs from its re-rendering"
