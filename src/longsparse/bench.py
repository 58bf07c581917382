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


def _time(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _fwd_bwd(mapping: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, g: torch.Tensor) -> Callable[[], None]:
    def run():
        xx = x.detach().requires_grad_()
        mapping(xx).backward(g)
    return run


def bench_mapping(lengths, repeats: int, total_elements: int = 1 << 22) -> list[dict]:
    """Rows of length N (total_elements scores per call), fwd and fwd+bwd, as ratios to torch.softmax
    and to the `entmax` package (when installed)."""
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
        t_sm = _time(lambda: softmax(x), repeats)
        t_sm_fb = _time(_fwd_bwd(softmax, x, g), repeats)
        for name, fn in ours.items():
            row = {"n": n, "rows": x.shape[0], "mapping": name,
                   "softmax_fwd_s": t_sm, "softmax_fwdbwd_s": t_sm_fb}
            row["ours_fwd_s"] = _time(lambda: fn(x), repeats)
            row["ours_fwdbwd_s"] = _time(_fwd_bwd(fn, x, g), repeats)
            row["fwd_vs_softmax"] = row["ours_fwd_s"] / t_sm
            row["fwdbwd_vs_softmax"] = row["ours_fwdbwd_s"] / t_sm_fb
            if name in package:
                pk = package[name]
                reps = max(1, repeats // 2)   # the package is slow; fewer repeats, same median
                row["package_fwd_s"] = _time(lambda: pk(x), reps)
                row["package_fwdbwd_s"] = _time(_fwd_bwd(pk, x, g), reps)
                row["speedup_vs_package_fwd"] = row["package_fwd_s"] / row["ours_fwd_s"]
                row["speedup_vs_package_fwdbwd"] = row["package_fwdbwd_s"] / row["ours_fwdbwd_s"]
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


def environment() -> dict:
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version(),
            "machine": platform.machine(), "processor": platform.processor(),
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def write_result(kind: str, rows: list[dict], out: str | None, config: dict) -> Path:
    path = Path(out) if out else Path("benchmarks/results") / f"{kind}-{datetime.now():%Y%m%d-%H%M%S}.json"
    if path.exists():
        raise FileExistsError(f"{path} exists; choose another --out (results are never overwritten)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": kind, "config": config, "env": environment(), "rows": rows}, indent=1))
    return path


def main(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = [int(v) for v in args.lengths.split(",")]
    if args.what == "mapping":
        rows = bench_mapping(lengths, args.repeats)
    else:
        raise ValueError(f"unknown benchmark {args.what!r}")
    path = write_result(args.what, rows, args.out, {"lengths": lengths, "repeats": args.repeats})
    print(f"wrote {path}")
    return 0
