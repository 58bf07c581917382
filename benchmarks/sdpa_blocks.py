"""Softmax with ALiBi (NAPE slopes), causal, without gradient, past auto's SDPA bias limit: the sdpa backend's
query blocks against the chunked path, the fused CPU kernel and FlexAttention (the flex backend, compiled; its
first call, which compiles, is the warm-up and is reported apart). Interleaved rounds (each round calls every
backend once), medians, ratios to the blocks; the outputs' largest difference from the last backend timed
(fused_cpu on the CPU). The JSON is never overwritten (`longsparse bench table --out FILE` renders it).

    python benchmarks/sdpa_blocks.py --out benchmarks/results/sdpa-blocks-cpu.json [--n 4096] [--threads 1]

On CUDA (``--device cuda``) fused_cpu is skipped; flex is skipped where it cannot take the call (its reason is
printed).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import longsparse as ls
from longsparse_experiments.bench import write_result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--n", type=int, default=4096, help="sequence length (queries = keys)")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args(argv)
    if args.n < 2 or args.heads < 1 or args.dim < 1 or args.repeats < 1 or args.threads < 1:
        ap.error("--n must be at least 2; --heads, --dim, --repeats and --threads at least 1")
    if Path(args.out).exists():
        ap.error(f"{args.out} exists; choose another --out (results are never overwritten)")
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    H = args.heads
    q, k, v = (torch.randn(1, H, args.n, args.dim, generator=g).to(args.device) for _ in range(3))
    slopes = torch.tensor([1.0 / (h + 1) if h < H // 2 else 0.0 for h in range(H)], device=args.device)
    names = ["sdpa", "chunked", "flex"] + (["fused_cpu"] if args.device == "cpu" else [])
    from longsparse.attention import BACKENDS
    from longsparse.attention.call import make_call

    with torch.no_grad():
        why = BACKENDS["flex"].supports(make_call(q, k, v, mapping="softmax", alibi_slopes=slopes, is_causal=True))
    if why is not None:
        print(f"flex skipped: {why}")
        names.remove("flex")

    def call(name):
        out = ls.attention(q, k, v, mapping="softmax", alibi_slopes=slopes, is_causal=True, backend=name)
        if args.device == "cuda":
            torch.cuda.synchronize()
        return out

    times = {n: [] for n in names}
    with torch.no_grad():
        first_s, outs = {}, {}
        for n in names:  # warm-up (flex compiles), and the outputs compared
            t0 = time.perf_counter()
            outs[n] = call(n)
            first_s[n] = time.perf_counter() - t0
        for _ in range(args.repeats):
            for n in names:
                t0 = time.perf_counter()
                call(n)
                times[n].append(time.perf_counter() - t0)
    base = outs[names[-1]]
    med = {n: statistics.median(t) for n, t in times.items()}
    rows = [
        {
            "n": args.n,
            "backend": n,
            "median_s": med[n],
            "times_s": times[n],
            "first_call_s": first_s[n],
            "vs_sdpa_blocks": med[n] / med["sdpa"],
            "diff_against": names[-1],
            "max_abs_diff": (outs[n] - base).abs().max().item(),
        }
        for n in names
    ]
    write_result("sdpa_blocks", rows, args.out, vars(args))
    for r in rows:
        print(f"{r['backend']:10s} {r['median_s']:8.3f} s  {r['vs_sdpa_blocks']:5.2f}x the blocks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
