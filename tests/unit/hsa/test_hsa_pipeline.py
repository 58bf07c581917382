"""HSA through the shared pipeline: config resolution (arch hsa: the [hsa] table, --set model.X), training with the
shared loop, checkpoints + exact resume, `longsparse eval` through the fast path with needle diagnostics."""

import json

import pytest
import torch
from helpers.paths import FAULTS

from longsparse.hsa import HSAModel, score_needles
from longsparse.models import load_checkpoint
from longsparse.train import ConfigError, build_config, train
from longsparse.train.config import build_model, run_label

TINY = [
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=32",
    "model.n_lower=1",
    "model.n_upper=1",
    "model.chunk_size=8",
    "model.window=8",
    "model.topk=2",
    "task.params.min_distance=8",
    "task.params.num_filler=8",
    "task.params.value_len=2",
    "train.train_lengths=[32, 48]",
    "train.batch_size=4",
    "train.warmup_steps=2",
    "train.val_every=0",
    "train.val_lengths=[48]",
    "train.val_samples=4",
    "train.ckpt_every=2",
    "train.log_every=1",
    "train.threads=1",
]


def tiny(steps=4, extra=()):
    return build_config("passkey", preset="cpu", arch="hsa", steps=steps, sets=[*TINY, *extra])


def test_hsa_config_resolution():
    cfg = tiny(extra=["model.fusion=standard", "model.landmark=mean", "model.encoder_layers=0"])
    m = cfg["model"]
    assert m["arch"] == "hsa" and m["fusion"] == "standard"
    assert (m["attention"]["method"], m["attention"]["positions"]) == ("softmax", "rope")  # [B]'s, by default
    assert "n_layers" not in m  # the Transformer's [model] table is not used
    label = run_label(cfg)  # hsa + the switches that differ from HSAConfig's defaults
    assert label.startswith("hsa[") and "landmark=mean" in label and "fusion=standard" in label
    model = build_model(m, 50)
    assert isinstance(model, HSAModel) and model.cfg.fusion == "standard"
    with pytest.raises(ConfigError, match="invalid hsa model config"):
        tiny(extra=["model.fusion=nonsense"])
    with pytest.raises(ConfigError, match="unknown HSAConfig field"):
        tiny(extra=["model.n_layers=3"])
    # the same preset still builds the baselines
    base = build_config("passkey", preset="cpu", method="softmax", steps=2)
    assert base["model"]["attention"]["method"] == "softmax" and "n_layers" in base["model"]
    assert "arch" not in base["model"]
    # method and positions are the token attention of HSA too: the preset's per-method table applies
    asn = build_config("passkey", preset="cpu", arch="hsa", method="asentmax", steps=2, sets=TINY)
    assert (asn["model"]["attention"]["method"], asn["model"]["attention"]["positions"]) == ("asentmax", "nape")
    assert run_label(asn).startswith("hsa[method=asentmax,positions=nape")


def test_hsa_trains_and_evaluates_with_diagnostics(tmp_path):
    from longsparse.evaluate import evaluate_run

    run = tmp_path / "run"
    res = train(tiny(6), str(run), progress=False, printer=lambda s: None)
    assert isinstance(res["model"], HSAModel) and res["step"] == 6
    model, extra = load_checkpoint(str(run / "checkpoints" / "last.pt"))
    assert isinstance(model, HSAModel) and extra["step"] == 6
    assert (run / "checkpoints" / "best.pt").exists()
    again = train(tiny(6), str(run), progress=False, printer=lambda s: None)  # complete: nothing to do
    assert again["resumed"] and again["step"] == 6

    path, _ = evaluate_run(run, [48, 96], samples=3, checkpoint="last", printer=None)
    saved = json.loads(path.read_text())
    assert saved["label"].startswith("hsa") and (saved["arch"], saved["method"]) == ("hsa", "softmax")
    for r in saved["results"]:
        nd = r["needles"]
        assert nd["n"] == 3 and 0 <= nd["recall_at_k"] <= 1 and nd["mean_rank"] >= 1
        assert 0 <= nd["mean_needle_weight"] <= 1
        assert nd["exact_match_given_recall"]["n"] + nd["exact_match_given_miss"]["n"] == 3
        # teacher-forced exact match of the same examples == greedy exact match
        assert nd["exact_match_teacher_forced"]["k"] == r["n_exact"]


def test_hsa_resume_is_bit_identical(tmp_path):
    """Kill after step 3 (SIGKILL in a subprocess), resume, compare with an uninterrupted run."""
    import subprocess
    import sys

    cfg = tiny(6)
    code = (
        "import json,sys; sys.path.insert(0, sys.argv[3]); from faults import sigkill_after; "
        "from longsparse.train import train; "
        "train(json.load(open(sys.argv[1])), sys.argv[2], progress=False, callbacks=[sigkill_after(3)])"
    )
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(json.dumps(cfg))
    run = tmp_path / "killed"
    p = subprocess.run([sys.executable, "-c", code, str(cfg_file), str(run), str(FAULTS.parent)], capture_output=True)
    assert p.returncode != 0  # killed
    assert load_checkpoint(str(run / "checkpoints" / "last.pt"))[1]["step"] == 2
    res = train(cfg, str(run), progress=False, printer=lambda s: None)
    assert res["resumed"] and res["step"] == 6
    ref = train(cfg, str(tmp_path / "ref"), progress=False, printer=lambda s: None)
    a = load_checkpoint(str(run / "checkpoints" / "last.pt"))[0].state_dict()
    b = ref["model"].state_dict()
    for k in b:
        assert torch.equal(a[k], b[k]), k


def test_score_needles_matches_score_length():
    from longsparse.tasks import get_task
    from longsparse.tasks.scoring import score_length

    torch.manual_seed(0)
    cfg = tiny()
    task = get_task("passkey", "cpu", **cfg["task"]["params"])
    model = build_model(cfg["model"], task.vocab_size)
    r = score_length(model, task, 64, 4, seed=1, batch_size=2)
    nd = score_needles(model, task, 64, 4, seed=1, batch_size=2)
    assert nd["exact_match_teacher_forced"]["k"] == r["n_exact"] and nd["n"] == 4
