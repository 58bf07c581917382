"""The `longsparse` command line."""
from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    import torch

    import longsparse as ls

    z = torch.tensor([2.0, 1.8, 1.6, 1.4, 1.2, -1.0, -3.0])
    print("scores:", [round(v, 2) for v in z.tolist()])
    print(f"{'mapping':<12} {'nonzeros':>8}  probabilities")
    for name, p in (("softmax", torch.softmax(z, -1)), ("entmax α=1.3", ls.entmax(z, 1.3)),
                    ("entmax15", ls.entmax15(z)), ("sparsemax", ls.sparsemax(z))):
        print(f"{name:<12} {int((p > 0).sum()):>8}  " + " ".join(f"{v:.3f}" for v in p.tolist()))
    print("\nThreshold property: appending scores below τ leaves entmax weights unchanged, softmax leaks:")
    longer = torch.cat([z, torch.full((1000,), -5.0)])
    for name, f in (("softmax", lambda x: torch.softmax(x, -1)), ("entmax15", ls.entmax15)):
        change = (f(longer)[: len(z)] - f(z)).abs().max().item()
        print(f"  {name:<9} max change of the first {len(z)} weights after 1000 distractors: {change:.3g}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from longsparse import bench

    return bench.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="longsparse", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="the main job: a short demo").set_defaults(func=_demo)
    b = sub.add_parser("bench", help="speed/memory benchmarks written to JSON")
    b.add_argument("what", choices=["mapping"], help="what to benchmark")
    b.add_argument("--out", default=None, help="JSON output path (default benchmarks/results/<what>-<time>.json)")
    b.add_argument("--lengths", default="512,1024,2048,4096,8192", help="row lengths")
    b.add_argument("--repeats", type=int, default=5)
    b.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    b.set_defaults(func=_bench)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
