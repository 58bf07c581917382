"""attention(q, k, v, ...): one function for every mapping, bias and mask, run by a named backend.

Logits z_ij = (q_i · s_i) · k_j · scale − m_h · (i − j) + mask (attention/logits.py), mapped row by row
(mappings/registry.py). The backend is named (``backend=``) or chosen by the documented auto policy
(attention/policy.py); `explain_attention` says which and why.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from longsparse.attention.backends import BACKENDS
from longsparse.attention.call import make_call
from longsparse.attention.policy import Choice, check_backend_name, resolve_backend, select_backend
from longsparse.mappings.entmax import AlphaLike


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mapping: str = "entmax",
    alpha: AlphaLike = 1.5,
    is_causal: bool = True,
    scale: Optional[float] = None,
    alibi_slopes: Optional[Tensor] = None,
    q_scale: Optional[Tensor] = None,
    attn_mask: Optional[Tensor] = None,
    chunk_size: Optional[int] = None,
    topk: int = 32,
    adatemp_order: str = "original",
    key_start: Optional[Tensor] = None,
    key_end: Optional[Tensor] = None,
    tolerance: Optional[float] = None,
    backend: str = "auto",
) -> Tensor:
    """Attention on (B, H, N, D) tensors with any mapping; returns (B, H, Nq, Dv).

    q (B, H, Nq, D); k (B, Hkv, Nk, D); v (B, Hkv, Nk, Dv), H a multiple of Hkv (GQA), Nq ≤ Nk: the queries
    sit at the last Nq key positions (decoding), causal masking is bottom-right aligned.
    mapping: softmax | entmax (α = ``alpha``: float ≥ 1 or per-head (H,) tensor; 1 is softmax) | sparsemax |
    topk (softmax over the ``topk`` largest logits) | adatemp (adaptive temperature, ``adatemp_order``
    original or reversed). The model methods ssmax / asentmax are accepted as softmax / entmax *with* their
    scales in q_scale (without, they raise).
    alibi_slopes: (H,) slopes m, bias −m·|i − j| with i the query's key position: Press et al.'s −m·(i − j)
    on the keys a causal row sees, symmetric in the distance when not causal (flash-attn's form).
    q_scale: (B, H, Nq) multiplier of q (not of the bias).
    attn_mask: bool (True = attend) or float (added), broadcastable to (B, H, Nq, Nk); integer masks are
    refused, as are NaN or ±inf in q, k, v, q_scale, alibi_slopes, scale (and NaN / +inf in a float mask).
    key_start, key_end: (B,) integer tensors (None: 0 and Nk): batch row b attends only to the keys
    key_start[b] ≤ j < key_end[b] — left and right padding of a batch of sequences of different lengths,
    without a (B, Nk) mask. They combine with attn_mask and the causal mask (a key must pass all three);
    positions for ALiBi and causality stay the key indices. The Triton kernels take them natively, every
    other backend as the equivalent (B, 1, 1, Nk) bool mask.
    A query that can attend to nothing gets a zero output.
    chunk_size: queries per block of the chunked backends (None = automatic).
    tolerance: α-entmax only. None (default): τ is exact on every backend. A float ε in (0, 0.5] lets the
    Triton kernels stop a row's threshold solve once |Σp − 1| ≤ ε and renormalise (‖p̂ − p‖₁ ≤ 2ε per row;
    docs/architecture.md, "Tolerance mode"); the other backends solve exactly, which meets any ε.
    backend: "auto" (the policy of `longsparse.attention.policy.select_backend`; `explain_attention` says
    what it picks and why) or one of reference, chunked, fused_cpu, sdpa, triton, adasplash: a named backend
    that cannot take the call raises with the reason. Only reference differentiates alpha, alibi_slopes
    and a float attn_mask.
    """
    check_backend_name(backend)
    call = make_call(
        q,
        k,
        v,
        mapping=mapping,
        alpha=alpha,
        is_causal=is_causal,
        scale=scale,
        alibi_slopes=alibi_slopes,
        q_scale=q_scale,
        attn_mask=attn_mask,
        chunk_size=chunk_size,
        topk=topk,
        adatemp_order=adatemp_order,
        key_start=key_start,
        key_end=key_end,
        tolerance=tolerance,
    )
    return BACKENDS[resolve_backend(call, backend)].run(call)


def explain_attention(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Choice:
    """Which backend ``attention(q, k, v, **kwargs)`` runs and why, with the reason each other backend was
    passed over. Takes `attention`'s keywords and validates them as it does; a named backend that cannot
    take the call raises as there. ``str()`` of the result is a readable table."""
    backend = kwargs.pop("backend", "auto")
    check_backend_name(backend)
    call = make_call(q, k, v, **kwargs)
    auto = select_backend(call, complete=True)
    if backend == "auto":
        return auto
    backend = resolve_backend(call, backend)
    passed = {name: f"not named (auto would pick {auto.backend})" for name in BACKENDS if name != backend}
    return Choice(backend, "named by the caller", passed, auto.call)
