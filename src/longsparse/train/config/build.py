"""Building a run config: a preset file (or any TOML file), its architecture / method / positions tables, the
overrides of code and study files (``apply_overrides``), the ``--set`` strings (``apply_sets``) and the explicit
flags, merged in that order and resolved (``build_config``)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from longsparse.models import ARCHITECTURES, DEFAULT_ARCH
from longsparse.nn.config import ATTENTION_KEY
from longsparse.train.config.errors import ConfigError
from longsparse.train.config.presets import load_toml, parse_value, preset_path, task_name
from longsparse.train.config.resolve import SECTIONS, attention_of, check_nested_attention, not_a_method, resolve


def deep_merge(base: dict, over: Mapping) -> dict:
    """A copy of ``base`` with ``over`` merged in: tables merge key by key, any other value replaces."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def apply_sets(cfg: dict, sets: Iterable[str]) -> dict:
    """``cfg`` with the ``--set section.key=value`` strings applied in order (the value parsed as TOML)."""
    cfg = copy.deepcopy(cfg)
    for item in sets or ():
        if "=" not in item:
            raise ConfigError(f"--set expects section.key=value, got {item!r}")
        key, _, text = item.partition("=")
        parts = [p for p in key.strip().split(".") if p]
        if len(parts) < 2 or parts[0] not in SECTIONS:
            raise ConfigError(
                f"--set key must start with one of {', '.join(SECTIONS)} (e.g. train.lr=3e-4), got {key!r}"
            )
        node = cfg
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {p!r} is not a table")
        node[parts[-1]] = parse_value(text.strip())
    return cfg


def apply_overrides(cfg: dict, overrides: Mapping | None) -> dict:
    """``cfg`` with ``overrides`` deep-merged over it: the library's form of ``--set``, a nested table of the
    sections task/model/train such as ``{"model": {"d_model": 64}, "train": {"lr": 2e-3}}`` (in TOML a table
    with dotted keys, ``model.d_model = 64``). A value replaces the config's value; a table merges into the
    config's table of that name. A table given where the config has a value, or a value where it has a table,
    is refused."""
    if not overrides:
        return copy.deepcopy(cfg)
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"overrides must be a table of the sections {', '.join(SECTIONS)}, got {overrides!r}")
    for section, table in overrides.items():
        if section not in SECTIONS:
            raise ConfigError(
                f"override section must be one of {', '.join(SECTIONS)} (e.g. train.lr = 3e-4), got {section!r}"
            )
        if not isinstance(table, Mapping):
            raise ConfigError(f"override {section} must be a table (e.g. {section}.key = value), got {table!r}")
        _check_override_tables(cfg.get(section), table, section)
    return deep_merge(cfg, overrides)


def _check_override_tables(have: Any, over: Mapping, key: str) -> None:
    """Every table of ``over`` lands on a table (or nothing) of ``have``, and no value replaces a table."""
    if have is not None and not isinstance(have, Mapping):
        raise ConfigError(f"override {key} is a table, but the config's {key} is not one (it is {have!r})")
    for k, v in over.items():
        inner = have.get(k) if isinstance(have, Mapping) else None
        if isinstance(v, Mapping):
            _check_override_tables(inner, v, f"{key}.{k}")
        elif isinstance(inner, Mapping):
            raise ConfigError(f"override {key}.{k} must be a table ({key}.{k} is one), got {v!r}")


def build_config(
    task: str,
    *,
    preset: str = "cpu",
    arch: str | None = None,
    method: str | None = None,
    positions: str | None = None,
    seed: int | None = None,
    steps: int | None = None,
    sets: Iterable[str] = (),
    config_file: str | None = None,
    overrides: Mapping | None = None,
) -> dict:
    """Resolve preset file + architecture table + method/positions tables + ``overrides`` + ``--set`` + flags
    into a validated run config.

    ``overrides`` is a nested table ``{"model": {"d_model": 64}, "train": {...}}`` (``apply_overrides``), the
    form code and study files give; ``sets`` are ``--set`` strings (``"model.d_model=64"``), applied after it so
    that the command line wins. A ``model.arch`` in either selects the architecture's table as ``arch`` does.
    The run is for ``task``: a file or an override naming another task is refused, never trained."""
    want = task_name(task)
    source = Path(config_file) if config_file else preset_path(task, preset)
    raw = load_toml(source)
    unknown = sorted(set(raw) - set(SECTIONS) - set(ARCHITECTURES) - {"methods", "positions", "description"})
    if unknown:
        raise ConfigError(
            f"config file has unknown top-level key(s) {unknown}; allowed: "
            f"{', '.join([*SECTIONS, *ARCHITECTURES])}, methods, positions, description"
        )
    if method is not None and method in ARCHITECTURES:
        raise ConfigError(not_a_method(method))
    asked = _arch_override(overrides, sets, f"{ATTENTION_KEY}.method")
    if isinstance(asked, str) and asked in ARCHITECTURES:
        raise ConfigError(not_a_method(asked))
    cfg = {s: copy.deepcopy(raw.get(s, {})) for s in SECTIONS}
    cfg["model"] = _model_table(raw, source, arch if arch is not None else _arch_override(overrides, sets))
    cfg["task"].setdefault("name", task)
    if task_name(cfg["task"]["name"]) != want:
        raise ConfigError(f"{source} is a config for task {cfg['task']['name']!r}, not for the requested task {want!r}")
    check_nested_attention(cfg["model"], f"{source}: ")
    flags = {k: v for k, v in (("method", method), ("positions", positions)) if v is not None}
    flag_tables = {"model": {ATTENTION_KEY: flags}} if flags else {}
    cfg = deep_merge(cfg, flag_tables)
    settings = attention_of(cfg)
    cfg = deep_merge(cfg, raw.get("methods", {}).get(settings.get("method"), {}))
    cfg = deep_merge(cfg, raw.get("positions", {}).get(settings.get("positions"), {}))
    cfg = apply_overrides(cfg, overrides)
    cfg = apply_sets(cfg, sets)
    if task_name(cfg["task"].get("name")) != want:
        raise ConfigError(f"an override sets task.name={cfg['task'].get('name')!r}, not the requested task {want!r}")
    cfg = apply_overrides(cfg, flag_tables)  # the flags win over every table
    if seed is not None:
        cfg["train"]["seed"] = seed
    if steps is not None:
        cfg["train"]["steps"] = steps
    return resolve(cfg)


def _arch_override(overrides: Mapping | None, sets: Iterable[str], key: str = "arch") -> str | None:
    """The architecture the overrides ask for (``key`` = "attention.method": the method), or None: the last
    ``--set model.arch=NAME``, else ``model.arch`` of ``overrides`` (the order ``build_config`` applies them in).
    A malformed ``overrides`` asks for none here; ``apply_overrides`` refuses it."""
    found = overrides.get("model") if isinstance(overrides, Mapping) else None
    for part in key.split("."):
        found = found.get(part) if isinstance(found, Mapping) else None
    for item in sets or ():
        name, sep, text = item.partition("=")
        if sep and name.strip() == f"model.{key}":
            found = parse_value(text.strip())
    return found


def _model_table(raw: Mapping, source: Path, arch: str | None) -> dict:
    """The model section of a config file for architecture ``arch`` (None: the file's own): ``[model]`` when
    ``arch`` is its ``arch`` (default transformer), else the table named after ``arch``."""
    model = raw.get("model", {})
    own = model.get("arch", DEFAULT_ARCH)
    if arch is None or arch == own:
        return copy.deepcopy(dict(model))
    if arch not in ARCHITECTURES:
        raise ConfigError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHITECTURES)}")
    if not isinstance(raw.get(arch), Mapping):
        raise ConfigError(
            f"{source} has no [{arch}] table, the model section for --arch {arch} (its [model] table is a {own} model)"
        )
    table = copy.deepcopy(dict(raw[arch]))
    if table.get("arch", arch) != arch:
        raise ConfigError(f"{source}: the [{arch}] table sets arch = {table['arch']!r}")
    return {**table, "arch": arch}
