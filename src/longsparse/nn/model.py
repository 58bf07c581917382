"""Gemma-2-style decoder (docs/method.md §4) with KV-cache greedy generation.

Block:  x ← x + norm(attn(norm(x)));  x ← x + norm(GeGLU(norm(x)))   ("sandwich" RMSNorms)
Model:  embeddings × √d_model → blocks → RMSNorm → untied output head. No dropout.

Positions in padded batches. Prompts may be left-padded (``attention_mask`` (B, N): 1/True for real
tokens). The position of a token is the number of real tokens before it in its row
(``position_ids = cumsum(mask) − 1``; pads get 0 and are never attended to), so a left-padded row
computes exactly what the same row would without padding: RoPE angles and SSMax/ASEntmax scales use
these positions, ALiBi uses the key-index distance i − j, which equals the real-token distance
because pads only precede the real tokens. Right padding (training batches) is fine as well since
attention is causal; pads *between* real tokens are not supported.

Padding reaches attention as key ranges whenever each row's real keys are one run (`key_padding`):
left-padded prompts as ``key_start``, right-padded rows with a cache as ``key_end``, and right-padded rows
without a cache not at all (no real token sees a pad that follows it). The fused backends (triton on CUDA)
take key ranges natively; only a mask with pads between real keys (right-padded prompts decoded further
with a cache) goes as a dense (B, 1, 1, Nk) mask.
"""

from __future__ import annotations

import math
from typing import List, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longsparse.nn.attention import Attention, KeyPadding, LayerCache, StaticLayerCache, key_padding
from longsparse.nn.config import ModelConfig
from longsparse.nn.generation import GreedyGeneration, KVCacheDecoding, StaticCacheDecoding
from longsparse.nn.scalers import ASEntmaxScaler


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.to(y.dtype)).to(x.dtype)


class GeGLU(nn.Module):
    """down(gelu_tanh(gate(x)) ⊙ up(x))."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class Block(nn.Module):
    """``attn``: the token-mixing module, ``Attention(cfg, layer_idx)`` unless given (longsparse.hsa passes its
    sliding-window and chunk-encoder attention and keeps this sandwich)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, attn: Optional[nn.Module] = None):
        super().__init__()
        self.pre_attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, layer_idx) if attn is None else attn
        self.post_attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.pre_mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = GeGLU(cfg.d_model, cfg.d_ff)
        self.post_mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)

    def forward(
        self,
        x: Tensor,
        positions: Tensor,
        padding: Optional[KeyPadding] = None,
        cache: Union[LayerCache, StaticLayerCache, None] = None,
        n_query: Optional[int] = None,
    ) -> Tensor:
        a = self.attn(self.pre_attn_norm(x), positions, padding, cache, n_query)
        if n_query is not None and n_query != x.shape[1]:
            x = x[:, x.shape[1] - n_query :]
        x = x + self.post_attn_norm(a)
        return x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x)))


class KVCache:
    """Per-layer keys/values plus, per row, which cached keys are real and the next position."""

    def __init__(self, n_layers: int):
        self.layers: List[LayerCache] = [LayerCache() for _ in range(n_layers)]
        self.key_mask: Optional[Tensor] = None  # (B, N) bool
        self.next_pos: Optional[Tensor] = None  # (B,) long

    def __len__(self) -> int:
        return 0 if self.key_mask is None else self.key_mask.shape[1]


class StaticKVCache:
    """A KV cache of fixed capacity for decoding steps of fixed shapes (`Transformer.decode_step`): per layer a
    `StaticLayerCache` (B, H, capacity, Dh), and per row, as device tensors that each step advances in place,
    the key range of its real keys [key_start, key_end) and the position of its next token. Built from a
    prompt's dynamic cache (`from_prefill`), whose rows are left-padded: every row's real keys are one run
    ending at the last prompt slot, so the rows write their new tokens at the same slot and key_end, one past
    that slot, is the same for every row.

    Exact: a step computes what the dynamic cache computes for the same token (a query over the row's real
    keys at its true position; RoPE and the q-scales use that position). Only ALiBi's distances count from
    the last slot of the capacity instead of the query's own slot: every key of a row gets the same extra
    bias −m·(capacity − 1 − slot), which leaves every mapping unchanged (each is invariant to adding a
    constant to a row: softmax, α-entmax, top-k, adaptive temperature) up to the rounding of that offset
    (m·(max_new_tokens − 2) at most in ``generate``; the kernels add it in float32, SDPA's bias holds it in
    the model's dtype).

    A cache takes capacity − prompt length steps: the step after those writes past its buffers (an index
    error; on CUDA a device-side assert), which no step may check without reading the slot on the host."""

    def __init__(self, layers: List[StaticLayerCache], key_start: Tensor, key_end: Tensor, next_pos: Tensor, slot):
        self.layers = layers
        self.key_start = key_start  # (B,) long: the row's first real key (its left padding)
        self.key_end = key_end  # (B,) long: one past the last key the step's attention reads, slot + 1
        self.next_pos = next_pos  # (B,) long: the position of the row's next token (its real tokens so far)
        self.slot = slot  # (1,) long: where the next token's key and value are written, in every layer
        self.key_index = torch.arange(self.capacity, device=slot.device)

    @property
    def capacity(self) -> int:
        return self.layers[0].k.shape[2]

    @property
    def batch_size(self) -> int:
        return self.key_start.shape[0]

    @classmethod
    def from_prefill(cls, cache: KVCache, capacity: int) -> "StaticKVCache":
        """The static cache of room ``capacity`` (≥ the prompt's length) holding a prompt's dynamic cache (its
        buffers copied, then released). ValueError unless every row's real prompt tokens are one run at its
        end (left padding)."""
        if cache.key_mask is None:
            raise ValueError("the static cache is built from a cache that holds a prompt; this one is empty")
        B, N = cache.key_mask.shape
        if capacity < N:
            raise ValueError(f"a static cache of capacity {capacity} cannot hold the {N} prompt keys")
        real = cache.key_mask.sum(1)
        start = N - real
        left_padded = cache.key_mask == (torch.arange(N, device=real.device) >= start[:, None])
        if not bool(left_padded.all()):
            raise ValueError(
                "the static cache takes left-padded prompts: each row's real tokens one run at its end "
                "(pads only before them)"
            )
        slot = torch.full((1,), N, dtype=torch.long, device=real.device)
        layers = []
        for i, layer in enumerate(cache.layers):
            k, v = layer.k, layer.v
            # zeros, not empty: an unwritten slot is masked, but a NaN there would still reach the output as 0·NaN
            shape = (*k.shape[:2], capacity, k.shape[3])
            big_k, big_v = k.new_zeros(shape), v.new_zeros(shape)
            big_k[:, :, :N], big_v[:, :, :N] = k, v
            cache.layers[i] = LayerCache()  # the prompt's buffers are released layer by layer, once copied
            layers.append(StaticLayerCache(big_k, big_v, slot))
        key_end = torch.full((B,), N + 1, dtype=torch.long, device=real.device)
        return cls(layers, start, key_end, cache.next_pos.clone(), slot)

    def key_mask(self) -> Tensor:
        """(B, capacity) bool: the keys a step's attention may read (its KeyPadding's mask: shape checks and
        introspection; attention itself takes the key ranges)."""
        j = self.key_index
        return (j >= self.key_start[:, None]) & (j < self.key_end[:, None])

    def advance(self) -> None:
        """After a step: the next token goes one slot further, one position later, and its key is read too."""
        self.slot.add_(1)
        self.key_end.add_(1)
        self.next_pos.add_(1)

    def counters(self) -> tuple:
        """Copies of what `advance` changes, for `restore` (a CUDA graph's warm-up steps are undone)."""
        return tuple(t.clone() for t in (self.slot, self.key_end, self.next_pos))

    def restore(self, counters: tuple) -> None:
        for t, saved in zip((self.slot, self.key_end, self.next_pos), counters):
            t.copy_(saved)


LOGITS_FOR = ("all", "last")


class Transformer(GreedyGeneration, nn.Module):
    """Decoder-only LM. ``forward(input_ids, attention_mask=None, position_ids=None, cache=None,
    logits_for="all")`` → logits (B, N, V), or (B, 1, V) with logits_for="last" (the last layer then
    computes only the last row: exact, and the cache still receives every key/value). ``generate``: greedy
    decoding with the KV cache (``longsparse.nn.generation``), or with a static cache whose step
    (`decode_step`) a CUDA graph can capture (``static_cache=True``, ``cuda_graph=True``)."""

    static_decoding_refusal = None  # generate(static_cache=True / cuda_graph=True): `decode_step`

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"expected a ModelConfig, got {type(cfg).__name__}")
        cfg.validate()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.embed_scale = math.sqrt(cfg.d_model)
        self.reset_parameters()

    @property
    def config(self) -> ModelConfig:
        return self.cfg

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, self.cfg.init_std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for m in self.modules():  # the scalers' own initialisation wins
            if isinstance(m, ASEntmaxScaler):
                m.reset_parameters()

    def attention_layers(self) -> List[Attention]:
        return [b.attn for b in self.blocks]

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.n_layers)

    def new_static_cache(self, prefilled: KVCache, capacity: int) -> StaticKVCache:
        """The static cache of room ``capacity`` holding the prompt of ``prefilled`` (`StaticKVCache.from_prefill`),
        for `decode_step`."""
        return StaticKVCache.from_prefill(prefilled, capacity)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Optional[Tensor] = None,
        position_ids: Optional[Tensor] = None,
        cache: Optional[KVCache] = None,
        logits_for: str = "all",
    ) -> Tensor:
        if logits_for not in LOGITS_FOR:
            raise ValueError(f"logits_for must be one of {LOGITS_FOR}, got {logits_for!r}")
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (B, N), got {tuple(input_ids.shape)}")
        B, N = input_ids.shape
        dev = input_ids.device
        new_mask = (
            torch.ones(B, N, dtype=torch.bool, device=dev)
            if attention_mask is None
            else attention_mask.to(device=dev, dtype=torch.bool)
        )
        if new_mask.shape != (B, N):
            raise ValueError(f"attention_mask must have shape {(B, N)}, got {tuple(new_mask.shape)}")
        base = (
            torch.zeros(B, dtype=torch.long, device=dev) if cache is None or cache.next_pos is None else cache.next_pos
        )
        if position_ids is None:
            position_ids = (base[:, None] + new_mask.long().cumsum(1) - 1).clamp_min(0)
        elif position_ids.shape != (B, N):
            raise ValueError(f"position_ids must have shape {(B, N)}, got {tuple(position_ids.shape)}")
        key_mask = new_mask
        if cache is not None:
            if cache.key_mask is not None:
                if cache.key_mask.shape[0] != B:
                    raise ValueError(f"cache batch size {cache.key_mask.shape[0]} != input batch size {B}")
                key_mask = torch.cat((cache.key_mask, new_mask), dim=1)
            cache.key_mask = key_mask
            cache.next_pos = base + new_mask.long().sum(1)
        # No mask and no cache: every key is real, with nothing to check (no graph break under torch.compile).
        # Without a cache, pads after a row's real tokens are seen only by the outputs at those pad positions,
        # which no loss or prediction reads: a right-padded training batch reaches attention unrestricted, as
        # the fused backends (fused_cpu, triton) take it. With a cache, later queries would see them.
        padding = (
            None
            if attention_mask is None and cache is None
            else key_padding(key_mask, trailing_pads_unseen=cache is None)
        )
        x = self.embed(input_ids) * self.embed_scale
        L = len(self.blocks)
        for i, block in enumerate(self.blocks):
            nq = 1 if (logits_for == "last" and i == L - 1) else None
            x = block(x, position_ids, padding, None if cache is None else cache.layers[i], nq)
        if logits_for == "last" and x.shape[1] != 1:
            x = x[:, -1:]
        return self.lm_head(self.final_norm(x))

    def cached_decoding(self, prompt_ids: Tensor, mask: Tensor) -> KVCacheDecoding:
        """Greedy decoding's incremental path (``GreedyGeneration.generate``): the KV cache."""
        return KVCacheDecoding(self, prompt_ids, mask)

    def static_decoding(self, prompt_ids: Tensor, mask: Tensor, max_new_tokens: int, cuda_graph: bool):
        """Greedy decoding with a static cache (``GreedyGeneration.generate(static_cache=True)``): the prompt
        through the KV cache, then `decode_step` per token, replayed from a CUDA graph if ``cuda_graph``."""
        return StaticCacheDecoding(self, prompt_ids, mask, max_new_tokens, cuda_graph)

    def decode_step(self, token_ids: Tensor, cache: StaticKVCache) -> Tensor:
        """One decoding step on a static cache: token_ids (B, 1) → logits (B, V) of the token that follows each
        row; the token's keys and values are written into the cache, whose ranges and positions advance in
        place. Fixed shapes, no host sync and no branch on device values: torch.compile(fullgraph=True) traces it
        and a CUDA graph captures it. Equal to ``forward(token_ids, cache=dynamic_cache, logits_for="last")`` on
        the dynamic cache it was built from (`StaticKVCache`)."""
        if token_ids.shape != (cache.batch_size, 1):
            raise ValueError(f"token_ids must have shape ({cache.batch_size}, 1), got {tuple(token_ids.shape)}")
        positions = cache.next_pos[:, None]
        padding = KeyPadding(cache.key_mask(), cache.key_start, cache.key_end, one_run=True)
        x = self.embed(token_ids) * self.embed_scale
        for block, layer in zip(self.blocks, cache.layers):
            x = block(x, positions, padding, layer)
        cache.advance()
        return self.lm_head(self.final_norm(x))[:, -1]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
