"""Where things are in the repository, for tests that read committed files or start scripts."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS.parent
SRC = REPO_ROOT / "src"
BENCHMARKS = REPO_ROOT / "benchmarks"
# committed inputs of the tests: recorded numbers, old run folders and checkpoints
DATA = TESTS / "data"
HELPERS = TESTS / "helpers"
# run as a script: python tests/helpers/faults.py STEP -- <longsparse.cli arguments>
FAULTS = HELPERS / "faults.py"
