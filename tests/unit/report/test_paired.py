"""The seed-level paired analysis (longsparse.report.paired) and `reproduce --analyse`."""

from __future__ import annotations

import json
import statistics

import pytest

from longsparse.report import paired
from longsparse_experiments.cli import main


def test_sign_flip_is_exact():
    assert paired.sign_flip_p([1.0, 2.0, 3.0]) == 2 / 8  # only all-plus and all-minus reach |sum| = 6
    assert paired.sign_flip_p([5.0] * 6) == 2 / 64
    assert paired.sign_flip_p([1.0, -1.0]) == 1.0  # every pattern is at least as far as 0
    # [3, -1]: patterns sum to 2, 4, -4, -2; |sum| >= 2 for all four
    assert paired.sign_flip_p([3.0, -1.0]) == 1.0
    # [3, 1, 1]: |sums| are 5, 3, 3, 1 (each twice): only the two patterns with |sum| = 5 are as far as observed
    assert paired.sign_flip_p([3.0, 1.0, 1.0]) == 2 / 8
    assert paired.sign_flip_p([3.0, 1.0, -1.0]) == 6 / 8  # observed 3: |sums| 5, 3, 3 (x2) reach it
    with pytest.raises(ValueError, match="1 to 16"):
        paired.sign_flip_p([])


def test_bootstrap_interval():
    assert paired.bootstrap_mean_interval([2.0] * 5) == (2.0, 2.0)
    xs = [1.0, 4.0, 2.0, 8.0, 5.0, 3.0]
    lo, hi = paired.bootstrap_mean_interval(xs)
    assert min(xs) <= lo < statistics.fmean(xs) < hi <= max(xs)
    assert paired.bootstrap_mean_interval(xs) == (lo, hi)  # seeded: the same on every rebuild


# Student t 0.975 quantiles from the standard tables (df: value, 3 decimals)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 10: 2.228, 30: 2.042}


@pytest.mark.parametrize("df", sorted(T975))
def test_t_quantile_matches_the_tables(df):
    assert round(paired.t_quantile(0.975, df), 3) == T975[df]


def test_t_quantile_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in range(1, 41):
        for q in (0.6, 0.9, 0.95, 0.975, 0.995):
            assert paired.t_quantile(q, df) == pytest.approx(stats.t.ppf(q, df), abs=1e-8)


@pytest.mark.parametrize("q, df", [(0.5, 3), (1.0, 3), (0.975, 0), (0.975, 2.5)])
def test_t_quantile_bad_input(q, df):
    with pytest.raises(ValueError, match="t_quantile"):
        paired.t_quantile(q, df)


def test_t_interval():
    xs = [32.5, 33.0, 69.0, 43.0, 54.0, 23.5]
    half = 2.5705818356 * statistics.stdev(xs) / 6**0.5
    lo, hi = paired.t_mean_interval(xs)
    assert lo == pytest.approx(statistics.fmean(xs) - half) and hi == pytest.approx(statistics.fmean(xs) + half)
    assert paired.t_mean_interval([5.0]) is None and paired.t_mean_interval([]) is None
    assert paired.t_mean_interval([100.0, 0.0]) == (-100.0, 100.0)  # clipped to the range a difference can take
    wide = paired.t_mean_interval([100.0, 0.0], bounds=(-float("inf"), float("inf")))
    assert wide[0] < -100 and wide[1] > 100
    # with few seeds the bootstrap cannot reach past the seeds themselves; the t-interval does
    b_lo, b_hi = paired.bootstrap_mean_interval([1.0, 9.0])
    t_lo, t_hi = paired.t_mean_interval([1.0, 9.0])
    assert b_lo >= 1.0 and b_hi <= 9.0 and t_lo < b_lo and t_hi > b_hi


def test_intercept_recovers_a_line():
    delta = [0.0, 1.0, 2.0, 3.0, 4.0]
    r = paired.intercept_interval([2.0 + 3.0 * x for x in delta], delta)
    assert r["a"] == pytest.approx(2.0) and r["b"] == pytest.approx(3.0)
    assert r["a_ci"][0] == pytest.approx(2.0) and r["a_ci"][1] == pytest.approx(2.0)
    assert paired.intercept_interval([1.0, 2.0], [0.0, 0.0])["a"] is None  # no spread in delta


@pytest.mark.parametrize(
    "ci,p,verdict",
    [
        ((1.0, 9.0), 0.03, "supported"),
        ((1.0, 9.0), 0.06, "inconclusive"),
        ((-9.0, -1.0), 0.03, "refuted"),
        ((-4.0, 4.0), 0.9, "refuted"),
        ((-1.0, 9.0), 0.2, "inconclusive"),
    ],
)
def test_decision_rule(ci, p, verdict):
    assert paired.decide(ci, p, margin=5.0) == verdict


def _archive(em: dict[str, dict[int, list[float]]], n: int = 200, study: str = "s") -> dict:
    """A study archive with exact match per method, length and seed (seeds 100, 101, ...)."""
    from longsparse.stats import wilson_interval

    series = {}
    for m, by_L in em.items():
        series[f"{m}/nape"] = {
            "last": {
                str(L): {
                    "per_seed": {
                        str(100 + i): {"exact_match": x, "n": n, "ci": list(wilson_interval(round(x * n), n))}
                        for i, x in enumerate(xs)
                    }
                }
                for L, xs in by_L.items()
            }
        }
    return {"format": "longsparse-reproduce", "studies": {study: {"series": series}}}


def test_robust_needs_one_sign_disjoint_intervals_and_two_seeds():
    """`is_robust`, the one rule every seed-level analysis uses: over one seed "every seed" holds trivially, so
    one seed is never robust, however far apart its runs are; a caller may ask for more seeds."""
    far = {"d": 50.0, "disjoint": True}
    assert not paired.is_robust([far])
    assert paired.is_robust([far, far]) and not paired.is_robust([far, far], min_seeds=3)
    assert not paired.is_robust([far, {"d": -50.0, "disjoint": True}])  # signs differ
    assert not paired.is_robust([far, {"d": 1.0, "disjoint": False}])  # one seed's intervals overlap
    assert not paired.is_robust([far, {"d": 0.0, "disjoint": False}])  # a tie has no sign
    one = _archive({"asentmax": {4096: [0.9]}, "softmax": {4096: [0.1]}})
    r = paired.compare(one["studies"], "asentmax", "softmax", 4096)
    assert r["per_seed"][0]["disjoint"] and not r["robust"]


def test_compare_and_analyse():
    arch = _archive(
        {
            "asentmax": {64: [1.0, 0.99, 1.0], 4096: [0.9, 0.8, 0.7]},
            "softmax": {64: [1.0, 0.98, 0.99], 4096: [0.5, 0.6, 0.69]},
        }
    )
    r = paired.compare(arch["studies"], "asentmax", "softmax", 4096, id_length=64)
    assert r["seeds"] == [100, 101, 102]
    assert [round(x["d"], 6) for x in r["per_seed"]] == [40.0, 20.0, 1.0]
    assert r["positive"] == 3 and r["p"] == 0.25
    assert not r["robust"]  # seed 102: 70 vs 69 % overlap
    assert [x["disjoint"] for x in r["per_seed"]] == [True, True, False]
    res = paired.analyse(arch, [("asentmax", "softmax")], endpoint=4096, lengths=[4096], id_length=64, margin=5)
    assert res["pairs"][0]["verdict"] == "inconclusive"  # p = 0.25 with 3 seeds
    assert res["pairs"][0]["converged"]["seeds"] == [100, 102]  # seed 101: softmax 98 % at 1x
    assert res["pairs"][0]["converged"]["at_bar"] == {"a": 3, "b": 2}
    assert [round(x["d_id"], 6) for x in r["per_seed"]] == [0.0, 1.0, 1.0]  # the 1x difference per seed
    md = paired.markdown(res)
    assert "+20.3 points" in md and "inconclusive" in md and "| 100 | 90.0 | 50.0 | +40.0* | +0.0 |" in md
    assert "Seeds where both reach ≥ 99 % at 1× (2)" in md
    # every interval is reported as a t-interval beside the bootstrap (which covers far less than 95 % at 3 seeds)
    assert r["t_ci"] == pytest.approx(paired.t_mean_interval([40.0, 20.0, 1.0]))
    lo, hi = r["t_ci"]
    assert f"t-interval [{lo:+.1f}, {hi:+.1f}]" in md and "| 95 % t-interval |" in md
    assert f"| 3 | +20.3 | [{lo:+.1f}, {hi:+.1f}] | {paired._fmt_ci(r['ci'])} | 0.250 |" in md


def test_markdown_says_when_no_seed_has_both_runs_converged():
    """An empty converged subset is a result (the secondary endpoint), not a line to leave out."""
    arch = _archive(
        {
            "asentmax": {64: [0.995, 0.99, 1.0], 4096: [0.9, 0.8, 0.7]},
            "softmax": {64: [0.985, 0.98, 0.97], 4096: [0.5, 0.6, 0.4]},
        }
    )
    res = paired.analyse(arch, [("asentmax", "softmax")], endpoint=4096, lengths=[4096], id_length=64, margin=5)
    conv = res["pairs"][0]["converged"]
    assert conv["seeds"] == [] and conv["at_bar"] == {"a": 3, "b": 0} and conv["of_seeds"] == 3
    md = paired.markdown(res)
    assert "No seed has both runs at ≥ 99 % at 1× (asentmax reaches it in 3 of 3 seeds, softmax in 0)." in md
    assert "| 102 | 70.0 | 40.0 | +30.0* | +3.0 |" in md


def test_cli_analyse(tmp_path, capsys):
    from longsparse_experiments.presets import presets_dir

    study = presets_dir() / "reproduce" / "prereg_mqmtar.toml"
    rep = tmp_path / "rep"
    rep.mkdir()

    def six(x):
        return [x] * 6

    (rep / "results.json").write_text(
        json.dumps(
            _archive(
                {
                    "asentmax": {64: six(1.0), 1024: six(0.9), 4096: [0.8, 0.7, 0.9, 0.6, 0.75, 0.85], 16384: six(0.3)},
                    "softmax": {64: six(1.0), 1024: six(0.8), 4096: six(0.5), 16384: six(0.1)},
                },
                study="prereg_primary",
            )
        )
    )
    assert (
        main(["reproduce", "synthetic", "--config", str(study), "--report", str(rep), "--analyse", "asentmax-softmax"])
        == 0
    )
    res = json.loads((rep / "analysis.json").read_text())
    prim = res["pairs"][0]
    assert res["endpoint"] == 4096 and prim["verdict"] == "supported" and prim["primary"]["p"] == 2 / 64
    assert "supported" in (rep / "analysis.md").read_text()
    assert main(["reproduce", "synthetic", "--config", str(study), "--report", str(rep), "--analyse", "asentmax"]) != 0
    assert "A-B" in capsys.readouterr().err
