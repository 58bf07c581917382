"""attention(q, k, v, ...): one function for every mapping, bias and mask.

Logits z_ij = (q_i · s_i) · k_j · scale − m_h · (i − j) + mask, with s the per-query q-scale
(SSMax / ASEntmax) and m the ALiBi slopes. Query i sits at absolute position Nk − Nq + i, so a
short q against a long KV cache is decoding. Rows are independent, which makes the query-chunked
path exact: it only bounds memory to O(chunk × Nk).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from longsparse.attention.chunked import BlockSpec, ChunkedAttention
from longsparse.attention.cuda import adasplash_attention
from longsparse.mappings import entmax
from longsparse.mappings.entmax import AlphaLike, _alpha_view, _check_alpha_values

MAPPINGS = ("softmax", "entmax", "sparsemax", "topk", "adatemp", "ssmax", "asentmax")
# ssmax and asentmax are softmax and entmax whose length scaling arrives through q_scale.
_ALIASES = {"ssmax": "softmax", "asentmax": "entmax"}

# Polynomial of Veličković et al. (2024) for the adaptive temperature, highest power first.
ADATEMP_POLY = {
    "original": (-0.037, 0.481, -2.3, 4.917, -1.791),
    "reversed": (-1.791, 4.917, -2.3, 0.481, -0.037),   # the coefficient order of the official [A] code
}

# Logit elements per block of the chunked path (B·H·chunk·Nk): 64 MiB of fp32 per buffer, a quarter
# of the full (H, N, N) scores at N = 2048, H = 8 (the backward holds two such buffers).
_AUTO_CHUNK_ELEMENTS = 1 << 24
# Queries per block below which q·kᵀ turns memory-bound (it re-reads k for every block).
_MIN_ROWS = 256
# Short rows that "auto" differentiates through the materialised logits with autograd instead of the
# chunked path's recomputing backward, which costs a second forward (training at the synthetic tasks'
# lengths): 0.70-0.95x its time for entmax at 32-64 keys (`longsparse bench short`; adatemp takes SDPA).
_AUTO_REFERENCE_MAX_KEYS = 64
_AUTO_REFERENCE_ELEMENTS = 1 << 22     # and at most this many logits (a few such buffers are kept)


def _check_shapes(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor; got dtype {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, N, D); got {tuple(t.shape)}")
    B, H, Nq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {B}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same number of heads; got {k.shape[1]} and {v.shape[1]}")
    if H % k.shape[1]:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({k.shape[1]})")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same length; got {k.shape[2]} and {v.shape[2]}")
    if k.shape[3] != D:
        raise ValueError(f"q and k head dims differ: {D} vs {k.shape[3]}")
    if Nq > k.shape[2]:
        raise ValueError(f"more queries ({Nq}) than keys ({k.shape[2]}): queries sit at the end of the keys")


def _check_mask_dtype(attn_mask: Optional[Tensor]) -> None:
    """SDPA's contract: a bool mask (True = attend) or a float one (added); an integer mask would be
    read as a bias of 0/1, silently not masking."""
    if attn_mask is not None and attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise ValueError(f"attn_mask must be bool (True = attend) or floating point (added to the logits); "
                         f"got dtype {attn_mask.dtype}")


def _check_finite_inputs(**tensors: Optional[Tensor]) -> None:
    """Refuses NaN and ±inf in the given tensors (the attn_mask may hold −inf) with one host sync.

    Checked here, once for every path, because the paths would notice different things: SDPA's fused
    kernels turn the NaN row of a NaN query into zeros, and the logits' row-max check of the other paths
    misses v and entries under a mask. One min/max reduction per tensor (a single pass, no temporary of the
    input's size; NaN propagates through it) and one sync: O(N·D) work for q, k, v against the
    attention's O(N²·D). Skipped under torch.compile (no data-dependent branches)."""
    if torch.compiler.is_compiling():
        return
    given = {name: t for name, t in tensors.items()
             if t is not None and t.numel() and t.is_floating_point()}
    if not given:
        return
    with torch.no_grad():
        stats = []          # (stack promotes mixed dtypes to the widest: finiteness is kept)
        for name, t in given.items():
            if name == "attn_mask":     # −inf masks; its max is NaN or +inf only for a bad entry
                stats += [t.amax().clamp_min(0)] * 2
            else:
                stats += torch.aminmax(t)
        finite = torch.isfinite(torch.stack(stats))
        if bool(finite.all()):
            return
        name = list(given)[finite.view(-1, 2).all(1).tolist().index(False)]
    raise ValueError(f"{name} contains NaN or {'+inf' if name == 'attn_mask' else 'inf'}")


def attention(q: Tensor, k: Tensor, v: Tensor, *, mapping: str = "entmax", alpha: AlphaLike = 1.5,
              is_causal: bool = True, scale: Optional[float] = None, alibi_slopes: Optional[Tensor] = None,
              q_scale: Optional[Tensor] = None, attn_mask: Optional[Tensor] = None,
              chunk_size: Optional[int] = None, topk: int = 32, adatemp_order: str = "original",
              path: str = "auto") -> Tensor:
    """Attention on (B, H, N, D) tensors with any mapping; returns (B, H, Nq, D).

    mapping: softmax | entmax (α = ``alpha``: float or per-head tensor) | sparsemax | topk (softmax
    over the ``topk`` largest logits) | adatemp (adaptive temperature, ``adatemp_order`` original or
    reversed) | ssmax / asentmax (softmax / entmax; pass their scales as ``q_scale``).
    alibi_slopes: (H,) slopes m, bias −m·(i − j). q_scale: (B, H, Nq) multiplier of q (not of the
    bias). attn_mask: bool (True = attend) or float (added), broadcastable to (B, H, Nq, Nk); integer
    masks are refused, as are NaN or ±inf in q, k, v, q_scale, alibi_slopes, scale (and NaN / +inf in a
    float mask). α = 1 is softmax, also per head.
    k/v may have fewer heads than q (GQA). Queries sit at the last Nq key positions.
    A query that can attend to nothing gets a zero output.
    Softmax with path "auto" and no chunk_size goes through torch SDPA when its mask stays small, adaptive
    temperature and top-k too while their (B, H, Nq, Nk) logits do (θ or the selection from one pass
    without autograd); on
    CUDA, entmax/sparsemax with one α, no ALiBi/mask and Nq = Nk go through `adasplash` when installed.
    path: "chunked" walks over blocks of ``chunk_size`` queries (None = automatic) with a recomputing
    backward: memory O(chunk × Nk) both ways. "reference" materialises all logits and lets autograd
    differentiate everything (also alpha, alibi_slopes and a float attn_mask). "auto" takes reference
    when alpha, alibi_slopes or attn_mask needs a gradient, or for a gradient through short rows
    (≤ 64 keys, ≤ 4 M logits, no autocast: faster than recomputing), else chunked.
    """
    _check_shapes(q, k, v)
    name = _ALIASES.get(mapping, mapping)
    if name not in ("softmax", "entmax", "sparsemax", "topk", "adatemp"):
        raise ValueError(f"unknown mapping {mapping!r}; choose one of {', '.join(MAPPINGS)}")
    if adatemp_order not in ADATEMP_POLY:
        raise ValueError(f"adatemp_order must be one of {sorted(ADATEMP_POLY)}, got {adatemp_order!r}")
    if name == "entmax":
        _check_alpha_values(alpha)
    if name == "topk" and topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    if alibi_slopes is not None and alibi_slopes.shape != (H,):
        raise ValueError(f"alibi_slopes must have shape ({H},); got {tuple(alibi_slopes.shape)}")
    if q_scale is not None and q_scale.shape != (B, H, Nq):
        raise ValueError(f"q_scale must have shape ({B}, {H}, {Nq}); got {tuple(q_scale.shape)}")
    _check_mask_dtype(attn_mask)
    if attn_mask is not None:
        try:
            torch.broadcast_shapes(attn_mask.shape, (B, H, Nq, Nk))
        except RuntimeError:
            raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                             f"{(B, H, Nq, Nk)}") from None
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number; got {scale}")
    _check_finite_inputs(q=q, k=k, v=v, q_scale=q_scale, alibi_slopes=alibi_slopes, attn_mask=attn_mask)
    if k.shape[1] != H:   # GQA: each k/v head serves H // Hkv query heads
        rep = H // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    first_pos = Nk - Nq                       # absolute position of query row 0
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    if isinstance(alpha, Tensor):
        alpha = _alpha_view(alpha, torch.empty((B, H, Nq, Nk), device="meta"), 3)
    if path not in ("auto", "chunked", "reference"):
        raise ValueError(f"path must be auto, chunked or reference; got {path!r}")
    needs_autograd = any(isinstance(t, Tensor) and t.requires_grad for t in (alpha, alibi_slopes, attn_mask))
    if path == "chunked" and needs_autograd:
        raise ValueError("the chunked path does not differentiate alpha, alibi_slopes or attn_mask; "
                         "use path='reference' (or 'auto')")
    if path == "reference" or (path == "auto" and needs_autograd):
        return reference_attention(q, k, v, name=name, alpha=alpha, is_causal=is_causal, scale=scale,
                                   alibi_slopes=alibi_slopes, q_scale=q_scale, attn_mask=attn_mask, topk=topk,
                                   adatemp_order=adatemp_order)
    head_block = H
    if name in ("entmax", "sparsemax") and path == "auto" and chunk_size is None:
        out = adasplash_attention(q, k, v, alpha=2.0 if name == "sparsemax" else alpha, is_causal=is_causal,
                                  scale=scale, q_scale=q_scale, alibi_slopes=alibi_slopes, attn_mask=attn_mask)
        if out is not None:
            return out
    if name == "softmax" and path == "auto" and chunk_size is None:
        out = _sdpa_softmax(q, k, v, is_causal=is_causal, scale=scale, alibi_slopes=alibi_slopes,
                            q_scale=q_scale, attn_mask=attn_mask)
        if out is not None:
            return out
    if name in ("adatemp", "topk") and path == "auto" and chunk_size is None:
        out = _sdpa_after_logits(q, k, v, name=name, is_causal=is_causal, scale=scale, alibi_slopes=alibi_slopes,
                                 q_scale=q_scale, attn_mask=attn_mask, topk=topk, order=adatemp_order)
        if out is not None:
            return out
    wants_grad = torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad
                                                 for t in (q, k, v, q_scale))
    short = Nk <= _AUTO_REFERENCE_MAX_KEYS and B * H * Nq * Nk <= _AUTO_REFERENCE_ELEMENTS
    # not under autocast: there the chunked path keeps its logits in float32, the reference matmul would not
    if (path == "auto" and chunk_size is None and wants_grad and short
            and not torch.is_autocast_enabled(q.device.type)):
        return reference_attention(q, k, v, name=name, alpha=alpha, is_causal=is_causal, scale=scale,
                                   alibi_slopes=alibi_slopes, q_scale=q_scale, attn_mask=attn_mask, topk=topk,
                                   adatemp_order=adatemp_order)
    if chunk_size is None:
        # all heads at once while that leaves ≥ _MIN_ROWS queries per block, else fewer heads
        head_block = max(1, min(H, _AUTO_CHUNK_ELEMENTS // max(1, B * Nk * _MIN_ROWS)))
        chunk_size = max(1, _AUTO_CHUNK_ELEMENTS // max(1, B * head_block * Nk))
        if is_causal:   # ≥ 8 query blocks, so that blocks skip the keys in their future
            chunk_size = min(chunk_size, max(_MIN_ROWS, -(-Nq // 8)))
    spec = BlockSpec(name=name, alpha=alpha, is_causal=is_causal, scale=scale, alibi_slopes=alibi_slopes,
                     attn_mask=attn_mask, topk=topk, adatemp_order=adatemp_order, first_pos=first_pos,
                     block=chunk_size, head_block=head_block, dtype=cdt, device=q.device)
    return ChunkedAttention.apply(q, k, v, q_scale, spec)


def _sdpa_softmax(q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool, scale: float,
                  alibi_slopes: Optional[Tensor], q_scale: Optional[Tensor], attn_mask: Optional[Tensor]):
    """Plain softmax through torch SDPA (fused kernels on CPU and CUDA; a fully masked row gives 0).
    SDPA's own causal flag aligns queries top-left, so decoding (Nq < Nk) and ALiBi need an explicit
    mask; so does a scale ≤ 0, since the flag's −inf is multiplied by the scale (0 · −inf = NaN); that mask
    is only built while it is small. Returns None when this path does not apply."""
    import torch.nn.functional as F

    B, H, Nq, _ = q.shape
    Nk = k.shape[2]
    if q_scale is not None:
        q = q * q_scale.unsqueeze(-1).to(q.dtype)
    if alibi_slopes is None and attn_mask is None and (not is_causal or (Nq == Nk and scale > 0)):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
    if (H if alibi_slopes is not None else 1) * Nq * Nk > _AUTO_CHUNK_ELEMENTS:
        return None
    bias = _additive_bias(Nq, Nk, q.dtype, q.device, alibi_slopes=alibi_slopes, attn_mask=attn_mask,
                          is_causal=is_causal)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.expand(B, H, Nq, Nk) if bias.dim() else None,
                                          scale=scale)


def _sdpa_after_logits(q: Tensor, k: Tensor, v: Tensor, *, name: str, is_causal: bool, scale: float,
                       alibi_slopes: Optional[Tensor], q_scale: Optional[Tensor], attn_mask: Optional[Tensor],
                       topk: int, order: str):
    """Adaptive temperature and top-k as softmax through SDPA, after one pass over the logits without
    autograd: adatemp = softmax(θ·z) with θ per row a constant for the gradient, so q and the bias are scaled
    by θ; top-k = softmax over the k largest logits, whose selection has no gradient, so the rest are masked.
    One differentiated attention instead of the chunked path's (adatemp: two, plus the recomputing backward).
    Returns None (use the chunked path) when the (B, H, Nq, Nk) logits and bias are too large to materialise."""
    import torch.nn.functional as F

    B, H, Nq, _ = q.shape
    Nk = k.shape[2]
    if B * H * Nq * Nk > _AUTO_CHUNK_ELEMENTS:
        return None
    if q_scale is not None:
        q = q * q_scale.unsqueeze(-1).to(q.dtype)
    with torch.no_grad():
        z = dense_logits(q, k, scale=scale, alibi_slopes=alibi_slopes, attn_mask=attn_mask, is_causal=is_causal)
        bias = _additive_bias(Nq, Nk, q.dtype, q.device, alibi_slopes=alibi_slopes, attn_mask=attn_mask,
                              is_causal=is_causal)
        if name == "adatemp":
            theta = adaptive_temperature(z, order).to(q.dtype)
            bias = theta * bias if bias.dim() else None          # θ ≥ 1 keeps −inf at −inf
        else:       # the same selection as map_scores: ties with the k-th largest stay in
            thresh = z.topk(min(topk, Nk), dim=-1).values[..., -1:]
            bias = bias + torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(z < thresh, float("-inf"))
        bias = None if bias is None else bias.expand(B, H, Nq, Nk)
    if name == "adatemp":
        q = q * theta
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)


def _additive_bias(Nq: int, Nk: int, dtype: torch.dtype, device: torch.device, *, alibi_slopes: Optional[Tensor],
                   attn_mask: Optional[Tensor], is_causal: bool) -> Tensor:
    """ALiBi, attn_mask and the causal mask as one additive bias broadcastable to (B, H, Nq, Nk), −inf where
    masked; a 0-dim zero when there is none. Queries sit at the last Nq key positions."""
    zero = torch.zeros((), dtype=dtype, device=device)
    bias = zero
    if alibi_slopes is not None:
        dist = (torch.arange(Nk - Nq, Nk, device=device).unsqueeze(-1) - torch.arange(Nk, device=device)).to(dtype)
        bias = -alibi_slopes.detach().to(dtype).view(-1, 1, 1) * dist
    if attn_mask is not None:
        bias = bias + (attn_mask.to(dtype) if attn_mask.dtype != torch.bool else
                       zero.masked_fill(~attn_mask, float("-inf")))
    if is_causal:
        future = torch.arange(Nk, device=device).unsqueeze(0) > torch.arange(Nk - Nq, Nk, device=device).unsqueeze(-1)
        bias = bias + zero.masked_fill(future, float("-inf"))
    return bias


def dense_logits(q: Tensor, k: Tensor, *, scale: float, q_scale: Optional[Tensor] = None,
                 alibi_slopes: Optional[Tensor] = None, attn_mask: Optional[Tensor] = None,
                 is_causal: bool = True) -> Tensor:
    """All logits of `attention`, materialised (B, H, Nq, Nk) in the compute dtype; −inf where masked.
    k must already have H heads (GQA repeated)."""
    _check_mask_dtype(attn_mask)
    Nq, Nk = q.shape[2], k.shape[2]
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    if q_scale is not None:
        q = q * q_scale.unsqueeze(-1).to(q.dtype)
    z = torch.matmul(q.to(cdt), k.to(cdt).transpose(-1, -2)) * scale
    q_pos = torch.arange(Nk - Nq, Nk, device=q.device).unsqueeze(-1)
    k_pos = torch.arange(Nk, device=q.device).unsqueeze(0)
    if alibi_slopes is not None:
        z = z - alibi_slopes.to(cdt).view(1, -1, 1, 1) * (q_pos - k_pos).to(cdt)
    if attn_mask is not None:
        z = z.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else z + attn_mask.to(cdt)
    if is_causal:
        z = z.masked_fill(k_pos > q_pos, float("-inf"))
    return z


def reference_attention(q: Tensor, k: Tensor, v: Tensor, *, name: str, alpha: AlphaLike, is_causal: bool,
                        scale: float, alibi_slopes: Optional[Tensor], q_scale: Optional[Tensor],
                        attn_mask: Optional[Tensor], topk: int, adatemp_order: str) -> Tensor:
    """The obviously-right path: all logits at once, differentiated by autograd."""
    z = dense_logits(q, k, scale=scale, q_scale=q_scale, alibi_slopes=alibi_slopes, attn_mask=attn_mask,
                     is_causal=is_causal)
    if name == "adatemp":
        z = z * adaptive_temperature(z, adatemp_order)
        name = "softmax"
    p = map_scores(z, name, alpha=alpha, topk=topk)
    return torch.matmul(p, v.to(p.dtype)).to(q.dtype)


def apply_bias_and_masks(z: Tensor, first_pos: int, *, alibi_slopes: Optional[Tensor],
                         attn_mask: Optional[Tensor], is_causal: bool) -> Tensor:
    """Adds ALiBi (slopes viewed (1, H, 1, 1)) and masks to logits z (B, H, n, kend) of the query rows
    at absolute positions first_pos … first_pos + n − 1, in place where possible."""
    n, kend = z.shape[-2], z.shape[-1]
    q_pos = torch.arange(first_pos, first_pos + n, dtype=z.dtype, device=z.device).unsqueeze(-1)
    if alibi_slopes is not None:
        dist = q_pos - torch.arange(kend, dtype=z.dtype, device=z.device)
        z = z.sub_(alibi_slopes * dist)
    if attn_mask is not None:
        z = z.masked_fill_(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else z.add_(attn_mask.to(z.dtype))
    if is_causal and kend > first_pos + 1:
        # only keys after the first row's position can be in the future of some row
        tail = z[..., first_pos + 1:]
        future = torch.arange(first_pos + 1, kend, device=z.device).unsqueeze(0) > q_pos.long()
        tail.masked_fill_(future, float("-inf"))
    return z


def map_scores(z: Tensor, name: str, *, alpha: AlphaLike = 1.5, topk: int = 32,
               adatemp_order: str = "original") -> Tensor:
    """Apply a mapping to logits z (…, Nk) along the last axis; −inf entries are masked."""
    name = _ALIASES.get(name, name)
    if name == "softmax":
        return entmax(z, 1.0)
    if name == "entmax":
        return entmax(z, alpha)
    if name == "sparsemax":
        return entmax(z, 2.0)
    if name == "topk":
        kk = min(topk, z.shape[-1])
        thresh = z.topk(kk, dim=-1).values[..., -1:]
        return entmax(z.masked_fill(z < thresh, float("-inf")), 1.0)
    if name == "adatemp":
        return adaptive_temperature_softmax(z, adatemp_order)
    raise ValueError(f"unknown mapping {name!r}")


def adaptive_temperature(z: Tensor, order: str = "original") -> Tensor:
    """Per-row θ = max(1, P(H)) where the entropy H of softmax(z) exceeds 0.5, else 1 (Veličković et
    al., 2024). θ is a constant for the gradient (computed without autograd)."""
    with torch.no_grad():
        p = entmax(z.detach(), 1.0)
        h = -torch.special.xlogy(p, p).sum(-1, keepdim=True)     # 0·log 0 = 0 (masked keys, masked rows)
        poly = torch.zeros_like(h)
        for c in ADATEMP_POLY[order]:
            poly = poly * h + c
        return torch.where(h > 0.5, poly.clamp_min(1.0), torch.ones_like(h))


def adaptive_temperature_softmax(z: Tensor, order: str = "original") -> Tensor:
    """softmax(θ·z) with the adaptive temperature θ of `adaptive_temperature`."""
    return entmax(z * adaptive_temperature(z, order), 1.0)
