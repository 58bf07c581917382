"""Where a sort model's greedy outputs go wrong (docs/results.md, section 1, sort recipe search).

For every wrong example of the test split (seed 0) at length L, the first wrong output token is classed as
  stopped early   the target repeats the previous symbol, the model moved on (it under-counted a duplicate)
  repeated        the model repeated the previous symbol once too often (over-counted)
  skipped         the model jumped to a larger symbol than the next one
  too low         anything else
and tallied with the multiplicity (count in the source) of the previous target symbol; the multiplicities of all
symbols of all examples are printed for comparison.
usage: python results/synthetic_trials/scripts/sort_errors.py RUN [SAMPLES=1000] [LENGTH=64]   (last checkpoint)
"""
import collections
import sys

import torch

from longsparse.evaluate.core import predict
from longsparse.evaluate.sweep import load_run_model
from longsparse.tasks.base import SPECIAL_TOKENS
from longsparse.train.config import make_task

EOS = SPECIAL_TOKENS.index("<eos>")


def first_error_class(src: list[int], out: list[int]) -> tuple[str, int] | None:
    """None when ``out`` is the sorted ``src`` + EOS, else (class, multiplicity of the previous target symbol)."""
    tgt = sorted(src) + [EOS]
    out = out[:len(tgt)]
    if out == tgt:
        return None
    t = next(j for j in range(len(tgt)) if j >= len(out) or out[j] != tgt[j])
    prev = tgt[t - 1] if t else None
    got = out[t] if t < len(out) else None
    if tgt[t] == prev:
        cls = "stopped early"
    elif got == prev:
        cls = "repeated"
    elif got is not None and got != EOS and got > tgt[t]:
        cls = "skipped"
    else:
        cls = "too low"
    return cls, (src.count(prev) if t else 0)


def main(run: str, samples: int = 1000, length: int = 64) -> None:
    torch.set_num_threads(1)
    model, cfg, _ = load_run_model(run, "last")
    model.eval()
    task = make_task(cfg["task"])
    if task.name != "sort":
        sys.exit(f"{run} is a {task.name!r} run, not sort")
    rng = task.rng(0, "test")
    errors, by_mult, mult = collections.Counter(), collections.Counter(), collections.Counter()
    done = 0
    while done < samples:
        b = task.batch(length, min(250, samples - done), rng=rng)
        pred = predict(model, task, b)
        for i, row in enumerate(b.prompts()):
            src = row.tolist()[1:-1]                # drop BOS and SEP
            mult.update(src.count(v) for v in set(src))
            e = first_error_class(src, pred[i].tolist())
            if e:
                errors[e[0]] += 1
                by_mult[e] += 1
        done += b.batch_size
    print(f"{run}: {sum(errors.values())} wrong of {done} at L = {length}: {dict(errors)}")
    print("first errors by (class, multiplicity of the previous symbol):", sorted(by_mult.items()))
    print("multiplicities of all symbols of all examples:", sorted(mult.items()))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], *(int(x) for x in sys.argv[2:4]))
