"""`longsparse bench …`: speed and memory measured as ratios within one run, written to JSON.

Absolute times on shared machines swing by 2x; the ratios to torch.softmax / SDPA measured
interleaved in the same process are what the docs report.
"""
from __future__ import annotations

import json
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

from longsparse.io import atomic_write_json


def _time(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _time_interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each of `fns` over `repeats` rounds that call every function once, in turn
    (after one warm-up call each): load changes on a shared machine then hit all of them alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


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
    package = {} if entmax_pkg is None else {
        "entmax15": entmax_pkg.entmax15,
        "entmax_alpha1.3": lambda x: entmax_pkg.entmax_bisect(x, 1.3),
        "sparsemax": entmax_pkg.sparsemax,
    }
    softmax = lambda x: torch.softmax(x, -1)  # noqa: E731
    rows = []
    for n in lengths:
        gen = torch.Generator().manual_seed(n)
        x = torch.randn(max(1, total_elements // n), n, generator=gen)
        g = torch.randn(x.shape, generator=gen)
        for name, fn in ours.items():
            fwd = _time_interleaved({"softmax": lambda: softmax(x), "ours": lambda: fn(x)}, repeats)
            fb = _time_interleaved({"softmax": _fwd_bwd(softmax, x, g), "ours": _fwd_bwd(fn, x, g)}, repeats)
            row = {"n": n, "rows": x.shape[0], "mapping": name,
                   "softmax_fwd_s": fwd["softmax"], "softmax_fwdbwd_s": fb["softmax"],
                   "ours_fwd_s": fwd["ours"], "ours_fwdbwd_s": fb["ours"]}
            row["fwd_vs_softmax"] = row["ours_fwd_s"] / row["softmax_fwd_s"]
            row["fwdbwd_vs_softmax"] = row["ours_fwdbwd_s"] / row["softmax_fwdbwd_s"]
            if name in package:
                pk = package[name]
                reps = max(1, repeats // 2)   # the package is slow; fewer rounds, interleaved with ours again
                pf = _time_interleaved({"ours": lambda: fn(x), "package": lambda: pk(x)}, reps)
                pb = _time_interleaved({"ours": _fwd_bwd(fn, x, g), "package": _fwd_bwd(pk, x, g)}, reps)
                row["package_fwd_s"], row["package_fwdbwd_s"] = pf["package"], pb["package"]
                row["ours_fwd_s_with_package"], row["ours_fwdbwd_s_with_package"] = pf["ours"], pb["ours"]
                row["speedup_vs_package_fwd"] = pf["package"] / pf["ours"]
                row["speedup_vs_package_fwdbwd"] = pb["package"] / pb["ours"]
            rows.append(row)
            print(_format_mapping_row(row), flush=True)
    return rows


def _format_mapping_row(r: dict) -> str:
    s = (f"n={r['n']:>6} {r['mapping']:<16} fwd {r['fwd_vs_softmax']:5.2f}x softmax  "
         f"fwd+bwd {r['fwdbwd_vs_softmax']:5.2f}x softmax")
    if "speedup_vs_package_fwd" in r:
        s += (f"   {r['speedup_vs_package_fwd']:6.1f}x / {r['speedup_vs_package_fwdbwd']:6.1f}x faster "
              "than entmax pkg (fwd / fwd+bwd)")
    return s


# ----------------------------------------------------------------------------- attention

ATTENTION_METHODS = ("sdpa_softmax", "naive_softmax", "ours_softmax", "ours_entmax15", "ours_entmax15_reference",
                     "entmax_pkg_naive")


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
    if method == "ours_entmax15":
        return lambda q, k, v: ls.attention(q, k, v, mapping="entmax", alpha=1.5)
    if method == "ours_entmax15_reference":
        return lambda q, k, v: ls.attention(q, k, v, mapping="entmax", alpha=1.5, path="reference")
    if method == "entmax_pkg_naive":
        import entmax as entmax_pkg

        return lambda q, k, v: _naive(q, k, v, lambda z: entmax_pkg.entmax15(z, dim=-1))
    raise ValueError(f"unknown attention method {method!r}; choose from {ATTENTION_METHODS}")


def attention_worker(method: str, n: int, heads: int, dim: int, backward: bool, repeats: int,
                     interleave_sdpa: bool = False) -> dict:
    """One measurement in a fresh process: median time and peak RSS above the inputs' baseline. With
    ``interleave_sdpa`` the method and SDPA-softmax are then timed again in alternation (after the memory
    reading, so SDPA's buffers do not count): ``time_vs_sdpa_interleaved`` is immune to slow load drifts."""
    import resource

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, dim, generator=gen) for _ in range(3))
    g = torch.randn(1, heads, n, dim, generator=gen)
    if method.startswith("ours_entmax"):
        import longsparse as ls
        ls.entmax15(torch.zeros(2, 2))          # builds/loads the kernel before the baseline
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
    seconds = _time(run, repeats)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"seconds": seconds, "extra_peak_bytes": (peak - base) * 1024}
    if interleave_sdpa and method != "sdpa_softmax":
        t = _time_interleaved({"sdpa": runner(_attention_fn("sdpa_softmax")), "method": run}, repeats)
        out["time_vs_sdpa_interleaved"] = t["method"] / t["sdpa"]
    return out


def bench_attention(lengths, repeats: int, heads: int = 8, dim: int = 64, fwd_only_lengths=(),
                    max_naive: int = 8192, max_package: int = 4096, max_interleaved: int = 4096) -> list[dict]:
    """Causal attention, B = 1: each (method, N, direction) in its own process so that peak memory
    (ru_maxrss) is its own. Ratios are to SDPA-softmax at the same N and direction: ``time_vs_sdpa`` from
    the separate processes, and up to ``max_interleaved`` also ``time_vs_sdpa_interleaved`` (both timed
    in alternation inside the method's process)."""
    import subprocess
    import sys

    rows = []
    plan = [(n, True) for n in lengths] + [(n, False) for n in lengths] + [(n, False) for n in fwd_only_lengths]
    for n, backward in plan:
        sdpa = None
        for method in ATTENTION_METHODS:
            if (method == "naive_softmax" or method == "ours_entmax15_reference") and n > max_naive:
                continue
            if method == "entmax_pkg_naive" and n > max_package:
                continue
            reps = repeats if n <= 4096 else 1
            cmd = [sys.executable, "-m", "longsparse.bench", "--attention-worker", method, str(n), str(heads),
                   str(dim), str(int(backward)), str(reps), str(torch.get_num_threads()),
                   str(int(n <= max_interleaved))]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            row = {"n": n, "method": method, "direction": "fwd+bwd" if backward else "fwd", "heads": heads,
                   "dim": dim, "scores_buffer_bytes": 4 * heads * n * n}
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
    heads, q-scales on all): ``path="auto"`` (dense autograd up to 64 keys) against ``path="chunked"`` (the
    recomputing backward), timed interleaved, per mapping and length."""
    import longsparse as ls

    rows = []
    g = torch.Generator().manual_seed(0)
    slopes = torch.tensor([2.0 ** -h if h < heads // 2 else 0.0 for h in range(heads)])
    for n in lengths:
        q, k, v = (torch.randn(batch, heads, n, dim, generator=g) for _ in range(3))
        q_scale = torch.rand(batch, heads, n, generator=g) + 0.5
        up = torch.randn(batch, heads, n, dim, generator=g)
        for mapping in ("entmax", "adatemp", "sparsemax"):
            def run(path, mapping=mapping):
                def call():
                    leaves = [t.detach().requires_grad_() for t in (q, k, v, q_scale)]
                    out = ls.attention(*leaves[:3], q_scale=leaves[3], mapping=mapping, alibi_slopes=slopes,
                                       is_causal=True, path=path)
                    out.backward(up)
                return call
            t = _time_interleaved({"auto": run("auto"), "chunked": run("chunked")}, repeats)
            rows.append({"n": n, "mapping": mapping, "batch": batch, "heads": heads, "dim": dim,
                         "auto_s": t["auto"], "chunked_s": t["chunked"], "auto_vs_chunked": t["auto"] / t["chunked"]})
            print(f"N={n:>5} {mapping:<9} auto {t['auto'] * 1e3:8.1f} ms  chunked {t['chunked'] * 1e3:8.1f} ms  "
                  f"auto/chunked {t['auto'] / t['chunked']:.2f}")
    return rows


def _format_attention_row(r: dict) -> str:
    head = f"N={r['n']:>6} {r['direction']:<7} {r['method']:<24}"
    if "error" in r:
        return head + " error: " + r["error"]
    inter = f" ({r['time_vs_sdpa_interleaved']:.2f}x interleaved)" if "time_vs_sdpa_interleaved" in r else ""
    return (head + f" {r['seconds']:8.3f} s  {r.get('time_vs_sdpa', float('nan')):6.2f}x SDPA{inter}  "
            f"extra peak {r['extra_peak_bytes'] / 2**20:8.1f} MiB = {r['buffers']:.2f} x (H*N^2 fp32)")


def markdown(path: str) -> str:
    """The markdown table of a saved benchmark JSON (what docs/benchmarks.md shows)."""
    data = json.loads(Path(path).read_text())
    rows = data["rows"]
    if data["benchmark"] == "short":
        out = ["| N | mapping | auto (ms) | chunked (ms) | auto / chunked |", "|---:|---|---:|---:|---:|"]
        for r in rows:
            out.append(f"| {r['n']} | {r['mapping']} | {r['auto_s'] * 1e3:.1f} | {r['chunked_s'] * 1e3:.1f} | "
                       f"{r['auto_vs_chunked']:.2f} |")
    elif data["benchmark"] == "mapping":
        out = ["| n | mapping | fwd / softmax | fwd+bwd / softmax | entmax pkg / ours (fwd) | entmax pkg / ours (fwd+bwd) |",
               "|---:|---|---:|---:|---:|---:|"]
        for r in rows:
            out.append(f"| {r['n']} | {r['mapping']} | {r['fwd_vs_softmax']:.2f} | {r['fwdbwd_vs_softmax']:.2f} | "
                       f"{r.get('speedup_vs_package_fwd', float('nan')):.1f} | "
                       f"{r.get('speedup_vs_package_fwdbwd', float('nan')):.1f} |")
    else:
        out = ["| N | direction | method | time (s) | / SDPA | / SDPA, interleaved | extra peak (MiB) | × (H·N² fp32) |",
               "|---:|---|---|---:|---:|---:|---:|---:|"]
        for r in rows:
            if "error" in r:
                out.append(f"| {r['n']} | {r['direction']} | {r['method']} | error: {r['error']} | | | | |")
                continue
            inter = f"{r['time_vs_sdpa_interleaved']:.2f}" if "time_vs_sdpa_interleaved" in r else "—"
            out.append(f"| {r['n']} | {r['direction']} | {r['method']} | {r['seconds']:.3f} | "
                       f"{r.get('time_vs_sdpa', float('nan')):.2f} | {inter} | {r['extra_peak_bytes'] / 2**20:.0f} | "
                       f"{r['buffers']:.2f} |")
    env = data["env"]
    out.append(f"\n_{path}: torch {env['torch']}, {env['threads']} threads, {env['time']}_")
    return "\n".join(out)


def environment() -> dict:
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version(),
            "machine": platform.machine(), "processor": platform.processor(),
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def write_result(kind: str, rows: list[dict], out: str | None, config: dict) -> Path:
    path = Path(out) if out else Path("benchmarks/results") / f"{kind}-{datetime.now():%Y%m%d-%H%M%S}.json"
    if path.exists():
        raise FileExistsError(f"{path} exists; choose another --out (results are never overwritten)")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"benchmark": kind, "config": config, "env": environment(), "rows": rows}, indent=1)
    return path


def main(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    default = {"mapping": "512,1024,2048,4096,8192", "short": "32,64,128,256,512"}.get(
        args.what, "512,1024,2048,4096,8192,16384")
    lengths = [int(v) for v in (args.lengths or default).split(",")]
    if args.what == "table":
        print(markdown(args.out))
        return 0
    config = {"lengths": lengths, "repeats": args.repeats}
    if args.what == "mapping":
        rows = bench_mapping(lengths, args.repeats)
    elif args.what == "short":
        config.update(batch=64, heads=4, dim=16, causal=True)
        rows = bench_short(lengths, args.repeats)
    elif args.what == "attention":
        fwd_only = [int(v) for v in args.fwd_only_lengths.split(",") if v]
        config.update(heads=8, dim=64, fwd_only_lengths=fwd_only, batch=1, causal=True)
        rows = bench_attention(lengths, args.repeats, fwd_only_lengths=fwd_only)
    else:
        raise ValueError(f"unknown benchmark {args.what!r}")
    path = write_result(args.what, rows, args.out, config)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":   # the per-measurement worker of bench_attention
    import sys

    if len(sys.argv) == 10 and sys.argv[1] == "--attention-worker":
        _, _, method, n, heads, dim, backward, reps, threads, interleave = sys.argv
        torch.set_num_threads(int(threads))
        print(json.dumps(attention_worker(method, int(n), int(heads), int(dim), bool(int(backward)), int(reps),
                                          bool(int(interleave)))))
    else:
        raise SystemExit("usage: python -m longsparse.bench --attention-worker METHOD N H D BACKWARD REPEATS "
                         "THREADS INTERLEAVE_SDPA")
