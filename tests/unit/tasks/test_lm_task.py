"""Language modelling as a task of the one trainer: the ``lm`` task's rows, stream, objective and bad input; the
typed run config; the trainer's callbacks."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from longsparse.lm.passkey import PasskeyMaker, reference_solve
from longsparse.lm.streams import SAMPLE_DIR, prepare
from longsparse.tasks import IGNORE_INDEX, get_task, make_rng
from longsparse.train import ConfigError, build_config, train
from longsparse.train.config import NOT_IDENTITY, RunConfig, TrainConfig, config_hash, resolve
from longsparse.train.objectives import objective_of


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("lmcache"))


def lm_task(cache, **params):
    return get_task(
        "lm", **{"corpus": "sample", "tokenizer": "bpe", "tokenizer_vocab": 320, "cache_dir": cache, **params}
    )


def test_rows_are_next_token_windows_of_the_training_stream(cache):
    task = lm_task(cache, passkey_frac=0.0)
    tok, tokens = prepare({"dir": str(SAMPLE_DIR), "tokenizer": "bpe", "vocab_size": 320}, cache_dir=cache)
    b = task.batch(24, 5, seed=3)
    assert b.input_ids.shape == b.labels.shape == (5, 24) and b.kind == "lm"
    assert bool((b.labels != IGNORE_INDEX).all()) and bool(b.attention_mask.all())
    assert torch.equal(b.input_ids[:, 1:], b.labels[:, :-1])  # labels are the next tokens
    # the same offsets an independent reading of the stream gives: randint(0, n - T - 1) per row
    rng, stream = make_rng("lm", 3, "train"), tokens["train"]
    for r in range(5):
        o = rng.randint(0, len(stream) - 25)
        assert torch.equal(b.input_ids[r], stream[o : o + 24]) and torch.equal(b.labels[r], stream[o + 1 : o + 25])
    assert task.vocab_size == tok.vocab_size


def test_passkey_rows_follow_the_fraction_and_end_with_their_answer(cache):
    task = lm_task(cache, passkey_frac=1.0, passkey_digits=4)
    maker = PasskeyMaker(task.tok, 4)
    b = task.batch(80, 6, seed=0)
    rng = make_rng("lm", 0, "train")
    for r in range(6):
        assert rng.random() < 1.0
        ex = maker.make(task.tokens["train"], 81, rng.random(), rng)
        assert b.input_ids[r].tolist() + b.labels[r, -1:].tolist() == ex.ids
    # a quarter of the rows are passkey rows: an independent oracle finds exactly one needle in those only
    mixed = lm_task(cache, passkey_frac=0.25, passkey_digits=4).batch(80, 200, seed=1)
    found = 0
    for r in range(200):
        row = mixed.input_ids[r].tolist() + mixed.labels[r, -1:].tolist()
        try:
            found += reference_solve(task.tok, row, 4) == task.tok.decode(row[-4:])
        except ValueError:  # no needle: a plain window of the stream
            pass
    assert 30 <= found <= 70


def test_a_length_range_is_drawn_once_per_batch_and_a_single_length_draws_nothing(cache):
    task = lm_task(cache, passkey_frac=0.0)
    assert torch.equal(task.batch((24, 24), 3, seed=1).input_ids, task.batch(24, 3, seed=1).input_ids)
    lengths = {task.batch((16, 40), 2, seed=s).input_ids.shape[1] for s in range(12)}
    assert len(lengths) > 1 and all(16 <= n <= 40 for n in lengths)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"tokenizer": "chars"}, "tokenizer must be 'bpe' or 'bytes'"),
        ({"passkey_frac": 1.5}, "passkey_frac must be a number in [0, 1]"),
        ({"passkey_digits": 0}, "passkey_digits must be an integer >= 1"),
        ({"tokenizer_vocab": 12}, "tokenizer_vocab must be an integer >= 260"),
        ({"corpus": ""}, "corpus must be a folder or 'sample'"),
    ],
)
def test_bad_lm_parameters_are_one_line_errors(cache, params, message):
    with pytest.raises(ValueError) as e:
        lm_task(cache, **{"passkey_frac": 0.0, **params})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_too_short_rows_for_a_passkey_are_refused(cache):
    task = lm_task(cache, passkey_frac=0.5)
    with pytest.raises(ValueError, match="too short"):
        task.batch(5, 2, seed=0)


def test_perplexity_objective_is_the_validation_nll(cache):
    task = lm_task(cache, passkey_frac=0.0)
    assert objective_of(task).name == "perplexity" and objective_of(get_task("copy")).name == "exact_match"
    torch.manual_seed(0)
    from longsparse.train.config import build_model

    model = build_model({"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32}, task.vocab_size)
    got = objective_of(task).measure(model, task, 32, 4, seed=0, autocast_dtype=None)
    # oracle: the mean cross-entropy of the same four evenly spaced validation windows, computed directly
    val = task.tokens["validation"]
    gap = (len(val) - 33) // 3
    x = torch.stack([val[k * gap : k * gap + 33] for k in range(4)])
    with torch.no_grad():
        nll = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    assert got["nll"] == pytest.approx(float(nll), rel=1e-5)
    assert objective_of(task).key({"val_mean_nll": 2.0}) > objective_of(task).key({"val_mean_nll": 3.0})


def lm_config(cache, **train):
    return {
        "task": {
            "name": "lm",
            "params": {"corpus": "sample", "tokenizer_vocab": 320, "passkey_frac": 0.25, "cache_dir": cache},
        },
        "model": {
            "d_model": 16,
            "n_layers": 1,
            "n_heads": 2,
            "d_ff": 32,
            "attention": {"method": "asentmax", "positions": "nape"},
        },
        "train": {
            "steps": 4,
            "batch_size": 4,
            "warmup_steps": 1,
            "train_lengths": [64, 64],
            "val_every": 2,
            "val_lengths": [64],
            "val_samples": 2,
            "log_every": 1,
            "ckpt_every": 2,
            "threads": 1,
            **train,
        },
    }


def test_the_one_trainer_trains_lm_and_validates_by_perplexity(cache, tmp_path):
    res = train(lm_config(cache), str(tmp_path / "run"), printer=lambda *_: None, progress=False)
    assert res["step"] == 4 and [h["step"] for h in res["history"]] == [2, 4]
    assert all(set(h["val"]["64"]) == {"nll", "ppl"} for h in res["history"])
    assert res["best"]["key"] == [-min(h["val_mean_nll"] for h in res["history"])]
    assert (tmp_path / "run" / "checkpoints" / "best.pt").exists() and res["train_seconds"] > 0


def test_cache_dir_is_not_part_of_an_lm_runs_identity(cache, tmp_path):
    a = resolve(lm_config(cache))
    b = resolve(lm_config(cache))
    b["task"]["params"]["cache_dir"] = str(tmp_path / "elsewhere")
    assert a != b and config_hash(a) == config_hash(b)
    assert ("task", "params", "cache_dir") in NOT_IDENTITY


def test_run_config_round_trips_and_keeps_the_identity(cache):
    for cfg in (
        build_config("mqmtar_inline", method="asentmax", positions="nape"),
        build_config("copy", method="softmax", positions="rope", sets=["train.lr=3e-4"]),
        build_config("passkey", arch="hsa"),
        resolve(lm_config(cache)),
    ):
        run = RunConfig.from_dict(cfg)
        assert run.as_dict() == cfg and run.hash == config_hash(cfg)
        assert isinstance(run.train, TrainConfig) and run.train.lr == cfg["train"]["lr"]
        assert run.model.attention.method == cfg["model"]["attention"]["method"]
    with pytest.raises(ConfigError, match="unknown train key"):
        RunConfig.from_dict({**lm_config(cache), "train": {"stepz": 3}})


def test_callbacks_see_every_step_after_its_checkpoint(tmp_path):
    cfg = build_config(
        "copy",
        method="softmax",
        positions="nape",
        steps=5,
        sets=[
            "model.d_model=16",
            "model.d_ff=32",
            "model.n_heads=2",
            "model.n_layers=1",
            "train.batch_size=4",
            "train.ckpt_every=2",
            "train.val_every=0",
            "train.val_lengths=[16]",
            "train.val_samples=2",
            "train.threads=1",
        ],
    )
    seen = []

    def record(step):
        path = tmp_path / "run" / "checkpoints" / "last.pt"
        seen.append((step, torch.load(path, weights_only=False)["extra"]["step"] if path.exists() else None))

    train(cfg, str(tmp_path / "run"), printer=lambda *_: None, progress=False, callbacks=[record])
    assert seen == [(1, None), (2, 2), (3, 2), (4, 4), (5, 5)]


def test_the_lm_preset_resolves_on_a_corpus_and_eval_refuses_an_lm_run(cache, tmp_path):
    from longsparse.evaluate import evaluate_run

    cfg = build_config(
        "lm",
        preset="cpu",
        steps=2,
        sets=[
            "task.params.corpus=sample",
            f"task.params.cache_dir={cache}",
            "task.params.tokenizer_vocab=320",
            "model.d_model=16",
            "model.d_ff=32",
            "model.n_layers=1",
            "model.n_heads=2",
            "train.batch_size=2",
            "train.val_samples=2",
        ],
    )
    assert cfg["task"]["name"] == "lm" and cfg["train"]["train_lengths"] == [128, 128]
    train(cfg, str(tmp_path / "run"), printer=lambda *_: None, progress=False)
    with pytest.raises(ValueError, match="scored by perplexity") as e:
        evaluate_run(tmp_path / "run", [128], samples=2, checkpoint="last", printer=None)
    assert "\n" not in str(e.value)


def test_lm_trains_under_bf16_autocast(cache, tmp_path):
    res = train(lm_config(cache, steps=2, bf16=True, val_every=0), None, printer=lambda *_: None, progress=False)
    assert res["step"] == 2 and all(math.isfinite(h["val_mean_nll"]) for h in res["history"])


@pytest.mark.slow
def test_lm_data_parallel_two_ranks_match_one_process(cache, tmp_path):
    """The LM task under torchrun (2 gloo ranks, half of the global batch each) reaches one process's weights."""
    cfg = lm_config(cache, steps=3, val_every=0, batch_size=4)
    toml = tmp_path / "lm.toml"
    toml.write_text(
        '[task]\nname = "lm"\n[task.params]\ncorpus = "sample"\ntokenizer_vocab = 320\npasskey_frac = 0.25\n'
        f'cache_dir = "{cache}"\n[model]\n'
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in cfg["model"].items())
        + "[train]\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in cfg["train"].items())
    )
    args = ["-m", "longsparse.cli", "train", "--task", "lm", "--config", str(toml)]
    for out, launcher in (
        (tmp_path / "one", []),
        (tmp_path / "two", ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]),
    ):
        p = subprocess.run(
            [sys.executable, *launcher, *args, "--out", str(out)], capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 0, p.stdout + p.stderr
    a = torch.load(tmp_path / "one" / "checkpoints" / "last.pt", weights_only=False)
    b = torch.load(tmp_path / "two" / "checkpoints" / "last.pt", weights_only=False)
    assert b["extra"]["world_size"] == 2
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=1e-4, atol=1e-5, msg=k)
