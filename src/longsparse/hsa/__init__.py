"""Hierarchical sparse attention (docs/method.md §8, paper [B]): sliding-window lower layers, a chunk memory with
encoder/CLS landmarks, per-token (or per-chunk) top-k / entmax chunk retrieval in the upper layers, and an
exact long-context evaluator that runs the upper layers only where outputs are needed.

    from longsparse.hsa import HSAConfig, HSAModel, hsa_fast_logits
    model = HSAModel(HSAConfig(vocab_size=64))
    logits = model(ids)                                   # (B, N, V)
    last = hsa_fast_logits(model, long_ids, [N - 1])      # exact, affordable at N = 10^6
"""

from longsparse.hsa.config import (
    FUSIONS,
    HSA_IMPLS,
    HSA_POSITIONS,
    LANDMARKS,
    LENGTH_SCALES,
    RETRIEVALS,
    WEIGHTS,
    HSAConfig,
)
from longsparse.hsa.diagnostics import answer_positions, needle_diagnostics, retrieval_diagnostics, score_needles
from longsparse.hsa.fast import HSAFastEvaluator, hsa_fast_logits, select_positions
from longsparse.hsa.model import (
    ChunkEncoder,
    ChunkEncoderAttention,
    ChunkMemory,
    HSAAttention,
    HSABlock,
    HSAModel,
    SlidingWindowAttention,
    SWABlock,
    TokenAttention,
)
from longsparse.hsa.ops import chunk_weights, length_scale, sliding_window_attention, visible_chunks

__all__ = [
    "HSAConfig",
    "HSAModel",
    "HSAFastEvaluator",
    "hsa_fast_logits",
    "retrieval_diagnostics",
    "needle_diagnostics",
    "score_needles",
    "answer_positions",
    "select_positions",
    "chunk_weights",
    "visible_chunks",
    "length_scale",
    "sliding_window_attention",
    "ChunkMemory",
    "ChunkEncoder",
    "HSAAttention",
    "HSABlock",
    "SWABlock",
    "TokenAttention",
    "SlidingWindowAttention",
    "ChunkEncoderAttention",
    "LANDMARKS",
    "FUSIONS",
    "WEIGHTS",
    "RETRIEVALS",
    "HSA_POSITIONS",
    "LENGTH_SCALES",
    "HSA_IMPLS",
]
