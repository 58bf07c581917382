"""Where a reverse model's greedy outputs go wrong (docs/results.md, section 1, reverse recipe search).

For every wrong example of the test split (seed 0) at length L: the index of the first wrong output token
(in buckets of 8), and how often the two target tokens before it occur in the source as that adjacent pair.
A model that finds its place in the source by the last two tokens it wrote cannot tell two occurrences apart;
so it also counts the sources in which no adjacent pair occurs twice, and how many of those the model gets right.
usage: python results/synthetic_trials/scripts/reverse_errors.py RUN [SAMPLES=1000] [LENGTH=64]   (last checkpoint)
"""
import collections
import sys

import torch

from longsparse.evaluate.core import predict
from longsparse.evaluate.sweep import load_run_model
from longsparse.tasks.base import SPECIAL_TOKENS
from longsparse.train.config import make_task

EOS = SPECIAL_TOKENS.index("<eos>")


def main(run: str, samples: int = 1000, length: int = 64) -> None:
    torch.set_num_threads(1)
    model, cfg, _ = load_run_model(run, "last")
    model.eval()
    task = make_task(cfg["task"])
    if task.name != "reverse":
        sys.exit(f"{run} is a {task.name!r} run, not reverse")
    rng = task.rng(0, "test")
    where, pair, all_pairs = collections.Counter(), collections.Counter(), collections.Counter()
    done = wrong = unique = unique_right = 0
    while done < samples:
        b = task.batch(length, min(250, samples - done), rng=rng)
        pred = predict(model, task, b)
        for i, row in enumerate(b.prompts()):
            src = row.tolist()[1:-1]                 # drop BOS and SEP
            tgt, out = src[::-1] + [EOS], pred[i].tolist()
            for t in range(2, len(src)):             # every position, for comparison
                all_pairs[_pair_count(src, tgt, t)] += 1
            right = out[:len(tgt)] == tgt
            if len(set(zip(src, src[1:]))) == len(src) - 1:   # no adjacent pair occurs twice
                unique += 1
                unique_right += right
            if right:
                continue
            wrong += 1
            t = next(j for j in range(len(tgt)) if out[j] != tgt[j])
            where[t // 8 * 8] += 1
            if t >= 2:
                pair[_pair_count(src, tgt, t)] += 1
        done += b.batch_size
    print(f"{run}: {wrong} wrong of {done} at L = {length}")
    print("first wrong output index (bucket start: count):", sorted(where.items()))
    print("occurrences in the source of the pair written before the first error (occurrences: count):",
          sorted(pair.items()))
    print("the same over every output position of every example:", sorted(all_pairs.items()))
    print(f"sources with no repeated adjacent pair: {unique} of {done}; right among them: {unique_right}")


def _pair_count(src: list[int], tgt: list[int], t: int) -> int:
    """How often (tgt[t-1], tgt[t-2]) -- adjacent in the source in that order -- occurs in the source."""
    a, b = tgt[t - 1], tgt[t - 2]
    return sum(src[j] == a and src[j + 1] == b for j in range(len(src) - 1))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], *(int(x) for x in sys.argv[2:4]))
