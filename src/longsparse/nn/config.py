"""ModelConfig: every knob of the decoder, validated, and round-trippable as a plain dict."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Optional

from longsparse.attention import BACKENDS
from longsparse.mappings.registry import METHODS
from longsparse.nn.positions import NAPE_SLOPES, POSITIONS
from longsparse.nn.scalers import ASENTMAX_INITS

ADATEMP_ORDERS = ("original", "reversed")
ASENTMAX_SCALERS = ("adaptive", "static")


@dataclass
class ModelConfig:
    """Gemma-2-style decoder (docs/method.md §4).

    method: softmax | ssmax | adatemp | topk | entmax | sparsemax | asentmax.
    positions: nope | rope | alibi | nape.
    alpha: entmax α (entmax / asentmax); learn_alpha: learn one α per head in (1, max_alpha)
    starting at ``alpha`` (longsparse.LearnedAlpha).
    topk: k of the top-k method. adatemp_order: "original" (Veličković et al.) or "reversed"
    (the coefficient order of the official [A] code).
    nape_slopes: "harmonic" (1/h) or "geometric" (2^−(h−1)) for the ALiBi half of NAPE.
    asentmax_init: "scale_aware" (default; scale ≈ 1.05 at init) or "reference" (N(0, 0.02) weights).
    asentmax_scaler: "adaptive" (ASEntmax) or "static" (δ + β_h log(i+2)^{γ_h} ablation).
    attn_chunk_size: passed to longsparse.attention (None = automatic).
    attn_backend: the attention backend, "auto" (longsparse.attention's policy) or a name in
    longsparse.attention.BACKENDS; a named one that cannot take a call raises instead of falling back.
    """
    vocab_size: int
    d_model: int = 256
    n_layers: int = 2
    n_heads: int = 8
    head_dim: Optional[int] = None          # default d_model // n_heads
    d_ff: int = 1024
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
    norm_eps: float = 1e-6
    init_std: float = 0.02
    attn_chunk_size: Optional[int] = None
    attn_backend: str = "auto"

    def __post_init__(self):
        if self.head_dim is None and self.n_heads > 0:
            self.head_dim = self.d_model // self.n_heads
        self.validate()

    def validate(self) -> None:
        def pos_int(name):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "head_dim", "d_ff", "topk"):
            pos_int(name)
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.positions not in POSITIONS:
            raise ValueError(f"unknown positions {self.positions!r}; choose one of {', '.join(POSITIONS)}")
        if self.positions == "nape" and self.n_heads % 2:
            raise ValueError(f"positions='nape' needs an even n_heads (half ALiBi, half NoPE), got {self.n_heads}")
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError(f"positions='rope' needs an even head_dim, got {self.head_dim}")
        if self.nape_slopes not in NAPE_SLOPES:
            raise ValueError(f"unknown nape_slopes {self.nape_slopes!r}; choose one of {', '.join(NAPE_SLOPES)}")
        if self.adatemp_order not in ADATEMP_ORDERS:
            raise ValueError(f"unknown adatemp_order {self.adatemp_order!r}; choose one of {', '.join(ADATEMP_ORDERS)}")
        if self.asentmax_init not in ASENTMAX_INITS:
            raise ValueError(f"unknown asentmax_init {self.asentmax_init!r}; choose one of {', '.join(ASENTMAX_INITS)}")
        if self.asentmax_scaler not in ASENTMAX_SCALERS:
            raise ValueError(f"unknown asentmax_scaler {self.asentmax_scaler!r}; "
                             f"choose one of {', '.join(ASENTMAX_SCALERS)}")
        if not self.alpha >= 1:
            raise ValueError(f"alpha must be >= 1, got {self.alpha}")
        if self.learn_alpha:
            if self.method not in ("entmax", "asentmax"):
                raise ValueError(f"learn_alpha needs method entmax or asentmax, got {self.method!r}")
            if not 1 < self.alpha < self.max_alpha:
                raise ValueError(f"learn_alpha needs 1 < alpha < max_alpha, got alpha={self.alpha}, "
                                 f"max_alpha={self.max_alpha}")
        if self.rope_theta <= 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")
        if self.norm_eps <= 0 or self.init_std <= 0:
            raise ValueError("norm_eps and init_std must be > 0")
        if self.attn_chunk_size is not None:
            pos_int("attn_chunk_size")
        if self.attn_backend != "auto" and self.attn_backend not in BACKENDS:
            raise ValueError(f"unknown attn_backend {self.attn_backend!r}; choose auto or one of {', '.join(BACKENDS)}")

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ModelConfig":
        return strict_from_dict(cls, d)


def strict_from_dict(cls, d: Dict[str, Any]):
    """Build the config dataclass `cls` from a plain dict, rejecting unknown fields by name."""
    if not isinstance(d, dict):
        raise ValueError(f"a {cls.__name__} must be built from a dict, got {type(d).__name__}")
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")
    return cls(**d)
