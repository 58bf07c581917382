"""Greedy generation, one implementation for every architecture (``GreedyGeneration``).

A model decodes through a ``Decoding``: the state of a batch being continued, which gives the logits of the next
token of every row and takes the tokens chosen. Every model has the reference one, ``FullForwardDecoding`` (its
full forward over everything so far, each step); a model with an incremental path gives it in
``cached_decoding``: the decoder's KV cache (``KVCacheDecoding``), HSA's long-context evaluator
(``longsparse.hsa.HSAFastEvaluator``). The loop, its checks and the EOS handling are ``GreedyGeneration.generate``.
"""

from __future__ import annotations

from typing import Optional, Protocol

import torch
from torch import Tensor


class Decoding(Protocol):
    """A batch of B rows being continued."""

    def last_logits(self) -> Tensor:
        """The logits (B, V) of the token that follows each row."""

    def extend(self, new_ids: Tensor) -> None:
        """Append the tokens new_ids (B, M) to every row."""


class FullForwardDecoding:
    """The model's full forward over the prompt and every token since, each step: the reference that every
    incremental decoding must match. mask (B, N) bool marks the real prompt tokens."""

    def __init__(self, model, prompt_ids: Tensor, mask: Tensor):
        self.model, self.ids, self.mask = model, prompt_ids, mask

    def last_logits(self) -> Tensor:
        return self.model(self.ids, attention_mask=self.mask)[:, -1]

    def extend(self, new_ids: Tensor) -> None:
        self.ids = torch.cat((self.ids, new_ids), 1)
        self.mask = torch.cat((self.mask, torch.ones_like(new_ids, dtype=torch.bool)), 1)


class KVCacheDecoding:
    """A decoder with a KV cache (``longsparse.nn.Transformer``): the prompt is run once into a fresh cache,
    then each new token alone, and only the last position's logits are computed (``logits_for="last"``). Left
    padding reaches attention as key ranges through the cache's key mask."""

    def __init__(self, model, prompt_ids: Tensor, mask: Tensor):
        self.model, self.cache = model, model.new_cache()
        self.pending, self.pending_mask = prompt_ids, mask  # the tokens the cache has not seen

    def last_logits(self) -> Tensor:
        logits = self.model(self.pending, attention_mask=self.pending_mask, cache=self.cache, logits_for="last")
        return logits[:, -1]

    def extend(self, new_ids: Tensor) -> None:
        self.pending, self.pending_mask = new_ids, torch.ones_like(new_ids, dtype=torch.bool)


class GreedyGeneration:
    """Greedy ``generate`` for an ``nn.Module`` decoder that has ``forward(ids, attention_mask=mask)`` → logits
    (B, N, V) and ``cached_decoding(prompt_ids, mask)`` → its incremental ``Decoding``.

    decodes_padded_rows: whether both decodings take a batch of left-padded prompts (the pads marked by the
    mask); a model without it generates each padded batch one row at a time, without the row's pads (exact,
    since a row alone is what its padded form must compute)."""

    decodes_padded_rows = True

    def cached_decoding(self, prompt_ids: Tensor, mask: Tensor) -> Decoding:
        raise NotImplementedError(f"{type(self).__name__} defines no cached decoding")

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Tensor,
        max_new_tokens: int,
        attention_mask: Optional[Tensor] = None,
        eos_id: Optional[int] = None,
        use_cache: bool = True,
    ) -> Tensor:
        """Greedy decoding. prompt_ids (B, N), left-padded when rows differ in length (mark pads with
        ``attention_mask`` = 0). Returns the new tokens (B, max_new_tokens); after a row emits
        ``eos_id`` it is filled with ``eos_id`` (and decoding stops once every row has).
        use_cache=False re-runs the full forward each step (the reference the cache must match).
        Runs in eval mode (the model's mode is restored afterwards)."""
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if prompt_ids.dim() != 2 or prompt_ids.shape[1] == 0:
            raise ValueError(f"prompt_ids must have shape (B, N) with N >= 1, got {tuple(prompt_ids.shape)}")
        B, dev = prompt_ids.shape[0], prompt_ids.device
        mask = (
            torch.ones_like(prompt_ids, dtype=torch.bool)
            if attention_mask is None
            else attention_mask.to(device=dev, dtype=torch.bool)
        )
        if mask.shape != prompt_ids.shape:
            raise ValueError(f"attention_mask must have shape {tuple(prompt_ids.shape)}, got {tuple(mask.shape)}")
        if not bool(mask.any(1).all()):
            raise ValueError("every prompt row needs at least one real (unmasked) token")
        if not self.decodes_padded_rows and not bool(mask.all()):
            return torch.cat(
                [
                    self.generate(prompt_ids[b, mask[b]][None], max_new_tokens, eos_id=eos_id, use_cache=use_cache)
                    for b in range(B)
                ]
            )
        out = torch.full((B, max_new_tokens), 0 if eos_id is None else eos_id, dtype=torch.long, device=dev)
        if max_new_tokens == 0:
            return out
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        was_training = self.training
        self.eval()
        try:
            decoding = (
                self.cached_decoding(prompt_ids, mask) if use_cache else FullForwardDecoding(self, prompt_ids, mask)
            )
            for t in range(max_new_tokens):
                nxt = decoding.last_logits().argmax(-1)
                if eos_id is not None:
                    nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
                    done = done | (nxt == eos_id)
                out[:, t] = nxt
                if t == max_new_tokens - 1 or (eos_id is not None and bool(done.all())):
                    break
                decoding.extend(nxt[:, None])
        finally:
            self.train(was_training)
        return out
