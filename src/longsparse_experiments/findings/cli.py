"""The ``longsparse findings`` command: ``cross-study`` (row command C2 of docs/findings.md) and
``interval-coverage`` (C14)."""

from __future__ import annotations

import argparse


def add_cli(sub) -> None:
    """Register ``longsparse findings cross-study|interval-coverage`` on the top-level subparsers."""
    f = sub.add_parser("findings", help="the cross-study analyses of docs/findings.md (C2, C14) from committed records")
    fsub = f.add_subparsers(dest="findings_command", required=True, metavar="cross-study|interval-coverage")
    c = fsub.add_parser(
        "cross-study", help="C2: comparisons --analyse cannot make (across studies, HSA, LM) and the combined forest"
    )
    c.add_argument("--root", default=".", help="repository root holding results/ (default: the current folder)")
    c.add_argument("--out", default=None, help="output folder (default ROOT/docs/findings)")
    c.set_defaults(func=_cross_study)
    i = fsub.add_parser("interval-coverage", help="C14: simulated coverage of the seed-level intervals (~1.5 CPU-min)")
    i.add_argument("--out", default="docs/findings", help="output folder (default docs/findings)")
    i.set_defaults(func=_interval_coverage)


def _cross_study(args: argparse.Namespace) -> int:
    from longsparse_experiments.findings.cross_study import run_cross_study

    out = run_cross_study(args.root, args.out)
    print(f"wrote the cross-study analyses to {out}")
    return 0


def _interval_coverage(args: argparse.Namespace) -> int:
    from longsparse_experiments.findings.interval_coverage import run_interval_coverage

    print(f"wrote {run_interval_coverage(args.out)}")
    return 0
