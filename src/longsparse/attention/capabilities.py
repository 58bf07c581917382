"""What an attention backend takes, as data: `Capabilities`, and `check(capabilities, call)`, the one function
that compares an `AttentionCall` with it and says in one line why the backend cannot take the call. `table`
renders the same data as the markdown table in docs/architecture.md (``python -m longsparse.attention.backends
--table`` prints it, ``--update docs/architecture.md`` writes it there), so the documented capabilities are the
checked ones.

The refusal phrases live here (`alpha_range_reason`, `dtype_reason`, ...) because the Triton module's own
``supports`` (for direct callers of its kernels) answers with the same words as the triton backend's data."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

from longsparse.attention.call import AttentionCall
from longsparse.mappings.registry import MAPPING_NAMES

# The mappings by kind: α-entmax of the logits (softmax: α = 1, sparsemax: α = 2), softmax forms (softmax of θ·z
# over a kept set). An `entmax` call with α = 1 is a softmax for a backend that takes softmax.
ALPHA_ENTMAX = ("softmax", "entmax", "sparsemax")
SOFTMAX_FORMS = ("softmax", "topk", "adatemp")
GRAD_OF_BIAS = ("alpha", "alibi_slopes", "attn_mask")


@dataclass(frozen=True)
class Capabilities:
    """What a backend takes on some devices; every field is checked by `check` and shown by `table`.

    devices: device types (None: any). dtypes: q, k, v share one of these (None: any floating dtypes).
    head_dims: the q/k head dims taken (None: any); min_head_dim: the least of q/k's and v's head dims;
    value_head_dim: whether v's head dim may differ from q/k's. mappings: mapping names taken (an α = 1 entmax
    counts as softmax); alpha: α-entmax mappings only with α in (lo, hi] (None: any α ≥ 1); alpha_tensor: "any"
    (α of any shape broadcasting over the rows), "per_head" (a scalar or one α per head), "none" (a float
    only). attn_mask, alibi, q_scale, decoding (Nq < Nk), gqa (fewer key/value heads than query heads): taken or
    not. key_ranges: key_start / key_end read natively (else they reach the backend as an attn_mask).
    min_length / power_of_two_length: the query rows it takes. grad: gradients of q, k, v and q_scale;
    grad_of_bias: gradients of α, the ALiBi slopes and a float mask. notes: per field name (or ``mapping
    NAME``), why, said after the refusal's own words."""

    devices: Optional[Tuple[str, ...]] = None
    dtypes: Optional[Tuple[torch.dtype, ...]] = None
    head_dims: Optional[Tuple[int, ...]] = None
    min_head_dim: int = 1
    value_head_dim: bool = True
    mappings: Tuple[str, ...] = MAPPING_NAMES
    alpha: Optional[Tuple[float, float]] = None
    alpha_tensor: str = "any"
    attn_mask: bool = True
    key_ranges: bool = False
    alibi: bool = True
    q_scale: bool = True
    decoding: bool = True
    gqa: bool = True
    min_length: int = 1
    power_of_two_length: bool = False
    grad: bool = True
    grad_of_bias: bool = False
    notes: Dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self):
        names = {f.name for f in fields(self)} | {f"mapping {m}" for m in MAPPING_NAMES}
        unknown = sorted(set(self.notes) - names)
        if unknown:
            raise ValueError(f"notes for unknown capabilities: {', '.join(unknown)}")
        unknown = sorted(set(self.mappings) - set(MAPPING_NAMES))
        if unknown:
            raise ValueError(f"unknown mappings in capabilities: {', '.join(unknown)}")
        if self.alpha_tensor not in ("any", "per_head", "none"):
            raise ValueError(f"alpha_tensor must be 'any', 'per_head' or 'none'; got {self.alpha_tensor!r}")

    def takes_device(self, device_type: str) -> bool:
        return self.devices is None or device_type in self.devices


# ----------------------------------------------------------------------------- the refusal phrases


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _one_of(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def interval(alpha: Tuple[float, float]) -> str:
    return f"({alpha[0]:g}, {alpha[1]:g}]"


def dtype_reason(dtypes: Sequence[torch.dtype], q: Tensor, k: Tensor, v: Tensor) -> Optional[str]:
    """Why q, k, v's dtypes are not taken (they must share one of `dtypes`), or None."""
    if not q.dtype == k.dtype == v.dtype:
        return f"q, k, v dtypes differ: {', '.join(dtype_name(t.dtype) for t in (q, k, v))}"
    if q.dtype not in dtypes:
        return f"dtype {dtype_name(q.dtype)} is not {_one_of([dtype_name(d) for d in dtypes])}"
    return None


def head_dim_reason(head_dims: Sequence[int], d: int) -> Optional[str]:
    return None if d in head_dims else f"head dim {d} not one of {tuple(head_dims)}"


def value_head_dim_reason(d: int, dv: int) -> Optional[str]:
    return None if dv == d else f"value head dim {dv} differs from q/k's {d}"


def alpha_range_reason(alpha: Tuple[float, float], value) -> Optional[str]:
    """Why α (a float, or a tensor checked only on the CPU: reading a CUDA tensor would synchronise) is
    outside (lo, hi], or None."""
    lo, hi = alpha
    if isinstance(value, Tensor):
        if value.device.type != "cpu" or torch.compiler.is_compiling():
            return None
        a = value.detach()
        return None if bool(((a > lo) & (a <= hi)).all()) else f"per-head α outside {interval(alpha)}"
    return None if lo < float(value) <= hi else f"α = {float(value):g} outside {interval(alpha)}"


def grad_of_bias_reason(which: str) -> str:
    return f"{which} requires grad: does not differentiate {_one_of(GRAD_OF_BIAS)} (use backend='reference')"


# ----------------------------------------------------------------------------- the check


def _mapping_reason(caps: Capabilities, call: AttentionCall) -> Optional[str]:
    m, name = call.mapping, call.mapping_name
    if name in caps.mappings or (m.softmax_form and not m.adjusts_logits and "softmax" in caps.mappings):
        return None
    note = caps.notes.get(f"mapping {name}")
    if note:
        return f"mapping {name!r} {note}"
    if set(caps.mappings) <= set(SOFTMAX_FORMS) and "softmax" in caps.mappings:
        kind = "a softmax"
    elif set(caps.mappings) <= set(ALPHA_ENTMAX):
        kind = "α-entmax"
    else:
        kind = f"one of {', '.join(caps.mappings)}"
    return f"mapping {name!r} is not {kind}"


def _alpha_reason(caps: Capabilities, call: AttentionCall):
    """(field, reason) when α lies outside `alpha_tensor` or `alpha`, else None."""
    alpha = call.mapping.alpha
    if alpha is None:
        return None
    if isinstance(alpha, Tensor):
        if caps.alpha_tensor == "none":
            return "alpha_tensor", "α as a tensor: one α for all heads only (no per-head α)"
        # `make_call` views a tensor α to broadcast over (B, H, Nq, Nk): per head is (1, H or 1, 1, 1)
        per_head = alpha.dim() == 4 and alpha.shape[0] == 1 and alpha.shape[2] == alpha.shape[3] == 1
        if caps.alpha_tensor == "per_head" and not per_head:
            return "alpha_tensor", f"α of shape {tuple(alpha.shape)}: not one α per head"
    reason = None if caps.alpha is None else alpha_range_reason(caps.alpha, alpha)
    return None if reason is None else ("alpha", reason)


def _first_reason(caps: Capabilities, call: AttentionCall):
    """(field, reason) of the first capability the call lies outside, or None."""
    B, H, Nq, Nk, D = call.shape
    dv = call.v.shape[-1]
    if not caps.takes_device(call.device_type):
        return "devices", f"tensors on {call.device_type}"
    reason = _mapping_reason(caps, call)
    if reason:
        return "mappings", reason
    found = _alpha_reason(caps, call)
    if found:
        return found
    if not caps.grad_of_bias and call.grad_of_bias:
        which = next(n for n in GRAD_OF_BIAS if isinstance(getattr(call, n), Tensor) and getattr(call, n).requires_grad)
        return "grad_of_bias", grad_of_bias_reason(which)
    if not caps.grad and call.wants_grad:
        return "grad", "a gradient of q, k, v or q_scale"
    if caps.dtypes is not None:
        reason = dtype_reason(caps.dtypes, call.q, call.k, call.v)
        if reason:
            return "dtypes", reason
    if not caps.value_head_dim and dv != D:
        return "value_head_dim", value_head_dim_reason(D, dv)
    if caps.head_dims is not None and D not in caps.head_dims:
        return "head_dims", head_dim_reason(caps.head_dims, D)
    if min(D, dv) < caps.min_head_dim:
        return "min_head_dim", f"head dim {min(D, dv)} < {caps.min_head_dim}"
    if not caps.decoding and Nq != Nk:
        return "decoding", f"decoding (Nq = {Nq} < Nk = {Nk})"
    if Nq < caps.min_length or (caps.power_of_two_length and Nq & (Nq - 1)):
        need = f"a power of two ≥ {caps.min_length}" if caps.power_of_two_length else f"≥ {caps.min_length}"
        return "min_length", f"length {Nq}: needs {need}"
    if not caps.attn_mask and call.attn_mask is not None:
        return "attn_mask", "attn_mask"
    if not caps.alibi and call.alibi_slopes is not None:
        return "alibi", "ALiBi slopes"
    if not caps.q_scale and call.q_scale is not None:
        return "q_scale", "q_scale"
    if not caps.gqa and call.k.shape[1] != H:
        return "gqa", f"GQA ({H} query heads, {call.k.shape[1]} key/value heads)"
    return None


def check(capabilities: Capabilities, call: AttentionCall) -> Optional[str]:
    """None when `call` lies within `capabilities`, else the one-line reason of the first field it lies
    outside (followed by that field's note). Key ranges: a backend without ``key_ranges`` is asked about the
    call with them folded into attn_mask (`AttentionCall.with_key_ranges_as_mask`), and a refusal that only
    that mask causes says so."""
    caps = capabilities
    seen = call if caps.key_ranges else call.with_key_ranges_as_mask()
    found = _first_reason(caps, seen)
    if found is None:
        return None
    name, reason = found
    note = caps.notes.get(name)
    if name == "devices" and not note:
        note = f"takes {_one_of(caps.devices)} tensors only"
    reason = f"{reason}: {note}" if note else reason
    if seen is not call and call.attn_mask is None and name == "attn_mask":
        reason = f"key_start / key_end reach it as an attn_mask, and {reason}"
    return reason


# ----------------------------------------------------------------------------- the table

TABLE_COLUMNS = (
    "backend",
    "devices",
    "dtypes",
    "head dims",
    "mappings",
    "α",
    "attn_mask",
    "key ranges",
    "ALiBi",
    "q-scale",
    "decoding",
    "GQA",
    "query rows",
    "gradients",
    "also checked",
)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def table_row(name: str, caps: Capabilities, also: str) -> Tuple[str, ...]:
    """One backend's capabilities on some devices as the cells of `TABLE_COLUMNS`."""
    head = "any" if caps.head_dims is None else ", ".join(map(str, caps.head_dims))
    if caps.min_head_dim > 1:
        head = f"≥ {caps.min_head_dim}" if caps.head_dims is None else f"{head} (≥ {caps.min_head_dim})"
    if not caps.value_head_dim:
        head += "; v's = q/k's"
    alpha = "any ≥ 1" if caps.alpha is None else interval(caps.alpha)
    if set(caps.mappings) & {"entmax", "sparsemax"}:
        alpha += {"any": "; any tensor", "per_head": "; per head", "none": "; a float"}[caps.alpha_tensor]
    else:
        alpha = "-"
    rows = "any"
    if caps.power_of_two_length or caps.min_length > 1:
        rows = f"{'powers of two ' if caps.power_of_two_length else ''}≥ {caps.min_length}"
    grads = ["q, k, v, q_scale"] if caps.grad else []
    grads += ["α, slopes, mask"] if caps.grad_of_bias else []
    return (
        f"`{name}`",
        "any" if caps.devices is None else ", ".join(caps.devices),
        "any" if caps.dtypes is None else ", ".join(dtype_name(d) for d in caps.dtypes),
        head,
        ", ".join(caps.mappings),
        alpha,
        _yes(caps.attn_mask),
        "native" if caps.key_ranges else ("as a mask" if caps.attn_mask else "no (as a mask)"),
        _yes(caps.alibi),
        _yes(caps.q_scale),
        _yes(caps.decoding),
        _yes(caps.gqa),
        rows,
        "; ".join(grads) or "none",
        also or "-",
    )


def table(rows: Sequence[Tuple[str, ...]]) -> str:
    """The markdown table of `table_row` rows (no trailing newline)."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)
