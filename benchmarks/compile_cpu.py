"""The compiled training step against the eager one on the CPU: `longsparse.train.loop.train_step` of the MQMTAR
(inline) `cpu` preset with NAPE, softmax and ASEntmax, one thread; the first step (which compiles) apart, then
interleaved rounds (each round one eager and one compiled step on the same batch), medians. Behind
``train.compile = "auto"`` staying off on the CPU. The JSON is never overwritten.

    python benchmarks/compile_cpu.py --out benchmarks/results/train-step-compile-cpu.json [--repeats 7]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from longsparse.tasks import IGNORE_INDEX
from longsparse.train import build_config
from longsparse.train.config import make_task, resolve
from longsparse.train.loop import CompiledLoss, build_model_and_optimizer, train_step
from longsparse_experiments.bench import write_result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.threads < 1:
        ap.error("--repeats and --threads must be at least 1")
    if Path(args.out).exists():
        ap.error(f"{args.out} exists; choose another --out (results are never overwritten)")
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    rows = []
    for method in ("softmax", "asentmax"):
        cfg = resolve(build_config("mqmtar_inline", preset="cpu", method=method, positions="nape"))
        task, tr = make_task(cfg["task"]), cfg["train"]
        batch = task.batch(tuple(tr["train_lengths"]), tr["batch_size"], rng=task.rng(0, "train"))
        n_target = int((batch.labels != IGNORE_INDEX).sum())
        steps, first = {}, {}
        for mode in ("eager", "compiled"):
            model, opt = build_model_and_optimizer(cfg, task, cpu)
            loss_fn = CompiledLoss(cpu) if mode == "compiled" else None

            def step(model=model, opt=opt, loss_fn=loss_fn):
                off = torch.autocast("cpu", enabled=False)
                train_step(model, opt, batch, n_target=n_target, lr=1e-4, grad_clip=1.0, autocast=off, loss_fn=loss_fn)

            t0 = time.perf_counter()
            step()
            first[mode] = time.perf_counter() - t0
            steps[mode] = step
        times = {m: [] for m in steps}
        for _ in range(args.repeats):
            for mode, step in steps.items():
                t0 = time.perf_counter()
                step()
                times[mode].append(time.perf_counter() - t0)
        med = {m: statistics.median(t) for m, t in times.items()}
        for mode in steps:
            rows.append(
                {
                    "method": method,
                    "mode": mode,
                    "batch": list(batch.input_ids.shape),
                    "first_step_s": first[mode],
                    "median_step_s": med[mode],
                    "times_s": times[mode],
                    "vs_eager": med[mode] / med["eager"],
                }
            )
            print(
                f"{method:9s} {mode:9s} first {first[mode]:6.1f} s  step {med[mode]:.3f} s  {med[mode] / med['eager']:.2f}x"
            )
    write_result("train_step_compile", rows, args.out, vars(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
