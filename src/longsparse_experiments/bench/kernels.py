"""`longsparse bench mapping | attention | short`: the mappings row-wise and attention calls against
torch.softmax / SDPA, interleaved in one process (attention: one fresh process per measurement)."""

from __future__ import annotations

import json
from typing import Callable

import torch

from longsparse_experiments.bench.timing import time_interleaved, time_median, wall_and_cpu_interleaved, worker_command


def _fwd_bwd(mapping: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, g: torch.Tensor) -> Callable[[], None]:
    def run():
        xx = x.detach().requires_grad_()
        mapping(xx).backward(g)

    return run


def bench_mapping(lengths, repeats: int, total_elements: int = 1 << 22) -> list[dict]:
    """Rows of length N (total_elements scores per call), fwd and fwd+bwd, as ratios to torch.softmax
    and to the `entmax` package (when installed). Each mapping is timed interleaved with torch.softmax
    (alternating calls, medians), so that its ratio comes from the same stretch of machine time;
    softmax_*_s of a row are the softmax medians of that interleaved run. The package is timed interleaved
    with ours in a separate run of its own (fewer rounds: it is slow)."""
    import longsparse as ls

    try:
        import entmax as entmax_pkg
    except ImportError:
        entmax_pkg = None
    ours = {
        "entmax15": ls.entmax15,
        "entmax_alpha1.3": lambda x: ls.entmax(x, 1.3),
        "sparsemax": ls.sparsemax,
    }
    package = (
        {}
        if entmax_pkg is None
        else {
            "entmax15": entmax_pkg.entmax15,
            "entmax_alpha1.3": lambda x: entmax_pkg.entmax_bisect(x, 1.3),
            "sparsemax": entmax_pkg.sparsemax,
        }
    )
    softmax = lambda x: torch.softmax(x, -1)  # noqa: E731
    rows = []
    for n in lengths:
        gen = torch.Generator().manual_seed(n)
        x = torch.randn(max(1, total_elements // n), n, generator=gen)
        g = torch.randn(x.shape, generator=gen)
        for name, fn in ours.items():
            fwd = time_interleaved({"softmax": lambda: softmax(x), "ours": lambda: fn(x)}, repeats)
            fb = time_interleaved({"softmax": _fwd_bwd(softmax, x, g), "ours": _fwd_bwd(fn, x, g)}, repeats)
            row = {
                "n": n,
                "rows": x.shape[0],
                "mapping": name,
                "softmax_fwd_s": fwd["softmax"],
                "softmax_fwdbwd_s": fb["softmax"],
                "ours_fwd_s": fwd["ours"],
                "ours_fwdbwd_s": fb["ours"],
            }
            row["fwd_vs_softmax"] = row["ours_fwd_s"] / row["softmax_fwd_s"]
            row["fwdbwd_vs_softmax"] = row["ours_fwdbwd_s"] / row["softmax_fwdbwd_s"]
            if name in package:
                pk = package[name]
                reps = max(1, repeats // 2)  # the package is slow; fewer rounds, interleaved with ours again
                pf = time_interleaved({"ours": lambda: fn(x), "package": lambda: pk(x)}, reps)
                pb = time_interleaved({"ours": _fwd_bwd(fn, x, g), "package": _fwd_bwd(pk, x, g)}, reps)
                row["package_fwd_s"], row["package_fwdbwd_s"] = pf["package"], pb["package"]
                row["ours_fwd_s_with_package"], row["ours_fwdbwd_s_with_package"] = pf["ours"], pb["ours"]
                row["speedup_vs_package_fwd"] = pf["package"] / pf["ours"]
                row["speedup_vs_package_fwdbwd"] = pb["package"] / pb["ours"]
            rows.append(row)
            print(_format_mapping_row(row), flush=True)
    return rows


def _format_mapping_row(r: dict) -> str:
    s = (
        f"n={r['n']:>6} {r['mapping']:<16} fwd {r['fwd_vs_softmax']:5.2f}x softmax  "
        f"fwd+bwd {r['fwdbwd_vs_softmax']:5.2f}x softmax"
    )
    if "speedup_vs_package_fwd" in r:
        s += (
            f"   {r['speedup_vs_package_fwd']:6.1f}x / {r['speedup_vs_package_fwdbwd']:6.1f}x faster "
            "than entmax pkg (fwd / fwd+bwd)"
        )
    return s


# ----------------------------------------------------------------------------- attention

ATTENTION_METHODS = (
    "sdpa_softmax",
    "naive_softmax",
    "ours_softmax",
    "ours_softmax_nape",
    "ours_entmax15",
    "ours_entmax15_nape",
    "ours_entmax15_reference",
    "entmax_pkg_naive",
)
# Methods that materialise (H, N, N) logits, run up to bench_attention's max_naive only.
_DENSE_METHODS = ("naive_softmax", "ours_entmax15_reference")


def _naive(q, k, v, mapping):
    n = q.shape[2]
    z = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    z = z.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return mapping(z) @ v


def _attention_fn(method: str):
    import torch.nn.functional as F

    import longsparse as ls

    if method == "sdpa_softmax":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if method == "naive_softmax":
        return lambda q, k, v: _naive(q, k, v, lambda z: torch.softmax(z, -1))
    if method == "ours_softmax":
        return lambda q, k, v: ls.attention(q, k, v, mapping="softmax")
    if method in ("ours_softmax_nape", "ours_entmax15_nape"):
        # NAPE: ALiBi on half the heads. SDPA would need an (H, N, N) bias: beyond 2^24 elements auto picks
        # fused_cpu, so these rows time the softmax / NAPE and ASEntmax / NAPE decoders' long evaluations
        from longsparse.nn.positions import nape_slopes

        mapping = "softmax" if method == "ours_softmax_nape" else "entmax"
        return lambda q, k, v: ls.attention(q, k, v, mapping=mapping, alpha=1.5, alibi_slopes=nape_slopes(q.shape[1]))
    if method == "ours_entmax15":
        return lambda q, k, v: ls.attention(q, k, v, mapping="entmax", alpha=1.5)
    if method == "ours_entmax15_reference":
        return lambda q, k, v: ls.attention(q, k, v, mapping="entmax", alpha=1.5, backend="reference")
    if method == "entmax_pkg_naive":
        import entmax as entmax_pkg

        return lambda q, k, v: _naive(q, k, v, lambda z: entmax_pkg.entmax15(z, dim=-1))
    raise ValueError(f"unknown attention method {method!r}; choose from {ATTENTION_METHODS}")


def attention_worker(
    method: str, n: int, heads: int, dim: int, backward: bool, repeats: int, interleave_sdpa: bool = False
) -> dict:
    """One measurement in a fresh process: median time and peak RSS above the inputs' baseline. With
    ``interleave_sdpa`` the method and SDPA-softmax are then timed again in alternation (after the memory
    reading, so SDPA's buffers do not count): ``time_vs_sdpa_interleaved`` (wall) is immune to slow load
    drifts, ``time_vs_sdpa_interleaved_cpu`` (process CPU time) also to other processes' time slices."""
    import resource

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, dim, generator=gen) for _ in range(3))
    g = torch.randn(1, heads, n, dim, generator=gen)
    if method.startswith("ours_"):
        import longsparse as ls

        ls.entmax15(torch.zeros(2, 2))  # builds/loads the kernel before the baseline
    if backward:
        q, k, v = (t.requires_grad_() for t in (q, k, v))

    def runner(fn):
        if backward:

            def run():
                fn(q, k, v).backward(g)
                q.grad = k.grad = v.grad = None
        else:

            def run():
                with torch.no_grad():
                    fn(q, k, v)

        return run

    run = runner(_attention_fn(method))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds = time_median(run, repeats)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"seconds": seconds, "extra_peak_bytes": (peak - base) * 1024}
    if interleave_sdpa and method != "sdpa_softmax":
        t = wall_and_cpu_interleaved({"sdpa": runner(_attention_fn("sdpa_softmax")), "method": run}, repeats)
        out["time_vs_sdpa_interleaved"] = t["method"]["wall_s"] / t["sdpa"]["wall_s"]
        out["time_vs_sdpa_interleaved_cpu"] = t["method"]["cpu_s"] / t["sdpa"]["cpu_s"]
    return out


def bench_attention(
    lengths,
    repeats: int,
    heads: int = 8,
    dim: int = 64,
    fwd_only_lengths=(),
    max_naive: int = 8192,
    max_package: int = 4096,
    max_interleaved: int = 16384,
    methods=ATTENTION_METHODS,
) -> list[dict]:
    """Causal attention, B = 1: each (method, N, direction) in its own process so that peak memory
    (ru_maxrss) is its own. Ratios are to SDPA-softmax (no bias) at the same N and direction:
    ``time_vs_sdpa`` from the separate processes, and up to ``max_interleaved`` also
    ``time_vs_sdpa_interleaved`` (wall) and ``_cpu`` (process CPU time), timed in alternation inside the
    method's process. Beyond 4096 tokens each timing takes min(repeats, 3) calls."""
    import subprocess

    rows = []
    plan = [(n, True) for n in lengths] + [(n, False) for n in lengths] + [(n, False) for n in fwd_only_lengths]
    for n, backward in plan:
        sdpa = None
        for method in ("sdpa_softmax",) + tuple(m for m in methods if m != "sdpa_softmax"):
            if method in _DENSE_METHODS and n > max_naive:
                continue
            if method == "entmax_pkg_naive" and n > max_package:
                continue
            reps = repeats if n <= 4096 else min(repeats, 3)
            cmd = worker_command(
                "--attention-worker",
                method,
                str(n),
                str(heads),
                str(dim),
                str(int(backward)),
                str(reps),
                str(torch.get_num_threads()),
                str(int(n <= max_interleaved)),
            )
            proc = subprocess.run(cmd, capture_output=True, text=True)
            row = {
                "n": n,
                "method": method,
                "direction": "fwd+bwd" if backward else "fwd",
                "heads": heads,
                "dim": dim,
                "scores_buffer_bytes": 4 * heads * n * n,
            }
            if proc.returncode != 0:
                row["error"] = (proc.stderr.strip().splitlines() or ["failed"])[-1]
            else:
                row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
                row["buffers"] = row["extra_peak_bytes"] / row["scores_buffer_bytes"]
                if method == "sdpa_softmax":
                    sdpa = row["seconds"]
                if sdpa:
                    row["time_vs_sdpa"] = row["seconds"] / sdpa
            rows.append(row)
            print(_format_attention_row(row), flush=True)
    return rows


def bench_short(lengths, repeats: int, batch: int = 64, heads: int = 4, dim: int = 16) -> list[dict]:
    """Causal attention fwd+bwd at training shapes of the synthetic tasks (NAPE-like ALiBi on half the
    heads, q-scales on all): ``backend="auto"`` against the recomputing backward (``chunked_s``: fused_cpu
    where it takes the mapping, else chunked), timed interleaved, per mapping and length."""
    import longsparse as ls
    from longsparse.attention import BACKENDS
    from longsparse.attention.call import make_call

    rows = []
    g = torch.Generator().manual_seed(0)
    slopes = torch.tensor([2.0**-h if h < heads // 2 else 0.0 for h in range(heads)])
    for n in lengths:
        q, k, v = (torch.randn(batch, heads, n, dim, generator=g) for _ in range(3))
        q_scale = torch.rand(batch, heads, n, generator=g) + 0.5
        up = torch.randn(batch, heads, n, dim, generator=g)
        for mapping in ("entmax", "adatemp", "sparsemax"):

            def run(backend, mapping=mapping):
                def call():
                    leaves = [t.detach().requires_grad_() for t in (q, k, v, q_scale)]
                    out = ls.attention(
                        *leaves[:3],
                        q_scale=leaves[3],
                        mapping=mapping,
                        alibi_slopes=slopes,
                        is_causal=True,
                        backend=backend,
                    )
                    out.backward(up)

                return call

            recomputing = (
                "fused_cpu"
                if BACKENDS["fused_cpu"].supports(
                    make_call(q, k, v, q_scale=q_scale, mapping=mapping, alibi_slopes=slopes)
                )
                is None
                else "chunked"
            )
            t = time_interleaved({"auto": run("auto"), "chunked": run(recomputing)}, repeats)
            rows.append(
                {
                    "n": n,
                    "mapping": mapping,
                    "batch": batch,
                    "heads": heads,
                    "dim": dim,
                    "auto_s": t["auto"],
                    "chunked_s": t["chunked"],
                    "auto_vs_chunked": t["auto"] / t["chunked"],
                }
            )
            print(
                f"N={n:>5} {mapping:<9} auto {t['auto'] * 1e3:8.1f} ms  chunked {t['chunked'] * 1e3:8.1f} ms  "
                f"auto/chunked {t['auto'] / t['chunked']:.2f}"
            )
    return rows


def _format_attention_row(r: dict) -> str:
    head = f"N={r['n']:>6} {r['direction']:<7} {r['method']:<24}"
    if "error" in r:
        return head + " error: " + r["error"]
    inter = ""
    if "time_vs_sdpa_interleaved" in r:
        inter = f" ({r['time_vs_sdpa_interleaved']:.2f}x interleaved"
        inter += f", {r['time_vs_sdpa_interleaved_cpu']:.2f}x CPU time)" if "time_vs_sdpa_interleaved_cpu" in r else ")"
    return (
        head + f" {r['seconds']:8.3f} s  {r.get('time_vs_sdpa', float('nan')):6.2f}x SDPA{inter}  "
        f"extra peak {r['extra_peak_bytes'] / 2**20:8.1f} MiB = {r['buffers']:.2f} x (H*N^2 fp32)"
    )
