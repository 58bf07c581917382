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
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longsparse.nn.attention import Attention, KeyPadding, LayerCache, key_padding
from longsparse.nn.config import ModelConfig
from longsparse.nn.generation import GreedyGeneration, KVCacheDecoding
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
        cache: Optional[LayerCache] = None,
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


LOGITS_FOR = ("all", "last")


class Transformer(GreedyGeneration, nn.Module):
    """Decoder-only LM. ``forward(input_ids, attention_mask=None, position_ids=None, cache=None,
    logits_for="all")`` → logits (B, N, V), or (B, 1, V) with logits_for="last" (the last layer then
    computes only the last row: exact, and the cache still receives every key/value). ``generate``: greedy
    decoding with the KV cache (``longsparse.nn.generation``)."""

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

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
