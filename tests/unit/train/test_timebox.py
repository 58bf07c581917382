"""A job with a wall-clock limit: training stopped by a deadline at a checkpoint that resumes bit for bit, and
evaluations cut short that continue to the numbers of one uninterrupted call (the same examples)."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch
from helpers.configs import tiny_run_sets

from longsparse.evaluate import evaluate_run, load_run_model
from longsparse.evaluate.sweep import partial_path, read_partial
from longsparse.models import read_checkpoint
from longsparse.tasks.scoring import new_score_state, score_more
from longsparse.train import build_config, make_task, train

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = tiny_run_sets(
    {
        "train.val_every": "4",
        "train.val_lengths": "[16]",
        "train.val_samples": "4",
        "train.ckpt_every": "100",  # the deadline's checkpoint is the only one before the end
    }
)


def _cfg(steps: int = 14) -> dict:
    return build_config("two_back", method="softmax", positions="nape", steps=steps, sets=TINY)


def _losses(run) -> list:
    return [
        (r["step"], r["loss"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r
    ]


def _sleep_after(step: int, seconds: float):
    def callback(done: int) -> None:
        if done == step:
            time.sleep(seconds)

    return callback


def test_deadline_stops_at_a_checkpoint_that_resumes_bit_for_bit(tmp_path):
    cfg = _cfg()
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    train(cfg, str(ref), progress=False, printer=lambda s: None)
    # the deadline passes during the pause after update 5: the loop stops before update 6 (or earlier on a
    # machine so slow that 5 updates take 4 s) and writes last.pt at that step, between ckpt_every checkpoints
    res = train(
        cfg,
        str(cut),
        progress=False,
        printer=lambda s: None,
        deadline=time.time() + 4.0,
        callbacks=[_sleep_after(5, 4.0)],
    )
    assert res["stopped_at_deadline"] and 1 <= res["step"] <= 5
    assert read_checkpoint(str(cut / "checkpoints" / "last.pt"))["extra"]["step"] == res["step"]
    assert "deadline: stopped at step" in (cut / "train.log").read_text()
    done = train(cfg, str(cut), progress=False, printer=lambda s: None)
    assert done["step"] == 14 and not done["stopped_at_deadline"] and done["trained_steps"] == 14 - res["step"]
    a, b = read_checkpoint(str(ref / "checkpoints" / "last.pt")), read_checkpoint(str(cut / "checkpoints" / "last.pt"))
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for i, st in a["optimizer"]["state"].items():
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(st[k], b["optimizer"]["state"][i][k])
    assert _losses(ref) == _losses(cut)


def test_a_passed_deadline_trains_nothing_and_the_run_starts_later(tmp_path):
    cfg = _cfg(steps=4)
    res = train(cfg, str(tmp_path / "r"), progress=False, printer=lambda s: None, deadline=time.time() - 1)
    assert res["stopped_at_deadline"] and res["step"] == 0 and res["trained_steps"] == 0
    assert not (tmp_path / "r" / "checkpoints" / "last.pt").exists()
    assert train(cfg, str(tmp_path / "r"), progress=False, printer=lambda s: None)["step"] == 4


# ---- evaluation cut short and continued --------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["copy", "two_back"])
def trained(request, tmp_path_factory):
    """A tiny trained run of a generated-answer task (copy) and of a per-token task (two_back)."""
    run = tmp_path_factory.mktemp("eval") / request.param
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sets = [s for s in TINY if not s.startswith("train.val_lengths")] + ["train.val_every=0"]
        if request.param == "copy":
            sets += ["task.params.num_symbols=8", "train.train_lengths=[4, 8]"]
        cfg = build_config(request.param, method="asentmax", positions="nape", steps=4, sets=sets)
        train(cfg, str(run), progress=False, printer=lambda s: None)
    finally:
        torch.set_num_threads(n)
    return run


COUNTS = ("n", "n_exact", "exact_match", "exact_match_ci", "n_tokens", "n_correct_tokens", "token_accuracy")


def test_evaluation_cut_short_twice_then_finished_equals_one_call(trained, tmp_path):

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    lengths, kw = [16, 32], {"samples": 7, "checkpoint": "last", "seed": 3, "printer": None, "progress": False}
    _, one = evaluate_run(run, lengths, write=False, **kw)  # one call, one batch of 7 per length
    path, res = evaluate_run(run, lengths, max_examples=3, **kw)
    assert (
        path is None
        and res["results"] == []
        and res["unfinished"] == [{"length": L, "done": 3, "samples": 7} for L in lengths]
    )
    st = read_partial(run, "last", 16, 7, 3)
    assert st["done"] == 3 and st["checkpoint_step"] == 4 and [p["examples"] for p in st["pieces"]] == [3]
    evaluate_run(run, lengths, max_examples=3, **kw)
    path, res = evaluate_run(run, lengths, until=time.time() + 600, **kw)
    assert res["unfinished"] == [] and not any(partial_path(run, "last", L, 7, 3).exists() for L in lengths)
    saved = json.loads(path.read_text())
    assert [r["length"] for r in saved["results"]] == lengths
    for got, want in zip(saved["results"], one["results"]):
        assert [p["examples"] for p in got["pieces"]] == [3, 3, 1]
        assert {k: got[k] for k in COUNTS} == {k: want[k] for k in COUNTS}
    assert saved["samples"] == 7 and saved["seed"] == 3 and saved["checkpoint_step"] == 4


def test_a_resumable_call_without_a_limit_continues_a_cut_evaluation_to_the_end(trained, tmp_path):
    """What a study runner does: every evaluation resumable, so a length another call cut short is continued
    there (not scored again) and finished, with the counts of one call."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    kw = {"samples": 5, "checkpoint": "last", "seed": 2, "printer": None, "progress": False}
    _, one = evaluate_run(run, [16], write=False, **kw)
    evaluate_run(run, [16], max_examples=2, **kw)
    path, res = evaluate_run(run, [16], resumable=True, **kw)
    (got,) = json.loads(path.read_text())["results"]
    assert [p["examples"] for p in got["pieces"]] == [2, 3] and res["unfinished"] == []
    assert {k: got[k] for k in COUNTS} == {k: one["results"][0][k] for k in COUNTS}
    assert not partial_path(run, "last", 16, 5, 2).exists()


def test_evaluation_stops_before_a_batch_past_the_deadline(trained):

    model, cfg, _ = load_run_model(trained, "last")
    task = make_task(cfg["task"])
    st = new_score_state(16, 5, seed=1, batch_size=5)
    stop = score_more(model, task, st, until=time.time() + 30, rate_hint=100.0)  # no example can finish
    assert st["done"] == 0 and st["pieces"] == [] and stop.startswith("deadline (100 s per example")
    assert score_more(model, task, st, until=time.time() - 1) is not None and st["done"] == 0
    assert score_more(model, task, st, until=time.time() + 600) is None  # a probe of one, then the rest
    assert st["done"] == 5 and [p["examples"] for p in st["pieces"]] == [5]


def test_partial_state_of_another_checkpoint_step_is_set_aside(trained, tmp_path):

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    kw = {"samples": 4, "checkpoint": "last", "seed": 0, "progress": False}
    evaluate_run(run, [16], max_examples=2, printer=None, **kw)
    p = partial_path(run, "last", 16, 4, 0)
    st = json.loads(p.read_text())
    p.write_text(json.dumps({**st, "checkpoint_step": 2}))  # as if the run had trained on since
    said = []
    path, res = evaluate_run(run, [16], max_examples=4, printer=said.append, **kw)
    assert res["results"][0]["n"] == 4 and [x["examples"] for x in res["results"][0]["pieces"]] == [4]
    assert (run / "eval_partial" / "last-L16-n4-seed0.step2.stale.json").is_file()
    assert any("set aside" in s for s in said)
    p.write_text("{")  # damaged: kept aside, not overwritten
    evaluate_run(run, [16], max_examples=1, printer=None, **kw)
    assert (run / "eval_partial" / "last-L16-n4-seed0.stepunreadable.stale.json").read_text() == "{"


def test_resumable_evaluation_bad_input(trained):

    with pytest.raises(ValueError, match="max_examples must be a positive integer"):
        evaluate_run(trained, [16], samples=2, checkpoint="last", max_examples=0, printer=None)
    with pytest.raises(ValueError, match="write=True"):
        evaluate_run(trained, [16], samples=2, checkpoint="last", until=time.time(), write=False, printer=None)
