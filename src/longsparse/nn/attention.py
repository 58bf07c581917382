"""Multi-head attention with every method × position combination, a per-layer KV cache and an
introspection hook (see longsparse.nn.introspect.capture)."""

from __future__ import annotations

import math
from typing import Dict, NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from longsparse.attention import attention, dense_logits
from longsparse.mappings import LearnedAlpha, get_mapping
from longsparse.mappings.registry import method_mapping
from longsparse.nn.config import ModelConfig
from longsparse.nn.positions import RoPE, position_setup
from longsparse.nn.scalers import ASEntmaxScaler, SSMaxScaler, StaticASEntmaxScaler


class KeyPadding(NamedTuple):
    """Which keys (cached and new) of each batch row are real, in the form attention takes cheapest.

    mask (B, Nk) bool, True = real key: what the shape check and introspection read. When every row's real
    keys are one run (pads only before and / or after them) the run goes to attention as key ranges,
    key_start / key_end (B,) long (None: 0 / Nk), which the fused kernels take natively; otherwise as the
    dense (B, 1, 1, Nk) mask. Build it with `key_padding`."""

    mask: Tensor
    key_start: Optional[Tensor]
    key_end: Optional[Tensor]
    one_run: bool

    def attention_kwargs(self) -> dict:
        if self.one_run:
            return {"key_start": self.key_start, "key_end": self.key_end}
        return {"attn_mask": self.mask[:, None, None, :]}


def key_padding(key_mask: Tensor, *, trailing_pads_unseen: bool = False) -> Optional[KeyPadding]:
    """The `KeyPadding` of a (B, Nk) bool key mask; None when every key is real.

    trailing_pads_unseen: the pads after a row's last real key change no output that anything reads (causal
    attention without a cache: only the outputs at those pad positions see them), so key_end is left out and
    a right-padded batch reaches attention with no key restriction at all."""
    nk = key_mask.shape[1]
    real = key_mask.long()
    start = real.argmax(1)  # the first real key (0 for a row without any)
    end = start + real.sum(1)
    j = torch.arange(nk, device=key_mask.device)
    one_run = (((j >= start[:, None]) & (j < end[:, None])) == key_mask).all()
    flags = torch.stack((key_mask.all(), one_run, (start > 0).any(), (end < nk).any()))
    all_real, one_run, left, right = flags.tolist()  # one host sync
    if all_real:
        return None
    if not one_run:
        return KeyPadding(key_mask, None, None, one_run=False)
    key_start = start if left else None
    key_end = end if right and not trailing_pads_unseen else None
    if key_start is None and key_end is None:
        return None
    return KeyPadding(key_mask, key_start, key_end, one_run=True)


class LayerCache:
    """Keys (RoPE already applied) and values of one layer: (B, H, N, Dh) each.

    Stored in buffers with spare room that double when full, so a decoding step writes one row instead of
    copying the whole cache (``torch.cat`` per step made long greedy generation quadratic in copies; at
    ~4,100 cached tokens a step takes 0.62-0.74x the concatenating time). Under autograd it concatenates, so no graph sees a buffer
    that a later step writes into."""

    def __init__(self):
        self._k: Optional[Tensor] = None
        self._v: Optional[Tensor] = None
        self.n = 0

    @property
    def k(self) -> Optional[Tensor]:
        return None if self._k is None else self._k[:, :, : self.n]

    @property
    def v(self) -> Optional[Tensor]:
        return None if self._v is None else self._v[:, :, : self.n]

    def append(self, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
        if self._k is None or (torch.is_grad_enabled() and (k.requires_grad or v.requires_grad)):
            if self._k is not None:
                k, v = torch.cat((self.k, k), dim=2), torch.cat((self.v, v), dim=2)
            self._k, self._v, self.n = k, v, k.shape[2]
            return k, v
        n, m = self.n, k.shape[2]
        if n + m > self._k.shape[2]:
            cap = max(2 * self._k.shape[2], n + m)
            grown_k = self._k.new_empty(*self._k.shape[:2], cap, self._k.shape[3])
            grown_v = self._v.new_empty(*self._v.shape[:2], cap, self._v.shape[3])
            grown_k[:, :, :n], grown_v[:, :, :n] = self.k, self.v
            self._k, self._v = grown_k, grown_v
        self._k[:, :, n : n + m] = k
        self._v[:, :, n : n + m] = v
        self.n = n + m
        return self.k, self.v


class StaticLayerCache:
    """Keys (RoPE already applied) and values of one layer in buffers of fixed capacity, (B, H, capacity, Dh)
    each, for a decoding step of fixed shapes (``longsparse.nn.StaticKVCache``): ``append`` writes the step's
    one token at ``slot`` ((1,) long, a device tensor the whole cache shares and advances) and returns the whole
    buffers, so no shape and no host value changes from step to step (CUDA graphs, torch.compile). The slots
    not written yet hold zeros and lie outside every row's key range."""

    def __init__(self, k: Tensor, v: Tensor, slot: Tensor):
        self.k, self.v, self.slot = k, v, slot

    def append(self, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
        if k.shape[2] != 1:
            raise ValueError(f"a static cache takes one token per step, got {k.shape[2]}")
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            # a buffer written in place step after step cannot keep the graph of an earlier step's keys
            raise ValueError("the static cache is for inference: run its decoding steps under torch.no_grad()")
        self.k.index_copy_(2, self.slot, k)
        self.v.index_copy_(2, self.slot, v)
        return self.k, self.v


class Attention(nn.Module):
    """MHA: q, k, v, o projections without bias, attention scale 1/√head_dim.

    ``forward(h, positions, padding=None, cache=None, n_query=None)``:
      h (B, N, d_model) the normalised layer input; positions (B, N) absolute positions of these
      tokens; padding a `KeyPadding` of the keys the cache returns (None = all real); cache a
      `LayerCache` extended in place (N_cache + N keys), or a `StaticLayerCache` (N = 1, its whole
      capacity of keys, the padding's key ranges marking the written ones); n_query: compute only the last
      n_query query rows (exact: keys/values still come from all N tokens). Returns (B, n_query or N, d_model).
    """

    def __init__(self, cfg: ModelConfig, layer_idx: int = 0):
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        H, Dh, d = cfg.n_heads, cfg.head_dim, cfg.d_model
        self.n_heads, self.head_dim = H, Dh
        self.scale = 1.0 / math.sqrt(Dh)
        self.q_proj = nn.Linear(d, H * Dh, bias=False)
        self.k_proj = nn.Linear(d, H * Dh, bias=False)
        self.v_proj = nn.Linear(d, H * Dh, bias=False)
        self.o_proj = nn.Linear(H * Dh, d, bias=False)
        slopes, scalable = position_setup(cfg.attention.positions, H, cfg.attention.nape_slopes)
        if slopes is not None:
            self.register_buffer("alibi_slopes", slopes, persistent=False)
        else:
            self.alibi_slopes = None
        self.register_buffer("scalable", scalable, persistent=False)
        self.rope = RoPE(Dh, cfg.attention.rope_theta) if cfg.attention.positions == "rope" else None
        self.scaler: Optional[nn.Module] = None
        if cfg.attention.method == "ssmax":
            self.scaler = SSMaxScaler(scalable, init=cfg.attention.ssmax_init)
        elif cfg.attention.method == "asentmax":
            if cfg.attention.asentmax_scaler == "adaptive":
                self.scaler = ASEntmaxScaler(
                    d,
                    scalable,
                    init=cfg.attention.asentmax_init,
                    delta=cfg.attention.asentmax_delta,
                    gamma_range=cfg.attention.asentmax_gamma_range,
                )
            else:
                self.scaler = StaticASEntmaxScaler(
                    scalable,
                    init=cfg.attention.asentmax_init,
                    delta=cfg.attention.asentmax_delta,
                    gamma_range=cfg.attention.asentmax_gamma_range,
                )
        self.learned_alpha = (
            LearnedAlpha((H,), init=cfg.attention.alpha, max_alpha=cfg.attention.max_alpha)
            if cfg.attention.learn_alpha
            else None
        )
        self._capture = None  # set by longsparse.nn.capture

    # -- the mapping ------------------------------------------------------------------------
    @property
    def mapping(self) -> str:
        return self.cfg.attention.method

    def alpha(self):
        """α (float or per-head (H,) tensor) for entmax-type methods."""
        return self.learned_alpha() if self.learned_alpha is not None else float(self.cfg.attention.alpha)

    def mapping_kwargs(self) -> Dict:
        """The mapping of the layer's method (ssmax / asentmax: softmax / entmax, their scales arrive as q_scale)."""
        return dict(
            mapping=method_mapping(self.cfg.attention.method),
            alpha=self.alpha(),
            topk=self.cfg.attention.topk,
            adatemp_order=self.cfg.attention.adatemp_order,
        )

    def probabilities(
        self, q: Tensor, k: Tensor, q_scale: Optional[Tensor] = None, attn_mask: Optional[Tensor] = None
    ) -> Tensor:
        """Dense attention map (B, H, Nq, Nk) of already-projected/rotated q, k (introspection)."""
        z = dense_logits(q, k, scale=self.scale, q_scale=q_scale, alibi_slopes=self.alibi_slopes, attn_mask=attn_mask)
        kw = self.mapping_kwargs()
        return get_mapping(kw.pop("mapping"), **kw)(z)

    # -- forward ----------------------------------------------------------------------------
    def _heads(self, x: Tensor) -> Tensor:
        B, N, _ = x.shape
        return x.view(B, N, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        h: Tensor,
        positions: Tensor,
        padding: Optional[KeyPadding] = None,
        cache: Union[LayerCache, StaticLayerCache, None] = None,
        n_query: Optional[int] = None,
    ) -> Tensor:
        B, N, _ = h.shape
        nq = N if n_query is None else n_query
        hq, pq = (h, positions) if nq == N else (h[:, N - nq :], positions[:, N - nq :])
        q = self._heads(self.q_proj(hq))
        k = self._heads(self.k_proj(h))
        v = self._heads(self.v_proj(h))
        if self.rope is not None:
            q = self.rope(q, pq)
            k = self.rope(k, positions)
        if cache is not None:
            k, v = cache.append(k, v)
        keys = {}
        if padding is not None:
            if padding.mask.shape != (B, k.shape[2]):
                raise ValueError(
                    f"the key padding mask must have shape {(B, k.shape[2])}, got {tuple(padding.mask.shape)}"
                )
            keys = padding.attention_kwargs()
        q_scale = self.scaler(hq, pq) if self.scaler is not None else None
        out = attention(
            q,
            k,
            v,
            is_causal=True,
            scale=self.scale,
            alibi_slopes=self.alibi_slopes,
            q_scale=q_scale,
            chunk_size=self.cfg.attention.attn_chunk_size,
            backend=self.cfg.attention.attn_backend,
            **keys,
            **self.mapping_kwargs(),
        )
        if self._capture is not None:
            self._capture.record(
                self, q=q, k=k, q_scale=q_scale, attn_mask=None if padding is None else padding.mask[:, None, None, :]
            )
        return self.o_proj(out.transpose(1, 2).reshape(B, nq, self.n_heads * self.head_dim))
