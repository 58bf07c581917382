"""Config overrides as tables: ``build_config(overrides=...)`` against its oracle, the ``--set`` strings it
replaces (same resolved config, precedence, architecture selection, bad input), and the study files: every cell
of every study file in the package, the demo's runs and the figures' runs resolve to the config hashes recorded
in tests/data/study_cell_hashes.json, and a study file in the older ``sets`` form reads as the same tables.

Regenerate the recorded hashes only when a recipe changes on purpose:
``PYTHONPATH=tests python tests/experiments/test_study_overrides.py``."""

import json
import sys
from pathlib import Path

import pytest
from helpers.paths import DATA

from longsparse.train import ConfigError, build_config
from longsparse.train.config import config_hash, resolve
from longsparse_experiments.study import load_study

RECORDED = DATA / "study_cell_hashes.json"


def current_hashes() -> dict:
    """{"studies": {file: {cell run: config hash}}, "demo": {...}, "figures": {...}} as the code resolves them
    now."""
    from longsparse_experiments import demo
    from longsparse_experiments.figures.context import default_run_configs
    from longsparse_experiments.presets import presets_dir

    out: dict = {"studies": {}, "demo": {}, "figures": {}}
    for f in sorted((presets_dir() / "reproduce").glob("*.toml")):
        spec = load_study(path=str(f))
        out["studies"][f.name] = {
            c.run: config_hash(resolve(s.cell_config(c))) for s in spec.studies for c in s.cells()
        }
    for quick in (False, True):
        scale = "quick" if quick else "full"
        for seed in (0, 1):
            for (method, positions), cfg in demo.run_configs(quick, seed).items():
                out["demo"][f"{scale}/seed{seed}/{method}-{positions}"] = config_hash(cfg)
        for name, cfg in default_run_configs(quick).items():
            out["figures"][f"{scale}/{name}"] = config_hash(cfg)
    return out


def test_every_study_cell_demo_and_figure_run_keeps_its_config():
    recorded = json.loads(RECORDED.read_text())
    now = current_hashes()
    assert sum(len(v) for v in recorded["studies"].values()) > 200 and recorded["demo"] and recorded["figures"]
    for part in ("studies", "demo", "figures"):
        assert now[part] == recorded[part], part


def test_the_preregistered_study_file_stays_as_registered_and_reads_nested():
    """prereg_mqmtar.toml (the older ``sets`` form) is byte for byte the registered file; it is read through the
    one converter (``longsparse.migrate.read_study_sets``) into today's nested configs, whose hashes are the
    recorded ones (test above)."""
    import hashlib

    from longsparse_experiments.presets import presets_dir

    path = presets_dir() / "reproduce" / "prereg_mqmtar.toml"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == (
        "2ac0b857a5073a9bb5fd1465c090f7eb46a3566004e46495d7f23784de970a5a"
    )
    recorded = json.loads(RECORDED.read_text())["studies"]["prereg_mqmtar.toml"]
    spec = load_study(path=str(path))
    for s in spec.studies:
        for c in s.cells():
            cfg = resolve(s.cell_config(c))
            assert cfg["model"]["attention"]["method"] == c.method and "method" not in cfg["model"]
            assert config_hash(cfg) == recorded[c.run]


def test_a_flat_attention_key_in_a_study_override_is_refused_naming_the_new_key(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text(STUDY.format(defaults="", a="overrides = { model.alpha = 1.3 }", b=""))
    with pytest.raises(ConfigError, match=r"study #1: overrides: model.alpha is now model.attention.alpha"):
        load_study(path=str(p))


SETS = [
    "model.d_model=32",
    "model.d_ff=64",
    "train.lr=2e-3",
    "train.val_lengths=[32, 64]",
    "task.params.num_symbols=16",
]
OVERRIDES = {
    "model": {"d_model": 32, "d_ff": 64},
    "train": {"lr": 2e-3, "val_lengths": [32, 64]},
    "task": {"params": {"num_symbols": 16}},
}


def test_overrides_resolve_as_the_same_sets_do():
    assert build_config("copy", method="entmax", overrides=OVERRIDES) == build_config(
        "copy", method="entmax", sets=SETS
    )


def test_order_file_then_method_table_then_overrides_then_sets_then_flags(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(
        '[task]\nname = "copy"\n[model]\nd_model = 32\n[model.attention]\nmethod = "softmax"\n'
        "[methods.entmax.model]\nd_model = 48\n"
    )

    def d_model(**kw):
        return build_config("copy", config_file=str(p), method="entmax", **kw)["model"]["d_model"]

    assert d_model() == 48
    assert d_model(overrides={"model": {"d_model": 40}}) == 40
    assert d_model(overrides={"model": {"d_model": 40}}, sets=["model.d_model=56"]) == 56
    cfg = build_config("copy", overrides={"train": {"lr": 2e-3, "steps": 50, "seed": 3}}, seed=7)
    assert cfg["train"]["lr"] == 2e-3 and cfg["train"]["steps"] == 50 and cfg["train"]["seed"] == 7
    assert build_config("copy", overrides={"train": {"steps": 50}}, steps=9)["train"]["steps"] == 9


def test_arch_in_overrides_selects_the_architecture_table():
    by_flag = build_config("passkey", arch="hsa", steps=2)
    assert by_flag["model"]["arch"] == "hsa"
    assert build_config("passkey", overrides={"model": {"arch": "hsa"}}, steps=2) == by_flag
    assert build_config("passkey", sets=["model.arch=hsa"], steps=2) == by_flag
    # the later of the two (the --set) chooses the table
    assert (
        "arch"
        not in build_config("passkey", overrides={"model": {"arch": "hsa"}}, sets=["model.arch=transformer"], steps=2)[
            "model"
        ]
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"optim": {"lr": 1}}, r"override section must be one of task, model, train.*'optim'"),
        ({"model": 64}, r"override model must be a table .* got 64"),
        ({"train": {"lr": {"peak": 1e-3}}}, r"override train\.lr is a table, but the config's train\.lr is not one"),
        ({"task": {"params": {"num_symbolz": 3}}}, r"has no parameter"),
        ({"train": {"lr": -1.0}}, r"train\.lr must be a number > 0"),
        ({"task": {"name": "sort"}}, r"an override sets task\.name='sort'"),
        (["model.d_model=64"], r"overrides must be a table of the sections"),
        ({"task": {"params": 5}}, r"task\.params must be a table of task parameters, got 5"),
    ],
)
def test_bad_overrides_are_refused_with_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        build_config("copy", overrides=overrides)
    assert "\n" not in str(e.value)


def test_a_value_where_the_config_has_a_table_is_refused(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[task]\nname = "copy"\n[task.params]\nnum_symbols = 8\n[model.attention]\nmethod = "softmax"\n')
    with pytest.raises(ConfigError, match=r"override task\.params must be a table \(task\.params is one\), got 3"):
        build_config("copy", config_file=str(p), overrides={"task": {"params": 3}})


STUDY = """[defaults]
preset = "cpu"
positions = ["nape"]
seeds = [0]
lengths = [64]
samples = 2
{defaults}

[[study]]
name = "a"
task = "copy"
methods = ["softmax", "asentmax"]
{a}

[[study]]
name = "b"
like = "a"
{b}
"""
NEW = STUDY.format(
    defaults="[defaults.overrides]\nmodel.d_model = 32\ntrain.steps = 3",
    a="[study.overrides]\ntrain.steps = 5\ntrain.lr = 2e-3\nmodel.d_ff = 64\n"
    '[study.method_overrides.asentmax]\nmodel.attention.asentmax_init = "reference"',
    b="more_overrides = { train.lr = 4e-3, model.n_layers = 3 }",
)
OLD = STUDY.format(
    defaults='sets = ["model.d_model=32", "train.steps=3"]',
    a='sets = ["train.steps=5", "train.lr=2e-3", "model.d_ff=64"]\n'
    'method_sets = { asentmax = ["model.asentmax_init=\\"reference\\""] }',
    b='more_sets = ["train.lr=4e-3", "model.n_layers=3"]',
)


def _configs(path: Path) -> dict:
    return {c.run: s.cell_config(c) for s in load_study(path=str(path)).studies for c in s.cells()}


def test_study_tables_and_the_older_sets_form_give_the_same_cells(tmp_path):
    (tmp_path / "new.toml").write_text(NEW)
    (tmp_path / "old.toml").write_text(OLD)
    new, old = _configs(tmp_path / "new.toml"), _configs(tmp_path / "old.toml")
    assert new == old and len(new) == 4
    a_soft, a_as, b_as = new["a/softmax-nape-s0"], new["a/asentmax-nape-s0"], new["b/asentmax-nape-s0"]
    # the study's table replaces the defaults' (as a study's own key does), the method's table adds to it
    assert a_soft["model"]["d_model"] != 32 and a_soft["train"]["steps"] == 5 and a_soft["model"]["d_ff"] == 64
    assert a_as["model"]["attention"]["asentmax_init"] == "reference" != a_soft["model"]["attention"]["asentmax_init"]
    # more_overrides merges over the inherited table: the later setting of a key wins, the rest is kept
    assert b_as["train"]["lr"] == 4e-3 and b_as["model"]["n_layers"] == 3 and b_as["train"]["steps"] == 5
    assert b_as["model"]["attention"]["asentmax_init"] == "reference"
    assert new["b/softmax-nape-s0"] == build_config(
        "copy",
        method="softmax",
        positions="nape",
        seed=0,
        sets=["train.steps=5", "train.lr=2e-3", "model.d_ff=64", "train.lr=4e-3", "model.n_layers=3"],
    )


@pytest.mark.parametrize(
    "body, message",
    [
        ("[study.overrides]\noptim.lr = 1", r"study #1: overrides: override section must be one of"),
        ("overrides = 3", r"study #1: overrides must be a table"),
        ("method_overrides = { asentmax = 3 }", r"study #1: method_overrides\.asentmax must be a table"),
        (
            'sets = ["train.lr=1"]\n[study.overrides]\ntrain.lr = 2',
            r"gives both sets and overrides; give overrides alone",
        ),
        ('sets = "train.lr=1"', r"sets must be a list of section\.key=value strings"),
        ('sets = ["lr=1"]', r"study #1: --set key must start with one of task, model, train"),
    ],
)
def test_bad_study_overrides_are_refused(tmp_path, body, message):
    p = tmp_path / "s.toml"
    p.write_text(
        '[[study]]\nname = "a"\ntask = "copy"\nmethods = ["softmax"]\npositions = ["nape"]\nseeds = [0]\n'
        f"lengths = [64]\nsamples = 2\n{body}\n"
    )
    with pytest.raises(ConfigError, match=message):
        load_study(path=str(p))


if __name__ == "__main__":
    RECORDED.write_text(json.dumps(current_hashes(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {RECORDED}", file=sys.stderr)
