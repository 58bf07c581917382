"""Scoring a model on a task at one length: greedy generation with the KV cache (seq2seq) or one forward pass
(token classification), exact match of the whole target and per-token accuracy, Wilson intervals.

The examples of (task, length, seed, split) are one seeded stream, drawn batch after batch, so the same
examples are scored whatever the batch size (``Task.batch`` with an int length consumes the stream only
through the examples themselves).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Optional

import torch

from longsparse.tasks import Batch, Score

DEFAULT_BATCH_TOKENS = 1 << 15  # tokens per evaluation batch (memory); long lengths go one example at a time
# Greedy generation (seq2seq tasks) is bound by the per-step cost of a decoding step, not by memory: at 2,048
# source tokens 20 examples in one batch took 0.72x the time of batches of 7, with the same predictions (a copy
# model).
DECODE_BATCH_TOKENS = 1 << 17


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% (z = 1.96) Wilson score interval of a binomial proportion k / n; (0, 1) when n = 0."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def sequence_tokens(task, length: int) -> int:
    """Total tokens of one example at task length ``length`` (one probe draw; cheap)."""
    ex = task.sample(length, task.rng(0, "test"))
    return len(ex.input_ids)


def check_batch_tokens(batch_tokens) -> None:
    if batch_tokens is not None and (
        isinstance(batch_tokens, bool) or not isinstance(batch_tokens, int) or batch_tokens < 1
    ):
        raise ValueError(f"--batch-tokens must be a positive integer, got {batch_tokens!r}")


def progress_bar(total: int, desc: str, enabled: bool):
    """A tqdm bar on stderr (examples done, rate, ETA), or None when ``enabled`` is false or stderr is not a
    terminal: logs and captured output stay free of carriage-return noise."""
    if not enabled or not sys.stderr.isatty():
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="ex", file=sys.stderr, leave=False, dynamic_ncols=True)


def eval_batch_size(task, length: int, samples: int, batch_tokens: Optional[int] = None) -> int:
    """Examples per batch so that batch × sequence length stays within ``batch_tokens`` (None: the task kind's
    default, DECODE_BATCH_TOKENS for generated targets, else DEFAULT_BATCH_TOKENS)."""
    if batch_tokens is None:
        batch_tokens = DECODE_BATCH_TOKENS if task.kind == "seq2seq" else DEFAULT_BATCH_TOKENS
    check_batch_tokens(batch_tokens)
    return max(1, min(samples, batch_tokens // max(1, sequence_tokens(task, length))))


@torch.no_grad()
def predict(model, task, batch: Batch, autocast_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """seq2seq: greedy tokens after the prompt (B, target width); tokcls: argmax per position (B, T)."""
    dev = next(model.parameters()).device
    batch = batch.to(dev)
    ctx = (
        torch.autocast(dev.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else torch.autocast(dev.type, enabled=False)
    )
    with ctx:
        if task.kind == "seq2seq":
            p = batch.prompt_len
            if bool((p == p[0]).all()):
                prompts, mask = batch.prompt_ids(), None
            else:  # left-pad the prompts
                P = int(p.max())
                prompts = torch.zeros(batch.batch_size, P, dtype=torch.long, device=dev)
                mask = torch.zeros(batch.batch_size, P, dtype=torch.bool, device=dev)
                for b, row in enumerate(batch.prompts()):
                    prompts[b, P - len(row) :] = row
                    mask[b, P - len(row) :] = True
            return model.generate(prompts, batch.max_new_tokens, attention_mask=mask, use_cache=True)
        return model(batch.input_ids, attention_mask=batch.attention_mask).argmax(-1)


@torch.no_grad()
def score_length(
    model,
    task,
    length: int,
    samples: int,
    *,
    seed: int = 0,
    split: str = "test",
    batch_size: Optional[int] = None,
    batch_tokens: Optional[int] = None,
    autocast_dtype: Optional[torch.dtype] = None,
    progress: bool = False,
) -> dict:
    """Score ``samples`` examples of ``length``; returns a JSON-able dict with exact match, token accuracy,
    Wilson 95% intervals, the batch size used and the seconds taken. ``progress``: a progress bar on stderr
    (only when it is a terminal)."""
    task.check_length(length)
    if not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive integer, got {samples!r}")
    bs = batch_size or eval_batch_size(task, length, samples, batch_tokens)
    was_training = model.training
    model.eval()
    rng = task.rng(seed, split)
    total = Score()
    t0 = time.perf_counter()
    bar = progress_bar(samples, f"L={length}", progress)
    try:
        done = 0
        while done < samples:
            n = min(bs, samples - done)
            batch = task.batch(length, n, rng=rng)
            total = total + task.score(predict(model, task, batch, autocast_dtype).cpu(), batch)
            done += n
            if bar is not None:
                bar.update(n)
    finally:
        model.train(was_training)
        if bar is not None:
            bar.close()
    lo, hi = wilson_interval(total.n_exact, total.n_examples)
    tlo, thi = wilson_interval(total.n_correct_tokens, total.n_tokens)
    return {
        "length": length,
        "n": total.n_examples,
        "n_exact": total.n_exact,
        "exact_match": total.exact_match,
        "exact_match_ci": [lo, hi],
        "n_tokens": total.n_tokens,
        "n_correct_tokens": total.n_correct_tokens,
        "token_accuracy": total.token_accuracy,
        "token_accuracy_ci": [tlo, thi],
        "batch_size": bs,
        "seconds": round(time.perf_counter() - t0, 3),
        "seed": seed,
        "split": split,
    }
