"""Training: run configs (TOML presets + overrides; ``RunConfig``, the typed form; ``config``), run directories
(``rundir``), the one trainer for every task (``Trainer`` in ``loop``: its loss from the task's labels, its
validation from the task's objective, ``objectives``) with exact resume (``TrainState``, ``state``) and data
parallelism under torchrun (``distributed``, ``fsdp``). ``train`` is the entry point."""

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
from longsparse.train.loop import Trainer, lr_at, train
from longsparse.train.rundir import (
    RunDirError,
    check_run_dir,
    checkpoint_path,
    environment,
    new_result_path,
    read_config,
)
from longsparse.train.state import TrainState

__all__ = [
    "train",
    "Trainer",
    "TrainState",
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
