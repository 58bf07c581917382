"""Exact, memory-bounded evaluation of an HSAModel at extreme lengths (docs/method.md §8).

Why it is exact. Every lower layer is a sliding-window layer (window W), so the mid-depth state at
position p depends only on tokens p − n_lower·(W−1) … p: a span [a, b) of mid states is computed
exactly by running the lower stack on [a − n_lower·(W−1), b) (absolute positions kept for RoPE). The
memory of chunk c needs the mid states of [cS, (c+1)S) only. The upper stack adds at most
R = n_upper·(W−1) positions of receptive field per output through its local paths (per-chunk retrieval:
n_upper·max(W−1, 2S−1), because the shared query of chunk j reads the layer inputs of chunk j−1);
retrieval itself reaches arbitrarily far back, but only through the chunk memory, which is recomputed
exactly on demand. So the outputs at positions P need

  1. landmarks of every complete chunk (computed once, in segments of ``segment_len`` tokens, so memory
     stays O(segment_len + N/S·d));
  2. the mid states of [min P − R, max P] (the upper layers run only there);
  3. the token states of the chunks those positions select (recomputed per selected chunk run and
     cached up to ``max_cached_chunks``).

``HSAFastEvaluator(model, ids).logits(positions)`` equals ``model(ids)[:, positions]`` up to floating-
point reassociation (tests check it). ``extend`` appends tokens and ``last_logits`` gives the next token's
logits: the ``Decoding`` of ``HSAModel.generate`` (``longsparse.nn.generation``).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch
from torch import Tensor, nn

from longsparse.hsa.ops import ChunkMemory


class _LazyMemory(ChunkMemory):
    """All landmarks; token states recomputed (and cached) by the evaluator for the chunks asked for."""

    def __init__(self, landmarks: Tensor, ev: "HSAFastEvaluator"):
        super().__init__(landmarks, None)
        self.ev = ev

    def chunk_tokens(self, chunk_ids: Tensor) -> Tensor:
        return self.ev.chunk_tokens(chunk_ids.tolist())


class HSAFastEvaluator:
    """The long-context evaluator of an ``HSAModel`` (``model``; typed as a module so that this file, which the
    model's `cached_decoding` runs, never imports the model's) on ``input_ids`` (B, N)."""

    def __init__(
        self, model: nn.Module, input_ids: Tensor, *, segment_len: Optional[int] = None, max_cached_chunks: int = 4096
    ):
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must have shape (B, N) with N >= 1, got {tuple(input_ids.shape)}")
        self.model, self.cfg = model, model.cfg
        S = self.cfg.chunk_size
        self.segment_len = max(S, ((segment_len or 4096) // S) * S)
        self.max_cached_chunks = max_cached_chunks
        self.ids = input_ids
        d = self.cfg.d_model
        p = next(model.parameters())
        self.landmarks = torch.zeros(input_ids.shape[0], 0, d, dtype=p.dtype, device=p.device)
        self._cache: Dict[int, Tensor] = {}
        self._update_landmarks()

    @property
    def length(self) -> int:
        return self.ids.shape[1]

    # -- spans ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def lower_span(self, a: int, b: int) -> Tensor:
        """Exact mid-depth states of positions [a, b)."""
        lo = max(0, a - self.cfg.n_lower * (self.cfg.window - 1))
        return self.model.run_lower(self.ids[:, lo:b], lo)[:, a - lo :]

    @torch.no_grad()
    def _update_landmarks(self) -> None:
        S = self.cfg.chunk_size
        have, total = self.landmarks.shape[1], self.length // S
        if self.cfg.retrieval == "none":  # sliding-window-only baseline: no chunk memory
            return
        parts = [self.landmarks]
        a = have * S
        while a < total * S:
            b = min(a + self.segment_len, total * S)
            land, tok = self.model.encode_chunks(self.lower_span(a, b))
            parts.append(land)
            for i in range(tok.shape[1]):
                if len(self._cache) < self.max_cached_chunks:
                    self._cache[a // S + i] = tok[:, i]
            a = b
        self.landmarks = torch.cat(parts, 1)

    @torch.no_grad()
    def chunk_tokens(self, chunk_ids: Sequence[int]) -> Tensor:
        """Token states (B, U, S, d) of the given complete chunks (recomputed exactly when not cached)."""
        S = self.cfg.chunk_size
        missing = sorted(c for c in set(chunk_ids) if c not in self._cache)
        fresh: Dict[int, Tensor] = {}
        i = 0
        while i < len(missing):  # runs of consecutive chunks share one lower pass
            j = i
            while j + 1 < len(missing) and missing[j + 1] == missing[j] + 1 and j - i < 255:
                j += 1
            _, tok = self.model.encode_chunks(self.lower_span(missing[i] * S, (missing[j] + 1) * S))
            for n, c in enumerate(range(missing[i], missing[j] + 1)):
                fresh[c] = tok[:, n]
            i = j + 1
        out = torch.stack([self._cache[c] if c in self._cache else fresh[c] for c in chunk_ids], 1)
        for c, t in fresh.items():
            if len(self._cache) < self.max_cached_chunks:
                self._cache[c] = t
        return out

    def receptive_field(self) -> int:
        cfg = self.cfg
        per = max(cfg.window - 1, 2 * cfg.chunk_size - 1) if cfg.retrieval == "chunk" else cfg.window - 1
        return cfg.n_upper * per

    # -- outputs --------------------------------------------------------------------------------------
    @torch.no_grad()
    def logits(self, positions: Sequence[int], record: Optional[list] = None) -> Tensor:
        """Logits (B, len(positions), V) at the given absolute positions (each in [0, length))."""
        pos = [int(p) for p in positions]
        if not pos:
            raise ValueError("positions must not be empty")
        if min(pos) < 0 or max(pos) >= self.length:
            raise ValueError(f"positions must lie in [0, {self.length}), got {min(pos)}..{max(pos)}")
        S = self.cfg.chunk_size
        start = max(0, min(pos) - self.receptive_field())
        end = max(pos) + 1
        mid = self.lower_span(start, end)
        n_chunks = min(self.landmarks.shape[1], end // S)
        memory = _LazyMemory(self.landmarks[:, :n_chunks], self)
        span_pos = torch.arange(start, end, device=self.ids.device)
        x = self.model.run_upper(mid, span_pos, memory, record)
        rows = torch.tensor(pos, device=x.device) - start
        if len(self._cache) > self.max_cached_chunks:
            self._cache.clear()
        return self.model.head(x[:, rows])

    @torch.no_grad()
    def last_logits(self) -> Tensor:
        """Logits (B, V) at the last position: the next token's (greedy decoding, ``longsparse.nn.generation``)."""
        return self.logits([self.length - 1])[:, -1]

    @torch.no_grad()
    def extend(self, new_ids: Tensor) -> None:
        """Append tokens (B, M) to every row; landmarks of newly completed chunks are added."""
        if new_ids.dim() != 2 or new_ids.shape[0] != self.ids.shape[0]:
            raise ValueError(f"new_ids must have shape ({self.ids.shape[0]}, M), got {tuple(new_ids.shape)}")
        self.ids = torch.cat((self.ids, new_ids.to(self.ids.device)), 1)
        self._update_landmarks()


def hsa_fast_logits(
    model: nn.Module,
    input_ids: Tensor,
    positions: Sequence[int],
    *,
    segment_len: Optional[int] = None,
    max_cached_chunks: int = 4096,
    record: Optional[list] = None,
) -> Tensor:
    """Logits (B, len(positions), V) of ``model(input_ids)`` at ``positions`` only — exact, with memory
    O(segment_len + N/S·d) and upper-layer work independent of N (see the module docstring)."""
    was = model.training
    model.eval()
    try:
        ev = HSAFastEvaluator(model, input_ids, segment_len=segment_len, max_cached_chunks=max_cached_chunks)
        return ev.logits(positions, record)
    finally:
        model.train(was)


def select_positions(record: List[dict], positions: Sequence[int]) -> List[dict]:
    """Restrict recorded retrieval entries (per HSA layer) to the rows of the given absolute positions."""
    out = []
    for r in record:
        if r["positions"] is None:
            out.append(r)
            continue
        rp = r["positions"].tolist()
        rows = torch.tensor([rp.index(int(p)) for p in positions], dtype=torch.long)
        out.append({k: (v[:, rows] if k != "positions" else v[rows]) for k, v in r.items()})
    return out
