"""The configs of the decoder: ``AttentionSettings`` (how the token attentions of a model attend; every
architecture's config holds one as its field ``attention``) and ``ModelConfig`` (the Gemma-2-style decoder),
validated and round-trippable through their stored form (``stored_form``: a plain dict, the model section of a run
config: the config's own fields, and its settings as the nested table ``attention``)."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Mapping, Optional, Sequence

from longsparse.attention import BACKENDS
from longsparse.mappings.registry import METHODS
from longsparse.nn.positions import NAPE_SLOPES, POSITIONS
from longsparse.nn.scalers import ASENTMAX_INITS, check_scaler_constants

ADATEMP_ORDERS = ("original", "reversed")
ASENTMAX_SCALERS = ("adaptive", "static")
# The key of an architecture config's stored form that holds its ``AttentionSettings`` as a nested table.
ATTENTION_KEY = "attention"


def check_positive_int(name: str, value: Any) -> None:
    """ValueError naming ``name`` unless ``value`` is an int >= 1 (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass
class AttentionSettings:
    """How the token attentions of a model attend (one ``longsparse.nn.Attention`` per layer, calling
    ``longsparse.attention``). Every architecture's config holds one as its field ``attention`` (its stored form
    holds them as its nested table ``attention``: ``stored_form``): a new attention option is a field here, its
    check in ``validate`` and its use in ``longsparse.nn.Attention``.

    method: softmax | ssmax | adatemp | topk | entmax | sparsemax | asentmax (a mapping plus, for ssmax and
    asentmax, a per-query length scaler).
    positions: nope | rope | alibi | nape. rope_theta: the RoPE base.
    alpha: entmax α (entmax / asentmax); learn_alpha: learn one α per head in (1, max_alpha)
    starting at ``alpha`` (longsparse.LearnedAlpha).
    topk: k of the top-k method. adatemp_order: "original" (Veličković et al.) or "reversed"
    (the coefficient order of the official [A] code).
    nape_slopes: "harmonic" (1/h) or "geometric" (2^−(h−1)) for the ALiBi half of NAPE.
    asentmax_init: "scale_aware" (default; scale ≈ 1.05 at init) or "reference" (N(0, 0.02) weights).
    asentmax_scaler: "adaptive" (ASEntmax) or "static" (δ + β_h log(i+2)^{γ_h} ablation);
    asentmax_delta: δ; asentmax_gamma_range: γ_r. ssmax_init: the initial SSMax β.
    attn_chunk_size: passed to longsparse.attention (None = automatic).
    attn_backend: the attention backend, "auto" (longsparse.attention's policy) or a name in
    longsparse.attention.BACKENDS; a named one that cannot take a call raises instead of falling back.
    """

    method: str = "entmax"
    positions: str = "nape"
    alpha: float = 1.5
    learn_alpha: bool = False
    max_alpha: float = 2.0
    topk: int = 32
    adatemp_order: str = "original"
    rope_theta: float = 10000.0
    nape_slopes: str = "harmonic"
    asentmax_init: str = "scale_aware"
    asentmax_scaler: str = "adaptive"
    asentmax_delta: float = 1.0
    asentmax_gamma_range: float = 2.0
    ssmax_init: float = 1.0
    attn_chunk_size: Optional[int] = None
    attn_backend: str = "auto"

    def validate(self, n_heads: int, head_dim: int) -> None:
        """ValueError naming the first invalid setting as its key in a stored model section (``attention.X``),
        for layers of ``n_heads`` heads of size ``head_dim``."""

        def key(name: str) -> str:
            return f"{ATTENTION_KEY}.{name}"

        check_positive_int(key("topk"), self.topk)
        if self.method not in METHODS:
            raise ValueError(f"unknown {key('method')} {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.positions not in POSITIONS:
            raise ValueError(f"unknown {key('positions')} {self.positions!r}; choose one of {', '.join(POSITIONS)}")
        if self.positions == "nape" and n_heads % 2:
            raise ValueError(f"{key('positions')}='nape' needs an even n_heads (half ALiBi, half NoPE), got {n_heads}")
        if self.positions == "rope" and head_dim % 2:
            raise ValueError(f"{key('positions')}='rope' needs an even head_dim, got {head_dim}")
        for name, allowed in (
            ("nape_slopes", NAPE_SLOPES),
            ("adatemp_order", ADATEMP_ORDERS),
            ("asentmax_init", ASENTMAX_INITS),
            ("asentmax_scaler", ASENTMAX_SCALERS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"unknown {key(name)} {getattr(self, name)!r}; choose one of {', '.join(allowed)}")
        if not self.alpha >= 1:
            raise ValueError(f"{key('alpha')} must be >= 1, got {self.alpha}")
        if self.learn_alpha:
            if self.method not in ("entmax", "asentmax"):
                raise ValueError(f"{key('learn_alpha')} needs method entmax or asentmax, got {self.method!r}")
            if not 1 < self.alpha < self.max_alpha:
                raise ValueError(
                    f"{key('learn_alpha')} needs 1 < alpha < max_alpha, got alpha={self.alpha}, "
                    f"max_alpha={self.max_alpha}"
                )
        check_scaler_constants(
            self.asentmax_delta, self.asentmax_gamma_range, (key("asentmax_delta"), key("asentmax_gamma_range"))
        )
        if not self.rope_theta > 0:
            raise ValueError(f"{key('rope_theta')} must be > 0, got {self.rope_theta}")
        if self.attn_chunk_size is not None:
            check_positive_int(key("attn_chunk_size"), self.attn_chunk_size)
        if self.attn_backend != "auto" and self.attn_backend not in BACKENDS:
            raise ValueError(
                f"unknown {key('attn_backend')} {self.attn_backend!r}; choose auto or one of {', '.join(BACKENDS)}"
            )


ATTENTION_FIELDS = tuple(f.name for f in dataclasses.fields(AttentionSettings))


def stored_form(config, keys: Sequence[str]) -> Dict[str, Any]:
    """The stored form (schema 3) of an architecture config: its own fields ``keys`` in that order, then
    ``"attention"``: every field of its ``AttentionSettings`` (``ATTENTION_FIELDS``, in that order)."""
    out = {k: getattr(config, k) for k in keys}
    out[ATTENTION_KEY] = {f: getattr(config.attention, f) for f in ATTENTION_FIELDS}
    return out


def from_stored_form(cls, d: Any):
    """The config ``cls`` (with ``STORED_KEYS``, its own fields) of its stored form ``d`` (``stored_form``):
    unknown keys and values of the wrong type, in the config or its ``attention`` table, raise ValueError naming
    them (``attention.X`` for a setting); the settings given apply over the architecture's default settings (its
    ``attention`` default)."""
    if not isinstance(d, dict):
        raise ValueError(f"a {cls.__name__} must be built from a dict, got {type(d).__name__}")
    unknown = sorted(set(d) - set(cls.STORED_KEYS) - {ATTENTION_KEY})
    if unknown:
        moved = [k for k in unknown if k in ATTENTION_FIELDS]
        hint = f" ({', '.join(f'{k} is {ATTENTION_KEY}.{k}' for k in moved)})" if moved else ""
        raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}{hint}")
    settings = d.get(ATTENTION_KEY, {})
    if not isinstance(settings, dict):
        raise ValueError(f"{ATTENTION_KEY} must be a table of attention settings, got {settings!r}")
    unknown = sorted(set(settings) - set(ATTENTION_FIELDS))
    if unknown:
        raise ValueError(f"unknown {ATTENTION_KEY} setting(s): {', '.join(f'{ATTENTION_KEY}.{k}' for k in unknown)}")
    check_field_types(cls, {k: v for k, v in d.items() if k != ATTENTION_KEY})
    check_field_types(AttentionSettings, settings, prefix=f"{ATTENTION_KEY}.")
    base = cls.__dataclass_fields__[ATTENTION_KEY].default_factory()
    own = {k: v for k, v in d.items() if k != ATTENTION_KEY}
    return cls(**own, attention=dataclasses.replace(base, **settings))


def own_attention(config) -> None:
    """In ``__post_init__``: TypeError unless ``config.attention`` is an ``AttentionSettings``; then a copy of
    it, so that no two configs share their settings."""
    if not isinstance(config.attention, AttentionSettings):
        raise TypeError(
            f"{type(config).__name__}.attention must be an AttentionSettings, got {type(config.attention).__name__}"
        )
    config.attention = dataclasses.replace(config.attention)


_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _field_kind(hint) -> tuple[Any, bool]:
    """(int / float / bool / str or None for any other type, whether None is allowed) of a field's type hint."""
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        hint = args[0] if len(args) == 1 else None
    return (hint if hint in _KINDS else None), optional


def check_field_types(cls, d: Mapping[str, Any], prefix: str = "") -> None:
    """ValueError naming the first key of ``d`` (as ``prefix`` + key) whose value has the wrong type for its field
    of ``cls``: ``d_model must be an integer, got 'abc'``, before any arithmetic on it would fail with a Python
    operator error. A float field takes an integer; nothing takes a bool but a bool field."""
    hints = typing.get_type_hints(cls)
    for key, value in d.items():
        kind, optional = _field_kind(hints.get(key))
        if kind is None or (value is None and optional):
            continue
        if kind is bool:
            ok = isinstance(value, bool)
        elif kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, kind) and not isinstance(value, bool)
        if not ok:
            raise ValueError(f"{prefix}{key} must be {_KINDS[kind]}{' or null' if optional else ''}, got {value!r}")


@dataclass
class ModelConfig:
    """Gemma-2-style decoder (docs/method.md §4): its widths, and ``attention``, the ``AttentionSettings`` of its
    layers (defaults: 1.5-entmax, NAPE): ``ModelConfig(vocab_size=64, attention=AttentionSettings(method=
    "asentmax"))``, ``cfg.attention.method``. The stored form (``to_dict``, the model section of a run config)
    holds its own fields in the order ``STORED_KEYS``, then the settings as the table ``attention``.

    head_dim: default d_model // n_heads. norm_eps: the RMSNorms' ε. init_std: the std of the normal init of
    every projection and embedding.
    """

    STORED_KEYS: ClassVar[tuple] = (
        "vocab_size",
        "d_model",
        "n_layers",
        "n_heads",
        "head_dim",
        "d_ff",
        "norm_eps",
        "init_std",
    )

    vocab_size: int
    d_model: int = 256
    n_layers: int = 2
    n_heads: int = 8
    head_dim: Optional[int] = None
    d_ff: int = 1024
    norm_eps: float = 1e-6
    init_std: float = 0.02
    attention: AttentionSettings = field(default_factory=AttentionSettings, kw_only=True)

    def __post_init__(self):
        own_attention(self)
        if self.head_dim is None and self.n_heads > 0:
            self.head_dim = self.d_model // self.n_heads
        self.validate()

    def validate(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "head_dim", "d_ff"):
            check_positive_int(name, getattr(self, name))
        self.attention.validate(self.n_heads, self.head_dim)
        if self.norm_eps <= 0 or self.init_std <= 0:
            raise ValueError("norm_eps and init_std must be > 0")

    def to_dict(self) -> Dict[str, Any]:
        """The stored form: every key of ``STORED_KEYS``, then ``attention``: every settings field."""
        return stored_form(self, self.STORED_KEYS)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ModelConfig":
        """The config of its stored form (``to_dict``); strict: unknown keys and values of the wrong type raise
        ValueError naming them; a key left out takes its default."""
        return from_stored_form(cls, d)
