"""Common machinery of the synthetic tasks: token ids, examples, batches, scoring, seeded streams.

Conventions (shared by every task)
----------------------------------
* Token ids ``PAD=0, BOS=1, SEP=2, EOS=3``; each task's own tokens follow from id 4 (see ``task.token_names``).
  One vocabulary covers inputs *and* outputs, so a decoder LM with a single output head fits every task.
* ``labels`` are already shifted (teacher forcing): ``labels[t]`` is the token the logits at position ``t``
  must predict; ``IGNORE_INDEX = -100`` where there is no loss. So ``F.cross_entropy(logits.flatten(0, 1),
  labels.flatten(), ignore_index=-100)`` is the training loss, with no further shifting.
* Two kinds of task:

  - ``"seq2seq"``: ``[BOS] src [SEP] trg [EOS]``. The loss covers the target tokens and EOS only
    (``labels[t] = input_ids[t+1]`` for ``prompt_len-1 <= t <= len-2``). ``prompt_len`` counts the prefix up
    to and including SEP: greedy generation starts from ``input_ids[:prompt_len]`` and produces
    ``target_len`` tokens (``target`` = trg + EOS). Score: exact match of the whole target (EOS included)
    and per-token accuracy over the target.
  - ``"tokcls"`` (token classification): ``[BOS] x_1 ... x_L`` and a label at some positions; no
    generation, one teacher-forced forward pass: ``pred = logits.argmax(-1)`` is compared with ``labels``
    where ``labels != -100``. Score: exact match = every labelled position right, plus per-token accuracy.
    ``prompt_len`` is the full sequence length and ``target`` lists the labelled values in order.

Seeds and splits
----------------
Every draw comes from a Python ``random.Random`` seeded with the string
``"longsparse:<task>:<split>:<seed>"`` (``make_rng``). Python seeds string seeds through SHA-512, so the
stream is the same on every machine and process (no dependence on ``PYTHONHASHSEED``), and different
(split, seed) pairs give unrelated streams. Train / validation / test are therefore disjoint *by seed*:
they never share a random stream. Identical examples can still occur by chance, at the rate at which the
task itself repeats (e.g. 32^-32 for copy at L = 32; non-negligible only for tiny L of low-entropy tasks).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, fields
from typing import ClassVar, Iterator, Sequence

import torch

PAD, BOS, SEP, EOS = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<bos>", "<sep>", "<eos>")
IGNORE_INDEX = -100
SPLITS = ("train", "validation", "test")
TRAIN_LENGTHS = (32, 64)  # docs/method.md §5: L ~ U[32, 64], inclusive, drawn once per batch
TEST_LENGTHS = tuple(64 * 2**i for i in range(11))  # 64, 128, ..., 65536


def make_rng(task: str, seed: int, split: str = "train") -> random.Random:
    """The random stream of (task, split, seed); see the module docstring for why splits are disjoint."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    return random.Random(f"longsparse:{task}:{split}:{seed}")


def sample_length(rng: random.Random, length) -> int:
    """``length`` is an int (returned as is) or an inclusive range ``(lo, hi)`` drawn uniformly."""
    if isinstance(length, int) and not isinstance(length, bool):
        return length
    try:
        lo, hi = length
    except (TypeError, ValueError):
        raise ValueError(f"length must be an int or an inclusive (lo, hi) range, got {length!r}") from None
    if not (isinstance(lo, int) and isinstance(hi, int)) or lo > hi:
        raise ValueError(f"length range must be two ints with lo <= hi, got {length!r}")
    return rng.randint(lo, hi)


@dataclass
class Example:
    """One example as plain lists (cheap even at 65,536 tokens). ``length`` is the task-level L."""

    input_ids: list[int]
    labels: list[int]
    prompt_len: int
    target: list[int]
    length: int

    @classmethod
    def seq2seq(cls, src: list[int], trg: list[int], length: int) -> "Example":
        input_ids = [BOS, *src, SEP, *trg, EOS]
        prompt_len = len(src) + 2
        target = [*trg, EOS]
        labels = [IGNORE_INDEX] * (prompt_len - 1) + target + [IGNORE_INDEX]
        return cls(input_ids, labels, prompt_len, target, length)

    @classmethod
    def tokcls(cls, x: list[int], y: list[int], length: int) -> "Example":
        """``y[i]`` is the label of position ``i + 1`` (after BOS), ``IGNORE_INDEX`` where unlabelled."""
        assert len(x) == len(y)
        return cls([BOS, *x], [IGNORE_INDEX, *y], len(x) + 1, [v for v in y if v != IGNORE_INDEX], length)


@dataclass
class Batch:
    """Right-padded tensors of a batch. ``attention_mask`` is True on real (non-PAD) tokens."""

    input_ids: torch.Tensor  # (B, T) long, PAD-padded
    labels: torch.Tensor  # (B, T) long, IGNORE_INDEX where no loss
    attention_mask: torch.Tensor  # (B, T) bool
    prompt_len: torch.Tensor  # (B,) long
    target: torch.Tensor  # (B, W) long, PAD-padded
    target_len: torch.Tensor  # (B,) long
    length: torch.Tensor  # (B,) long, the task-level L of each example
    kind: str

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device) -> "Batch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in moved.items():
            if isinstance(v, torch.Tensor):
                moved[k] = v.to(device)
        return Batch(**moved)

    def prompts(self) -> list[torch.Tensor]:
        """Per-example generation prompts ``input_ids[b, :prompt_len[b]]`` (seq2seq: ends with SEP)."""
        return [self.input_ids[b, : int(n)] for b, n in enumerate(self.prompt_len)]

    def prompt_ids(self) -> torch.Tensor:
        """The prompts as one (B, P) tensor; requires equal prompt lengths (true for a fixed-length batch)."""
        p = self.prompt_len
        if p.numel() and not bool((p == p[0]).all()):
            raise ValueError("prompt lengths differ within the batch; use Batch.prompts()")
        return self.input_ids[:, : int(p[0])] if p.numel() else self.input_ids[:, :0]

    @property
    def max_new_tokens(self) -> int:
        return int(self.target_len.max()) if self.target_len.numel() else 0


def collate(examples: Sequence[Example], kind: str) -> Batch:
    if not examples:
        raise ValueError("cannot collate an empty list of examples")
    t = max(len(e.input_ids) for e in examples)
    w = max(len(e.target) for e in examples)
    ids = [e.input_ids + [PAD] * (t - len(e.input_ids)) for e in examples]
    lab = [e.labels + [IGNORE_INDEX] * (t - len(e.labels)) for e in examples]
    trg = [e.target + [PAD] * (w - len(e.target)) for e in examples]
    seq_len = torch.tensor([len(e.input_ids) for e in examples])
    return Batch(
        input_ids=torch.tensor(ids, dtype=torch.long),
        labels=torch.tensor(lab, dtype=torch.long),
        attention_mask=torch.arange(t)[None, :] < seq_len[:, None],
        prompt_len=torch.tensor([e.prompt_len for e in examples], dtype=torch.long),
        target=torch.tensor(trg, dtype=torch.long).reshape(len(examples), w),
        target_len=torch.tensor([len(e.target) for e in examples], dtype=torch.long),
        length=torch.tensor([e.length for e in examples], dtype=torch.long),
        kind=kind,
    )


@dataclass
class Score:
    """Counts, so scores of several batches add up (``sum(scores, Score())``)."""

    n_examples: int = 0
    n_exact: int = 0
    n_tokens: int = 0
    n_correct_tokens: int = 0
    correct: torch.Tensor | None = field(default=None, repr=False)  # (B,) bool, per-example exact match

    @property
    def exact_match(self) -> float:
        return self.n_exact / self.n_examples if self.n_examples else float("nan")

    @property
    def token_accuracy(self) -> float:
        return self.n_correct_tokens / self.n_tokens if self.n_tokens else float("nan")

    def __add__(self, other: "Score") -> "Score":
        c = None
        if self.correct is not None and other.correct is not None:
            c = torch.cat([self.correct, other.correct])
        elif self.n_examples == 0:
            c = other.correct
        return Score(
            self.n_examples + other.n_examples,
            self.n_exact + other.n_exact,
            self.n_tokens + other.n_tokens,
            self.n_correct_tokens + other.n_correct_tokens,
            c,
        )

    __radd__ = __add__

    def as_dict(self) -> dict:
        return {
            "exact_match": self.exact_match,
            "token_accuracy": self.token_accuracy,
            "n_examples": self.n_examples,
            "n_tokens": self.n_tokens,
        }


def _score_masked(eq: torch.Tensor, mask: torch.Tensor) -> Score:
    eq = eq & mask
    ok = eq.sum(1) == mask.sum(1)
    return Score(int(ok.numel()), int(ok.sum()), int(mask.sum()), int(eq.sum()), ok.cpu())


def score_generated(pred: torch.Tensor, batch: Batch) -> Score:
    """Seq2seq: ``pred`` (B, K) = tokens generated after the prompt; compared with ``target`` (incl. EOS).
    Missing positions (K < target_len) count as wrong; tokens past ``target_len`` are ignored."""
    pred = torch.as_tensor(pred).to(batch.target.device).long()
    if pred.dim() != 2 or pred.shape[0] != batch.batch_size:
        raise ValueError(f"pred must have shape (B={batch.batch_size}, K), got {tuple(pred.shape)}")
    w = batch.target.shape[1]
    if pred.shape[1] < w:
        pred = torch.cat([pred, pred.new_full((pred.shape[0], w - pred.shape[1]), -1)], 1)
    mask = torch.arange(w, device=pred.device)[None, :] < batch.target_len[:, None]
    return _score_masked(pred[:, :w] == batch.target, mask)


def score_positions(pred: torch.Tensor, batch: Batch) -> Score:
    """Per-position predictions ``pred`` (B, T) (or logits (B, T, V)) against ``labels`` where labelled.
    The score of a token-classification task; for seq2seq it is teacher-forced accuracy (not the metric)."""
    pred = torch.as_tensor(pred).to(batch.labels.device)
    if pred.dim() == 3:
        pred = pred.argmax(-1)
    if tuple(pred.shape) != tuple(batch.labels.shape):
        raise ValueError(f"pred must have shape {tuple(batch.labels.shape)}, got {tuple(pred.shape)}")
    return _score_masked(pred.long() == batch.labels, batch.labels != IGNORE_INDEX)


class Task:
    """Base class. Subclasses are dataclasses whose fields are the task parameters; they set ``name``,
    ``kind``, build ``token_names`` in ``__post_init__`` and implement ``min_length`` and ``_sample``."""

    name: ClassVar[str] = "task"
    kind: ClassVar[str] = "seq2seq"
    objective: ClassVar[str] = "exact_match"  # what the trainer validates (longsparse.train.objectives)
    train_lengths: ClassVar[tuple[int, int]] = TRAIN_LENGTHS
    length_doc: ClassVar[str] = ""
    token_names: list[str]

    # ---- vocabulary -------------------------------------------------------------------------------------
    def _build_vocab(self, *groups: Sequence[str]) -> None:
        names = list(SPECIAL_TOKENS)
        for g in groups:
            names.extend(g)
        if len(set(names)) != len(names):
            raise AssertionError("duplicate token names")
        self.token_names = names
        self.token_ids = {n: i for i, n in enumerate(names)}

    @property
    def vocab_size(self) -> int:
        return len(self.token_names)

    def decode(self, ids) -> list[str]:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return [self.token_names[i] if 0 <= i < len(self.token_names) else f"<{i}?>" for i in ids]

    def params(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    # ---- sampling ---------------------------------------------------------------------------------------
    def min_length(self) -> int:
        return 1

    def _sample(self, length: int, rng: random.Random) -> Example:
        raise NotImplementedError

    def check_length(self, length: int) -> None:
        if not isinstance(length, int) or isinstance(length, bool):
            raise ValueError(f"{self.name}: length must be an int, got {length!r}")
        if length < self.min_length():
            raise ValueError(
                f"{self.name}: length {length} is too short; the minimum is {self.min_length()} ({self.length_doc})"
            )

    def sample(self, length: int, rng: random.Random) -> Example:
        """One example of task-level length ``length`` drawn from ``rng`` (a ``random.Random``)."""
        self.check_length(length)
        return self._sample(length, rng)

    def rng(self, seed: int = 0, split: str = "train") -> random.Random:
        return make_rng(self.name, seed, split)

    def batch(
        self, length, batch_size: int = 64, *, seed: int = 0, split: str = "train", rng: random.Random | None = None
    ) -> Batch:
        """One batch. ``length``: an int, or an inclusive ``(lo, hi)`` range drawn once for the batch.
        Uses ``rng`` if given (to continue a stream), else a fresh ``make_rng(name, seed, split)``."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        rng = rng if rng is not None else self.rng(seed, split)
        n = sample_length(rng, length)
        self.check_length(n)
        return collate([self._sample(n, rng) for _ in range(batch_size)], self.kind)

    def batches(
        self, length=None, batch_size: int = 64, *, seed: int = 0, split: str = "train", num_batches: int | None = None
    ) -> Iterator[Batch]:
        """A stream of batches (infinite unless ``num_batches``) from one seeded random stream.
        ``length`` defaults to the task's training range (``train_lengths``), drawn per batch."""
        length = self.train_lengths if length is None else length
        rng = self.rng(seed, split)
        i = 0
        while num_batches is None or i < num_batches:
            yield self.batch(length, batch_size, rng=rng)
            i += 1

    def examples(self, length: int, n: int, *, seed: int = 0, split: str = "test") -> Iterator[Example]:
        """``n`` single examples from one seeded stream (for very long test lengths, one at a time)."""
        rng = self.rng(seed, split)
        for _ in range(n):
            yield self.sample(length, rng)

    def collate(self, examples: Sequence[Example]) -> Batch:
        return collate(examples, self.kind)

    # ---- scoring ----------------------------------------------------------------------------------------
    def score(self, pred: torch.Tensor, batch: Batch) -> Score:
        """seq2seq: ``pred`` = generated tokens (B, K) after the prompt; tokcls: per-position ``pred``
        (B, T) or logits (B, T, V). Returns counts with ``exact_match`` and ``token_accuracy``."""
        if self.kind == "seq2seq":
            return score_generated(pred, batch)
        return score_positions(pred, batch)

    # ---- display ----------------------------------------------------------------------------------------
    def describe(self, example: Example, max_tokens: int | None = None) -> str:
        """Readable text of an example. seq2seq: ``src: ...`` / ``trg: ...``;
        tokcls: ``x: ...`` / ``y: ...`` with ``.`` at unlabelled positions."""

        def cut(tokens: list[str]) -> str:
            if max_tokens is not None and len(tokens) > max_tokens:
                tokens = tokens[:max_tokens] + [f"... (+{len(tokens) - max_tokens})"]
            return " ".join(tokens)

        ids = example.input_ids
        if self.kind == "seq2seq":
            p = example.prompt_len
            return f"src: {cut(self.decode(ids[1 : p - 1]))}\ntrg: {cut(self.decode(ids[p:-1]))}"
        y = ["." if v == IGNORE_INDEX else self.token_names[v] for v in example.labels[1:]]
        return f"x: {cut(self.decode(ids[1:]))}\ny: {cut(y)}"
