"""Resolving a run config: every section filled with its defaults and validated (``resolve``), the task and the
model it names (``make_task``, ``build_model``) and its series label (``run_label``)."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from longsparse.models import ARCHITECTURES, DEFAULT_ARCH, config_section, get_architecture, model_config
from longsparse.models import build_model as _build_model
from longsparse.nn.config import ATTENTION_KEY
from longsparse.train.config.errors import ConfigError
from longsparse.train.config.identity import FORM_KEYS, SCHEMA_VERSION
from longsparse.train.config.training import TRAIN_DEFAULTS, TrainConfig

SECTIONS = ("task", "model", "train")
# Keys of a model section that named an attention setting otherwise before the settings were a table (HSA's
# ``attn_topk``, beside its own ``topk``): refused naming the setting.
RENAMED_SETTINGS = {"attn_topk": "topk"}


def resolve(cfg: Mapping) -> dict:
    """Fill defaults and validate every section; returns a JSON-able dict (raises ConfigError): ``schema_version``
    (``SCHEMA_VERSION``), the sections ``task``, ``model``, ``train`` and, when ``cfg`` has one, ``legacy_hash``.

    A config without ``schema_version`` is read in this version's form (a config written by hand or in code);
    one of an older version is refused, naming ``longsparse migrate``. Every run starts here (``train`` calls it
    before touching the run folder), so a config that cannot train is refused before anything is written."""
    unknown = sorted(set(cfg) - set(SECTIONS) - set(FORM_KEYS))
    if unknown:
        raise ConfigError(f"unknown config section(s) {unknown}; sections: {', '.join(SECTIONS)}")
    form = check_form(cfg)
    _check_finite(cfg)
    t = dict(cfg.get("task", {}))
    bad = sorted(set(t) - {"name", "preset", "params"})
    if bad:
        raise ConfigError(
            f"unknown task key(s) {bad}; allowed: name, preset, params (task parameters go in task.params)"
        )
    if "name" not in t:
        raise ConfigError("config has no task.name")
    if not isinstance(t.get("params") or {}, Mapping):
        raise ConfigError(f"task.params must be a table of task parameters, got {t['params']!r}")
    task_cfg = {"name": t["name"], "preset": t.get("preset"), "params": dict(t.get("params") or {})}
    task = make_task(task_cfg)
    task_cfg["name"] = task.name

    model = dict(cfg.get("model", {}))
    if "vocab_size" in model:
        raise ConfigError("model.vocab_size is set from the task; do not give it")
    model_cfg = _resolve_model(model, task)

    tr = copy.deepcopy(dict(cfg.get("train", {})))
    bad = sorted(set(tr) - set(TRAIN_DEFAULTS))
    if bad:
        raise ConfigError(f"unknown train key(s) {bad}; valid: {', '.join(TRAIN_DEFAULTS)}")
    train = TrainConfig(**tr).for_task(task).as_dict()
    return {"schema_version": SCHEMA_VERSION, "task": task_cfg, "model": model_cfg, "train": train, **form}


def check_form(cfg: Mapping) -> dict:
    """``{"legacy_hash": ...}`` of a run config that has one ({} otherwise), after checking its ``schema_version``
    (absent: this version) and ``legacy_hash`` (a 16-digit hex hash); ConfigError naming the problem."""
    version = cfg.get("schema_version", SCHEMA_VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        raise ConfigError(f"schema_version must be an integer, got {version!r}")
    if version < SCHEMA_VERSION:
        raise ConfigError(
            f"run config of schema_version {version}; this longsparse reads {SCHEMA_VERSION}: "
            f"rewrite the file once with `longsparse migrate FILE`"
        )
    if version > SCHEMA_VERSION:
        raise ConfigError(
            f"run config of schema_version {version}, newer than this longsparse reads ({SCHEMA_VERSION}): "
            f"use a newer longsparse"
        )
    if "legacy_hash" not in cfg:
        return {}
    legacy = cfg["legacy_hash"]
    if not isinstance(legacy, str) or len(legacy) != 16 or set(legacy) - set("0123456789abcdef"):
        raise ConfigError(f"legacy_hash must be a 16-digit hex config hash, got {legacy!r}")
    return {"legacy_hash": legacy}


def not_a_method(name: str) -> str:
    """The message for an architecture's name given as the attention method."""
    from longsparse.nn import METHODS

    return (
        f'{name!r} is an architecture, not a method: use --arch {name} (config key model.arch = "{name}"); '
        f"the method is the attention mapping of any architecture ({', '.join(METHODS)})"
    )


def attention_of(cfg: Mapping) -> dict:
    """The attention settings of a run config (resolved, or being built): ``cfg["model"]["attention"]`` ({} when
    the section or the table is absent). The one accessor for readers of the settings (method, positions, α,
    ...)."""
    model = cfg.get("model")
    settings = model.get(ATTENTION_KEY) if isinstance(model, Mapping) else None
    return settings if isinstance(settings, dict) else {}


def check_nested_attention(model: Mapping, where: str = "", *, any_arch: bool = False) -> None:
    """ConfigError (prefixed by ``where``) naming the new key for an attention setting given flat in a model
    section (``model.alpha``, the form before schema 3): the settings are the table ``model.attention``
    (``model.attention.alpha``). An architecture whose own field shares a setting's name (HSA's chunk ``topk``)
    keeps it: the one ``model.arch`` names, or with ``any_arch`` (a table that may not name it, as a study's
    overrides) any registered one."""
    from longsparse.nn.config import ATTENTION_FIELDS

    archs = list(ARCHITECTURES) if any_arch else [model.get("arch", DEFAULT_ARCH)]
    own = {k for a in archs if a in ARCHITECTURES for k in get_architecture(a).config_cls.STORED_KEYS}
    flat = [k for k in model if (k in ATTENTION_FIELDS and k not in own) or k in RENAMED_SETTINGS]
    if flat:
        k = flat[0]
        raise ConfigError(
            f"{where}model.{k} is now model.{ATTENTION_KEY}.{RENAMED_SETTINGS.get(k, k)} (the attention settings "
            "are a table; `longsparse migrate FILE` rewrites a run config of older code)"
        )


def _resolve_model(model: dict, task) -> dict:
    """The model section with every field of its architecture's config, validated (``arch`` kept only when it
    is not the default)."""
    from longsparse.nn import METHODS, POSITIONS

    name = model.pop("arch", DEFAULT_ARCH)
    if name not in ARCHITECTURES:
        raise ConfigError(f"unknown model.arch {name!r}; choose one of {', '.join(ARCHITECTURES)}")
    check_nested_attention({**model, "arch": name})
    settings = model.get(ATTENTION_KEY, {})
    if not isinstance(settings, Mapping):
        raise ConfigError(f"model.{ATTENTION_KEY} must be a table of attention settings, got {settings!r}")
    # the two axes every architecture has: named here so that a typo gets the list of valid values
    if "method" in settings and settings["method"] not in METHODS:
        raise ConfigError(
            not_a_method(settings["method"])
            if settings["method"] in ARCHITECTURES
            else f"unknown method {settings['method']!r}; valid methods: {', '.join(METHODS)}"
        )
    if "positions" in settings and settings["positions"] not in POSITIONS:
        raise ConfigError(f"unknown positions {settings['positions']!r}; valid positions: {', '.join(POSITIONS)}")
    try:
        config = model_config({**model, "arch": name}, task.vocab_size)
    except (TypeError, ValueError) as e:
        prefix = "" if name == DEFAULT_ARCH else f"{name} "
        raise ConfigError(f"invalid {prefix}model config: {e}") from None
    out = config_section(config)
    del out["vocab_size"]
    return out


def build_model(model_cfg: Mapping, vocab_size: int):
    """The model of a resolved model section (``longsparse.models.build_model``)."""
    return _build_model(model_cfg, vocab_size)


def run_label(cfg: Mapping) -> str:
    """Series label of a resolved run config: ``method/positions`` for the default architecture; for another one
    its name plus the fields of its ``label_keys`` that differ from its config's defaults, e.g.
    ``hsa[landmark=mean,fusion=standard]``."""
    m, a = cfg["model"], attention_of(cfg)
    name = m.get("arch", DEFAULT_ARCH)
    if name == DEFAULT_ARCH:
        return f"{a['method']}/{a['positions']}"
    arch = get_architecture(name)
    default = arch.config_cls(vocab_size=2).to_dict()
    # a label key names the model's own field, or (``attention.X``) a setting; the label shows the field's name
    have = {**{f"{ATTENTION_KEY}.{k}": v for k, v in a.items()}, **m}
    want = {**{f"{ATTENTION_KEY}.{k}": v for k, v in default[ATTENTION_KEY].items()}, **default}
    diff = [f"{k.rpartition('.')[2]}={have[k]}" for k in arch.label_keys if k in have and have[k] != want[k]]
    return name + (f"[{','.join(diff)}]" if diff else "")


def make_task(task_cfg: Mapping):
    """The task object of a task section ``{"name", "preset", "params"}`` (ConfigError if it is invalid)."""
    from longsparse.tasks import get_task

    try:
        return get_task(task_cfg["name"], task_cfg.get("preset"), **dict(task_cfg.get("params") or {}))
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None


def _check_finite(node: Any, key: str = "") -> None:
    """No inf or nan anywhere: no config knob (rate, ratio, α, scale, ...) means anything when non-finite, and
    such a value only fails (or poisons the weights) after the run folder exists."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            _check_finite(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            _check_finite(v, f"{key}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(f"{key} must be a finite number, got {node!r}")
