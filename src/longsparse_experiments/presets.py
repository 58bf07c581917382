"""The experiments' presets, shipped as package data in ``longsparse_experiments/configs``:

    configs/reproduce/<study>.toml    the studies of ``longsparse reproduce`` (``<study>-quick.toml``: --quick)
    configs/lm/<preset>.toml          the LM study's presets (``longsparse lm run --preset``)

The task presets every run starts from are the library's (``longsparse.train.configs_dir``).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def presets_dir() -> Path:
    """The folder of the experiments' presets. A folder on disk: the wheel installs unzipped, so
    ``importlib.resources`` resolves it to a real path."""
    return Path(str(resources.files("longsparse_experiments") / "configs"))


def available_presets() -> dict[str, list[str]]:
    """{kind ("lm", "reproduce"): sorted preset names}."""
    root = presets_dir()
    return {
        d.name: sorted(f.stem for f in d.glob("*.toml"))
        for d in sorted(p for p in root.iterdir() if p.is_dir())
        if any(d.glob("*.toml"))
    }
