"""Scoring a model on a task at one length: greedy generation with the KV cache (seq2seq) or one forward pass
(token classification), exact match of the whole target and per-token accuracy, Wilson intervals
(`longsparse.stats`). The trainer's validation and `longsparse.evaluate`'s run sweeps both score through here.

The examples of (task, length, seed, split) are one seeded stream, drawn batch after batch, so the same
examples are scored whatever the batch size (``Task.batch`` with an int length consumes the stream only
through the examples themselves).
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional

import torch

from longsparse.stats import wilson_interval
from longsparse.tasks.base import Batch

DEFAULT_BATCH_TOKENS = 1 << 15  # tokens per evaluation batch (memory); long lengths go one example at a time
# Greedy generation (seq2seq tasks) is bound by the per-step cost of a decoding step, not by memory: at 2,048
# source tokens 20 examples in one batch took 0.72x the time of batches of 7, with the same predictions (a copy
# model).
DECODE_BATCH_TOKENS = 1 << 17


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


def new_score_state(length: int, samples: int, *, seed: int = 0, split: str = "test", batch_size: int = 1) -> dict:
    """The counts of a scoring of ``samples`` examples of the (task, ``length``, ``seed``, ``split``) stream that
    has not begun: a JSON-able dict that ``score_more`` advances (``rng``: the stream's position once begun;
    ``pieces``: one entry per call that scored examples) and ``score_result`` turns into the result. Saved
    between calls (``longsparse.evaluate.sweep``), it continues with the next example of the same stream."""
    return {
        "length": length,
        "samples": samples,
        "seed": seed,
        "split": split,
        "batch_size": batch_size,
        "done": 0,
        "n_exact": 0,
        "n_tokens": 0,
        "n_correct_tokens": 0,
        "seconds": 0.0,
        "rng": None,
        "pieces": [],
    }


@torch.no_grad()
def score_more(
    model,
    task,
    state: dict,
    *,
    until: Optional[float] = None,
    max_examples: Optional[int] = None,
    rate_hint: Optional[float] = None,
    autocast_dtype: Optional[torch.dtype] = None,
    progress: bool = False,
    on_batch: Optional[Callable[[dict], None]] = None,
) -> Optional[str]:
    """Score the next examples of ``state`` (``new_score_state``; updated in place) in batches of its
    ``batch_size``, until all its samples are scored, or ``max_examples`` more are, or the next batch would not
    end before ``until`` (a ``time.time()`` value): a batch shrinks to the examples that fit at the seconds per
    example measured so far (before any: ``rate_hint``; with neither, one example measures it). The examples
    are the stream's whatever the batches, so any sequence of calls scores the examples one call scores, with
    the same counts. ``on_batch(state)`` after every batch (to save it). Returns None when every sample is
    scored, else why it stopped."""
    task.check_length(state["length"])
    L, target, full = state["length"], state["samples"], state["batch_size"]
    rng = task.rng(state["seed"], state["split"])
    if state["rng"] is not None:
        v, internal, g = state["rng"]
        rng.setstate((v, tuple(internal), g))
    rate = state["seconds"] / state["done"] if state["done"] else rate_hint
    dev = next(model.parameters()).device
    piece = {"examples": 0, "seconds": 0.0, "device": str(dev), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    state["pieces"].append(piece)  # this call's, updated in place as batches finish (so a saved state has it)
    was_training = model.training
    model.eval()
    bar = progress_bar(target - state["done"], f"L={L}", progress)
    stop = None
    try:
        while state["done"] < target:
            bs = min(full, target - state["done"])
            if max_examples is not None:
                if piece["examples"] >= max_examples:
                    stop = f"{max_examples} examples scored in this call"
                    break
                bs = min(bs, max_examples - piece["examples"])
            if until is not None:
                left = until - time.time()
                if left <= 0:
                    stop = "deadline passed"
                    break
                if rate is None:
                    bs = 1  # a probe: its time sizes the next batches
                elif rate * bs > left:
                    bs = int(left // rate)
                    if bs < 1:
                        stop = f"deadline ({rate:.3g} s per example, {max(left, 0.0):.0f} s left)"
                        break
            t0 = time.perf_counter()
            batch = task.batch(L, bs, rng=rng)
            sc = task.score(predict(model, task, batch, autocast_dtype).cpu(), batch)
            dt = time.perf_counter() - t0
            v, internal, g = rng.getstate()
            state.update(
                done=state["done"] + bs,
                n_exact=state["n_exact"] + sc.n_exact,
                n_tokens=state["n_tokens"] + sc.n_tokens,
                n_correct_tokens=state["n_correct_tokens"] + sc.n_correct_tokens,
                seconds=state["seconds"] + dt,
                rng=[v, list(internal), g],
            )
            piece["examples"] += bs
            piece["seconds"] = round(piece["seconds"] + dt, 3)
            rate = piece["seconds"] / piece["examples"]
            if bar is not None:
                bar.update(bs)
            if on_batch is not None:
                on_batch(state)
    finally:
        model.train(was_training)
        if bar is not None:
            bar.close()
        if not piece["examples"]:
            state["pieces"].pop()
    return stop


def score_result(state: dict) -> dict:
    """The result of a finished (or, for a report of progress, unfinished) ``state``: exact match, token
    accuracy and their Wilson 95% intervals over the examples scored, the batch size, the seconds (summed over
    calls), the seed and the split (the dict ``score_length`` returns)."""
    n, tokens = state["done"], state["n_tokens"]
    lo, hi = wilson_interval(state["n_exact"], n)
    tlo, thi = wilson_interval(state["n_correct_tokens"], tokens)
    return {
        "length": state["length"],
        "n": n,
        "n_exact": state["n_exact"],
        "exact_match": state["n_exact"] / n if n else float("nan"),
        "exact_match_ci": [lo, hi],
        "n_tokens": tokens,
        "n_correct_tokens": state["n_correct_tokens"],
        "token_accuracy": state["n_correct_tokens"] / tokens if tokens else float("nan"),
        "token_accuracy_ci": [tlo, thi],
        "batch_size": state["batch_size"],
        "seconds": round(state["seconds"], 3),
        "seed": state["seed"],
        "split": state["split"],
    }


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
    state = new_score_state(length, samples, seed=seed, split=split, batch_size=bs)
    score_more(model, task, state, autocast_dtype=autocast_dtype, progress=progress)
    return score_result(state)
