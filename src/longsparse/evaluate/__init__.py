"""Evaluation: exact match / token accuracy per length with Wilson intervals (``core``) and run sweeps written
as result JSON (``sweep``, the ``longsparse eval`` command)."""

from longsparse.evaluate.core import (
    DECODE_BATCH_TOKENS,
    DEFAULT_BATCH_TOKENS,
    eval_batch_size,
    predict,
    score_length,
    wilson_interval,
)
from longsparse.evaluate.sweep import FORMAT, evaluate_run, load_run_model, parse_lengths

__all__ = [
    "score_length",
    "predict",
    "wilson_interval",
    "eval_batch_size",
    "DEFAULT_BATCH_TOKENS",
    "DECODE_BATCH_TOKENS",
    "evaluate_run",
    "load_run_model",
    "parse_lengths",
    "FORMAT",
]
