"""Fault injection for the resume tests: a training callback that SIGKILLs the process right after a step.

In a test process: ``train(cfg, out, callbacks=[sigkill_after(7)])``. From a subprocess that runs the library's
command line with the fault (the way a user's run dies): ``python tests/helpers/faults.py STEP -- train --task
...``; the trainer that command calls gets the callback, so nothing after that step's checkpoint runs."""

from __future__ import annotations

import functools
import os
import signal
import sys


def sigkill_after(step: int):
    """A ``train`` callback that kills this process with SIGKILL once update ``step`` is done."""

    def callback(done: int) -> None:
        if done == step:
            os.kill(os.getpid(), signal.SIGKILL)

    return callback


def main(argv: list[str]) -> int:
    step, sep, *cli_args = argv
    if sep != "--":
        raise SystemExit("usage: python tests/helpers/faults.py STEP -- <longsparse.cli arguments>")
    import longsparse.train
    from longsparse.cli import main as cli_main

    longsparse.train.train = functools.partial(longsparse.train.train, callbacks=[sigkill_after(int(step))])
    return cli_main(cli_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
