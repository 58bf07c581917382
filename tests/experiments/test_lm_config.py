"""The LM study config (longsparse_experiments.lm_config): defaults, typed frozen sections, every bad key or value
refused in one line naming the file and the section, and the ``--steps`` override of ``longsparse lm run``."""

from __future__ import annotations

import dataclasses
import json

import pytest

from longsparse.lm.streams import SAMPLE_DIR
from longsparse.train.config import ConfigError, load_toml
from longsparse_experiments.cli import main
from longsparse_experiments.lm_config import (
    LMData,
    LMEval,
    LMStudyConfig,
    LMStudyGrid,
    LMTrain,
    configs_lm_dir,
    load_study_config,
)
from longsparse_experiments.lm_study import run_config, run_study

QUICK = configs_lm_dir() / "quick.toml"


def _variant(tmp_path, old: str, new: str):
    """A copy of the quick preset with ``old`` (which it must contain) replaced by ``new``."""
    text = QUICK.read_text()
    assert old in text, old
    path = tmp_path / "variant.toml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_an_empty_file_gets_every_default(tmp_path):
    (tmp_path / "empty.toml").write_text("")
    cfg = load_study_config(path=str(tmp_path / "empty.toml"))
    assert cfg == LMStudyConfig()
    assert cfg.description == "" and cfg.model == {}
    assert (cfg.data.dir, cfg.data.tokenizer, cfg.data.vocab_size) == ("data/shakespeare", "bpe", 2048)
    assert cfg.data.corpus == "data/shakespeare" and not cfg.data.is_sample
    assert dataclasses.asdict(cfg.train) == {
        "seq_len": 128,
        "batch_size": 32,
        "steps": 1000,
        "lr": 1e-3,
        "warmup_steps": 50,
        "min_lr_ratio": 0.1,
        "betas": (0.9, 0.99),
        "grad_clip": 1.0,
        "passkey_frac": 0.25,
        "passkey_digits": 5,
        "threads": 1,
        "log_every": 25,
        "ckpt_every": 50,
        "val_windows": 8,
    }
    assert cfg.eval.as_dict() == {
        "length_mults": [0.25, 0.5, 1, 2, 4, 8, 16],
        "n_windows": 8,
        "passkey_mults": [1, 2, 4, 8, 16],
        "passkey_depths": [0.0, 0.25, 0.5, 0.75, 1.0],
        "passkey_samples": 8,
        "batch_tokens": 16384,
    }
    assert cfg.study == LMStudyGrid(("softmax", "ssmax", "entmax", "asentmax"), ("nape",), (0,))


def test_the_quick_preset_holds_what_its_file_says():
    raw = load_toml(QUICK)
    cfg = load_study_config("quick")
    assert cfg.description == raw["description"] and cfg.model == raw["model"]
    assert cfg.data.dir == str(SAMPLE_DIR) and cfg.data.is_sample and cfg.data.corpus == "sample"
    assert cfg.data.as_dict() == {**raw["data"], "dir": str(SAMPLE_DIR)}
    for section in ("train", "eval", "study"):
        for key, value in raw[section].items():
            got = getattr(getattr(cfg, section), key)
            assert (list(got) if isinstance(got, tuple) else got) == value, (section, key)
    # eval.json stores and compares the JSON form: the file's values, unknown keys none, every sequence a list
    ev = cfg.eval.as_dict()
    assert ev == {**LMEval().as_dict(), **raw["eval"]} and json.loads(json.dumps(ev)) == ev
    assert all(type(a) is type(b) for a, b in zip(ev["length_mults"], raw["eval"]["length_mults"]))  # 1 stays 1


def test_run_config_is_the_library_config_of_one_run():
    cfg = load_study_config("quick")
    rc = run_config(cfg, "asentmax", "nape", 3, cache_dir="/c")
    T = cfg.train.seq_len
    assert rc["task"] == {
        "name": "lm",
        "params": {
            "corpus": "sample",
            "tokenizer": cfg.data.tokenizer,
            "tokenizer_vocab": cfg.data.vocab_size,
            "passkey_frac": cfg.train.passkey_frac,
            "passkey_digits": cfg.train.passkey_digits,
            "cache_dir": "/c",
        },
    }
    assert rc["model"] == {**load_toml(QUICK)["model"], "attention": {"method": "asentmax", "positions": "nape"}}
    tr = rc["train"]
    assert tr["betas"] == [0.9, 0.99] and isinstance(tr["betas"], list)  # JSON form, as config.json stores it
    assert (tr["seed"], tr["steps"], tr["train_lengths"], tr["val_lengths"], tr["val_every"]) == (
        3,
        cfg.train.steps,
        [T, T],
        [T],
        0,
    )


def test_the_config_is_frozen_and_replace_checks_again():
    cfg = load_study_config("quick")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.steps = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.study = LMStudyGrid()
    shorter = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=3))
    assert shorter.train.steps == 3 and cfg.train.steps == 12 and shorter.eval == cfg.eval
    with pytest.raises(ConfigError, match=r"\[train\] steps must be an integer >= 1, got 0"):
        dataclasses.replace(cfg.train, steps=0)
    # sequences given as lists are kept as tuples; "sample" is the committed sample wherever it is given
    assert LMStudyGrid(methods=["softmax"]).methods == ("softmax",) and LMData(dir="sample").dir == str(SAMPLE_DIR)
    assert issubclass(ConfigError, ValueError)  # callers catching ValueError still catch every config error


@pytest.mark.parametrize(
    "old, new, named",
    [
        ("description", "descripton = 'x'\ndescription", "unknown section(s) or key(s) ['descripton']"),
        ("[study]", "[studdy]\n[study]", "unknown section(s) or key(s) ['studdy']"),
        ("[data]", "[data]\nvocab = 512", "[data] unknown key(s) ['vocab']"),
        ("[model]", "[model]\nd_modle = 64", "[model] is not a valid model config for softmax/nape"),
        ("[train]", "[train]\nstep = 5", "[train] unknown key(s) ['step']"),
        ("[train]", "[train]\nseed = 1", "[train] unknown key(s) ['seed']"),  # the seeds are [study]'s
        ("[eval]", "[eval]\nn_window = 2", "[eval] unknown key(s) ['n_window']"),
        ("[study]", "[study]\nseed = [1]", "[study] unknown key(s) ['seed']"),
    ],
)
def test_a_typo_in_any_section_is_refused_naming_it(tmp_path, old, new, named):
    path = _variant(tmp_path, old, new)
    with pytest.raises(ConfigError) as e:
        load_study_config(path=str(path))
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and named in msg and "\n" not in msg


@pytest.mark.parametrize(
    "old, new, named",
    [
        ("description = ", "description = 3 #", "description must be a string"),
        ('[data]\ndir = "sample"\ntokenizer = "bpe"\nvocab_size = 320', "data = 3", "[data] must be a table, got 3"),
        ('dir = "sample"', "dir = 3", "[data] dir must be a folder"),
        ('tokenizer = "bpe"', 'tokenizer = "bp"', "[data] tokenizer must be one of bpe, bytes"),
        ("vocab_size = 320", "vocab_size = 100", "[data] vocab_size must be an integer >= 260"),
        ("[model]", "[model.attention]\nmethod = 'softmax'\n[model]", "[model] sets ['attention.method']"),
        ("n_heads = 4", "n_heads = 3", "[model] is not a valid model config for softmax/nape"),
        ("steps = 12", "steps = 1.5", "[train] steps must be an integer >= 1, got 1.5"),
        ("seq_len = 96", "seq_len = 0", "[train] seq_len must be an integer >= 1"),
        ("batch_size = 8", "batch_size = true", "[train] batch_size must be an integer >= 1"),
        ("warmup_steps = 2", "warmup_steps = -1", "[train] warmup_steps must be an integer >= 0"),
        ("lr = 3e-3", "lr = 0", "[train] lr must be a number > 0"),
        ("passkey_frac = 0.25", "passkey_frac = 1.5", "[train] passkey_frac must be a number in [0, 1]"),
        ("threads = 1", "threads = 1\nbetas = [0.9]", "[train] betas must be two numbers in [0, 1)"),
        ("n_windows = 1", "n_windows = 0", "[eval] n_windows must be an integer >= 1"),
        (
            "length_mults = [0.25",
            "length_mults = [-0.25",
            "[eval] length_mults must be a non-empty list of numbers > 0",
        ),
        ("passkey_mults = [1, 2, 4]", "passkey_mults = []", "[eval] passkey_mults must be a non-empty list"),
        ("passkey_depths = [0.0, 0.5, 1.0]", "passkey_depths = [0.5, 2]", "[eval] passkey_depths must be a non-empty"),
        ('methods = ["softmax"', 'methods = ["sofmax"', "[study] unknown methods ['sofmax']; known: softmax"),
        ('positions = ["nape"]', 'positions = ["napes"]', "[study] unknown positions ['napes']"),
        ('positions = ["nape"]', 'positions = "nape"', "[study] positions must be a non-empty list of names"),
        ("seeds = [0]", "seeds = [0, 0]", "[study] seeds must be distinct, got [0, 0]"),
        ("seeds = [0]", "seeds = [-1]", "[study] seeds must be a non-empty list of integers >= 0"),
    ],
)
def test_bad_types_and_ranges_are_refused(tmp_path, old, new, named):
    path = _variant(tmp_path, old, new)
    with pytest.raises(ConfigError) as e:
        load_study_config(path=str(path))
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and named in msg and "\n" not in msg


def test_an_unknown_preset_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"no LM preset 'nope'; available: cpu, quick"):
        load_study_config("nope")


def test_study_overrides_are_checked_before_anything_runs(tmp_path):
    cfg = load_study_config("quick")
    with pytest.raises(ConfigError, match=r"\[study\] unknown methods \['sofmax'\]"):
        run_study(cfg, tmp_path / "out", methods=["sofmax"], printer=lambda *_: None)
    with pytest.raises(ConfigError, match=r"\[study\] seeds must be distinct"):
        run_study(cfg, tmp_path / "out", seeds=[1, 1], printer=lambda *_: None)
    assert not (tmp_path / "out").exists()


def test_steps_override_of_lm_run(tmp_path, capsys):
    out = tmp_path / "lmq"
    assert main(["lm", "run", "--quick", "--steps", "2", "--methods", "softmax", "--out", str(out)]) == 0
    run = out / "softmax-nape-s0"
    assert json.loads((run / "config.json").read_text())["train"]["steps"] == 2
    assert json.loads((run / "eval.json").read_text())["steps"] == 2
    assert [p.name for p in out.glob("*-s0")] == ["softmax-nape-s0"]
    capsys.readouterr()
    assert main(["lm", "run", "--quick", "--steps", "0", "--out", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "--steps: [train] steps must be an integer >= 1, got 0" in err and not (tmp_path / "none").exists()


def test_sections_check_themselves_when_built_directly():
    assert LMTrain(steps=7).steps == 7 and LMEval(n_windows=2).n_windows == 2
    with pytest.raises(ConfigError, match=r"\[model\] is not a valid model config for softmax/nape"):
        LMStudyConfig(model={"n_heads": 3}, study=LMStudyGrid(methods=("softmax",)))
