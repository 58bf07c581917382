"""`longsparse findings mechanism`: the measurement's rows against the full attention map, the file it extends,
and the per-method analysis against hand-computed values."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch
from helpers.configs import tiny_run_sets

from longsparse.report.paired import t_quantile
from longsparse.train import build_config, train
from longsparse.train.config import make_task
from longsparse_experiments.cli import main as cli_main
from longsparse_experiments.findings import mechanism as mech

LENGTHS = {64: 2, 128: 1}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny mqmtar_inline runs (softmax, ASEntmax; NAPE, 2 heads), 4 steps each: {method: run folder}."""
    root = tmp_path_factory.mktemp("mechanism")
    out = {}
    for method in ("softmax", "asentmax"):
        cfg = build_config("mqmtar_inline", method=method, positions="nape", steps=4, sets=tiny_run_sets())
        train(cfg, str(root / method), printer=lambda s: None, progress=False)
        out[method] = str(root / method)
    return out


def test_rows_are_the_last_rows_of_the_full_map(runs):
    from longsparse.evaluate.sweep import load_run_model

    for run in runs.values():
        model, cfg, _ = load_run_model(run, "last", "cpu")
        model.eval()
        task = make_task(cfg["task"])
        batch = task.batch(96, 1, rng=task.rng(7, "test"))
        T = batch.input_ids.shape[1]
        layers = [m for m in model.modules() if hasattr(m, "_capture") and hasattr(m, "layer_idx")]
        maps = {}
        for m in (T, 20):
            rec = mech.LastRows(m)
            for lyr in layers:
                lyr._capture = rec
            with torch.no_grad():
                model(batch.input_ids, attention_mask=batch.attention_mask)
            maps[m] = rec.rows
        for lyr in layers:
            lyr._capture = None
        for L, full in maps[T].items():
            assert full.shape[-2:] == (T, T)
            torch.testing.assert_close(maps[20][L], full[:, -20:], rtol=1e-5, atol=1e-6)
            # causal: row i attends to keys 0..i only, and each row is a distribution
            assert float(full.triu(1).abs().max()) == 0.0
            torch.testing.assert_close(full.sum(-1), torch.ones(full.shape[:-1]), rtol=0, atol=1e-5)


def test_row_statistics_against_hand_values():
    row = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.0, 0.5, 0.5, 0.0]])
    s = mech.row_statistics(row, 1, 2)
    assert s["mass"] == [0.5, 1.0]
    assert s["entropy"] == [1.0, round(math.log(2) / math.log(4), 5)]
    assert s["max"] == [0.25, 0.5]
    assert s["support"] == [4, 2]


def test_pair_start_finds_the_one_pair_or_says_why():
    ids = [5, 6, 1, 7, 8, 9, 10, 1, 11]
    assert mech.pair_start(ids, [9, 10], 1, len(ids)) == 5
    with pytest.raises(ValueError, match="expected one context pair with key \\[3, 4\\], found 0"):
        mech.pair_start(ids, [3, 4], 1, len(ids))


def test_measure_writes_checked_rows_and_extends_without_redoing(runs, tmp_path):
    out = tmp_path / "m.json"
    lines = []
    data = mech.measure([runs["softmax"]], out, 11, LENGTHS, printer=lines.append)
    assert len(lines) == 2 and json.loads(out.read_text()) == data
    r = data["runs"][runs["softmax"]]
    assert (r["method"], r["step"]) == ("softmax", 4)
    for L, n in LENGTHS.items():
        exs = r[str(L)]["examples"]
        assert len(exs) == n
        for e in exs:
            assert e["exact"] == all(q["right"] for q in e["queries"])
            assert len(e["rows"]) == 2 * len(e["queries"])
            for row in e["rows"]:
                for stats in row["layers"].values():
                    assert all(-1e-5 <= m <= 1 + 1e-5 for m in stats["mass"])
                    assert all(-1e-5 <= h <= 1 + 1e-5 for h in stats["entropy"])
                    assert all(isinstance(s, int) and s >= 1 for s in stats["support"])
    before = out.read_text()
    lines.clear()
    data2 = mech.measure([runs["softmax"], runs["asentmax"]], out, 11, LENGTHS, printer=lines.append)
    assert len(lines) == 2  # only the new run's lengths
    assert data2["runs"][runs["softmax"]] == json.loads(before)["runs"][runs["softmax"]]
    assert data2["runs"][runs["asentmax"]]["method"] == "asentmax"
    with pytest.raises(ValueError, match="measured with stream 11"):
        mech.measure([runs["softmax"]], out, 12, LENGTHS)
    with pytest.raises(ValueError, match="lengths"):
        mech.measure([runs["softmax"]], out, 11, {64: 3})


def _example(right: list[bool], masses: list[float]) -> dict:
    """An example whose retrieval candidates are layer 0 head 0 (mass ``masses`` per query, both rows) and head 1
    (mass 0.1 everywhere)."""
    rows = [
        {"query": q, "row": row, "layers": {"0": {"mass": [m, 0.1], "entropy": [0.5, 0.9], "support": [3, 9]}}}
        for q, m in enumerate(masses)
        for row in ("v1", "v2")
    ]
    return {"exact": all(right), "queries": [{"right": x} for x in right], "rows": rows}


def _run(method, seed, short_mass, long_right, long_masses):
    return {
        "method": method,
        "seed": seed,
        "step": 8,
        "64": {"n": 1, "examples": [_example([True, True], [short_mass, short_mass])]},
        "256": {"n": 1, "examples": [_example(long_right, long_masses)]},
    }


def test_analyse_against_hand_computed_values():
    data = {
        "stream": 1,
        "lengths": {"64": 1, "256": 1},
        "runs": {
            "a": _run("softmax", 1, 0.9, [True, False], [0.8, 0.4]),
            "b": _run("softmax", 2, 0.8, [False, False], [0.5, 0.3]),
            "c": _run("softmax", 3, 0.8, [True, True], [0.7, 0.7]),
            "d": _run("asentmax", 1, 0.9, [True, True], [0.9, 0.9]),
        },
    }
    a = mech.analyse(data)
    assert a["runs"]["a"]["head"] == [0, 0]
    s = a["runs"]["a"]["lengths"]["256"]
    assert (s["exact"], s["mass_right"], s["mass_wrong"], s["rows_right"], s["rows_wrong"]) == (0, 0.8, 0.4, 2, 2)
    assert s["mass"] == pytest.approx(0.6)
    m = a["methods"]["softmax"]["lengths"]["256"]
    drops = [0.9 - 0.6, 0.8 - 0.4, 0.8 - 0.7]
    assert m["drop"]["mean"] == pytest.approx(statistics.fmean(drops))
    half = t_quantile(0.975, 2) * statistics.stdev(drops) / math.sqrt(3)
    assert m["drop"]["t95"] == pytest.approx([statistics.fmean(drops) - half, statistics.fmean(drops) + half])
    assert (m["drop"]["n"], m["drop"]["positive"]) == (3, 3)
    # only seed 1 has right and wrong queries at 256
    assert (m["right_minus_wrong"]["n"], m["right_minus_wrong"]["t95"]) == (1, None)
    assert m["right_minus_wrong"]["mean"] == pytest.approx(0.4)
    # mass 0.6, 0.4, 0.7 (ranks 2, 1, 3) against exact 0, 0, 1 (ranks 1.5, 1.5, 3)
    assert m["spearman"] == pytest.approx(1.5 / math.sqrt(2 * 1.5))
    assert a["methods"]["asentmax"]["lengths"]["256"]["drop"]["mean"] == pytest.approx(0.0)
    text = mech.summary_text(a)
    assert "| softmax | 4x |" in text and "| asentmax | 1 | 8 | L0 H0 |" in text


def test_ranks_and_spearman():
    assert mech.ranks([3.0, 1.0, 2.0, 2.0]) == [4.0, 1.0, 2.5, 2.5]
    assert mech.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert mech.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert mech.spearman([1, 2], [1, 2]) is None
    assert mech.spearman([1, 2, 3], [5, 5, 5]) is None
    # Pearson of ranks (1, 2, 3, 4) and (1, 3, 2, 4): 0.8
    assert mech.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)


@pytest.mark.parametrize("text", ["64", "64:0", "a:3", "64:3,", "64:3:1"])
def test_bad_lengths_are_refused_in_one_line(text):
    with pytest.raises(ValueError, match="--lengths takes LENGTH:EXAMPLES"):
        mech.parse_lengths(text)


def test_a_gz_file_is_compressed_reproducibly_and_reads_back(runs, tmp_path):
    data = mech.measure([runs["asentmax"]], tmp_path / "m.json.gz", 5, {64: 1}, printer=lambda s: None)
    raw = (tmp_path / "m.json.gz").read_bytes()
    assert raw[:2] == b"\x1f\x8b" and mech.load(tmp_path / "m.json.gz") == data
    mech.dump(tmp_path / "again.json.gz", data)
    assert (tmp_path / "again.json.gz").read_bytes() == raw


def test_cli_summary_json_and_figure_claim_their_files(runs, tmp_path, capsys):
    out = tmp_path / "m.json"
    mech.measure([runs["asentmax"]], out, 3, {64: 1}, printer=lambda s: None)
    assert cli_main(["findings", "mechanism", "summary", str(out), "--json", str(tmp_path / "a.json")]) == 0
    assert "asentmax" in capsys.readouterr().out
    assert json.loads((tmp_path / "a.json").read_text())["stream"] == 3
    assert cli_main(["findings", "mechanism", "figure", str(out), "--out", str(tmp_path / "m.png")]) == 0
    assert (tmp_path / "m.png").stat().st_size > 0
    # a file the command did not write is not overwritten
    (tmp_path / "mine.png").write_text("someone else's")
    assert cli_main(["findings", "mechanism", "figure", str(out), "--out", str(tmp_path / "mine.png")]) != 0
    assert "mine.png exists and was not written by" in capsys.readouterr().err
    assert (tmp_path / "mine.png").read_text() == "someone else's"
