"""The library never depends on the experiments: no module of ``longsparse`` imports ``longsparse_experiments``
(at the top or inside a function, absolutely, by a relative import or by name through importlib), and importing
the library and building its command line loads nothing of the experiments."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
LIBRARY, EXPERIMENTS = "longsparse", "longsparse_experiments"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, wherever it sits (module level, function,
    class, try/if blocks); relative imports resolved against the file's package; string arguments of
    ``importlib.import_module`` / ``__import__`` and ``"module:attr"`` strings (import paths the code loads
    later, e.g. a registry entry) count as imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            out.append((node.lineno, module))
            out += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and node.value.split(":")[0].strip()
            and " " not in node.value.split(":")[0]
        ):
            out.append((node.lineno, node.value.split(":")[0]))
    return out


def _is_experiments(name: str) -> bool:
    return name == EXPERIMENTS or name.startswith(EXPERIMENTS + ".")


def test_no_library_module_imports_the_experiments():
    files = sorted((SRC / LIBRARY).rglob("*.py"))
    assert len(files) > 40  # the whole library is scanned, not an empty glob
    bad = [
        f"{f.relative_to(SRC)}:{line}: {name}"
        for f in files
        for line, name in imported_names(f)
        if _is_experiments(name)
    ]
    assert not bad, "the library imports the experiments:\n" + "\n".join(bad)


def test_the_experiments_import_the_library():
    """The other direction holds and the scan sees it (so the check above is not vacuous)."""
    names = {name for f in (SRC / EXPERIMENTS).rglob("*.py") for _, name in imported_names(f)}
    assert any(n == LIBRARY or n.startswith(LIBRARY + ".") for n in names)


@pytest.mark.parametrize(
    "source,expected",
    [
        ("import longsparse_experiments\n", True),
        ("def f():\n    from longsparse_experiments.reproduce import load_study\n", True),
        ("try:\n    import longsparse_experiments.cli as c\nexcept ImportError:\n    pass\n", True),
        ("import importlib\nm = importlib.import_module('longsparse_experiments.demo')\n", True),
        ("ARCH = 'longsparse_experiments.figures:make_figures'\n", True),
        ("from ..experiments import x\n", False),  # a relative import resolves inside longsparse
        ('"""A docstring may name longsparse_experiments."""\n', False),
        ("import longsparse.train\n", False),
    ],
)
def test_the_scan_finds_every_kind_of_import(tmp_path, monkeypatch, source, expected):
    pkg = tmp_path / LIBRARY / "sub"
    pkg.mkdir(parents=True)
    f = pkg / "mod.py"
    f.write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    assert any(_is_experiments(n) for _, n in imported_names(f)) == expected


def test_importing_the_library_loads_no_experiment_module():
    code = (
        "import sys, longsparse, longsparse.cli, longsparse.lm, longsparse.report, longsparse.train\n"
        "longsparse.cli.build_parser()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'longsparse_experiments'))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert res.stdout.strip() == "[]", res.stdout
