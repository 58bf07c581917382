"""NAPE against all-NoPE attention on the fused CPU kernel: what the band of live keys on ALiBi heads
(`longsparse.attention.band`) saves.

Causal 1.5-entmax attention forward, B = 1, H = 8, D = 64, fp32, no gradient, `backend="fused_cpu"`; NAPE =
ALiBi slopes 1/h on the first four heads (`nape_slopes`), NoPE = no slopes; SDPA softmax without a bias for
scale. Each source tree (``--src LABEL=DIR``, e.g. an export of the commit before the band and this tree's
``src``) runs in its own process per length, the three calls timed in alternation (``--repeats`` rounds);
medians of wall and process CPU seconds. `longsparse bench table --out FILE` renders the JSON.

    python benchmarks/alibi_band.py --src before=EXPORT/src --src after=src --lengths 4096,16384,65536 \\
        --repeats 3 --threads 1 --out benchmarks/results/alibi-band-cpu-1thread.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

METHODS = ("nape", "nope", "sdpa")


def worker(n: int, repeats: int, threads: int) -> dict:
    """Times the three calls at length n in this process (the longsparse on sys.path)."""
    import torch
    import torch.nn.functional as F

    import longsparse as ls
    from longsparse.nn.positions import nape_slopes

    torch.set_num_threads(threads)
    slopes = nape_slopes(8)
    calls = {
        "nape": lambda q, k, v: ls.attention(
            q, k, v, mapping="entmax", alpha=1.5, alibi_slopes=slopes, backend="fused_cpu"
        ),
        "nope": lambda q, k, v: ls.attention(q, k, v, mapping="entmax", alpha=1.5, backend="fused_cpu"),
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        warm = [torch.randn(1, 8, 512, 64, generator=g) for _ in range(3)]
        for fn in calls.values():  # builds / loads the kernel, warms the allocator
            fn(*warm)
        q, k, v = (torch.randn(1, 8, n, 64, generator=g) for _ in range(3))
        wall = {m: [] for m in calls}
        cpu = {m: [] for m in calls}
        for _ in range(repeats):
            for m, fn in calls.items():
                c0, t0 = time.process_time(), time.perf_counter()
                fn(q, k, v)
                wall[m].append(time.perf_counter() - t0)
                cpu[m].append(time.process_time() - c0)
    return {"n": n, "wall_s": wall, "cpu_s": cpu, "longsparse": str(Path(ls.__file__).parent)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", action="append", required=True, metavar="LABEL=DIR", help="a source tree to time")
    ap.add_argument("--lengths", default="4096,16384,65536")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    out = Path(args.out)
    if out.exists():  # checked before the runs (write_result refuses too, after them)
        raise SystemExit(f"{out} exists: choose another --out (results are never overwritten)")
    sources = []
    for spec in args.src:
        label, sep, path = spec.partition("=")
        if not sep or not Path(path, "longsparse").is_dir():
            raise SystemExit(f"--src {spec!r}: expected LABEL=DIR with DIR/longsparse a package")
        sources.append((label, str(Path(path).resolve())))
    rows = []
    for n in (int(v) for v in args.lengths.split(",") if v):
        for label, path in sources:
            env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS=str(args.threads))
            cmd = [sys.executable, __file__, "--worker", str(n), str(args.repeats), str(args.threads)]
            load = os.getloadavg()[0]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{label} at n = {n} failed:\n{proc.stderr[-2000:]}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            row = {"src": label, "path": path, "n": n, "load_avg_before": load, **r}
            for kind in ("wall_s", "cpu_s"):
                med = {m: statistics.median(r[kind][m]) for m in METHODS}
                row[f"median_{kind}"] = med
                row[f"nape_vs_nope_{kind}"] = med["nape"] / med["nope"]
            rows.append(row)
            med, cpu = row["median_wall_s"], row["median_cpu_s"]
            print(
                f"{label:>8} n={n:>6}  NAPE {med['nape']:8.2f} s  NoPE {med['nope']:8.2f} s  SDPA {med['sdpa']:8.2f} s"
                f"  NAPE/NoPE wall {row['nape_vs_nope_wall_s']:.2f} CPU {row['nape_vs_nope_cpu_s']:.2f}"
                f"  (CPU s: {cpu['nape']:.2f} / {cpu['nope']:.2f} / {cpu['sdpa']:.2f})",
                flush=True,
            )
    from longsparse_experiments.bench import write_result

    config = {
        "command": " ".join(["python", "benchmarks/alibi_band.py", *(sys.argv[1:] if argv is None else argv)]),
        "batch": 1,
        "heads": 8,
        "dim": 64,
        "alpha": 1.5,
        "causal": True,
        "nape_heads": 4,
        "repeats": args.repeats,
        "threads": args.threads,
        "cpu": _cpu_name(),
    }
    print(f"wrote {write_result('alibi_band', rows, str(out), config)}")
    return 0


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        print(json.dumps(worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
    else:
        sys.exit(main())
