"""RULER-style retrieval tasks for the hierarchical sparse attention study (docs/method.md §8): ``passkey`` (single
needle), ``multi_query_needle`` (several key→value needles, several queried) and ``variable_tracking``
(multi-hop assignment chains). Sequence-to-sequence in the usual layout ``[BOS] src [SEP] trg [EOS]``;
exact match of every answer token (+ EOS).

Vocabulary (after the 4 specials): markers ``<needle> <is> <query> <var> <eq>``, then ``num_values`` value
tokens ``v0..`` (the passkey "digits"), ``num_keys`` key tokens ``k0..`` (needle keys / variable names),
``num_filler`` filler tokens ``f0..``. Filler is uniform over its own tokens, disjoint from every needle
token, so it carries no information about the answer; the needle is at least ``min_distance`` tokens
before the query, so a sliding window shorter than that cannot see it.

Length semantics: L = len(src) = filler + needle statements + query. A needle's *offset* is the number of
filler tokens before it; offsets range over [0, F − min_distance] (F = number of filler tokens), so the
last needle ends at least ``min_distance`` tokens before the query. ``depth`` (0 … 1) fixes the offset of
the queried needle (of the first statement of the queried chain) at round(depth·(F − min_distance));
None draws it uniformly.

* passkey:            ``<needle> v v v v`` … ``<query>``  →  ``v v v v``   (value_len tokens)
* multi_query_needle: ``num_needles`` × ``<needle> key <is> value`` (distinct keys) … then
                      ``num_queries`` × ``<query> key`` (distinct, drawn from the needles) → their values
                      in query order. With a fixed depth the queried needles sit together at that depth.
* variable_tracking:  ``num_chains`` chains of ``num_hops`` statements: ``<var> X1 <eq> value``,
                      ``<var> X2 <eq> X1``, … (in this order, at increasing offsets; chains interleave);
                      query ``<query> X_last`` of chain 0 → its value. Variable names are distinct
                      ``key_len``-token words.

``task.needle_positions(batch)`` finds (by parsing, no stored state) per row the positions of the tokens
the answer must be retrieved from: the passkey value, the queried values, or every token of the queried
chain's statements — the input of ``longsparse.hsa.needle_diagnostics``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar, List, Optional

from longsparse.tasks.base import Example, Task

MARKERS = ("<needle>", "<is>", "<query>", "<var>", "<eq>")


def _check_int(task: str, name: str, value, lo: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ValueError(f"{task}: {name} must be an int >= {lo}, got {value!r}")


@dataclass
class _RulerTask(Task):
    num_values: int = 10
    num_keys: int = 32
    num_filler: int = 64
    value_len: int = 4
    key_len: int = 1
    depth: Optional[float] = None
    min_distance: int = 32

    kind: ClassVar[str] = "seq2seq"
    train_lengths: ClassVar[tuple[int, int]] = (128, 256)
    length_doc: ClassVar[str] = "L = len(src) = filler + needle statements + query"

    def __post_init__(self):
        for name, lo in (
            ("num_values", 1),
            ("num_keys", 1),
            ("num_filler", 1),
            ("value_len", 1),
            ("key_len", 1),
            ("min_distance", 0),
        ):
            _check_int(self.name, name, getattr(self, name), lo)
        if self.depth is not None and not (isinstance(self.depth, (int, float)) and 0 <= self.depth <= 1):
            raise ValueError(f"{self.name}: depth must be None or a number in [0, 1], got {self.depth!r}")
        self._check_params()
        self._build_vocab(
            MARKERS,
            [f"v{i}" for i in range(self.num_values)],
            [f"k{i}" for i in range(self.num_keys)],
            [f"f{i}" for i in range(self.num_filler)],
        )
        t = self.token_ids
        self.NEEDLE, self.IS, self.QUERY, self.VAR, self.EQ = (t[m] for m in MARKERS)
        self.values = range(t["v0"], t["v0"] + self.num_values)
        self.keys = range(t["k0"], t["k0"] + self.num_keys)
        self.filler = range(t["f0"], t["f0"] + self.num_filler)

    def _check_params(self) -> None:
        pass

    # -- helpers ----------------------------------------------------------------------------------------
    def _words(self, rng: random.Random, n: int) -> List[List[int]]:
        """n distinct key words of key_len tokens."""
        if n > self.num_keys**self.key_len:
            raise ValueError(f"{self.name}: needs {n} distinct keys but only {self.num_keys}^{self.key_len} exist")
        seen, out = set(), []
        while len(out) < n:
            w = tuple(rng.choices(self.keys, k=self.key_len))
            if w not in seen:
                seen.add(w)
                out.append(list(w))
        return out

    def _value(self, rng: random.Random) -> List[int]:
        return rng.choices(self.values, k=self.value_len)

    def _offset(self, rng: random.Random, max_off: int) -> int:
        return round(self.depth * max_off) if self.depth is not None else rng.randint(0, max_off)

    def _layout(self, length: int, rng: random.Random, statements, query: List[int]) -> List[int]:
        """statements: list of (offset or None, token list), placed in list order among equal offsets."""
        n_stmt = sum(len(s) for _, s in statements)
        F = length - n_stmt - len(query)
        max_off = F - self.min_distance
        assert max_off >= 0
        placed = [
            (rng.randint(0, max_off) if off is None else off(max_off), i, s) for i, (off, s) in enumerate(statements)
        ]
        placed.sort(key=lambda x: (x[0], x[1]))
        src, used = [], 0
        for off, _, s in placed:
            src.extend(rng.choices(self.filler, k=off - used))
            used = off
            src.extend(s)
        src.extend(rng.choices(self.filler, k=F - used))
        src.extend(query)
        assert len(src) == length
        return src

    def needle_positions(self, batch) -> List[List[int]]:
        out = []
        for b in range(batch.batch_size):
            p = int(batch.prompt_len[b])
            out.append(self._needle_positions(batch.input_ids[b, :p].tolist()))
        return out

    def _needle_positions(self, ids: List[int]) -> List[int]:
        raise NotImplementedError


@dataclass
class Passkey(_RulerTask):
    """Single needle (RULER passkey / S-NIAH)."""

    name: ClassVar[str] = "passkey"

    def min_length(self) -> int:
        return 1 + self.value_len + 1 + self.min_distance

    def _sample(self, length: int, rng: random.Random) -> Example:
        value = self._value(rng)
        src = self._layout(length, rng, [(lambda m: self._offset(rng, m), [self.NEEDLE, *value])], [self.QUERY])
        return Example.seq2seq(src, value, length)

    def _needle_positions(self, ids):
        i = ids.index(self.NEEDLE)
        return list(range(i + 1, i + 1 + self.value_len))


@dataclass
class MultiQueryNeedle(_RulerTask):
    """Several key→value needles, several of them queried (RULER MQ-NIAH / MK-NIAH)."""

    num_needles: int = 4
    num_queries: int = 2
    name: ClassVar[str] = "multi_query_needle"

    def _check_params(self):
        _check_int(self.name, "num_needles", self.num_needles, 1)
        _check_int(self.name, "num_queries", self.num_queries, 1)
        if self.num_queries > self.num_needles:
            raise ValueError(f"{self.name}: num_queries ({self.num_queries}) > num_needles ({self.num_needles})")
        if self.num_needles > self.num_keys**self.key_len:
            raise ValueError(f"{self.name}: num_needles exceeds the {self.num_keys}^{self.key_len} distinct keys")

    def min_length(self) -> int:
        return (
            self.num_needles * (2 + self.key_len + self.value_len)
            + self.num_queries * (1 + self.key_len)
            + self.min_distance
        )

    def _sample(self, length: int, rng: random.Random) -> Example:
        keys = self._words(rng, self.num_needles)
        values = [self._value(rng) for _ in keys]
        queried = rng.sample(range(self.num_needles), self.num_queries)
        stmts = []
        shared = {}

        def at_depth(m):
            if "o" not in shared:
                shared["o"] = self._offset(rng, m)
            return shared["o"]

        for i in range(self.num_needles):
            off = at_depth if (self.depth is not None and i in queried) else None
            stmts.append((off, [self.NEEDLE, *keys[i], self.IS, *values[i]]))
        # queried needles at a fixed depth keep query order
        if self.depth is not None:
            stmts = [stmts[i] for i in queried] + [s for i, s in enumerate(stmts) if i not in queried]
        query = [t for i in queried for t in (self.QUERY, *keys[i])]
        src = self._layout(length, rng, stmts, query)
        return Example.seq2seq(src, [t for i in queried for t in values[i]], length)

    def _needle_positions(self, ids):
        q = ids.index(self.QUERY)
        kl = self.key_len
        qkeys = [tuple(ids[i + 1 : i + 1 + kl]) for i in range(q, len(ids)) if ids[i] == self.QUERY]
        out = []
        for key in qkeys:
            for i in range(q):
                if ids[i] == self.NEEDLE and tuple(ids[i + 1 : i + 1 + kl]) == key:
                    s = i + 2 + kl
                    out.extend(range(s, s + self.value_len))
        return out


@dataclass
class VariableTracking(_RulerTask):
    """Multi-hop variable tracking (RULER VT): X1 = value, X2 = X1, …; query the last variable.

    With ``num_chains = 1`` the answer's tokens are the only value tokens in the sequence, so a model can answer without
    tracking anything (a passkey); the presets use 2 chains."""

    num_hops: int = 2
    num_chains: int = 1
    name: ClassVar[str] = "variable_tracking"

    def _check_params(self):
        _check_int(self.name, "num_hops", self.num_hops, 1)
        _check_int(self.name, "num_chains", self.num_chains, 1)
        if self.num_hops * self.num_chains > self.num_keys**self.key_len:
            raise ValueError(f"{self.name}: num_hops·num_chains exceeds the {self.num_keys}^{self.key_len} names")

    def min_length(self) -> int:
        first = 3 + self.key_len + self.value_len
        hop = 3 + 2 * self.key_len
        return self.num_chains * (first + (self.num_hops - 1) * hop) + 1 + self.key_len + self.min_distance

    def _sample(self, length: int, rng: random.Random) -> Example:
        names = self._words(rng, self.num_hops * self.num_chains)
        n_stmt = self.num_chains * (3 + self.key_len + self.value_len + (self.num_hops - 1) * (3 + 2 * self.key_len))
        max_off = length - n_stmt - 1 - self.key_len - self.min_distance
        stmts = []
        answer = None
        for c in range(self.num_chains):
            var = names[c * self.num_hops : (c + 1) * self.num_hops]
            value = self._value(rng)
            if c == 0:
                answer = value
                first = self._offset(rng, max_off)
            else:
                first = rng.randint(0, max_off)
            offs = [first] + sorted(rng.randint(first, max_off) for _ in range(self.num_hops - 1))
            stmts.append((offs[0], [self.VAR, *var[0], self.EQ, *value]))
            for h in range(1, self.num_hops):
                stmts.append((offs[h], [self.VAR, *var[h], self.EQ, *var[h - 1]]))
        # _layout sorts by (offset, list index): a chain's statements keep their order at equal offsets
        stmts = [(lambda m, o=o: o, s) for o, s in stmts]
        query = [self.QUERY, *names[self.num_hops - 1]]
        src = self._layout(length, rng, stmts, query)
        return Example.seq2seq(src, answer, length)

    def _needle_positions(self, ids):
        kl = self.key_len
        q = ids.index(self.QUERY)
        target = tuple(ids[q + 1 : q + 1 + kl])
        out = []
        for _ in range(self.num_hops + 1):
            for i in range(q):
                if ids[i] == self.VAR and tuple(ids[i + 1 : i + 1 + kl]) == target:
                    s = i + 2 + kl
                    rhs_is_value = ids[s] in self.values
                    n = self.value_len if rhs_is_value else kl
                    out.extend(range(i, s + n))
                    if rhs_is_value:
                        return sorted(out)
                    target = tuple(ids[s : s + kl])
                    break
        return sorted(out)
