"""The quick study and the quick LM study produce the numbers stored in tests/data/quick_studies (recorded with
`longsparse reproduce synthetic --quick` and `longsparse lm run --quick`): moving or restructuring code must not
change what a command computes. Dates, commits and wall-clock times are not compared; floats are compared to a
relative 1e-5 (room for summation-order rounding, not for a changed computation); config hashes exactly (the
results store matches records to cells by them, so a changed hash orphans every stored result).

To record new expected numbers after an intended change, rerun the two commands and copy
``report/records.jsonl`` and the ``runs`` of ``report/lm_results.json`` (the keys kept in lm_runs.json) here."""

from __future__ import annotations

import json
import math

import pytest
from helpers.paths import DATA
from helpers.records import NOT_COMPARED

from longsparse.report.store import read_records
from longsparse_experiments.cli import main

EXPECTED = DATA / "quick_studies"


def differences(want, got, where: str = "") -> list[str]:
    """Where ``got`` differs from ``want`` (nested dicts / lists; floats to a relative 1e-5 or an absolute 1e-8;
    NOT_COMPARED keys skipped). The absolute floor is for differences of nearly equal numbers (a Δ NLL of 2e-4
    between two NLLs near 1 carries their float32 rounding, ~1e-9, which is far more than 1e-5 of the Δ)."""
    if isinstance(want, dict) and isinstance(got, dict):
        keys = (set(want) | set(got)) - NOT_COMPARED
        return [
            d
            for k in sorted(keys, key=str)
            for d in (
                differences(want[k], got[k], f"{where}.{k}")
                if k in want and k in got
                else [f"{where}.{k}: {'missing' if k in want else 'unexpected'}"]
            )
        ]
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{where}: {len(got)} items, expected {len(want)}"]
        return [d for i, (a, b) in enumerate(zip(want, got)) for d in differences(a, b, f"{where}[{i}]")]
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        same = math.isclose(want, got, rel_tol=1e-5, abs_tol=1e-8) or (math.isnan(want) and math.isnan(got))
        return [] if same else [f"{where}: {got!r}, expected {want!r}"]
    return [] if want == got and type(want) is type(got) else [f"{where}: {got!r}, expected {want!r}"]


def test_differences_sees_changed_numbers_and_ignores_timings():
    want = {"a": 1.0, "n": 6, "date": "x", "r": [{"em": 0.5, "train_seconds": 1.0}]}
    assert differences(want, {**want, "date": "y", "r": [{"em": 0.5 + 1e-9, "train_seconds": 9.0}]}) == []
    assert differences(want, {**want, "a": 1.001}) == [".a: 1.001, expected 1.0"]
    assert differences({"d": -2.2967656e-4}, {"d": -2.2967408e-4}) == []  # a Δ NLL, rounding of its two NLLs
    assert differences({"d": -2.2967656e-4}, {"d": -2.2e-4}) == [".d: -0.00022, expected -0.00022967656"]
    assert differences(want, {**want, "n": 7}) == [".n: 7, expected 6"]
    assert differences(want, {**want, "r": []}) == [".r: 0 items, expected 1"]
    assert differences({"h": "a362"}, {"h": "a363"}) == [".h: 'a363', expected 'a362'"]


@pytest.mark.slow
def test_quick_study_gives_the_stored_records(tmp_path):
    assert (
        main(
            ["reproduce", "synthetic", "--quick", "--out", str(tmp_path / "runs"), "--report", str(tmp_path / "report")]
        )
        == 0
    )
    want = [json.loads(line) for line in (EXPECTED / "reproduce_records.jsonl").read_text().splitlines() if line]
    got = read_records(tmp_path / "report")
    assert differences(want, got) == []


@pytest.mark.slow
def test_quick_lm_study_gives_the_stored_numbers(tmp_path):
    assert main(["lm", "run", "--quick", "--out", str(tmp_path / "lm")]) == 0
    want = json.loads((EXPECTED / "lm_runs.json").read_text())
    got = json.loads((tmp_path / "lm" / "report" / "lm_results.json").read_text())["runs"]
    assert differences(want, [{k: r[k] for k in want[0]} for r in got]) == []
