"""Greedy-decoding cost of a trained seq2seq run, in one process (docs/results.md, section 6).

1. Decoding steps at ~4,100 cached tokens (batch 3, a random 4,098-token prompt), with the KV cache as it is
   and with a cache that concatenates every step (the code before session 9), interleaved.
2. Scoring 20 test examples at L = 2,048 in batches of 7 (the old 32,768-token budget) and of 20 (the
   131,072-token one): seconds and correct tokens of each.
usage: python results/synthetic_trials/scripts/decode_speed.py RUN     (last checkpoint; one thread)
"""
import sys
import time

import torch

from longsparse.evaluate.core import score_length
from longsparse.evaluate.sweep import load_run_model
from longsparse.nn import LayerCache
from longsparse.train.config import make_task


def concatenating_append(self, k, v):
    """The pre-session-9 LayerCache.append: a new tensor every step."""
    if self._k is not None:
        k, v = torch.cat((self.k, k), dim=2), torch.cat((self.v, v), dim=2)
    self._k, self._v, self.n = k, v, k.shape[2]
    return k, v


def decode_ms(model, steps: int = 200) -> float:
    ids = torch.randint(4, 36, (3, 4098), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = model.new_cache()
        model(ids, cache=cache, logits_for="last")
        nxt = torch.full((3, 1), 5)
        t0 = time.perf_counter()
        for _ in range(steps):
            model(nxt, cache=cache, logits_for="last")
    return (time.perf_counter() - t0) / steps * 1000


def main(run: str) -> None:
    torch.set_num_threads(1)
    model, cfg, _ = load_run_model(run, "last")
    model.eval()
    buffered = LayerCache.append
    for rep in range(2):
        LayerCache.append = concatenating_append
        cat = decode_ms(model)
        LayerCache.append = buffered
        buf = decode_ms(model)
        print(f"decode step, batch 3, ~4,100 cached tokens (round {rep + 1}): concatenating {cat:.1f} ms, "
              f"buffered {buf:.1f} ms, ratio {buf / cat:.2f}")
    task = make_task(cfg["task"])
    for bs in (7, 20):
        r = score_length(model, task, 2048, 20, batch_size=bs)
        print(f"L = 2048, 20 examples, batch {bs}: {r['seconds']:.1f} s, exact {r['n_exact']}, "
              f"correct tokens {r['n_correct_tokens']} of {r['n_tokens']}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
