"""The results store: an append-only file of result records, the one place a study's results are kept.

    STORE/records.jsonl     one record per line; lines are only ever added (``longsparse.io.atomic_append_jsonl``)

A record is one run's evaluation::

    {"format": "longsparse-record", "version": 2,
     "study": "mqmtar_inline", "run": "mqmtar_inline/softmax-nape-s0",          # the run's identity
     "task": "mqmtar_inline", "preset": "cpu", "method": "softmax", "positions": "nape", "seed": 0,
     "config_hash": "5875a60a4e5c7998",       # the run config's hash (None: not recorded)
     "code_commit": "03faac84...",            # the git commit that evaluated it (None: not recorded)
     "date": "2026-11-24T10:53:43+00:00",     # when it was evaluated (None: not recorded)
     "test_seed": 0, "train_hi": 64,          # test stream; the longest training length
     "train": {"steps": 4000, "train_seconds": 1106.0, "final_loss": 0.00455},   # None: not known
     "eval_seconds": 3992.1,                  # optional
     "results": [{"checkpoint": "last", "length": 4096, "n": 50, "exact_match": 0.7, "ci": [lo, hi],
                  "token_accuracy": 0.9, "checkpoint_step": 4000}, ...],
     "source": "where it came from"}

Reading (``read_records``) returns the records in the order they were written; a later record of the same run
wins, per (checkpoint, length), over an earlier one (``merge_results``): a run evaluated again, or trained again
and re-evaluated, appends a new record and never edits an old one.

Results written before the store existed are read as they are: a study archive ``results.json`` of `longsparse
reproduce` (format ``longsparse-reproduce``) in the store folder is read as the store's records while the folder
has no ``records.jsonl``; the first append, or a report about to write its view over that file
(``adopt_archive``), imports it, after which ``records.jsonl`` alone is the store. The view a report renders has
the same format with ``"view": true``; it is never the store, but a view carried to another machine on its own
reads like an archive (the results it shows, no more). A ``longsparse eval`` result file becomes a record with
``record_from_eval``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Optional

from longsparse.io import atomic_append_jsonl, read_jsonl, warn_stderr

RECORD_FORMAT = "longsparse-record"
# 2: a record's run ``config`` (where it holds one) is in run config schema 3, its ``config_hash`` that config's
# hash and ``legacy_hash`` the hash it was filed under before; `longsparse migrate` rewrites version 1 once.
RECORD_VERSION = 2
ARCHIVE_FORMAT = "longsparse-reproduce"
RECORDS_NAME = "records.jsonl"
ARCHIVE_NAME = "results.json"
VIEW_MARK = "view"  # key set in a results.json that a report rendered from a store (not an archive to keep)
REQUIRED = ("study", "run", "method", "positions", "seed", "results")
RESULT_REQUIRED = ("checkpoint", "length", "n", "exact_match")


class StoreError(ValueError):
    pass


def records_path(store: str | Path) -> Path:
    return Path(store) / RECORDS_NAME


def check_record(rec: Any, where: str = "record") -> dict:
    """``rec`` if it is a well-formed record; StoreError naming the first problem otherwise."""
    if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT:
        raise StoreError(f"{where}: not a {RECORD_FORMAT} record")
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise StoreError(f"{where}: record lacks {missing}")
    if not isinstance(rec["results"], list) or not rec["results"]:
        raise StoreError(f"{where}: record of {rec['run']} has no results")
    for r in rec["results"]:
        if not isinstance(r, dict) or any(k not in r for k in RESULT_REQUIRED):
            raise StoreError(f"{where}: a result of {rec['run']} lacks one of {list(RESULT_REQUIRED)}")
    return rec


def new_record(
    *,
    study: str,
    run: str,
    method: str,
    positions: str,
    seed: int,
    results: list[dict],
    task: Optional[str] = None,
    preset: Optional[str] = None,
    config_hash: Optional[str] = None,
    code_commit: Optional[str] = None,
    date: Optional[str] = None,
    test_seed: Optional[int] = None,
    train_hi: Optional[int] = None,
    train: Optional[dict] = None,
    source: Optional[str] = None,
    **extra,
) -> dict:
    """A checked record (see the module docstring); ``extra`` keys (e.g. ``eval_seconds``) are kept as given."""
    rec = {
        "format": RECORD_FORMAT,
        "version": RECORD_VERSION,
        "study": study,
        "run": run,
        "task": task,
        "preset": preset,
        "method": method,
        "positions": positions,
        "seed": seed,
        "config_hash": config_hash,
        "code_commit": code_commit,
        "date": date,
        "test_seed": test_seed,
        "train_hi": train_hi,
        "train": train,
        **extra,
        "results": results,
        "source": source,
    }
    return check_record(rec)


def read_archive(path: Path) -> dict:
    """The study archive or view ``path`` (format ``longsparse-reproduce``); StoreError for anything else."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise StoreError(
            f"{path} is not readable JSON ({e}); it holds earlier results, so nothing was written: "
            "repair it (git checkout) or choose another --store"
        ) from None
    if not isinstance(data, dict) or data.get("format") != ARCHIVE_FORMAT or not isinstance(data.get("studies"), dict):
        raise StoreError(
            f"{path} is not a {ARCHIVE_FORMAT} archive; nothing was written: choose another --store (or --report)"
        )
    return data


def read_records(store: str | Path, warn: Optional[Callable[[str], None]] = warn_stderr) -> list[dict]:
    """Every record of the store folder ``store``, oldest first ([] for a folder that does not exist yet).

    Without ``records.jsonl``, an archive ``results.json`` there (see the module docstring) is read instead;
    a ``results.json`` that is not such an archive is an error (StoreError), so that nothing built on the folder
    can lose what it holds. A line of ``records.jsonl`` that is not a record is skipped with a warning."""
    store = Path(store)
    path = records_path(store)
    if not path.is_file():
        legacy = store / ARCHIVE_NAME
        return import_archive(read_archive(legacy), source=str(legacy)) if legacy.is_file() else []
    out = []
    for i, rec in enumerate(read_jsonl(path, warn=warn), 1):
        try:
            out.append(check_record(rec, f"{path}: record {i}"))
        except StoreError as e:
            if warn:
                warn(f"skipping {e}")
    return out


def append_records(store: str | Path, records: Iterable[dict]) -> int:
    """Append ``records`` (checked first: all or none) to the store; returns how many. The first append to a
    folder that holds only an archive ``results.json`` imports that archive first, so nothing it held is lost
    when a report later writes its view over it."""
    records = [check_record(r) for r in records]
    if not records:
        return 0
    store = Path(store)
    path = records_path(store)
    legacy = store / ARCHIVE_NAME
    first = import_archive(read_archive(legacy), source=str(legacy)) if not path.exists() and legacy.is_file() else []
    atomic_append_jsonl(path, [*first, *records])
    return len(records)


def import_archive_file(archive: str | Path, store: str | Path, source: Optional[str] = None) -> int:
    """Append the records of the archive file ``archive`` (a ``results.json`` of `longsparse reproduce`) to the
    store ``store``; ``source`` (default: the file's path) is kept in every record. Returns how many."""
    archive = Path(archive)
    return append_records(store, import_archive(read_archive(archive), source=source or str(archive)))


def adopt_archive(store: str | Path) -> bool:
    """Import the folder's archive ``results.json`` into a new ``records.jsonl`` (True), unless the folder has
    ``records.jsonl`` already or no archive (False): done before a report writes its view over that file."""
    store = Path(store)
    legacy = store / ARCHIVE_NAME
    if records_path(store).exists() or not legacy.is_file():
        return False
    atomic_append_jsonl(records_path(store), import_archive(read_archive(legacy), source=str(legacy)))
    return True


# ---- results written before the store --------------------------------------------------------------------------
def import_archive(archive: dict, source: str) -> list[dict]:
    """The records of a study archive (``results.json`` of `longsparse reproduce`): one per archived run, holding
    every (checkpoint, length) result the archive kept for it, its training record, config hash and test stream
    where the archive has them (None where it does not). Lossless: ``study_records.view`` of the records gives back
    the archive's series and runs."""
    out = []
    for name, sd in archive.get("studies", {}).items():
        per_run: dict[str, dict] = {}
        for key, by_ck in sd.get("series", {}).items():
            method, _, positions = key.partition("/")
            for ck, by_L in by_ck.items():
                for L, per in by_L.items():
                    for seed, r in per.get("per_seed", {}).items():
                        run = f"{name}/{method}-{positions}-s{seed}"
                        d = per_run.setdefault(
                            run, {"method": method, "positions": positions, "seed": int(seed), "results": []}
                        )
                        d["results"].append({"checkpoint": ck, "length": int(L), **r})
        runs = sd.get("runs", {})
        for run, d in per_run.items():
            info = dict(runs.get(run) or {})
            chash = info.pop("config_hash", None)
            extra = {"eval_seconds": info.pop("eval_seconds")} if "eval_seconds" in info else {}
            out.append(
                new_record(
                    study=name,
                    run=run,
                    task=sd.get("task"),
                    preset=sd.get("preset"),
                    config_hash=chash,
                    test_seed=sd.get("test_seed"),
                    train_hi=sd.get("train_hi"),
                    train=info or None,
                    source=source,
                    **d,
                    **extra,
                )
            )
    return out


def record_from_eval(
    doc: dict,
    *,
    study: str,
    run: str,
    seed: int,
    source: str,
    config_hash: Optional[str] = None,
    all_result_fields: bool = False,
    **extra,
) -> dict:
    """The record of one ``longsparse eval`` result file (format ``longsparse-eval``) of run ``run``.

    ``all_result_fields``: each result also keeps every other field the file has for its length (e.g. ``seconds``,
    ``n_exact`` and an HSA evaluation's ``needles`` diagnostics); by default only the scored fields. ``extra``
    keys (e.g. ``train``) are kept in the record as given."""
    if not isinstance(doc, dict) or doc.get("format") != "longsparse-eval":
        raise StoreError(f"{source}: not a longsparse eval result (format tag missing)")
    results = []
    for r in doc["results"]:
        entry = {
            "checkpoint": doc.get("checkpoint"),
            "length": int(r["length"]),
            "n": r["n"],
            "exact_match": r["exact_match"],
            "ci": r["exact_match_ci"],
            "token_accuracy": r.get("token_accuracy"),
            "checkpoint_step": doc.get("checkpoint_step"),
        }
        if all_result_fields:
            entry.update({k: v for k, v in r.items() if k not in entry and k != "exact_match_ci"})
        results.append(entry)
    git = doc.get("env", {}).get("git", {})
    return new_record(
        study=study,
        run=run,
        task=doc.get("task"),
        preset=doc.get("task_preset"),
        method=doc.get("method"),
        positions=doc.get("positions"),
        seed=seed,
        config_hash=config_hash,
        code_commit=git.get("commit"),
        date=doc.get("created"),
        test_seed=doc.get("seed"),
        train_hi=(doc.get("train_lengths") or [None, None])[1],
        results=results,
        source=source,
        **extra,
    )


# ---- reading records back ---------------------------------------------------------------------------------------
def by_run(records: Iterable[dict]) -> dict[tuple[str, str], list[dict]]:
    """``{(study, run): [record, ...]}`` in store order."""
    out: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        out.setdefault((r["study"], r["run"]), []).append(r)
    return out


def result_entry(r: dict) -> dict:
    """A record's result without its (checkpoint, length) key: the per-seed entry of a study view."""
    return {k: v for k, v in r.items() if k not in ("checkpoint", "length")}


def merge_results(records: Iterable[dict]) -> dict[tuple[str, int], dict]:
    """``{(checkpoint, length): result}`` over ``records`` of one run, a later record winning."""
    out = {}
    for rec in records:
        for r in rec["results"]:
            out[(r["checkpoint"], int(r["length"]))] = r
    return out
