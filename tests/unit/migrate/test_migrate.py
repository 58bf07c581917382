"""`longsparse migrate` (longsparse.migrate) and the schema version of run configs: a run config of older code is
rewritten once in today's form with the hash it had kept as ``legacy_hash`` (tests/data/hsa_legacy: the config as
older code wrote it, config_schema1.json, and its checkpoint, which recorded that hash); a file in the current
form is left byte-identical; stores, archives and reports are read and checked; a report folder of older code gets
its markers; bad input stops the command in one line with nothing written. ``resolve`` reads the current schema
and refuses another, naming the command."""

from __future__ import annotations

import json
import shutil
import struct
import zlib

import pytest
from helpers.paths import DATA, REPO_ROOT

from longsparse.cli import main
from longsparse.migrate import MigrateError, convert_file, migrate, migrate_run_config
from longsparse.models import read_checkpoint
from longsparse.report import PNG_KEY, PNG_VALUE, png_text
from longsparse.train import ConfigError, build_config, resolve
from longsparse.train.config import SCHEMA_VERSION, RunConfig, config_hash, run_identity
from longsparse.train.rundir import RunDirError, check_run_dir

LEGACY = DATA / "hsa_legacy"
ROOT = REPO_ROOT
ARCHIVE = ROOT / "results" / "matched_convergence" / "results.json"  # a study archive of `longsparse reproduce`
STORE = ROOT / "results" / "mqmtar256x_26" / "records.jsonl"
pytestmark = pytest.mark.usefixtures("one_thread")


def _small() -> dict:
    return build_config("copy", method="entmax", positions="nape", steps=2)


def _err_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


# ---------------------------------------------------------------------------------------- the schema version
def test_resolved_configs_carry_the_schema_version_outside_their_hash():
    cfg = _small()
    assert cfg["schema_version"] == SCHEMA_VERSION
    bare = {k: v for k, v in cfg.items() if k != "schema_version"}
    assert resolve(bare) == cfg  # a config without a version (written by hand or in code) is in today's form
    assert config_hash(bare) == config_hash(cfg) and "schema_version" not in run_identity(cfg)
    tagged = {**cfg, "legacy_hash": "0123456789abcdef"}
    assert resolve(tagged)["legacy_hash"] == "0123456789abcdef" and config_hash(tagged) == config_hash(cfg)
    run = RunConfig.from_dict(tagged)
    assert run.legacy_hash == "0123456789abcdef" and run.as_dict() == resolve(tagged) and run.hash == config_hash(cfg)
    assert RunConfig.from_dict(cfg).as_dict() == cfg


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"schema_version": 1},
            r"schema_version 1; this longsparse reads 2: rewrite the file once with `longsparse migrate",
        ),
        ({"schema_version": 3}, r"schema_version 3, newer than this longsparse reads \(2\)"),
        ({"schema_version": "2"}, r"schema_version must be an integer, got '2'"),
        ({"legacy_hash": "xyz"}, r"legacy_hash must be a 16-digit hex config hash, got 'xyz'"),
        ({"extra": {}}, r"unknown config section\(s\) \['extra'\]"),
    ],
)
def test_resolve_refuses_another_schema_in_one_line(change, message):
    with pytest.raises(ConfigError, match=message):
        resolve({**_small(), **change})


def test_a_run_folder_of_an_older_schema_is_refused_naming_the_command(tmp_path):
    cfg = _small()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({**cfg, "schema_version": 1}))
    with pytest.raises(RunDirError, match=r"schema_version 1; .* `longsparse migrate .*config.json`; nothing"):
        check_run_dir(run, cfg)
    # a folder of code before versions (no schema_version) with the same identity resumes
    (run / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "schema_version"}))
    assert check_run_dir(run, cfg) == "resume"


# ------------------------------------------------------------------------------------------------ run configs
def test_an_hsa_config_of_older_code_is_rewritten_with_the_hash_it_had(tmp_path):
    old = json.loads((LEGACY / "config_schema1.json").read_text())
    assert (old["model"]["method"], old["model"]["positions"]) == ("hsa", "hsa") and "schema_version" not in old
    new = migrate_run_config(old)
    m = new["model"]
    assert new["schema_version"] == SCHEMA_VERSION
    assert (m["arch"], m["method"], m["positions"]) == ("hsa", "softmax", "rope")  # the attention HSA then had
    # the hash it had is the one its checkpoint recorded; its hash now is another one
    recorded = read_checkpoint(str(LEGACY / "run" / "checkpoints" / "last.pt"))["extra"]["config_hash"]
    assert new["legacy_hash"] == config_hash(old) == recorded != config_hash(new)
    assert run_identity(resolve(new)) == run_identity(new) and migrate_run_config(new) == new  # a fixed point
    assert all(new[s][k] == v for s in ("task", "train") for k, v in old[s].items())  # as they were
    with pytest.raises(ConfigError, match="`longsparse migrate FILE` rewrites it"):
        resolve(old)  # only the migration reads the older form
    # the file as the command writes it; a second run leaves it byte-identical
    path = tmp_path / "config.json"
    shutil.copy(LEGACY / "config_schema1.json", path)
    assert main(["migrate", str(path)]) == 0
    written = path.read_bytes()
    assert json.loads(written) == new and written == (json.dumps(new, indent=2, sort_keys=True) + "\n").encode()
    assert main(["migrate", str(path)]) == 0 and path.read_bytes() == written
    assert convert_file(path) == {}


def test_a_config_in_todays_form_without_a_version_gets_only_the_version(tmp_path):
    cfg = _small()
    path = tmp_path / "run" / "config.json"
    path.parent.mkdir()
    bare = {k: v for k, v in run_identity(cfg).items()}
    path.write_text(json.dumps(bare, indent=2, sort_keys=True) + "\n")
    changes = migrate([tmp_path])
    assert list(changes) == [path]
    got = json.loads(path.read_text())
    assert got == {**bare, "schema_version": SCHEMA_VERSION} and "legacy_hash" not in got
    assert migrate([tmp_path]) == {}


# ------------------------------------------------------------------------------------- stores, archives, reports
def test_stores_and_archives_are_read_and_left_byte_identical(tmp_path, capsys):
    folder = tmp_path / "results"
    (folder / "study").mkdir(parents=True)
    (folder / "store").mkdir()
    shutil.copy(ARCHIVE, folder / "study" / "results.json")
    shutil.copy(STORE, folder / "store" / "records.jsonl")
    (folder / "study" / "notes.txt").write_text("not looked at\n")
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert main(["migrate", str(folder), str(folder / "study" / "results.json")]) == 0
    out = capsys.readouterr().out
    assert "3 file(s) read; rewrote 0" in out
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


# ------------------------------------------------------------------------------------------------ checkpoints
def test_a_sharded_checkpoints_state_of_older_code_is_upgraded_once_and_the_legacy_run_with_it(tmp_path):
    """extra.pt of a sharded checkpoint without the keys added since gets them; today's layout is left as it is;
    a state missing a key no layout lacked, or with an unknown key, stops the command with nothing written.
    (tests/unit/train: a last.pt of older code, refused by the trainer, migrated, resumes bit for bit.)"""
    import torch

    from longsparse.migrate import ADDED_KEYS
    from longsparse.train.state import RECORD_KEYS, STATE_KEYS, split_extra

    legacy = read_checkpoint(str(LEGACY / "run" / "checkpoints" / "last.pt"))["extra"]  # older code's layout
    assert set(ADDED_KEYS) == set(STATE_KEYS) - set(legacy)
    with pytest.raises(ValueError, match=r"`longsparse migrate here` rewrites it once"):
        split_extra(legacy, "here")
    extra = tmp_path / "checkpoints" / "last-3.dcp" / "extra.pt"
    extra.parent.mkdir(parents=True)
    torch.save(legacy, extra)
    assert main(["migrate", str(tmp_path)]) == 0
    new = torch.load(extra, weights_only=True)
    assert set(new) == {*STATE_KEYS, *RECORD_KEYS} and (new["train_seconds"], new["cuda_rng"]) == (0.0, None)
    assert all(new[k] == v for k, v in legacy.items() if k != "torch_rng") and torch.equal(
        new["torch_rng"], legacy["torch_rng"]
    )
    split_extra(new, "here")  # today's layout
    written = extra.read_bytes()
    assert migrate([tmp_path]) == {} and extra.read_bytes() == written
    # the committed run folder of older code, copied: its checkpoint is upgraded with its weights as they were
    run = tmp_path / "legacy"
    shutil.copytree(LEGACY / "run", run)
    last = run / "checkpoints" / "last.pt"
    assert list(migrate([run])) == [last]
    old, got = read_checkpoint(str(LEGACY / "run" / "checkpoints" / "last.pt")), read_checkpoint(str(last))
    assert all(torch.equal(got["model"][k], w) for k, w in old["model"].items()) and got["config"] == old["config"]
    assert got["extra"]["config_hash"] == legacy["config_hash"]  # the hash its config had, kept
    for bad in ({**legacy, "momentum": 1}, {k: v for k, v in legacy.items() if k != "best"}):
        torch.save(bad, extra)
        before = extra.read_bytes()
        with pytest.raises(MigrateError, match=r"extra.pt: (missing|unknown) key.*not a layout longsparse migrate"):
            migrate([tmp_path])
        assert extra.read_bytes() == before


def _png(chunks: list[tuple[bytes, bytes]]) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return b"\x89PNG\r\n\x1a\n" + b"".join(chunk(k, b) for k, b in chunks)


def _chunks_valid(data: bytes) -> list[bytes]:
    kinds, i = [], 8
    while i < len(data):
        (n,) = struct.unpack(">I", data[i : i + 4])
        kind, body = data[i + 4 : i + 8], data[i + 8 : i + 8 + n]
        assert struct.unpack(">I", data[i + 8 + n : i + 12 + n])[0] == zlib.crc32(kind + body), kind
        kinds.append(kind)
        i += 12 + n
    return kinds


def test_a_report_folder_of_older_code_gets_its_markers(tmp_path):
    from longsparse.report import MD_MARKER

    out = tmp_path / "report"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"format": "longsparse-report", "version": 1, "series": []}))
    table = "### copy: exact match % [95% Wilson interval], n = 10 per cell\n| L | x |\n"
    (out / "results.md").write_text(table)
    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    png = _png(
        [
            (b"IHDR", ihdr),
            (b"tEXt", b"Software\0Matplotlib version3"),
            (b"IDAT", zlib.compress(b"\0\0")),
            (b"IEND", b""),
        ]
    )
    (out / "accuracy_vs_length.png").write_bytes(png)
    assert sorted(migrate([out])) == [out / "accuracy_vs_length.png", out / "results.md"]
    assert (out / "results.md").read_text() == MD_MARKER + "\n" + table
    new_png = (out / "accuracy_vs_length.png").read_bytes()
    assert _chunks_valid(new_png) == [b"IHDR", b"tEXt", b"tEXt", b"IDAT", b"IEND"]
    meta = png_text(out / "accuracy_vs_length.png")
    assert meta[PNG_KEY] == PNG_VALUE and meta["Software"] == "Matplotlib version3"
    assert new_png.replace(new_png[33 : 33 + 12 + len(b"longsparse\0report")], b"") == png  # nothing else changed
    assert migrate([out]) == {}  # idempotent
    # a hand-written results.md (no table heading) and a foreign PNG get no marker
    (out / "results.md").write_text("my notes\n")
    (out / "accuracy_vs_length.png").write_bytes(_png([(b"IHDR", ihdr), (b"IEND", b"")]))
    assert migrate([out]) == {}


# ------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "name, content, message",
    [
        ("results.json", "{not json", r"results.json: not readable JSON"),
        ("config.json", json.dumps({"task": {}, "model": {}, "schema_version": 7}), r"unknown schema_version 7"),
        (
            "config.json",
            json.dumps({"format": "longsparse-eval"}),
            r"format 'longsparse-eval', which longsparse migrate",
        ),
        ("config.json", json.dumps([1, 2]), r"config.json: not a run config"),
        ("records.jsonl", '{"format": "longsparse-record"}\n', r"records.jsonl: record 1: record lacks"),
        ("study.toml", "[[study]]\n", r"study.toml: not a file longsparse migrate knows"),
        ("last.pt", "not a zip", r"last.pt: not a readable checkpoint"),
        ("extra.pt", "not a zip", r"extra.pt: not a readable checkpoint"),
        (
            "config.json",
            json.dumps({"task": {"name": "copy"}, "model": {"method": "entmax15"}}),
            r"config.json: cannot be read in schema 2: unknown method 'entmax15'",
        ),
    ],
)
def test_a_file_it_cannot_read_stops_the_command_with_nothing_written(tmp_path, capsys, name, content, message):
    good = tmp_path / "a" / "config.json"
    good.parent.mkdir()
    shutil.copy(LEGACY / "config_schema1.json", good)  # would be rewritten, were the other file readable
    bad = tmp_path / "b" / name
    bad.parent.mkdir()
    bad.write_text(content)
    before = good.read_bytes(), bad.read_bytes()
    assert main(["migrate", str(good), str(bad)]) == 2
    err = _err_line(capsys)
    assert str(bad) in err
    with pytest.raises(MigrateError, match=message):
        migrate([good, bad])
    assert (good.read_bytes(), bad.read_bytes()) == before
    assert not [p for p in tmp_path.rglob(".*") if p.is_file()]  # no temporaries left


def test_a_missing_path_is_named(tmp_path, capsys):
    assert main(["migrate", str(tmp_path / "nowhere")]) == 2
    assert "nowhere: no such file or folder" in _err_line(capsys)
