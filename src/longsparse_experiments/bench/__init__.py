"""`longsparse bench …`: speed and memory measured as ratios within one run, written to JSON.

Absolute times on shared machines swing by 2x; the ratios to torch.softmax / SDPA measured interleaved in the
same process are what the docs report. One module per role:

* ``registry``  the kinds of result (``Bench``, ``BENCHES``, ``register_bench``), their JSON files
                (``write_result``) and tables (``markdown``);
* ``timing``    the clocks: interleaved medians, process CPU time, resident memory, worker processes;
* ``kernels``   ``mapping``, ``attention``, ``short``: the mappings and attention calls;
* ``training``  ``train-step``, ``train-run``, ``eval``: whole steps, runs and evaluations per method;
* ``tables``    each kind's markdown table;
* ``cli``       the kinds measured here, registered, and the command (``add_cli``, ``main``);
* ``__main__``  the per-measurement workers (``python -m longsparse_experiments.bench --attention-worker ...``).

A new kind is one ``register_bench(Bench(name, table, run))``: its table then prints any saved result of it.
"""

from longsparse_experiments.bench.cli import add_cli, main
from longsparse_experiments.bench.kernels import (
    ATTENTION_METHODS,
    attention_worker,
    bench_attention,
    bench_mapping,
    bench_short,
)
from longsparse_experiments.bench.registry import BENCHES, Bench, environment, markdown, register_bench, write_result
from longsparse_experiments.bench.training import (
    TRAIN_BENCH_METHODS,
    bench_eval,
    bench_train_run,
    bench_train_step,
    train_step_worker,
)

__all__ = [
    "ATTENTION_METHODS",
    "BENCHES",
    "Bench",
    "TRAIN_BENCH_METHODS",
    "add_cli",
    "attention_worker",
    "bench_attention",
    "bench_eval",
    "bench_mapping",
    "bench_short",
    "bench_train_run",
    "bench_train_step",
    "environment",
    "main",
    "markdown",
    "register_bench",
    "train_step_worker",
    "write_result",
]
