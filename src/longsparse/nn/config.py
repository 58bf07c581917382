"""The configs of the decoder: ``AttentionSettings`` (how the token attentions of a model attend; every
architecture's config holds one as its field ``attention``) and ``ModelConfig`` (the Gemma-2-style decoder),
validated and round-trippable through their stored form (``stored_form``: a flat plain dict, the model section of
a run config)."""

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


def check_positive_int(name: str, value: Any) -> None:
    """ValueError naming ``name`` unless ``value`` is an int >= 1 (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass
class AttentionSettings:
    """How the token attentions of a model attend (one ``longsparse.nn.Attention`` per layer, calling
    ``longsparse.attention``). Every architecture's config holds one as its field ``attention`` (its stored form
    holds the fields flat: ``stored_form``): a new attention option is a field here, its check in ``validate``
    and its use in ``longsparse.nn.Attention``.

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

    def validate(self, n_heads: int, head_dim: int, names: Optional[Mapping[str, str]] = None) -> None:
        """ValueError naming the first invalid setting, for layers of ``n_heads`` heads of size ``head_dim``.
        names: the owning config's key of each field whose key differs from the field's name."""

        def key(name: str) -> str:
            return (names or {}).get(name, name)

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


def attention_keys(names: Mapping[str, str]) -> Dict[str, str]:
    """{stored key: AttentionSettings field} of a config whose stored form names some settings fields otherwise
    (``names``: field -> key, e.g. HSA's ``attn_topk``)."""
    return {names.get(f, f): f for f in ATTENTION_FIELDS}


def stored_form(config, keys: Sequence[str], names: Mapping[str, str]) -> Dict[str, Any]:
    """The stored form (schema 2) of an architecture config: a flat dict of ``keys`` in that order, each its own
    field or a field of its ``attention`` settings (under its key in ``names``)."""
    settings = attention_keys(names)
    return {k: getattr(config.attention, settings[k]) if k in settings else getattr(config, k) for k in keys}


def from_stored_form(cls, d: Any):
    """The config ``cls`` (with ``STORED_KEYS`` and ``ATTENTION_NAMES``) of its stored form ``d``
    (``stored_form``): unknown keys and values of the wrong type raise ValueError naming them; the settings keys
    apply over the architecture's default settings (its ``attention`` default)."""
    if not isinstance(d, dict):
        raise ValueError(f"a {cls.__name__} must be built from a dict, got {type(d).__name__}")
    unknown = sorted(set(d) - set(cls.STORED_KEYS))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")
    check_field_types(cls, d)
    settings = attention_keys(cls.ATTENTION_NAMES)
    own = {k: v for k, v in d.items() if k not in settings}
    base = cls.__dataclass_fields__["attention"].default_factory()
    attention = dataclasses.replace(base, **{settings[k]: v for k, v in d.items() if k in settings})
    return cls(**own, attention=attention)


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


def check_field_types(cls, d: Mapping[str, Any]) -> None:
    """ValueError naming the first key of ``d`` whose value has the wrong type for its field of ``cls`` (or, for an
    architecture config's stored form, of its ``AttentionSettings``): ``d_model must be an integer, got 'abc'``,
    before any arithmetic on it would fail with a Python operator error. A float field takes an integer; nothing
    takes a bool but a bool field."""
    hints = typing.get_type_hints(cls)
    names = getattr(cls, "ATTENTION_NAMES", None)
    if names is not None:
        settings = typing.get_type_hints(AttentionSettings)
        hints.update({key: settings[f] for key, f in attention_keys(names).items()})
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
            raise ValueError(f"{key} must be {_KINDS[kind]}{' or null' if optional else ''}, got {value!r}")


@dataclass
class ModelConfig:
    """Gemma-2-style decoder (docs/method.md §4): its widths, and ``attention``, the ``AttentionSettings`` of its
    layers (defaults: 1.5-entmax, NAPE): ``ModelConfig(vocab_size=64, attention=AttentionSettings(method=
    "asentmax"))``, ``cfg.attention.method``. The stored form (``to_dict``, the model section of a run config)
    holds the settings' fields flat among its own, in the order ``STORED_KEYS``.

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
        "norm_eps",
        "init_std",
        "attn_chunk_size",
        "attn_backend",
    )
    ATTENTION_NAMES: ClassVar[dict] = {}

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
        """The stored form: every key of ``STORED_KEYS``, the settings' fields flat."""
        return stored_form(self, self.STORED_KEYS, self.ATTENTION_NAMES)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ModelConfig":
        """The config of its stored form (``to_dict``); strict: unknown keys raise ValueError naming them."""
        return from_stored_form(cls, d)
