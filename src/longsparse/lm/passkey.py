"""Passkey (needle-in-a-haystack) retrieval in real text.

An example of total length ``N`` tokens is ``haystack[:k] + NEEDLE + haystack[k:] + QUERY + answer`` where the
haystack is a contiguous window of the (held-out, for evaluation) token stream, ``NEEDLE`` is
``"\\nThe pass key is " d1 … dn ".\\n"``, ``QUERY`` is ``"\\nWhat is the pass key? The pass key is "`` and the
answer is the same ``n_digits`` digits (one token per digit, each digit encoded on its own). ``depth`` (0…1)
places the needle at ``k = round(depth · len(haystack))`` (0 = first token, 1 = right before the query).

Scoring: the answer is read by teacher forcing — the argmax of the logits at the ``n_digits`` positions
before each answer digit. All digits right ⇔ greedy decoding after ``QUERY`` produces the passkey exactly
(greedy decoding of step i conditions on the earlier digits, which are then the right ones), so exact match
under teacher forcing equals greedy exact match, in one forward pass.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import List, Sequence

NEEDLE_PREFIX = "\nThe pass key is "
NEEDLE_SUFFIX = ".\n"
QUERY = "\nWhat is the pass key? The pass key is "


@dataclass
class PasskeyExample:
    ids: List[int]  # length N (prompt + answer digits)
    answer: List[int]  # the digit token ids
    passkey: str  # the digits as text
    needle_start: int  # index of the first needle token in ids
    answer_start: int  # index of the first answer digit in ids (= N − n_digits)
    depth: float


class PasskeyMaker:
    def __init__(self, tokenizer, n_digits: int = 5):
        self.tok, self.n_digits = tokenizer, n_digits
        self.digit_ids = []
        for d in "0123456789":
            ids = tokenizer.encode(d)
            if len(ids) != 1:
                raise ValueError(f"digit {d!r} is not a single token ({ids}); passkeys need single-digit tokens")
            self.digit_ids.append(ids[0])
        self.pre, self.suf, self.query = (tokenizer.encode(s) for s in (NEEDLE_PREFIX, NEEDLE_SUFFIX, QUERY))

    def overhead(self) -> int:
        return len(self.pre) + len(self.suf) + len(self.query) + 2 * self.n_digits

    def min_length(self) -> int:
        return self.overhead() + 1

    def make(self, stream: Sequence[int], length: int, depth: float, rng: random.Random) -> PasskeyExample:
        """One example of ``length`` tokens; haystack from ``stream`` (a token sequence) at a random offset."""
        if not 0 <= depth <= 1:
            raise ValueError(f"depth must be in [0, 1], got {depth}")
        n_hay = length - self.overhead()
        if n_hay < 1:
            raise ValueError(f"length {length} too short for a passkey example (minimum {self.min_length()})")
        if len(stream) < n_hay:
            raise ValueError(f"haystack stream of {len(stream)} tokens is shorter than {n_hay}")
        off = rng.randint(0, len(stream) - n_hay)
        hay = list(stream[off : off + n_hay])
        key = "".join(rng.choice("0123456789") for _ in range(self.n_digits))
        digits = [self.digit_ids[int(c)] for c in key]
        k = round(depth * n_hay)
        ids = hay[:k] + self.pre + digits + self.suf + hay[k:] + self.query + digits
        assert len(ids) == length
        return PasskeyExample(ids, digits, key, k, length - self.n_digits, depth)


def reference_solve(tokenizer, ids: Sequence[int], n_digits: int = 5) -> str:
    """An independent oracle: decode the prompt (everything before the answer) to text and read the passkey
    with a regular expression on the needle sentence. Returns the digits as text."""
    text = tokenizer.decode(list(ids[: len(ids) - n_digits]))
    m = re.findall(r"\nThe pass key is (\d+)\.\n", text)
    if len(m) != 1:
        raise ValueError(f"expected exactly one needle in the text, found {len(m)}")
    return m[0]
