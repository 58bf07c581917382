"""Files of older code in today's form: the one module that knows the older forms of stored files.

    longsparse migrate PATH...    each PATH a file, or a folder (searched for config.json, records.jsonl,
                                  results.json, last.pt and extra.pt, hidden folders skipped)

Every other reader takes the current form only (``longsparse.train.config.SCHEMA_VERSION`` for run configs,
``longsparse.report.store.RECORD_VERSION`` for records), so an older form is converted here once, in place:

- a run config (``config.json``; stored by older code without ``schema_version``) is read in its form, upgraded
  (below), resolved and written in the form run folders hold, with ``schema_version``; where the rewrite changes
  its hash, the hash it had is kept as ``legacy_hash``, so everything recorded under the old hash (a
  checkpoint's ``config_hash``, an archived result) stays traceable to it. Upgrades from schema 1: a model
  section written before ``model.arch`` existed named HSA as the method (``"method": "hsa", "positions": "hsa"``)
  with the token attention HSA then had (softmax, RoPE, today's HSA defaults): it becomes ``arch = "hsa"``.
- a checkpoint's training state (the ``extra`` of ``last.pt``; ``extra.pt`` of a sharded checkpoint) written
  before keys were added to its layout (``longsparse.train.state``) gets them with the value that describes that
  code (``ADDED_KEYS``), so that the trainer, which reads today's layout only, resumes it.
- a results store (``records.jsonl``) and a study archive or view (``results.json`` of `longsparse reproduce`)
  are checked: their records are in the current form (version ``RECORD_VERSION``), nothing is rewritten.
- a report folder of `longsparse report` (``results.json`` of format ``longsparse-report``) written before its
  files carried the report's marker: its ``results.md`` (the report's table heading, no marker line) gets the
  marker line, its plot (a matplotlib PNG without the marker) the marker text chunk, so that a rerun of
  `longsparse report` into the folder replaces them as its own.

Idempotent: a file already in the current form is left byte-identical. All or nothing: every file is read and
converted before the first one is written; a file that cannot be read stops the command with one line naming it,
and nothing is written. Each rewrite is atomic (``longsparse.io``).

Study files (TOML, written by hand with their comments) are not rewritten: ``study_table`` converts a study
table of the older form (``--set`` strings under ``sets`` / ``more_sets`` / ``method_sets``) as it is read, so
that a file that must stay as it was registered (``prereg_mqmtar.toml``) reads as today's tables.
"""

from __future__ import annotations

import argparse
import json
import struct
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from longsparse.train.config.errors import ConfigError

# The names a folder is searched for.
KNOWN_NAMES = ("config.json", "records.jsonl", "results.json", "last.pt", "extra.pt")

# Keys added to a checkpoint's training state after checkpoints existed, with the value that says what the code
# before them did: ``train_seconds`` was not measured, ``cuda_rng`` not stored (the CUDA generator stays as seeded
# on resume).
ADDED_KEYS = {"train_seconds": 0.0, "cuda_rng": None}

# Study tables of the older form: each key a list of ``--set`` strings (``method_sets``: a table of such lists, one
# per method), today the override table named by the value.
STUDY_SET_KEYS = {"sets": "overrides", "more_sets": "more_overrides", "method_sets": "method_overrides"}

# A results.md of `longsparse report` written before the marker line: its table heading.
REPORT_MD_HEADING = ": exact match % [95% Wilson interval], n = "


class MigrateError(ValueError):
    """A file ``longsparse migrate`` cannot read or convert (the message names it)."""


# ---- run configs ------------------------------------------------------------------------------------------------
def _upgrade_schema1_model(model: Mapping) -> dict:
    """A schema-1 model section in today's form: HSA named as the method (before ``model.arch``) becomes the
    architecture, with its positions "hsa" dropped (the token attention it had is today's HSA default)."""
    from longsparse.models import ARCHITECTURES

    model = dict(model)
    if "arch" not in model and model.get("method") in ARCHITECTURES:
        model["arch"] = model.pop("method")
        if model.get("positions") == model["arch"]:
            del model["positions"]
    return model


def migrate_run_config(cfg: Any, where: str = "run config") -> dict:
    """The run config ``cfg`` (a stored config.json, any schema this code knows) in the form a run folder holds
    now (``longsparse.train.rundir.normalise`` of the resolved config), with ``legacy_hash`` where its hash
    changed. MigrateError naming ``where`` if it cannot be converted."""
    from longsparse.train.config import SCHEMA_VERSION, config_hash, resolve
    from longsparse.train.rundir import normalise

    if not isinstance(cfg, dict) or not {"task", "model"} <= set(cfg):
        raise MigrateError(f"{where}: not a run config (a JSON object with task and model sections)")
    version = cfg.get("schema_version", 1)  # older code wrote no version
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise MigrateError(f"{where}: unknown schema_version {version!r} (this longsparse knows 1 to {SCHEMA_VERSION})")
    new = dict(cfg)
    if version == 1:
        new["model"] = _upgrade_schema1_model(new["model"]) if isinstance(new["model"], Mapping) else new["model"]
    new["schema_version"] = SCHEMA_VERSION
    try:
        new = normalise(resolve(new))
    except ConfigError as e:
        raise MigrateError(f"{where}: cannot be read in schema {SCHEMA_VERSION}: {e}") from None
    if "legacy_hash" not in new and config_hash(new) != config_hash(cfg):
        new["legacy_hash"] = config_hash(cfg)
    return new


def read_study_sets(path: Any, where: str, table: Mapping) -> dict:
    """A ``[defaults]`` or ``[[study]]`` table of a study file with its older ``--set``-string keys
    (``STUDY_SET_KEYS``) turned into today's override tables, parsed as ``--set`` parses them; a table without
    them is returned as it is. ConfigError naming the file, the table and the problem."""
    from longsparse.train.config.build import apply_sets

    table = dict(table)
    for old, new in STUDY_SET_KEYS.items():
        if old not in table:
            continue
        if new in table:
            raise ConfigError(f"{path}: {where} gives both {old} and {new}; give {new} alone")
        value = table.pop(old)
        lists = value if old == "method_sets" else {None: value}
        if not isinstance(lists, dict) or not all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in lists.values()
        ):
            shape = "a table of lists" if old == "method_sets" else "a list"
            raise ConfigError(
                f"{path}: {where}: {old} must be {shape} of section.key=value strings (the current "
                f"form: a {new} table, e.g. model.d_model = 64)"
            )
        try:
            converted = {m: apply_sets({}, sets) for m, sets in lists.items()}
        except ConfigError as e:
            raise ConfigError(f"{path}: {where}: {e}") from None
        table[new] = converted if old == "method_sets" else converted[None]
    return table


# ---- checkpoints --------------------------------------------------------------------------------------------------
def upgrade_extra(extra: Mapping[str, Any], where: str) -> dict:
    """A checkpoint's training state ``extra`` in today's layout: the ``ADDED_KEYS`` it lacks get the value that
    describes the code that wrote it; nothing else is filled in. MigrateError naming ``where`` if the result is
    not today's layout (``longsparse.train.state.check_extra``)."""
    from longsparse.train.state import check_extra

    new = {**{k: v for k, v in ADDED_KEYS.items() if k not in extra}, **extra}
    try:
        check_extra(new, where)
    except ValueError as e:
        raise MigrateError(f"{e}; not a layout longsparse migrate knows") from None
    return new


def _checkpoint_bytes(path: Path) -> bytes | None:
    """The bytes the checkpoint file ``path`` (``last.pt``, or ``extra.pt`` of a sharded checkpoint) must hold
    now, or None when its training state is in today's layout (or it holds none: a checkpoint saved without
    one)."""
    import io

    import torch

    from longsparse.models.checkpoint import FORMAT

    # read without read_checkpoint's check of the weights: a diverged run's file is upgraded as well
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, garbage, pickle errors, ...
        first = (str(e).strip().splitlines() or [""])[0]  # torch's messages run over several lines
        raise MigrateError(
            f"{path}: not a readable checkpoint, corrupt or truncated? ({type(e).__name__}: {first})"
        ) from None
    if not isinstance(payload, dict):
        raise MigrateError(f"{path}: not a longsparse checkpoint (not a dict)")
    if path.name == "extra.pt":  # a sharded checkpoint's training state
        extra, payload = payload, None
    elif payload.get("format") != FORMAT:
        raise MigrateError(f"{path}: not a longsparse checkpoint (missing format tag)")
    elif "extra" not in payload:  # saved without a training state (a model alone)
        return None
    else:
        extra = payload["extra"]
    new = upgrade_extra(extra, str(path))
    if set(new) == set(extra):  # the upgrade only adds keys: none added, nothing to rewrite
        return None
    buf = io.BytesIO()
    torch.save(new if payload is None else {**payload, "extra": new}, buf)
    return buf.getvalue()


# ---- results ------------------------------------------------------------------------------------------------------
def _check_records(path: Path) -> None:
    from longsparse.io import read_jsonl
    from longsparse.report.store import RECORD_VERSION, StoreError, check_record

    try:
        lines = read_jsonl(path, warn=None)
    except (OSError, ValueError) as e:
        raise MigrateError(f"{path}: not readable JSON lines ({e})") from None
    if not lines and path.stat().st_size:
        raise MigrateError(f"{path}: holds no record")
    for i, rec in enumerate(lines, 1):
        try:
            check_record(rec, f"{path}: record {i}")
        except StoreError as e:
            raise MigrateError(str(e)) from None
        if rec.get("version") != RECORD_VERSION:
            raise MigrateError(f"{path}: record {i} has version {rec.get('version')!r}, not one this longsparse knows")


def _png_with_marker(data: bytes, key: str, value: str) -> bytes:
    """The PNG ``data`` with a tEXt chunk ``key``/``value`` right after its header chunk (before the image data,
    where ``longsparse.report.png_text`` reads)."""
    (n,) = struct.unpack(">I", data[8:12])
    end = 8 + 12 + n  # signature, then IHDR: length, type, data, CRC
    body = key.encode("latin-1") + b"\0" + value.encode("latin-1")
    chunk = struct.pack(">I", len(body)) + b"tEXt" + body + struct.pack(">I", zlib.crc32(b"tEXt" + body))
    return data[:end] + chunk + data[end:]


def _report_files(folder: Path) -> dict[Path, bytes]:
    """{path: new bytes} of the files of a report folder that lack the report's marker (see the module)."""
    from longsparse.report import MD_MARKER, PNG_KEY, PNG_VALUE, png_text

    out: dict[Path, bytes] = {}
    md = folder / "results.md"
    if md.is_file():
        text = md.read_text(encoding="utf-8")
        if text.split("\n", 1)[0] != MD_MARKER and REPORT_MD_HEADING in text:
            out[md] = (MD_MARKER + "\n" + text).encode("utf-8")
    png = folder / "accuracy_vs_length.png"
    if png.is_file():
        meta = png_text(png)
        if meta.get(PNG_KEY) != PNG_VALUE and meta.get("Software", "").startswith("Matplotlib"):
            out[png] = _png_with_marker(png.read_bytes(), PNG_KEY, PNG_VALUE)
    return out


# ---- files --------------------------------------------------------------------------------------------------------
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise MigrateError(f"{path}: not readable JSON ({e})") from None


def convert_file(path: str | Path) -> dict[Path, bytes]:
    """{path: the bytes it must hold now} for the file ``path`` and, for a report's results.json, the files of its
    folder; {} when everything is in the current form. Writes nothing; MigrateError naming a file it cannot
    read."""
    from longsparse.report import MERGED_FORMAT
    from longsparse.report.store import ARCHIVE_FORMAT, StoreError, read_archive

    path = Path(path)
    if not path.is_file():
        raise MigrateError(f"{path}: no such file")
    if path.name in ("last.pt", "extra.pt"):
        data = _checkpoint_bytes(path)
        return {} if data is None else {path: data}
    if path.suffix == ".jsonl":
        _check_records(path)
        return {}
    if path.suffix != ".json":
        raise MigrateError(
            f"{path}: not a file longsparse migrate knows (a run config.json, a records.jsonl, a results.json, "
            "a checkpoint's last.pt or extra.pt); "
            "study files (TOML) are read in their older form as they are"
        )
    data = _read_json(path)
    fmt = data.get("format") if isinstance(data, dict) else None
    if fmt == ARCHIVE_FORMAT:
        try:
            read_archive(path)
        except StoreError as e:
            raise MigrateError(str(e)) from None
        return {}
    if fmt == MERGED_FORMAT:
        return _report_files(path.parent)
    if fmt is not None:
        raise MigrateError(f"{path}: a file of format {fmt!r}, which longsparse migrate does not know")
    new = migrate_run_config(data, str(path))
    if new == data:
        return {}
    return {path: (json.dumps(new, indent=2, sort_keys=True) + "\n").encode("utf-8")}


def files_under(paths: Iterable[str | Path]) -> list[Path]:
    """The files the command looks at: each path that is a file, and the ``KNOWN_NAMES`` under each folder."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(
                f
                for f in p.rglob("*")
                if f.name in KNOWN_NAMES
                and f.is_file()
                and not any(part.startswith(".") for part in f.relative_to(p).parts)
            )
            out += found
        elif p.exists():
            out.append(p)
        else:
            raise MigrateError(f"{p}: no such file or folder")
    return out


def migrate(paths: Iterable[str | Path], *, dry_run: bool = False) -> dict[Path, bytes]:
    """Convert every file under ``paths`` (``files_under``) to the current form, all or nothing (see the module);
    returns {path: new bytes} of the files that changed (written unless ``dry_run``)."""
    from longsparse.io import atomic_write_bytes

    changes: dict[Path, bytes] = {}
    for f in files_under(paths):
        changes.update(convert_file(f))
    if not dry_run:
        for f, data in changes.items():
            atomic_write_bytes(f, data)
    return changes


def _command(args: argparse.Namespace) -> int:
    files = files_under(args.paths)
    changes = migrate(files, dry_run=args.dry_run)
    verb = "would rewrite" if args.dry_run else "rewrote"
    for f in changes:
        print(f"{verb} {f}")
    print(f"{len(files)} file(s) read; {verb} {len(changes)}, the others are in the current form")
    return 0


def add_cli(sub: argparse._SubParsersAction) -> None:
    """Register ``longsparse migrate`` on ``sub``."""
    m = sub.add_parser(
        "migrate", help="rewrite run configs and reports of older code in today's form, once (idempotent)"
    )
    m.add_argument("paths", nargs="+", metavar="PATH", help="files, or folders searched for " + ", ".join(KNOWN_NAMES))
    m.add_argument("--dry-run", action="store_true", help="only list the files that would be rewritten")
    m.set_defaults(func=_command)
