"""The ``longsparse findings`` command: ``cross-study`` (row command C2 of docs/findings.md),
``interval-coverage`` (C14), ``mechanism`` (attention mass on the queried pair in trained models), ``hsa-seeds``
(the HSA six-seed study), ``matched-convergence`` (ASEntmax − softmax at equal fit) and ``per-method-lr`` (each
method at the learning rate it selects)."""

from __future__ import annotations

import argparse


def add_cli(sub) -> None:
    """Register ``longsparse findings cross-study|interval-coverage|mechanism|hsa-seeds|matched-convergence|per-method-lr`` on the top-level subparsers."""
    f = sub.add_parser("findings", help="the cross-study analyses of docs/findings.md (C2, C14) from committed records")
    fsub = f.add_subparsers(
        dest="findings_command",
        required=True,
        metavar="cross-study|interval-coverage|mechanism|hsa-seeds|matched-convergence|per-method-lr",
    )
    c = fsub.add_parser(
        "cross-study", help="C2: comparisons --analyse cannot make (across studies, HSA, LM) and the combined forest"
    )
    c.add_argument("--root", default=".", help="repository root holding results/ (default: the current folder)")
    c.add_argument("--out", default=None, help="output folder (default ROOT/docs/findings)")
    c.set_defaults(func=_cross_study)
    i = fsub.add_parser("interval-coverage", help="C14: simulated coverage of the seed-level intervals (~1.5 CPU-min)")
    i.add_argument("--out", default="docs/findings", help="output folder (default docs/findings)")
    i.set_defaults(func=_interval_coverage)
    _add_mechanism(fsub)
    h = fsub.add_parser("hsa-seeds", help="the HSA six-seed study: how often each variant trains, rows B1-B7")
    h.add_argument("--store", default="results/hsa_seeds", help="the study's results store (default results/hsa_seeds)")
    h.add_argument("--out", default=None, help="also write analysis.json and analysis.md into this folder")
    h.set_defaults(func=_hsa_seeds)
    mc = fsub.add_parser(
        "matched-convergence", help="the matched-convergence study: matched runs, ASEntmax − softmax at equal fit"
    )
    mc.add_argument("--prereg", default="results/prereg_mqmtar", help="the pre-registered study's archive folder")
    mc.add_argument("--matched", default="results/matched_convergence", help="the retrained runs' archive folder")
    mc.add_argument("--out", default=None, help="also write analysis.json and analysis.md into this folder")
    mc.set_defaults(func=_matched_convergence)
    pl = fsub.add_parser(
        "per-method-lr", help="the per-method lr study: each method's selected lr, then the comparison"
    )
    pl.add_argument("--store", default="results/per_method_lr", help="the study's results store")
    pl.add_argument("--out", default=None, help="also write analysis.json and analysis.md into this folder")
    pl.set_defaults(func=_per_method_lr)


def _add_mechanism(fsub) -> None:
    from longsparse_experiments.findings import mechanism

    m = fsub.add_parser("mechanism", help="attention mass on the queried pair in trained mqmtar_inline models")
    msub = m.add_subparsers(dest="mechanism_command", required=True, metavar="measure|summary|figure")
    a = msub.add_parser("measure", help="measure run folders' last checkpoints into a JSON file (resumable)")
    a.add_argument("runs", nargs="+", help="run folders")
    a.add_argument(
        "--out", required=True, help="the JSON file, gzip-compressed if it ends in .gz (created, or extended)"
    )
    a.add_argument("--stream", type=int, required=True, help="seed of the test stream the examples come from")
    a.add_argument("--lengths", default=None, help="LENGTH:EXAMPLES,... (default 64:50,1024:50,4096:20,16384:5)")
    a.set_defaults(func=mechanism.main_measure)
    s = msub.add_parser("summary", help="print the per-run and per-method tables of a measured file")
    s.add_argument("file")
    s.add_argument("--json", default=None, help="also write the analysis as JSON here")
    s.set_defaults(func=mechanism.main_summary)
    f = msub.add_parser("figure", help="plot each run's retrieval-head mass against length")
    f.add_argument("file")
    f.add_argument("--out", required=True, help="the PNG to write")
    f.set_defaults(func=mechanism.main_figure)


def _cross_study(args: argparse.Namespace) -> int:
    from longsparse_experiments.findings.cross_study import run_cross_study

    out = run_cross_study(args.root, args.out)
    print(f"wrote the cross-study analyses to {out}")
    return 0


def _hsa_seeds(args: argparse.Namespace) -> int:
    from longsparse_experiments.findings.hsa_seeds import main

    return main(args)


def _matched_convergence(args: argparse.Namespace) -> int:
    from longsparse_experiments.findings.matched_convergence import main

    return main(args)


def _per_method_lr(args: argparse.Namespace) -> int:
    from longsparse_experiments.findings.per_method_lr import main

    return main(args)


def _interval_coverage(args: argparse.Namespace) -> int:
    from longsparse_experiments.findings.interval_coverage import run_interval_coverage

    print(f"wrote {run_interval_coverage(args.out)}")
    return 0
