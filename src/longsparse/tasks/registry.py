"""Task registry: ``get_task(name, preset=None, **params)``.

``PRESETS[name][preset]`` holds parameter overrides. ``"paper"`` is always the docs/method.md §5 defaults (empty
overrides). ``"cpu"`` is a smaller parameterisation meant for minutes-long CPU training; it only differs
where listed below, and results obtained with it must say so:

* mqmtar/cpu: alphabet 64 and 1,000 keys / 1,000 values (instead of 256 and 10,000 / 10,000), same layout,
  pair density and 4 queries — fewer symbol embeddings to learn.
* mqmtar_inline/cpu: 8 queries (instead of 4) per example, so each example supervises more retrievals.
* every other task: identical to "paper" (the tasks are already small; the model and step budget are
  what the training presets shrink).
"""

from __future__ import annotations

from dataclasses import fields

from longsparse.tasks.base import Task
from longsparse.tasks.lm import CorpusLM
from longsparse.tasks.ruler import MultiQueryNeedle, Passkey, VariableTracking
from longsparse.tasks.seq2seq import MQMTAR, Copy, MaxRetrieval, MQMTARInline, Reverse, Sort
from longsparse.tasks.tokcls import FlipFlop, LocalCount, TwoBack

TASKS: dict[str, type[Task]] = {
    cls.name: cls for cls in (MQMTAR, MQMTARInline, MaxRetrieval, Copy, Sort, Reverse, LocalCount, TwoBack, FlipFlop)
}

PRESETS: dict[str, dict[str, dict]] = {name: {"paper": {}, "cpu": {}} for name in TASKS}
# RULER-style tasks of the HSA study (docs/method.md §8): resolved by get_task, kept out of TASKS (the docs/method.md §5 suite,
# whose lengths 32–64 are below their minimum lengths).
RULER_TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (Passkey, MultiQueryNeedle, VariableTracking)}
PRESETS.update({name: {"paper": {}, "cpu": {}} for name in RULER_TASKS})
# Language modelling on a text corpus (docs/method.md §6): a task of the same trainer, kept out of TASKS too.
CORPUS_TASKS: dict[str, type[Task]] = {CorpusLM.name: CorpusLM}
PRESETS.update({name: {"paper": {}, "cpu": {}} for name in CORPUS_TASKS})
PRESETS["mqmtar"]["cpu"] = {"alphabet_size": 64, "num_keys": 1000, "num_values": 1000}
PRESETS["mqmtar_inline"]["cpu"] = {"num_queries": 8}


def task_class(name: str) -> type[Task]:
    """The task class of ``name`` (aliases such as ``flipflop`` resolved), without building a task."""
    key = name.replace("-", "_").lower() if isinstance(name, str) else name
    key = {
        "flipflop": "flip_flop",
        "2back": "two_back",
        "2_back": "two_back",
        "local_counting": "local_count",
        "maxretrieval": "max_retrieval",
    }.get(key, key)
    known = {**TASKS, **RULER_TASKS, **CORPUS_TASKS}
    if key not in known:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(known))}")
    return known[key]


def get_task(name: str, preset: str | None = None, **params) -> Task:
    """The task ``name`` with ``PRESETS[name][preset]`` (if given) updated by ``params``."""
    cls = task_class(name)
    key = cls.name
    merged: dict = {}
    if preset is not None:
        if preset not in PRESETS[key]:
            raise ValueError(f"unknown preset {preset!r} for task {key!r}; known: {', '.join(PRESETS[key])}")
        merged.update(PRESETS[key][preset])
    merged.update(params)
    allowed = [f.name for f in fields(cls)]
    unknown = sorted(set(merged) - set(allowed))
    if unknown:
        raise ValueError(f"task {key!r} has no parameter(s) {unknown}; its parameters: {allowed}")
    return cls(**merged)
