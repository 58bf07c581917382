"""The model registry (longsparse.models): architectures by name, save/load through it for both architectures,
`model.arch` in run configs, what every architecture shares (its attention settings, stored as the table
`attention`; greedy generation), and what older code wrote: an HSA run folder from before `model.arch` existed
(tests/data/hsa_legacy: its config named HSA as the method; `longsparse migrate` rewrote it) loads, gives the same
logits and evaluates; the model sections and their hashes are pinned (with the hashes of their flat form of schema
2), and checkpoints written by the flat configs (tests/data/checkpoints) compute the same once migrated."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import shutil

import pytest
import torch
from helpers.paths import DATA

from longsparse.cli import main
from longsparse.hsa import HSAConfig, HSAModel
from longsparse.migrate import flat_attention, nest_attention, schema2_hash
from longsparse.models import (
    ARCHITECTURES,
    architecture_of,
    build_model,
    config_section,
    get_architecture,
    load_checkpoint,
    model_config,
    read_checkpoint,
    save_checkpoint,
)
from longsparse.nn import AttentionSettings, ModelConfig, Transformer
from longsparse.train import ConfigError, build_config, config_hash, resolve
from longsparse.train.config import attention_of, run_label

LEGACY = DATA / "hsa_legacy"
CHECKPOINTS = DATA / "checkpoints"
pytestmark = pytest.mark.usefixtures("one_thread")

SECTIONS = {
    "transformer": {
        "d_model": 16,
        "n_layers": 2,
        "n_heads": 2,
        "d_ff": 24,
        "attention": {"method": "asentmax", "positions": "nape"},
    },
    "hsa": {
        "arch": "hsa",
        "d_model": 16,
        "n_heads": 2,
        "d_ff": 24,
        "n_lower": 1,
        "n_upper": 1,
        "chunk_size": 4,
        "window": 4,
        "attention": {"method": "entmax", "learn_alpha": True, "alpha": 1.3, "positions": "alibi"},
        "select_warmup": 2,
    },
}


def test_registry_names_and_lookups():
    assert list(ARCHITECTURES) == ["transformer", "hsa"]
    assert get_architecture("hsa").model_cls is HSAModel and get_architecture("transformer").config_cls is ModelConfig
    with pytest.raises(ValueError, match="unknown architecture 'hsb'; choose one of transformer, hsa"):
        get_architecture("hsb")
    t, h = build_model(SECTIONS["transformer"], 20), build_model(SECTIONS["hsa"], 20)
    assert isinstance(t, Transformer) and isinstance(h, HSAModel)
    assert [architecture_of(x) for x in (t, t.cfg, h, h.cfg)] == ["transformer", "transformer", "hsa", "hsa"]
    with pytest.raises(TypeError, match="not a model or config of a registered architecture"):
        architecture_of(torch.nn.Linear(2, 2))
    assert "arch" not in config_section(t.cfg) and config_section(h.cfg)["arch"] == "hsa"
    assert model_config(config_section(h.cfg)) == h.cfg
    with pytest.raises(ValueError, match="unknown HSAConfig field"):
        model_config({"arch": "hsa", "n_layers": 2}, 20)


@pytest.mark.parametrize("arch", list(SECTIONS))
def test_save_load_round_trip_through_the_registry(arch, tmp_path):
    torch.manual_seed(0)
    model = build_model(SECTIONS[arch], 20)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 20, (2, 13))
    model(x).square().mean().backward()
    opt.step()
    path = save_checkpoint(str(tmp_path / "m.pt"), model, opt, extra={"step": 1})
    assert read_checkpoint(path)["arch"] == arch
    loaded, extra = load_checkpoint(path)
    assert type(loaded) is type(model) and loaded.cfg == model.cfg and extra == {"step": 1}
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    model.eval()
    loaded.eval()
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    opt2 = torch.optim.AdamW(loaded.parameters(), lr=1e-2)
    load_checkpoint(path, optimizer=opt2, model=loaded)  # into a given model, with the optimizer state
    other = build_model({**SECTIONS[arch], "d_ff": 32}, 20)
    with pytest.raises(ValueError, match="config differs"):
        load_checkpoint(path, model=other)


def test_unknown_architecture_in_a_file_is_named(tmp_path):
    path = save_checkpoint(str(tmp_path / "m.pt"), build_model(SECTIONS["transformer"], 20))
    payload = torch.load(path, weights_only=True)
    payload["arch"] = "mamba"
    torch.save(payload, path)
    with pytest.raises(ValueError, match="m.pt: unknown architecture 'mamba'"):
        load_checkpoint(path)
    with pytest.raises(TypeError, match="registered architecture"):
        save_checkpoint(str(tmp_path / "x.pt"), torch.nn.Linear(2, 2))


# ----------------------------------------------------------------------------------- older files
def test_legacy_hsa_checkpoint_gives_the_same_logits():
    """A checkpoint written before model.arch existed; float64 logits and greedy tokens computed then."""
    expected = torch.load(LEGACY / "expected.pt", weights_only=True)
    model, extra = load_checkpoint(str(LEGACY / "run" / "checkpoints" / "last.pt"))
    assert isinstance(model, HSAModel) and extra["step"] == 3 and int(model.select_steps) == 3
    assert (model.cfg.attention.method, model.cfg.attention.positions) == (
        "softmax",
        "rope",
    )  # the token attention of that code
    model = model.double().eval()
    with torch.no_grad():
        logits = model(expected["input_ids"])[:, expected["rows"]]
        torch.testing.assert_close(logits, expected["logits"], rtol=0, atol=1e-10)
        prompt = expected["input_ids"][:, : expected["prompt_len"]]
        assert torch.equal(model.generate(prompt, 4), expected["generated"])


def test_legacy_hsa_run_config_is_read_once_migrated_evaluates_and_keeps_its_label(tmp_path):
    from longsparse.evaluate import evaluate_run
    from longsparse.evaluate.sweep import load_run_model
    from longsparse.migrate import migrate_run_config

    old = json.loads((LEGACY / "config_schema1.json").read_text())  # the config as that code wrote it
    assert (old["model"]["method"], old["model"]["positions"]) == ("hsa", "hsa")  # the old form
    with pytest.raises(ConfigError, match=r"model.method is now model.attention.method.*`longsparse migrate FILE`"):
        resolve(old)  # read by the migration only
    stored = json.loads((LEGACY / "run" / "config.json").read_text())  # the run folder's, migrated
    assert migrate_run_config(old) == stored and stored["legacy_hash"] == config_hash(old)
    cfg = resolve(stored)
    m = cfg["model"]
    assert (m["arch"], m["attention"]["method"], m["attention"]["positions"]) == ("hsa", "softmax", "rope")
    assert run_label(cfg) == "hsa[weights=softmax,hsa_positions=rope,length_scale=learned]"
    assert resolve(cfg) == cfg  # today's form is a fixed point
    run = tmp_path / "run"
    shutil.copytree(LEGACY / "run", run)
    model, _, _ = load_run_model(run, "last")
    assert isinstance(model, HSAModel)
    _, res = evaluate_run(run, [48], samples=2, checkpoint="last", printer=None, write=False, progress=False)
    assert (res["arch"], res["method"], res["label"]) == ("hsa", "softmax", run_label(cfg))
    assert res["results"][0]["needles"]["n"] == 2  # the architecture's needle scorer


# ------------------------------------------------------------------------------------ run configs
def test_arch_selects_the_model_table_and_method_stays_the_mapping():
    hsa = build_config("passkey", arch="hsa", method="entmax", positions="alibi", steps=2)
    assert (hsa["model"]["arch"], attention_of(hsa)["method"], attention_of(hsa)["positions"]) == (
        "hsa",
        "entmax",
        "alibi",
    )
    assert "n_layers" not in hsa["model"] and hsa["model"]["chunk_size"] == 16  # the [hsa] table
    assert build_config("passkey", sets=["model.arch=hsa"], steps=2)["model"]["arch"] == "hsa"
    dec = build_config("passkey", method="entmax", steps=2)
    assert "arch" not in dec["model"] and dec["model"]["n_layers"] == 2  # the [model] table
    # naming the default architecture changes nothing, not even the run's identity
    explicit = resolve({**dec, "model": {**dec["model"], "arch": "transformer"}})
    assert explicit == dec and config_hash(explicit) == config_hash(dec)
    with pytest.raises(ConfigError, match="'hsa' is an architecture, not a method: use --arch hsa"):
        build_config("passkey", method="hsa")
    with pytest.raises(ConfigError, match=r"has no \[hsa\] table"):
        build_config("copy", arch="hsa")
    with pytest.raises(ConfigError, match="unknown architecture 'rnn'"):
        build_config("passkey", arch="rnn")
    with pytest.raises(ConfigError, match="unknown method 'entmax15'; valid methods: softmax, entmax"):
        resolve({**hsa, "model": {**hsa["model"], "attention": {"method": "entmax15"}}})
    with pytest.raises(ConfigError, match=r"invalid hsa model config: unknown HSAConfig field\(s\): n_layers"):
        resolve({**hsa, "model": {**hsa["model"], "n_layers": 2}})


def test_cli_refuses_method_hsa_naming_arch(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--task", "passkey", "--method", "hsa", "--out", str(tmp_path / "r")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "hsa is an architecture, not a method: use --arch hsa" in err
    assert not (tmp_path / "r").exists()
    assert (
        main(
            ["train", "--task", "passkey", "--arch", "hsa", "--method", "asentmax", "--out", "unused", "--print-config"]
        )
        == 0
    )
    cfg = json.loads(capsys.readouterr().out)
    assert (cfg["model"]["arch"], attention_of(cfg)["method"]) == ("hsa", "asentmax")


# ------------------------------------------------------------------ the stored forms of the model configs
ATTENTION_KEYS = [
    "method",
    "positions",
    "alpha",
    "learn_alpha",
    "max_alpha",
    "topk",
    "adatemp_order",
    "rope_theta",
    "nape_slopes",
    "asentmax_init",
    "asentmax_scaler",
    "asentmax_delta",
    "asentmax_gamma_range",
    "ssmax_init",
    "attn_chunk_size",
    "attn_backend",
]
TRANSFORMER_KEYS = [
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "head_dim",
    "d_ff",
    "norm_eps",
    "init_std",
    "attention",
]
HSA_KEYS = [
    "arch",
    "vocab_size",
    "d_model",
    "n_heads",
    "head_dim",
    "d_ff",
    "n_lower",
    "n_upper",
    "upper_group_size",
    "encoder_layers",
    "chunk_size",
    "window",
    "topk",
    "landmark",
    "fusion",
    "weights",
    "retrieval",
    "hsa_positions",
    "retrieval_dim",
    "entmax_alpha",
    "entmax_cap",
    "length_scale",
    "length_gamma",
    "gumbel_noise",
    "select_warmup",
    "select_warmup_topk",
    "hsa_local",
    "hsa_impl",
    "norm_eps",
    "init_std",
    "branch_gain",
    "attention",
]
# name: (config, its keys, sha256 of json.dumps(section) (keys in order, values), config_hash({"model": section}),
# the config hash of its flat section in schema 2: the hashes pinned before the settings were nested)
PINNED_SECTIONS = {
    "transformer_default": (
        lambda: ModelConfig(vocab_size=32),
        TRANSFORMER_KEYS,
        "390384e44665a639",
        "88ba86b05135cd8a",
        "8361f5ce542ee838",
    ),
    "transformer_asentmax_nape": (
        lambda: ModelConfig(
            vocab_size=32,
            attention=AttentionSettings(
                method="asentmax", positions="nape", topk=8, asentmax_init="reference", attn_backend="reference"
            ),
        ),
        TRANSFORMER_KEYS,
        "d455663054a5d8b9",
        "d8fddf0fa07500da",
        "28a3ffc98d34fb1f",
    ),
    "hsa_default": (
        lambda: HSAConfig(vocab_size=32),
        HSA_KEYS,
        "f44a5908832924e5",
        "e6b5102449ebd595",
        "ccff462703982ec5",
    ),
    "hsa_entmax": (
        lambda: HSAConfig(
            vocab_size=32,
            weights="entmax",
            entmax_cap=3,
            attention=AttentionSettings(method="entmax", positions="nape", alpha=1.3, topk=8, attn_chunk_size=64),
        ),
        HSA_KEYS,
        "7f67d2ac70296a27",
        "75c61c9b26a85c9b",
        "b99f62b2febdcd14",
    ),
}


@pytest.mark.parametrize("name", list(PINNED_SECTIONS))
def test_model_sections_their_hashes_and_their_schema2_hashes_are_pinned(name):
    make_config, keys, ordered_sha, identity, schema2 = PINNED_SECTIONS[name]
    cfg = make_config()
    section = config_section(cfg)
    assert list(section) == keys and list(section["attention"]) == ATTENTION_KEYS
    assert hashlib.sha256(json.dumps(section).encode()).hexdigest()[:16] == ordered_sha
    assert config_hash({"model": section}) == identity
    # the same config in the flat form of schema 2 has the hash it had then
    assert schema2_hash({"model": section}) == schema2 != identity
    assert nest_attention(flat_attention(section)) == section
    rebuilt = model_config(section)  # the stored form builds the same config
    assert rebuilt == cfg and list(config_section(rebuilt).items()) == list(section.items())


@pytest.mark.parametrize("cls", [ModelConfig, HSAConfig])
def test_every_field_round_trips_through_the_stored_form(cls):
    """Every own field and every attention setting set to a value other than its default comes back."""
    settings = AttentionSettings(
        method="asentmax",
        positions="alibi",
        alpha=1.25,
        learn_alpha=True,
        max_alpha=3.0,
        topk=5,
        adatemp_order="reversed",
        rope_theta=500.0,
        nape_slopes="geometric",
        asentmax_init="reference",
        asentmax_scaler="static",
        asentmax_delta=0.5,
        asentmax_gamma_range=1.5,
        ssmax_init=0.7,
        attn_chunk_size=16,
        attn_backend="reference",
    )
    own = dict(vocab_size=9, d_model=12, n_heads=2, head_dim=8, d_ff=20, norm_eps=1e-5, init_std=0.03)
    if cls is ModelConfig:
        own.update(n_layers=3)
    else:
        own.update(
            n_lower=1, n_upper=4, upper_group_size=2, encoder_layers=2, chunk_size=8, window=6, topk=3,
            landmark="encoder_mean", fusion="standard", weights="entmax", retrieval="chunk", hsa_positions="rope",
            retrieval_dim=6, entmax_alpha=1.7, entmax_cap=2, length_scale="learned", length_gamma=0.5,
            gumbel_noise=0.1, select_warmup=5, select_warmup_topk=3, hsa_local=False, hsa_impl="gather",
            branch_gain=0.2,
        )  # fmt: skip
    default = cls(vocab_size=9)
    assert all(getattr(default, k) != v for k, v in own.items() if k != "vocab_size")
    assert all(getattr(default.attention, f.name) != getattr(settings, f.name) for f in dataclasses.fields(settings))
    cfg = cls(**own, attention=settings)
    stored = cfg.to_dict()
    assert set(stored) == set(cls.STORED_KEYS) | {"attention"} and stored["attention"] == dataclasses.asdict(settings)
    assert cls.from_dict(json.loads(json.dumps(stored))) == cfg


def test_checkpoints_of_the_flat_configs_are_refused_then_load_once_migrated(tmp_path):
    """tiny checkpoints (float32 weights, checkpoint version 1) written by the flat configs, with the float64 logits
    and greedy tokens of their models then: refused naming `longsparse migrate`; migrated, the stored config
    reads back key for key in today's form and the outputs agree."""
    for name in ("transformer_asentmax_nape", "hsa_entmax"):
        path = tmp_path / f"{name}.pt"
        shutil.copy(CHECKPOINTS / f"{name}.pt", path)
        flat = torch.load(path, weights_only=True)["config"]
        with pytest.raises(
            ValueError, match=f"unsupported checkpoint version 1: rewrite it once with `longsparse migrate {path}`"
        ):
            load_checkpoint(str(path))
        assert main(["migrate", str(path)]) == 0
        stored = read_checkpoint(str(path))["config"]
        assert stored == nest_attention(flat, "hsa" if name.startswith("hsa") else "transformer") != flat
        model, extra = load_checkpoint(str(path))
        assert model.cfg.to_dict() == stored and list(model.cfg.to_dict()) == list(stored)
        assert model.cfg.attention.learn_alpha and model.cfg.attention.method in ("asentmax", "entmax")
        exact = copy.deepcopy(model).double().eval()
        with torch.no_grad():
            torch.testing.assert_close(exact(extra["input_ids"]), extra["logits"], rtol=0, atol=1e-12)
        prompt = extra["input_ids"][:, : extra["prompt_len"]]
        for use_cache in (True, False):
            assert torch.equal(exact.generate(prompt, 6, use_cache=use_cache), extra["generated"])
        written = path.read_bytes()
        assert main(["migrate", str(path)]) == 0 and path.read_bytes() == written  # once


def test_attention_settings_are_a_plain_field_stored_nested():
    t = ModelConfig.from_dict(
        {"vocab_size": 8, "d_model": 8, "n_heads": 2, "attention": {"method": "softmax", "topk": 3}}
    )
    h = HSAConfig.from_dict(
        {"vocab_size": 8, "d_model": 8, "n_heads": 2, "topk": 5, "attention": {"topk": 3, "method": "entmax"}}
    )
    assert t.attention == AttentionSettings(method="softmax", topk=3)
    # HSA's own topk counts retrieved chunks; the top-k mapping's k is attention.topk, over HSA's default settings
    assert h.attention == AttentionSettings(method="entmax", positions="rope", topk=3) and h.topk == 5
    assert HSAConfig(vocab_size=8).attention == AttentionSettings(method="softmax", positions="rope")
    assert (h.to_dict()["topk"], h.to_dict()["attention"]["topk"], t.to_dict()["attention"]["method"]) == (
        5,
        3,
        "softmax",
    )
    for flat in ("method", "attn_topk", "alpha"):  # the settings are read through ``attention`` only
        assert not hasattr(t, flat) and not hasattr(h, flat) and flat not in t.to_dict() and flat not in h.to_dict()
    with pytest.raises(TypeError, match="unexpected keyword argument 'method'"):
        ModelConfig(vocab_size=8, method="softmax")
    # given settings are copied: no two configs share their settings
    shared = AttentionSettings(alpha=1.3)
    a, b = ModelConfig(vocab_size=8, attention=shared), ModelConfig(vocab_size=8, attention=shared)
    a.attention.alpha = 1.2
    assert (shared.alpha, a.attention.alpha, b.attention.alpha) == (1.3, 1.2, 1.3)
    assert h.attention_config("nope").attention == dataclasses.replace(h.attention, positions="nope")
    assert h.attention_config().attention == h.attention and h.attention_config().attention is not h.attention
    with pytest.raises(TypeError, match="attention must be an AttentionSettings"):
        ModelConfig(vocab_size=8, attention={"method": "entmax"})
    # strict: a setting given flat, a renamed key of schema 2, an unknown setting, a wrong type, all named
    with pytest.raises(ValueError, match=r"unknown ModelConfig field\(s\): alpha \(alpha is attention.alpha\)"):
        ModelConfig.from_dict({"vocab_size": 8, "alpha": 1.3})
    with pytest.raises(ValueError, match=r"unknown HSAConfig field\(s\): attn_topk$"):
        HSAConfig.from_dict({"vocab_size": 8, "attn_topk": 3})
    with pytest.raises(ValueError, match=r"unknown attention setting\(s\): attention.alpah"):
        ModelConfig.from_dict({"vocab_size": 8, "attention": {"alpah": 1.3}})
    with pytest.raises(ValueError, match="attention must be a table of attention settings, got 'entmax'"):
        ModelConfig.from_dict({"vocab_size": 8, "attention": "entmax"})
    with pytest.raises(ValueError, match="attention.topk must be a positive integer"):
        HSAConfig.from_dict({"vocab_size": 8, "attention": {"topk": 0}})
    with pytest.raises(ValueError, match="attention.topk must be an integer, got 'x'"):
        HSAConfig.from_dict({"vocab_size": 8, "attention": {"topk": "x"}})
    with pytest.raises(ValueError, match="attention.learn_alpha must be true or false, got 1"):
        ModelConfig.from_dict({"vocab_size": 8, "attention": {"learn_alpha": 1}})
    with pytest.raises(ValueError, match="d_model must be an integer, got 'abc'"):
        ModelConfig.from_dict({"vocab_size": 8, "d_model": "abc"})
    with pytest.raises(ValueError, match="unknown attention.method 'flash'"):
        HSAConfig(vocab_size=8, attention=AttentionSettings(method="flash", positions="rope"))


# ------------------------------------------------------------------------------- shared greedy generation
@pytest.mark.parametrize("arch", list(SECTIONS))
def test_generation_checks_eos_and_mode_are_shared_by_every_architecture(arch):
    torch.manual_seed(0)
    model = build_model(SECTIONS[arch], 20).double().train()
    prompt = torch.randint(0, 20, (2, 9), generator=torch.Generator().manual_seed(1))
    steps = dict(model.named_buffers()).get("select_steps")
    before = None if steps is None else int(steps)
    free = model.generate(prompt, 6)
    assert model.training and (steps is None or int(steps) == before)  # decoded in eval mode, mode restored
    with torch.no_grad():
        assert torch.equal(free, model.eval().generate(prompt, 6, use_cache=False))
    eos = int(free[0, 2])
    out = model.generate(prompt, 6, eos_id=eos)
    for row, tokens in zip(out, free):
        first = tokens.tolist().index(eos) if eos in tokens.tolist() else 6
        assert torch.equal(row[: first + 1], tokens[: first + 1]) and (row[first:] == eos).all()
    assert model.generate(prompt, 0).shape == (2, 0)
    for bad, kw, msg in [
        (prompt, dict(max_new_tokens=-1), "max_new_tokens must be >= 0"),
        (prompt[:, :0], {}, "prompt_ids must have shape"),
        (prompt, dict(attention_mask=torch.ones(2, 8)), "attention_mask must have shape"),
        (prompt, dict(attention_mask=torch.zeros(2, 9)), "at least one real"),
    ]:
        with pytest.raises(ValueError, match=msg):
            model.generate(bad, **{"max_new_tokens": 3, **kw})
