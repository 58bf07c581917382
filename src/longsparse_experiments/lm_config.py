"""The LM study's config: a preset file (``configs/lm/<preset>.toml`` of this package) read into typed, frozen
objects, with every value checked before anything runs::

    cfg = load_study_config("quick")            # or load_study_config(path="my.toml")
    cfg.data.dir, cfg.train.seq_len, cfg.eval.length_mults, cfg.study.methods
    cfg = replace(cfg, train=replace(cfg.train, steps=2))    # dataclasses.replace: checked again

A file has a ``description`` and the sections ``[data]`` (corpus and tokenizer), ``[model]`` (overrides of the
library's model config; each run sets its method and positions), ``[train]`` (the budget of every run),
``[eval]`` (perplexity and passkey lengths) and ``[study]`` (the methods × positions × seeds to run). What a file
leaves out takes the defaults of the dataclasses below; an unknown section or key, a wrong type or an out-of-range
value is a ConfigError naming the file, the section and the problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from longsparse.lm.streams import SAMPLE_DIR
from longsparse.lm.tokenizer import KINDS, MIN_BPE_VOCAB
from longsparse.models import model_config
from longsparse.nn.config import METHODS
from longsparse.nn.positions import POSITIONS
from longsparse.tasks.lm import SAMPLE_CORPUS
from longsparse.train.config import ConfigError, load_toml
from longsparse_experiments.presets import presets_dir

# Set per run (the attention's method and positions from [study]) or from the tokenizer (vocab_size), never by
# [model] (``[model.attention]`` holds the other attention settings).
MODEL_KEYS_SET_PER_RUN = ("attention.method", "attention.positions", "vocab_size")


def run_model_section(model: Mapping, method: str, positions: str) -> dict:
    """The model section of one run of the LM study: the preset's ``[model]`` with the run's attention method and
    positions in its ``attention`` table."""
    attention = model.get("attention")
    attention = dict(attention) if isinstance(attention, Mapping) else {}
    return {**model, "attention": {**attention, "method": method, "positions": positions}}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_fraction(x) -> bool:
    return _is_number(x) and 0 <= x <= 1


def _check_int(section: str, key: str, v, low: int) -> None:
    if not _is_int(v) or v < low:
        raise ConfigError(f"[{section}] {key} must be an integer >= {low}, got {v!r}")


def _sequence(section: str, key: str, v, ok, what: str) -> tuple:
    """``v`` as a tuple, when it is a non-empty list (or tuple) of items that pass ``ok``, described by ``what``."""
    if not isinstance(v, (list, tuple)) or not v or not all(ok(x) for x in v):
        raise ConfigError(f"[{section}] {key} must be a non-empty list of {what}, got {v!r}")
    return tuple(v)


def _as_json(obj) -> dict:
    """A section's fields in field order, tuples as lists (the JSON form)."""
    return {f.name: (list(v) if isinstance(v := getattr(obj, f.name), tuple) else v) for f in fields(obj)}


@dataclass(frozen=True)
class LMData:
    """``[data]``: the corpus folder (``longsparse data shakespeare --dir DIR``; ``"sample"`` is the committed
    sample, stored as its path ``SAMPLE_DIR``) and the tokenizer trained on its training split."""

    dir: str = "data/shakespeare"
    tokenizer: str = "bpe"  # "bpe" or "bytes" (longsparse.lm.tokenizer.KINDS)
    vocab_size: int = 2048  # the BPE vocabulary (the byte tokenizer has its own)

    def __post_init__(self):
        if not isinstance(self.dir, str) or not self.dir:
            raise ConfigError(f"[data] dir must be a folder or {SAMPLE_CORPUS!r}, got {self.dir!r}")
        if self.dir == SAMPLE_CORPUS:
            object.__setattr__(self, "dir", str(SAMPLE_DIR))
        if self.tokenizer not in KINDS:
            raise ConfigError(f"[data] tokenizer must be one of {', '.join(KINDS)}, got {self.tokenizer!r}")
        _check_int("data", "vocab_size", self.vocab_size, MIN_BPE_VOCAB)

    @property
    def is_sample(self) -> bool:
        return self.dir == str(SAMPLE_DIR)

    @property
    def corpus(self) -> str:
        """The task lm's ``corpus`` parameter: ``"sample"`` for the committed sample, else the folder."""
        return SAMPLE_CORPUS if self.is_sample else self.dir

    def as_dict(self) -> dict:
        """The data config ``longsparse.lm.streams.prepare`` takes: ``{"dir", "tokenizer", "vocab_size"}``."""
        return _as_json(self)


@dataclass(frozen=True)
class LMTrain:
    """``[train]``: the budget of every run, trained at the one length ``seq_len`` (T). Rows are packed text, a
    ``passkey_frac`` of them passkey examples of ``passkey_digits`` digits; validation is perplexity on
    ``val_windows`` windows of length T at the end. The seed of a run is one of ``[study] seeds``."""

    seq_len: int = 128
    batch_size: int = 32
    steps: int = 1000
    lr: float = 1e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0
    passkey_frac: float = 0.25
    passkey_digits: int = 5
    threads: int = 1  # torch threads per run; 0 = torch's default
    log_every: int = 25
    ckpt_every: int = 50
    val_windows: int = 8

    def __post_init__(self):
        for key in ("seq_len", "batch_size", "steps", "passkey_digits", "log_every", "ckpt_every", "val_windows"):
            _check_int("train", key, getattr(self, key), 1)
        for key in ("warmup_steps", "threads"):
            _check_int("train", key, getattr(self, key), 0)
        for key in ("lr", "grad_clip"):
            v = getattr(self, key)
            if not _is_number(v) or not v > 0:
                raise ConfigError(f"[train] {key} must be a number > 0, got {v!r}")
        for key in ("min_lr_ratio", "passkey_frac"):
            v = getattr(self, key)
            if not _is_fraction(v):
                raise ConfigError(f"[train] {key} must be a number in [0, 1], got {v!r}")
        b = self.betas
        if not (isinstance(b, (list, tuple)) and len(b) == 2 and all(_is_number(x) and 0 <= x < 1 for x in b)):
            raise ConfigError(f"[train] betas must be two numbers in [0, 1), got {b!r}")
        object.__setattr__(self, "betas", tuple(b))


@dataclass(frozen=True)
class LMEval:
    """``[eval]``: perplexity at the lengths ``length_mults`` × T on ``n_windows`` windows of the longest (the
    same target tokens at every length), and passkey exact match at ``passkey_mults`` × T, needles at
    ``passkey_depths``, ``passkey_samples`` examples per (length, depth); ``batch_tokens`` tokens per forward."""

    length_mults: tuple[float, ...] = (0.25, 0.5, 1, 2, 4, 8, 16)
    n_windows: int = 8
    passkey_mults: tuple[float, ...] = (1, 2, 4, 8, 16)
    passkey_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    passkey_samples: int = 8
    batch_tokens: int = 16384

    def __post_init__(self):
        for key in ("length_mults", "passkey_mults"):
            v = _sequence("eval", key, getattr(self, key), lambda x: _is_number(x) and x > 0, "numbers > 0")
            object.__setattr__(self, key, v)
        depths = _sequence("eval", "passkey_depths", self.passkey_depths, _is_fraction, "numbers in [0, 1]")
        object.__setattr__(self, "passkey_depths", depths)
        for key in ("n_windows", "passkey_samples", "batch_tokens"):
            _check_int("eval", key, getattr(self, key), 1)

    def as_dict(self) -> dict:
        """The JSON form, which ``eval.json`` stores as its ``eval_config`` (an evaluation is reused only for an
        equal one): keys in field order, the numbers as the file gave them (``1`` stays ``1``), lists."""
        return _as_json(self)


@dataclass(frozen=True)
class LMStudyGrid:
    """``[study]``: the runs, every method × positions at every seed (each distinct; the seed is the run's
    training seed)."""

    methods: tuple[str, ...] = ("softmax", "ssmax", "entmax", "asentmax")
    positions: tuple[str, ...] = ("nape",)
    seeds: tuple[int, ...] = (0,)

    def __post_init__(self):
        for key, known in (("methods", METHODS), ("positions", POSITIONS)):
            v = _sequence("study", key, getattr(self, key), lambda x: isinstance(x, str), "names")
            bad = [x for x in v if x not in known]
            if bad:
                raise ConfigError(f"[study] unknown {key} {bad}; known: {', '.join(known)}")
            object.__setattr__(self, key, v)
        seeds = _sequence("study", "seeds", self.seeds, lambda x: _is_int(x) and x >= 0, "integers >= 0")
        object.__setattr__(self, "seeds", seeds)
        for key in ("methods", "positions", "seeds"):
            v = getattr(self, key)
            if len(set(v)) != len(v):
                raise ConfigError(f"[study] {key} must be distinct, got {list(v)}")


@dataclass(frozen=True)
class LMStudyConfig:
    """A whole LM study file. ``model`` is a table of overrides of the library's model config (``d_model``,
    ``n_layers``, ...); it is checked here against every method and positions of ``study`` and resolved by the
    library when a run config is built (``lm_study.run_config``)."""

    description: str = ""
    data: LMData = field(default_factory=LMData)
    model: dict[str, Any] = field(default_factory=dict)
    train: LMTrain = field(default_factory=LMTrain)
    eval: LMEval = field(default_factory=LMEval)
    study: LMStudyGrid = field(default_factory=LMStudyGrid)

    def __post_init__(self):
        if not isinstance(self.description, str):
            raise ConfigError(f"description must be a string, got {self.description!r}")
        if not isinstance(self.model, Mapping):
            raise ConfigError(f"[model] must be a table of model-config overrides, got {self.model!r}")
        attention = self.model.get("attention")
        given = {*self.model, *(f"attention.{k}" for k in (attention if isinstance(attention, Mapping) else {}))}
        per_run = [k for k in MODEL_KEYS_SET_PER_RUN if k in given]
        if per_run:
            raise ConfigError(
                f"[model] sets {per_run}: each run takes its method and positions from [study] and its "
                "vocabulary from the tokenizer"
            )
        for method in self.study.methods:
            for positions in self.study.positions:
                try:
                    model_config(run_model_section(self.model, method, positions), self.data.vocab_size)
                except (TypeError, ValueError) as e:
                    raise ConfigError(f"[model] is not a valid model config for {method}/{positions}: {e}") from None


SECTIONS = {"data": LMData, "train": LMTrain, "eval": LMEval, "study": LMStudyGrid}
TOP_LEVEL = ("description", "data", "model", "train", "eval", "study")


def configs_lm_dir() -> Path:
    """The LM study's presets (``<preset>.toml``)."""
    return presets_dir() / "lm"


def load_study_config(preset: str = "cpu", path: Optional[str] = None) -> LMStudyConfig:
    """The LM study file ``path`` (default: this package's ``configs/lm/<preset>.toml``), with the defaults filled
    in and every value checked. Raises ConfigError naming the file, the section and the problem."""
    p = Path(path) if path else configs_lm_dir() / f"{preset}.toml"
    if not path and not p.is_file():
        known = sorted(f.stem for f in configs_lm_dir().glob("*.toml"))
        raise ConfigError(f"no LM preset {preset!r}; available: {', '.join(known)}")
    raw = load_toml(p)
    try:
        unknown = sorted(set(raw) - set(TOP_LEVEL))
        if unknown:
            raise ConfigError(f"unknown section(s) or key(s) {unknown}; valid: {', '.join(TOP_LEVEL)}")
        for name in TOP_LEVEL[1:]:
            if not isinstance(raw.get(name, {}), dict):
                raise ConfigError(f"[{name}] must be a table, got {raw[name]!r}")
        sections = {}
        for name, cls in SECTIONS.items():
            table = raw.get(name, {})
            valid = [f.name for f in fields(cls)]
            bad = sorted(set(table) - set(valid))
            if bad:
                raise ConfigError(f"[{name}] unknown key(s) {bad}; valid: {', '.join(valid)}")
            sections[name] = cls(**table)
        return LMStudyConfig(description=raw.get("description", ""), model=dict(raw.get("model", {})), **sections)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
