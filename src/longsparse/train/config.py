"""Run configuration: TOML presets shipped in the package (``longsparse/configs/``), ``--set key=value`` overrides,
validation.

A *resolved* run config is a plain dict with three sections, stored as ``config.json`` in the run directory
(``RunConfig`` is the same config typed: ``RunConfig.from_dict(cfg)``, ``run.as_dict()``):

    {"task":  {"name": "copy", "preset": "cpu", "params": {...}},        # longsparse.tasks.get_task
     "model": {"d_model": 128, ..., "method": "asentmax", "positions": "nape"},   # the model's config minus vocab_size
     "train": {"steps": 800, "batch_size": 32, "lr": 1e-3, ...}}          # TRAIN_DEFAULTS

Preset files live in ``src/longsparse/configs/<task>/<preset>.toml`` (package data, so a wheel install has them;
``$LONGSPARSE_CONFIGS`` names another folder of the same layout). Besides the three sections a
file may hold ``[methods.<method>.<section>]`` and ``[positions.<positions>.<section>]`` tables, merged (in that
order) when the run uses that method / positions, so one file covers task × method × positions at one scale.
Then the overrides apply: code and study files give a nested table (``build_config(overrides={"model":
{"d_model": 64}})``, in TOML ``model.d_model = 64``), the command line ``--set section.key=value`` strings (value
parsed as a TOML value, else taken as a string), which win; last the explicit flags (``--method``,
``--positions``, ``--seed``, ``--steps``).

Architectures. ``model.arch`` names the model (``longsparse.models``: ``transformer``, the default, or ``hsa``);
the model section holds that architecture's config fields (``ModelConfig`` / ``HSAConfig`` minus ``vocab_size``).
Every architecture has ``method`` (the attention mapping and its length scaler) and ``positions``. A file's
``[model]`` table is the model of its own architecture (its ``arch`` key, default transformer); a table named
after another architecture (``[hsa]``) is the model section of a run that asks for that one (``--arch hsa`` or
``--set model.arch=hsa``), so one file holds the decoder baselines and the HSA model of a task. The resolved
section names ``arch`` only when it is not the default: transformer run configs, and so their identities, read
as they did before architectures had names. Run configs written before ``model.arch`` existed named HSA as a
method (``"method": "hsa", "positions": "hsa"``); ``resolve`` reads them as ``arch = "hsa"`` with the token
attention it then had (softmax, RoPE).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any, Optional

from longsparse.models import ARCHITECTURES, DEFAULT_ARCH, config_section, get_architecture, model_config
from longsparse.models import build_model as _build_model

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli has the same API and is a dependency there (pyproject.toml)
    import tomli as tomllib


@dataclass(frozen=True)
class TrainConfig:
    """The ``train`` section of a run config (how the one trainer trains, for every task). ``resolve`` fills the
    ``None`` lengths from the task and validates every field."""

    steps: int = 1000  # optimizer steps
    batch_size: int = 32  # GLOBAL batch (split over data-parallel ranks)
    lr: float = 1e-3  # peak learning rate
    warmup_steps: int = 100  # linear warm-up from lr/warmup_steps to lr
    min_lr_ratio: float = 0.0  # cosine decays to lr * min_lr_ratio at the last step
    betas: tuple = (0.9, 0.99)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    bf16: bool = False  # bfloat16 autocast for the forward pass
    seed: int = 0  # model init and training data stream
    train_lengths: Optional[tuple] = None  # [lo, hi] inclusive; None = the task's own training range
    log_every: int = 25
    val_every: int = 200  # 0 = only at the end
    val_lengths: Optional[tuple] = None  # None = [hi, 2*hi, 4*hi] of the training range
    val_samples: int = 64  # examples (windows, for a perplexity objective) per validation length
    ckpt_every: int = 100  # last.pt every N steps (and at the end)
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch.set_num_threads on CPU; 0 = leave torch's default
    compile: Any = "auto"  # torch.compile the training step: auto (on for CUDA, off on the CPU) | true | false
    parallel: str = "ddp"  # several ranks (torchrun): ddp (replicated model) | fsdp (FSDP2, sharded; train/fsdp.py)

    def as_dict(self) -> dict:
        """The JSON form (``config.json``'s ``train`` section): sequences as lists."""
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}


TRAIN_DEFAULTS: dict[str, Any] = TrainConfig().as_dict()
PARALLEL = ("ddp", "fsdp")
SECTIONS = ("task", "model", "train")
SCALES = ("cpu", "paper")


class ConfigError(ValueError):
    """A bad preset, override or resolved config (message says what and what is valid)."""


def configs_dir() -> Path:
    """``$LONGSPARSE_CONFIGS`` if set, else the presets shipped as package data (``longsparse/configs``).

    A folder on disk: the package is installed unzipped (its C++ kernel is compiled from the installed source),
    so ``importlib.resources`` resolves it to a real path."""
    env = os.environ.get("LONGSPARSE_CONFIGS")
    if env:
        return Path(env)
    return Path(str(resources.files("longsparse") / "configs"))


def available_presets() -> dict[str, list[str]]:
    root = configs_dir()
    out: dict[str, list[str]] = {}
    if root.is_dir():
        for d in sorted(p for p in root.iterdir() if p.is_dir()):
            scales = sorted(f.stem for f in d.glob("*.toml"))
            if scales:
                out[d.name] = scales
    return out


def load_toml(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no config file {path}")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from e


def task_name(task: str) -> str:
    """The canonical name of ``task`` (aliases such as ``flipflop`` resolved)."""
    from longsparse.tasks.registry import task_class

    try:
        return task_class(task).name
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None


def preset_path(task: str, preset: str) -> Path:
    """``<configs>/<task>/<preset>.toml``. A preset is a bare name: anything that could leave the task's folder
    (a path separator, ``..``, a leading dot) is refused, so ``--preset`` can never read another task's file."""
    from longsparse.tasks import TASKS

    name = task_name(task)
    have = available_presets().get(name, [])
    seps = {"/", "\\", os.sep, os.altsep} - {None}
    if not isinstance(preset, str) or not preset or preset.startswith(".") or any(c in preset for c in seps):
        raise ConfigError(
            f"preset must be a name, not a path, got {preset!r}; presets of task {name!r}: "
            f"{', '.join(have) or 'none'} (use --config FILE.toml for a file)"
        )
    path = configs_dir() / name / f"{preset}.toml"
    if not path.is_file():
        raise ConfigError(
            f"no preset {preset!r} for task {name!r} (looked for {path}); available: "
            f"{', '.join(have) or 'none'} (tasks: {', '.join(sorted(TASKS))})"
        )
    return path


def deep_merge(base: dict, over: Mapping) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def parse_value(text: str) -> Any:
    """A TOML value (``3e-4``, ``true``, ``[64, 128]``, ``"x"``), else the raw string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_sets(cfg: dict, sets: Iterable[str]) -> dict:
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
        raise ConfigError(_not_a_method(method))
    asked = _arch_override(overrides, sets, "method")  # before resolve reads an old run's method "hsa" as its arch
    if isinstance(asked, str) and asked in ARCHITECTURES:
        raise ConfigError(_not_a_method(asked))
    cfg = {s: copy.deepcopy(raw.get(s, {})) for s in SECTIONS}
    cfg["model"] = _model_table(raw, source, arch if arch is not None else _arch_override(overrides, sets))
    cfg["task"].setdefault("name", task)
    if task_name(cfg["task"]["name"]) != want:
        raise ConfigError(f"{source} is a config for task {cfg['task']['name']!r}, not for the requested task {want!r}")
    if method is not None:
        cfg["model"]["method"] = method
    if positions is not None:
        cfg["model"]["positions"] = positions
    m, p = cfg["model"].get("method"), cfg["model"].get("positions")
    cfg = deep_merge(cfg, raw.get("methods", {}).get(m, {}))
    cfg = deep_merge(cfg, raw.get("positions", {}).get(p, {}))
    cfg = apply_overrides(cfg, overrides)
    cfg = apply_sets(cfg, sets)
    if task_name(cfg["task"].get("name")) != want:
        raise ConfigError(f"an override sets task.name={cfg['task'].get('name')!r}, not the requested task {want!r}")
    if method is not None:
        cfg["model"]["method"] = method
    if positions is not None:
        cfg["model"]["positions"] = positions
    if seed is not None:
        cfg["train"]["seed"] = seed
    if steps is not None:
        cfg["train"]["steps"] = steps
    return resolve(cfg)


def _not_a_method(name: str) -> str:
    from longsparse.nn import METHODS

    return (
        f'{name!r} is an architecture, not a method: use --arch {name} (config key model.arch = "{name}"); '
        f"the method is the attention mapping of any architecture ({', '.join(METHODS)})"
    )


def _arch_override(overrides: Mapping | None, sets: Iterable[str], key: str = "arch") -> str | None:
    """The architecture the overrides ask for (``key`` = "method": the method), or None: the last ``--set
    model.arch=NAME``, else ``model.arch`` of ``overrides`` (the order ``build_config`` applies them in). A
    malformed ``overrides`` asks for none here; ``apply_overrides`` refuses it."""
    model = overrides.get("model") if isinstance(overrides, Mapping) else None
    found = model.get(key) if isinstance(model, Mapping) else None
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


def resolve(cfg: Mapping) -> dict:
    """Fill defaults and validate every section; returns a JSON-able dict (raises ConfigError).

    Every run starts here (``train`` calls it before touching the run folder), so a config that cannot train
    is refused before anything is written."""
    unknown = sorted(set(cfg) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"unknown config section(s) {unknown}; sections: {', '.join(SECTIONS)}")
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
    model_cfg = _resolve_model(upgrade_legacy_model(model), task)

    tr = dict(cfg.get("train", {}))
    bad = sorted(set(tr) - set(TRAIN_DEFAULTS))
    if bad:
        raise ConfigError(f"unknown train key(s) {bad}; valid: {', '.join(TRAIN_DEFAULTS)}")
    train = {**copy.deepcopy(TRAIN_DEFAULTS), **tr}
    _check_train(train, task)
    return {"task": task_cfg, "model": model_cfg, "train": train}


def upgrade_legacy_model(model: Mapping) -> dict:
    """A model section written before ``model.arch`` existed, in today's form. Such sections named the HSA
    architecture as the method with the positions "hsa" and had no other token attention than softmax with RoPE
    (today's HSA defaults): the method becomes the architecture and both are dropped. Any other section is
    returned as it is."""
    model = dict(model)
    if "arch" not in model and model.get("method") in ARCHITECTURES:
        model["arch"] = model.pop("method")
        if model.get("positions") == model["arch"]:
            del model["positions"]
    return model


def _resolve_model(model: dict, task) -> dict:
    """The model section with every field of its architecture's config, validated (``arch`` kept only when it
    is not the default)."""
    from longsparse.nn import METHODS, POSITIONS

    name = model.pop("arch", DEFAULT_ARCH)
    if name not in ARCHITECTURES:
        raise ConfigError(f"unknown model.arch {name!r}; choose one of {', '.join(ARCHITECTURES)}")
    # the two axes every architecture has: named here so that a typo gets the list of valid values
    if "method" in model and model["method"] not in METHODS:
        raise ConfigError(
            _not_a_method(model["method"])
            if model["method"] in ARCHITECTURES
            else f"unknown method {model['method']!r}; valid methods: {', '.join(METHODS)}"
        )
    if "positions" in model and model["positions"] not in POSITIONS:
        raise ConfigError(f"unknown positions {model['positions']!r}; valid positions: {', '.join(POSITIONS)}")
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
    m = cfg["model"]
    name = m.get("arch", DEFAULT_ARCH)
    if name == DEFAULT_ARCH:
        return f"{m['method']}/{m['positions']}"
    arch = get_architecture(name)
    default = arch.config_cls(vocab_size=2)
    diff = [f"{k}={m[k]}" for k in arch.label_keys if k in m and m[k] != getattr(default, k)]
    return name + (f"[{','.join(diff)}]" if diff else "")


def make_task(task_cfg: Mapping):
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


def _check_train(tr: dict, task) -> None:
    def pos_int(k, allow_zero=False):
        v = tr[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if allow_zero else 1):
            raise ConfigError(f"train.{k} must be an integer >= {0 if allow_zero else 1}, got {v!r}")

    for k in ("steps", "batch_size", "log_every", "val_samples", "ckpt_every"):
        pos_int(k)
    for k in ("warmup_steps", "val_every", "seed", "threads"):
        pos_int(k, allow_zero=True)
    for k in ("lr", "grad_clip"):
        if isinstance(tr[k], bool) or not isinstance(tr[k], (int, float)) or not tr[k] > 0:
            raise ConfigError(f"train.{k} must be a number > 0, got {tr[k]!r}")
    if (
        isinstance(tr["weight_decay"], bool)
        or not isinstance(tr["weight_decay"], (int, float))
        or not tr["weight_decay"] >= 0
    ):
        raise ConfigError(f"train.weight_decay must be a number >= 0, got {tr['weight_decay']!r}")
    # the cosine ends at lr * min_lr_ratio: a ratio above 1 would raise the rate, not decay it
    r = tr["min_lr_ratio"]
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1:
        raise ConfigError(f"train.min_lr_ratio must be a number in [0, 1], got {r!r}")
    b = tr["betas"]
    if not (
        isinstance(b, (list, tuple)) and len(b) == 2 and all(isinstance(x, (int, float)) and 0 <= x < 1 for x in b)
    ):
        raise ConfigError(f"train.betas must be two numbers in [0, 1), got {b!r}")
    tr["betas"] = [float(x) for x in b]
    if not isinstance(tr["bf16"], bool):
        raise ConfigError(f"train.bf16 must be true or false, got {tr['bf16']!r}")
    if not (tr["compile"] == "auto" or isinstance(tr["compile"], bool)):
        raise ConfigError(f"train.compile must be auto, true or false, got {tr['compile']!r}")
    if tr["parallel"] not in PARALLEL:
        raise ConfigError(f"train.parallel must be one of {', '.join(PARALLEL)}, got {tr['parallel']!r}")
    if tr["device"] not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"train.device must be auto, cpu or cuda, got {tr['device']!r}")
    if tr["train_lengths"] is None:
        tr["train_lengths"] = list(task.train_lengths)
    tl = tr["train_lengths"]
    if isinstance(tl, int) and not isinstance(tl, bool):
        tl = tr["train_lengths"] = [tl, tl]
    if not (isinstance(tl, (list, tuple)) and len(tl) == 2 and all(isinstance(x, int) for x in tl) and tl[0] <= tl[1]):
        raise ConfigError(f"train.train_lengths must be [lo, hi] integers with lo <= hi, got {tl!r}")
    tr["train_lengths"] = list(tl)
    if tr["val_lengths"] is None:
        hi = tl[1]
        tr["val_lengths"] = [hi, 2 * hi, 4 * hi]
    vl = tr["val_lengths"]
    if isinstance(vl, int) and not isinstance(vl, bool):
        vl = tr["val_lengths"] = [vl]
    if not (isinstance(vl, (list, tuple)) and vl and all(isinstance(x, int) and not isinstance(x, bool) for x in vl)):
        raise ConfigError(f"train.val_lengths must be a non-empty list of integers, got {vl!r}")
    tr["val_lengths"] = list(vl)
    for n in (*tl, *vl):
        try:
            task.check_length(n)
        except ValueError as e:
            raise ConfigError(f"impossible length: {e}") from None


# Settings that choose how a run is computed, not what it computes (every attention backend is tested equal to the
# reference, the compiled training step to the eager one; a task's cache folder only says where derived files live;
# DDP and FSDP compute the same update): they are not part of a run's identity, so a run resumes, and an archived
# result stays valid, under another choice, and configs written before such a setting existed keep their identity.
# Each entry is a key path into the resolved config.
NOT_IDENTITY = (
    ("model", "attn_backend"),
    ("task", "params", "cache_dir"),
    ("train", "compile"),
    ("train", "parallel"),
)


def run_identity(cfg: Mapping) -> dict:
    """``cfg`` as plain JSON data without the ``NOT_IDENTITY`` settings: what two runs must share to be one run."""
    out = json.loads(json.dumps(cfg, sort_keys=True))
    for *parents, key in NOT_IDENTITY:
        node = out
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(key, None)
    return out


@dataclass(frozen=True)
class TaskSpec:
    """The ``task`` section of a run config: a task by name, preset and parameters (``longsparse.tasks``)."""

    name: str
    preset: Optional[str] = None
    params: Optional[Mapping] = None

    def build(self):
        """The task object (``make_task``)."""
        return make_task(self.as_dict())

    def as_dict(self) -> dict:
        return {"name": self.name, "preset": self.preset, "params": dict(self.params or {})}


@dataclass(frozen=True)
class RunConfig:
    """A resolved run config, typed: what the trainer trains.

    ``model`` is the architecture's config object (``ModelConfig`` or ``HSAConfig``, its ``vocab_size`` the
    task's); ``as_dict()`` is the JSON form stored as ``config.json`` (``model`` without ``vocab_size``, ``arch``
    named only when not the default), whose ``config_hash`` identifies the run."""

    task: TaskSpec
    model: Any
    train: TrainConfig

    @classmethod
    def from_dict(cls, cfg: Mapping) -> "RunConfig":
        """Resolve (defaults, validation: ``ConfigError``) a raw or resolved run config dict."""
        r = resolve(cfg)
        task = TaskSpec(**r["task"])
        vocab = task.build().vocab_size
        tr = {k: tuple(v) if isinstance(v, list) else v for k, v in r["train"].items()}
        return cls(task, model_config(r["model"], vocab), TrainConfig(**tr))

    def as_dict(self) -> dict:
        model = config_section(self.model)
        del model["vocab_size"]
        return {"task": self.task.as_dict(), "model": model, "train": self.train.as_dict()}

    @property
    def hash(self) -> str:
        return config_hash(self.as_dict())


def config_hash(cfg: Mapping) -> str:
    """The short hash of a run's identity (``run_identity``) that checkpoints and archives record."""
    return hashlib.sha256(json.dumps(run_identity(cfg), sort_keys=True).encode()).hexdigest()[:16]


def config_diff(a: Mapping, b: Mapping, prefix: str = "") -> list[str]:
    """Human-readable differences ``key: a -> b`` between two nested dicts."""
    out = []
    for k in sorted(set(a) | set(b), key=str):
        va, vb = a.get(k, "<missing>"), b.get(k, "<missing>")
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            out += config_diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r} -> {vb!r}")
    return out
