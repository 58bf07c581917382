"""`AttentionCall`: the validated arguments of one `attention` call, which backends inspect (`supports`) and
run. Validation happens here, once, before a backend is chosen, so every backend refuses the same inputs
with the same message.

Key ranges. ``key_start`` / ``key_end`` ((B,) integers) limit batch row b to the keys
key_start[b] ≤ j < key_end[b]: left padding (pads before the real tokens) and right padding (pads after
them) without a dense mask. Backends that take them natively read them here (the Triton kernels); the
others get `key_range_mask`, the equivalent (B, 1, 1, Nk) bool mask, folded into ``attn_mask`` by
`with_key_ranges_as_mask` (`capabilities.check` and `Backend.run` do that for them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

import torch
from torch import Tensor

from longsparse.attention.logits import check_mask_dtype, compute_dtype
from longsparse.mappings.entmax import AlphaLike, _alpha_view
from longsparse.mappings.registry import SCALED_METHODS, Mapping, get_mapping


@dataclass
class AttentionCall:
    """q (B, H, Nq, D); k, v (B, Hkv, Nk, D) as given (H a multiple of Hkv: GQA); mapping bound to its options.

    alpha: α as given (float or tensor), for kernels that take per-head (H,) α; ``mapping.alpha`` holds
    it viewed to broadcast over (B, H, Nq, Nk) rows. scale: the resolved logit scale. The query rows sit
    at the last Nq key positions (`first_pos` = Nk − Nq). key_start, key_end: (B,) int64 on q's device
    or None (0 / Nk): batch row b attends only to keys key_start[b] ≤ j < key_end[b]."""

    q: Tensor
    k: Tensor
    v: Tensor
    mapping_name: str
    mapping: Mapping
    alpha: AlphaLike
    is_causal: bool
    scale: float
    alibi_slopes: Optional[Tensor]
    q_scale: Optional[Tensor]
    attn_mask: Optional[Tensor]
    chunk_size: Optional[int]
    key_start: Optional[Tensor] = None
    key_end: Optional[Tensor] = None
    tolerance: Optional[float] = None
    device_type: str = ""
    _kv: Optional[tuple] = field(default=None, repr=False)
    _masked: Optional["AttentionCall"] = field(default=None, repr=False)

    def __post_init__(self):
        if not self.device_type:
            self.device_type = self.q.device.type

    @property
    def shape(self):
        """(B, H, Nq, Nk, D)."""
        B, H, Nq, D = self.q.shape
        return B, H, Nq, self.k.shape[2], D

    @property
    def first_pos(self) -> int:
        return self.k.shape[2] - self.q.shape[2]

    @property
    def compute_dtype(self) -> torch.dtype:
        return compute_dtype(self.q.dtype)

    def kv_heads_repeated(self):
        """(k, v) with H heads: each of the Hkv heads repeated for the H // Hkv query heads it serves."""
        if self._kv is None:
            k, v = self.k, self.v
            if k.shape[1] != self.q.shape[1]:
                rep = self.q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            self._kv = (k, v)
        return self._kv

    @property
    def has_key_ranges(self) -> bool:
        return self.key_start is not None or self.key_end is not None

    def key_range_mask(self) -> Optional[Tensor]:
        """(B, 1, 1, Nk) bool, True on the keys key_start[b] ≤ j < key_end[b]; None without key ranges."""
        if not self.has_key_ranges:
            return None
        j = torch.arange(self.k.shape[2], device=self.q.device)
        keep = torch.ones((self.q.shape[0], j.numel()), dtype=torch.bool, device=j.device)
        if self.key_start is not None:
            keep &= j >= self.key_start[:, None]
        if self.key_end is not None:
            keep &= j < self.key_end[:, None]
        return keep[:, None, None, :]

    def with_key_ranges_as_mask(self) -> "AttentionCall":
        """This call with its key ranges folded into attn_mask (bool: and-ed; float: −inf outside the ranges,
        still differentiable in the mask), for backends that take no key ranges; built once per call."""
        if not self.has_key_ranges:
            return self
        if self._masked is None:
            keep, mask = self.key_range_mask(), self.attn_mask
            if mask is None:
                mask = keep
            elif mask.dtype == torch.bool:
                mask = mask & keep
            else:
                mask = mask.masked_fill(~keep, float("-inf"))
            self._masked = replace(self, attn_mask=mask, key_start=None, key_end=None, _masked=None)
        return self._masked

    @property
    def grad_of_bias(self) -> bool:
        """Whether α, the ALiBi slopes or a float mask need a gradient (only the reference gives them)."""
        return any(isinstance(t, Tensor) and t.requires_grad for t in (self.alpha, self.alibi_slopes, self.attn_mask))

    @property
    def wants_grad(self) -> bool:
        """Whether autograd will differentiate the output with respect to q, k, v or q_scale."""
        return torch.is_grad_enabled() and any(
            isinstance(t, Tensor) and t.requires_grad for t in (self.q, self.k, self.v, self.q_scale)
        )


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


def tracing_or_capturing(device: torch.device) -> bool:
    """Whether the running code is traced by torch.compile or captured into a CUDA graph on ``device``: then it
    may neither read a device value on the host (a CUDA graph refuses the sync; a trace would break its graph)
    nor keep a tensor it makes for later calls (a captured one holds its value only once the graph replays)."""
    if torch.compiler.is_compiling():
        return True
    return torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()


def _check_finite_inputs(**tensors: Optional[Tensor]) -> None:
    """Refuses NaN and ±inf in the given tensors (the attn_mask may hold −inf) with one host sync.

    Checked here, once for every backend, because the backends would notice different things: SDPA's fused
    kernels turn the NaN row of a NaN query into zeros, and the logits' row-max check of the others misses
    v and entries under a mask. One min/max reduction per tensor (a single pass, no temporary of the
    input's size; NaN propagates through it) and one sync: O(N·D) work for q, k, v against the
    attention's O(N²·D). Skipped under torch.compile and CUDA-graph capture (`tracing_or_capturing`)."""
    given = {name: t for name, t in tensors.items() if t is not None and t.numel() and t.is_floating_point()}
    if not given or tracing_or_capturing(next(iter(given.values())).device):
        return
    with torch.no_grad():
        stats = []  # (stack promotes mixed dtypes to the widest: finiteness is kept)
        for name, t in given.items():
            if name == "attn_mask":  # −inf masks; its max is NaN or +inf only for a bad entry
                stats += [t.amax().clamp_min(0)] * 2
            else:
                stats += torch.aminmax(t)
        finite = torch.isfinite(torch.stack(stats))
        if bool(finite.all()):
            return
        name = list(given)[finite.view(-1, 2).all(1).tolist().index(False)]
    raise ValueError(f"{name} contains NaN or {'+inf' if name == 'attn_mask' else 'inf'}")


def _key_bound(name: str, t: Optional[Tensor], B: int, device: torch.device) -> Optional[Tensor]:
    """key_start / key_end as (B,) int64 on q's device. Any integer is meaningful (a row whose range is empty
    attends to nothing), so the values are not checked: that would synchronise with the device."""
    if t is None:
        return None
    if (
        not isinstance(t, Tensor)
        or t.is_floating_point()
        or t.is_complex()
        or t.dtype == torch.bool
        or tuple(t.shape) != (B,)
    ):
        got = f"dtype {t.dtype}, shape {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"{name} must be an integer tensor of shape ({B},) (one key index per batch row); got {got}")
    return t.to(device=device, dtype=torch.long)


MAX_TOLERANCE = 0.5  # ‖p̂ − p‖₁ ≤ 2ε: beyond 0.5 the bound says little


def tolerance_problem(tolerance) -> str | None:
    """None when `tolerance` is None (exact τ) or a float in (0, MAX_TOLERANCE], else a one-line reason."""
    if tolerance is None:
        return None
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)):
        return f"tolerance must be a float in (0, {MAX_TOLERANCE}] or None; got {tolerance!r}"
    if not 0.0 < float(tolerance) <= MAX_TOLERANCE:
        return f"tolerance {tolerance!r} outside (0, {MAX_TOLERANCE}] (None solves τ exactly)"
    return None


def make_call(
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
) -> AttentionCall:
    """Validates `attention`'s arguments (shapes, dtypes, finiteness, the mapping's options) into a call."""
    _check_shapes(q, k, v)
    problem = tolerance_problem(tolerance)
    if problem is not None:
        raise ValueError(problem)
    name = mapping
    if mapping in SCALED_METHODS:
        if q_scale is None:
            raise ValueError(
                f"mapping={mapping!r} is {SCALED_METHODS[mapping]} with per-query length scales, which must be "
                f"passed as q_scale (e.g. from longsparse.nn.{'ASEntmaxScaler' if mapping == 'asentmax' else 'SSMaxScaler'}); "
                f"without them use mapping={SCALED_METHODS[mapping]!r}"
            )
        name = SCALED_METHODS[mapping]
    bound = get_mapping(name, alpha=alpha, topk=topk, adatemp_order=adatemp_order)
    if tolerance is not None and bound.alpha is None:
        raise ValueError(f"tolerance applies to α-entmax mappings; {mapping!r} has no threshold τ to solve")
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    if alibi_slopes is not None and alibi_slopes.shape != (H,):
        raise ValueError(f"alibi_slopes must have shape ({H},); got {tuple(alibi_slopes.shape)}")
    if q_scale is not None and q_scale.shape != (B, H, Nq):
        raise ValueError(f"q_scale must have shape ({B}, {H}, {Nq}); got {tuple(q_scale.shape)}")
    check_mask_dtype(attn_mask)
    if attn_mask is not None:
        try:
            torch.broadcast_shapes(attn_mask.shape, (B, H, Nq, Nk))
        except RuntimeError:
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to {(B, H, Nq, Nk)}"
            ) from None
    key_start, key_end = (
        _key_bound(arg, t, B, q.device) for arg, t in (("key_start", key_start), ("key_end", key_end))
    )
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number; got {scale}")
    _check_finite_inputs(q=q, k=k, v=v, q_scale=q_scale, alibi_slopes=alibi_slopes, attn_mask=attn_mask)
    if isinstance(bound.alpha, Tensor):  # per-head (H,) or any shape broadcastable over the rows
        bound = type(bound)(bound.name, _alpha_view(bound.alpha, torch.empty((B, H, Nq, Nk), device="meta"), 3))
    return AttentionCall(
        q=q,
        k=k,
        v=v,
        mapping_name=name,
        mapping=bound,
        alpha=alpha,
        is_causal=bool(is_causal),
        scale=1.0 / math.sqrt(D) if scale is None else float(scale),
        alibi_slopes=alibi_slopes,
        q_scale=q_scale,
        attn_mask=attn_mask,
        chunk_size=chunk_size,
        key_start=key_start,
        key_end=key_end,
        tolerance=None if tolerance is None else float(tolerance),
    )
