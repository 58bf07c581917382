"""GPU check of the Triton α-entmax attention kernels: correctness against the reference path, the kernel's
own pass counts, then speed and memory against torch SDPA (flash), AdaSplash-2 and an earlier version of the
kernel, training steps/s, and a converted Hugging Face model's attention calls and steps/s.

One call on any CUDA GPU (≤ 5 minutes in all; docs/gpu.md, "The GPU check of the Triton kernels"):

    git show 85d6dae:src/longsparse/attention/triton_entmax.py > /tmp/triton_entmax_85d6dae.py
    python benchmarks/gpu_check.py --out OUT/gpu_check.json --baseline /tmp/triton_entmax_85d6dae.py

On CPU, a stored call as markdown tables, its checks judged by the float32 rule (about two minutes):

    python benchmarks/gpu_check.py --rescore benchmarks/results/gpu_check_h200.json

On CPU, for the tests (Triton interpreter, tiny shapes; the timing and training code run once, their numbers
mean nothing):

    TRITON_INTERPRET=1 python benchmarks/gpu_check.py --dry-run --out /tmp/gpu_check.json

(a) checks: every feature of `entmax_attention_triton` (α = 1.25 / 1.5 / 2 / per head, causal or not,
    NAPE slopes, q-scales, N up to 4096 and odd N, GQA, right padding (key_end), left padding (key_start)
    and both, fully masked rows, decoding offsets and the decode path, head dims 16-128, fp16 / bf16,
    torch.compile) against ls.attention(backend="reference") in float64 (key ranges as the dense mask):
    max abs errors of the output and of dq, dk, dv (and the q-scale gradient). A float32 case passes
    within max(1e-4, 2 × the float32 reference's own error) per quantity (`fp32_verdict`), a 16-bit one
    within a bound relative to the largest reference entry; a failing case is recorded and the run goes
    on. `--rescore FILE` judges a stored file by the float32 rule on the CPU (for files written before
    the rule, it recomputes the float32 reference's errors). One more check generates greedily from a
    tiny model with a left-padded batch of 1,100-token prompts (so the cached steps take the split-K
    decode path): auto must run every attention call on triton, each row must give the tokens and
    logits of the row generated alone, and the static cache (eagerly, and replayed from a CUDA graph)
    the batch's tokens and logits. The cases run
    in a pool of worker processes, so that Triton compiles the kernel variants on several CPU cores at once
    (compilation, not the GPU, bounds this phase); the pool also compiles the timing phase's kernels, which
    land in Triton's on-disk cache.
(b) counts: what the block forward did per query block, counted by the kernel (`solver_counts`): QKᵀ
    passes, solver sweeps, blocks at the sweep cap, uncertified rows, key tiles per pass on ALiBi heads.
(c) timings, side by side in one process: the current kernel (`triton_*`) and, with --baseline PATH (an
    earlier version's src/longsparse/attention folder, or its one triton_entmax.py from before the kernels
    moved to attention/triton_kernels/: `load_baseline`), the earlier one (`prev_*`), at α = 1.5 without and
    with NAPE slopes (and α = 1.25, per-head α at two shapes; in some groups launch and solver variants beside
    the default, KERNEL_VARIANTS, `autotune` among them, whose picks the JSON keeps as `autotune_choices`),
    against SDPA flash (the anchor), AdaSplash-2 (forward + backward; its autotuning runs in the
    worker pool with Triton's autotuning cache) and softmax with NAPE through the flex and sdpa backends:
    causal bf16, B = 1, H = 16, groups N:D:direction in priority order (--groups). Each group's methods are
    timed interleaved (rounds of triton.testing.do_bench, each call after an L2 flush), medians; peak memory
    above the inputs from the first (warm-up) call. Decoding one query at 32K and 128K keys, eagerly and
    replayed from a CUDA graph (the difference is host time). The model-level decode (`generate`'s steps on a
    2-layer d = 256 ASEntmax / NAPE model, bf16, prompts of --model-decode-lengths tokens, 32 new tokens): the
    dynamic KV cache eagerly against the static cache eagerly and replayed from a CUDA graph, decode steps per
    second in interleaved rounds. torch.profiler's time per kernel of one
    forward + backward at N = 4096. No group starts after --budget-s − --train-reserve-s seconds.
(d) training and evaluation (`longsparse_experiments.bench_gpu_train`): steps/s of the GPU-scale model's
    training step, eager against compiled (`train.compile`), softmax and ASEntmax; seconds per example of
    evaluation at 256× and 1,024× the training length, softmax through flex against ASEntmax through triton.
    Nothing starts after --budget-s seconds (default 290).
(e) a Hugging Face model (runs before (d), in --hf-reserve-s kept from the timings): a small Llama converted by
    `longsparse.nn.hf.apply_papers_config`: every attention call of a training step (right-padded batch, bf16
    autocast) and of cached greedy generation (left-padded prompts; dynamic and static cache, decoding eager)
    must run on triton (auto; named in the dry run), its float32 logits must match backend="reference", and its
    training steps/s are timed against the same Llama with transformers' own sdpa attention.
The JSON is rewritten after every case, so a run cut short still leaves its results.
"""

import argparse
import collections
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import zlib
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import datetime, timezone
from pathlib import Path

T0 = time.perf_counter()  # the --budget-s clock starts before torch is imported
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch


def _elapsed() -> float:
    return time.perf_counter() - T0


# ============================================================================ (a) checks


def _nape(H: int) -> torch.Tensor:
    """NAPE: the first H/2 heads ALiBi with slopes 1/h, the others NoPE (zero slopes)."""
    return torch.tensor([1.0 / (h + 1) if h < H // 2 else 0.0 for h in range(H)])


def check_cases(dry: bool) -> list:
    """(name, spec) pairs; shapes shrink under --dry-run (interpreter: milliseconds per tile operation)."""
    n_big, n_mid, n_odd, n_dec = (48, 40, 37, 64) if dry else (4096, 1024, 1000, 4096)
    d = 16 if dry else 64

    def spec(**kw):
        return {"alpha": 1.5, "causal": True, "D": d, "H": 2, **kw}

    cases = []
    for alpha in (1.25, 1.5, 2.0):
        for causal in (True, False):
            if dry and causal == (alpha == 1.5):  # the dry run keeps one direction per α
                continue
            cases.append(
                (
                    f"alpha{alpha}_{'causal' if causal else 'full'}_nape_qscale",
                    spec(alpha=alpha, causal=causal, N=n_mid, nape=True, q_scale=True),
                )
            )
    cases += [
        ("alpha1.5_causal_plain_longest", spec(N=n_big)),
        ("alpha1.5_causal_nape_odd_N", spec(N=n_odd, nape=True)),
        ("alpha1.5_causal_N77", spec(N=21 if dry else 77, nape=True)),
        ("per_head_alpha", spec(alpha=[1.25, 1.5, 1.75, 2.0], N=n_mid, H=4, nape=True)),
        ("gqa_lengths_masked_rows", spec(N=n_mid, B=3, H=4, Hkv=2, nape=True, lengths=[n_mid, n_mid // 3, 0])),
        (
            "gqa_lengths_noncausal",
            spec(alpha=2.0, causal=False, N=n_mid, B=2, H=4, Hkv=1, lengths=[n_mid // 2 + 1, n_mid]),
        ),
        (
            "left_padding_block",
            spec(N=n_mid, B=3, H=4, Hkv=2, nape=True, q_scale=True, starts=[0, n_mid // 3 + 1, n_mid - n_mid // 4 + 3]),
        ),
        (
            "left_right_padding_noncausal",
            spec(
                alpha=1.25,
                causal=False,
                N=n_odd,
                B=3,
                nape=True,
                starts=[n_odd // 5, 0, n_odd // 2],
                lengths=[n_odd - 3, n_odd // 2, 1],
            ),
        ),
        ("decode_Nq1_auto", spec(N=n_dec, Nq=1, H=4, Hkv=2, nape=True, decode=True if dry else None)),
        ("decode_Nq5_decode_path", spec(N=n_dec, Nq=5, nape=True, q_scale=True, decode=True)),
        ("decode_Nq5_block_path", spec(N=n_dec, Nq=5, nape=True, decode=False)),
        (
            "decode_per_head_alpha_lengths",
            spec(alpha=[1.25, 2.0], N=n_dec, Nq=3, B=2, lengths=[n_dec, n_dec // 5], decode=True),
        ),
        (
            "decode_left_padding",
            spec(
                N=n_dec,
                Nq=1,
                B=2,
                H=4,
                Hkv=2,
                nape=True,
                q_scale=True,
                starts=[n_dec // 3 + 5, 0],
                decode=True if dry else None,
            ),
        ),
        ("bf16_inputs", spec(N=n_mid, nape=True, dtype="bfloat16")),
        ("fp16_inputs", spec(N=n_mid, nape=True, dtype="float16")),
        ("torch_compile_fullgraph", spec(N=24 if dry else n_mid, nape=True, q_scale=True, compile=True)),
    ]
    if not dry:
        cases += [
            ("head_dim_16", spec(N=n_mid, D=16, nape=True)),
            ("head_dim_32", spec(N=n_mid, D=32, nape=True)),
            ("head_dim_128_bf16", spec(N=n_mid, D=128, nape=True, dtype="bfloat16")),
        ]
    return cases


def _named_path(ls, name: str) -> dict:
    """ls.attention's keyword naming a backend: backend= (path= is its older, deprecated spelling)."""
    import inspect

    return {"backend": name} if "backend" in inspect.signature(ls.attention).parameters else {"path": name}


def _tolerance(dtype: str) -> float:
    return {"float32": 1e-4, "bfloat16": 3e-2, "float16": 1e-2}[dtype]


GRAD_NAMES = ("out", "dq", "dk", "dv", "dq_scale")


def _case_tensors(name: str, spec: dict, device: str) -> dict:
    """The inputs of one check case, drawn on the CPU from a generator seeded by the case's name (the same
    tensors on every machine), then moved to `device`: q, k, v (and q_scale) as grad leaves in the case's
    dtype, the upstream gradient `up`, α, NAPE slopes, key ranges and the dense mask the reference takes."""
    B, H, Hkv = spec.get("B", 1), spec["H"], spec.get("Hkv", spec["H"])
    Nk = spec["N"]
    Nq = spec.get("Nq", Nk)
    D = spec["D"]
    dtype = getattr(torch, spec.get("dtype", "float32"))
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    q = torch.randn(B, H, Nq, D, generator=g)
    k = torch.randn(B, Hkv, Nk, D, generator=g)
    v = torch.randn(B, Hkv, Nk, D, generator=g)
    up = torch.randn(B, H, Nq, D, generator=g)
    leaves = [t.to(device=device, dtype=dtype).requires_grad_() for t in (q, k, v)]
    if spec.get("q_scale"):
        leaves.append((torch.rand(B, H, Nq, 1, generator=g) + 0.5).to(device).requires_grad_())
    alpha = spec["alpha"]
    lengths = torch.tensor(spec["lengths"], device=device) if spec.get("lengths") else None
    starts = torch.tensor(spec["starts"], device=device) if spec.get("starts") else None
    mask = None  # the key ranges as the dense mask the reference takes
    if lengths is not None or starts is not None:
        j = torch.arange(Nk, device=device)[None, :]
        mask = (
            (j >= (0 if starts is None else starts[:, None])) & (j < (Nk if lengths is None else lengths[:, None]))
        ).view(B, 1, 1, Nk)
    return {
        "leaves": leaves,
        "up": up.to(device),
        "dtype": dtype,
        "alpha": torch.tensor(alpha, device=device) if isinstance(alpha, list) else alpha,
        "slopes": _nape(H).to(device) if spec.get("nape") else None,
        "lengths": lengths,
        "starts": starts,
        "mask": mask,
        "causal": spec["causal"],
    }


def _reference(case: dict, rdt: torch.dtype) -> list:
    """ls.attention(backend="reference") in dtype `rdt` on the case's inputs: [out, dq, dk, dv(, dq_scale)]."""
    import longsparse as ls

    alpha, slopes, mask = case["alpha"], case["slopes"], case["mask"]
    rl = [t.detach().to(rdt).requires_grad_() for t in case["leaves"]]
    if slopes is not None and not case["causal"]:
        # non-causal ALiBi is symmetric, −m·|i + Nk − Nq − j| (as flash-attn's): written out as an additive
        # mask, an oracle independent of the library's own bias
        Nq, Nk = rl[0].shape[2], rl[1].shape[2]
        i = torch.arange(Nq, device=rl[0].device, dtype=rdt)[:, None] + (Nk - Nq)
        j = torch.arange(Nk, device=rl[0].device, dtype=rdt)[None, :]
        bias = -slopes.to(rdt)[None, :, None, None] * (i - j).abs()
        mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        slopes = None
    ref = ls.attention(
        rl[0],
        rl[1],
        rl[2],
        mapping="entmax",
        alpha=alpha.to(rdt) if isinstance(alpha, torch.Tensor) else alpha,
        is_causal=case["causal"],
        alibi_slopes=None if slopes is None else slopes.to(rdt),
        q_scale=rl[3].squeeze(-1) if len(rl) > 3 else None,
        attn_mask=mask,
        **_named_path(ls, "reference"),
    )
    return [ref, *torch.autograd.grad((ref * case["up"].to(rdt)).sum(), rl)]


def _max_errors(got: list, want: list) -> dict:
    """Max abs difference per quantity (out, dq, dk, dv, dq_scale); inf where `got` is not finite."""
    return {
        n: (a.to(b.dtype) - b).abs().max().item() if torch.isfinite(a).all() else math.inf
        for n, a, b in zip(GRAD_NAMES, got, want)
    }


def fp32_verdict(errors: dict, ref32_errors: dict, tol: float = 1e-4) -> bool:
    """The float32 pass rule: each error within max(tol, 2 × the float32 reference's own error against
    float64). A float32 kernel cannot beat float32 arithmetic: with large logits (non-causal ALiBi reaches
    slope × N) or large gradients the float32 reference's own error exceeds any fixed absolute bound."""
    return all(e <= max(tol, 2.0 * ref32_errors.get(n, 0.0)) for n, e in errors.items())


def run_check(name: str, spec: dict, device: str) -> dict:
    """One correctness case: the kernel's output and gradients against the float64 reference; for float32
    inputs also the float32 reference's own error, the yardstick of `fp32_verdict`."""
    from longsparse.attention import triton_entmax as te

    t0 = time.perf_counter()
    row = {"case": name, **{k: v for k, v in spec.items() if k != "compile"}}
    try:
        case = _case_tensors(name, spec, device)
        leaves, dtype = case["leaves"], case["dtype"]

        def kernel(*ts):
            return te.entmax_attention_triton(
                ts[0],
                ts[1],
                ts[2],
                alpha=case["alpha"],
                is_causal=case["causal"],
                alibi_slopes=case["slopes"],
                q_scale=ts[3] if len(ts) > 3 else None,
                key_start=case["starts"],
                key_end=case["lengths"],
                decode=spec.get("decode"),
            )

        fn = kernel
        if spec.get("compile"):
            fn = torch.compile(kernel, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
        out = fn(*leaves)
        got = [out, *torch.autograd.grad((out.float() * case["up"]).sum(), leaves)]
        # reference: float64 for fp32 inputs, float32 on the rounded inputs for 16-bit ones
        rdt = torch.float64 if dtype == torch.float32 else torch.float32
        want = _reference(case, rdt)
        errors = _max_errors(got, want)
        scales = {n: max(b.abs().max().item(), 1.0) for n, b in zip(GRAD_NAMES, want)}
        if case["lengths"] is not None and 0 in spec["lengths"]:
            errors["masked_rows_abs_max"] = out[spec["lengths"].index(0)].abs().max().item()
            scales["masked_rows_abs_max"] = 1.0
        tol = _tolerance(spec.get("dtype", "float32"))
        if dtype == torch.float32:  # against float32 arithmetic's own error (fp32_verdict)
            ref32 = _max_errors(_reference(case, torch.float32), want)
            row.update(ref32_errors=ref32, tolerance_kind="abs, or 2x the float32 reference's error")
            ok = fp32_verdict(errors, ref32, tol)
        else:  # 16-bit: relative to the largest reference entry (gradients grow with N)
            row.update(tolerance_kind="relative")
            ok = all(e <= tol * scales[n] for n, e in errors.items())
        row.update(errors=errors, ref_abs_max=scales, tolerance=tol, ok=ok)
    except Exception as exc:  # noqa: BLE001 - recorded, and the run goes on
        row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000], traceback=traceback.format_exc()[-3000:])
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def rescore(path: str) -> str:
    """Judges a stored GPU check by `fp32_verdict`: the float32 reference's own error, recomputed here on
    the CPU for each float32 case that lacks it (inputs are seeded by the case's name, so they are the
    tensors the GPU saw), next to the kernel's stored errors. Returns a markdown table of every check: its
    largest error relative to the rule's bound, the float32 reference's error for that quantity, and the
    verdict under the stored rule and under the float32 rule (16-bit cases and the generation check have
    one rule only)."""
    data = json.loads(Path(path).read_text())
    specs = dict(check_cases(bool(data.get("dry_run"))))
    lines = [
        "| check | kernel's largest error | float32 reference's error | stored verdict | float32 rule |",
        "|---|---|---|---|---|",
    ]
    for row in data["checks"]:
        name, errors = row["case"], row.get("errors", {})
        spec = specs.get(name)
        stored = "passes" if row.get("ok") else "FAILS"
        if "error" in row:
            lines.append(f"| {name} | {row['error'][:80]} | | {stored} | {stored} |")
            continue
        grads = {n: e for n, e in errors.items() if n in GRAD_NAMES}
        if spec is not None and spec.get("dtype", "float32") == "float32" and grads:
            ref32 = row.get("ref32_errors")
            if ref32 is None:
                case = _case_tensors(name, spec, "cpu")
                ref32 = _max_errors(_reference(case, torch.float32), _reference(case, torch.float64))
            ok = fp32_verdict(errors, ref32)  # as run_check judges a float32 case
            worst = max(grads, key=lambda n: grads[n] / max(1e-4, 2.0 * ref32[n]))
            lines.append(
                f"| {name} | {grads[worst]:.1e} ({worst}) | {ref32[worst]:.1e} | {stored} | "
                f"{'passes' if ok else 'FAILS'} |"
            )
        else:
            worst = max(errors, key=errors.get) if errors else None
            err = f"{errors[worst]:.1e} ({worst})" if worst else "-"
            lines.append(f"| {name} | {err} | - | {stored} | {stored} |")
    return "\n".join(lines) + "\n"


def _ratio(x) -> str:
    """A stored ratio for a table; '-' where the base was not timed (the call's time ran out before it)."""
    return "-" if x is None else f"{x:.2f}"


def _ratio_to(rows: list, row: dict, prefix: str):
    """row's time over the time of the same method in another family (`prev_` for the baseline kernel), or of
    adasplash (prefix "adasplash"), within one group; None where that was not timed."""
    t = row.get("median_s")
    if not t:
        return None
    if prefix == "adasplash":
        other = next((r for r in rows if r.get("method", "").startswith("adasplash")), None)
    else:
        name = row.get("method", "")
        if not name.startswith("triton_"):
            return None
        other = next((r for r in rows if r.get("method") == prefix + name[len("triton_") :]), None)
    return t / other["median_s"] if other and other.get("median_s") else None


def timing_tables(path: str) -> str:
    """The stored timings as markdown: per (direction, N, D) each method's median time with its ratio to SDPA
    flash, to adasplash and (current kernel rows) to the baseline kernel, and its peak memory above the
    inputs; the decode steps eagerly and replayed from a CUDA graph; the kernel's own counts; the profile;
    the training rates."""
    data = json.loads(Path(path).read_text())
    lines = [
        "| direction | N | D | method | median ms | calls | vs SDPA | vs adasplash | vs baseline | peak extra MiB |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    groups = collections.defaultdict(list)
    for r in data["timings"]:
        groups[(r.get("direction"), r.get("N"), r.get("D"))].append(r)
    for (direction, N, D), rows in groups.items():
        for r in rows:
            t = r.get("median_s")
            if t is None:
                why = r.get("skipped") or r.get("error") or "not timed"
                lines.append(f"| {direction} | {N} | {D} | {r.get('method')} | {why[:60]} | | | | | |")
                continue
            base = r.get("vs_sdpa_flash", r.get("vs_sdpa"))
            peak = r.get("peak_extra_bytes")
            mib = f"{peak / 2**20:.1f}" if peak is not None else "-"
            lines.append(
                f"| {direction} | {N} | {D} | {r['method']} | {1e3 * t:.3f} | {r.get('calls', r.get('repeats', '-'))} "
                f"| {_ratio(base)} | {_ratio(_ratio_to(rows, r, 'adasplash'))} | {_ratio(_ratio_to(rows, r, 'prev_'))} "
                f"| {mib} |"
            )
    lines += ["", "| decode: keys | method | replay | median ms | vs SDPA (eager) |", "|---:|---|---|---:|---:|"]
    for r in data["decode"]:
        if r.get("median_s") is not None:
            ratio = r.get("vs_sdpa_eager", r.get("vs_sdpa"))
            lines.append(
                f"| {r['Nk']} | {r['method']} | {r.get('replay', 'eager')} | {1e3 * r['median_s']:.3f} | {_ratio(ratio)} |"
            )
    model_rows = data.get("model_decode") or []
    if model_rows:
        lines += [
            "",
            "| model decode: prompt | mode | new tokens | decode steps/s | rate / dynamic eager | setup s | tokens equal |",
            "|---:|---|---:|---:|---:|---:|---|",
        ]
        for r in model_rows:
            if r.get("tokens_per_s") is None:
                lines.append(f"| {r.get('N')} | {r.get('mode')} | {r.get('error', 'not timed')[:60]} | | | | |")
                continue
            lines.append(
                f"| {r['N']} | {r['mode']} | {r['new_tokens']} | {r['tokens_per_s']:.1f} | "
                f"{_ratio(r.get('vs_dynamic_eager'))} | {r['setup_median_s']:.3f} | {r.get('tokens_equal_dynamic')} |"
            )
    counts = data.get("solver_counts") or []
    if counts:
        lines += [
            "",
            "| counts: N | heads | QKᵀ passes mean / max | sweeps mean / max | blocks at cap | uncertified rows "
            "| tiles per pass / causal tiles |",
            "|---:|---|---|---|---:|---:|---:|",
        ]
        for r in counts:
            if "qk_passes_mean" in r:
                lines.append(
                    f"| {r['N']} | {r['heads']} | {r['qk_passes_mean']:.2f} / {r['qk_passes_max']:.2f} | "
                    f"{r['sweeps_mean']:.2f} / {r['sweeps_max']:.0f} | {r['blocks_at_cap']} | {r['uncertified_rows']} "
                    f"| {r['tiles_per_pass_fraction']:.3f} |"
                )
    prof = data.get("profile") or {}
    if prof.get("ms_by_kernel"):
        lines += ["", f"| profile (N = {prof['N']}, D = {prof['D']}, fwd+bwd, NAPE): kernel | ms |", "|---|---:|"]
        lines += [f"| {k[:70]} | {v:.3f} |" for k, v in prof["ms_by_kernel"].items()]
    hf = data.get("hf_model")
    if hf:
        rates = {k: f"{v:.1f}" for k, v in (hf.get("steps_per_s") or {}).items()}
        err = hf.get("logits_err_vs_reference")
        lines += [
            "",
            "| converted HF Llama | attention backends (calls) | logits err vs reference | steps/s | sdpa steps/s "
            "| / sdpa |",
            "|---|---|---:|---:|---:|---:|",
            f"| {'ok' if hf.get('ok') else hf.get('skipped', 'FAILS')} | {hf.get('backends', hf.get('error', '-'))} "
            f"| {'-' if err is None else f'{err:.1e}'} | {rates.get('longsparse', '-')} | {rates.get('sdpa', '-')} "
            f"| {_ratio(hf.get('vs_sdpa'))} |",
        ]
    lines += [
        "",
        "| training (GPU-scale model) | eager steps/s | compiled steps/s | compiled / eager |",
        "|---|---:|---:|---:|",
    ]
    for r in data["training"]:
        if r.get("part", "train") != "train":
            continue
        if r.get("eager_steps_per_s") or r.get("compiled_steps_per_s"):
            e, c = r.get("eager_steps_per_s"), r.get("compiled_steps_per_s")
            lines.append(
                f"| {r['method']} | {e and round(e, 1)} | {c and round(c, 1)} | {_ratio(r.get('compiled_vs_eager'))} |"
            )
        else:
            lines.append(f"| {r.get('method')} | {r.get('skipped', r.get('error', 'not run'))} | | |")
    evals = [r for r in data["training"] if r.get("part") == "eval"]
    if evals:
        lines += ["", "| evaluation: method | backend | × training length | s per example |", "|---|---|---:|---:|"]
        for r in evals:
            sec = r.get("seconds_per_example")
            what = f"{sec:.3f}" if sec else r.get("skipped", r.get("error", "not run"))[:60]
            lines.append(f"| {r['method']} | {r.get('backend')} | {r.get('multiple')} | {what} |")
    lines += ["", *(f"* {n}" for n in data.get("notes", []))]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def backends_used():
    """Counts the attention calls each backend runs inside the block (a Counter by backend name)."""
    from longsparse.attention import BACKENDS

    counts = collections.Counter()
    saved = dict(BACKENDS)

    def counted(backend):
        def run_call(call):
            counts[backend.name] += 1
            return backend.run_call(call)

        return dataclasses.replace(backend, run_call=run_call)

    BACKENDS.update({name: counted(b) for name, b in saved.items()})
    try:
        yield counts
    finally:
        BACKENDS.update(saved)


def generation_check(name: str, device: str, dry: bool) -> dict:
    """Cached greedy generation of a left-padded batch from a tiny ASEntmax / NAPE model (float32), as
    `generate` runs on CUDA: every attention call must run on triton (auto on the GPU; named in the dry run,
    where auto keeps CPU tensors off triton), and each row must give the tokens of the row generated alone
    and, teacher-forced through the cache, its logits. Prompts of 1,100 tokens put the cached steps on the
    split-K decode path (Nk ≥ 1024). The static cache (`generate(static_cache=True)`) and, on CUDA, its step
    replayed from a CUDA graph (`cuda_graph=True`) must give the batch's tokens and, teacher-forced, its
    logits."""
    from longsparse.nn import ModelConfig, Transformer

    t0 = time.perf_counter()
    row = {"case": name}
    try:
        n, new, layers = (24, 2, 1) if dry else (1100, 8, 2)
        pads = (n // 3, 0)
        torch.manual_seed(0)
        cfg = ModelConfig.from_dict(
            dict(
                vocab_size=64,
                d_model=64,
                n_layers=layers,
                n_heads=4,
                d_ff=128,
                attention=dict(method="asentmax", positions="nape", attn_backend="triton" if dry else "auto"),
            )
        )
        model = Transformer(cfg).to(device).eval()
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, 64, (len(pads), n), generator=g).to(device)
        follow = torch.randint(0, 64, (len(pads), new), generator=g).to(device)
        mask = torch.ones(len(pads), n, dtype=torch.bool, device=device)
        for b, s in enumerate(pads):
            mask[b, :s] = False

        def teacher_forced(prompt, prompt_mask, steps):
            cache = model.new_cache()
            out = [model(prompt, attention_mask=prompt_mask, cache=cache, logits_for="last")]
            out += [model(steps[:, t : t + 1], cache=cache, logits_for="last") for t in range(steps.shape[1])]
            return torch.cat(out, 1)

        def teacher_forced_static(graph):
            decoding = model.static_decoding(ids, mask, follow.shape[1] + 1, graph)
            out = [decoding.last_logits()]
            for t in range(follow.shape[1]):
                decoding.extend(follow[:, t : t + 1])
                out.append(decoding.last_logits().clone())  # a graph's logits are overwritten by its next replay
            return torch.stack(out, 1)

        static_modes = {"static": False, **({"graph": True} if device == "cuda" else {})}
        with torch.no_grad(), backends_used() as used:
            tokens = model.generate(ids, new, attention_mask=mask)
            logits = teacher_forced(ids, mask, follow)
            static_tokens, errors = {}, {}
            for mode, graph in static_modes.items():
                got = model.generate(ids, new, attention_mask=mask, static_cache=True, cuda_graph=graph)
                static_tokens[mode] = bool(torch.equal(got, tokens))
                errors[f"{mode}_logits"] = (teacher_forced_static(graph) - logits).abs().max().item()
        err, same = 0.0, True
        with torch.no_grad():
            for b, s in enumerate(pads):
                same &= torch.equal(tokens[b : b + 1], model.generate(ids[b : b + 1, s:], new))
                alone = teacher_forced(ids[b : b + 1, s:], None, follow[b : b + 1])
                err = max(err, (logits[b : b + 1] - alone).abs().max().item())
        errors = {"logits": err, **errors}
        row.update(
            prompt=n,
            pads=list(pads),
            new_tokens=new,
            backends=dict(used),
            tokens_equal=bool(same),
            static_tokens_equal=static_tokens,
            errors=errors,
            tolerance=1e-4,
            tolerance_kind="abs",
            ok=bool(same) and all(static_tokens.values()) and max(errors.values()) <= 1e-4 and set(used) == {"triton"},
        )
    except Exception as exc:  # noqa: BLE001 - recorded, and the run goes on
        row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000], traceback=traceback.format_exc()[-3000:])
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def _counts_inputs(N: int, H: int, D: int, device: str, dtype: torch.dtype):
    g = torch.Generator().manual_seed(N)
    return [torch.randn(1, H, N, D, generator=g).to(device=device, dtype=dtype) for _ in range(3)]


def solver_count_rows(device: str, dry: bool) -> list:
    """What the block forward does, counted by the kernel itself (`triton_entmax.solver_counts`) on random
    inputs (q, k, v ~ N(0, 1), 8 heads: 4 ALiBi with slopes 1/h, 4 NoPE): per length and head kind the QKᵀ
    passes per query block (mean, max), the solver's sweeps (mean, max), blocks at the sweep cap, rows that
    ended uncertified, and the key tiles a pass visits as a share of the causal tiles."""
    from longsparse.attention import triton_entmax as te

    lengths, D, dtype = ((48,), 16, torch.float32) if dry else ((1024, 4096, 16384), 64, torch.bfloat16)
    H = 8
    slopes = _nape(H).to(device)
    cap = te._MAX_SWEEPS_EXACT
    rows = []
    for N in lengths:
        q, k, v = _counts_inputs(N, H, D, device, dtype)
        c = te.solver_counts(q, k, v, alpha=1.5, is_causal=True, alibi_slopes=slopes)
        for kind, heads in (("alibi", slice(0, H // 2)), ("nope", slice(H // 2, H))):
            sweeps = c["sweeps"][:, heads].float()
            passes = c["qk_passes"][:, heads]
            per_pass = c["tiles_visited"][:, heads].float() / (sweeps + 2)
            rows.append(
                {
                    "N": N,
                    "D": D,
                    "dtype": str(dtype).replace("torch.", ""),
                    "heads": kind,
                    "qk_passes_mean": passes.mean().item(),
                    "qk_passes_max": passes.max().item(),
                    "sweeps_mean": sweeps.mean().item(),
                    "sweeps_max": sweeps.max().item(),
                    "blocks_at_cap": int((c["sweeps"][:, heads] >= cap).sum()),
                    "uncertified_rows": int(c["uncertified"][:, heads].sum()),
                    "tiles_per_pass_fraction": (per_pass.sum() / c["causal_tiles"][:, heads].sum()).item(),
                    "blocks": int(sweeps.numel()),
                }
            )
    return rows


def warm_kernels(spec: dict, device: str, baseline: str | None) -> dict:
    """Runs the timing phase's methods once at small sizes (forward, forward + backward, decode), filling
    Triton's on-disk cache, so the timing phase compiles nothing."""
    t0 = time.perf_counter()
    D, H = spec["D"], 16
    base = load_baseline(baseline) if baseline else None
    n = 1024  # ≥ triton_entmax.BAND_MIN_KEYS: the ALiBi rows compile their banded variants
    for backward in (False, True):
        groups = BACKWARD_VARIANT_GROUPS if backward else VARIANT_GROUPS
        variants = tuple(sorted({v for (_, d), vs in groups.items() if d == D for v in vs}))
        methods = _methods(n, D, H, device, backward, base, True, False, softmax=D == 64, variants=variants)
        for name, f in methods.items():
            leaves = [
                torch.randn(1, H, n, D, device=device, dtype=torch.bfloat16, requires_grad=backward) for _ in range(3)
            ]
            out = f(*leaves)
            if backward:
                out.backward(torch.ones_like(out))
    for name, f in _decode_methods(2048, D, H, device, base).items():
        f()
    torch.cuda.synchronize()
    return {"warm": D, "seconds": round(time.perf_counter() - t0, 2)}


def warm_adasplash(spec: dict, device: str) -> dict:
    """adasplash's first call at a shape autotunes (10-60 s): done here, in a pool worker, with Triton's
    autotuning cache on (TRITON_CACHE_AUTOTUNING), so the timing phase finds the tuned configuration."""
    t0 = time.perf_counter()
    try:
        import adasplash
    except ImportError:
        return {"warm_adasplash": None, "skipped": "adasplash is not installed"}
    N, D, H = spec["N"], spec["D"], 16
    leaves = [torch.randn(1, H, N, D, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    out = adasplash.adasplash(*leaves, alpha=1.5, is_causal=True)
    out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    return {"warm_adasplash": [N, D], "seconds": round(time.perf_counter() - t0, 2)}


def _pool_task(kind: str, name: str, spec: dict, device: str, dry: bool, baseline: str | None = None):
    if kind == "check":
        return run_check(name, spec, device)
    if kind == "generate":
        return generation_check(name, device, dry)
    if kind == "counts":
        return {"solver_counts": solver_count_rows(device, dry)}
    if kind == "adasplash":
        return warm_adasplash(spec, device)
    if kind == "hf":  # the converted Llama's kernels, compiled into Triton's on-disk cache for (e)
        row = hf_model_row(device, dry, math.inf, timed=False)
        return {"warm_hf": row.get("ok"), "error": row.get("error"), "seconds": row["seconds"]}
    return warm_kernels(spec, device, baseline)


# ============================================================================ (b) timings


def load_baseline(path: str):
    """The kernel module of an earlier version, loaded beside the current one with its custom ops registered
    under the namespace `longsparse_baseline`, so both can run in one process. `path` is either a copy of
    attention/triton_entmax.py from before the kernels moved to attention/triton_kernels/ (e.g. written by
    `git show REF:src/longsparse/attention/triton_entmax.py`), or a copy of a later version's
    src/longsparse/attention folder (e.g. `git archive REF src/longsparse/attention | tar -x -C DIR`)."""
    import importlib

    if Path(path).is_dir():
        folder = Path(path)
        if not (folder / "triton_entmax.py").is_file():
            raise ValueError(f"{path}: not a copy of src/longsparse/attention (no triton_entmax.py in it)")
        files = {f.relative_to(folder): f.read_text() for f in sorted(folder.rglob("*.py"))}
        _check_baseline_source(path, "".join(files.values()), files[Path("triton_entmax.py")])
        # only the modules the kernel file imports run: the folder's __init__ (which would register the
        # backends a second time) is replaced by an empty one; the custom ops (in triton_entmax.py, or in
        # triton_ops.py in later versions) are renamed wherever they are defined
        files[Path("__init__.py")] = ""
        files = {rel: text.replace('"longsparse::', '"longsparse_baseline::') for rel, text in files.items()}
        digest = zlib.crc32("".join(f"{k}\0{v}" for k, v in sorted(files.items(), key=str)).encode())
        name = f"longsparse_baseline_{digest:08x}"
        parent = Path(tempfile.gettempdir()) / "longsparse_baselines"
        package = parent / name
        if not package.exists():  # triton.jit reads a kernel's source from its file: the copy stays on disk
            tmp = parent / f"{name}.{os.getpid()}.tmp"
            for rel, text in files.items():
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / rel).write_text(text)
            try:
                os.replace(tmp, package)
            except OSError:  # another worker of the pool wrote the same copy first
                if not package.exists():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        if str(parent) not in sys.path:
            sys.path.insert(0, str(parent))
        return importlib.import_module(f"{name}.triton_entmax")
    import importlib.util

    src = Path(path).read_text()
    _check_baseline_source(path, src, src)
    src = src.replace('"longsparse::', '"longsparse_baseline::')
    if "from .band import" in src:  # a later version: its relative import names the current package
        src = src.replace("from .band import", "from longsparse.attention.band import")
    # triton.jit reads a kernel's source from its file: the renamed copy is written next to Triton's cache
    copy = Path(tempfile.gettempdir()) / f"longsparse_baseline_{zlib.crc32(src.encode()):08x}.py"
    if not copy.exists():
        tmp = copy.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(src)
        os.replace(tmp, copy)
    spec = importlib.util.spec_from_file_location("longsparse_baseline_triton_entmax", copy)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _check_baseline_source(path, sources: str, kernel_file: str) -> None:
    """`sources`: the text of every module given (the folder's, or the one file); `kernel_file`: triton_entmax.py."""
    if '"longsparse::triton_entmax_attention"' not in sources:
        raise ValueError(f"{path}: not a copy of longsparse/attention/triton_entmax.py (its custom op is missing)")
    if ("from .triton_kernels" in kernel_file or "from .triton_ops" in kernel_file) and not Path(path).is_dir():
        raise ValueError(
            f"{path}: this version keeps its kernels in attention/triton_kernels/: pass a copy of its "
            "src/longsparse/attention folder instead of the one file"
        )


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _bench_ms(fn, device: str, rep_ms: float) -> list:
    """Per-call times (ms) of `fn`: triton.testing.do_bench on CUDA (a warm-up, then as many calls as fit in
    rep_ms, each after an L2 flush, each timed by CUDA events); one wall-clock call on the CPU."""
    if device != "cuda":
        t0 = time.perf_counter()
        fn()
        return [1e3 * (time.perf_counter() - t0)]
    from triton.testing import do_bench

    times = do_bench(fn, warmup=max(1.0, rep_ms / 5), rep=rep_ms, return_mode="all")
    return list(times) if isinstance(times, (list, tuple)) else [float(times)]


def _first_call(fn, device: str, row: dict) -> bool:
    """The warm-up call (compiles, if still needed), with the peak memory above what was allocated before
    it (CUDA); an exception is recorded in the row. Returns whether the call worked."""
    try:
        _sync(device)
        if device == "cuda":
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        fn()
        _sync(device)
        row["first_call_s"] = round(time.perf_counter() - t0, 3)
        if device == "cuda":
            row["peak_extra_bytes"] = torch.cuda.max_memory_allocated() - base
        return True
    except Exception as exc:  # noqa: BLE001 - recorded in the JSON; the run goes on
        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        if device == "cuda":
            torch.cuda.empty_cache()
        return False


def _sdpa_context(device: str, decode: bool = False):
    """SDPA restricted to the flash backend on CUDA (flash or memory-efficient for decoding); any on CPU."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if device != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel(
        [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION] if decode else SDPBackend.FLASH_ATTENTION
    )


PER_HEAD_ALPHAS = (1.25, 1.5, 1.75, 2.0)
# Launch and solver variants of the current kernel, timed beside its defaults in some groups: name →
# (SOLVER_POINTS of α = 1.5 or None, overrides of the CUDA launch configuration `_config`)
KERNEL_VARIANTS = {  # name: (α = 1.5 solver points, launch-configuration overrides, triton_ops constants)
    "p0_4": ((4, 2), {}, {}),
    "p0_2": ((2, 2), {}, {}),
    "stages2": (None, {"stages": 2}, {}),
    "fwd_warps4": (None, {"fwd": 4}, {}),
    # D = 128: key tiles of 32 with the forward at 4 warps, no kernel spilling, two forward CTAs per SM
    # (test_d128_bn32_candidate_compiles_without_spills_at_two_ctas_per_sm)
    "d128_bn32": (
        None,
        {"BN": 32, "fwd": 4, "fwd_fold": 8, "fwd_general": 8, "prep": 4, "dkdv": 8, "dq": 4},
        {},
    ),
    # the output pass folded into the certifying sweep, P·V accumulated from the third / second sweep on
    "fold2": (None, {}, {"FOLD_FROM": 2}),
    "fold1": (None, {}, {"FOLD_FROM": 1}),
    # the max pass keeps each row's 16 / 32 largest scores, which certify small supports with no sweep
    "top16": (None, {}, {"TOP_SCORES": 16}),
    "top32": (None, {}, {"TOP_SCORES": 32}),
    # both: the sweeps a block the 32 largest scores left open folds the output pass into, from the third on
    "top32_fold2": (None, {}, {"TOP_SCORES": 32, "FOLD_FROM": 2}),
    # warps and stages of the forward and the backward's dk/dv and dq timed per key at first use (triton_ops.AUTOTUNE)
    "autotune": (None, {}, {"AUTOTUNE": True}),
}
VARIANT_GROUPS = {
    (4096, 64): ("p0_4", "p0_2", "stages2", "fold2", "fold1", "top16", "top32", "top32_fold2", "autotune"),
    (16384, 64): ("p0_4", "p0_2", "fold2", "top16", "top32", "top32_fold2", "autotune"),
    (4096, 128): ("fwd_warps4", "d128_bn32", "fold2", "top16", "autotune"),
    (16384, 128): ("d128_bn32", "autotune"),
}
BACKWARD_VARIANT_GROUPS = {(4096, 64): ("autotune",), (4096, 128): ("autotune",)}  # forward + backward


@contextlib.contextmanager
def kernel_variant(ops, name: str):
    """The current kernel's launches (module attention/triton_ops.py, where they read their configuration) with
    one of KERNEL_VARIANTS in force for the duration (one process, one call at a time)."""
    points, overrides, constants = KERNEL_VARIANTS[name]
    saved_points, saved_config = dict(ops.SOLVER_POINTS), ops._config
    saved_constants = {c: getattr(ops, c) for c in constants}
    if points is not None:
        ops.SOLVER_POINTS[1] = points
    if overrides:
        ops._config = lambda D, dtype, device_type: {**saved_config(D, dtype, device_type), **overrides}
    for c, value in constants.items():
        setattr(ops, c, value)
    try:
        yield
    finally:
        ops.SOLVER_POINTS.clear()
        ops.SOLVER_POINTS.update(saved_points)
        ops._config = saved_config
        for c, value in saved_constants.items():
            setattr(ops, c, value)


def _methods(
    N: int,
    D: int,
    H: int,
    device: str,
    backward: bool,
    baseline,
    extras: bool,
    adasplash: bool,
    softmax: bool = False,
    variants: tuple = (),
) -> dict:
    """name → callable(q, k, v) giving the causal output: SDPA flash (the anchor), the current kernel
    (`triton_*`) and, given a baseline module, the earlier one (`prev_*`), each at α = 1.5 without and with
    NAPE slopes; with `extras` also α = 1.25 (exact, and the current kernel's tolerance mode at ε = 10⁻²) and
    per-head α; with `adasplash` (forward + backward only: its
    first call at a shape autotunes) AdaSplash-2, which takes causal α = 1.5 without bias; with `softmax`
    softmax with NAPE through the flex backend and (forward only) the sdpa backend; `variants` (names of
    KERNEL_VARIANTS) the current kernel with NAPE under each."""
    import torch.nn.functional as F

    from longsparse.attention import triton_entmax as te
    from longsparse.attention import triton_ops

    slopes = _nape(H).to(device)
    per_head = torch.tensor([PER_HEAD_ALPHAS[h % len(PER_HEAD_ALPHAS)] for h in range(H)], device=device)

    def sdpa(q, k, v):
        with _sdpa_context(device):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    methods = {"sdpa_flash": sdpa}
    for prefix, mod in (("triton", te), ("prev", baseline)):
        if mod is None:
            continue
        methods[f"{prefix}_entmax15"] = lambda q, k, v, mod=mod: mod.entmax_attention_triton(
            q, k, v, alpha=1.5, is_causal=True
        )
        methods[f"{prefix}_entmax15_nape"] = lambda q, k, v, mod=mod: mod.entmax_attention_triton(
            q, k, v, alpha=1.5, is_causal=True, alibi_slopes=slopes
        )
        if extras:
            methods[f"{prefix}_entmax125_nape"] = lambda q, k, v, mod=mod: mod.entmax_attention_triton(
                q, k, v, alpha=1.25, is_causal=True, alibi_slopes=slopes
            )
            methods[f"{prefix}_per_head_alpha_nape"] = lambda q, k, v, mod=mod: mod.entmax_attention_triton(
                q, k, v, alpha=per_head, is_causal=True, alibi_slopes=slopes
            )
    if extras:  # the opt-in tolerance mode (current kernel only) where it saves most: general α
        methods["triton_entmax125_nape_tol1e-2"] = lambda q, k, v: te.entmax_attention_triton(
            q, k, v, alpha=1.25, is_causal=True, alibi_slopes=slopes, tolerance=1e-2
        )
    for variant in variants:

        def run(q, k, v, variant=variant):
            with kernel_variant(triton_ops, variant):
                return te.entmax_attention_triton(q, k, v, alpha=1.5, is_causal=True, alibi_slopes=slopes)

        run.variant = variant  # a backward timed through it runs under the variant as well (time_group)
        methods[f"triton_entmax15_nape_{variant}"] = run
    if adasplash and backward:
        try:
            import adasplash as ada

            methods["adasplash_entmax15"] = lambda q, k, v: ada.adasplash(q, k, v, alpha=1.5, is_causal=True)
        except ImportError:
            pass
    if softmax:  # the softmax baseline with NAPE: FlexAttention (bias in the kernel) and SDPA with a dense bias
        import longsparse as ls
        from longsparse.attention import BACKENDS

        for backend in ("flex", "sdpa"):
            # flex runs here on CUDA only (on the CPU it compiles for tens of seconds a shape and has no backward:
            # tests/unit/attention/test_flex.py covers it there); sdpa's bias path is the evaluation one (no gradient)
            if backend in BACKENDS and (device == "cuda" if backend == "flex" else not backward):
                methods[f"{backend}_softmax_nape"] = lambda q, k, v, backend=backend: ls.attention(
                    q, k, v, mapping="softmax", is_causal=True, alibi_slopes=slopes, backend=backend
                )
    return methods


def _time_interleaved(calls: dict, rows: dict, base: str, rounds: int, deadline: float, device: str, rep_ms: float):
    """Times the warmed-up ``calls`` (name -> no-argument function) interleaved: each of ``rounds`` rounds runs
    `_bench_ms` on every method in turn, so that load changes hit all of them alike; the median over every
    timed call. No method starts after ``deadline``. Writes ``median_s``, ``calls`` (timed calls in all) and
    ``vs_<base>`` into ``rows[name]``."""
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            if time.perf_counter() > deadline:
                break
            times[name] += _bench_ms(call, device, rep_ms)
    base_s = statistics.median(times[base]) / 1e3 if times.get(base) else None
    for name, ts in times.items():
        if ts:
            rows[name]["median_s"] = statistics.median(ts) / 1e3
            rows[name]["calls"] = len(ts)
            if base_s:
                rows[name][f"vs_{base}"] = rows[name]["median_s"] / base_s


def time_group(
    N: int,
    D: int,
    backward: bool,
    rounds: int,
    deadline: float,
    device: str,
    H: int,
    baseline,
    extras: bool,
    adasplash: bool,
    softmax: bool = False,
    variants: tuple = (),
) -> list:
    """Every method at one (N, D, direction), interleaved; rows with median seconds, the ratio to SDPA flash
    (and, in the tables, to adasplash and to the baseline kernel), peak memory above the inputs."""
    from longsparse.attention import triton_ops

    g = torch.Generator(device=device).manual_seed(N + D)
    q, k, v = (torch.randn(1, H, N, D, device=device, dtype=torch.bfloat16, generator=g) for _ in range(3))
    up = torch.randn(q.shape, device=device, dtype=q.dtype, generator=g)
    calls, rows = {}, {}
    for name, f in _methods(N, D, H, device, backward, baseline, extras, adasplash, softmax, variants).items():
        row = {"N": N, "D": D, "H": H, "B": 1, "dtype": "bfloat16", "causal": True, "method": name}
        row["direction"] = "fwd+bwd" if backward else "fwd"
        rows[name] = row
        if time.perf_counter() > deadline:
            row["skipped"] = "budget"
            continue
        if backward:
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]

            def call(f=f, leaves=leaves):
                variant = getattr(f, "variant", None)
                with kernel_variant(triton_ops, variant) if variant else contextlib.nullcontext():
                    torch.autograd.grad(f(*leaves), leaves, up)
        else:

            def call(f=f):
                with torch.no_grad():
                    f(q, k, v)

        if _first_call(call, device, row):
            calls[name] = call
    _time_interleaved(calls, rows, "sdpa_flash", rounds, deadline, device, rep_ms=20.0 if device == "cuda" else 0)
    return list(rows.values())


def _decode_methods(Nk: int, D: int, H: int, device: str, baseline) -> dict:
    """name → no-argument callable: one query (the last position) against an Nk-key bf16 cache."""
    import torch.nn.functional as F

    from longsparse.attention import triton_entmax as te

    g = torch.Generator(device=device).manual_seed(Nk)
    q = torch.randn(1, H, 1, D, device=device, dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(1, H, Nk, D, device=device, dtype=torch.bfloat16, generator=g) for _ in range(2))
    slopes = _nape(H).to(device)

    def sdpa():
        with _sdpa_context(device, decode=True):
            return F.scaled_dot_product_attention(q, k, v)

    methods = {"sdpa": sdpa}
    for prefix, mod in (("triton", te), ("prev", baseline)):
        if mod is not None:
            methods[f"{prefix}_entmax15_decode"] = lambda mod=mod: mod.entmax_attention_triton(
                q, k, v, alpha=1.5, is_causal=True, decode=True
            )
            methods[f"{prefix}_entmax15_nape_decode"] = lambda mod=mod: mod.entmax_attention_triton(
                q, k, v, alpha=1.5, is_causal=True, alibi_slopes=slopes, decode=True
            )
    return methods


def _graphed(fn):
    """`fn` captured in a CUDA graph after two eager warm-up calls: the returned callable replays it, so its
    time holds no host work (launches, checks, allocations)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def time_decode(Nk: int, D: int, rounds: int, deadline: float, device: str, H: int, baseline) -> list:
    """Decoding one query against Nk keys: each method eagerly and (CUDA) replayed from a CUDA graph; the
    difference is the host's cost per call."""
    calls, rows = {}, {}
    for name, f in _decode_methods(Nk, D, H, device, baseline).items():

        def call(f=f):
            with torch.no_grad():
                f()

        variants = [("eager", call)]
        if device == "cuda":
            variants.append(("graph", None))
        for mode, fn in variants:
            key = f"{name}_{mode}"
            rows[key] = {"Nk": Nk, "Nq": 1, "D": D, "H": H, "dtype": "bfloat16", "direction": "decode"}
            rows[key].update(method=name, replay=mode)
            try:
                fn = fn if fn is not None else _graphed(call)
            except Exception as exc:  # noqa: BLE001 - recorded in the JSON; the run goes on
                rows[key]["error"] = f"capture: {type(exc).__name__}: {exc}"[:500]
                continue
            if _first_call(fn, device, rows[key]):
                calls[key] = fn
    _time_interleaved(calls, rows, "sdpa_eager", rounds, deadline, device, rep_ms=10.0 if device == "cuda" else 0)
    return list(rows.values())


MODEL_DECODE = {"vocab_size": 512, "d_model": 256, "n_layers": 2, "n_heads": 4, "d_ff": 1024}
MODEL_DECODE_DRY = {"vocab_size": 64, "d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128}


def _greedy_steps(decoding, first_logits: torch.Tensor, steps: int) -> torch.Tensor:
    """The greedy loop of `generate` on a `Decoding` whose prompt gave ``first_logits`` (its one
    ``last_logits()`` call so far): ``steps`` decoding steps; returns the tokens (B, steps + 1)."""
    tokens = [first_logits.argmax(-1)]
    for _ in range(steps):
        decoding.extend(tokens[-1][:, None])
        tokens.append(decoding.last_logits().argmax(-1))
    return torch.stack(tokens, 1)


def time_model_decode(N: int, new_tokens: int, rounds: int, deadline: float, device: str, dry: bool) -> list:
    """The model-level decode: `Transformer.generate`'s steps for one prompt of N tokens (a 2-layer d = 256
    ASEntmax / NAPE model, bf16 on CUDA), dynamic KV cache eager against the static cache eager and replayed from
    a CUDA graph (CUDA), in interleaved rounds. Per mode: decode tokens per second (the steps after the prompt,
    host and device, synchronised at the end), the median setup seconds (prefill, copy into the static cache,
    warm-up and capture) and whether its tokens equal the dynamic cache's. The first round of each mode warms up
    (kernel compilation) and is not counted."""
    from longsparse.nn import ModelConfig, Transformer

    torch.manual_seed(0)
    shape = MODEL_DECODE_DRY if dry else MODEL_DECODE
    cfg = ModelConfig.from_dict({**shape, "attention": {"method": "asentmax", "positions": "nape"}})
    dtype = torch.float32 if dry else torch.bfloat16
    model = Transformer(cfg).to(device=device, dtype=dtype).eval()
    ids = torch.randint(0, shape["vocab_size"], (1, N), generator=torch.Generator().manual_seed(N)).to(device)
    mask = torch.ones_like(ids, dtype=torch.bool)
    steps = new_tokens - 1  # the last new token is never fed back
    modes = {
        "dynamic_eager": lambda: model.cached_decoding(ids, mask),
        "static_eager": lambda: model.static_decoding(ids, mask, new_tokens, False),
    }
    if device == "cuda":
        modes["static_graph"] = lambda: model.static_decoding(ids, mask, new_tokens, True)
    base = {"N": N, "new_tokens": new_tokens, "batch": 1, "dtype": str(dtype).replace("torch.", ""), **shape}
    rows = {mode: {**base, "method": "asentmax_nape", "mode": mode} for mode in modes}
    setup, decode, tokens = ({mode: [] for mode in modes} for _ in range(3))
    for r in range(rounds + 1):  # round 0 warms up
        for mode, make in modes.items():
            if time.perf_counter() > deadline or "error" in rows[mode]:
                continue
            try:
                with torch.no_grad():
                    _sync(device)
                    t0 = time.perf_counter()
                    decoding = make()
                    first = decoding.last_logits()  # the prompt (the dynamic cache runs it here)
                    _sync(device)
                    t1 = time.perf_counter()
                    out = _greedy_steps(decoding, first, steps)
                    _sync(device)
                    t2 = time.perf_counter()
            except Exception as exc:  # noqa: BLE001 - recorded in the JSON; the run goes on
                rows[mode]["error"] = f"{type(exc).__name__}: {exc}"[:500]
                continue
            del decoding
            tokens[mode].append(out)
            if r > 0:
                setup[mode].append(t1 - t0)
                decode[mode].append(t2 - t1)
    for mode, row in rows.items():
        if decode[mode]:
            row["setup_median_s"] = statistics.median(setup[mode])
            row["decode_median_s"] = statistics.median(decode[mode])
            row["tokens_per_s"] = steps / row["decode_median_s"]
            row["rounds"] = len(decode[mode])
        if tokens[mode] and tokens["dynamic_eager"]:
            row["tokens_equal_dynamic"] = bool(torch.equal(tokens[mode][0], tokens["dynamic_eager"][0]))
    dyn = rows["dynamic_eager"].get("tokens_per_s")
    for row in rows.values():
        if dyn and row.get("tokens_per_s"):
            row["vs_dynamic_eager"] = row["tokens_per_s"] / dyn
    if device == "cuda":
        torch.cuda.empty_cache()
    return list(rows.values())


def profile_kernels(N: int, D: int, device: str, H: int) -> dict:
    """GPU time per kernel (ms, summed over one call) of the current kernel's forward + backward with NAPE,
    from torch.profiler: which stage costs what."""
    from torch.profiler import ProfilerActivity, profile

    from longsparse.attention import triton_entmax as te

    g = torch.Generator(device=device).manual_seed(7)
    leaves = [
        torch.randn(1, H, N, D, device=device, dtype=torch.bfloat16, generator=g).requires_grad_() for _ in range(3)
    ]
    slopes = _nape(H).to(device)

    def call():
        out = te.entmax_attention_triton(*leaves, alpha=1.5, is_causal=True, alibi_slopes=slopes)
        torch.autograd.grad(out, leaves, torch.ones_like(out))

    call()
    _sync(device)
    activities = [ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        call()
        _sync(device)
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) if device == "cuda" else e.cpu_time_total
        if t:
            out[e.key] = round(t / 1e3, 4)
    return {"N": N, "D": D, "H": H, "ms_by_kernel": dict(sorted(out.items(), key=lambda kv: -kv[1])[:25])}


# ============================================================================ (e) a Hugging Face model

# The converted Llama of the HF phase: 4 layers, d 512, 8 query heads × 64 over 4 key-value heads
HF_SHAPE = {
    "vocab_size": 1024,
    "hidden_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "intermediate_size": 1024,
}
HF_DRY_SHAPE = {
    "vocab_size": 64,
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 64,
}
HF_TRAIN = {"batch": 8, "length": 1024, "prompt": 256, "new_tokens": 8, "steps": 5, "rounds": 3}
HF_DRY_TRAIN = {"batch": 2, "length": 24, "prompt": 12, "new_tokens": 2, "steps": 1, "rounds": 1}


def _hf_llama(device: str, dry: bool, convert: bool):
    """A Llama built from a config (seed 0, so both calls give the same weights) with transformers' own sdpa
    attention, or converted by `apply_papers_config` (ASEntmax + NAPE; auto's backend, triton named in the dry
    run, where auto keeps CPU tensors off triton)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from longsparse.nn.hf import apply_papers_config

    shape = HF_DRY_SHAPE if dry else HF_SHAPE
    cfg = LlamaConfig(attn_implementation="sdpa", pad_token_id=0, bos_token_id=None, eos_token_id=None, **shape)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device)
    if convert:
        apply_papers_config(model, backend="triton" if dry else "auto")
    return model


def _hf_batches(device: str, dry: bool, vocab: int) -> dict:
    """A right-padded training batch (row b keeps length − b·length/(2·batch) tokens) and a left-padded prompt
    batch (row b starts b·prompt/(2·batch) tokens late), as (ids, mask[, labels])."""
    p = HF_DRY_TRAIN if dry else HF_TRAIN
    B, n, m = p["batch"], p["length"], p["prompt"]
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, vocab, (B, n), generator=g)
    mask = torch.ones(B, n, dtype=torch.long)
    prompt = torch.randint(1, vocab, (B, m), generator=g)
    prompt_mask = torch.ones(B, m, dtype=torch.long)
    for b in range(B):
        mask[b, n - b * n // (2 * B) :] = 0
        prompt_mask[b, : b * m // (2 * B)] = 0
    ids, prompt = ids.masked_fill(mask == 0, 0), prompt.masked_fill(prompt_mask == 0, 0)
    return {
        "train": tuple(t.to(device) for t in (ids, mask, ids.masked_fill(mask == 0, -100))),
        "prompt": (prompt.to(device), prompt_mask.to(device)),
    }


def _hf_train_step(model, opt, batch, device: str, dry: bool) -> None:
    ids, mask, labels = batch
    with torch.autocast(device, dtype=torch.bfloat16, enabled=not dry):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def hf_model_row(device: str, dry: bool, deadline: float, timed: bool = True) -> dict:
    """A tiny Llama converted by `apply_papers_config` (ASEntmax + NAPE), through transformers: which backend
    each attention call runs on in a training step (right-padded batch, bf16 autocast) and in cached greedy
    generation of a left-padded batch (dynamic and static cache), which must be triton for every call (causal +
    padding reach attention as key ranges); the max abs difference of its float32 logits at real tokens from the
    same model on backend="reference"; and, when ``timed``, training steps/s (AdamW, bf16 autocast) against the
    same Llama with transformers' own sdpa attention (RoPE, softmax), timed interleaved in rounds, medians; no
    round starts after ``deadline``. Untimed, it fills Triton's on-disk cache for the timed call."""
    t0 = time.perf_counter()
    p = HF_DRY_TRAIN if dry else HF_TRAIN
    row = {"model": "llama", **(HF_DRY_SHAPE if dry else HF_SHAPE), **p, "autocast": None if dry else "bfloat16"}
    if importlib.util.find_spec("transformers") is None:
        return {**row, "skipped": "transformers (optional extra) is not installed", "seconds": 0.0}
    try:
        model = _hf_llama(device, dry, convert=True)
        layers = model.config.num_hidden_layers
        data = _hf_batches(device, dry, model.config.vocab_size)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        backends, expected = {}, {}
        with backends_used() as used:
            _hf_train_step(model, opt, data["train"], device, dry)
        backends["train_step"], expected["train_step"] = dict(used), layers
        model.eval()
        ids, mask = data["prompt"]
        for cache in ("dynamic", "static"):
            with torch.no_grad(), backends_used() as used:
                # generate compiles a static cache's decoding steps on CUDA by default; traced by torch.compile the
                # padding cannot be checked for one run per row, so those steps take the dense mask (docs/hf.md)
                model.generate(
                    ids,
                    attention_mask=mask,
                    max_new_tokens=p["new_tokens"],
                    do_sample=False,
                    cache_implementation=cache,
                    disable_compile=True,
                )
            backends[f"generate_{cache}"], expected[f"generate_{cache}"] = dict(used), layers * p["new_tokens"]
        ids, mask, _ = data["train"]
        with torch.no_grad():
            got = model(input_ids=ids, attention_mask=mask).logits
            settings = model.config.longsparse
            model.config.longsparse = {**settings, "backend": "reference"}  # read at every attention call
            want = model(input_ids=ids, attention_mask=mask).logits
            model.config.longsparse = settings
        real = mask.bool()
        err = (got[real] - want[real]).abs().max().item()
        row.update(
            backends=backends,
            expected_calls=expected,
            logits_err_vs_reference=err,
            tolerance=1e-3,
            ok=err <= 1e-3 and all(backends[k] == {"triton": n} for k, n in expected.items()),
        )
        if timed:
            model.train()
            own = _hf_llama(device, dry, convert=False).train()
            models = {"longsparse": (model, opt), "sdpa": (own, torch.optim.AdamW(own.parameters(), lr=1e-4))}
            for m, o in models.values():  # warm-up: the kernels (compiled in the pool) and the optimizer state
                _hf_train_step(m, o, data["train"], device, dry)
            rates = {name: [] for name in models}
            for r in range(p["rounds"]):
                if r and time.perf_counter() > deadline:
                    break
                for name, (m, o) in models.items():
                    _sync(device)
                    t = time.perf_counter()
                    for _ in range(p["steps"]):
                        _hf_train_step(m, o, data["train"], device, dry)
                    _sync(device)
                    rates[name].append(p["steps"] / (time.perf_counter() - t))
            steps_per_s = {name: statistics.median(v) for name, v in rates.items()}
            row.update(
                steps_per_s=steps_per_s,
                rounds_timed=len(rates["sdpa"]),
                vs_sdpa=steps_per_s["longsparse"] / steps_per_s["sdpa"],
            )
    except Exception as exc:  # noqa: BLE001 - recorded, and the run goes on
        row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000], traceback=traceback.format_exc()[-3000:])
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


# ============================================================================ driver


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def _env(device: str) -> dict:
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": device,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    try:
        import adasplash

        env["adasplash"] = getattr(adasplash, "__version__", "installed")
    except ImportError:
        env["adasplash"] = None
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["capability"] = list(torch.cuda.get_device_capability())
    return env


DEFAULT_GROUPS = (
    "4096:64:fwd",
    "4096:64:fwd+bwd",
    "16384:64:fwd",
    "16384:64:fwd+bwd",
    "1024:64:fwd",
    "1024:64:fwd+bwd",
    "32768:64:fwd",
    "32768:64:fwd+bwd",
    "4096:128:fwd",
    "4096:128:fwd+bwd",
    "16384:128:fwd",
    "16384:128:fwd+bwd",
    "65536:64:fwd",
)
EXTRA_ROWS = {(4096, 64), (16384, 64)}  # groups that also time α = 1.25 and per-head α
# adasplash's autotuning runs in the pool (10-60 s a shape, 220 s at 32K keys on an H200): two shapes only
ADASPLASH_SHAPES = ((4096, 64), (16384, 64))


def _parse_group(text: str) -> tuple:
    try:
        n, d, direction = text.split(":")
        if direction not in ("fwd", "fwd+bwd"):
            raise ValueError
        return int(n), int(d), direction == "fwd+bwd"
    except ValueError:
        raise argparse.ArgumentTypeError(f"a timing group is N:D:fwd or N:D:fwd+bwd, not {text!r}") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON file to write (required unless --rescore)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    ap.add_argument("--budget-s", type=float, default=290.0, help="nothing new starts after this many seconds")
    ap.add_argument(
        "--train-reserve-s",
        type=float,
        default=50.0,
        help="seconds kept from the timings for the training steps at the end",
    )
    ap.add_argument(
        "--baseline",
        metavar="PATH",
        help="an earlier version's src/longsparse/attention folder (from `git archive REF src/longsparse/attention`),"
        " or for versions before attention/triton_kernels/ its triton_entmax.py, timed beside the current kernel"
        " (rows prev_*)",
    )
    ap.add_argument("--workers", type=int, default=None, help="processes for the checks (compilation in parallel)")
    ap.add_argument("--groups", type=_parse_group, nargs="*", default=[_parse_group(g) for g in DEFAULT_GROUPS])
    ap.add_argument("--decode-lengths", type=int, nargs="*", default=[32768, 131072])
    ap.add_argument(
        "--model-decode-lengths",
        type=int,
        nargs="*",
        default=[4096, 32768],
        help="prompt lengths of the model-level decode rows (generate: dynamic cache against a CUDA graph)",
    )
    ap.add_argument("--model-decode-new-tokens", type=int, default=32, help="new tokens of each model-level decode")
    ap.add_argument("--cases", nargs="*", default=None, help="run only the checks whose name contains one of these")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--skip-training", action="store_true")
    ap.add_argument("--skip-hf", action="store_true", help="skip (e), the converted Hugging Face Llama")
    ap.add_argument(
        "--hf-reserve-s",
        type=float,
        default=20.0,
        help="seconds kept from the timings for (e), the converted Hugging Face Llama, before the training rows",
    )
    ap.add_argument(
        "--rescore",
        metavar="JSON",
        help="a stored check file as markdown tables: its checks judged by the float32 rule (fp32_verdict, on the "
        "CPU), its timings as ratios to SDPA, adasplash and the baseline kernel, its counts and training rates",
    )
    args = ap.parse_args(argv)
    if args.rescore:
        print(rescore(args.rescore) + "\n" + timing_tables(args.rescore), end="")
        return 0
    if not args.out:
        ap.error("--out is required (the JSON file to write)")
    if args.baseline and not Path(args.baseline).exists():
        ap.error(f"--baseline {args.baseline}: no such file or folder")

    dry = args.dry_run
    if dry:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    else:
        os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")  # adasplash's tuning, done in the pool, is reused
    device = "cpu" if dry else "cuda"
    if not dry and not torch.cuda.is_available():
        print("no CUDA device: use --dry-run on CPU", file=sys.stderr)
        return 2
    baseline = load_baseline(args.baseline) if args.baseline else None
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # no training starts after this; the dry run goes through every stage once whatever the machine's load
    deadline = math.inf if dry else T0 + args.budget_s
    hf_deadline = deadline - (0.0 if args.skip_training else args.train_reserve_s)
    timing_deadline = hf_deadline - (0.0 if args.skip_hf else args.hf_reserve_s)
    data = {
        "benchmark": "gpu_check",
        "dry_run": dry,
        "env": _env(device),
        "config": {**vars(args), "groups": [list(g) for g in args.groups]},
        "checks": [],
        "solver_counts": [],
        "timings": [],
        "decode": [],
        "model_decode": [],
        "profile": None,
        "hf_model": None,
        "training": [],
        "warm": [],
        "notes": [],
    }
    _write(out_path, data)

    # (a) checks and the kernels' own counts, with the timing kernels compiled (and adasplash tuned) alongside
    if not args.skip_checks:
        cases = [("check", n, s) for n, s in check_cases(dry)] + [("generate", "model_generate_left_padded", {})]
        tasks = [c for c in cases if not args.cases or any(x in c[1] for x in args.cases)]
        tasks.append(("counts", "solver_counts", {}))
        if not dry:  # the timing phase's kernel variants, and the training's (head dim 32)
            dims = ([] if args.skip_timing else sorted({d for _, d, _ in args.groups})) + (
                [] if args.skip_training else [32]
            )
            tasks = [("warm", f"warm_D{d}", {"D": d}) for d in dict.fromkeys(dims)] + tasks
            if not args.skip_hf:
                tasks = [("hf", "warm_hf_llama", {})] + tasks
            if not args.skip_timing:
                wanted = {(n, d) for n, d, bwd in args.groups if bwd}
                tasks = [
                    ("adasplash", f"adasplash_{n}_{d}", {"N": n, "D": d})
                    for n, d in ADASPLASH_SHAPES
                    if (n, d) in wanted
                ] + tasks
        workers = args.workers or (2 if dry else max(1, min(8, (os.cpu_count() or 2) - 1)))
        import multiprocessing as mp

        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
            futures = {
                pool.submit(_pool_task, kind, name, spec, device, dry, args.baseline): (kind, name)
                for kind, name, spec in tasks
            }
            for fut in as_completed(futures):
                kind, name = futures[fut]
                try:
                    res = fut.result()
                except Exception as exc:  # noqa: BLE001 - recorded in the JSON; the run goes on
                    res = {"case": name, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
                if kind in ("check", "generate"):
                    data["checks"].append(res)
                    print(
                        f"[{_elapsed():6.1f}s] check {name}: {'ok' if res.get('ok') else 'FAIL'} "
                        f"{res.get('errors', res.get('error'))}",
                        flush=True,
                    )
                elif kind == "counts":
                    data["solver_counts"] = res.get("solver_counts", [res])
                    for r in data["solver_counts"]:
                        print(f"[{_elapsed():6.1f}s] counts {r}", flush=True)
                else:
                    data["warm"].append({"task": name, **res})
                    print(f"[{_elapsed():6.1f}s] {name}: {res}", flush=True)
                _write(out_path, data)
        order = {name: i for i, (_, name, _) in enumerate(tasks)}
        data["checks"].sort(key=lambda r: order.get(r["case"], 0))
        data["checks_passed"] = sum(bool(r.get("ok")) for r in data["checks"])
        data["checks_total"] = len(data["checks"])
        data["checks_seconds"] = round(_elapsed(), 1)
        _write(out_path, data)

    # (b) timings; the dry run goes through the same code once at tiny sizes (its times mean nothing)
    groups, decode_lengths, rounds, heads = args.groups, args.decode_lengths, 3, 16
    model_decode_lengths, model_new_tokens = args.model_decode_lengths, args.model_decode_new_tokens
    if dry:
        groups, decode_lengths, rounds, heads = [(32, 16, False), (32, 16, True)], [48], 1, 2
        model_decode_lengths, model_new_tokens = [24], 4
    if not args.skip_timing:
        for Nk in decode_lengths:
            if time.perf_counter() > timing_deadline:
                data["notes"].append(f"budget reached before decode Nk={Nk}")
                continue
            try:
                rows = time_decode(Nk, 128 if not dry else 16, rounds, timing_deadline, device, heads, baseline)
            except Exception as exc:  # noqa: BLE001 - recorded in the JSON; the run goes on
                rows = [{"Nk": Nk, "direction": "decode", "error": f"{type(exc).__name__}: {exc}"[:500]}]
            data["decode"] += rows
            for r in rows:
                print(
                    f"[{_elapsed():6.1f}s] decode Nk={Nk} {r.get('method')} {r.get('replay')}: "
                    f"{r.get('median_s', r.get('error'))} vs_sdpa={r.get('vs_sdpa_eager')}",
                    flush=True,
                )
            _write(out_path, data)
        for N in model_decode_lengths:
            if time.perf_counter() > timing_deadline:
                data["notes"].append(f"budget reached before the model decode at N={N}")
                continue
            try:
                rows = time_model_decode(N, model_new_tokens, rounds, timing_deadline, device, dry)
            except Exception as exc:  # noqa: BLE001 - recorded in the JSON; the run goes on
                rows = [{"N": N, "error": f"{type(exc).__name__}: {exc}"[:500]}]
            data["model_decode"] += rows
            for r in rows:
                print(
                    f"[{_elapsed():6.1f}s] model decode N={N} {r.get('mode')}: "
                    f"{r.get('tokens_per_s', r.get('error'))} tokens/s vs dynamic={r.get('vs_dynamic_eager')} "
                    f"tokens equal={r.get('tokens_equal_dynamic')}",
                    flush=True,
                )
            _write(out_path, data)
        for N, D, backward in groups:
            direction = "fwd+bwd" if backward else "fwd"
            if time.perf_counter() > timing_deadline:
                data["notes"].append(f"budget reached before N={N} D={D} {direction}")
                continue
            try:
                rows = time_group(
                    N,
                    D,
                    backward,
                    rounds,
                    timing_deadline,
                    device,
                    heads,
                    baseline,
                    extras=(N, D) in EXTRA_ROWS,
                    adasplash=not dry and (N, D) in ADASPLASH_SHAPES,
                    softmax=D == 64 or dry,
                    variants=(BACKWARD_VARIANT_GROUPS if backward else VARIANT_GROUPS).get((N, D), ()),
                )
            except Exception as exc:  # noqa: BLE001 - recorded in the JSON; the run goes on
                rows = [{"N": N, "D": D, "direction": direction, "error": f"{type(exc).__name__}: {exc}"[:500]}]
            data["timings"] += rows
            for r in rows:
                print(
                    f"[{_elapsed():6.1f}s] {direction} N={N} D={D} {r.get('method')}: "
                    f"{r.get('median_s', r.get('error'))} vs_sdpa={r.get('vs_sdpa_flash')}",
                    flush=True,
                )
            _write(out_path, data)
            if device == "cuda":
                torch.cuda.empty_cache()
        if device == "cuda":  # what the `autotune` variant's rows chose, per kernel and key
            from longsparse.attention import triton_ops

            data["autotune_choices"] = triton_ops.autotune_choices()
        if time.perf_counter() < timing_deadline:
            try:
                data["profile"] = profile_kernels(32 if dry else 4096, 16 if dry else 64, device, heads)
            except Exception as exc:  # noqa: BLE001 - recorded in the JSON; the run goes on
                data["profile"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            _write(out_path, data)

    # (e) the converted Hugging Face Llama: every attention call on triton, its steps/s against transformers' sdpa
    if not args.skip_hf:
        if time.perf_counter() < hf_deadline:
            data["hf_model"] = hf_model_row(device, dry, hf_deadline)
            r = data["hf_model"]
            print(
                f"[{_elapsed():6.1f}s] hf llama: {'ok' if r.get('ok') else 'FAIL'} backends {r.get('backends')} "
                f"steps/s {r.get('steps_per_s', r.get('error'))} vs sdpa {r.get('vs_sdpa')}",
                flush=True,
            )
        else:
            data["notes"].append("budget reached before the Hugging Face model")
        _write(out_path, data)

    # (d) training and evaluation rows: compiled against eager training steps of the GPU-scale model, and seconds
    # per example of evaluation at 256× / 1,024×, softmax through flex against ASEntmax through triton
    if not args.skip_training:
        from longsparse_experiments.bench_gpu_train import gpu_train_rows

        left = deadline - time.perf_counter()
        if left > 0:
            data["training"] = gpu_train_rows(left, device=device, dry=dry, parts=("train", "eval"))["rows"]
        else:
            data["notes"].append("budget reached before the training rows")
        for row in data["training"]:
            print(f"[{_elapsed():6.1f}s] {row}", flush=True)
        _write(out_path, data)
    data["total_seconds"] = round(_elapsed(), 1)
    _write(out_path, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
