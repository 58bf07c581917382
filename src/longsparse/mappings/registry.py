"""The attention mappings by name: softmax, entmax (α), sparsemax, top-k (k), adaptive temperature (order).

`get_mapping(name, alpha=, topk=, adatemp_order=)` validates the options a mapping reads and returns a bound
`Mapping` that carries what every attention backend needs:

* ``mapping(z)``: probabilities along the last axis, differentiable by autograd (the reference backend);
* ``forward(z) -> (p, saved)`` and ``backward(p, dp, saved) -> ∂L/∂z``: the explicit pair of the chunked
  backends' recomputing backward;
* ``alpha``: the α when the mapping is α-entmax of the logits (softmax 1, sparsemax 2, entmax its α),
  else None: the kernels (fused CPU, Triton, adasplash) take exactly these;
* ``softmax_form``: True when p = softmax(θ·z over a kept set), θ and the set chosen per row without a
  gradient; ``adjusts_logits``: whether they depend on z (top-k, adaptive temperature; not softmax);
  ``softmax_adjustment(z) -> (θ or None, dropped or None)`` gives them (the SDPA backend).

ssmax and asentmax are model-level *methods* (a mapping plus a per-query length scaler, longsparse.nn.scalers),
not mappings: `SCALED_METHODS` names their mapping, and `METHODS` lists every method a model can use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from torch import Tensor

from longsparse.mappings.entmax import AlphaLike, _check_alpha_values, entmax, entmax_jvp_backward
from longsparse.mappings.variants import ADATEMP_POLY, adaptive_temperature, topk_dropped


class Mapping:
    """A row-wise mapping with its options bound. Rows are the last axis; −inf entries are masked and a
    row that is entirely −inf maps to zeros."""

    name: str = ""
    alpha: Optional[AlphaLike] = None  # α when this is α-entmax of the logits, else None
    softmax_form: bool = False  # softmax of θ·z over a kept set (θ, the set: no gradient)
    adjusts_logits: bool = False  # softmax_form with a θ or a kept set that depend on z

    def __call__(self, z: Tensor) -> Tensor:
        return self.forward(z)[0]

    def forward(self, z: Tensor) -> Tuple[Tensor, object]:
        """(p, saved): the probabilities and what `backward` needs besides p."""
        raise NotImplementedError

    def backward(self, p: Tensor, dp: Tensor, saved: object) -> Tensor:
        """∂L/∂z (same shape as p) from ∂L/∂p, without autograd."""
        raise NotImplementedError

    def softmax_adjustment(self, z: Tensor) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        """For a softmax-form mapping: (θ (…, 1) or None, dropped (…, n) bool or None) with
        p = softmax(θ·z with the dropped entries at −inf). No gradient."""
        raise TypeError(f"mapping {self.name!r} is not a softmax of adjusted logits")

    def rows(self, heads: slice, rows: slice) -> "Mapping":
        """This mapping for a block of heads and query rows of (B, H, Nq, Nk) logits (a per-head or per-row
        α follows its block)."""
        return self

    def __repr__(self) -> str:
        return f"<mapping {self.name}>"


class AlphaEntmax(Mapping):
    """α-entmax of the logits: softmax (α = 1), sparsemax (α = 2), entmax (any α ≥ 1, float or tensor
    broadcastable over the rows, e.g. (1, H, 1, 1) per head)."""

    def __init__(self, name: str, alpha: AlphaLike):
        self.name, self.alpha = name, alpha
        self.softmax_form = not isinstance(alpha, Tensor) and float(alpha) == 1.0

    def __call__(self, z: Tensor) -> Tensor:
        return entmax(z, self.alpha)

    def forward(self, z: Tensor):
        return entmax(z, self.alpha), None

    def backward(self, p: Tensor, dp: Tensor, saved) -> Tensor:
        a = self.alpha.to(p.dtype) if isinstance(self.alpha, Tensor) else float(self.alpha)
        return entmax_jvp_backward(p, dp, a, -1)

    def softmax_adjustment(self, z: Tensor):
        if not self.softmax_form:
            return super().softmax_adjustment(z)
        return None, None

    def rows(self, heads: slice, rows: slice) -> "Mapping":
        a = self.alpha
        if not isinstance(a, Tensor) or a.dim() != 4 or (a.shape[1] == 1 and a.shape[2] == 1):
            return self
        return AlphaEntmax(
            self.name, a[:, heads if a.shape[1] != 1 else slice(None), rows if a.shape[2] != 1 else slice(None)]
        )


class TopK(Mapping):
    """softmax over the k largest logits of each row (ties with the k-th kept), the others exactly 0."""

    softmax_form = adjusts_logits = True

    def __init__(self, k: int):
        self.name, self.k = "topk", k

    def forward(self, z: Tensor):
        return entmax(z.masked_fill(topk_dropped(z, self.k), float("-inf")), 1.0), None

    def backward(self, p: Tensor, dp: Tensor, saved) -> Tensor:
        return entmax_jvp_backward(p, dp, 1.0, -1)  # softmax on the kept set: u = p, 0 elsewhere

    def softmax_adjustment(self, z: Tensor):
        return None, topk_dropped(z, self.k)


class AdaptiveTemperature(Mapping):
    """softmax(θ·z), θ = max(1, P(H(softmax(z)))) per row when the entropy H > 0.5, else 1 (Veličković et
    al., 2024); ``order`` picks the coefficient order of P (`ADATEMP_POLY`). θ has no gradient."""

    softmax_form = adjusts_logits = True

    def __init__(self, order: str):
        self.name, self.order = "adatemp", order

    def forward(self, z: Tensor):
        theta = adaptive_temperature(z, self.order)
        return entmax(z * theta, 1.0), theta

    def backward(self, p: Tensor, dp: Tensor, theta) -> Tensor:
        return entmax_jvp_backward(p, dp, 1.0, -1).mul_(theta)

    def softmax_adjustment(self, z: Tensor):
        return adaptive_temperature(z, self.order), None


@dataclass(frozen=True)
class MappingInfo:
    """A registered mapping: its name, the attention() options it reads and how to bind them."""

    name: str
    summary: str
    options: Tuple[str, ...]
    bind: Callable[..., Mapping]


def _bind_entmax(alpha: AlphaLike = 1.5, **_) -> Mapping:
    _check_alpha_values(alpha)
    return AlphaEntmax("entmax", alpha)


def _bind_topk(topk: int = 32, **_) -> Mapping:
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk must be an integer >= 1, got {topk!r}")
    return TopK(topk)


def _bind_adatemp(adatemp_order: str = "original", **_) -> Mapping:
    if adatemp_order not in ADATEMP_POLY:
        raise ValueError(f"adatemp_order must be one of {sorted(ADATEMP_POLY)}, got {adatemp_order!r}")
    return AdaptiveTemperature(adatemp_order)


MAPPINGS: Dict[str, MappingInfo] = {
    m.name: m
    for m in (
        MappingInfo("softmax", "softmax(z)", (), lambda **_: AlphaEntmax("softmax", 1.0)),
        MappingInfo(
            "entmax", "α-entmax(z); α = alpha, a float ≥ 1 or a per-head (H,) tensor", ("alpha",), _bind_entmax
        ),
        MappingInfo(
            "sparsemax", "2-entmax(z), the projection onto the simplex", (), lambda **_: AlphaEntmax("sparsemax", 2.0)
        ),
        MappingInfo("topk", "softmax over the topk largest logits of each row", ("topk",), _bind_topk),
        MappingInfo(
            "adatemp",
            "softmax(θ·z), adaptive temperature θ (adatemp_order: original | reversed)",
            ("adatemp_order",),
            _bind_adatemp,
        ),
    )
}
MAPPING_NAMES: Tuple[str, ...] = tuple(MAPPINGS)

# Model-level methods that are a mapping plus a per-query length scaler (its scales reach attention as q_scale).
SCALED_METHODS: Dict[str, str] = {"ssmax": "softmax", "asentmax": "entmax"}
METHODS: Tuple[str, ...] = MAPPING_NAMES + tuple(SCALED_METHODS)


def method_mapping(method: str) -> str:
    """The mapping of a model-level method (itself for a plain mapping)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    return SCALED_METHODS.get(method, method)


def get_mapping(name: str, *, alpha: AlphaLike = 1.5, topk: int = 32, adatemp_order: str = "original") -> Mapping:
    """The registered mapping ``name`` bound to its options (each mapping reads only its own)."""
    info = MAPPINGS.get(name)
    if info is None:
        if name in SCALED_METHODS:
            raise ValueError(
                f"{name!r} is a model method (mapping {SCALED_METHODS[name]!r} + a per-query length scaler), not a "
                f"mapping: use mapping={SCALED_METHODS[name]!r} and pass the scales as q_scale"
            )
        raise ValueError(f"unknown mapping {name!r}; choose one of {', '.join(MAPPING_NAMES)}")
    return info.bind(alpha=alpha, topk=topk, adatemp_order=adatemp_order)


def map_scores(
    z: Tensor, name: str, *, alpha: AlphaLike = 1.5, topk: int = 32, adatemp_order: str = "original"
) -> Tensor:
    """The mapping ``name`` applied to logits z (…, Nk) along the last axis; −inf entries are masked."""
    return get_mapping(name, alpha=alpha, topk=topk, adatemp_order=adatemp_order)(z)


__all__ = [
    "Mapping",
    "AlphaEntmax",
    "TopK",
    "AdaptiveTemperature",
    "MappingInfo",
    "MAPPINGS",
    "MAPPING_NAMES",
    "SCALED_METHODS",
    "METHODS",
    "method_mapping",
    "get_mapping",
    "map_scores",
]
