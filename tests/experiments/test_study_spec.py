"""The typed study spec (longsparse_experiments.study): defaults, cells, --only selection and bad values."""

from __future__ import annotations

import dataclasses

import pytest

from longsparse.train.config import ConfigError
from longsparse_experiments.study import CHECKPOINTS, Cell, Study, StudyFile, load_study

MINIMAL = (
    '[[study]]\nname = "a"\ntask = "copy"\nmethods = ["softmax", "asentmax"]\npositions = ["nape", "rope"]\n'
    "seeds = [3, 1]\nlengths = [64, 128, 256]\nsamples = 5\n"
)


def _load(tmp_path, text: str) -> StudyFile:
    p = tmp_path / "s.toml"
    p.write_text(text)
    return load_study(path=str(p))


def test_defaults_are_filled_and_the_spec_is_frozen(tmp_path):
    spec = _load(tmp_path, MINIMAL)
    (s,) = spec.studies
    assert isinstance(spec, StudyFile) and isinstance(s, Study) and spec.path == str(tmp_path / "s.toml")
    assert (s.preset, s.description, s.checkpoints, s.test_seed) == ("cpu", "", CHECKPOINTS, 0)
    assert (s.id_samples, s.long_samples, s.long_from) == (5, 5, 257)  # no length is "long" by default
    assert s.methods == ("softmax", "asentmax") and s.seeds == (3, 1) and s.lengths == (64, 128, 256)
    assert [s.samples_for(L) for L in s.lengths] == [5, 5, 5]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.samples = 7


def test_sample_counts_by_length(tmp_path):
    (s,) = _load(tmp_path, MINIMAL + "id_samples = 100\nlong_from = 256\nlong_samples = 2\n").studies
    assert [s.samples_for(L) for L in s.lengths] == [100, 5, 2]


def test_cells_are_seed_major_with_the_method_overrides_merged(tmp_path):
    text = MINIMAL + (
        "[study.overrides]\ntrain.steps = 7\nmodel.d_model = 32\n[study.method_overrides.asentmax]\ntrain.steps = 9\n"
    )
    (s,) = _load(tmp_path, text).studies
    cells = s.cells()
    assert all(isinstance(c, Cell) for c in cells)
    assert [(c.seed, c.method, c.positions) for c in cells[:4]] == [
        (3, "softmax", "nape"),
        (3, "softmax", "rope"),
        (3, "asentmax", "nape"),
        (3, "asentmax", "rope"),
    ]
    assert len(cells) == 8 and cells[0].run == "a/softmax-nape-s3"
    by = {c.run: c for c in cells}
    assert by["a/softmax-nape-s1"].overrides == {"train": {"steps": 7}, "model": {"d_model": 32}}
    assert by["a/asentmax-rope-s1"].overrides == {"train": {"steps": 9}, "model": {"d_model": 32}}
    cfg = s.cell_config(by["a/asentmax-rope-s1"])
    assert cfg["train"]["steps"] == 9 and cfg["model"]["d_model"] == 32 and cfg["train"]["seed"] == 1
    assert (cfg["model"]["attention"]["method"], cfg["model"]["attention"]["positions"]) == ("asentmax", "rope")


def test_like_and_defaults(tmp_path):
    text = (
        '[defaults]\npositions = ["nape"]\nseeds = [0]\nsamples = 4\n'
        '[[study]]\nname = "a"\ntask = "copy"\nmethods = ["softmax"]\nlengths = [64, 128]\ndescription = "first"\n'
        "[study.overrides]\ntrain.steps = 3\n"
        '[[study]]\nname = "b"\nlike = "a"\nmore_overrides = { train.lr = 1e-3 }\n'
    )
    a, b = _load(tmp_path, text).studies
    assert (b.task, b.methods, b.lengths, b.samples) == (a.task, a.methods, a.lengths, a.samples)
    assert b.description == "" and b.overrides == {"train": {"steps": 3, "lr": 1e-3}}
    assert a.overrides == {"train": {"steps": 3}}  # the variant does not change the study it copies


def test_select(tmp_path):
    text = MINIMAL + MINIMAL.replace('name = "a"', 'name = "b"').replace('"copy"', '"sort"')
    spec = _load(tmp_path, text)
    assert spec.select(None) is spec and spec.select([]) is spec
    assert [s.name for s in spec.select(["b"]).studies] == ["b"]
    assert [s.name for s in spec.select(["copy"]).studies] == ["a"]  # a task picks its studies
    with pytest.raises(ConfigError, match=r"--only: unknown \['nope'\]"):
        spec.select(["nope", "a"])


@pytest.mark.parametrize(
    "change, message",
    [
        (('methods = ["softmax", "asentmax"]', 'methods = "softmax"'), "methods must be a non-empty list"),
        (("seeds = [3, 1]", "seeds = []"), "seeds must be a non-empty list"),
        (("seeds = [3, 1]", "seeds = [3, 3]"), "seeds must be distinct"),
        (("seeds = [3, 1]", "seeds = [0.5]"), "seeds must be integers"),
        (("lengths = [64, 128, 256]", "lengths = [64, true]"), "lengths must be integers"),
        (('name = "a"', 'name = "a/b"'), "name must be"),
        (('name = "a"', 'name = ".."'), "name must be a folder name"),
        (('name = "a"', 'name = "."'), "name must be a folder name"),
        (('name = "a"', 'name = "a\\\\b"'), "name must be a folder name"),
        (('methods = ["softmax", "asentmax"]', 'methods = ["softmax", "softmax"]'), "methods must be distinct"),
        (('positions = ["nape", "rope"]', 'positions = ["rope", "rope"]'), "positions must be distinct"),
        (("samples = 5", 'samples = 5\ncheckpoints = ["last", "last"]'), "checkpoints must be distinct"),
        (('task = "copy"', "task = 3"), "task must be a string"),
        (("samples = 5", "samples = 0"), "samples must be an integer >= 1"),
        (("samples = 5", "samples = 5\nlong_from = 0"), "long_from must be"),
        (("samples = 5", "samples = 5\ncheckpoints = []"), "checkpoints must be a non-empty list"),
    ],
)
def test_bad_values_fail_in_one_line_naming_the_study(tmp_path, change, message):
    old, new = change
    assert old in MINIMAL
    with pytest.raises(ConfigError, match=message) as e:
        _load(tmp_path, MINIMAL.replace(old, new))
    assert "\n" not in str(e.value) and "s.toml" in str(e.value)


def test_study_names_are_unique(tmp_path):
    with pytest.raises(ConfigError, match="unique"):
        _load(tmp_path, MINIMAL + MINIMAL)
