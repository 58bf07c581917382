"""What the trainer validates, named by the task (``task.objective``): the metrics measured at each validation
length, their summary in ``metrics.jsonl``, and the key that picks the best checkpoint (larger is better).

* ``exact_match`` (the synthetic tasks): greedy generation (seq2seq) or one teacher-forced pass (tokcls) on
  ``val_samples`` validation examples per length (``longsparse.tasks.scoring.score_length``); per length
  ``{"exact_match", "token_accuracy"}``, key (mean exact match, mean token accuracy).
* ``perplexity`` (language modelling): the mean next-token NLL on ``val_samples`` windows of the validation split
  per length (``task.validation_nll``); per length ``{"nll", "ppl"}``, key −(mean NLL).

The training loss needs no objective: every task's labels are next-token targets with ``IGNORE_INDEX`` where no
loss is taken, so one cross-entropy serves all of them (``loop.train_step``).
"""

from __future__ import annotations

from typing import Mapping, Optional

import torch

from longsparse.tasks.scoring import score_length


class ExactMatch:
    name = "exact_match"

    def measure(
        self, model, task, length: int, samples: int, *, seed: int, autocast_dtype: Optional[torch.dtype]
    ) -> dict:
        r = score_length(model, task, length, samples, seed=seed, split="validation", autocast_dtype=autocast_dtype)
        return {"exact_match": r["exact_match"], "token_accuracy": r["token_accuracy"]}

    def summary(self, by_length: Mapping[str, dict]) -> dict:
        n = len(by_length)
        return {
            "val_mean_exact_match": sum(v["exact_match"] for v in by_length.values()) / n,
            "val_mean_token_accuracy": sum(v["token_accuracy"] for v in by_length.values()) / n,
        }

    def key(self, summary: Mapping) -> list[float]:
        return [summary["val_mean_exact_match"], summary["val_mean_token_accuracy"]]

    def line(self, by_length: Mapping[str, dict]) -> str:
        return "val exact match " + "  ".join(f"L={k}: {v['exact_match']:.3f}" for k, v in by_length.items())

    def best_text(self, best: Mapping) -> str:
        return f"best mean val exact match {best['key'][0]:.3f} at step {best['step']}"


class Perplexity:
    name = "perplexity"

    def measure(
        self, model, task, length: int, samples: int, *, seed: int, autocast_dtype: Optional[torch.dtype]
    ) -> dict:
        # the windows are fixed stretches of the validation split: the same at every call, whatever the seed
        with torch.autocast(
            next(model.parameters()).device.type,
            dtype=autocast_dtype or torch.float32,
            enabled=autocast_dtype is not None,
        ):
            return task.validation_nll(model, length, samples)

    def summary(self, by_length: Mapping[str, dict]) -> dict:
        return {"val_mean_nll": sum(v["nll"] for v in by_length.values()) / len(by_length)}

    def key(self, summary: Mapping) -> list[float]:
        return [-summary["val_mean_nll"]]

    def line(self, by_length: Mapping[str, dict]) -> str:
        return "val perplexity " + "  ".join(f"L={k}: {v['ppl']:.2f}" for k, v in by_length.items())

    def best_text(self, best: Mapping) -> str:
        return f"best mean val NLL {-best['key'][0]:.4f} at step {best['step']}"


OBJECTIVES = {o.name: o for o in (ExactMatch(), Perplexity())}


def objective_of(task):
    """The objective object a task names (``task.objective``; the synthetic tasks' default is exact match)."""
    name = getattr(task, "objective", ExactMatch.name)
    if name not in OBJECTIVES:
        raise ValueError(f"task {task.name!r} names the unknown objective {name!r}; known: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]
