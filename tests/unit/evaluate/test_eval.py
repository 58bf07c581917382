"""Evaluation: Wilson intervals, batch-size invariance, long lengths through the chunked path, result JSON
structure, one new file per call (never overwriting), clear errors."""

import json
import math

import pytest
from helpers.configs import tiny_run_sets

from longsparse.evaluate import evaluate_run, parse_lengths
from longsparse.stats import wilson_interval
from longsparse.tasks.scoring import score_length
from longsparse.train import RunDirError, build_config, train
from longsparse.train.config import make_task

TINY = tiny_run_sets(
    {"train.batch_size": "16", "train.log_every": "5", "train.val_samples": "4", "train.ckpt_every": "5"}
)


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson_interval(10, 10)
    assert hi == 1.0 and lo == pytest.approx(0.7225, abs=1e-4)
    lo, hi = wilson_interval(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_parse_lengths():
    assert parse_lengths("64,128, 16k") == [64, 128, 16384]
    assert parse_lengths("64-512") == [64, 128, 256, 512]
    for bad in ("", "64,abc", "0", "-5", "128-64"):
        with pytest.raises(ValueError):
            parse_lengths(bad)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalruns")
    out = {}
    for task, extra in (
        ("copy", ["task.params.num_symbols=8", "train.train_lengths=[4, 8]", "train.val_lengths=[8]"]),
        ("flip_flop", ["train.val_lengths=[32]"]),
    ):
        method = "asentmax" if task == "copy" else "softmax"
        cfg = build_config(task, method=method, positions="nape", steps=10, sets=TINY + extra)
        train(cfg, str(root / task), printer=lambda s: None)
        out[task] = root / task
    return out


def test_eval_json_structure_and_never_overwrite(runs):
    run = runs["copy"]
    p1, r1 = evaluate_run(run, "8,16", samples=6, checkpoint="last", printer=None)
    text1 = p1.read_text()
    p2, r2 = evaluate_run(run, [8], samples=3, checkpoint="best", printer=None)
    assert p1 != p2 and p1.parent == p2.parent == run / "eval"
    assert p1.read_text() == text1  # the earlier result is untouched
    d = json.loads(text1)
    assert d["format"] == "longsparse-eval" and d["version"] == 1
    assert d["task"] == "copy" and d["method"] == "asentmax" and d["positions"] == "nape"
    assert d["label"] == "asentmax/nape" and d["checkpoint"] == "last" and d["checkpoint_step"] == 10
    assert d["train_lengths"] == [4, 8]
    assert [r["length"] for r in d["results"]] == [8, 16]
    for r in d["results"]:
        assert r["n"] == 6 and 0 <= r["n_exact"] <= 6
        assert r["exact_match"] == pytest.approx(r["n_exact"] / 6)
        lo, hi = r["exact_match_ci"]
        assert 0 <= lo <= r["exact_match"] <= hi <= 1
        assert r["n_tokens"] == 6 * (r["length"] + 1)  # target + EOS per example
        assert r["token_accuracy"] == pytest.approx(r["n_correct_tokens"] / r["n_tokens"])
    assert d["results"][1]["ratio"] == 2.0
    assert {"torch", "python", "longsparse", "git"} <= set(d["env"])
    assert json.loads(p2.read_text())["checkpoint"] == "best"


def test_scores_do_not_depend_on_batch_size(runs):
    from longsparse.evaluate import load_run_model

    for name in ("copy", "flip_flop"):
        model, cfg, _ = load_run_model(runs[name], "last")
        task = make_task(cfg["task"])
        L = 16 if name == "copy" else 64
        a = score_length(model, task, L, 7, batch_size=1)
        b = score_length(model, task, L, 7, batch_size=4)
        c = score_length(model, task, L, 7)
        for k in ("n_exact", "n_tokens", "n_correct_tokens"):
            assert a[k] == b[k] == c[k], (name, k)


def test_default_batch_tokens_by_task_kind():
    """Generated targets get the wider decoding budget, single-pass tasks the memory one; explicit wins."""
    from longsparse.tasks.scoring import DECODE_BATCH_TOKENS, DEFAULT_BATCH_TOKENS, eval_batch_size

    copy, flip = make_task({"name": "copy"}), make_task({"name": "flip_flop"})
    assert eval_batch_size(copy, 2048, 10_000) == DECODE_BATCH_TOKENS // (2 * 2048 + 3)
    assert eval_batch_size(flip, 2048, 10_000) == DEFAULT_BATCH_TOKENS // len(flip.sample(2048, flip.rng(0)).input_ids)
    assert eval_batch_size(copy, 2048, 10_000, batch_tokens=4099) == 1
    assert eval_batch_size(copy, 64, 20) == 20


def test_long_length_through_chunked_path(runs):
    """A 16K-token flip-flop example, one at a time (batch size adapts to the length)."""
    path, res = evaluate_run(runs["flip_flop"], "16k", samples=1, checkpoint="last", printer=None, batch_tokens=4096)
    r = res["results"][0]
    assert r["length"] == 16384 and r["batch_size"] == 1 and r["n"] == 1
    assert math.isfinite(r["token_accuracy"])


def test_eval_errors(runs, tmp_path):
    with pytest.raises(ValueError, match="impossible length: copy: length 0|positive integers"):
        evaluate_run(runs["copy"], "0", printer=None)
    with pytest.raises(ValueError, match="impossible length: flip_flop: length 2 is too short; the minimum is 4"):
        evaluate_run(runs["flip_flop"], "2,64", printer=None)
    with pytest.raises(RunDirError, match="not a longsparse run directory"):
        evaluate_run(tmp_path, "64", printer=None)
    with pytest.raises(ValueError, match="--samples must be a positive integer"):
        evaluate_run(runs["copy"], "8", samples=0, printer=None)
    n_before = len(list((runs["copy"] / "eval").glob("*.json"))) if (runs["copy"] / "eval").exists() else 0
    # a corrupt checkpoint: clear message, nothing written
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(runs["copy"], broken)
    (broken / "checkpoints" / "best.pt").write_bytes(b"\x00" * 100)
    shutil.rmtree(broken / "eval", ignore_errors=True)
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        evaluate_run(broken, "8", printer=None)
    (broken / "checkpoints" / "best.pt").unlink()
    with pytest.raises(RunDirError, match="no best checkpoint.*--checkpoint last"):
        evaluate_run(broken, "8", printer=None)
    assert not (broken / "eval").exists() or not list((broken / "eval").glob("*.json"))
    n_after = len(list((runs["copy"] / "eval").glob("*.json"))) if (runs["copy"] / "eval").exists() else 0
    assert n_after == n_before
