"""The configs of the decoder: ``AttentionSettings`` (how the token attentions of a model attend; every
architecture's config holds one) and ``ModelConfig`` (the Gemma-2-style decoder), validated and round-trippable
as flat plain dicts."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Sequence

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
    ``longsparse.attention``). Every architecture's config holds one as its field ``attention`` and takes, reads
    and stores its fields flat, as its own (``flat_attention_settings``): a new attention option is a field here,
    its check in ``validate`` and its use in ``longsparse.nn.Attention``.

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


def flat_attention_settings(*, names: Optional[Mapping[str, str]] = None, order: Sequence[str] = ()):
    """Class decorator (above ``@dataclass``) for an architecture config whose field ``attention`` holds its
    ``AttentionSettings`` (its ``default_factory`` gives the architecture's defaults). The settings' fields become
    flat keys of the config, as if they were its own fields: ``Config(vocab_size=64, method="entmax")`` sets
    them over the defaults (over a copy of ``attention=`` when that is given too: a config never shares its
    settings), ``cfg.method`` reads and writes them, and ``to_dict`` / ``from_dict`` store them flat.

    names: the key of a settings field in this config where it differs from the field's name (HSA's
    ``attn_topk``: its own ``topk`` counts chunks). order: the key order of ``to_dict``, the stored form that
    checkpoints and ``--print-config`` show (the hashes of run configs sort the keys); keys it leaves out follow
    in declaration order (the config's fields, then the settings'). The class gets ``STORED_KEYS`` (every key, in
    that order) and ``ATTENTION_NAMES`` (``names``)."""
    names = dict(names or {})

    def decorate(cls):
        if "attention" not in cls.__dataclass_fields__:
            raise TypeError(f"{cls.__name__} has no field 'attention' to hold its AttentionSettings")
        if set(names) - set(ATTENTION_FIELDS):
            raise TypeError(
                f"{cls.__name__}: names= renames unknown AttentionSettings fields "
                f"{sorted(set(names) - set(ATTENTION_FIELDS))}"
            )
        own = [f.name for f in dataclasses.fields(cls) if f.name != "attention"]
        setting_of = {names.get(f, f): f for f in ATTENTION_FIELDS}  # flat key -> settings field
        if set(own) & set(setting_of):
            raise TypeError(
                f"{cls.__name__}: its fields {sorted(set(own) & set(setting_of))} clash with the flat "
                f"keys of its AttentionSettings (rename those with names=)"
            )
        keys = [k for k in order if k in own or k in setting_of]
        if len(keys) != len(order):
            raise TypeError(f"{cls.__name__}: order names unknown keys {sorted(set(order) - set(keys))}")
        keys += [k for k in own + list(setting_of) if k not in keys]
        dataclass_init = cls.__init__

        @functools.wraps(dataclass_init)
        def __init__(self, *args, **kwargs):
            flat = {setting_of[k]: kwargs.pop(k) for k in list(kwargs) if k in setting_of}
            base = kwargs.get("attention")
            if base is None:
                base = cls.__dataclass_fields__["attention"].default_factory()
            elif not isinstance(base, AttentionSettings):
                raise TypeError(f"{cls.__name__}.attention must be an AttentionSettings, got {type(base).__name__}")
            kwargs["attention"] = dataclasses.replace(base, **flat)
            dataclass_init(self, *args, **kwargs)

        def setting(name: str) -> property:
            return property(
                lambda self: getattr(self.attention, name),
                lambda self, value: setattr(self.attention, name, value),
                doc=f"``attention.{name}`` (AttentionSettings)",
            )

        def to_dict(self) -> Dict[str, Any]:
            """The flat stored form: every key of the config (its fields and its settings') in ``order``."""
            return {k: getattr(self, k) for k in keys}

        cls.__init__ = __init__
        for key, name in setting_of.items():
            setattr(cls, key, setting(name))
        cls.to_dict = to_dict
        cls.STORED_KEYS = tuple(keys)
        cls.ATTENTION_NAMES = names
        return cls

    return decorate


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
    """ValueError naming the first key of ``d`` whose value has the wrong type for its field of ``cls`` (or of its
    flat ``AttentionSettings``): ``d_model must be an integer, got 'abc'``, before any arithmetic on it would fail
    with a Python operator error. A float field takes an integer; nothing takes a bool but a bool field."""
    hints = typing.get_type_hints(cls)
    names = getattr(cls, "ATTENTION_NAMES", None)
    if names is not None:
        settings = typing.get_type_hints(AttentionSettings)
        hints.update({names.get(f, f): settings[f] for f in ATTENTION_FIELDS})
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


def strict_from_dict(cls, d: Dict[str, Any]):
    """Build the config class ``cls`` (a dataclass, or one with ``flat_attention_settings``: ``STORED_KEYS``) from a
    flat plain dict, rejecting unknown keys and values of the wrong type by name."""
    if not isinstance(d, dict):
        raise ValueError(f"a {cls.__name__} must be built from a dict, got {type(d).__name__}")
    known = getattr(cls, "STORED_KEYS", None) or [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")
    check_field_types(cls, d)
    return cls(**d)


@flat_attention_settings(
    order=(
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
)
@dataclass
class ModelConfig:
    """Gemma-2-style decoder (docs/method.md §4): its widths, and ``attention``, the ``AttentionSettings`` of its
    layers (defaults: 1.5-entmax, NAPE), whose fields it takes and stores flat as its own
    (``ModelConfig(vocab_size=64, method="asentmax")``, ``cfg.method``; ``flat_attention_settings``).

    head_dim: default d_model // n_heads. norm_eps: the RMSNorms' ε. init_std: the std of the normal init of
    every projection and embedding.
    """

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
        if self.head_dim is None and self.n_heads > 0:
            self.head_dim = self.d_model // self.n_heads
        self.validate()

    def validate(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "head_dim", "d_ff"):
            check_positive_int(name, getattr(self, name))
        self.attention.validate(self.n_heads, self.head_dim)
        if self.norm_eps <= 0 or self.init_std <= 0:
            raise ValueError("norm_eps and init_std must be > 0")

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ModelConfig":
        """Strict: unknown keys raise ValueError naming them."""
        return strict_from_dict(cls, d)
