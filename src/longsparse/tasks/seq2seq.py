"""Sequence-to-sequence tasks: ``[BOS] src [SEP] trg [EOS]`` (see ``base`` for the conventions).

Length semantics (L = the ``length`` argument):

* copy / reverse / sort: src = L symbols, uniform over ``num_symbols`` (32); trg = src / reversed / ascending.
  Total sequence = 2L + 3 tokens.
* mqmtar: L = length of the key–value context; src = context (L) + queries (``num_queries``·(1+key_len));
  trg = ``num_queries``·(1+value_len) tokens. Defaults: total = L + 12 + 12 + 3 = L + 27.
* max_retrieval: src = n = L // 2 (item, priority) pairs = 2n tokens (= L for even L); trg = 1 token.
  Total = 2n + 4.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from longsparse.tasks.base import IGNORE_INDEX, Example, Task


def _check_int(task: str, name: str, value, lo: int, hi: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{task}: {name} must be an int {rng}, got {value!r}")


# ---------------------------------------------------------------------------------------------------------
@dataclass
class _SymbolTask(Task):
    """L symbols uniform over ``num_symbols`` tokens ``s0 .. s{n-1}`` (ids 4 ...)."""

    num_symbols: int = 32
    length_doc = "L = number of source symbols; total sequence = 2L + 3"

    def __post_init__(self):
        _check_int(self.name, "num_symbols", self.num_symbols, 1)
        self._build_vocab([f"s{i}" for i in range(self.num_symbols)])
        self._symbols = range(4, 4 + self.num_symbols)

    def _transform(self, src: list[int]) -> list[int]:
        raise NotImplementedError

    def _sample(self, length: int, rng: random.Random) -> Example:
        src = rng.choices(self._symbols, k=length)
        return Example.seq2seq(src, self._transform(src), length)


@dataclass
class Copy(_SymbolTask):
    name = "copy"

    def _transform(self, src):
        return list(src)


@dataclass
class Reverse(_SymbolTask):
    name = "reverse"

    def _transform(self, src):
        return src[::-1]


@dataclass
class Sort(_SymbolTask):
    name = "sort"

    def _transform(self, src):
        return sorted(src)  # token ids are in symbol order, so this is ascending by symbol


# ---------------------------------------------------------------------------------------------------------
@dataclass
class MQMTAR(Task):
    """Multi-query multi-token associative recall (docs/method.md §5).

    Vocabulary: ``alphabet_size`` symbols ``a0..`` then ``<kv>`` (SEP_KV), ``_`` (space) and ``<Q>``.
    A fixed key vocabulary of ``num_keys`` distinct ``key_len``-symbol words and a value vocabulary of
    ``num_values`` distinct ``value_len``-symbol words are drawn from all alphabet^len words by a dedicated
    ``random.Random(f"longsparse:mqmtar-vocab:{vocab_seed}")``, so every split shares them.

    An example of context length L has n = ``num_pairs`` or ⌊pair_density·L / (key_len + value_len + 2)⌋
    pairs (docs/method.md §5: ⌊0.8·L/6⌋) with *distinct* keys (uniform without replacement from the key vocabulary) and
    values (uniform with replacement). Pair i is ``k.. <kv> v..`` at a uniform random offset inside row i of
    width w = L // n, the rest of the row ``_``; the last L − n·w context tokens are ``_``, so the context
    is exactly L tokens. Then ``num_queries`` queries ``<Q> k..`` whose keys are drawn with replacement from
    the n pairs present. Target: ``<Q> v..`` for each query in order (docs/method.md §5: 12 tokens), then EOS.
    """

    alphabet_size: int = 256
    key_len: int = 2
    value_len: int = 2
    num_keys: int = 10_000
    num_values: int = 10_000
    num_queries: int = 4
    pair_density: float = 0.8
    num_pairs: int | None = None
    vocab_seed: int = 0

    name = "mqmtar"
    length_doc = (
        "L = key-value context length; src = L + num_queries*(1+key_len) tokens, "
        "trg = num_queries*(1+value_len); total = L + 3 + both query blocks"
    )

    def __post_init__(self):
        t = self.name
        _check_int(t, "alphabet_size", self.alphabet_size, 1)
        _check_int(t, "key_len", self.key_len, 1)
        _check_int(t, "value_len", self.value_len, 1)
        _check_int(t, "num_keys", self.num_keys, 1, self.alphabet_size**self.key_len)
        _check_int(t, "num_values", self.num_values, 1, self.alphabet_size**self.value_len)
        _check_int(t, "num_queries", self.num_queries, 1)
        _check_int(t, "vocab_seed", self.vocab_seed, 0)
        if self.num_pairs is not None:
            _check_int(t, "num_pairs", self.num_pairs, 1, self.num_keys)
        if not isinstance(self.pair_density, (int, float)) or not 0 < self.pair_density <= 1:
            raise ValueError(f"{t}: pair_density must be in (0, 1], got {self.pair_density!r}")
        self._build_vocab([f"a{i}" for i in range(self.alphabet_size)], ["<kv>", "_", "<Q>"])
        self.kv_id, self.space_id, self.query_id = (self.token_ids[n] for n in ("<kv>", "_", "<Q>"))
        vrng = random.Random(f"longsparse:mqmtar-vocab:{self.vocab_seed}")
        self.keys = self._words(vrng, self.num_keys, self.key_len)
        self.values = self._words(vrng, self.num_values, self.value_len)
        self._min_length = self._find_min_length()

    def _words(self, rng: random.Random, n: int, width: int) -> list[tuple[int, ...]]:
        a = self.alphabet_size
        out = []
        for code in rng.sample(range(a**width), n):
            word = []
            for _ in range(width):
                code, d = divmod(code, a)
                word.append(4 + d)
            out.append(tuple(word))
        return out

    def pairs_for(self, length: int) -> int:
        if self.num_pairs is not None:
            return self.num_pairs
        # round first so that e.g. 0.8 * 30 counts as exactly 24 despite binary floating point
        return int(round(self.pair_density * length, 6) // (self.key_len + self.value_len + 2))

    def check_length(self, length: int) -> None:
        super().check_length(length)
        n = self.pairs_for(length)
        pw = self.key_len + 1 + self.value_len
        if n < 1 or length // n < pw:
            raise ValueError(
                f"mqmtar: context length L={length} is too short: {n} pair(s) need rows of width "
                f">= {pw} (L >= {self.min_length()} with these parameters)"
            )
        if n > self.num_keys:
            raise ValueError(
                f"mqmtar: L={length} asks for {n} pairs with distinct keys but the key "
                f"vocabulary has only num_keys={self.num_keys}"
            )

    def min_length(self) -> int:
        return self._min_length

    def _find_min_length(self) -> int:
        pw = self.key_len + 1 + self.value_len
        if self.num_pairs is not None:
            return self.num_pairs * pw
        # >= 1 pair needs pair_density*L >= key_len+value_len+2; rows are then at least that wide (> pw)
        length = max(pw, int((self.key_len + self.value_len + 2) / self.pair_density) - 2)
        while not (self.pairs_for(length) >= 1 and length // self.pairs_for(length) >= pw):
            length += 1
        return length

    def _context(self, length: int, rng: random.Random) -> tuple[list[int], list[int], list[int]]:
        """The L context tokens, the key indices of its pairs and their value indices."""
        n = self.pairs_for(length)
        w = length // n
        pw = self.key_len + 1 + self.value_len
        sp = self.space_id
        key_idx = rng.sample(range(self.num_keys), n)
        val_idx = rng.choices(range(self.num_values), k=n)
        src: list[int] = []
        for ki, vi in zip(key_idx, val_idx):
            off = rng.randrange(w - pw + 1)
            src += [sp] * off
            src += self.keys[ki]
            src.append(self.kv_id)
            src += self.values[vi]
            src += [sp] * (w - pw - off)
        src += [sp] * (length - n * w)
        return src, key_idx, val_idx

    def _sample(self, length: int, rng: random.Random) -> Example:
        src, key_idx, val_idx = self._context(length, rng)
        trg: list[int] = []
        for q in rng.choices(range(len(key_idx)), k=self.num_queries):
            src.append(self.query_id)
            src += self.keys[key_idx[q]]
            trg.append(self.query_id)
            trg += self.values[val_idx[q]]
        return Example.seq2seq(src, trg, length)


@dataclass
class MQMTARInline(MQMTAR):
    """MQMTAR with each answer written right after its query (the layout of Zoology's MQAR).

    Same context as ``mqmtar``; then ``num_queries`` blocks ``<Q> k.. <kv> v..``, keys drawn with
    replacement from the pairs present. A token-classification task: the value tokens are labelled (the
    logits at ``<kv>`` predict v1, at v1 predict v2, ...), evaluated in one teacher-forced pass; exact match =
    every value token of every query right. Each query block repeats the context's ``k.. <kv>`` pattern, so a
    query is answered by the same lookup as in ``mqmtar`` but with the answer supervised next to it; with
    several queries per sequence this learns in CPU minutes where the grouped layout stays on its plateau.
    """

    name = "mqmtar_inline"
    kind = "tokcls"
    length_doc = (
        "L = key-value context length; then num_queries blocks of 2+key_len+value_len tokens; "
        "total = L + 1 + num_queries*(2+key_len+value_len)"
    )

    def _sample(self, length: int, rng: random.Random) -> Example:
        x, key_idx, val_idx = self._context(length, rng)
        y = [IGNORE_INDEX] * len(x)
        for q in rng.choices(range(len(key_idx)), k=self.num_queries):
            value = self.values[val_idx[q]]
            x += [self.query_id, *self.keys[key_idx[q]], self.kv_id, *value]
            # y[i] is what the logits at x[i] predict: <kv> -> v1, v1 -> v2, ..., nothing after the last value
            y += [IGNORE_INDEX] * (1 + self.key_len) + list(value) + [IGNORE_INDEX]
        return Example.tokcls(x, y, length)


# ---------------------------------------------------------------------------------------------------------
@dataclass
class MaxRetrieval(Task):
    """Max retrieval (after Veličković et al. 2024, "softmax is not enough").

    src = n = L // 2 items, each two tokens ``i<c> p<r>``: an item token (``num_items`` kinds) and a priority
    token (``num_priorities`` ordered levels, ``p0`` lowest). trg = the item token of the unique item with the
    highest priority. Construction (ties impossible): the winning level m is uniform on [1, P−1] (on
    [0, P−1] when n = 1), the winner's position is uniform, every other item's priority is uniform on
    [0, m−1], and all item tokens are uniform (they may repeat). Training uses small sets (the default range
    L ∈ [32, 64], i.e. 16–32 items); tests use larger L.
    """

    num_items: int = 32
    num_priorities: int = 64

    name = "max_retrieval"
    length_doc = "L = source tokens; n = L // 2 (item, priority) pairs, src = 2n tokens; total = 2n + 4"

    def __post_init__(self):
        _check_int(self.name, "num_items", self.num_items, 1)
        _check_int(self.name, "num_priorities", self.num_priorities, 2)
        self._build_vocab([f"i{c}" for c in range(self.num_items)], [f"p{r}" for r in range(self.num_priorities)])
        self._item0 = 4
        self._prio0 = 4 + self.num_items

    def min_length(self) -> int:
        return 2

    def _sample(self, length: int, rng: random.Random) -> Example:
        n = length // 2
        items = rng.choices(range(self._item0, self._item0 + self.num_items), k=n)
        if n == 1:
            prios = [rng.randrange(self.num_priorities)]
        else:
            m = rng.randint(1, self.num_priorities - 1)
            prios = rng.choices(range(m), k=n - 1)
            prios.insert(rng.randrange(n), m)
        src = [0] * (2 * n)
        src[0::2] = items
        src[1::2] = [self._prio0 + p for p in prios]
        best = max(range(n), key=prios.__getitem__)
        return Example.seq2seq(src, [items[best]], length)
