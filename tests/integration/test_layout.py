"""The test suite's own layout: every test module sits in the folder of what it tests, no test module imports
another (or conftest.py), and the folder tests/integration carries the `integration` marker."""

from __future__ import annotations

import ast

from helpers.paths import SRC, TESTS

LIBRARY = SRC / "longsparse"
# tests/entmax_v13 is the entmax package's own suite, run against the drop-in names as upstream wrote it
UPSTREAM = TESTS / "entmax_v13"


def _test_modules():
    return sorted(p for p in TESTS.rglob("test_*.py") if not p.is_relative_to(UPSTREAM))


def test_every_test_module_sits_in_a_layer_experiments_or_integration_folder():
    misplaced = []
    for path in _test_modules():
        parts = path.relative_to(TESTS).parts
        if parts[0] in ("experiments", "integration") and len(parts) == 2:
            continue
        layer = parts[1] if parts[0] == "unit" and len(parts) == 3 else None
        if layer and ((LIBRARY / layer).is_dir() or (LIBRARY / f"{layer}.py").is_file()):
            continue
        misplaced.append(str(path.relative_to(TESTS)))
    assert not misplaced, (
        f"test modules outside tests/unit/<layer of src/longsparse>, experiments, integration: {misplaced}"
    )


def test_no_test_module_imports_another_or_conftest():
    names = {p.stem for p in _test_modules()} | {"conftest"}
    found = []
    for path in [*_test_modules(), *TESTS.glob("helpers/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            else:
                continue
            found += [f"{path.relative_to(TESTS)}:{node.lineno}: {m}" for m in mods if m.split(".")[0] in names]
    assert not found, f"import shared code from tests/helpers instead: {found}"


def test_the_marker_is_on_the_integration_folder_only(request):
    # every test of this session (all of the default run's, in a full run): marked exactly when under the folder
    folder = TESTS / "integration"
    assert request.node.get_closest_marker("integration") is not None
    wrong = [
        i.nodeid
        for i in request.session.items
        if bool(i.get_closest_marker("integration")) != i.path.is_relative_to(folder)
    ]
    assert not wrong, wrong
