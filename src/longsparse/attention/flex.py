"""The `flex` backend: softmax-form attention through torch's FlexAttention
(``torch.nn.attention.flex_attention``), compiled by torch.compile into one fused kernel per call shape.

It takes softmax (SSMax: softmax with q-scales) and the adaptive temperature, with the biases and masks that
SDPA can take only as a dense bias (which moves it off its flash kernel and, past a size, off the fast path):

    z_ij = scale · (q_i s_i θ_i) · k_j − θ_i · m_h · |pos_i − j|,   key_start[b] ≤ j < key_end[b],
                                                                     j ≤ pos_i when causal,

with s the q-scales, m the ALiBi / NAPE slopes, pos_i = Nk − Nq + i (bottom-right alignment: decoding with
Nq < Nk) and θ the adaptive temperature (1 for softmax). Under the causal mask |pos_i − j| = pos_i − j on every
key a row sees, so one score_mod serves both forms (`logits.py`'s formula; |i − j| when not causal). The
q-scales and θ are folded into q before the kernel, so autograd differentiates q_scale through that product;
θ has no gradient (as in every backend).

Masks never become a dense tensor: the block mask (which (query block, key block) tiles hold any visible key,
and which hold only visible keys) is computed from the key ranges and the causal diagonal in
O(B · Nq/128 · Nk/128) integer work, and ``mask_mod`` evaluates the exact mask inside the partial tiles only.
All per-call values (slopes, θ, key ranges, the causal bound) reach the kernel as tensors captured by
score_mod / mask_mod, so a compiled function is reused across calls of one shape; each new shape, dtype or head
count compiles its own (static lengths: see `compiled`).

Adaptive temperature takes two passes. The first, without gradient, gets each row's entropy of softmax(z),
H = lse − E_p[z], from FlexAttention's log-sum-exp and an output over the values [k | j]:
E_p[z] = scale · q·E_p[k] − m · (pos_i − E_p[j]) (under the symmetric non-causal bias the keys left and right
of pos_i are two calls, combined by their log-sum-exps). The second is the softmax of θ·z. The first pass
runs in float32 (E_p[j] holds key positions); its rounding, about Nk · 2⁻²⁴ in E_p[j], moves H by m times
that (0.002 at 64K keys and slope 1/2), and θ = P(H) with it.

Where it runs (the backend's capabilities: attention/backends/flex.py): CUDA (forward and backward; float16,
bfloat16, float32; head dims ≥ 16), and CPU inference in float32 / 16-bit (torch's CPU FlexAttention has no backward and returns no log-sum-exp, so no
adaptive temperature there). Not: top-k (it needs each row's k-th logit), a dense attn_mask, a gradient of the
slopes.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from longsparse.attention.call import AttentionCall, tracing_or_capturing
from longsparse.mappings.variants import temperature_of_entropy

# Query rows and keys per tile of the block mask (FlexAttention's default and its kernels' largest tile).
BLOCK = 128


def _flex_module():
    """(torch.nn.attention.flex_attention or None, why not)."""
    try:
        from torch.nn.attention import flex_attention as module

        module.BlockMask.from_kv_blocks  # noqa: B018 - the entry point this backend builds its masks with
    except (ImportError, AttributeError) as exc:
        return None, f"not available: torch {torch.__version__} has no FlexAttention ({type(exc).__name__}: {exc})"
    return module, None


def _cpu_supported() -> bool:
    """Whether torch's CPU FlexAttention template runs here: the conditions of torch's own check
    (torch._inductor.kernel.flex.flex_cpu.check_cpu_supported: AVX2, not macOS), read without importing the
    compiler."""
    avx2 = getattr(torch.cpu, "_is_avx2_supported", lambda: False)()
    return bool(avx2) and os.getenv("ATEN_CPU_CAPABILITY") != "default" and sys.platform != "darwin"


def _build_reason(device_type: str) -> Optional[str]:
    """Why FlexAttention cannot run compiled for tensors on `device_type` with this torch build (None: it can;
    a compiler that then fails says so when the call runs)."""
    module, why = _flex_module()
    if module is None:
        return why
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "not available: torch.compile needs Triton for CUDA tensors and cannot use it here"
        return None
    if device_type == "cpu":
        if not _cpu_supported():
            return "not available on this CPU: torch's CPU FlexAttention needs AVX2 (and not macOS)"
        return None
    return f"tensors on {device_type}: longsparse runs FlexAttention on CUDA and CPU only"


_BUILD_REASONS: Dict[str, Optional[str]] = {}


def build_reason(device_type: str) -> Optional[str]:
    if device_type not in _BUILD_REASONS:
        _BUILD_REASONS[device_type] = _build_reason(device_type)
    return _BUILD_REASONS[device_type]


# ----------------------------------------------------------------------------- the block mask


def block_mask_tensors(
    B: int, Nq: int, Nk: int, first: int, key_start: Tensor, key_end: Tensor, lo: int, hi: int, device
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices), int32 (B, 1, ⌈Nq/BLOCK⌉[, ⌈Nk/BLOCK⌉]),
    of the mask "key_start[b] ≤ j < key_end[b] and pos_i + lo ≤ j ≤ pos_i + hi" (pos_i = first + i): for each
    tile, partial (some key visible: mask_mod decides) or full (every key of the tile visible to every row of
    the tile: mask_mod skipped). A tile whose keys run past Nk is never full."""
    nqb, nkb = -(-Nq // BLOCK), -(-Nk // BLOCK)
    qb = torch.arange(nqb, device=device)
    pos_first = first + qb * BLOCK  # (nqb,)
    pos_last = first + torch.clamp((qb + 1) * BLOCK, max=Nq) - 1
    ks, ke = key_start[:, None, None], key_end[:, None, None]  # (B, 1, 1)
    # keys visible to some row of the tile (the rows' ranges slide right by one per row: their union is one
    # range) and keys visible to every row
    some_lo = torch.maximum(ks, (pos_first + lo)[:, None])
    some_hi = torch.minimum(ke, (pos_last + hi + 1)[:, None])
    all_lo = torch.maximum(ks, (pos_last + lo)[:, None])
    all_hi = torch.minimum(ke, (pos_first + hi + 1)[:, None])
    start = torch.arange(nkb, device=device) * BLOCK  # (nkb,)
    end = start + BLOCK
    touched = (start < some_hi) & (end > some_lo) & (some_lo < some_hi)  # (B, nqb, nkb)
    full = touched & (start >= all_lo) & (end <= all_hi)
    partial = touched & ~full

    def listed(sel: Tensor) -> Tuple[Tensor, Tensor]:
        # the selected tiles' key-block indices first, in order (a stable sort puts True before False)
        idx = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True)
        return sel.sum(-1, dtype=torch.int32)[:, None], idx.to(torch.int32)[:, None]

    return (*listed(partial), *listed(full))


# ----------------------------------------------------------------------------- the compiled kernels


def _attend(q, k, v, coef, bounds, key_start, key_end, blocks, scale: float, gqa: bool, with_lse: bool):
    """FlexAttention of q (B, H, Nq, D) over k, v (B, Hkv, Nk, ·): scores scale·q·k − coef[b, h, i]·|pos_i − j|,
    visible where key_start[b] ≤ j < key_end[b] and pos_i + bounds[0] ≤ j ≤ pos_i + bounds[1]; blocks: the
    block mask's tile lists (`block_mask_tensors`). Returns the output, and the log-sum-exp (B, H, Nq) when
    with_lse."""
    from torch.nn.attention import flex_attention as fa

    Nq, Nk = q.shape[2], k.shape[2]
    first = Nk - Nq

    def mask_mod(b, h, i, j):
        pos = i + first
        return (j >= key_start[b]) & (j < key_end[b]) & (j >= pos + bounds[0]) & (j <= pos + bounds[1])

    def score_mod(score, b, h, i, j):
        return score - coef[b, h, i] * (i + first - j).abs()

    block_mask = fa.BlockMask.from_kv_blocks(*blocks, BLOCK_SIZE=BLOCK, mask_mod=mask_mod, seq_lengths=(Nq, Nk))
    kw = dict(score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa)
    if not with_lse:
        return fa.flex_attention(q, k, v, **kw)
    if hasattr(fa, "AuxRequest"):  # torch ≥ 2.9: return_lse is deprecated
        out, aux = fa.flex_attention(q, k, v, **kw, return_aux=fa.AuxRequest(lse=True))
        return out, aux.lse
    return fa.flex_attention(q, k, v, **kw, return_lse=True)


def _attend_out(q, k, v, coef, bounds, key_start, key_end, blocks, scale: float, gqa: bool):
    return _attend(q, k, v, coef, bounds, key_start, key_end, blocks, scale, gqa, False)


def _attend_lse(q, k, v, coef, bounds, key_start, key_end, blocks, scale: float, gqa: bool):
    return _attend(q, k, v, coef, bounds, key_start, key_end, blocks, scale, gqa, True)


# torch.compile keeps its cache of compiled graphs, and its recompile limit, per code object: each entry here
# is a function of its own code, one per call shape, compiled with static lengths. On the CPU torch's
# FlexAttention template takes static lengths only; on CUDA, lengths made dynamic after a first change fail to
# lower in torch 2.11 ("'ShapeAsConstantBuffer' object has no attribute 'dtype'", seen on an H200 at 16K keys
# after a 4K call), so CUDA compiles per shape too: auto gives flex long rows only (attention/policy.py), whose
# lengths are few.
_COMPILED: Dict[tuple, Callable] = {}


def compiled(with_lse: bool, device_type: str, shapes: tuple) -> Callable:
    """The compiled `_attend_out` / `_attend_lse` for calls of this kind, built on first use."""
    key = (with_lse, device_type) + shapes
    if key not in _COMPILED:
        fn = _attend_lse if with_lse else _attend_out
        own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__)
        _COMPILED[key] = torch.compile(own, fullgraph=True, dynamic=False)
    return _COMPILED[key]


# Block masks of calls without key ranges, by shape and bounds (oldest dropped first).
_MASKS: Dict[tuple, tuple] = {}
_MASKS_KEPT = 32
# Key ranges of calls without them, (0, Nk) for every batch row, by (B, Nk, device).
_FULL_RANGES: Dict[tuple, Tuple[Tensor, Tensor]] = {}


def _full_ranges(B: int, Nk: int, device) -> Tuple[Tensor, Tensor]:
    def make():
        return torch.zeros(B, dtype=torch.long, device=device), torch.full((B,), Nk, dtype=torch.long, device=device)

    if tracing_or_capturing(device):
        return make()
    key = (B, Nk, str(device))
    if key not in _FULL_RANGES:
        if len(_FULL_RANGES) >= _MASKS_KEPT:
            _FULL_RANGES.pop(next(iter(_FULL_RANGES)))
        _FULL_RANGES[key] = make()
    return _FULL_RANGES[key]


class _Kernel:
    """One call's fixed arguments for the kernels: its key ranges (B,) and its causal bound."""

    def __init__(self, call: AttentionCall):
        B, H, Nq, Nk, _ = call.shape
        dev = call.q.device
        self.B, self.Nq, self.Nk, self.first = B, Nq, Nk, call.first_pos
        self.ranged = call.has_key_ranges
        self.key_start, self.key_end = _full_ranges(B, Nk, dev)
        if call.key_start is not None:
            self.key_start = call.key_start.long()
        if call.key_end is not None:
            self.key_end = call.key_end.long()
        self.causal = call.is_causal
        self.scale = call.scale
        group = H // call.k.shape[1]
        self.gqa = group > 1 and group & (group - 1) == 0  # flex's decoding kernel shares power-of-two groups
        if group > 1 and not self.gqa:
            self.k, self.v = call.kv_heads_repeated()
        else:
            self.k, self.v = call.k, call.v

    def _masks(self, lo: int, hi: int, device) -> tuple:
        """(block mask tiles, bounds tensor) of this call's mask with the bounds lo, hi. Without key ranges they
        depend on the shape alone and are kept (`_MASKS`), so repeated calls (training steps, layers) launch
        no work for them; inside a compiled model or a CUDA graph they are computed in it."""
        key = (self.B, self.Nq, self.Nk, lo, hi, str(device))
        fresh = self.ranged or tracing_or_capturing(device)
        if fresh or key not in _MASKS:
            blocks = block_mask_tensors(
                self.B, self.Nq, self.Nk, self.first, self.key_start, self.key_end, lo, hi, device
            )
            # [lo, hi] made on the device: a copy from the host is no operation a CUDA graph can capture
            bounds = torch.arange(2, dtype=torch.long, device=device).mul_(hi - lo).add_(lo)
            masks = (blocks, bounds)
            if fresh:
                return masks
            if len(_MASKS) >= _MASKS_KEPT:
                _MASKS.pop(next(iter(_MASKS)))
            _MASKS[key] = masks
        return _MASKS[key]

    def run(self, q: Tensor, v: Tensor, coef: Tensor, part: str = "all", with_lse: bool = False):
        """FlexAttention of q against this call's keys and values `v`, with ALiBi coefficients coef (B, H, Nq);
        part: "all" keys of the call, or (non-causal) only those "left" (j ≤ pos_i) or "right" (j > pos_i)."""
        far = self.Nk + self.Nq  # a bound no key reaches
        lo, hi = {"all": (-far, 0 if self.causal else far), "left": (-far, 0), "right": (1, far)}[part]
        blocks, bounds = self._masks(lo, hi, q.device)
        args = (q, self.k, v, coef, bounds, self.key_start, self.key_end, blocks, self.scale, self.gqa)
        if torch.compiler.is_compiling():  # inside a compiled model: traced into its graph
            return (_attend_lse if with_lse else _attend_out)(*args)
        shapes = (tuple(q.shape), tuple(self.k.shape), tuple(v.shape), q.dtype)
        fn = compiled(with_lse, q.device.type, shapes)
        try:
            return fn(*args)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - a compiler failure becomes the backend's one-line error
            text = str(exc).strip()
            raise RuntimeError(
                f"backend 'flex': FlexAttention could not run this call on {q.device.type} "
                f"({type(exc).__name__}: {text.splitlines()[0][:300] if text else 'no message'})"
            ) from exc


def _row_coef(call: AttentionCall, theta: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    """θ_i · m_h per query row, (B, H, Nq) contiguous (zeros without slopes)."""
    B, H, Nq, _, _ = call.shape
    dev = call.q.device
    if call.alibi_slopes is None:
        return torch.zeros((B, H, Nq), dtype=dtype, device=dev)
    coef = call.alibi_slopes.detach().to(device=dev, dtype=dtype).view(1, H, 1).expand(B, H, Nq)
    return (coef * theta if theta is not None else coef).contiguous()


def _entropy(call: AttentionCall, kern: _Kernel, qs: Tensor) -> Tensor:
    """H (B, H, Nq) of softmax(z) per row, z the call's logits with q-scaled queries qs; float32, no gradient.
    An empty row (no visible key) has H = 0."""
    D = qs.shape[-1]
    q32, k32 = qs.float(), kern.k.float()
    j = torch.arange(kern.Nk, dtype=torch.float32, device=qs.device)
    width = max(16, 1 << D.bit_length())  # ≥ D + 1, a power of two: [k | j | 0…]
    vals = torch.zeros(k32.shape[:-1] + (width,), dtype=torch.float32, device=qs.device)
    vals[..., :D] = k32
    vals[..., D] = j
    slopes = _row_coef(call, None, torch.float32)
    pos = (kern.first + torch.arange(kern.Nq, dtype=torch.float32, device=qs.device)).view(1, 1, -1)

    parts = ("all",) if kern.causal or call.alibi_slopes is None else ("left", "right")
    lses, means = [], []
    for part in parts:
        out, lse = kern.run(q32, vals, slopes, part, with_lse=True)
        # E_p[z] = scale·q·E_p[k] − m·E_p[|pos − j|], the distance of one sign on each part
        dist = (pos - out[..., D]) if part != "right" else (out[..., D] - pos)
        means.append(kern.scale * (q32 * out[..., :D]).sum(-1) - slopes * dist)
        lses.append(lse.float())
    if len(parts) == 1:
        lse, mean = lses[0], means[0]
    else:
        lse = torch.logaddexp(*lses)
        w = [torch.where(torch.isfinite(part_lse), torch.exp(part_lse - lse), 0.0) for part_lse in lses]
        mean = sum(wi * torch.nan_to_num(mi) for wi, mi in zip(w, means))
    return torch.where(torch.isfinite(lse), lse - mean, 0.0)


def flex_attention_run(call: AttentionCall) -> Tensor:
    """The flex backend: (B, H, Nq, Dv) in q's dtype."""
    q = call.q
    if call.q_scale is not None:
        q = q * call.q_scale.unsqueeze(-1).to(q.dtype)
    kern = _Kernel(call)
    theta = None
    if call.mapping.adjusts_logits:  # adaptive temperature (supports admits no other)
        with torch.no_grad():
            theta = temperature_of_entropy(_entropy(call, kern, q.detach()), call.mapping.order)
        q = q * theta.unsqueeze(-1).to(q.dtype)
    return kern.run(q, kern.v, _row_coef(call, theta, torch.float32))
