"""Evaluation of run folders: per length, exact match / token accuracy with Wilson intervals, written as result
JSON (``sweep``, the ``longsparse eval`` command), and the memory check before long lengths (``memory``). Scoring
one length lives below the trainer, in ``longsparse.tasks.scoring``."""

from longsparse.evaluate.sweep import FORMAT, evaluate_run, load_run_model, parse_lengths

__all__ = ["evaluate_run", "load_run_model", "parse_lengths", "FORMAT"]
