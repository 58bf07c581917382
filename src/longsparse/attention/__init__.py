"""attention(q, k, v, ...) on (B, H, N, D) for every mapping, bias and mask."""
from longsparse.attention.core import (
    ADATEMP_POLY, MAPPINGS, adaptive_temperature, adaptive_temperature_softmax, attention, dense_logits, map_scores,
)

__all__ = ["attention", "dense_logits", "map_scores", "adaptive_temperature", "adaptive_temperature_softmax",
           "MAPPINGS", "ADATEMP_POLY"]
