"""Synthetic length-generalisation tasks (docs/method.md §5): streaming, seeded generators and their scorers.

    task = get_task("mqmtar")                       # or preset="cpu", or any parameter as a keyword
    for batch in task.batches(batch_size=128, seed=0):   # training stream, L ~ U[32, 64] per batch
        loss = F.cross_entropy(model(batch.input_ids).flatten(0, 1), batch.labels.flatten(), ignore_index=-100)
    test = task.batch(1024, batch_size=100, seed=0, split="test")
    gen = greedy(model, test.prompt_ids(), test.max_new_tokens)   # seq2seq; tokcls: model(...).argmax(-1)
    task.score(gen, test).exact_match

Conventions (token ids, label shift, prompts, splits) are documented in ``longsparse.tasks.base``;
length semantics per task in ``seq2seq`` and ``tokcls``; presets in ``registry``. Language modelling on a text
corpus (``lm``: ``CorpusLM``) is a task of the same kind for the trainer: batches of next-token labels and a
perplexity objective.
"""

from longsparse.tasks.base import (
    BOS,
    EOS,
    IGNORE_INDEX,
    PAD,
    SEP,
    SPLITS,
    TEST_LENGTHS,
    TRAIN_LENGTHS,
    Batch,
    Example,
    Score,
    Task,
    collate,
    make_rng,
    sample_length,
    score_generated,
    score_positions,
)
from longsparse.tasks.lm import CorpusLM
from longsparse.tasks.registry import CORPUS_TASKS, PRESETS, TASKS, get_task
from longsparse.tasks.seq2seq import MQMTAR, Copy, MaxRetrieval, MQMTARInline, Reverse, Sort
from longsparse.tasks.tokcls import FlipFlop, LocalCount, TwoBack

__all__ = [
    "PAD",
    "BOS",
    "SEP",
    "EOS",
    "IGNORE_INDEX",
    "SPLITS",
    "TRAIN_LENGTHS",
    "TEST_LENGTHS",
    "Example",
    "Batch",
    "Score",
    "Task",
    "collate",
    "make_rng",
    "sample_length",
    "score_generated",
    "score_positions",
    "TASKS",
    "CORPUS_TASKS",
    "PRESETS",
    "get_task",
    "CorpusLM",
    "MQMTAR",
    "MQMTARInline",
    "MaxRetrieval",
    "Copy",
    "Reverse",
    "Sort",
    "LocalCount",
    "TwoBack",
    "FlipFlop",
]
