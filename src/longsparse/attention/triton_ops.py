"""The Triton backend's launches: launch configuration, the block forward, the split-K decode path and the
backward as kernel launches, and the ``torch.library`` custom ops (forward, backward, registered autograd) that
`triton_entmax` (the public API: semantics, what is supported, the algorithm) calls.

The kernels themselves are in attention/triton_kernels/ (tiles, solve, forward, backward, decode) as raw
functions; `_kernels()` has them wrapped with triton.jit at first use (compiled, or interpreted when
``TRITON_INTERPRET=1`` is set by then) and binds the wrapped kernels to this module's names, which the launches
call. The custom ops have fake implementations, so ``torch.compile`` traces a model that calls them (fullgraph).
"""

import os

import torch
from torch import Tensor

from .band import ROUNDING_MARGIN
from .triton_kernels import build
from .triton_kernels.backward import _bwd_dkdv_kernel, _bwd_dq_kernel, _bwd_prep_kernel
from .triton_kernels.decode import (
    _dec_combine_kernel,
    _dec_filter_kernel,
    _dec_out_kernel,
    _dec_scores_kernel,
    _dec_solve_kernel,
)
from .triton_kernels.forward import _fwd_kernel
from .triton_kernels.lang import TRITON_ERROR as _TRITON_ERROR
from .triton_kernels.lang import triton

# ALiBi band (attention/band.py) from this many keys: a few dozen small launches, worth it only on long rows
BAND_MIN_KEYS = 1024
# Decode candidates (X > −1) kept per split: at most split / DECODE_CANDIDATE_DIVISOR (random logits keep ~7 % of
# 32K keys; trained attention far fewer); a row with a split past that solves over all its logits.
DECODE_CANDIDATE_DIVISOR = 4
_TOL = 1e-6  # Newton step (in τ, whose bracket has width < 1) at which general α stops
_MAX_SWEEPS_EXACT = 24  # α = 1.5 / 2: the exact finish certifies after a few sweeps (a cap, not a budget)
_MAX_SWEEPS_GENERAL = 32  # other α: quadratic convergence once the bracket is tight
# Points per sweep of the threshold solve, (first sweep, later sweeps), by mode (general, 1.5, 2). More points
# cost element-wise work in every tile but fewer passes over K: on an H200, 4 first points timed 6 % faster
# than 8 and 3 % faster than 2 at 4K and 16K keys (benchmarks/results/gpu_check-h200-*). α = 1.5 sweeps later
# at one point, the closed form of the last sweep, and its forward takes the first sweep inside the max pass
# (`ANCHOR`): fewer passes on most heads and 17–29 % fewer point evaluations than (4, 2) on NoPE heads
# (docs/reports/2026-11-28-threshold-solve-strategies.md).
SOLVER_POINTS = {0: (4, 2), 1: (4, 1), 2: (4, 2)}
# α = 1.5, exact: the first sweep after the max pass (0-based) from which sweeps also accumulate P·V, so that the
# sweep certifying a whole block is its output pass too (−1: off). Counted on CPU, from the third sweep on
# (benchmarks/solver_emulator.py, `folded`): about one QKᵀ pass fewer per block for up to twice the P·V work;
# off until a GPU has timed that trade (benchmarks/gpu_check.py times both).
FOLD_FROM = -1
# α = 1.5, one-point sweeps: the number of largest scores per row the forward's max pass keeps (a power of two;
# 0: off, the max pass anchors the first sweep instead). A row whose support is smaller is certified from them
# with no sweep, and the others start from a bracket they narrow. Counted on CPU
# (docs/reports/2026-11-28-threshold-solve-strategies.md): 16 cut the QKᵀ passes of random NoPE logits from
# 5.4 to 3.9 per block at 1K keys and from 6.1 to 4.2 at 4K, for a sort of each key tile's scores in the max
# pass; off until a GPU has timed that trade (benchmarks/gpu_check.py times it). It composes with FOLD_FROM (whose
# sweep count then starts at the P0-point sweep): 32 with FOLD_FROM = 2 is the one setting counted within 4.5 passes
# per block on every input of that report, a diffuse trained layer included.
TOP_SCORES = 0

# Opt-in autotuning (LONGSPARSE_TRITON_AUTOTUNE=1 in the environment, or this set to True): on CUDA the block
# forward and the backward's dk/dv and dq kernels time each (num_warps, num_stages) of TUNE_CONFIGS that does not
# spill (`tune_spills`) at their first call per key (head dim, dtype, mode and flags, causality, ⌈log₂ Nk⌉) and
# keep the fastest, in memory and in Triton's cache directory (`triton.autotune` with cache_results), so a machine
# tunes a key once. The tiles (BM, BN) stay `_config`'s: the backward reads the forward's tile mask in them. Not
# tuned: decode (its key count grows every step and its time is mostly the host's), the interpreter, instrumented
# calls (`counts`), and calls made while a CUDA graph is captured (nothing can be timed inside a capture): those
# take `_config`'s choice.
AUTOTUNE = os.environ.get("LONGSPARSE_TRITON_AUTOTUNE", "") == "1"
TUNE_CONFIGS = tuple((warps, stages) for warps in (4, 8) for stages in (2, 3, 4))
_TUNE_KEYS = {
    "_fwd_kernel": ("len_class", "causal", "D", "MODE", "BAND", "STORE_UV", "FOLD_FROM", "TOP", "FTOL"),
    "_bwd_dkdv_kernel": ("len_class", "causal", "D", "MODE"),
    "_bwd_dq_kernel": ("len_class", "causal", "D", "MODE"),
}
_TUNED: dict = {}  # kernel name → its triton.autotune wrapper, built at first tuned launch

_MODE_GENERAL, _MODE_15, _MODE_2 = 0, 1, 2
INTERPRETER_BLOCK = 32  # query and key tile of the interpreter (CPU tensors): see `_config`


# ============================================================================ kernels
# The kernels live in attention/triton_kernels/ by role (tiles, solve, forward, backward, decode) as raw
# functions; `_kernels()` has them wrapped with triton.jit at first use and binds the wrapped kernels here.

_BUILT: bool | None = None  # None: not built; else whether the kernels run in the interpreter


def _kernels() -> bool:
    """Builds the kernels (compiled or interpreted, by TRITON_INTERPRET at this first use) and binds them to
    this module's names, which the launches below call. Returns whether they are interpreted."""
    global _BUILT
    if _BUILT is None:
        if triton is None:
            raise RuntimeError(_TRITON_ERROR)
        built, _BUILT = build.kernels()
        globals().update(built)
    return _BUILT


def _interpreter_mode() -> bool:
    """Whether the kernels run (or, once built, would run) in Triton's CPU interpreter."""
    return _BUILT if _BUILT is not None else build.interpreting()


# ============================================================================ launch configuration


def _launcher(kernel, device: torch.device, warps: int, stages: int, tune: bool = True):
    """(kernel, launch options) for a jitted ``kernel``: its `triton.autotune` wrapper and no options when
    AUTOTUNE applies to this launch (see AUTOTUNE), else the kernel itself with ``warps`` and ``stages``."""
    if not (AUTOTUNE and tune and device.type == "cuda" and not _BUILT) or torch.cuda.is_current_stream_capturing():
        return kernel, {"num_warps": warps, "num_stages": stages}
    name = kernel.fn.__name__
    tuned = _TUNED.get(name)
    if tuned is None:
        configs = [triton.Config({}, num_warps=w, num_stages=s) for w, s in TUNE_CONFIGS]

        def spill_free(configs, named_args, **consts):
            return [c for c in configs if not tune_spills(name, c.num_warps, consts)]

        tuned = _TUNED[name] = triton.autotune(
            configs=configs,
            key=list(_TUNE_KEYS[name]),
            prune_configs_by={"early_config_prune": spill_free},
            cache_results=True,
        )(kernel)
    return tuned, {}


def tune_spills(kernel_name: str, warps: int, consts: dict) -> bool:
    """Whether a tuned kernel at ``warps`` and its launch's constexprs ``consts`` (D, MODE, FOLD_FROM) spills more
    than 64 bytes a thread compiled for sm_90 (16-bit inputs; the bound `_config`'s choices keep), at some
    num_stages of TUNE_CONFIGS: 4 warps for the forward that folds the output pass (44–1,404 bytes) or solves
    general α (136–324 bytes), and for dk/dv at D > 64 (124–488 bytes). The autotuner does not time those
    (benchmarks/sm90_compile.py --tune-space; records in benchmarks/results/:
    sm90-compile-cpu-2026-11-28-tune-space.json, α = 1.5, and ...-tune-space-general-alpha.json)."""
    if warps != 4:
        return False
    if kernel_name == "_fwd_kernel":
        return consts["FOLD_FROM"] >= 0 or consts["MODE"] == _MODE_GENERAL
    return kernel_name == "_bwd_dkdv_kernel" and consts["D"] > 64


def autotune_choices() -> list[dict]:
    """The autotuner's choices so far in this process: one dict per (kernel, key) with the key's values (in
    _TUNE_KEYS's order, then the tensor arguments' dtypes), num_warps and num_stages."""
    return [
        {"kernel": name, "key": [str(v) for v in key], "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        for name, tuned in sorted(_TUNED.items())
        for key, cfg in tuned.cache.items()
    ]


def _len_class(n_keys: int) -> int:
    return max(0, int(n_keys) - 1).bit_length()


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ of host integers (triton.cdiv is a jitted function: called on the host it costs microseconds)."""
    return -(-a // b)


def _config(D: int, dtype: torch.dtype, device_type: str) -> dict:
    """Launch configuration: BM, BN (shared by the forward and the backward, since the tile mask is
    indexed in these tiles), num_warps per kernel, the dot precision, and the decode tiles (dec_BN for
    the split kernels, dec_BJ for the threshold sweep over scratch logits); fwd_fold: the forward's warps with
    FOLD_FROM on, fwd_general: for general α (two points a later sweep, Newton's finish).

    CUDA: chosen by compiling for sm_90 with ptxas -v (16-bit inputs: at most 64 bytes spilled by any kernel;
    general α's forward at D ≤ 64 takes 8 warps, where 4 spill 180 bytes). float32 inputs use
    3xTF32 dots (≈ fp32 accuracy on tensor cores; plain fp32 FMA dots spill tens of KB); at D = 128 their query
    tiles are 16 rows, where 32 spill 4.2 KB in the forward (16 rows: ≤ 88 bytes in the forward and decode,
    ≤ 504 in dk/dv): fp32 is the accuracy configuration, 16-bit the fast one. Under the interpreter (CPU tensors) tiles are
    INTERPRETER_BLOCK: its cost is per tile, nearly independent of the tile's size, and tests lower it
    to 16 (the smallest tile tl.dot takes) to span more tiles."""
    if device_type != "cuda":
        b = INTERPRETER_BLOCK
        return {
            "BM": b,
            "BN": b,
            "fwd": 4,
            "fwd_fold": 4,
            "fwd_general": 4,
            "prep": 4,
            "dkdv": 4,
            "dq": 4,
            "dec": 4,
            "dec_combine": 4,
            "dec_BN": b,
            "dec_BJ": 2 * b,
            "stages": 1,
            "prec": {torch.float32: "ieee", torch.bfloat16: "upcast"}.get(dtype, "tf32"),
        }
    if dtype == torch.float32:  # ≤ 32×32 tiles keep shared memory ≤ 96 KiB at D = 128 (A100-sized too)
        return {
            "BM": 32 if D <= 64 else 16,
            "BN": 32,
            "fwd": 4,
            "fwd_fold": 4,
            "fwd_general": 4,
            "prep": 4,
            "dkdv": 4,
            "dq": 4,
            "dec": 4,
            "dec_combine": 4,
            "dec_BN": 64,
            "dec_BJ": 512,
            "stages": 2,
            "prec": "tf32x3",
        }
    if D <= 64:
        return {
            "BM": 64,
            "BN": 64,
            "fwd": 4,
            "fwd_fold": 8,  # FOLD_FROM's two more (BM, D) accumulators spill 92 bytes at 4 warps (D = 64)
            "fwd_general": 8,  # general α's forward spills 180 bytes at 4 warps (D = 64)
            "prep": 8,
            "dkdv": 8,
            "dq": 4,
            "dec": 4,
            "dec_combine": 4,
            "dec_BN": 64,
            "dec_BJ": 512,
            "stages": 3,
            "prec": "tf32",
        }
    return {
        "BM": 64,
        "BN": 64,
        "fwd": 8,
        "fwd_fold": 8,
        "fwd_general": 8,
        "prep": 8,
        "dkdv": 8,
        "dq": 8,
        "dec": 4,
        "dec_combine": 4,
        "dec_BN": 64,
        "dec_BJ": 512,
        "stages": 2,
        "prec": "tf32",
    }


def _mode(alpha: float, alpha_heads: Tensor | None) -> int:
    if alpha_heads is None and alpha == 1.5:
        return _MODE_15
    if alpha_heads is None and alpha == 2.0:
        return _MODE_2
    return _MODE_GENERAL


_FILLED: dict = {}


def _filled(n: int, value, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A constant (n,) tensor, kept per (n, value, dtype, device): the kernels only read it, and a decode
    step then launches no fill kernels of its own."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.full((n,), value, dtype=dtype, device=device)  # graph-pool memory: not kept
    key = (n, value, dtype, str(device))
    t = _FILLED.get(key)
    if t is None:
        if len(_FILLED) > 256:
            _FILLED.clear()
        t = _FILLED[key] = torch.full((n,), value, dtype=dtype, device=device)
    return t


def _runtime_args(
    q: Tensor,
    k: Tensor,
    alpha: float,
    alpha_heads: Tensor | None,
    slopes: Tensor | None,
    key_start: Tensor | None,
    key_end: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The kernels' per-head α (H,) fp32, slopes (H,) fp32 (zeros: no bias), key starts and ends (B,)
    int32 (0 and Nk: no padding; given ones are already int32, see `_op_args`)."""
    B, H = q.shape[:2]
    Nk = int(k.shape[2])
    dev = q.device
    alphas = (
        _filled(H, float(alpha), torch.float32, dev)
        if alpha_heads is None
        else alpha_heads.to(device=dev, dtype=torch.float32).expand(H).contiguous()
    )
    slopes = (
        _filled(H, 0.0, torch.float32, dev)
        if slopes is None
        else slopes.to(device=dev, dtype=torch.float32).contiguous()
    )
    starts = _filled(B, 0, torch.int32, dev) if key_start is None else key_start
    ends = _filled(B, Nk, torch.int32, dev) if key_end is None else key_end
    return alphas, slopes, starts, ends


def _tile_mask_shape(
    B: int, H: int, Nq: int, Nk: int, D: int, dtype: torch.dtype, device_type: str, decode: bool
) -> tuple:
    if decode:
        return (0,)
    cfg = _config(D, dtype, device_type)
    return (B, H, -(-Nq // cfg["BM"]), -(-Nk // cfg["BN"]))


def _n_sm(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2


def _common_args(q: Tensor, k: Tensor, v: Tensor):
    return (*q.stride(), *k.stride(), *v.stride())


# ============================================================================ forward / backward launches


def _forward_impl(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alpha: float,
    alpha_heads: Tensor | None,
    slopes: Tensor | None,
    key_start: Tensor | None,
    key_end: Tensor | None,
    scale: float,
    is_causal: bool,
    decode: bool,
    need_uv: bool,
    tolerance: float = 0.0,
    counts: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    _kernels()
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group = H // Hkv
    mode = _mode(alpha, alpha_heads)
    max_sweeps = _MAX_SWEEPS_GENERAL if mode == _MODE_GENERAL else _MAX_SWEEPS_EXACT
    p0, p_later = SOLVER_POINTS[mode]
    cfg = _config(D, q.dtype, q.device.type)
    alphas, slopes_t, starts, ends = _runtime_args(q, k, alpha, alpha_heads, slopes, key_start, key_end)
    causal = int(is_causal)
    o = torch.empty((B, H, Nq, D), dtype=q.dtype, device=q.device)
    stats = torch.empty((3, B, H, Nq), dtype=torch.float32, device=q.device)
    empty = torch.empty((0,), dtype=torch.float32, device=q.device)
    if not decode:
        BM, BN = cfg["BM"], cfg["BN"]
        n_qb, n_kt = _cdiv(Nq, BM), _cdiv(Nk, BN)
        # the output pass writes the bits of the tiles it visits: the others must read "no support"
        tile_mask = torch.zeros((B, H, n_qb, n_kt), dtype=torch.int8, device=q.device)
        uv = torch.empty((B, H, Nq, D), dtype=torch.float32, device=q.device) if need_uv else empty
        live = torch.empty((B * H * n_qb, 2 * n_kt), dtype=torch.int32, device=q.device)
        band = slopes is not None and Nk >= BAND_MIN_KEYS
        knorm = _key_norm_bound(k, starts, ends) if band else stats
        fold_from = FOLD_FROM if mode == _MODE_15 and p_later == 1 and tolerance == 0 else -1
        top = min(TOP_SCORES, BN) if mode == _MODE_15 and p_later == 1 else 0
        warps = cfg["fwd_fold"] if fold_from >= 0 else cfg["fwd_general" if mode == _MODE_GENERAL else "fwd"]
        kernel, launch = _launcher(_fwd_kernel, q.device, warps, cfg["stages"], tune=counts is None)
        kernel[(B * H, n_qb)](
            q,
            k,
            v,
            o,
            stats,
            uv if need_uv else stats,
            tile_mask,
            live,
            stats if counts is None else counts,
            knorm,
            alphas,
            slopes_t,
            starts,
            ends,
            *_common_args(q, k, v),
            *o.stride(),
            H,
            group,
            Nq,
            Nk,
            n_qb,
            n_kt,
            scale,
            causal,
            _len_class(Nk),
            D=D,
            BM=BM,
            BN=BN,
            MODE=mode,
            P0=p0,
            P=p_later,
            MAX_SWEEPS=max_sweeps,
            TOL=_TOL,
            FTOL=tolerance,
            DOT_PREC=cfg["prec"],
            BAND=band,
            BAND_EPS=ROUNDING_MARGIN,
            ANCHOR=mode == _MODE_15 and p_later == 1 and top == 0,
            FOLD_FROM=fold_from,
            TOP=top,
            STORE_UV=need_uv,
            COUNT=counts is not None,
            **launch,
        )
        return o, stats, tile_mask, uv

    # decode: split-K logits → per-split candidates → per-row threshold → split-K output → combine
    BN, BJ = cfg["dec_BN"], cfg["dec_BJ"]
    hpp = group if group * Nq <= 64 else 1  # query heads per program (they share one kv head)
    BMd = max(16, _next_pow2(hpp * Nq))
    n_prog = B * (H // hpp)
    n_split = max(1, min(_cdiv(Nk, BN), _cdiv(2 * _n_sm(q.device), n_prog)))
    split = _cdiv(_cdiv(Nk, n_split), BN) * BN
    n_split = _cdiv(Nk, split)
    rows = B * H * Nq
    z = torch.empty((rows, Nk), dtype=torch.float32, device=q.device)
    mpart = torch.empty((rows, n_split), dtype=torch.float32, device=q.device)
    _dec_scores_kernel[(n_split, n_prog)](
        q,
        k,
        z,
        mpart,
        slopes_t,
        starts,
        ends,
        *q.stride(),
        *k.stride(),
        H,
        group,
        hpp,
        Nq,
        Nk,
        split,
        n_split,
        scale,
        causal,
        D=D,
        BM=BMd,
        BN=BN,
        DOT_PREC=cfg["prec"],
        num_warps=cfg["dec"],
    )
    cap = max(16, _cdiv(split, DECODE_CANDIDATE_DIVISOR))
    cand = torch.empty((rows, n_split, cap), dtype=torch.float32, device=q.device)
    cand_n = torch.empty((rows, n_split), dtype=torch.int32, device=q.device)
    _dec_filter_kernel[(n_split, rows)](
        z,
        mpart,
        cand,
        cand_n,
        alphas,
        starts,
        ends,
        H,
        Nq,
        Nk,
        split,
        n_split,
        cap,
        causal,
        BLOCK_J=BJ,
        BLOCK_S=_next_pow2(n_split),
        MODE=mode,
        num_warps=cfg["dec"],
    )
    _dec_solve_kernel[(rows,)](
        z,
        mpart,
        cand,
        cand_n,
        stats,
        alphas,
        starts,
        ends,
        H,
        Nq,
        Nk,
        n_split,
        cap,
        causal,
        BLOCK_J=BJ,
        BLOCK_S=_next_pow2(n_split),
        MODE=mode,
        P0=p0,
        P=p_later,
        MAX_SWEEPS=max_sweeps,
        TOL=_TOL,
        FTOL=tolerance,
    )
    opart = torch.empty((rows, n_split, D), dtype=torch.float32, device=q.device)
    lpart = torch.empty((rows, n_split), dtype=torch.float32, device=q.device)
    _dec_out_kernel[(n_split, n_prog)](
        z,
        v,
        stats,
        opart,
        lpart,
        alphas,
        starts,
        ends,
        *v.stride(),
        H,
        group,
        hpp,
        Nq,
        Nk,
        split,
        n_split,
        causal,
        D=D,
        BM=BMd,
        BN=BN,
        MODE=mode,
        DOT_PREC=cfg["prec"],
        num_warps=cfg["dec"],
    )
    _dec_combine_kernel[(rows,)](
        opart, lpart, o, stats, n_split, D=D, BLOCK_S=min(16, _next_pow2(n_split)), num_warps=cfg["dec_combine"]
    )
    return o, stats, torch.empty((0,), dtype=torch.int8, device=q.device), empty


def _key_norm_bound(k: Tensor, starts: Tensor, ends: Tensor) -> Tensor:
    """(B·H_kv,) fp32: an upper bound of ‖k_j‖ over each batch row's keys [start, end) (the norms of 16-bit
    keys are rounded to their dtype, 2^-9 relative at most for bfloat16: widened by 2^-8)."""
    B, Hkv, Nk, _ = k.shape
    kn = torch.linalg.vector_norm(k, dim=-1).float() * (1.0 + 2.0**-8)
    j = torch.arange(Nk, device=k.device)
    seen = (j >= starts.long()[:, None]) & (j < ends.long()[:, None])  # (B, Nk)
    return kn.masked_fill(~seen[:, None, :], 0.0).amax(-1).reshape(B * Hkv).contiguous()


def _live_lists(tile_mask: Tensor, B: int, H: int, Nq: int, Nk: int, BM: int, BN: int):
    """From the forward's tile mask (B, H, n_qb, n_kt) (or, for the decode path, every visible tile): per
    query block the key tiles holding support, listed first (B, H, n_qb, n_kt) int32, and their count
    (B, H, n_qb); per key tile the query blocks, (B, H, n_kt, n_qb) and (B, H, n_kt). The backward's loops
    then run over plain lists, which Triton software-pipelines (a branch on a mask bit inside the loop
    would not be)."""
    live = tile_mask.bool()
    tiles = torch.argsort((~live).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    blocks = torch.argsort((~live).transpose(-1, -2).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return (
        tiles.contiguous(),
        live.sum(-1, dtype=torch.int32).contiguous(),
        blocks.contiguous(),
        live.sum(-2, dtype=torch.int32).contiguous(),
    )


def _backward_impl(
    do: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    stats: Tensor,
    tile_mask: Tensor,
    uv: Tensor,
    alpha: float,
    alpha_heads: Tensor | None,
    slopes: Tensor | None,
    key_start: Tensor | None,
    key_end: Tensor | None,
    scale: float,
    is_causal: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    _kernels()
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group = H // Hkv
    cfg = _config(D, q.dtype, q.device.type)
    BM, BN = cfg["BM"], cfg["BN"]
    n_qb, n_kt = _cdiv(Nq, BM), _cdiv(Nk, BN)
    mode = _mode(alpha, alpha_heads)
    alphas, slopes, starts, ends = _runtime_args(q, k, alpha, alpha_heads, slopes, key_start, key_end)
    do = do.contiguous()
    dq = torch.empty((B, H, Nq, D), dtype=q.dtype, device=q.device)
    dk = torch.empty((B, Hkv, Nk, D), dtype=k.dtype, device=k.device)
    dv = torch.empty((B, Hkv, Nk, D), dtype=v.dtype, device=v.device)
    args = (alphas, slopes, starts, ends, *_common_args(q, k, v), H, group, Nq, Nk, n_qb)
    flags = {"D": D, "BM": BM, "BN": BN, "MODE": mode, "DOT_PREC": cfg["prec"]}
    if uv.numel() > 0:  # δ_i = dO_i · (Σ_j u_ij v_j / Σ_j u_ij), the second sum kept by the forward
        delta = (do.float() * uv).sum(-1).contiguous()
    else:
        delta = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
        _bwd_prep_kernel[(B * H, n_qb)](
            q, k, v, do, stats, delta, *args, scale, int(is_causal), num_warps=cfg["prep"], **flags
        )
    if tile_mask.numel() == 0:  # the decode path keeps no tile mask: every tile a row can see
        tile_mask = _visible_tiles(q, k, starts, ends, is_causal, BM, BN)
    tiles, n_tiles, blocks, n_blocks = _live_lists(tile_mask, B, H, Nq, Nk, BM, BN)
    kernel, launch = _launcher(_bwd_dkdv_kernel, q.device, cfg["dkdv"], cfg["stages"])
    kernel[(B * Hkv, n_kt)](
        q,
        k,
        v,
        do,
        dk,
        dv,
        stats,
        delta,
        blocks,
        n_blocks,
        *args,
        n_kt,
        scale,
        int(is_causal),
        _len_class(Nk),
        **launch,
        **flags,
    )
    kernel, launch = _launcher(_bwd_dq_kernel, q.device, cfg["dq"], cfg["stages"])
    kernel[(B * H, n_qb)](
        q,
        k,
        v,
        do,
        dq,
        stats,
        delta,
        tiles,
        n_tiles,
        *args,
        n_kt,
        scale,
        int(is_causal),
        _len_class(Nk),
        **launch,
        **flags,
    )
    return dq, dk, dv


def _visible_tiles(q: Tensor, k: Tensor, starts: Tensor, ends: Tensor, is_causal: bool, BM: int, BN: int) -> Tensor:
    """(B, H, n_qb, n_kt) int8: 1 for the key tiles holding a key some row of the query block can see."""
    B, H, Nq, _ = q.shape
    Nk = k.shape[2]
    n_qb, n_kt = _cdiv(Nq, BM), _cdiv(Nk, BN)
    dev = q.device
    first_key = torch.arange(n_kt, device=dev) * BN  # (n_kt,)
    last_row = torch.clamp(torch.arange(n_qb, device=dev) * BM + BM - 1, max=Nq - 1) + (Nk - Nq)  # (n_qb,)
    lo = starts.to(dev).long().clamp(0, Nk)[:, None, None]
    hi = ends.to(dev).long().clamp(0, Nk)[:, None, None]
    tile_hi = torch.minimum(first_key + BN, torch.full_like(first_key, Nk))
    seen = (first_key[None, None, :] < hi) & (tile_hi[None, None, :] > lo)
    if is_causal:
        seen = seen & (first_key[None, None, :] <= last_row[None, :, None])
    return seen.to(torch.int8)[:, None].expand(B, H, n_qb, n_kt).contiguous()


# ============================================================================ custom ops (torch.compile)


@torch.library.custom_op("longsparse::triton_entmax_attention", mutates_args=())
def _attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alpha: float,
    alpha_heads: Tensor | None,
    slopes: Tensor | None,
    key_start: Tensor | None,
    key_end: Tensor | None,
    scale: float,
    is_causal: bool,
    decode: bool,
    need_uv: bool,
    tolerance: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(O (B, H, Nq, D), stats (3, B, H, Nq) fp32 = row max, τ, 1/Σp, tile mask int8 (B, H, ⌈Nq/BM⌉,
    ⌈Nk/BN⌉) or (0,) from the decode path, and with need_uv (block path) Σ_j u_ij v_j / Σ_j u_ij (B, H, Nq, D)
    fp32 for the backward's δ, else (0,)). tolerance: 0 (exact τ) or the opt-in mode's bound on |Σp − 1|."""
    return _forward_impl(
        q, k, v, alpha, alpha_heads, slopes, key_start, key_end, scale, is_causal, decode, need_uv, tolerance
    )


@_attention_op.register_fake
def _attention_fake(
    q, k, v, alpha, alpha_heads, slopes, key_start, key_end, scale, is_causal, decode, need_uv, tolerance
):
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    o = q.new_empty((B, H, Nq, D))
    stats = q.new_empty((3, B, H, Nq), dtype=torch.float32)
    mask = q.new_empty(_tile_mask_shape(B, H, Nq, Nk, D, q.dtype, q.device.type, decode), dtype=torch.int8)
    uv = q.new_empty((B, H, Nq, D) if need_uv and not decode else (0,), dtype=torch.float32)
    return o, stats, mask, uv


@torch.library.custom_op("longsparse::triton_entmax_attention_backward", mutates_args=())
def _attention_backward_op(
    do: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    stats: Tensor,
    tile_mask: Tensor,
    uv: Tensor,
    alpha: float,
    alpha_heads: Tensor | None,
    slopes: Tensor | None,
    key_start: Tensor | None,
    key_end: Tensor | None,
    scale: float,
    is_causal: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    return _backward_impl(
        do, q, k, v, stats, tile_mask, uv, alpha, alpha_heads, slopes, key_start, key_end, scale, is_causal
    )


@_attention_backward_op.register_fake
def _attention_backward_fake(
    do, q, k, v, stats, tile_mask, uv, alpha, alpha_heads, slopes, key_start, key_end, scale, is_causal
):
    # contiguous, as `_backward_impl` returns them (empty_like would copy the strides of a transposed q)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, alpha, alpha_heads, slopes, key_start, key_end, scale, is_causal, _decode, _need_uv, _tol = inputs
    _, stats, tile_mask, uv = output
    ctx.save_for_backward(q, k, v, stats, tile_mask, uv, alpha_heads, slopes, key_start, key_end)
    ctx.alpha, ctx.scale, ctx.is_causal = alpha, scale, is_causal
    ctx.mark_non_differentiable(stats, tile_mask, uv)


def _backward(ctx, do, _dstats, _dmask, _duv):
    q, k, v, stats, tile_mask, uv, alpha_heads, slopes, key_start, key_end = ctx.saved_tensors
    dq, dk, dv = _attention_backward_op(
        do, q, k, v, stats, tile_mask, uv, ctx.alpha, alpha_heads, slopes, key_start, key_end, ctx.scale, ctx.is_causal
    )
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


_attention_op.register_autograd(_backward, setup_context=_setup_context)
