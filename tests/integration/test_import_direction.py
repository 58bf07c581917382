"""The library never depends on the experiments: no module of ``longsparse`` imports ``longsparse_experiments``
(at the top or inside a function, absolutely, by a relative import or by name through importlib), and importing
the library and building its command line loads nothing of the experiments."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import SRC

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


# ----------------------------------------------------------------------------- the library's layers
# What each layer of the library may import (docs/architecture.md, "Layers"): every import counts, at the top
# or inside a function, by a relative import or by an import path in a string. A layer is a subpackage or a
# top-level module; "" is longsparse/__init__.py, which re-exports the public API.
# atomic writes; the Wilson interval; the build of the fused CPU kernels (one module from the C++ sources of
# mappings/ and attention/): they import no layer, and any layer may use them
_BASE = {"io", "stats", "cpu_kernel"}
ALLOWED = {
    "io": set(),
    "stats": set(),
    "cpu_kernel": set(),
    "mappings": set() | _BASE,
    "attention": {"mappings"} | _BASE,
    "nn": {"attention", "mappings"} | _BASE,
    "hsa": {"nn", "attention", "mappings"} | _BASE,
    "models": {"hsa", "nn", "attention", "mappings"} | _BASE,
    "lm": set() | _BASE,
    "tasks": {"lm"} | _BASE,
    "train": {"tasks", "models", "hsa", "nn", "attention", "mappings", "lm"} | _BASE,
    "evaluate": {"train", "tasks", "models", "hsa", "nn", "attention", "mappings", "lm"} | _BASE,
    "report": set() | _BASE,
    "migrate": {"train", "report", "models", "nn"} | _BASE,
    "cli": {"migrate", "evaluate", "report", "train", "tasks", "models", "hsa", "nn", "lm", "attention", "mappings"}
    | _BASE,
    "": {"attention", "mappings", "nn", "models", "hsa", "train", "evaluate", "tasks", "report", "lm"} | _BASE,
}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_imports() -> dict:
    """{(importing layer, imported layer): ["file:line", ...]} over every import between layers."""
    edges = {}
    for f in sorted((SRC / LIBRARY).rglob("*.py")):
        here = _layer(_module_name(f))
        for line, name in imported_names(f):
            if name.split(".")[0] != LIBRARY or name == LIBRARY:
                continue
            there = _layer(name)
            if there != here:
                edges.setdefault((here, there), []).append(f"{f.relative_to(SRC)}:{line}")
    return edges


def test_every_layer_imports_only_the_layers_below_it():
    edges = layer_imports()
    assert ("train", "tasks") in edges and ("nn", "attention") in edges  # the scan sees the layers' imports
    layers = {here for here, _ in edges} | {there for _, there in edges}
    assert layers <= set(ALLOWED), f"layers missing from ALLOWED: {sorted(layers - set(ALLOWED))}"
    bad = [
        f"{here} -> {there}: {places[0]}"
        for (here, there), places in sorted(edges.items())
        if there not in ALLOWED[here]
    ]
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_the_layer_table_has_no_cycle():
    order, seen = [], set()

    def visit(layer, path):
        assert layer not in path, f"cycle: {' -> '.join([*path, layer])}"
        if layer not in seen:
            for below in sorted(ALLOWED[layer]):
                visit(below, [*path, layer])
            seen.add(layer)
            order.append(layer)

    for layer in sorted(ALLOWED):
        visit(layer, [])
    assert len(order) == len(ALLOWED)


def _module_cycles() -> list:
    """Import cycles between the library's modules (Tarjan's strongly connected components), counting imports
    inside functions: such an import only postpones the cycle to the first call."""
    modules = {_module_name(f): f for f in (SRC / LIBRARY).rglob("*.py")}
    graph = {m: set() for m in modules}
    for m, f in modules.items():
        for _, name in imported_names(f):
            parts = name.split(".")
            target = next(
                (".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules), None
            )
            # a package's __init__ importing its own modules (or a module its package) is not a cycle to break
            if target and target != m and not m.startswith(target + ".") and not target.startswith(m + "."):
                graph[m].add(target)
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return cycles


def test_no_import_cycle_between_modules():
    assert _module_cycles() == []
