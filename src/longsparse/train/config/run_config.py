"""``RunConfig``: a resolved run config, typed (``TaskSpec``, the architecture's config object, ``TrainConfig``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from longsparse.models import config_section, model_config
from longsparse.train.config.identity import SCHEMA_VERSION, config_hash
from longsparse.train.config.resolve import make_task, resolve
from longsparse.train.config.training import TrainConfig


@dataclass(frozen=True)
class TaskSpec:
    """The ``task`` section of a run config: a task by name, preset and parameters (``longsparse.tasks``)."""

    name: str
    preset: Optional[str] = None
    params: Optional[Mapping] = None

    def build(self):
        """The task object (``make_task``)."""
        return make_task(self.as_dict())

    def as_dict(self) -> dict:
        return {"name": self.name, "preset": self.preset, "params": dict(self.params or {})}


@dataclass(frozen=True)
class RunConfig:
    """A resolved run config, typed: what the trainer trains.

    ``model`` is the architecture's config object (``ModelConfig`` or ``HSAConfig``, its ``vocab_size`` the
    task's); ``as_dict()`` is the JSON form stored as ``config.json`` (``schema_version``, ``model`` without
    ``vocab_size``, ``arch`` named only when not the default), whose ``config_hash`` identifies the run.
    ``legacy_hash``: the hash the config had before ``longsparse migrate`` rewrote it (None: not migrated)."""

    task: TaskSpec
    model: Any
    train: TrainConfig
    legacy_hash: Optional[str] = None

    @classmethod
    def from_dict(cls, cfg: Mapping) -> "RunConfig":
        """Resolve (defaults, validation: ``ConfigError``) a raw or resolved run config dict."""
        r = resolve(cfg)
        task = TaskSpec(**r["task"])
        vocab = task.build().vocab_size
        return cls(task, model_config(r["model"], vocab), TrainConfig(**r["train"]), r.get("legacy_hash"))

    def as_dict(self) -> dict:
        model = config_section(self.model)
        del model["vocab_size"]
        legacy = {} if self.legacy_hash is None else {"legacy_hash": self.legacy_hash}
        out = {"task": self.task.as_dict(), "model": model, "train": self.train.as_dict()}
        return {"schema_version": SCHEMA_VERSION, **out, **legacy}

    @property
    def hash(self) -> str:
        return config_hash(self.as_dict())
