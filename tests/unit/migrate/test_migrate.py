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
from longsparse.migrate import (
    MigrateError,
    convert_file,
    flat_attention,
    migrate,
    migrate_run_config,
    nest_attention,
    schema2_hash,
)
from longsparse.models import read_checkpoint
from longsparse.report import PNG_KEY, PNG_VALUE, png_text
from longsparse.train import ConfigError, build_config, resolve
from longsparse.train.config import SCHEMA_VERSION, RunConfig, config_hash, run_identity
from longsparse.train.rundir import RunDirError, check_run_dir, normalise

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
            {"schema_version": 2},
            r"schema_version 2; this longsparse reads 3: rewrite the file once with `longsparse migrate",
        ),
        ({"schema_version": 4}, r"schema_version 4, newer than this longsparse reads \(3\)"),
        ({"schema_version": "3"}, r"schema_version must be an integer, got '3'"),
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
    assert (m["arch"], m["attention"]["method"], m["attention"]["positions"]) == ("hsa", "softmax", "rope")
    # the hash it had is the one its checkpoint recorded; its hash now is another one
    recorded = read_checkpoint(str(LEGACY / "run" / "checkpoints" / "last.pt"))["extra"]["config_hash"]
    assert new["legacy_hash"] == config_hash(old) == recorded != config_hash(new)
    assert run_identity(resolve(new)) == run_identity(new) and migrate_run_config(new) == new  # a fixed point
    assert all(new[s][k] == v for s in ("task", "train") for k, v in old[s].items())  # as they were
    with pytest.raises(ConfigError, match="`longsparse migrate FILE` rewrites a run config of older code"):
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


def _schema2(cfg: dict) -> dict:
    """A resolved config of today as the code of schema 2 wrote it: its attention settings flat."""
    return {**cfg, "schema_version": 2, "model": flat_attention(cfg["model"])}


@pytest.mark.parametrize("arch", ["transformer", "hsa"])
def test_a_schema2_config_gets_its_attention_nested_and_keeps_the_hash_it_had(tmp_path, arch):
    task = "copy" if arch == "transformer" else "passkey"
    cfg = build_config(task, arch=arch, method="entmax", positions="alibi", steps=2, sets=["model.attention.topk=5"])
    old = _schema2(cfg)
    if arch == "hsa":  # schema 2 named the top-k mapping's k attn_topk beside HSA's own topk (retrieved chunks)
        assert (old["model"]["attn_topk"], old["model"]["topk"]) == (5, cfg["model"]["topk"])
    assert old["model"]["method"] == "entmax" and "attention" not in old["model"]
    # the hash schema-2 code filed it under: its identity, which left out model.attn_backend (a run folder's
    # config.json, which holds the identity only, hashes to it as it is)
    filed = schema2_hash(cfg)
    assert config_hash(_schema2(normalise(cfg))) == filed != config_hash(cfg)
    new = migrate_run_config(old)
    assert new == {**normalise(cfg), "legacy_hash": filed}  # as a run folder's config.json holds it
    assert config_hash(new) == config_hash(cfg) and schema2_hash(new) == filed
    assert migrate_run_config(new) == new  # a fixed point
    with pytest.raises(ConfigError, match=r"schema_version 2; this longsparse reads 3"):
        resolve(old)
    # a config migrated before (schema 1 -> 2) keeps the hash it was first filed under
    first = {**old, "legacy_hash": "0123456789abcdef"}
    assert migrate_run_config(first)["legacy_hash"] == "0123456789abcdef"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")
    assert list(migrate([tmp_path])) == [path] and json.loads(path.read_text()) == new
    assert migrate([tmp_path]) == {}
    with pytest.raises(ConfigError, match=r"model.method is now model.attention.method"):
        resolve({k: v for k, v in old.items() if k != "schema_version"})  # the flat form without its version


def test_the_legacy_hsa_run_folder_keeps_the_hash_of_schema_1():
    """tests/data/hsa_legacy/run/config.json, migrated 1 -> 2 and then 2 -> 3: its legacy_hash stays the hash
    its checkpoint was saved under (schema 1), which the trainer accepts."""
    stored = json.loads((LEGACY / "run" / "config.json").read_text())
    old = json.loads((LEGACY / "config_schema1.json").read_text())
    assert stored["schema_version"] == SCHEMA_VERSION and stored["legacy_hash"] == config_hash(old)
    assert stored == migrate_run_config(old) and "method" in stored["model"]["attention"]
    assert RunConfig.from_dict(stored).legacy_hash == config_hash(old)


def test_a_flat_key_in_a_set_a_preset_or_an_override_is_refused_naming_the_new_key(tmp_path, capsys):
    msg = r"model.alpha is now model.attention.alpha"
    with pytest.raises(ConfigError, match=msg):
        build_config("copy", sets=["model.alpha=1.3"])
    with pytest.raises(ConfigError, match=msg):
        build_config("copy", overrides={"model": {"alpha": 1.3}})
    with pytest.raises(ConfigError, match=r"model.attn_topk is now model.attention.topk"):
        build_config("passkey", arch="hsa", sets=["model.attn_topk=3"])
    assert build_config("passkey", arch="hsa", sets=["model.topk=3"], steps=2)["model"]["topk"] == 3  # HSA's own
    preset = tmp_path / "p.toml"
    preset.write_text('[task]\nname = "copy"\n[model]\nmethod = "softmax"\n')
    with pytest.raises(ConfigError, match=rf"{preset}: model.method is now model.attention.method"):
        build_config("copy", config_file=str(preset))
    assert main(["train", "--task", "copy", "--set", "model.alpha=1.3", "--out", str(tmp_path / "r")]) == 2
    assert "model.alpha is now model.attention.alpha" in _err_line(capsys) and not (tmp_path / "r").exists()
    assert build_config("copy", sets=["model.attention.alpha=1.3"])["model"]["attention"]["alpha"] == 1.3


def test_a_schema2_record_gets_its_config_nested_and_its_hash_with_the_old_one_kept(tmp_path):
    """A store record of version 1 holding its run config (as the HSA study records) gets the config in today's
    form, config_hash the hash of that config and legacy_hash the one it was filed under; a record without a
    config keeps its hash (the schema-2 identity, matched by schema2_hash); a second run writes nothing."""
    from longsparse.report.store import RECORD_VERSION, new_record, read_records

    cfg = build_config("copy", method="entmax", positions="nape", steps=2)
    old_cfg = _schema2(cfg)
    common = dict(
        study="s",
        method="entmax",
        positions="nape",
        seed=0,
        results=[{"checkpoint": "last", "length": 8, "n": 2, "exact_match": 0.5}],
    )
    with_config = {**new_record(run="s/a", config_hash=schema2_hash(cfg), **common), "config": old_cfg}
    bare = new_record(run="s/b", config_hash=schema2_hash(cfg), **common)
    store = tmp_path / "records.jsonl"
    store.write_text("".join(json.dumps({**r, "version": 1}) + "\n" for r in (with_config, bare)))
    assert list(migrate([tmp_path])) == [store]
    a, b = read_records(tmp_path)
    assert a["version"] == b["version"] == RECORD_VERSION == 2
    assert a["config"] == migrate_run_config(old_cfg) and a["config_hash"] == config_hash(cfg)
    assert a["legacy_hash"] == b["config_hash"] == schema2_hash(cfg) and "legacy_hash" not in b
    written = store.read_bytes()
    assert migrate([tmp_path]) == {} and store.read_bytes() == written
    store.write_text(json.dumps({**bare, "version": 9}) + "\n")
    with pytest.raises(MigrateError, match=r"record 1 has version 9, not one this longsparse knows"):
        migrate([tmp_path])


def test_an_archived_store_keeps_every_hash_it_had_as_legacy_hash(tmp_path):
    """A copy of a committed store whose records hold their configs (results/hsa): after migrate every record's
    legacy_hash (or, where the hash did not change, its config_hash) is the hash it had before."""
    src = ROOT / "results" / "hsa" / "records.jsonl"
    before = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    old_form = [{**r, "version": 1, "config": _schema2(r["config"])} if r["version"] == 2 else r for r in before]
    for r, o in zip(before, old_form):  # the committed store migrated, or the one before its migration
        if r["version"] == 2 and "legacy_hash" not in r:
            o["config_hash"] = schema2_hash(r["config"])
        elif r["version"] == 2:
            o["config_hash"] = r["legacy_hash"]
            o.pop("legacy_hash")
    store = tmp_path / "records.jsonl"
    store.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in old_form))
    migrate([tmp_path])
    after = [json.loads(line) for line in store.read_text().splitlines()]
    assert len(after) == len(old_form) > 0
    for o, n in zip(old_form, after):
        assert n.get("legacy_hash", n["config_hash"]) == o["config_hash"]
        assert n["config_hash"] == config_hash(n["config"]) and n["config"]["schema_version"] == SCHEMA_VERSION
    assert after == before  # the committed store is the migrated one


def test_an_older_study_tables_flat_attention_sets_are_read_nested():
    from longsparse.migrate import read_study_sets

    table = read_study_sets("f.toml", "study #1", {"sets": ["model.alpha=1.3", "model.d_model=64", "train.steps=5"]})
    assert table == {"overrides": {"model": {"d_model": 64, "attention": {"alpha": 1.3}}, "train": {"steps": 5}}}
    methods = read_study_sets("f.toml", "study #1", {"method_sets": {"entmax": ["model.positions=rope"]}})
    assert methods == {"method_overrides": {"entmax": {"model": {"attention": {"positions": "rope"}}}}}


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

    # the committed legacy run's checkpoint as its code wrote it: checkpoint version 1, the model config flat,
    # the training state without the keys added since (the committed file is migrated: it has them, as added)
    committed = torch.load(LEGACY / "run" / "checkpoints" / "last.pt", weights_only=True)
    added_since = ("train_seconds", "cuda_rng")  # the legacy run's code stored loss_acc already
    legacy = {k: v for k, v in committed["extra"].items() if k not in added_since}
    assert all(committed["extra"][k] == ADDED_KEYS[k] for k in added_since)
    old_payload = {**committed, "version": 1, "config": flat_attention(committed["config"], "hsa"), "extra": legacy}
    assert set(added_since) == set(STATE_KEYS) - set(legacy) and set(added_since) < set(ADDED_KEYS)
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
    # older still (the pre-registered studies' frozen code): no loss_acc either; its loss window restarted empty
    torch.save({k: v for k, v in legacy.items() if k != "loss_acc"}, extra)
    assert main(["migrate", str(tmp_path)]) == 0
    older = torch.load(extra, weights_only=True)
    assert older["loss_acc"] == [0.0, 0] and split_extra(older, "here")[0]["loss_acc"] == [0.0, 0]
    assert {k: v for k, v in older.items() if k not in ("loss_acc", "torch_rng")} == {
        k: v for k, v in new.items() if k not in ("loss_acc", "torch_rng")
    }
    torch.save(new, extra)
    written = extra.read_bytes()
    assert migrate([tmp_path]) == {} and extra.read_bytes() == written
    # the committed run folder of older code, copied: its checkpoint is upgraded with its weights as they were
    run = tmp_path / "legacy"
    shutil.copytree(LEGACY / "run", run)
    last = run / "checkpoints" / "last.pt"
    torch.save(old_payload, last)
    assert list(migrate([run])) == [last]
    got = read_checkpoint(str(last))
    assert all(torch.equal(got["model"][k], w) for k, w in old_payload["model"].items())
    assert got["config"] == committed["config"] == nest_attention(old_payload["config"], "hsa")
    assert got["extra"]["config_hash"] == legacy["config_hash"]  # the hash its config had, kept
    assert torch.load(LEGACY / "run" / "checkpoints" / "last.pt", weights_only=True)["version"] == 2
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
            r"config.json: cannot be read in schema 3: unknown method 'entmax15'",
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
