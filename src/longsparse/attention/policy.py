"""How ``backend="auto"`` chooses: `select_backend`, the one policy, and the `Choice` it returns (what
`explain_attention` shows). A named backend is never replaced: if it cannot take the call, `resolve_backend`
raises with its reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import torch

from longsparse.attention.backends import BACKENDS, sdpa
from longsparse.attention.call import AttentionCall

# Short rows that auto differentiates through the materialised logits with autograd (reference) instead of the
# chunked backends' recomputing backward, which costs a second forward: 0.70-0.95x their time for entmax at
# 32-64 keys (`longsparse bench short`), training at the synthetic tasks' lengths.
REFERENCE_MAX_KEYS = 64
REFERENCE_MAX_ELEMENTS = 1 << 22  # and at most this many logits (a few such buffers are kept)
# Rows that auto differentiates through fused_dense (the kernel on all logits at once, p kept for the backward)
# instead of fused_cpu (flash-style, recomputing backward): fwd+bwd CPU time against fused_cpu for 1.5-entmax
# 0.82-0.89x at 64 keys, 0.87-0.95x at 96, 0.89-1.15x at 128; sparsemax 1.20-1.49x at every length
# (benchmarks/short_rows_policy.py, docs/benchmarks.md).
FUSED_DENSE_MAX_KEYS = 96
FUSED_DENSE_MAX_ELEMENTS = 1 << 22  # p is kept until the backward: 16 MiB of fp32 per call

OPT_IN = {"adasplash": "opt-in (name it): not yet measured equal to the reference on a GPU"}


@dataclass
class Choice:
    """The backend for one call, why, and why each other backend was passed over."""

    backend: str
    why: str
    passed_over: Dict[str, str] = field(default_factory=dict)
    call: str = ""

    def as_dict(self) -> dict:
        return {"backend": self.backend, "why": self.why, "passed_over": dict(self.passed_over), "call": self.call}

    def __str__(self) -> str:
        width = max(map(len, [self.backend, *self.passed_over]))
        lines = [f"attention{' ' + self.call if self.call else ''}", f"  -> {self.backend:<{width}}  {self.why}"]
        lines += [f"     {name:<{width}}  {reason}" for name, reason in self.passed_over.items()]
        return "\n".join(lines)


def describe(call: AttentionCall) -> str:
    B, H, Nq, Nk, D = call.shape
    parts = [
        call.mapping_name,
        f"B={B} H={H}" + (f"/{call.k.shape[1]}" if call.k.shape[1] != H else ""),
        f"Nq={Nq} Nk={Nk} D={D}",
        str(call.q.dtype).replace("torch.", ""),
        call.device_type,
        "causal" if call.is_causal else "non-causal",
    ]
    parts += [
        name
        for name, t in (
            ("alibi", call.alibi_slopes),
            ("q_scale", call.q_scale),
            ("mask", call.attn_mask),
            ("key_start", call.key_start),
            ("key_end", call.key_end),
        )
        if t is not None
    ]
    if call.wants_grad or call.grad_of_bias:
        parts.append("grad")
    return "(" + ", ".join(parts) + ")"


def _sdpa_gate(call: AttentionCall) -> Optional[str]:
    """Why auto does not give this call to sdpa although sdpa could take it (None: it does)."""
    if call.chunk_size is not None:
        return "chunk_size was given: auto keeps to the chunked backends"
    B, H, Nq, Nk, _ = call.shape
    if call.mapping.adjusts_logits:
        n = B * H * Nq * Nk
        if n > sdpa.SDPA_MAX_ELEMENTS:
            return f"its no-grad pass would materialise {n:,} logits (auto's limit: {sdpa.SDPA_MAX_ELEMENTS:,})"
        return None
    needs_bias = (
        call.alibi_slopes is not None
        or call.attn_mask is not None
        or call.has_key_ranges
        or (call.is_causal and (Nq != Nk or call.scale <= 0))
    )
    n = sdpa.bias_row_elements(call) * Nq
    if needs_bias and n > sdpa.SDPA_MAX_ELEMENTS:
        if call.device_type == "cuda" and not call.wants_grad:
            # sdpa runs such a call in query blocks, each bias within the limit; on the CPU fused_cpu is
            # there for long rows, on CUDA the alternative is the chunked path (unfused PyTorch ops)
            return None
        return f"its bias would hold {n:,} elements per batch row (auto's limit: {sdpa.SDPA_MAX_ELEMENTS:,})"
    return None


def _flex_gate(call: AttentionCall) -> Optional[str]:
    """Why auto does not give this call to flex although flex could take it (None: it does)."""
    if call.device_type != "cuda":
        # torch's CPU FlexAttention is inference only, and slower there than sdpa / fused_cpu
        # (docs/benchmarks.md, "FlexAttention")
        return f"tensors on {call.device_type}: auto uses flex for CUDA tensors only"
    if call.chunk_size is not None:
        return "chunk_size was given: auto keeps to the chunked backends"
    if call.mapping.adjusts_logits:
        return None
    B, H, Nq, Nk, _ = call.shape
    if call.alibi_slopes is None and not call.has_key_ranges and not (call.is_causal and (Nq != Nk or call.scale <= 0)):
        return "no ALiBi, key range or decoding offset: SDPA's flash kernel takes the call as it is"
    n = sdpa.bias_row_elements(call) * Nq
    if n <= sdpa.SDPA_MAX_ELEMENTS:
        # flex compiles one kernel per call shape: short rows (training batches, decoding steps whose key count
        # grows by one) would recompile often, while their dense bias is small
        return f"its bias holds {n:,} elements per batch row (≤ {sdpa.SDPA_MAX_ELEMENTS:,}): SDPA with a dense bias"
    return None


def _short_rows_gate(call: AttentionCall, what: str, max_keys: int, max_elements: int) -> Optional[str]:
    """Why auto does not differentiate this call through all its logits at once (fused_dense, reference: rule
    4) although the backend could take it (None: it does)."""
    B, H, Nq, Nk, _ = call.shape
    if call.chunk_size is not None:
        return "chunk_size was given: auto keeps to the chunked backends"
    if not call.wants_grad:
        return "no gradient is needed (auto takes it for gradients through short rows)"
    alpha = call.mapping.alpha
    if isinstance(alpha, (int, float)) and alpha >= 2:
        # sparsemax rows are fused_cpu's cheapest: either other backend takes 1.2-2.7x its time (short_rows_policy.py)
        return "α = 2 (sparsemax): fused_cpu's recomputing backward is faster"
    if Nk > max_keys or B * H * Nq * Nk > max_elements:
        return (
            f"rows too long for {what} ({Nk} keys, {B * H * Nq * Nk:,} logits; auto's limits: "
            f"{max_keys} keys, {max_elements:,} logits)"
        )
    return None


def _fused_dense_gate(call: AttentionCall) -> Optional[str]:
    return _short_rows_gate(call, "keeping p for the backward", FUSED_DENSE_MAX_KEYS, FUSED_DENSE_MAX_ELEMENTS)


def _short_reference_gate(call: AttentionCall) -> Optional[str]:
    why = _short_rows_gate(call, "the dense backward", REFERENCE_MAX_KEYS, REFERENCE_MAX_ELEMENTS)
    # under autocast the chunked backends keep their logits in float32; the reference's matmul would not
    if why is None and torch.is_autocast_enabled(call.q.device.type):
        return "autocast is on (the chunked backends keep float32 logits)"
    return why


def select_backend(
    call: AttentionCall, *, supports: Optional[Callable[[str], Optional[str]]] = None, complete: bool = False
) -> Choice:
    """The auto policy. The first rule that applies picks:

    1. CUDA tensors: ``triton`` when it supports the call.
    2. α, ALiBi slopes or a float mask that needs a gradient: ``reference`` (no other backend gives those).
    2b. CUDA tensors, no chunk_size: ``flex`` when it supports the call and the call is softmax with ALiBi
       slopes, key ranges or a causal decoding offset (what SDPA takes only as a dense bias) whose bias would
       exceed `SDPA_MAX_ELEMENTS` per batch row (flex compiles per call shape: short rows stay on sdpa), or
       adaptive temperature (flex needs no materialised logits for its θ).
    3. A softmax-form mapping (softmax, top-k, adaptive temperature), no chunk_size, and what SDPA must
       materialise within `SDPA_MAX_ELEMENTS`: ``sdpa``; on CUDA also plain softmax without gradient beyond
       it (sdpa then runs in query blocks, each bias within the limit).
    4. A gradient through short rows, no chunk_size: ``fused_dense`` when it takes the call (≤
       `FUSED_DENSE_MAX_KEYS` keys, ≤ `FUSED_DENSE_MAX_ELEMENTS` logits); else ``reference`` (≤
       `REFERENCE_MAX_KEYS` keys, ≤ `REFERENCE_MAX_ELEMENTS` logits, no autocast).
    5. ``fused_cpu`` when it supports the call, else ``chunked``, else ``reference``.
    ``adasplash`` is never picked (opt-in).

    supports(name) -> None | reason replaces the backends' own `supports` (tests). complete=True also asks
    every backend that the policy did not reach for its reason (`explain_attention`); auto itself asks only
    the ones it reaches."""
    asked: Dict[str, Optional[str]] = {}

    def refusal(name: str) -> Optional[str]:
        if name not in asked:
            asked[name] = supports(name) if supports is not None else BACKENDS[name].supports(call)
        return asked[name]

    passed: Dict[str, str] = {}

    def consider(name: str, gate: Optional[str]) -> bool:
        """Whether `name` is picked; else records why not (its own refusal first, then the policy's)."""
        if gate is not None and not complete:
            passed.setdefault(name, gate)
            return False
        reason = refusal(name) or gate
        if reason is None:
            return True
        passed.setdefault(name, reason)
        return False

    def pick(name: str, why: str) -> Choice:
        for other in BACKENDS:
            if other == name or other in passed:
                continue
            reason = refusal(other) if complete else None
            passed[other] = reason or OPT_IN.get(other) or f"auto picked {name} earlier in its order"
        passed.pop(name, None)
        return Choice(name, why, {n: passed[n] for n in BACKENDS if n in passed}, describe(call) if complete else "")

    if consider(
        "triton",
        None
        if call.device_type == "cuda"
        else f"tensors on {call.device_type}: auto uses triton for CUDA tensors only",
    ):
        return pick("triton", "CUDA tensors, and the Triton kernels take the call")
    if call.grad_of_bias:
        return pick("reference", "α, the ALiBi slopes or the mask need a gradient: only the reference gives it")
    if consider("flex", _flex_gate(call)):
        return pick(
            "flex",
            "CUDA softmax with ALiBi, key ranges or a decoding offset: FlexAttention applies them inside its fused "
            "kernel (SDPA takes them only as a dense bias, off its flash kernel)"
            if not call.mapping.adjusts_logits
            else f"{call.mapping_name} on CUDA: two FlexAttention passes (the rows' entropies, then the "
            "re-tempered softmax), no logits materialised",
        )
    if consider("sdpa", _sdpa_gate(call)):
        return pick(
            "sdpa",
            "softmax: torch SDPA"
            if not call.mapping.adjusts_logits
            else f"{call.mapping_name} is a softmax after a per-row choice without gradient: one no-grad pass "
            "over the logits, then torch SDPA",
        )
    if consider("fused_dense", _fused_dense_gate(call)):
        return pick(
            "fused_dense",
            f"a gradient through short rows (≤ {FUSED_DENSE_MAX_KEYS} keys): the kernel on all "
            "logits at once, p kept for the backward instead of a recomputed forward",
        )
    short = _short_reference_gate(call)
    if short is None:
        return pick(
            "reference",
            f"a gradient through short rows (≤ {REFERENCE_MAX_KEYS} keys): autograd through "
            "the logits beats the chunked backends' recomputing backward",
        )
    passed["reference"] = short
    if consider("fused_cpu", None):
        return pick("fused_cpu", "the C++ kernel takes the call: chunked blocks, one fused pass each")
    if consider("chunked", None):
        return pick("chunked", "query blocks with a recomputing backward: O(block × Nk) memory")
    passed.pop("reference")
    return pick("reference", "no faster backend takes the call")


def load_backends(device_type: str) -> None:
    """Imports what the backends' `supports` load on first use (the Triton module, FlexAttention's build
    check), so that a model traced by torch.compile finds them loaded instead of tracing the imports."""
    from longsparse.attention import flex
    from longsparse.attention.backends.triton import triton_module

    triton_module()
    flex.build_reason(device_type)


def resolve_backend(call: AttentionCall, backend: str) -> str:
    """The backend that runs the call: the auto policy's choice, or the named one if it supports the call
    (else ValueError with its reason: a named backend is never replaced)."""
    if backend == "auto":
        return select_backend(call).backend
    check_backend_name(backend)
    reason = BACKENDS[backend].supports(call)
    if reason is not None:
        raise ValueError(f"backend {backend!r} cannot take this call: {reason}")
    return backend


def check_backend_name(backend: str) -> None:
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose auto or one of {', '.join(BACKENDS)}")
