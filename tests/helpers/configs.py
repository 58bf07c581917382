"""The tiny models and runs that tests in several folders train: one definition each, changed per test by name."""

from __future__ import annotations

# vocabulary size of the tiny HSA models
HSA_VOCAB = 24

# `--set` values of a tiny transformer run: seconds to train on one CPU thread, no validation
TINY_RUN = {
    "model.d_model": "32",
    "model.d_ff": "64",
    "model.n_heads": "2",
    "train.batch_size": "8",
    "train.lr": "3e-3",
    "train.warmup_steps": "2",
    "train.log_every": "2",
    "train.val_every": "0",
    "train.val_samples": "2",
    "train.threads": "1",
}


def tiny_run_sets(changes: dict[str, str] | None = None) -> list[str]:
    """The ``--set`` strings ("key=value") of TINY_RUN with ``changes`` applied (a key of TINY_RUN keeps its
    place, a new key comes last), for ``build_config(..., sets=...)`` or ``--set`` on the command line."""
    return [f"{k}={v}" for k, v in {**TINY_RUN, **(changes or {})}.items()]


def decoder_section(**fields) -> dict:
    """The stored form of a ``ModelConfig`` (a model section) from its fields by name: its own fields, and the
    fields of its attention settings (``method="entmax"``, ``alpha=1.3``) in the table ``attention``."""
    from longsparse.nn import ModelConfig
    from longsparse.nn.config import ATTENTION_FIELDS

    settings = {k: fields.pop(k) for k in list(fields) if k in ATTENTION_FIELDS and k not in ModelConfig.STORED_KEYS}
    return {**fields, "attention": settings}


def tiny_hsa(attention: dict | None = None, **changes):
    """A tiny HSAConfig (2 heads of width 16, chunks of 4, a window of 5, 2 retrieved chunks) with ``changes``
    applied by field name: its own fields, and the fields of its attention settings (``method="entmax"``) but
    ``topk``, which is its own (the chunks retrieved); ``attention`` is a table of settings applied last
    (``attention={"topk": 2}``: the k of the top-k method)."""
    from longsparse.hsa import HSAConfig
    from longsparse.nn.config import ATTENTION_FIELDS

    base = dict(
        vocab_size=HSA_VOCAB,
        d_model=32,
        n_heads=2,
        d_ff=48,
        n_lower=1,
        n_upper=2,
        encoder_layers=1,
        chunk_size=4,
        window=5,
        topk=2,
    )
    settings = {k: changes.pop(k) for k in list(changes) if k in ATTENTION_FIELDS and k not in HSAConfig.STORED_KEYS}
    return HSAConfig.from_dict({**base, **changes, "attention": {**settings, **(attention or {})}})
