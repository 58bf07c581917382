"""Greedy generation, one implementation for every architecture (``GreedyGeneration``).

A model decodes through a ``Decoding``: the state of a batch being continued, which gives the logits of the next
token of every row and takes the tokens chosen. Every model has the reference one, ``FullForwardDecoding`` (its
full forward over everything so far, each step); a model with an incremental path gives it in
``cached_decoding``: the decoder's KV cache (``KVCacheDecoding``), HSA's long-context evaluator
(``longsparse.hsa.HSAFastEvaluator``). A model may also give ``static_decoding``, steps of fixed shapes without
host syncs on a preallocated cache, which a CUDA graph can capture (the decoder's ``StaticCacheDecoding``). The
loop, its checks and the EOS handling are ``GreedyGeneration.generate``; the host's one read per step, whether
every row is done, stays outside the step.
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


class StaticCacheDecoding:
    """A decoder with a static KV cache (``longsparse.nn.Transformer``): the prompt runs once through the KV
    cache, which is then copied into a static one with room for every new token (``new_static_cache``:
    `longsparse.nn.StaticKVCache`), and each new token is one `decode_step` of fixed shapes, writing the token
    into a fixed input buffer first. With ``cuda_graph`` the step is captured once in a CUDA graph
    (`CapturedStep`) and replayed per token: the host then launches one graph per token instead of every
    kernel. Exact: the same logits as `KVCacheDecoding` (see `StaticKVCache`)."""

    def __init__(self, model, prompt_ids: Tensor, mask: Tensor, max_new_tokens: int, cuda_graph: bool):
        cache = model.new_cache()
        self.logits = model(prompt_ids, attention_mask=mask, cache=cache, logits_for="last")[:, -1]
        self.tokens = torch.zeros((prompt_ids.shape[0], 1), dtype=torch.long, device=prompt_ids.device)
        self.step = None
        # the last new token is never fed back: room for the prompt and the others
        if max_new_tokens >= 2:
            static = model.new_static_cache(cache, prompt_ids.shape[1] + max_new_tokens - 1)

            def step() -> Tensor:
                return model.decode_step(self.tokens, static)

            self.step = CapturedStep(step, static) if cuda_graph else step

    def last_logits(self) -> Tensor:
        return self.logits

    def extend(self, new_ids: Tensor) -> None:
        if self.step is None:
            raise RuntimeError("this static cache has no room for another token (built for max_new_tokens)")
        self.tokens.copy_(new_ids)
        self.logits = self.step()


class CapturedStep:
    """A decoding step ``step()`` → logits, captured in a CUDA graph: calling it replays the graph and returns
    its logits, one tensor overwritten by every replay. Two eager warm-up steps run first on a side stream
    (compilation, autotuning, workspaces: what a graph cannot capture), each undone on the cache
    (``cache.counters`` / ``restore``); capture itself runs nothing, so the cache is where it was."""

    WARMUP_STEPS = 2

    def __init__(self, step, cache):
        saved = cache.counters()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.WARMUP_STEPS):
                step()
                cache.restore(saved)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph):
                self.logits = step()
        except Exception as exc:  # the model's step did something a graph cannot hold (a host sync)
            first_line = (str(exc).strip().splitlines() or [""])[0]
            raise RuntimeError(
                f"cuda_graph=True: the decoding step could not be captured in a CUDA graph "
                f"({type(exc).__name__}: {first_line})"
            ) from exc

    def __call__(self) -> Tensor:
        self.graph.replay()
        return self.logits


class GreedyGeneration:
    """Greedy ``generate`` for an ``nn.Module`` decoder that has ``forward(ids, attention_mask=mask)`` → logits
    (B, N, V) and ``cached_decoding(prompt_ids, mask)`` → its incremental ``Decoding``.

    decodes_padded_rows: whether both decodings take a batch of left-padded prompts (the pads marked by the
    mask); a model without it generates each padded batch one row at a time, without the row's pads (exact,
    since a row alone is what its padded form must compute)."""

    decodes_padded_rows = True
    # why the model has no `static_decoding` (None: it has one); generate refuses static_cache / cuda_graph with it
    static_decoding_refusal: Optional[str] = "it defines no static-cache decoding"

    def cached_decoding(self, prompt_ids: Tensor, mask: Tensor) -> Decoding:
        raise NotImplementedError(f"{type(self).__name__} defines no cached decoding")

    def static_decoding(self, prompt_ids: Tensor, mask: Tensor, max_new_tokens: int, cuda_graph: bool) -> Decoding:
        """The incremental path of fixed shapes: room for ``max_new_tokens``, its step captured in a CUDA graph
        if ``cuda_graph``. Models with one set ``static_decoding_refusal = None``."""
        raise NotImplementedError(f"{type(self).__name__} defines no static-cache decoding")

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Tensor,
        max_new_tokens: int,
        attention_mask: Optional[Tensor] = None,
        eos_id: Optional[int] = None,
        use_cache: bool = True,
        static_cache: bool = False,
        cuda_graph: bool = False,
    ) -> Tensor:
        """Greedy decoding. prompt_ids (B, N), left-padded when rows differ in length (mark pads with
        ``attention_mask`` = 0). Returns the new tokens (B, max_new_tokens); after a row emits
        ``eos_id`` it is filled with ``eos_id`` (and decoding stops once every row has).
        use_cache=False re-runs the full forward each step (the reference the cache must match).
        static_cache=True decodes with a cache preallocated for the prompt and every new token, one step of
        fixed shapes per token without host syncs (the same tokens and logits as the dynamic cache);
        cuda_graph=True (CUDA tensors) also captures that step in a CUDA graph and replays it per token.
        Runs in eval mode (the model's mode is restored afterwards)."""
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if prompt_ids.dim() != 2 or prompt_ids.shape[1] == 0:
            raise ValueError(f"prompt_ids must have shape (B, N) with N >= 1, got {tuple(prompt_ids.shape)}")
        static_cache = static_cache or cuda_graph  # the graph captures the static cache's step
        if static_cache:
            self._check_static_decoding(prompt_ids, use_cache, cuda_graph)
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
            if static_cache:
                decoding = self.static_decoding(prompt_ids, mask, max_new_tokens, cuda_graph)
            elif use_cache:
                decoding = self.cached_decoding(prompt_ids, mask)
            else:
                decoding = FullForwardDecoding(self, prompt_ids, mask)
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

    def _check_static_decoding(self, prompt_ids: Tensor, use_cache: bool, cuda_graph: bool) -> None:
        """ValueError naming why ``generate(static_cache=True / cuda_graph=True)`` cannot run."""
        option = "cuda_graph=True" if cuda_graph else "static_cache=True"
        if self.static_decoding_refusal is not None:
            raise ValueError(f"{type(self).__name__} cannot decode with {option}: {self.static_decoding_refusal}")
        if not use_cache:
            raise ValueError(f"{option} decodes with a cache; use_cache=False runs the full forward instead")
        if cuda_graph:
            devices = {prompt_ids.device.type} | {p.device.type for p in self.parameters()}
            if devices != {"cuda"}:
                raise ValueError(
                    f"cuda_graph=True needs CUDA tensors: the model and prompt are on {', '.join(sorted(devices))}"
                    " (static_cache=True runs the same step eagerly on any device)"
                )
