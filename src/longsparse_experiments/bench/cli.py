"""`longsparse bench`: the kinds measured here registered with their runs and tables, the command's flags and
its driver."""

from __future__ import annotations

import argparse

import torch

from longsparse.cli import positive_int
from longsparse_experiments.bench import tables
from longsparse_experiments.bench.kernels import bench_attention, bench_mapping, bench_short
from longsparse_experiments.bench.registry import BENCHES, Bench, markdown, register_bench, write_result
from longsparse_experiments.bench.training import bench_eval, bench_train_run, bench_train_step


def _methods(args: argparse.Namespace, config: dict) -> tuple:
    methods = tuple(m for m in args.methods.split(",") if m)
    config.update(task=args.task, preset=args.preset, positions=args.positions, methods=methods, sets=args.set)
    return methods


def _run_mapping(args, lengths, config):
    return bench_mapping(lengths, args.repeats)


def _run_short(args, lengths, config):
    config.update(batch=64, heads=4, dim=16, causal=True)
    return bench_short(lengths, args.repeats)


def _run_attention(args, lengths, config):
    fwd_only = [int(v) for v in args.fwd_only_lengths.split(",") if v]
    config.update(heads=8, dim=64, fwd_only_lengths=fwd_only, batch=1, causal=True)
    return bench_attention(lengths, args.repeats, fwd_only_lengths=fwd_only)


def _run_train_step(args, lengths, config):
    methods = _methods(args, config)
    return bench_train_step(lengths, args.repeats, methods, args.task, args.preset, args.positions, args.set)


def _run_train_run(args, lengths, config):
    methods = _methods(args, config)
    config.update(steps=args.steps or 150)
    return bench_train_run(
        config["steps"], args.repeats, methods, args.task, args.preset, args.positions, args.set, workdir=args.workdir
    )


def _run_eval(args, lengths, config):
    methods = _methods(args, config)
    config.update(samples=args.samples, runs=args.runs, train_steps=args.steps or 30)
    return bench_eval(
        lengths,
        args.repeats,
        args.samples,
        args.runs,
        config["train_steps"],
        methods,
        args.task,
        args.preset,
        args.positions,
        args.set,
    )


for _bench in (
    Bench(
        "mapping", tables.mapping_table, _run_mapping, "512,1024,2048,4096,8192", "row-wise mappings, fwd and fwd+bwd"
    ),
    Bench("attention", tables.attention_table, _run_attention, help="attention fwd / fwd+bwd per method against SDPA"),
    Bench(
        "short",
        tables.short_table,
        _run_short,
        "32,64,128,256,512",
        "attention fwd+bwd at training lengths, auto vs the chunked path",
    ),
    Bench(
        "train-step", tables.train_step_table, _run_train_step, "32,64", "whole training steps per method: time, memory"
    ),
    Bench("train-run", tables.train_run_table, _run_train_run, "", "whole `longsparse train` runs per method"),
    Bench("eval", tables.eval_table, _run_eval, "16384", "evaluation examples/s of trained decoders"),
    Bench("sdpa_blocks", tables.sdpa_blocks_table, help="benchmarks/sdpa_blocks.py"),
    Bench("alibi_band", tables.alibi_band_table, help="benchmarks/alibi_band.py"),
    Bench("train_step_compile", tables.compile_table, help="benchmarks/compile_cpu.py"),
    Bench("sm90_compile", tables.sm90_compile_table, help="benchmarks/sm90_compile.py"),
    Bench("decode_host", tables.decode_host_table, help="benchmarks/decode_host.py"),
):
    register_bench(_bench)


def add_cli(sub: argparse._SubParsersAction) -> None:
    """Register ``longsparse bench`` on ``sub``, the ``longsparse`` command's subcommands."""
    b = sub.add_parser("bench", help="speed/memory benchmarks written to JSON")
    b.add_argument(
        "what",
        choices=[*(name for name, b in BENCHES.items() if b.run is not None), "table"],
        help="what to benchmark ("
        + "; ".join(f"{name}: {b.help}" for name, b in BENCHES.items() if b.run is not None)
        + "); `table --out FILE.json` prints a saved result (of any kind) as markdown",
    )
    b.add_argument(
        "--out", default=None, help="JSON output path (default benchmarks/results/<what>-<device>-<date>.json)"
    )
    b.add_argument(
        "--lengths",
        default=None,
        help="row lengths / sequence lengths (default mapping 512..8192, attention 512..16384, short 32..512)",
    )
    b.add_argument("--fwd-only-lengths", default="32768,65536", help="attention: forward-only lengths")
    b.add_argument("--repeats", type=positive_int, default=5)
    b.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    b.add_argument(
        "--methods",
        default="softmax,asentmax",
        help="train-step / train-run / eval: methods compared, ratios to the first (default softmax,asentmax)",
    )
    b.add_argument(
        "--task", default="mqmtar_inline", help="train-step / train-run / eval: task (default mqmtar_inline)"
    )
    b.add_argument("--preset", default="cpu", help="train-step / train-run / eval: preset (default cpu)")
    b.add_argument("--positions", default="nape", help="train-step / train-run / eval: positions (default nape)")
    b.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        help="train-run: steps per run (default 150); eval: training steps of the decoders trained "
        "here when no --runs are given (default 30)",
    )
    b.add_argument("--samples", type=positive_int, default=1, help="eval: examples per length and round (default 1)")
    b.add_argument(
        "--runs",
        nargs="+",
        default=None,
        metavar="RUN",
        help="eval: run folders whose best checkpoints are measured (instead of training decoders here)",
    )
    b.add_argument("--workdir", default=None, help="train-run: keep the run folders here (default: a temporary folder)")
    b.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="train-step / train-run / eval: config override of the measured runs, as for train (repeatable)",
    )
    b.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Run the benchmark ``args.what`` (the parsed ``longsparse bench`` flags, see ``add_cli``) and write its JSON;
    ``table`` prints the markdown of the saved result ``args.out`` instead."""
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.what == "table":
        if not args.out:
            raise SystemExit("longsparse bench table: --out FILE.json (the saved result to print) is required")
        print(markdown(args.out))
        return 0
    bench = BENCHES[args.what]
    lengths = [int(v) for v in (args.lengths or bench.lengths).split(",") if v]
    config = {"lengths": lengths, "repeats": args.repeats}
    rows = bench.run(args, lengths, config)
    path = write_result(args.what, rows, args.out, config)
    print(f"wrote {path}")
    return 0
