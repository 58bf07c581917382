"""Files of older code in today's form: the one module that knows the older forms of stored files.

    longsparse migrate PATH...    each PATH a file, or a folder (searched for config.json, records.jsonl,
                                  results.json, last.pt, best.pt and extra.pt, hidden folders skipped)

Every other reader takes the current form only (``longsparse.train.config.SCHEMA_VERSION`` for run configs,
``longsparse.report.store.RECORD_VERSION`` for records), so an older form is converted here once, in place:

- a run config (``config.json``; stored by older code without ``schema_version``) is read in its form, upgraded
  (below), resolved and written in the form run folders hold, with ``schema_version``; where the rewrite changes
  its hash, the hash it was first filed under is kept as ``legacy_hash`` (one it has already is kept), so
  everything recorded under that hash (a checkpoint's ``config_hash``, an archived result) stays traceable to it
  and the trainer resumes such a checkpoint. Upgrades from schema 1: a model section written before
  ``model.arch`` existed named HSA as the method (``"method": "hsa", "positions": "hsa"``) with the token
  attention HSA then had (softmax, RoPE, today's HSA defaults): it becomes ``arch = "hsa"``. From schema 2: the
  attention settings, stored flat among the model's keys (HSA's top-k mapping's k as ``attn_topk``), become the
  table ``model.attention`` (``nest_attention``).
- a checkpoint (``last.pt``, ``best.pt``, or any ``.pt`` file named; ``extra.pt`` of a sharded checkpoint): the
  training state (of ``last.pt``, ``extra.pt``) written before keys were added to its layout (``longsparse.train.state``) gets them with the value that
  describes that code (``ADDED_KEYS``), so that the trainer, which reads today's layout only, resumes it; a
  checkpoint of version 1 gets its model config nested as schema 3 nests it (checkpoint version 2).
- a results store (``records.jsonl``): records of version 1 become version 2 (``RECORD_VERSION``); a record's
  run ``config`` is migrated as a run config and its ``config_hash`` becomes that config's hash, the one it had
  kept as ``legacy_hash``; a record without a config keeps its hash, the identity of the schema it was written
  in (``schema2_hash`` gives it for today's config; the study runner matches records by either). A study archive
  or view (``results.json`` of `longsparse reproduce`, which holds hashes but no configs) is checked, not
  rewritten.
- a report folder of `longsparse report` (``results.json`` of format ``longsparse-report``) written before its
  files carried the report's marker: its ``results.md`` (the report's table heading, no marker line) gets the
  marker line, its plot (a matplotlib PNG without the marker) the marker text chunk, so that a rerun of
  `longsparse report` into the folder replaces them as its own.

Idempotent: a file already in the current form is left byte-identical. All or nothing: every file is read and
converted before the first one is written; a file that cannot be read stops the command with one line naming it,
and nothing is written. Each rewrite is atomic (``longsparse.io``).

Study files (TOML, written by hand with their comments) are not rewritten: ``read_study_sets`` converts a study
table of the older form (``--set`` strings under ``sets`` / ``more_sets`` / ``method_sets``, flat attention
settings nested) as it is read, so that a file that must stay as it was registered (``prereg_mqmtar.toml``) reads
as today's tables.
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
KNOWN_NAMES = ("config.json", "records.jsonl", "results.json", "last.pt", "best.pt", "extra.pt")

# Keys added to a checkpoint's training state after checkpoints existed, with the value that says what the code
# before them did: ``train_seconds`` was not measured, ``cuda_rng`` not stored (the CUDA generator stays as seeded
# on resume), ``loss_acc`` not stored (the loss of the logging window being summed restarted empty on resume: the
# pre-registered studies' frozen code, 946520f, wrote such checkpoints).
ADDED_KEYS = {"train_seconds": 0.0, "cuda_rng": None, "loss_acc": [0.0, 0]}

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


# Schema 2 stored a model section's attention settings flat among its own keys, HSA's top-k mapping's k as
# ``attn_topk`` (its own ``topk`` counts retrieved chunks); schema 3 nests them as the table ``attention``.
SCHEMA2_RENAMED = {"hsa": {"attn_topk": "topk"}}


def _arch_of(model: Mapping) -> str:
    from longsparse.models import DEFAULT_ARCH

    return model.get("arch", DEFAULT_ARCH)


def nest_attention(model: Mapping, arch: str | None = None) -> dict:
    """A schema-2 model section (or a checkpoint's stored model config, of architecture ``arch``; default its
    ``arch`` key) in schema 3: the attention settings given flat (HSA's ``attn_topk`` as ``topk``) move into the
    table ``attention``, in front of any setting that table already holds. A section in schema 3 is returned as
    it is."""
    from longsparse.models import ARCHITECTURES
    from longsparse.nn.config import ATTENTION_FIELDS, ATTENTION_KEY

    arch = arch or _arch_of(model)
    renamed = SCHEMA2_RENAMED.get(arch, {})
    own = set(ARCHITECTURES[arch].config_cls.STORED_KEYS) if arch in ARCHITECTURES else set()
    out, flat = {}, {}
    for k, v in model.items():
        if k in renamed:
            flat[renamed[k]] = v
        elif k in ATTENTION_FIELDS and k not in own:
            flat[k] = v
        else:
            out[k] = v
    if not flat:
        return dict(model)
    nested = out.get(ATTENTION_KEY)
    out[ATTENTION_KEY] = {**flat, **(nested if isinstance(nested, Mapping) else {})}
    return out


def flat_attention(model: Mapping, arch: str | None = None) -> dict:
    """A schema-3 model section (or a checkpoint's stored model config, of architecture ``arch``; default its
    ``arch`` key) in the flat form of schema 2, the inverse of ``nest_attention``: what ``schema2_hash``
    hashes."""
    from longsparse.nn.config import ATTENTION_KEY

    out = {k: v for k, v in model.items() if k != ATTENTION_KEY}
    names = {new: old for old, new in SCHEMA2_RENAMED.get(arch or _arch_of(model), {}).items()}
    out.update({names.get(k, k): v for k, v in (model.get(ATTENTION_KEY) or {}).items()})
    return out


def schema2_hash(cfg: Mapping) -> str:
    """The config hash that the resolved run config ``cfg`` (today's form) had in schema 2, when its model section
    held the attention settings flat: the identity that records of that code carry without their config (a store
    record of a study cell: ``longsparse_experiments.study_records`` matches them by it)."""
    return _filed_hash({**cfg, "model": flat_attention(cfg["model"])}, 2)


def _filed_hash(cfg: Mapping, version: int) -> str:
    """The config hash that the code of schema ``version`` computed for ``cfg`` (a config in that schema's form):
    up to schema 2 the identity left out the flat ``model.attn_backend`` (today ``model.attention.attn_backend``,
    which ``config_hash`` leaves out)."""
    from longsparse.train.config import config_hash

    model = cfg.get("model")
    if version <= 2 and isinstance(model, Mapping) and "attn_backend" in model:
        cfg = {**cfg, "model": {k: v for k, v in model.items() if k != "attn_backend"}}
    return config_hash(cfg)


def migrate_run_config(cfg: Any, where: str = "run config") -> dict:
    """The run config ``cfg`` (a stored config.json, any schema this code knows) in the form a run folder holds
    now (``longsparse.train.rundir.normalise`` of the resolved config), with ``legacy_hash`` where its hash
    changed (a config that has one keeps it: the hash it was first filed under, what its artifacts recorded).
    MigrateError naming ``where`` if it cannot be converted."""
    from longsparse.train.config import SCHEMA_VERSION, config_hash, resolve
    from longsparse.train.rundir import normalise

    if not isinstance(cfg, dict) or not {"task", "model"} <= set(cfg):
        raise MigrateError(f"{where}: not a run config (a JSON object with task and model sections)")
    version = cfg.get("schema_version", 1)  # older code wrote no version
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise MigrateError(f"{where}: unknown schema_version {version!r} (this longsparse knows 1 to {SCHEMA_VERSION})")
    new = dict(cfg)
    if version == 1 and isinstance(new["model"], Mapping):
        new["model"] = _upgrade_schema1_model(new["model"])
    if version <= 2 and isinstance(new["model"], Mapping):
        new["model"] = nest_attention(new["model"])
    new["schema_version"] = SCHEMA_VERSION
    try:
        new = normalise(resolve(new))
    except ConfigError as e:
        raise MigrateError(f"{where}: cannot be read in schema {SCHEMA_VERSION}: {e}") from None
    if "legacy_hash" not in new and config_hash(new) != _filed_hash(cfg, version):
        new["legacy_hash"] = _filed_hash(cfg, version)
    return new


def read_study_sets(path: Any, where: str, table: Mapping) -> dict:
    """A ``[defaults]`` or ``[[study]]`` table of a study file with its older ``--set``-string keys
    (``STUDY_SET_KEYS``) turned into today's override tables, parsed as ``--set`` parses them, flat attention
    settings nested (``model.alpha`` as ``model.attention.alpha``); a table without them is returned as it is.
    ConfigError naming the file, the table and the problem."""
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
            converted = {m: _nested_sets(apply_sets({}, sets)) for m, sets in lists.items()}
        except ConfigError as e:
            raise ConfigError(f"{path}: {where}: {e}") from None
        table[new] = converted if old == "method_sets" else converted[None]
    return table


def _nested_sets(table: dict) -> dict:
    """An override table of the older form's ``--set`` strings with the flat attention settings of its model
    table (``model.alpha=1.3``, schema 2) nested as today's (``model.attention.alpha``)."""
    if isinstance(table.get("model"), Mapping):
        table = {**table, "model": nest_attention(table["model"])}
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
    """The bytes the checkpoint file ``path`` (``last.pt`` or any ``.pt`` checkpoint, or ``extra.pt`` of a sharded
    checkpoint) must hold now, or None when its training state (if it holds one) and its model config are in
    today's form."""
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
    else:
        # the trainer's training state is the extra of last.pt (best.pt records its step and score, another
        # checkpoint what its writer chose); None: saved without one
        extra = payload.get("extra") if path.name == "last.pt" else None
    new_extra = None if extra is None else upgrade_extra(extra, str(path))
    new_payload = None if payload is None else _upgrade_checkpoint_config(payload, path)
    if (extra is None or set(new_extra) == set(extra)) and new_payload is None:
        return None  # the upgrades only add keys and nest the config: none added, nothing nested
    buf = io.BytesIO()
    if payload is None:
        torch.save(new_extra, buf)
    else:
        new_payload = dict(new_payload or payload)
        if extra is not None:
            new_payload["extra"] = new_extra
        torch.save(new_payload, buf)
    return buf.getvalue()


def _upgrade_checkpoint_config(payload: Mapping[str, Any], path: Path) -> dict | None:
    """The checkpoint ``payload`` with its model config in today's stored form (``nest_attention``) and today's
    version (``longsparse.models.checkpoint.VERSION``), or None when it is in today's form."""
    from longsparse.models.checkpoint import VERSION

    version = payload.get("version")
    if version == VERSION:
        return None
    if version != 1 or not isinstance(payload.get("config"), Mapping):
        raise MigrateError(f"{path}: checkpoint version {version!r}, not one longsparse migrate knows")
    return {**payload, "version": VERSION, "config": nest_attention(payload["config"], payload.get("arch"))}


# ---- results ------------------------------------------------------------------------------------------------------
def upgrade_record(rec: Mapping[str, Any], where: str) -> dict:
    """A store record of version 1 in today's form (``RECORD_VERSION``): its run ``config``, where it holds one,
    in today's schema (``migrate_run_config``) with its ``config_hash`` the hash of that config and the hash it
    was filed under kept as ``legacy_hash`` (a record that has one keeps it). A record without a config keeps its
    ``config_hash`` (the identity of the schema it was written in: ``schema2_hash`` of the config today). A
    record of today's version is returned as it is."""
    from longsparse.report.store import RECORD_VERSION
    from longsparse.train.config import config_hash

    version = rec.get("version")
    if version == RECORD_VERSION:
        return dict(rec)
    if version != 1:
        raise MigrateError(f"{where} has version {version!r}, not one this longsparse knows")
    new = {**rec, "version": RECORD_VERSION}
    if isinstance(rec.get("config"), Mapping):
        new["config"] = migrate_run_config(rec["config"], f"{where}: its config")
        old = rec.get("config_hash")
        if old is not None and config_hash(new["config"]) != old:
            new["config_hash"] = config_hash(new["config"])
            new["legacy_hash"] = rec.get("legacy_hash") or old
    return new


def _records_bytes(path: Path) -> bytes | None:
    """The bytes the results store ``path`` (``records.jsonl``) must hold now (each record through
    ``upgrade_record``, in store order, one JSON line each as the store writes them), or None when every record
    is in today's form."""
    from longsparse.io import read_jsonl
    from longsparse.report.store import StoreError, check_record

    try:
        lines = read_jsonl(path, warn=None)
    except (OSError, ValueError) as e:
        raise MigrateError(f"{path}: not readable JSON lines ({e})") from None
    if not lines and path.stat().st_size:
        raise MigrateError(f"{path}: holds no record")
    new = []
    for i, rec in enumerate(lines, 1):
        try:
            check_record(rec, f"{path}: record {i}")
        except StoreError as e:
            raise MigrateError(str(e)) from None
        new.append(upgrade_record(rec, f"{path}: record {i}"))
    if new == lines:
        return None
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in new).encode("utf-8")


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
    if path.suffix == ".pt":
        data = _checkpoint_bytes(path)
        return {} if data is None else {path: data}
    if path.suffix == ".jsonl":
        data = _records_bytes(path)
        return {} if data is None else {path: data}
    if path.suffix != ".json":
        raise MigrateError(
            f"{path}: not a file longsparse migrate knows (a run config.json, a records.jsonl, a results.json, "
            "a checkpoint .pt or extra.pt); "
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
        "migrate",
        help="rewrite run configs, checkpoints, result records and reports of older code in today's form, once "
        "(idempotent)",
    )
    m.add_argument("paths", nargs="+", metavar="PATH", help="files, or folders searched for " + ", ".join(KNOWN_NAMES))
    m.add_argument("--dry-run", action="store_true", help="only list the files that would be rewritten")
    m.set_defaults(func=_command)
