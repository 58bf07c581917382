"""The named attention backends. Each declares what it takes, ``supports(call) -> None | reason``, and runs a
call it supports, ``run(call) -> (B, H, Nq, D)``. Every backend is tested equal to `reference` (values and
gradients) by tests/unit/attention/test_backends.py, over every registered backend: registering one here enrols it.

    reference   all logits at once, autograd differentiates everything (also α, ALiBi slopes, a float mask)
    chunked     query blocks with a recomputing backward, pure PyTorch: O(block × Nk) memory, any mapping
    fused_cpu   the C++ kernel, flash-style: key tiles with scale, ALiBi and causal mask, α-entmax solved per
                row, p·v gathered from the support, recomputing backward (CPU)
    fused_dense the kernel's in-place scores pass on all logits at once, p kept for the backward (no recompute):
                short rows with a gradient
    sdpa        torch SDPA for softmax-form mappings: softmax; top-k and adaptive temperature after a
                no-grad pass over the logits (the kept set / θ enter SDPA's mask and q)
    triton      α-entmax flash attention in Triton (attention/triton_entmax.py): CUDA, or CPU tensors
                in Triton's interpreter (TRITON_INTERPRET=1) when named
    adasplash   the adasplash package's α-entmax kernels (CUDA); opt-in, see attention/cuda.py
    flex        torch FlexAttention, compiled, for softmax and adaptive temperature (attention/flex.py):
                ALiBi, causal offsets and key ranges inside the fused kernel (CUDA; CPU inference)

Key ranges (``key_start`` / ``key_end`` of the call, left / right padding): a backend registered with
``key_ranges=True`` reads them itself; for every other one `register` wraps ``supports`` and ``run`` so that
they see the call with the ranges folded into ``attn_mask`` (`AttentionCall.with_key_ranges_as_mask`, a
(B, 1, 1, Nk) bool mask built once per call). A backend that takes no mask then refuses the call, and its
reason says that the key ranges became a mask.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from longsparse import cpu_kernel
from longsparse.attention import cuda, flex
from longsparse.attention.call import AttentionCall
from longsparse.attention.chunked import chunked_attention, fused_attention
from longsparse.attention.fused_dense import fused_dense_attention
from longsparse.attention.logits import additive_bias, bias_shape, dense_logits


@dataclass(frozen=True)
class Backend:
    """supports(call) -> None | reason; run(call) -> (B, H, Nq, D). key_ranges: whether the backend reads
    ``call.key_start`` / ``call.key_end`` natively (else `register` wraps it to see them as a mask)."""

    name: str
    summary: str
    supports: Callable[[AttentionCall], Optional[str]]
    run: Callable[[AttentionCall], Tensor]
    key_ranges: bool = False


BACKENDS: Dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    if not backend.key_ranges:
        backend = _with_key_ranges_as_mask(backend)
    BACKENDS[backend.name] = backend
    return backend


def _with_key_ranges_as_mask(backend: Backend) -> Backend:
    """The backend, taking calls with key ranges as calls with the equivalent attn_mask."""
    supports, run = backend.supports, backend.run

    def masked_supports(call: AttentionCall) -> Optional[str]:
        if not call.has_key_ranges:
            return supports(call)
        reason = supports(call.with_key_ranges_as_mask())
        if (
            reason is not None
            and call.attn_mask is None
            and supports(dataclasses.replace(call, key_start=None, key_end=None)) is None
        ):
            reason = f"key_start / key_end reach it as an attn_mask, and {reason}"
        return reason

    def masked_run(call: AttentionCall) -> Tensor:
        return run(call.with_key_ranges_as_mask())

    return dataclasses.replace(backend, supports=masked_supports, run=masked_run)


_NO_BIAS_GRAD = "does not differentiate alpha, alibi_slopes or attn_mask (use backend='reference')"


# ----------------------------------------------------------------------------- reference


def _reference_run(call: AttentionCall) -> Tensor:
    k, v = call.kv_heads_repeated()
    z = dense_logits(
        call.q,
        k,
        scale=call.scale,
        q_scale=call.q_scale,
        alibi_slopes=call.alibi_slopes,
        attn_mask=call.attn_mask,
        is_causal=call.is_causal,
    )
    p = call.mapping(z)
    return torch.matmul(p, v.to(p.dtype)).to(call.q.dtype)


register(
    Backend(
        "reference",
        "materialises all (B, H, Nq, Nk) logits; autograd differentiates every input",
        lambda call: None,
        _reference_run,
    )
)


# ----------------------------------------------------------------------------- chunked, fused_cpu


def _chunked_supports(call: AttentionCall) -> Optional[str]:
    return _NO_BIAS_GRAD if call.grad_of_bias else None


def _fused_supports(call: AttentionCall) -> Optional[str]:
    if call.device_type != "cpu":
        return f"tensors on {call.device_type}: the kernel reads CPU memory only"
    if not cpu_kernel.enabled():
        return "disabled by LONGSPARSE_KERNEL=0"
    if call.grad_of_bias:
        return _NO_BIAS_GRAD
    alpha = call.mapping.alpha
    if alpha is None:
        return f"mapping {call.mapping_name!r} is not α-entmax of the logits (the kernel solves α-entmax rows)"
    if isinstance(alpha, Tensor) and not (
        alpha.dim() == 4 and alpha.shape[0] == 1 and alpha.shape[2] == alpha.shape[3] == 1
    ):
        return f"α of shape {tuple(alpha.shape)}: the kernel takes one α per head"
    if call.attn_mask is not None:
        return "attn_mask: the kernel applies only the causal mask"
    if cpu_kernel.get() is None:
        return "not available: the C++ kernel could not be built (see the warning)"
    return None


def _fused_cpu_supports(call: AttentionCall) -> Optional[str]:
    if call.v.shape[-1] != call.q.shape[-1]:
        return f"value head dim {call.v.shape[-1]} differs from q/k's {call.q.shape[-1]}: the kernel takes one head dim"
    return _fused_supports(call)


register(
    Backend(
        "chunked",
        "query blocks with a recomputing backward (PyTorch): O(block × Nk) memory",
        _chunked_supports,
        chunked_attention,
    )
)
register(
    Backend(
        "fused_cpu",
        "flash-style C++ kernel: key tiles, α-entmax solved per row, p·v from the support "
        "(CPU): O(block × tile) memory",
        _fused_cpu_supports,
        fused_attention,
        key_ranges=True,
    )
)


# ----------------------------------------------------------------------------- fused_dense

register(
    Backend(
        "fused_dense",
        "all logits at once through the C++ kernel, p kept for the backward (CPU; short rows)",
        _fused_supports,
        fused_dense_attention,
    )
)


# ----------------------------------------------------------------------------- sdpa


def _sdpa_supports(call: AttentionCall) -> Optional[str]:
    if not call.mapping.softmax_form:
        return f"mapping {call.mapping_name!r} is not a softmax"
    if call.grad_of_bias:
        return _NO_BIAS_GRAD
    return None


def _sdpa_run(call: AttentionCall) -> Tensor:
    """torch SDPA (fused kernels on CPU and CUDA; a fully masked row gives 0). SDPA's own causal flag aligns
    queries top-left, so decoding (Nq < Nk) and ALiBi need an explicit bias; so does a scale ≤ 0, since the
    flag's −inf is multiplied by the scale (0 · −inf = NaN). Top-k and adaptive temperature: one pass over the
    logits without autograd picks the kept set / θ (no gradient through either), which then enter as −inf in
    the bias / as a factor of q and the bias: one differentiated attention. Softmax without gradient whose
    bias would exceed auto's SDPA limit runs in query blocks (`_sdpa_query_blocks`), each bias within it."""
    q = call.q
    k, v = call.kv_heads_repeated()
    B, H, Nq, Nk, _ = call.shape
    if call.q_scale is not None:
        q = q * call.q_scale.unsqueeze(-1).to(q.dtype)
    m = call.mapping
    simple = call.alibi_slopes is None and call.attn_mask is None
    if not m.adjusts_logits and simple and (not call.is_causal or (Nq == Nk and call.scale > 0)):
        return F.scaled_dot_product_attention(q, k, v, is_causal=call.is_causal, scale=call.scale)
    if not m.adjusts_logits and not call.wants_grad:
        rows = _sdpa_rows_per_block(call)
        if rows < Nq:
            return _sdpa_query_blocks(call, q, k, v, rows)
    theta = None
    with torch.no_grad():
        bias = additive_bias(
            B,
            H,
            Nq,
            Nk,
            dtype=q.dtype,
            device=q.device,
            alibi_slopes=call.alibi_slopes,
            attn_mask=call.attn_mask,
            is_causal=call.is_causal,
        )
        if m.adjusts_logits:
            z = dense_logits(
                q,
                k,
                scale=call.scale,
                alibi_slopes=call.alibi_slopes,
                attn_mask=call.attn_mask,
                is_causal=call.is_causal,
            )
            theta, dropped = m.softmax_adjustment(z)
            if theta is not None:
                theta = theta.to(q.dtype)
                bias = None if bias is None else theta * bias  # θ ≥ 1 keeps −inf at −inf
            if dropped is not None:
                drop = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(dropped, float("-inf"))
                bias = drop if bias is None else bias + drop
        bias = None if bias is None else bias.expand(B, H, Nq, Nk)
    if theta is not None:
        q = q * theta
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=call.scale)


# Largest bias (softmax: per batch row, H·Nq·Nk with ALiBi, else Nq·Nk) or logits tensor (top-k, adaptive
# temperature: B·H·Nq·Nk) that the sdpa backend materialises at once, 64 MiB of fp32: auto's limit for sdpa, past
# which softmax without gradient runs in blocks of query rows.
SDPA_MAX_ELEMENTS = 1 << 24


def sdpa_bias_row_elements(call: AttentionCall) -> int:
    """Elements of the bias sdpa builds per batch row and query row: heads × keys (the heads of the ALiBi
    slopes or of the mask, else 1). Auto's SDPA limit and the query blocks both count with it."""
    _, H, _, Nk, _ = call.shape
    shape = bias_shape(1, H, 1, Nk, alibi_slopes=call.alibi_slopes, attn_mask=call.attn_mask)
    return shape[1] * shape[3]


def _sdpa_rows_per_block(call: AttentionCall) -> int:
    """Query rows whose bias stays within `SDPA_MAX_ELEMENTS`; at least 1."""
    return max(1, SDPA_MAX_ELEMENTS // sdpa_bias_row_elements(call))


def _sdpa_query_blocks(call: AttentionCall, q: Tensor, k: Tensor, v: Tensor, rows: int) -> Tensor:
    """Softmax without gradient as SDPA over blocks of `rows` query rows, each with its own bias (its rows'
    ALiBi distances and masks, against the keys it can see: under causal masking up to its last row's
    position), so no bias larger than a block's is ever built. Equal to one SDPA call with the whole bias.
    q (B, H, Nq, D) already scaled by q_scale; k, v (B, H, Nk, D) with the kv heads repeated."""
    B, H, Nq, Nk, _ = call.shape
    first = call.first_pos
    out = q.new_empty((B, H, Nq, v.shape[-1]))
    mask = call.attn_mask
    for s in range(0, Nq, rows):
        e = min(Nq, s + rows)
        kend = min(Nk, first + e) if call.is_causal else Nk
        block_mask = None if mask is None else mask[..., slice(s, e) if mask.shape[-2] != 1 else slice(None), :kend]
        bias = additive_bias(
            B,
            H,
            e - s,
            kend,
            dtype=q.dtype,
            device=q.device,
            alibi_slopes=call.alibi_slopes,
            attn_mask=block_mask,
            is_causal=call.is_causal,
            first_pos=first + s,
        )
        out[:, :, s:e] = F.scaled_dot_product_attention(
            q[:, :, s:e], k[:, :, :kend], v[:, :, :kend], attn_mask=bias.expand(B, H, e - s, kend), scale=call.scale
        )
    return out


register(
    Backend(
        "sdpa",
        "torch scaled_dot_product_attention for softmax, top-k and adaptive temperature",
        _sdpa_supports,
        _sdpa_run,
    )
)


# ----------------------------------------------------------------------------- triton

_TRITON: Dict[str, object] = {}


def triton_module():
    """(attention/triton_entmax.py as a module or None, why not), imported on first use."""
    if "module" not in _TRITON:
        try:
            _TRITON["module"], _TRITON["why"] = importlib.import_module("longsparse.attention.triton_entmax"), None
        except Exception as exc:  # noqa: BLE001 - any import failure means: not available, and why
            _TRITON["module"], _TRITON["why"] = None, f"not available: {type(exc).__name__}: {exc}"
    return _TRITON["module"], _TRITON["why"]


def _triton_supports(call: AttentionCall) -> Optional[str]:
    mod, why = triton_module()
    return why if mod is None else mod.supports_call(call)


def _triton_run(call: AttentionCall) -> Tensor:
    mod, why = triton_module()
    if mod is None:
        raise RuntimeError(why)
    return mod.run_call(call)


register(
    Backend(
        "triton",
        "α-entmax flash attention in Triton (CUDA; CPU under TRITON_INTERPRET=1 when named)",
        _triton_supports,
        _triton_run,
        key_ranges=True,
    )
)


# ----------------------------------------------------------------------------- adasplash

register(Backend("adasplash", "the adasplash package's α-entmax kernels (CUDA); opt-in", cuda.supports, cuda.run))


# ----------------------------------------------------------------------------- flex

register(
    Backend(
        "flex",
        "torch FlexAttention (compiled) for softmax and adaptive temperature: ALiBi, causal offsets and key "
        "ranges in the fused kernel (CUDA; CPU inference)",
        flex.supports,
        flex.flex_attention_run,
        key_ranges=True,
    )
)
