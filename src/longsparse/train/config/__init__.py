"""Run configuration: TOML presets shipped in the package (``longsparse/configs/``), ``--set key=value`` overrides,
validation. One module per concern: ``training`` (``TrainConfig``, the ``train`` section, validating itself),
``presets`` (preset files, TOML), ``build`` (preset + overrides + flags: ``build_config``), ``resolve`` (defaults and
validation of every section, the task and model a config names), ``identity`` (``config_hash``, the schema
version) and ``run_config`` (``RunConfig``, the typed form).

A *resolved* run config is a plain dict with its schema version and three sections, stored as ``config.json`` in
the run directory (``RunConfig`` is the same config typed: ``RunConfig.from_dict(cfg)``, ``run.as_dict()``):

    {"schema_version": 3,                                                # SCHEMA_VERSION; not part of the hash
     "task":  {"name": "copy", "preset": "cpu", "params": {...}},        # longsparse.tasks.get_task
     "model": {"d_model": 128, ...,                                      # the model's config minus vocab_size,
               "attention": {"method": "asentmax", "positions": "nape", ...}},   # its AttentionSettings
     "train": {"steps": 800, "batch_size": 32, "lr": 1e-3, ...}}          # TRAIN_DEFAULTS

Preset files live in ``src/longsparse/configs/<task>/<preset>.toml`` (package data, so a wheel install has them;
``$LONGSPARSE_CONFIGS`` names another folder of the same layout). Besides the three sections a
file may hold ``[methods.<method>.<section>]`` and ``[positions.<positions>.<section>]`` tables, merged (in that
order) when the run uses that method / positions, so one file covers task × method × positions at one scale.
Then the overrides apply: code and study files give a nested table (``build_config(overrides={"model":
{"d_model": 64}})``, in TOML ``model.d_model = 64``), the command line ``--set section.key=value`` strings (value
parsed as a TOML value, else taken as a string), which win; last the explicit flags (``--method``,
``--positions``: ``model.attention.method`` / ``.positions``; ``--seed``, ``--steps``).

Architectures. ``model.arch`` names the model (``longsparse.models``: ``transformer``, the default, or ``hsa``);
the model section holds that architecture's config fields (``ModelConfig`` / ``HSAConfig`` minus ``vocab_size``).
Every architecture has the table ``attention`` (``longsparse.nn.AttentionSettings``: ``method``, the attention
mapping and its length scaler, ``positions``, α, ...; a preset's ``[model.attention]``, ``--set
model.attention.alpha=1.3``; ``attention_of(cfg)`` reads it); a setting given flat (``model.alpha``) is refused
naming its key. A file's
``[model]`` table is the model of its own architecture (its ``arch`` key, default transformer); a table named
after another architecture (``[hsa]``) is the model section of a run that asks for that one (``--arch hsa`` or
``--set model.arch=hsa``), so one file holds the decoder baselines and the HSA model of a task. The resolved
section names ``arch`` only when it is not the default: transformer run configs, and so their identities, read
as they did before architectures had names.

Run configs written in an older form (an older ``schema_version``, or none in a stored config.json of older code)
are rewritten once by ``longsparse migrate`` (``longsparse.migrate``), which keeps the hash they had as
``legacy_hash``; ``resolve`` reads the current form only.
"""

from longsparse.train.config.build import apply_overrides, apply_sets, build_config, deep_merge
from longsparse.train.config.errors import ConfigError
from longsparse.train.config.identity import (
    FORM_KEYS,
    NOT_IDENTITY,
    SCHEMA_VERSION,
    config_diff,
    config_hash,
    run_identity,
)
from longsparse.train.config.presets import (
    SCALES,
    available_presets,
    configs_dir,
    load_toml,
    parse_value,
    preset_path,
    task_name,
)
from longsparse.train.config.resolve import (
    SECTIONS,
    attention_of,
    build_model,
    check_nested_attention,
    make_task,
    resolve,
    run_label,
)
from longsparse.train.config.run_config import RunConfig, TaskSpec
from longsparse.train.config.training import PARALLEL, TRAIN_DEFAULTS, TrainConfig

__all__ = [
    "ConfigError",
    "TrainConfig",
    "TRAIN_DEFAULTS",
    "PARALLEL",
    "SECTIONS",
    "SCALES",
    "RunConfig",
    "TaskSpec",
    "build_config",
    "apply_overrides",
    "apply_sets",
    "deep_merge",
    "resolve",
    "make_task",
    "build_model",
    "run_label",
    "attention_of",
    "check_nested_attention",
    "configs_dir",
    "available_presets",
    "load_toml",
    "parse_value",
    "preset_path",
    "task_name",
    "NOT_IDENTITY",
    "run_identity",
    "config_hash",
    "config_diff",
    "SCHEMA_VERSION",
    "FORM_KEYS",
]
