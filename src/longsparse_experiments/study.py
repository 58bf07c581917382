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
from longsparse.tasks import get_task
from longsparse.train.config import ConfigError, apply_overrides, build_config, deep_merge, load_toml
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
)


@dataclass(frozen=True)
class Cell:
    """One run of a study: a method and positions at one seed. ``run`` is its folder below the study's output
    folder (``<study>/<method>-<positions>-s<seed>``); ``overrides`` are the study's with the method's merged
    over them (the later setting of a key wins)."""

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

    def samples_for(self, length: int) -> int:
        """Examples evaluated at ``length``: ``id_samples`` at the first (in-distribution) length, ``long_samples``
        from ``long_from`` on, ``samples`` in between."""
        if length == self.lengths[0]:
            return self.id_samples
        return self.long_samples if length >= self.long_from else self.samples

    def cells(self) -> list[Cell]:
        """Every (method, positions, seed) of the study, seed-major, so that a partial run has every method at
        the first seed before any at the second."""
        return [
            Cell(
                method=m,
                positions=pos,
                seed=seed,
                run=f"{self.name}/{m}-{pos}-s{seed}",
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
        return StudyFile(self.path, picked)


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
    return StudyFile(str(p), studies)


def _study(path: Path, s: dict) -> Study:
    """The typed study of a resolved table, after checking every value."""
    where = f"{path}: study {s['name']!r}"
    name = s["name"]
    # the name is the folder of its runs under --out: one plain path component, never "." / ".." or hidden
    if not isinstance(name, str) or not name or name.startswith(".") or any(c in name for c in "/\\\0"):
        raise ConfigError(f"{where}: name must be a folder name: non-empty, not starting with '.', without '/' or '\\'")
    for key in ("task", "preset", "description"):
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
        task = get_task(s["task"], preset)
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
    )


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
    except ConfigError as e:
        raise ConfigError(f"{path}: {where}: {e}") from None
