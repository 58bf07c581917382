"""α-entmax flash attention in Triton: forward, backward and a split-K decode path.

Public entry points:

* ``entmax_attention_triton(q, k, v, *, alpha, is_causal, alibi_slopes, q_scale, scale, key_start, key_end)``
  → (B, H, Nq, D), differentiable in q, k, v (and q_scale, through autograd);
* ``supports(q, k, v, **kwargs) -> str | None``: None when the kernels take the call, else the reason;
  ``supports_call(call)`` / ``run_call(call)``: the same check and the run for a validated ``AttentionCall``
  (the triton backend);
* ``threshold_stats(q, k, v, **kwargs)``: the forward's row statistics and tile mask (diagnostics);
* ``solver_counts(q, k, v, **kwargs)``: what the forward did per query block, counted by the kernel.

Semantics are those of ``ls.attention(..., mapping="entmax")``: logits
    z_ij = (q_i · k_j) · scale − m_h · |i + Nk − Nq − j|
(causal rows see only j ≤ i + Nk − Nq, where this is the usual −m_h·(i − j); non-causal ALiBi is
symmetric, as flash-attn's), batch row b sees only the keys key_start[b] ≤ j < key_end[b] (left / right
padding), causal masking bottom-right aligned (query i sits at absolute position i + Nk − Nq),
p_i = α-entmax(z_i), o_i = Σ_j p_ij v_j; a row that can attend to nothing gives zeros. The per-query
q-scale (SSMax / ASEntmax) multiplies q before the kernel, which is exact because it does not scale the
bias; its gradient then flows through autograd.

Algorithm (one program per block of BLOCK_M query rows, key tiles of BLOCK_N, fp32 arithmetic; blocks
dispatched longest first):

1. max pass: the row max M over the key tiles.
2. threshold solve, in the shifted scale X = (α−1)(z − M) ∈ (−∞, 0] where τ ∈ [−1, −n^{1−α}] (n = the
   row's visible keys), f(τ) = Σ_j [X_j − τ]₊^{1/(α−1)} − 1 (decreasing, convex). Each sweep over the key
   tiles evaluates f at several points per row at once (the first sweep at P0 points spread geometrically
   over the bracket, later sweeps at the ends of the bracket the last one proved), and folds them into
   the bracket with Newton steps and, for α = 1.5 / 2, the closed-form τ of each point's support, which is
   an upper or a lower bound and is τ* exactly when that support is the true one — certified from below
   (every support entry stays positive) or from above (every other entry stays non-positive)
   (`_bracket_update`). Other α finish when the Newton step is below ``_TOL`` (output renormalised). A row
   whose bracket closes to rounding ends at its lower bound, renormalised; ``solver_counts`` reports those.
   The opt-in tolerance mode (``tolerance=ε``) also ends a row at the first point with |f| ≤ ε.
3. output pass: p = [X − τ]₊^{1/(α−1)} / Σp, O = p·V, and for training Σ u·V / Σ u (u = p^{2−α}) per row,
   from which the backward's δ is one dot product (no extra pass over K).

The loops over key tiles are plain `for` loops (no data-dependent branch around a load), so Triton
software-pipelines their K and V loads; tiles inside every row's visible range skip the visibility mask,
slope-0 (NoPE) heads the bias. Skipping: key tiles outside [key_start, key_end) and past the causal
diagonal are never visited; on ALiBi heads, the band of `attention/band.py` (a bound proving that keys
far enough away hold no support) limits every pass to the tiles near the diagonal. The output pass records
per (query block, key tile) whether the tile holds some p > 0 (⌈Nq/BLOCK_M⌉·⌈Nk/BLOCK_N⌉ bytes per head);
the row statistics are 3 floats per query (M, τ, 1/Σp). No N×N buffer exists.

Backward, with u = p^{2−α} (√p for α = 1.5, the support indicator for α = 2), g_ij = dO_i · v_j:
    ∂L/∂z_ij = u_ij (g_ij − δ_i),  δ_i = Σ_j u_ij g_ij / Σ_j u_ij = dO_i · (Σ_j u_ij v_j) / Σ_j u_ij.
δ comes from the forward's Σ u·V (a pre-pass computes it where the forward kept none: the decode path).
The tile mask becomes lists (per query block its live key tiles, per key tile its live query blocks),
so dk/dv — one program per (key tile, batch, kv head) over the query heads of its GQA group, summed
without atomics (deterministic) — and dq — one program per query block — loop over plain lists.

Decode (few queries against a long KV cache, ``decode=True`` or automatically for Nq ≤ 16 and
Nk ≥ 1024): τ is global over the row, so a split over keys cannot finish its rows alone. Instead
(a) a split-K kernel reads K once, writes the Nq×Nk fp32 logits to a scratch buffer and a per-split row
max; GQA query heads sharing a kv head go into one program so K is read once per group; (b) a kernel per
(split, row) keeps the candidates X > −1 (a superset of the support) of its split, packed; (c) one
program per row runs the block kernel's solve over its candidates (over the whole scratch row if a split
had more than its share); (d) a split-K kernel forms p from the scratch logits and τ and accumulates
partial P·V and Σp per split, skipping the V tiles where p is all zero; since τ is global, partial
outputs simply add (no rescaling, unlike softmax flash-decoding), and a small reduction divides by Σp.
The decode path also returns the row statistics, so its output is differentiable through the same
backward kernels.

The decode scratch is B·H·Nq·Nk fp32 logits plus at most as many candidates (with Nq ≤ 16).

Supported: α ∈ (1, 2] as a float (α = 1.5 and 2 with the exact finish) or a per-head (H,) tensor
(general solver; α itself is not differentiated); causal (bottom-right) or not; ALiBi / NAPE slopes (H,)
(not differentiated); q-scales; GQA; left and right padding through key_start / key_end; any N; head
dims 16, 32, 64, 128; float16 / bfloat16 / float32 inputs (fp32 accumulation; fp32 inputs use 3xTF32 dots on CUDA).
Refused (see `supports`): arbitrary attn_mask, other mappings, α outside (1, 2] or requiring grad,
other head dims and dtypes, non-CUDA tensors outside the interpreter.

The kernels themselves are in attention/triton_kernels/ (tiles, solve, forward, backward, decode);
attention/triton_ops.py launches them. They are built lazily on first use: ``TRITON_INTERPRET=1`` (Triton's CPU
interpreter, used by the tests) must be set before that first use. The entry point is a ``torch.library.custom_op``
pair (forward, backward) with fake implementations and registered autograd, so ``torch.compile`` traces a model
that calls it (fullgraph).
"""

import math

import torch
from torch import Tensor

from . import triton_ops as ops
from .call import AttentionCall, tolerance_problem
from .capabilities import alpha_range_reason, dtype_reason, grad_of_bias_reason, head_dim_reason, value_head_dim_reason

# _MAX_SWEEPS_EXACT and SOLVER_POINTS: read from here by benchmarks/kernel_counts.py and benchmarks/gpu_check.py
# (the launches read them, and any override, on triton_ops)
from .triton_ops import _MAX_SWEEPS_EXACT, _TRITON_ERROR, SOLVER_POINTS, _attention_op, _interpreter_mode  # noqa: F401

HEAD_DIMS = (16, 32, 64, 128)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ALPHA_RANGE = (1.0, 2.0)  # α in (1, 2]
DECODE_MAX_QUERIES = 16  # the decode path holds all of a program's query rows in one tile
DECODE_MIN_KEYS = 1024  # below this the block kernel has enough key tiles per query block anyway


# ============================================================================ public API

AlphaArg = float | int | Tensor

_IGNORED_KWARGS = ("chunk_size", "topk", "adatemp_order", "path", "backend")


def supports(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mapping: str = "entmax",
    alpha: AlphaArg = 1.5,
    is_causal: bool = False,
    scale: float | None = None,
    alibi_slopes: Tensor | None = None,
    q_scale: Tensor | None = None,
    attn_mask: Tensor | None = None,
    key_start: Tensor | None = None,
    key_end: Tensor | None = None,
    decode: bool | None = None,
    tolerance: float | None = None,
    **other,
) -> str | None:
    """None when `entmax_attention_triton` can take this call, else a one-line reason.

    Accepts ``ls.attention``'s keywords (``mapping`` entmax / asentmax / sparsemax; ``chunk_size``,
    ``topk``, ``adatemp_order``, ``path``, ``backend`` are ignored) plus ``decode``. Refused:
    Triton missing; tensors not on CUDA (CPU only in interpreter mode, TRITON_INTERPRET=1); other
    mappings; α outside (1, 2], α requiring grad, an α tensor not of shape (H,); dtypes other than
    float16 / bfloat16 / float32 or mixed; head dims other than 16, 32, 64, 128; shapes that are not
    (B, H, N, D) with H divisible by H_kv and Nq ≤ Nk; an attn_mask; ALiBi slopes requiring grad or not
    of shape (H,); q_scale not (B, H, Nq) / (B, H, Nq, 1); key_start / key_end not integer (B,)
    tensors; decode=True with more than 16 queries; a tolerance that is not a float in (0, 0.5]."""
    if _TRITON_ERROR is not None:
        return _TRITON_ERROR
    for key in other:
        if key not in _IGNORED_KWARGS:
            return f"unsupported argument {key!r}"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            return f"{name} must be a 4-D (B, H, N, D) tensor"
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    if k.shape[0] != B or v.shape[0] != B or k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        return f"inconsistent shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if H % k.shape[1]:
        return f"query heads ({H}) not a multiple of key/value heads ({k.shape[1]})"
    if Nq > Nk:
        return f"more queries ({Nq}) than keys ({Nk}): queries sit at the last key positions"
    problem = _kernel_problem(q, k, v, mapping, alpha, attn_mask, alibi_slopes, decode)
    if problem is not None:
        return problem
    if alibi_slopes is not None and tuple(alibi_slopes.shape) != (H,):
        return f"alibi_slopes must have shape ({H},); got {tuple(alibi_slopes.shape)}"
    if q_scale is not None and tuple(q_scale.shape) not in ((B, H, Nq), (B, H, Nq, 1)):
        return f"q_scale must have shape ({B}, {H}, {Nq}) or ({B}, {H}, {Nq}, 1); got {tuple(q_scale.shape)}"
    for name, t in (("key_start", key_start), ("key_end", key_end)):
        if t is not None and (
            not isinstance(t, Tensor)
            or t.is_floating_point()
            or t.is_complex()
            or t.dtype == torch.bool
            or tuple(t.shape) != (B,)
        ):
            return f"{name} must be an integer tensor of shape ({B},)"
    if scale is not None and not math.isfinite(float(scale)):
        return f"scale {scale!r} is not finite"
    return tolerance_problem(tolerance)


def supports_call(call: AttentionCall) -> str | None:
    """`supports` for an `AttentionCall`, whose arguments `make_call` has validated (the triton backend's
    check): only what the kernels add — the mapping and α, device, dtypes, head dims, no attn_mask, slopes
    without gradient — with `supports`' reasons."""
    if call.mapping.alpha is None:
        return f"mapping {call.mapping_name!r} is not α-entmax"
    if _TRITON_ERROR is not None:
        return _TRITON_ERROR
    return _kernel_problem(
        call.q, call.k, call.v, call.mapping_name, _call_alpha(call), call.attn_mask, call.alibi_slopes, None
    )


def _call_alpha(call: AttentionCall) -> AlphaArg:
    """α for the kernels: the float of softmax / sparsemax / entmax, or the tensor α as the caller gave it."""
    return call.alpha if isinstance(call.mapping.alpha, Tensor) else call.mapping.alpha


def _kernel_problem(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mapping: str,
    alpha: AlphaArg,
    attn_mask: Tensor | None,
    alibi_slopes: Tensor | None,
    decode: bool | None,
) -> str | None:
    """What the kernels refuse in arguments of consistent shapes (q (B, H, Nq, D), k and v (B, H_kv, Nk, ·) with
    H_kv dividing H and Nq ≤ Nk), else None."""
    if mapping not in ("entmax", "asentmax", "sparsemax"):
        return f"mapping {mapping!r} is not α-entmax"
    if mapping == "sparsemax":
        alpha = 2.0
    devices = {t.device for t in (q, k, v)}
    if len(devices) != 1:
        return f"q, k, v are on different devices: {sorted(map(str, devices))}"
    if q.device.type != "cuda" and not (q.device.type == "cpu" and _interpreter_mode()):
        return f"tensors on {q.device.type}: the kernels need CUDA (or CPU tensors with TRITON_INTERPRET=1)"
    problem = dtype_reason(DTYPES, q, k, v)
    if problem is not None:
        return problem
    _, H, Nq, D = q.shape
    if k.shape[3] != D:
        return f"head dims differ: q {D}, k {k.shape[3]}"
    if v.shape[3] != D:
        return f"{value_head_dim_reason(D, v.shape[3])}: the kernels take one head dim"
    if D not in HEAD_DIMS:
        return head_dim_reason(HEAD_DIMS, D)
    if k.shape[2] < 1 or Nq < 1:
        return "empty query or key sequence"
    if isinstance(alpha, Tensor):
        if alpha.requires_grad:
            return grad_of_bias_reason("alpha")
        if alpha.numel() != 1 and tuple(alpha.shape) != (H,):
            return f"alpha tensor of shape {tuple(alpha.shape)}: only a scalar or per-head (H,) = ({H},)"
    elif not isinstance(alpha, (int, float)):
        return f"alpha {alpha!r} is not a float or a tensor"
    problem = alpha_range_reason(ALPHA_RANGE, alpha)
    if problem is not None:
        return problem
    if attn_mask is not None:
        return "attn_mask: the kernels take key_start / key_end (left / right padding) and is_causal, not a dense mask"
    if alibi_slopes is not None and alibi_slopes.requires_grad:
        return grad_of_bias_reason("alibi_slopes")
    if decode and Nq > DECODE_MAX_QUERIES:
        return f"the decode path takes at most {DECODE_MAX_QUERIES} queries; got {Nq}"
    return None


def entmax_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    alpha: AlphaArg = 1.5,
    is_causal: bool = False,
    alibi_slopes: Tensor | None = None,
    q_scale: Tensor | None = None,
    scale: float | None = None,
    key_start: Tensor | None = None,
    key_end: Tensor | None = None,
    decode: bool | None = None,
    tolerance: float | None = None,
) -> Tensor:
    """α-entmax attention through the Triton kernels; returns (B, H, Nq, D) in q's dtype.

    q: (B, H, Nq, D); k, v: (B, H_kv, Nk, D) with H % H_kv == 0 (GQA) and Nq ≤ Nk: query i sits at
    absolute position i + Nk − Nq (bottom-right), so Nq < Nk is prefill against a cache or decoding.
    alpha: float in (1, 2] (1.5 and 2 finish exactly), or an (H,) tensor of per-head α (general solver;
    a 0-d tensor on the CPU counts as a float). Values of a CUDA α tensor are not checked here (that
    would synchronise): ls.attention checks α before it dispatches.
    alibi_slopes: (H,) slopes m, bias −m·(i − j); zero slopes are NoPE heads (NAPE = half zeros).
    q_scale: (B, H, Nq) or (B, H, Nq, 1) per-query multiplier of q (SSMax / ASEntmax), differentiable.
    scale: logit scale, default 1/√D. key_start, key_end: (B,) integers (None: 0, Nk): batch row b sees
    only the keys key_start[b] ≤ j < key_end[b] (left / right padding; positions stay the key indices);
    the keys outside get zero gradients (if finite: the dk/dv kernel loads whole key tiles).
    decode: force (True) or forbid (False) the split-K decode path; None = Nq ≤ 16 and Nk ≥ 1024.
    tolerance: None (default) solves τ exactly. A float ε in (0, 0.5] is the opt-in fast mode: a row's solve
    may stop at a τ̂ whose unnormalised Σp = S has |S − 1| ≤ ε, and p̂ = p(τ̂)/S. Then p̂ is exactly
    α-entmax of the logits times c = S^{1−α}, and ‖p̂ − p‖₁ ≤ 2|S − 1| ≤ 2ε (each row's output moves by at most
    2ε·max‖v_j‖); the backward differentiates α-entmax at p̂ (see docs/architecture.md, "Tolerance mode").
    Rows that can attend to nothing give zeros. Differentiable in q, k, v (not α, not the slopes).
    Raises ValueError with `supports`' reason when the call is not supported."""
    out, _, _, _ = _attention_op(
        *_op_args(
            q,
            k,
            v,
            alpha=alpha,
            is_causal=is_causal,
            alibi_slopes=alibi_slopes,
            q_scale=q_scale,
            scale=scale,
            key_start=key_start,
            key_end=key_end,
            decode=decode,
            tolerance=tolerance,
        )
    )
    return out


def run_call(call: AttentionCall) -> Tensor:
    """Runs an `AttentionCall` that `supports_call` takes (the triton backend): (B, H, Nq, D) in q's dtype."""
    args = _to_op_args(
        call.q,
        call.k,
        call.v,
        _call_alpha(call),
        call.is_causal,
        call.alibi_slopes,
        call.q_scale,
        call.scale,
        call.key_start,
        call.key_end,
        None,
        call.tolerance,
    )
    return _attention_op(*args)[0]


def threshold_stats(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> tuple[Tensor, Tensor, Tensor]:
    """The forward op's results for diagnostics and tests: (O, stats (3, B, H, Nq) fp32 = row max M / τ /
    1/Σp, tile mask int8 (B, H, ⌈Nq/BM⌉, ⌈Nk/BN⌉) with 1 where a key tile holds some p > 0; shape (0,)
    from the decode path). Takes `entmax_attention_triton`'s keywords."""
    out, stats, mask, _ = _attention_op(*_op_args(q, k, v, **kwargs))
    return out, stats, mask


def solver_counts(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> dict:
    """What the block forward did, per query block, counted by the kernel itself (benchmarks and tests; the
    block path only): a dict of (B, H, ⌈Nq/BM⌉) int32 tensors — `sweeps` of the threshold solve,
    `tiles_visited` (key tiles whose logits were computed, over the max pass, the sweeps and the output pass),
    `causal_tiles` (key tiles of the block's visible range: what one dense pass visits), `uncertified` (rows
    that ended renormalised rather than exactly) — and `qk_passes` = tiles_visited / causal_tiles. Takes
    `entmax_attention_triton`'s keywords."""
    args = _op_args(q, k, v, **{**kwargs, "decode": False})
    B, H, Nq, D = q.shape
    n_qb = -(-Nq // ops._config(D, q.dtype, q.device.type)["BM"])
    counts = torch.zeros((B, H, n_qb, 4), dtype=torch.int32, device=q.device)
    with torch.no_grad():
        ops._forward_impl(*args[:11], False, args[12], counts)
    out = dict(zip(("sweeps", "tiles_visited", "causal_tiles", "uncertified"), counts.unbind(-1)))
    out["qk_passes"] = out["tiles_visited"].float() / out["causal_tiles"].clamp(min=1).float()
    return out


def _op_args(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    alpha: AlphaArg = 1.5,
    is_causal: bool = False,
    alibi_slopes: Tensor | None = None,
    q_scale: Tensor | None = None,
    scale: float | None = None,
    key_start: Tensor | None = None,
    key_end: Tensor | None = None,
    decode: bool | None = None,
    tolerance: float | None = None,
) -> tuple:
    """Checks the call (`supports`) and turns it into the custom op's arguments."""
    reason = supports(
        q,
        k,
        v,
        alpha=alpha,
        is_causal=is_causal,
        scale=scale,
        alibi_slopes=alibi_slopes,
        q_scale=q_scale,
        key_start=key_start,
        key_end=key_end,
        decode=decode,
        tolerance=tolerance,
    )
    if reason is not None:
        raise ValueError(f"entmax_attention_triton: {reason}")
    return _to_op_args(q, k, v, alpha, is_causal, alibi_slopes, q_scale, scale, key_start, key_end, decode, tolerance)


def _to_op_args(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alpha: AlphaArg,
    is_causal: bool,
    alibi_slopes: Tensor | None,
    q_scale: Tensor | None,
    scale: float | None,
    key_start: Tensor | None,
    key_end: Tensor | None,
    decode: bool | None,
    tolerance: float | None,
) -> tuple:
    """The custom op's arguments from arguments `supports` takes."""
    H, Nq, D = q.shape[1:]
    Nk = k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if q_scale is not None:  # exact: the scale multiplies q·k, never the ALiBi bias
        q = q * (q_scale if q_scale.dim() == 4 else q_scale.unsqueeze(-1)).to(q.dtype)
    alpha_heads = None
    if isinstance(alpha, Tensor):
        if alpha.numel() == 1 and alpha.device.type == "cpu" and not torch.compiler.is_compiling():
            alpha = float(alpha.item())
        else:
            alpha_heads = alpha.detach().to(device=q.device, dtype=torch.float32).reshape(-1).expand(H).contiguous()
            alpha = 1.5  # not read by the kernels when per-head α is given
    slopes = None if alibi_slopes is None else alibi_slopes.detach().to(device=q.device, dtype=torch.float32)
    # the kernels' int32, clamped to [0, Nk] before narrowing (the kernels then clamp start to end)
    start, end = (
        None if t is None else t.to(q.device).clamp(0, Nk).to(torch.int32).contiguous() for t in (key_start, key_end)
    )
    if decode is None:
        decode = Nq <= DECODE_MAX_QUERIES and Nk >= DECODE_MIN_KEYS
    # the forward keeps Σ u·v for the backward's δ only when a gradient can be asked for
    need_uv = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    tol = 0.0 if tolerance is None else float(tolerance)
    return q, k, v, float(alpha), alpha_heads, slopes, start, end, scale, bool(is_causal), bool(decode), need_uv, tol
