"""Training: run configs (TOML presets + overrides; ``RunConfig``, the typed form), run directories, the one
training loop for every task (its loss from the task's labels, its validation from the task's objective) with
exact resume and data parallelism under torchrun. See ``loop``, ``objectives`` and ``rundir`` for the details."""

from longsparse.train.config import (
    SCALES,
    TRAIN_DEFAULTS,
    ConfigError,
    RunConfig,
    TaskSpec,
    TrainConfig,
    available_presets,
    build_config,
    config_diff,
    config_hash,
    configs_dir,
    make_task,
    resolve,
)
from longsparse.train.loop import lr_at, train
from longsparse.train.rundir import (
    RunDirError,
    check_run_dir,
    checkpoint_path,
    environment,
    new_result_path,
    read_config,
)

__all__ = [
    "train",
    "lr_at",
    "build_config",
    "resolve",
    "make_task",
    "ConfigError",
    "RunDirError",
    "TRAIN_DEFAULTS",
    "RunConfig",
    "TaskSpec",
    "TrainConfig",
    "SCALES",
    "available_presets",
    "configs_dir",
    "config_hash",
    "config_diff",
    "check_run_dir",
    "checkpoint_path",
    "environment",
    "new_result_path",
    "read_config",
]
