"""Token-classification tasks, expressed for a decoder LM (see ``base`` for the conventions).

Input ``[BOS] x_1 ... x_L`` and ``labels[t]`` = the class token the logits at position t must predict
(−100 where unlabelled; BOS is never labelled). Class labels are ordinary vocabulary ids, so the same
output head and cross-entropy serve every task; evaluation is one teacher-forced forward pass with
``pred = logits.argmax(-1)``. A causal model at position t sees x_1..x_t, which is all every label needs.

* local_count: L tokens = runs of one symbol (``num_symbols`` = 16 symbols ``s*``; consecutive runs use
  different symbols; run lengths uniform on [min_run, max_run] = [2, 48], the last run cut at L). Label of
  x_t = its 0-based index within its run, as class token ``c<k>`` (``num_classes`` = max_run = 48 classes).
  Every position is labelled. Training range L ∈ [64, 128] (docs/method.md §5). Total sequence = L + 1.
* two_back: L symbols uniform over ``num_symbols`` (32); label of x_t = the symbol x_{t−back} (back = 2),
  for t > back (the first ``back`` positions are unlabelled). Total sequence = L + 1; needs L > back.
* flip_flop (Liu et al. 2023, flip-flop language): n = L // 2 pairs ``instruction bit`` with instructions
  ``w`` (write), ``i`` (ignore), ``r`` (read) and bits ``0``/``1``. Instruction 1 is always ``w`` and
  instruction n always ``r`` (so every read is defined and every example has a label); the others are
  ``w`` with probability ``write_prob`` (0.1), ``r`` with ``read_prob`` (0.1) and ``i`` otherwise
  (ignore probability 1 − write_prob − read_prob = 0.8: the reference data FFL(0.8)). Bits after ``w``/``i``
  are uniform; the bit after ``r`` equals the bit of the most recent ``w``. As in the original language
  model task, the label sits on the ``r`` position and is the following bit token (next-token prediction);
  the true bit itself is in the input one position later. Total sequence = 2n + 1; needs L >= 4.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from longsparse.tasks.base import IGNORE_INDEX, Example, Task
from longsparse.tasks.seq2seq import _check_int


@dataclass
class LocalCount(Task):
    num_symbols: int = 16
    min_run: int = 2
    max_run: int = 48
    num_classes: int | None = None  # default: max_run (indices 0 .. max_run-1)

    name = "local_count"
    kind = "tokcls"
    train_lengths = (64, 128)
    length_doc = "L = input symbols, all labelled; total sequence = L + 1"

    def __post_init__(self):
        t = self.name
        _check_int(t, "num_symbols", self.num_symbols, 2)
        _check_int(t, "min_run", self.min_run, 1)
        _check_int(t, "max_run", self.max_run, self.min_run)
        if self.num_classes is None:
            self.num_classes = self.max_run
        _check_int(t, "num_classes (must cover run indices 0..max_run-1)", self.num_classes, self.max_run)
        self._build_vocab([f"s{i}" for i in range(self.num_symbols)], [f"c{k}" for k in range(self.num_classes)])
        self._class0 = 4 + self.num_symbols

    def _sample(self, length: int, rng: random.Random) -> Example:
        x: list[int] = []
        y: list[int] = []
        prev = -1
        c0 = self._class0
        while len(x) < length:
            s = rng.randrange(self.num_symbols - (prev >= 0))
            if prev >= 0 and s >= prev:
                s += 1
            r = min(rng.randint(self.min_run, self.max_run), length - len(x))
            x += [4 + s] * r
            y += range(c0, c0 + r)
            prev = s
        return Example.tokcls(x, y, length)


@dataclass
class TwoBack(Task):
    num_symbols: int = 32
    back: int = 2

    name = "two_back"
    kind = "tokcls"
    length_doc = "L = input symbols; positions t > back labelled; total sequence = L + 1"

    def __post_init__(self):
        _check_int(self.name, "num_symbols", self.num_symbols, 1)
        _check_int(self.name, "back", self.back, 1)
        self._build_vocab([f"s{i}" for i in range(self.num_symbols)])

    def min_length(self) -> int:
        return self.back + 1

    def _sample(self, length: int, rng: random.Random) -> Example:
        x = rng.choices(range(4, 4 + self.num_symbols), k=length)
        return Example.tokcls(x, [IGNORE_INDEX] * self.back + x[: length - self.back], length)


@dataclass
class FlipFlop(Task):
    write_prob: float = 0.1
    read_prob: float = 0.1

    name = "flip_flop"
    kind = "tokcls"
    length_doc = "L = tokens; n = L // 2 (instruction, bit) pairs, total sequence = 2n + 1"

    def __post_init__(self):
        for nm in ("write_prob", "read_prob"):
            v = getattr(self, nm)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0.0 <= v <= 1.0:
                raise ValueError(f"flip_flop: {nm} must be in [0, 1], got {v!r}")
        if self.write_prob + self.read_prob > 1.0 + 1e-12:
            raise ValueError(
                f"flip_flop: write_prob + read_prob must be <= 1 (the rest is ignore), got "
                f"{self.write_prob} + {self.read_prob}"
            )
        self._build_vocab(["w", "i", "r", "0", "1"])
        self.write_id, self.ignore_id, self.read_id, self.bit0_id, self.bit1_id = range(4, 9)

    def min_length(self) -> int:
        return 4

    def _sample(self, length: int, rng: random.Random) -> Example:
        n = length // 2
        w, r = self.write_prob, self.write_prob + self.read_prob
        W, I, R, B0 = self.write_id, self.ignore_id, self.read_id, self.bit0_id  # noqa: E741 (the W/I/R symbols)
        x = [0] * (2 * n)
        y = [IGNORE_INDEX] * (2 * n)
        mem = B0
        for j in range(n):
            if j == 0:
                ins = W
            elif j == n - 1:
                ins = R
            else:
                u = rng.random()
                ins = W if u < w else (R if u < r else I)
            if ins == R:
                bit = mem
                y[2 * j] = bit
            else:
                bit = B0 + rng.getrandbits(1)
                if ins == W:
                    mem = bit
            x[2 * j] = ins
            x[2 * j + 1] = bit
        return Example.tokcls(x, y, length)
