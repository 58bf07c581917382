"""What one decoding call of the Triton entmax attention costs on the host, on any machine: the kernels' launches
are replaced by stubs that count them, so what is timed is everything around the kernels (argument checks, the
custom op's dispatch, allocations, launch set-up, torch operations between launches). On a GPU this is the CPU
time a decode step pays per attention layer before its kernels can run, and every torch operation counted here
is one more kernel launch on the GPU; a CUDA graph replays the launches without it.

    TRITON_INTERPRET=1 python benchmarks/decode_host.py [--out benchmarks/results/FILE.json] [--baseline DIR]
        [--keys 32768] [--heads 16] [--calls 300] [--repeats 7]
    longsparse bench table --out benchmarks/results/FILE.json      # the table of a stored result

--baseline DIR: a copy of an earlier version's src/longsparse/attention folder (`git archive REF
src/longsparse/attention | tar -x -C DIR`, as benchmarks/gpu_check.py takes it), timed interleaved with the
current one in the same process (repeats alternate), so the ratio is not a difference between two moments of a
shared machine. Each row: the version, the shape, Triton launches and torch operations inside the op per call,
and the median and spread of microseconds per call over the repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU tensors reach the kernels' launch code (stubbed below)

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from longsparse_experiments.bench import markdown, write_result  # noqa: E402


class _Launches:
    """Stands in for a jitted kernel: ``kernel[grid](...)`` counts the launch and runs nothing."""

    def __init__(self, counter: list):
        self.counter = counter

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.counter[0] += 1

        return launch


class _TorchOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


class Version:
    """A kernel module (`triton_entmax`) whose launches are stubbed; ``call()`` runs one decoding call."""

    def __init__(self, name: str, te, q, k, v, slopes):
        import importlib

        self.name = name
        self.ops_module = importlib.import_module(te.__name__.rsplit(".", 1)[0] + ".triton_ops")
        self.ops_module._kernels()  # binds the jitted kernels first, so the stubs below replace them
        self.launches = [0]
        self.kernels = {a: getattr(self.ops_module, a) for a in dir(self.ops_module) if a.endswith("_kernel")}
        for attr in self.kernels:
            setattr(self.ops_module, attr, _Launches(self.launches))
        self.te, self.args = te, (q, k, v)
        self.kwargs = dict(alpha=1.5, is_causal=True, alibi_slopes=slopes, decode=True)

    def restore(self) -> None:
        """Puts the real kernels back (the module is the process's own for the current version)."""
        for attr, kernel in self.kernels.items():
            setattr(self.ops_module, attr, kernel)

    def call(self):
        return self.te.entmax_attention_triton(*self.args, **self.kwargs)

    def counts(self) -> dict:
        """Triton launches and torch operations inside the op (the op's own implementation, `_forward_impl`)."""
        args = self.te._op_args(*self.args, **self.kwargs)
        before = self.launches[0]
        with _TorchOps() as mode:
            self.ops_module._forward_impl(*args)
        return {"triton_launches": self.launches[0] - before, "torch_ops": len(mode.ops), "ops": sorted(mode.ops)}

    def time(self, calls: int) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            self.call()
        return 1e6 * (time.perf_counter() - t0) / calls


def measure(baseline: str | None, keys: int, heads: int, calls: int, repeats: int) -> list[dict]:
    """One row per version: counts per call and µs per call (median over ``repeats``, versions alternating)."""
    from longsparse.attention import triton_entmax

    torch.manual_seed(0)
    D = 64
    q = torch.randn(1, heads, 1, D)
    k, v = torch.randn(1, heads, keys, D), torch.randn(1, heads, keys, D)
    slopes = torch.cat([torch.zeros(heads // 2), 2.0 ** -torch.arange(1, heads - heads // 2 + 1, dtype=torch.float32)])
    versions = [Version("current", triton_entmax, q, k, v, slopes)]
    try:
        if baseline:
            sys.path.insert(0, str(Path(__file__).parent))
            from gpu_check import load_baseline

            versions.append(Version("baseline", load_baseline(baseline), q, k, v, slopes))
        return _timed_rows(versions, calls, repeats)
    finally:
        for ver in versions:
            ver.restore()


def _timed_rows(versions: list[Version], calls: int, repeats: int) -> list[dict]:
    for ver in versions:
        ver.time(max(1, calls // 10))  # warm: first calls build caches
    times: dict[str, list[float]] = {ver.name: [] for ver in versions}
    for _ in range(repeats):
        for ver in versions:
            times[ver.name].append(ver.time(calls))
    rows = []
    for ver in versions:
        ts = times[ver.name]
        q, k, _ = ver.args
        rows.append(
            {
                "version": ver.name,
                "B": q.shape[0],
                "H": q.shape[1],
                "Nq": q.shape[2],
                "Nk": k.shape[2],
                "D": q.shape[3],
                **ver.counts(),
                "us_per_call": statistics.median(ts),
                "us_min": min(ts),
                "us_max": max(ts),
                "calls": calls,
                "repeats": repeats,
            }
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON file to write (default benchmarks/results/decode_host-cpu-DATE.json)")
    ap.add_argument("--baseline", default=None, help="a copy of an earlier src/longsparse/attention folder")
    ap.add_argument("--keys", type=int, default=32768, help="cached keys (default 32768)")
    ap.add_argument("--heads", type=int, default=16, help="query (= key) heads (default 16)")
    ap.add_argument("--calls", type=int, default=300, help="calls per timed repeat (default 300)")
    ap.add_argument("--repeats", type=int, default=7, help="timed repeats per version, alternating (default 7)")
    args = ap.parse_args(argv)
    for name in ("keys", "heads", "calls", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.heads < 2:
        ap.error("--heads must be at least 2 (NAPE: half the heads with ALiBi slopes)")
    if args.out and Path(args.out).exists():
        ap.error(f"--out {args.out} exists: choose a new file (stored results are not overwritten)")
    if args.baseline and not Path(args.baseline).is_dir():
        ap.error(f"--baseline {args.baseline}: not a folder (give a copy of src/longsparse/attention)")
    torch.set_num_threads(1)
    rows = measure(args.baseline, args.keys, args.heads, args.calls, args.repeats)
    config = {k: getattr(args, k) for k in ("baseline", "keys", "heads", "calls", "repeats")}
    path = write_result("decode_host", rows, args.out, config)
    print(markdown(str(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
