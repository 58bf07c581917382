"""Training: run configs (TOML presets + overrides), run directories, the training loop with exact resume
and data parallelism under torchrun. See ``loop`` and ``rundir`` for the details."""
from longsparse.train.config import (SCALES, TRAIN_DEFAULTS, ConfigError, available_presets, build_config,
                                     config_diff, config_hash, configs_dir, make_task, resolve)
from longsparse.train.loop import lr_at, train
from longsparse.train.rundir import (RunDirError, check_run_dir, checkpoint_path, environment, new_result_path,
                                     read_config)

__all__ = ["train", "lr_at", "build_config", "resolve", "make_task", "ConfigError", "RunDirError", "TRAIN_DEFAULTS",
           "SCALES", "available_presets", "configs_dir", "config_hash", "config_diff", "check_run_dir",
           "checkpoint_path", "environment", "new_result_path", "read_config"]
