"""attention(q, k, v, ...) on (B, H, N, D) for every mapping, bias and mask, through named backends
(`BACKENDS`; `explain_attention` says which one auto picks and why)."""

from longsparse.attention.backends import BACKENDS, Backend
from longsparse.attention.core import attention, explain_attention
from longsparse.attention.logits import additive_bias, dense_logits
from longsparse.attention.policy import Choice, select_backend
from longsparse.mappings.registry import map_scores

__all__ = [
    "attention",
    "explain_attention",
    "BACKENDS",
    "Backend",
    "Choice",
    "select_backend",
    "dense_logits",
    "additive_bias",
    "map_scores",
]
