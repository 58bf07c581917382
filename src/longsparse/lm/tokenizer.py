"""Tokenizers for the LM study, trained offline and saved next to the data.

* ``ByteTokenizer`` (no dependency): ids 0–255 are the UTF-8 bytes, then the specials ``<|endoftext|>`` (256,
  separates documents) and ``<pad>`` (257). Lossless on any text.
* ``BPETokenizer``: Hugging Face ``tokenizers`` byte-level BPE (the ``lm`` extra: ``pip install
  longsparse[lm]``), trained on the training split only, vocabulary ``vocab_size`` (default 2048) including the
  256 byte symbols and the same two specials. Byte-level, so also lossless. Training is deterministic for a
  given text and vocabulary size (tested).

``train_tokenizer(kind, texts, vocab_size)``, ``tok.save(path)`` and ``load_tokenizer(path)``; ``kind`` is
``"bpe"`` or ``"bytes"``. Both write one JSON file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, List, Sequence

from longsparse.io import atomic_write_text, read_json

EOT = "<|endoftext|>"
PAD = "<pad>"
KINDS = ("bpe", "bytes")
# The smallest BPE vocabulary accepted: the 256 byte symbols, the two specials and room for merges.
MIN_BPE_VOCAB = 260


class ByteTokenizer:
    kind = "bytes"

    def __init__(self):
        self.eot_id, self.pad_id = 256, 257

    @property
    def vocab_size(self) -> int:
        return 258

    def encode(self, text: str) -> List[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        out, buf = [], bytearray()
        for i in ids:
            if i < 256:
                buf.append(i)
            else:
                out.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
                out.append(EOT if i == self.eot_id else PAD if i == self.pad_id else f"<{i}?>")
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def save(self, path) -> None:
        atomic_write_text(path, json.dumps({"longsparse_tokenizer": "bytes", "specials": [EOT, PAD]}) + "\n")


class BPETokenizer:
    kind = "bpe"

    def __init__(self, tok):
        self.tok = tok
        self.eot_id, self.pad_id = tok.token_to_id(EOT), tok.token_to_id(PAD)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, text: str) -> List[int]:
        return self.tok.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, path) -> None:
        atomic_write_text(path, self.tok.to_str(pretty=True))

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 2048) -> "BPETokenizer":
        try:
            from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        except ImportError as e:  # pragma: no cover
            raise ImportError(
                "the BPE tokenizer needs the `tokenizers` package (pip install longsparse[lm]); "
                "use --tokenizer bytes for the dependency-free byte-level one"
            ) from e
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=2,
            special_tokens=[EOT, PAD],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(list(texts), trainer=trainer)
        return cls(tok)


def train_tokenizer(kind: str, texts: Iterable[str], vocab_size: int = 2048):
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "bpe":
        return BPETokenizer.train(texts, vocab_size)
    raise ValueError(f"unknown tokenizer kind {kind!r}; choose one of {KINDS}")


def load_tokenizer(path):
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no tokenizer at {path}")
    d = read_json(path)
    if d.get("longsparse_tokenizer") == "bytes":
        return ByteTokenizer()
    from tokenizers import Tokenizer

    return BPETokenizer(Tokenizer.from_file(str(path)))
