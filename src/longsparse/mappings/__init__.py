"""Row-wise probability mappings (pure functions + autograd Functions, no module state) and the registry of
attention mappings by name (`get_mapping`, `MAPPING_NAMES`)."""

from longsparse.mappings.budget import budget_sparsemax
from longsparse.mappings.compat import (
    BudgetBisect,
    Entmax15,
    EntmaxBisect,
    NormmaxBisect,
    Sparsemax,
    SparsemaxBisect,
    budget_bisect,
    entmax_bisect,
    normmax_bisect,
    sparsemax_bisect,
)
from longsparse.mappings.entmax import (
    LearnedAlpha,
    bounded_alpha,
    entmax,
    entmax15,
    inverse_bounded_alpha,
    sparsemax,
)
from longsparse.mappings.losses import (
    Entmax15Loss,
    EntmaxBisectLoss,
    NormmaxBisectLoss,
    SparsemaxBisectLoss,
    SparsemaxLoss,
    entmax15_loss,
    entmax_bisect_loss,
    normmax_bisect_loss,
    sparsemax_bisect_loss,
    sparsemax_loss,
    tsallis_entropy,
)
from longsparse.mappings.normmax import normmax
from longsparse.mappings.registry import MAPPING_NAMES, METHODS, SCALED_METHODS, get_mapping, map_scores
from longsparse.mappings.variants import (
    ADATEMP_POLY,
    adaptive_temperature,
    adaptive_temperature_softmax,
    topk_softmax,
)

__all__ = [
    "MAPPING_NAMES",
    "METHODS",
    "SCALED_METHODS",
    "get_mapping",
    "map_scores",
    "ADATEMP_POLY",
    "adaptive_temperature",
    "adaptive_temperature_softmax",
    "topk_softmax",
    "entmax",
    "normmax",
    "budget_sparsemax",
    # the entmax package's 22 public names (v1.3)
    "entmax15",
    "sparsemax",
    "entmax_bisect",
    "sparsemax_bisect",
    "normmax_bisect",
    "budget_bisect",
    "Entmax15",
    "Sparsemax",
    "EntmaxBisect",
    "SparsemaxBisect",
    "NormmaxBisect",
    "BudgetBisect",
    "entmax15_loss",
    "sparsemax_loss",
    "entmax_bisect_loss",
    "sparsemax_bisect_loss",
    "normmax_bisect_loss",
    "Entmax15Loss",
    "SparsemaxLoss",
    "EntmaxBisectLoss",
    "SparsemaxBisectLoss",
    "NormmaxBisectLoss",
    "tsallis_entropy",
    "bounded_alpha",
    "inverse_bounded_alpha",
    "LearnedAlpha",
]
