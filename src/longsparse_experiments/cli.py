"""The `longsparse` command line: the library's commands (`longsparse.cli`, whose docstring lists them) plus
the experiments:

    longsparse demo [--out runs/demo] [--quick]          softmax+RoPE, ASEntmax+NAPE, softmax+NAPE: 1x-16x, verdicts
    longsparse figures --out docs/figures [--runs RUN ...] [--quick] [--only 1,3]   the paper's analyses (docs/method.md §7)
    longsparse findings cross-study|interval-coverage   the cross-study analyses of docs/findings.md (C2, C14)
    longsparse findings mechanism measure|summary|figure   attention mass on the queried pair in trained models
    longsparse hsa tables NAME | check | write | add STUDY RUN_DIR ...   the HSA study's report tables (docs/hsa.md)
    longsparse lm run [--quick] [--out runs/lm]          LM study: perplexity + passkey vs length (docs/lm.md)
    longsparse lm report runs/lm --out docs/lm
    longsparse reproduce synthetic [--quick] [--only TASKS]   the length-generalisation study (docs/results.md)
    longsparse bench mapping|attention|short|train-step|train-run|eval   speed/memory as JSON (docs/benchmarks.md)
    longsparse bench table --out FILE.json               a saved benchmark result as a markdown table
"""

from __future__ import annotations

import argparse
import sys

from longsparse import cli as library_cli


def _demo(args: argparse.Namespace) -> int:
    from longsparse_experiments.demo import run_demo

    return run_demo(out=args.out, quick=args.quick, samples=args.samples, seed=args.seed)


def _add_demo(sub) -> None:
    d = sub.add_parser(
        "demo",
        help="the main job: standard (softmax+RoPE) vs papers' (ASEntmax+NAPE) recipe, "
        "with softmax+NAPE to attribute the difference; ~2 CPU minutes",
    )
    d.add_argument("--out", default="runs/demo", help="output folder (runs, table, plot, JSON)")
    d.add_argument("--quick", action="store_true", help="a seconds-long smoke version (too short to show the effect)")
    d.add_argument("--samples", type=int, default=None, help="test examples per length")
    d.add_argument("--seed", type=int, default=0, help="training seed (results go to OUT/seed<S> for S != 0)")
    d.set_defaults(func=_demo)


def _with_experiment_presets(library_presets):
    """`presets`: the library's task presets, then the experiments' study presets."""

    def presets(args: argparse.Namespace) -> int:
        from longsparse_experiments.presets import available_presets, presets_dir

        code = library_presets(args)
        print(f"experiment presets in {presets_dir()}:")
        for kind, names in available_presets().items():
            print(f"  {kind:<14} {', '.join(names)}")
        return code

    return presets


def build_parser() -> argparse.ArgumentParser:
    """Every ``longsparse`` command: the library's (``longsparse.cli.add_library_commands``) and the experiments'."""
    from longsparse_experiments.bench import add_cli as add_bench_cli
    from longsparse_experiments.figures import add_cli as add_figures_cli
    from longsparse_experiments.findings import add_cli as add_findings_cli
    from longsparse_experiments.hsa_tables import add_cli as add_hsa_cli
    from longsparse_experiments.lm_study import add_cli as add_lm_cli
    from longsparse_experiments.reproduce import add_cli as add_reproduce_cli

    parser, sub = library_cli.new_parser(__doc__)
    _add_demo(sub)
    library_cli.add_library_commands(sub)
    presets = sub.choices["presets"]
    presets.set_defaults(func=_with_experiment_presets(presets.get_default("func")))
    add_figures_cli(sub)
    add_findings_cli(sub)
    add_hsa_cli(sub)
    add_lm_cli(sub)
    add_reproduce_cli(sub)
    add_bench_cli(sub)
    return parser


def main(argv=None) -> int:
    """The ``longsparse`` console script: errors as in ``longsparse.cli.main`` (one line, exit 2)."""
    return library_cli.main(argv, parser=build_parser())


if __name__ == "__main__":
    sys.exit(main())
