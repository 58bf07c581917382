"""Preset files: the TOML presets shipped as package data (``longsparse/configs/<task>/<preset>.toml``, or the
folder ``$LONGSPARSE_CONFIGS`` names) and reading a TOML file."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from longsparse.train.config.errors import ConfigError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli has the same API and is a dependency there (pyproject.toml)
    import tomli as tomllib

SCALES = ("cpu", "paper")


def configs_dir() -> Path:
    """``$LONGSPARSE_CONFIGS`` if set, else the presets shipped as package data (``longsparse/configs``).

    A folder on disk: the package is installed unzipped (its C++ kernel is compiled from the installed source),
    so ``importlib.resources`` resolves it to a real path."""
    env = os.environ.get("LONGSPARSE_CONFIGS")
    if env:
        return Path(env)
    return Path(str(resources.files("longsparse") / "configs"))


def available_presets() -> dict[str, list[str]]:
    """``{task: [preset, ...]}`` of the presets folder (``configs_dir``), both sorted."""
    root = configs_dir()
    out: dict[str, list[str]] = {}
    if root.is_dir():
        for d in sorted(p for p in root.iterdir() if p.is_dir()):
            scales = sorted(f.stem for f in d.glob("*.toml"))
            if scales:
                out[d.name] = scales
    return out


def load_toml(path: str | os.PathLike) -> dict:
    """The TOML file at ``path`` as a dict (ConfigError naming the file if it is missing or invalid)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no config file {path}")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from e


def parse_value(text: str):
    """A TOML value (``3e-4``, ``true``, ``[64, 128]``, ``"x"``), else the raw string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def task_name(task: str) -> str:
    """The canonical name of ``task`` (aliases such as ``flipflop`` resolved)."""
    from longsparse.tasks.registry import task_class

    try:
        return task_class(task).name
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None


def preset_path(task: str, preset: str) -> Path:
    """``<configs>/<task>/<preset>.toml``. A preset is a bare name: anything that could leave the task's folder
    (a path separator, ``..``, a leading dot) is refused, so ``--preset`` can never read another task's file."""
    from longsparse.tasks import TASKS

    name = task_name(task)
    have = available_presets().get(name, [])
    seps = {"/", "\\", os.sep, os.altsep} - {None}
    if not isinstance(preset, str) or not preset or preset.startswith(".") or any(c in preset for c in seps):
        raise ConfigError(
            f"preset must be a name, not a path, got {preset!r}; presets of task {name!r}: "
            f"{', '.join(have) or 'none'} (use --config FILE.toml for a file)"
        )
    path = configs_dir() / name / f"{preset}.toml"
    if not path.is_file():
        raise ConfigError(
            f"no preset {preset!r} for task {name!r} (looked for {path}); available: "
            f"{', '.join(have) or 'none'} (tasks: {', '.join(sorted(TASKS))})"
        )
    return path
