"""The cross-study analyses of docs/findings.md (``longsparse findings``, ``longsparse_experiments.findings``):
re-rendered from the committed records, byte for byte equal to the committed outputs; their statistics on small
hand-checked inputs; bad input refused with one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

from longsparse.io import ForeignFileError
from longsparse.report import paired
from longsparse_experiments.cli import main
from longsparse_experiments.findings import cross_study, interval_coverage
from longsparse_experiments.findings.sources import Stores, pseudo, series

ROOT = REPO_ROOT
FINDINGS = ROOT / "docs" / "findings"


def _png_software(data: bytes) -> str | None:
    found = re.search(rb"tEXtSoftware\x00([^\x00]*?), https", data)
    return found.group(1).decode() if found else None


def _assert_same_outputs(made: Path, committed: Path, names) -> None:
    """Every named file equal byte for byte; a PNG only where this matplotlib made the committed one (another
    version renders other bytes), else it must be a PNG."""
    try:
        import matplotlib

        mpl = f"Matplotlib version{matplotlib.__version__}"
    except ImportError:
        mpl = None
    for name in names:
        want = (committed / name).read_bytes()
        if name.endswith(".png"):
            if mpl is None:
                continue  # forest_plot draws nothing without matplotlib
            got = (made / name).read_bytes()
            assert got.startswith(b"\x89PNG"), name
            if _png_software(want) != mpl:
                continue
        else:
            got = (made / name).read_bytes()
        assert got == want, f"{committed / name} differs from its re-rendering {made / name}"


def test_cross_study_rerenders_the_committed_analyses(tmp_path):
    out = cross_study.run_cross_study(ROOT, tmp_path, log=lambda *_: None)
    for name, files in cross_study.ANALYSES.items():
        _assert_same_outputs(out / name, FINDINGS / name, files)
        assert json.loads((FINDINGS / name / ".longsparse-outputs.json").read_text())["files"] == {
            f: cross_study.WRITER for f in files
        }
    _assert_same_outputs(out, FINDINGS, [cross_study.COMBINED_FOREST])


@pytest.mark.slow
def test_interval_coverage_rerenders_the_committed_simulation(tmp_path):
    pytest.importorskip("numpy")
    d = interval_coverage.run_interval_coverage(tmp_path, log=lambda *_: None)
    _assert_same_outputs(d, FINDINGS / interval_coverage.NAME, interval_coverage.OUTPUTS)


# ---- the statistics on hand-checked inputs ------------------------------------------------------------------
def test_perplexity_difference_by_hand():
    ppl = {
        ("a", "nape", 0): {"128": {"ppl": 10.0}},
        ("a", "nape", 1): {"128": {"ppl": 12.0}},
        ("a", "nape", 2): {"128": {"ppl": 99.0}},  # no B run of seed 2: not paired
        ("b", "nape", 0): {"128": {"ppl": 8.0}},
        ("b", "nape", 1): {"128": {"ppl": 8.0}},
    }
    r = cross_study.perplexity_difference(("a", "nape"), ("b", "nape"), "128", ppl)
    assert r["seeds"] == [0, 1] and r["d"] == [2.0, 4.0] and r["mean"] == 3.0
    assert r["a_ppl"] == [10.0, 12.0] and r["b_ppl"] == [8.0, 8.0] and r["a"] == "a/nape" and r["length"] == 128
    # sign patterns of (2, 4): means 3, 1, -1, -3; two of four are as far from 0 as 3
    assert r["p"] == 0.5
    # two seeds: sd = sqrt(2), standard error 1, t(0.975, 1) = 12.706 (tables); not clipped to +-100
    assert r["t_ci"] == pytest.approx((3 - 12.706, 3 + 12.706), abs=1e-3)
    # resamples of two values have means 2, 3 or 4 (probability 1/4, 1/2, 1/4): the 2.5 and 97.5 % points are 2, 4
    assert r["ci"] == (2.0, 4.0)
    with pytest.raises(ValueError, match="no seed has both a/nape and b/rope"):
        cross_study.perplexity_difference(("a", "nape"), ("b", "rope"), "128", ppl)


def test_lm_markdown_by_hand():
    row = {
        "a": "a/nape",
        "b": "b/nape",
        "length": 1024,
        "seeds": [0, 1],
        "a_ppl": [10.0, 12.0],
        "b_ppl": [8.0, 8.0],
        "mean": 3.0,
        "t_ci": (-9.706, 15.706),
        "ci": (2.0, 4.0),
        "p": 0.5,
    }
    text = cross_study.lm_markdown("note", [row], {"r0": {"1": 0.0, "2": 0.025}, "r1": {"1": 0.0}})
    assert "| a/nape − b/nape | 1024 (8×) | 2 | 10.00 / 8.00, 12.00 / 8.00 | +3.00 | [-9.71, +15.71] | " in text
    assert "[+2.00, +4.00] | 0.500 |" in text
    assert text.endswith("all 2 runs × lengths 1×–16× (40 examples each): highest value 2 %.\n")


def _hsa_record(run, lengths_em, date="2026-11-21"):
    return {
        "run": run,
        "date": date,
        "results": [{"length": L, "exact_match": em, "ci": [0, 1], "n": 8} for L, em in lengths_em],
    }


def test_hsa_series_takes_the_later_evaluation_and_only_its_runs():
    records = [
        _hsa_record("hsa_full/fl_full_s1", [(16384, 0.25), (1024, 0.5)]),
        _hsa_record("hsa_full/fl_full_s0", [(16384, 1.0)]),
        _hsa_record("hsa_full/fl_full_s1", [(16384, 0.75)]),  # later: wins
        _hsa_record("hsa/fl_full_s0", [(16384, 0.0)]),  # another study
        _hsa_record("hsa_full/fl_full_sx", [(16384, 0.0)]),  # no seed number
        _hsa_record("hsa_full/fl_full_long_s0", [(16384, 0.0)]),  # another run prefix
    ]
    named = cross_study.hsa_series(records)
    assert list(named["hsa"]) == ["1024", "16384"]  # lengths ascending
    assert list(named["hsa"]["16384"]) == ["0", "1"]  # seeds sorted
    assert named["hsa"]["16384"]["1"] == {"exact_match": 0.75, "ci": [0, 1], "n": 8}
    assert named["hsa"]["16384"]["0"]["exact_match"] == 1.0 and named["swa_only"] == {}
    table = cross_study.hsa_per_run_table({"hsa": named["hsa"]}, lengths=("1024", "16384", "65536"))
    assert "| run | 1,024 | 16,384 | 65,536 |\n|---|---|---|---|" in table
    assert "| hsa (fl_full) | s1 50 (8) | s0 100 (8) / s1 75 (8) | not run |" in table


def test_pseudo_view_feeds_the_paired_analysis():
    rec = {"ci": [0.0, 1.0], "n": 10}
    named = {
        "x.one": {"64": {0: {**rec, "exact_match": 0.9}, 1: {**rec, "exact_match": 0.8}}},
        "x.two": {"64": {0: {**rec, "exact_match": 0.5}, 1: {**rec, "exact_match": 0.6}}},
    }
    view = pseudo(named)
    assert series(view["studies"]["x"], "x.one") == {"64": {"0": named["x.one"]["64"][0], "1": named["x.one"]["64"][1]}}
    res = paired.analyse(view, [("x.one", "x.two")], endpoint=64, lengths=[64], id_length=64, margin=5.0)
    r = res["pairs"][0]["by_length"]["64"]
    assert r["mean"] == pytest.approx(30.0) and [s["d"] for s in r["per_seed"]] == pytest.approx([40.0, 20.0])


def test_beyond_takes_the_later_record_of_a_run_at_the_length():
    st = Stores("/nonexistent")

    def rec(seed, em, length=16384, study="s", ckpt="last"):
        r = {"length": length, "checkpoint": ckpt, "exact_match": em, "ci": [0, 1], "n": 20, "other": 1}
        return {"study": study, "method": "asentmax", "seed": seed, "results": [r]}

    st._records["store"] = [
        rec(0, 0.1),
        rec(0, 0.2),
        rec(1, 0.3, length=64),
        rec(1, 0.4, study="t"),
        rec(1, 0.5, ckpt="best"),
    ]
    assert st.beyond("store", "s", 16384) == {"asentmax": {"0": {"exact_match": 0.2, "ci": [0, 1], "n": 20}}}


def test_covers_zero_by_hand():
    np = pytest.importorskip("numpy")
    # 4 resamples enumerating the patterns of two seeds: the percentile positions 0 and 3 are the min and max mean
    idx = np.array([[[0, 0], [0, 1], [1, 0], [1, 1]]] * 2)
    boot, t = interval_coverage.covers_zero(np.array([[-1.0, 1.0], [1.0, 2.0]]), idx)
    assert boot.tolist() == [True, False]  # [-1, 1] holds 0; [1, 2] does not
    assert t.tolist() == [True, True]  # 1.5 +- 12.706 * 0.7071 / 1.414 = 1.5 +- 6.35 holds 0
    # three seeds 1, 1.1, 1.2: mean 1.1, sd 0.1, t(0.975, 2) = 4.303: 1.1 +- 0.248 does not hold 0
    idx3 = np.zeros((1, 4, 3), dtype=int)
    boot, t = interval_coverage.covers_zero(np.array([[1.0, 1.1, 1.2]]), idx3)
    assert boot.tolist() == [False] and t.tolist() == [False]


def test_coverage_at_two_seeds_is_a_half_for_the_bootstrap():
    """With two seeds the bootstrap interval is [min, max] (up to resampling noise), which holds the true mean 0
    exactly when the two draws have opposite signs: probability 1/2; the t-interval holds it 95 % of the time."""
    np = pytest.importorskip("numpy")
    r = interval_coverage.coverage(2, np.random.default_rng(1), trials=1000)
    assert r["seeds"] == 2 and r["t_quantile"] == pytest.approx(12.706, abs=1e-3)
    assert abs(r["bootstrap"] - 0.5) < 0.06 and abs(r["t"] - 0.95) < 0.025  # > 3 binomial standard errors


# ---- the command ---------------------------------------------------------------------------------------------
def test_cross_study_without_the_stores_is_one_line(tmp_path, capsys):
    assert main(["findings", "cross-study", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no records in" in err and "--root" in err


def test_cross_study_never_replaces_a_file_it_did_not_write(tmp_path):
    foreign = tmp_path / "hsa_passkey" / "analysis.md"
    foreign.parent.mkdir()
    foreign.write_text("mine")
    with pytest.raises(ForeignFileError, match="analysis.md exists and was not written by"):
        cross_study.run_cross_study(ROOT, tmp_path, log=lambda *_: None)
    assert foreign.read_text() == "mine" and not (tmp_path / "positions_mqmtar" / "analysis.json").exists()


def test_the_committed_simulation_belongs_to_its_command():
    """`longsparse findings interval-coverage --out docs/findings` may rewrite the committed files."""
    manifest = json.loads((FINDINGS / interval_coverage.NAME / ".longsparse-outputs.json").read_text())
    assert manifest["files"] == {f: interval_coverage.WRITER for f in interval_coverage.OUTPUTS}
