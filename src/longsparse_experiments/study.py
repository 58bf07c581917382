"""The study spec: what `longsparse reproduce` trains and evaluates, read from a study TOML file into typed objects.

A study file holds ``[[study]]`` tables (and an optional ``[defaults]`` table under them all). Each study is a
grid of cells, task × method × positions × seed, every cell trained from the task's preset with the study's
``[study.overrides]`` (dotted keys: ``model.d_model = 64``) and then its method's
``[study.method_overrides.<method>]`` merged over it, and evaluated at every length of ``lengths``::

    spec = load_study(path="src/longsparse_experiments/configs/reproduce/synthetic.toml")
    for study in spec.studies:
        for cell in study.cells():
            cfg = study.cell_config(cell)       # the run config `longsparse train` gets

``load_study`` checks everything that would fail later (unknown task, method, positions, checkpoint or key; a
length the task cannot make; sample counts) before anything runs, so a bad study file fails in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from longsparse.migrate import read_study_sets
from longsparse.nn.config import METHODS
from longsparse.nn.positions import POSITIONS
from longsparse.tasks import PRESETS, get_task
from longsparse.tasks.registry import task_class
from longsparse.train.config import (
    ConfigError,
    apply_overrides,
    build_config,
    check_nested_attention,
    deep_merge,
    load_toml,
    preset_path,
)
from longsparse_experiments.presets import presets_dir

CHECKPOINTS = ("best", "last")
REQUIRED = ("name", "task", "methods", "positions", "seeds", "lengths", "samples")
# Keys a study table may give besides REQUIRED (``like`` and ``more_overrides`` are resolved while reading).
OPTIONAL = (
    "preset",
    "long_samples",
    "long_from",
    "id_samples",
    "overrides",
    "method_overrides",
    "description",
    "checkpoints",
    "test_seed",
    "folder",
    "run_name",
    "samples_at",
)
# A study file's optional top-level ``report``: how its results are recorded and rendered. "tables": the records
# and tables of study_records (per method/positions, mean over seeds); "hsa": each evaluation recorded whole (needle
# diagnostics, training record) in the form the HSA study's tables read (``hsa_study``); "lm": the LM study, whose
# [[study]] tables are grids over an LM preset, read and run by ``lm_study`` (its task needs the corpus to check).
REPORTS = ("tables", "hsa", "lm")
DEFAULT_RUN_NAME = "{method}-{positions}-s{seed}"


@dataclass(frozen=True)
class Cell:
    """One run of a study: a method and positions at one seed. ``run`` is its folder below the study's output
    folder (``<folder>/<run_name>``; by default ``<study>/<method>-<positions>-s<seed>``); ``overrides`` are the
    study's with the method's merged over them (the later setting of a key wins)."""

    method: str
    positions: str
    seed: int
    run: str
    overrides: dict[str, Any]


@dataclass(frozen=True)
class Study:
    """One ``[[study]]`` of a study file, with its defaults filled in.

    ``lengths`` are increasing and the first is the in-distribution one (where the ≥ 99 % bar is checked, with
    ``id_samples`` examples); lengths from ``long_from`` on get ``long_samples`` examples, the others
    ``samples``. ``test_seed`` names the evaluation stream, ``checkpoints`` which of a run's checkpoints are
    evaluated."""

    name: str
    task: str
    methods: tuple[str, ...]
    positions: tuple[str, ...]
    seeds: tuple[int, ...]
    lengths: tuple[int, ...]
    samples: int
    long_samples: int
    long_from: int
    id_samples: int
    preset: str = "cpu"
    overrides: dict[str, Any] = field(default_factory=dict)
    method_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    description: str = ""
    checkpoints: tuple[str, ...] = CHECKPOINTS
    test_seed: int = 0
    folder: str = ""
    run_name: str = DEFAULT_RUN_NAME
    samples_at: dict[int, int] = field(default_factory=dict)

    def samples_for(self, length: int) -> int:
        """Examples evaluated at ``length``: ``samples_at[length]`` where given, else ``id_samples`` at the first
        (in-distribution) length, ``long_samples`` from ``long_from`` on, ``samples`` in between."""
        if length in self.samples_at:
            return self.samples_at[length]
        if length == self.lengths[0]:
            return self.id_samples
        return self.long_samples if length >= self.long_from else self.samples

    def cells(self) -> list[Cell]:
        """Every (method, positions, seed) of the study, seed-major, so that a partial run has every method at
        the first seed before any at the second. A cell's run folder is ``<folder>/<run_name>`` (``folder``
        defaults to the study's name, ``run_name`` to ``DEFAULT_RUN_NAME``; its fields: method, positions, seed)."""
        return [
            Cell(
                method=m,
                positions=pos,
                seed=seed,
                run=f"{self.folder or self.name}/{self.run_name.format(method=m, positions=pos, seed=seed)}",
                overrides=deep_merge(self.overrides, self.method_overrides.get(m, {})),
            )
            for seed in self.seeds
            for m in self.methods
            for pos in self.positions
        ]

    def cell_config(self, cell: Cell) -> dict:
        """The training config of ``cell``: the task's preset plus the study's and the method's overrides."""
        return build_config(
            self.task,
            preset=self.preset,
            method=cell.method,
            positions=cell.positions,
            seed=cell.seed,
            overrides=cell.overrides,
        )


@dataclass(frozen=True)
class StudyFile:
    """A study file read by ``load_study``: its path (as given) and its studies, in file order, names unique."""

    path: str
    studies: tuple[Study, ...]
    report: str = "tables"

    def names(self) -> set[str]:
        return {s.name for s in self.studies}

    def select(self, only: Optional[Sequence[str]]) -> StudyFile:
        """The studies ``--only`` picks (all of them when ``only`` is empty): an entry that is a study's name picks
        that study alone; any other entry picks every study of that task (so ``--only mqmtar_inline`` is not also
        its _3l/_rope variants). An entry that is neither is an error."""
        if not only:
            return self
        known = self.names() | {s.task for s in self.studies}
        if set(only) - known:
            raise ConfigError(f"--only: unknown {sorted(set(only) - known)}; the study file has {sorted(known)}")
        names = self.names()
        picked = tuple(s for s in self.studies if s.name in only or any(x not in names and x == s.task for x in only))
        return StudyFile(self.path, picked, self.report)


def load_study(name: str = "synthetic", quick: bool = False, path: Optional[str] = None) -> StudyFile:
    """The study file ``path`` (default: this package's ``configs/reproduce/<name>[-quick].toml``), validated.

    A ``[[study]]`` may say ``like = "<earlier study>"`` to take that study's settings (not its name or
    description) and override some of them; ``more_overrides`` is merged over the ``overrides`` it has (the later
    of two settings of one key wins), so a variant names only what it changes. ``[defaults]`` fills what a study
    leaves out. A file in the older form (``sets``, ``more_sets``, ``method_sets``: lists of ``--set`` strings, as
    the pre-registered study's) is read as the same tables through ``longsparse.migrate.read_study_sets``. Raises ConfigError naming the file, the study and the problem."""
    p = Path(path) if path else presets_dir() / "reproduce" / f"{name}{'-quick' if quick else ''}.toml"
    if not p.is_file():
        raise ConfigError(f"no study file {p}")
    raw = load_toml(p)
    report = raw.get("report", "tables")
    if report not in REPORTS:
        raise ConfigError(f"{p}: report must be one of {', '.join(REPORTS)}, got {report!r}")
    if report == "lm":
        return StudyFile(str(p), (), report)
    tables = raw.get("study")
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"{p}: needs at least one [[study]] table")
    defaults = _current_form(p, "[defaults]", raw.get("defaults", {}))
    read: list[dict] = []  # the resolved tables, which a later ``like`` copies
    for i, s in enumerate(tables):
        s = _current_form(p, f"study #{i + 1}", s)
        if "like" in s:
            base = next((dict(b) for b in read if b["name"] == s["like"]), None)
            if base is None:
                raise ConfigError(f"{p}: study #{i + 1}: like = {s['like']!r} names no earlier study")
            for k in ("name", "description"):
                base.pop(k, None)
            s = {**base, **{k: v for k, v in s.items() if k != "like"}}
        s = {**defaults, **s}
        if "more_overrides" in s:
            s["overrides"] = deep_merge(s.get("overrides", {}), s.pop("more_overrides"))
        missing = [k for k in REQUIRED if k not in s]
        if missing:
            raise ConfigError(f"{p}: study #{i + 1} lacks {missing}")
        unknown = sorted(set(s) - set(REQUIRED) - set(OPTIONAL))
        if unknown:
            raise ConfigError(f"{p}: study {s['name']!r} has unknown key(s) {unknown}")
        read.append(s)
    studies = tuple(_study(p, s) for s in read)
    names = [s.name for s in studies]
    if len(set(names)) != len(names):
        raise ConfigError(f"{p}: study names must be unique, got {names}")
    runs = [c.run for s in studies for c in s.cells()]
    twice = sorted({r for r in runs if runs.count(r) > 1})
    if twice:  # one folder trained by two cells would mix two configs
        raise ConfigError(f"{p}: two cells share the run folder(s) {twice}; give the studies distinct folder/run_name")
    return StudyFile(str(p), studies, report)


def _study(path: Path, s: dict) -> Study:
    """The typed study of a resolved table, after checking every value."""
    where = f"{path}: study {s['name']!r}"
    name = s["name"]
    # the name is the folder of its runs under --out: one plain path component, never "." / ".." or hidden
    if not isinstance(name, str) or not name or name.startswith(".") or any(c in name for c in "/\\\0"):
        raise ConfigError(f"{where}: name must be a folder name: non-empty, not starting with '.', without '/' or '\\'")
    for key in ("task", "preset", "description", "folder", "run_name"):
        if not isinstance(s.get(key, ""), str):
            raise ConfigError(f"{where}: {key} must be a string, got {s[key]!r}")
    for key in ("methods", "positions", "seeds", "lengths", "checkpoints"):
        if key in s and (not isinstance(s[key], list) or not s[key]):
            raise ConfigError(f"{where}: {key} must be a non-empty list, got {s[key]!r}")
    for key in ("seeds", "lengths"):
        if any(isinstance(x, bool) or not isinstance(x, int) for x in s[key]):
            raise ConfigError(f"{where}: {key} must be integers, got {s[key]!r}")
    for key in ("seeds", "methods", "positions", "checkpoints"):  # a repeat would train and record a cell twice
        if key in s and len(set(map(str, s[key]))) != len(s[key]):
            raise ConfigError(f"{where}: {key} must be distinct, got {s[key]}")
    preset = s.get("preset", "cpu")
    try:
        task = _task_of(s["task"], preset)
        for L in s["lengths"]:
            task.check_length(L)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    if list(s["lengths"]) != sorted(set(s["lengths"])):
        raise ConfigError(
            f"{where}: lengths must be increasing (the first is the in-distribution one), got {s['lengths']}"
        )
    for key in ("samples", "long_samples", "id_samples", "long_from"):
        v = s.get(key, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{where}: {key} must be an integer >= 1, got {v!r}")
    _check_run_name(where, s.get("folder") or name, s.get("run_name", DEFAULT_RUN_NAME))  # "": the name
    samples_at = s.get("samples_at", {})
    if not isinstance(samples_at, dict) or any(
        not str(L).isdigit() or int(L) not in s["lengths"] or isinstance(n, bool) or not isinstance(n, int) or n < 1
        for L, n in samples_at.items()
    ):
        raise ConfigError(
            f"{where}: samples_at must be a table of the study's lengths to integers >= 1 "
            f'(e.g. samples_at = {{ "65536" = 16 }}), got {samples_at!r}'
        )
    ts = s.get("test_seed", 0)
    if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
        raise ConfigError(f"{where}: test_seed must be an integer >= 0, got {ts!r}")
    for key, known in (("methods", METHODS), ("positions", POSITIONS), ("checkpoints", CHECKPOINTS)):
        bad = [x for x in s.get(key, known) if x not in known]
        if bad:
            raise ConfigError(f"{where}: unknown {key} {bad}; known: {', '.join(known)}")
    return Study(
        name=s["name"],
        task=s["task"],
        methods=tuple(s["methods"]),
        positions=tuple(s["positions"]),
        seeds=tuple(s["seeds"]),
        lengths=tuple(s["lengths"]),
        samples=s["samples"],
        long_samples=s.get("long_samples", s["samples"]),
        long_from=s.get("long_from", max(s["lengths"]) + 1),
        id_samples=s.get("id_samples", s["samples"]),
        preset=preset,
        overrides=s.get("overrides", {}),
        method_overrides=s.get("method_overrides", {}),
        description=s.get("description", ""),
        checkpoints=tuple(s.get("checkpoints", CHECKPOINTS)),
        test_seed=ts,
        folder=s.get("folder", ""),
        run_name=s.get("run_name", DEFAULT_RUN_NAME),
        samples_at={int(L): n for L, n in samples_at.items()},
    )


def _task_of(name: str, preset: str):
    """The task a study's runs are made of: the task preset ``preset``, or for a preset that only the config files
    have (passkey's cpu_full), the ``[task]`` table of that file."""
    if preset in PRESETS.get(task_class(name).name, {}):
        return get_task(name, preset)
    table = load_toml(preset_path(name, preset)).get("task", {})
    return get_task(name, table.get("preset"), **table.get("params", {}))


def _check_run_name(where: str, folder: str, run_name: str) -> None:
    """``folder`` and every ``run_name`` of a cell must be plain folder names (one path component, not hidden),
    and ``run_name`` may use only the fields method, positions and seed."""
    try:
        example = run_name.format(method="m", positions="p", seed=0)
    except (KeyError, IndexError, ValueError, AttributeError) as e:
        raise ConfigError(f"{where}: run_name {run_name!r} may use only {{method}}, {{positions}}, {{seed}} ({e})")
    for what, text in (("folder", folder), ("run_name", example)):
        if not text or text.startswith(".") or any(c in text for c in "/\\\0"):
            raise ConfigError(f"{where}: {what} must give a folder name (not starting with '.', no '/'), got {text!r}")


def _current_form(path: Path, where: str, table: dict) -> dict:
    """A ``[defaults]`` or ``[[study]]`` table with its overrides checked (sections task/model/train, tables
    where the config has tables), a table of the older form converted first (``read_study_sets``)."""
    table = read_study_sets(path, where, table)
    for key in ("overrides", "more_overrides"):
        if key in table:
            _check_overrides(path, f"{where}: {key}", table[key])
    if "method_overrides" in table:
        if not isinstance(table["method_overrides"], dict):
            raise ConfigError(
                f"{path}: {where}: method_overrides must be a table of per-method override tables, "
                f"got {table['method_overrides']!r}"
            )
        for m, over in table["method_overrides"].items():
            _check_overrides(path, f"{where}: method_overrides.{m}", over)
    return table


def _check_overrides(path: Path, where: str, overrides) -> None:
    if not isinstance(overrides, dict):
        raise ConfigError(f"{path}: {where} must be a table (e.g. model.d_model = 64), got {overrides!r}")
    try:
        apply_overrides({}, overrides)
        if isinstance(overrides.get("model"), dict):
            check_nested_attention(overrides["model"], any_arch=True)
    except ConfigError as e:
        raise ConfigError(f"{path}: {where}: {e}") from None
