"""The benchmark scripts (benchmarks/*.py) as modules, for the tests of their pure parts."""

from __future__ import annotations

import importlib.util
import sys

from helpers.paths import BENCHMARKS


def benchmark_script(name: str):
    """The script ``benchmarks/<name>.py`` as a module, loaded from its file once (cached in sys.modules as
    ``benchmarks_<name>``) without putting benchmarks/ on sys.path: the scripts are run as files, not installed
    as a package, so a test of one loads it the same way."""
    key = f"benchmarks_{name}"
    if key not in sys.modules:
        path = BENCHMARKS / f"{name}.py"
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # dataclasses look their module up while a class is made
        spec.loader.exec_module(module)
    return sys.modules[key]
