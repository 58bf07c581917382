"""The per-method lr selection rule (results/per_method_lr/select.py) against the protocol's wording
(docs/reports/2026-11-27-per-method-lr.md): the fit bar, the 16x criterion, the tie rule, the flagged fallback,
pending cells, and reading the records."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sel():
    spec = importlib.util.spec_from_file_location("lr_select", ROOT / "results" / "per_method_lr" / "select.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def grid(cells):
    """{(method, lr, seed): {64: 1x, 1024: 16x}} for softmax from {lr: ((1x s400, 16x s400), (1x s401, 16x s401))}."""
    return {("softmax", lr, s): {64: a, 1024: b} for lr, pair in cells.items() for s, (a, b) in zip((400, 401), pair)}


def test_the_best_16x_among_the_lrs_that_fit_1x_wins_over_a_better_lr_that_does_not(sel):
    em = grid({2e-3: ((99.5, 60), (99.2, 62)), 4e-3: ((99.0, 70), (99.9, 71)), 8e-3: ((98.9, 95), (100, 95))})
    lr, how = sel.select(em, "softmax")
    assert lr == 4e-3 and "FLAGGED" not in how


def test_a_tie_within_half_a_point_goes_to_4e3_then_to_the_lower_lr(sel):
    em = grid({2e-3: ((100, 80.1), (100, 80.1)), 4e-3: ((100, 80.0), (100, 80.0)), 8e-3: ((100, 80.4), (100, 80.4))})
    assert sel.select(em, "softmax")[0] == 4e-3  # 80.4 best; 80.1 and 80.0 within 0.5 of it
    em = grid({2e-3: ((100, 80.0), (100, 80.0)), 4e-3: ((100, 70), (100, 70)), 8e-3: ((100, 80.4), (100, 80.4))})
    lr, how = sel.select(em, "softmax")
    assert lr == 2e-3 and "2e-3, 8e-3" in how  # equally far from 4e-3 (a factor 2): the lower one
    em = grid({2e-3: ((100, 80.0), (100, 80.0)), 4e-3: ((100, 70), (100, 70)), 8e-3: ((100, 80.6), (100, 80.6))})
    assert sel.select(em, "softmax")[0] == 8e-3  # 0.6 points is no tie


def test_no_lr_fitting_1x_falls_back_to_the_best_16x_and_says_so(sel):
    em = grid({2e-3: ((98, 60), (99.5, 62)), 4e-3: ((99.5, 70), (97, 71)), 8e-3: ((90, 50), (99, 50))})
    lr, how = sel.select(em, "softmax")
    assert lr == 4e-3 and how.startswith("FLAGGED")


def test_a_missing_cell_or_length_leaves_the_method_pending(sel):
    em = grid({2e-3: ((100, 60), (100, 62)), 4e-3: ((100, 70), (100, 71)), 8e-3: ((100, 50), (100, 50))})
    assert sel.select(em, "asentmax") == (None, "pending")
    del em["softmax", 8e-3, 401][1024]
    assert sel.select(em, "softmax") == (None, "pending")


def test_records_are_read_per_study_lr_with_the_later_record_winning(sel, tmp_path):
    def rec(study, seed, em64, em1024, checkpoint="last"):
        results = [{"checkpoint": checkpoint, "length": L, "exact_match": x} for L, x in ((64, em64), (1024, em1024))]
        return json.dumps({"study": study, "method": "adatemp", "seed": seed, "results": results})

    path = tmp_path / "records.jsonl"
    lines = [rec("lr_select_8e-3", 400, 0.5, 0.25), rec("lr_select_8e-3", 400, 0.99, 0.75)]
    lines += [rec("lr_select_8e-3", 401, 0.1, 0.1, checkpoint="best"), rec("lr_confirm", 402, 0.1, 0.1)]
    path.write_text("\n".join(lines) + "\n")
    assert sel.exact_match(path) == {("adatemp", 8e-3, 400): {64: 99.0, 1024: 75.0}}
