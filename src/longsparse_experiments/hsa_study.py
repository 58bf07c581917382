"""`longsparse reproduce hsa`: the HSA study of docs/hsa.md as the cells of a study file, recorded and rendered as
the HSA study's tables (``hsa_tables``).

    longsparse reproduce hsa --out runs/hsa --store results/hsa      # every run the store lacks, then the tables
    longsparse reproduce hsa --out runs/hsa --store runs/hsa/store   # the whole study again, into a new store
    longsparse reproduce hsa --quick                                 # a tiny version, seconds

The study file (``configs/reproduce/hsa.toml``, top-level ``report = "hsa"``) lists every run of the study: each
``[[study]]`` is one variant (the stripped recipe, the full [B] layout, an ablation by its overrides, a decoder
baseline) with its seeds, its test lengths and the examples at each (those of the stored evaluations), and its
runs in the folder the store files them under (``folder = "hsa_full"``, ``run_name = "fl_dense16_s{seed}"``).
Training and evaluation are `longsparse reproduce`'s (``reproduce.run_study``: resumable, locked run folders,
``--shard``); each evaluation is appended to the store whole, as `longsparse hsa add` does
(``hsa_tables.add_runs``: every per-length result with its needle diagnostics, the config, the training record),
and the report ``REPORT/tables.md`` is every block of ``hsa_tables.BLOCKS`` rendered from the store, each with the
runs it has so far (`longsparse hsa write --store STORE` puts complete blocks into the report page).

A cell is skipped when the store holds its results already: records of its run folder whose config, read by this
code, is the cell's (the hash of the config's current form, so records written before a config schema change keep
their stored hash and still count) with a result at every length the study asks for, with its example count.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Optional

from longsparse.io import atomic_write_text, check_outputs, claim_outputs
from longsparse.report import store as result_store
from longsparse.train.config import ConfigError, config_hash, resolve
from longsparse_experiments import hsa_tables
from longsparse_experiments.study import Cell, Study, StudyFile

REPORT_WRITER = "longsparse reproduce hsa"  # its tables.md is not the tables.md of another study's report
REPORT_FILES = ("tables.md",)


def stored_identity(rec: dict) -> Optional[str]:
    """The hash of a record's config in its current form (``resolve`` reads older forms), or None without one."""
    return config_hash(resolve(rec["config"])) if rec.get("config") else None


def missing_lengths(study: Study, cell: Cell, records: list[dict]) -> list[int]:
    """The study's lengths that ``records`` (a store's) lack for ``cell``: no result of a record of its run folder
    and config at the study's checkpoint(s), with the example count the study asks for (a later record wins)."""
    want = config_hash(study.cell_config(cell))
    mine = [r for r in records if r["run"] == cell.run and stored_identity(r) == want]
    have = result_store.merge_results(mine)
    return [
        L
        for L in study.lengths
        if any((have.get((ck, L)) or {}).get("n") != study.samples_for(L) for ck in study.checkpoints)
    ]


def left_to_run(spec: StudyFile, records: list[dict], printer: Callable[[str], None] = print) -> StudyFile:
    """``spec`` without the cells whose results ``records`` hold (each study keeps the seeds still to run; a
    study left with none is dropped); prints each skipped cell."""
    studies = []
    for study in spec.studies:
        seeds = []
        for c in study.cells():
            if missing_lengths(study, c, records):
                seeds.append(c.seed)
            else:
                printer(f"{c.run}: every result is in the store; skipped")
        if seeds:
            studies.append(dataclasses.replace(study, seeds=tuple(dict.fromkeys(seeds))))
    return StudyFile(spec.path, tuple(studies), spec.report)


def record_runs(spec: StudyFile, out: str | Path, store: str | Path, printer: Callable[[str], None] = print) -> int:
    """Append to ``store`` the evaluations of the cells' run folders under ``out`` that it lacks (filed under each
    study's folder, as `longsparse hsa add FOLDER RUN_DIR ...`); returns how many records were appended."""
    by_folder: dict[str, list[Path]] = {}
    for study in spec.studies:
        for c in study.cells():
            run = Path(out) / c.run
            if any((run / "eval").glob("*.json")):
                by_folder.setdefault(c.run.split("/")[0], []).append(run)
    return sum(hsa_tables.add_runs(folder, runs, store, printer=printer) for folder, runs in by_folder.items())


def report_text(records: list[dict], source: str) -> str:
    """Every block of ``hsa_tables.BLOCKS`` with the runs ``records`` (read from ``source``) hold (a block none of
    whose runs has a record is named as waiting), under a heading per block."""
    stored = {r["run"] for r in records}
    parts = []
    for name, block in hsa_tables.BLOCKS.items():
        runs = tuple(n for n in block.runs if f"{block.study}/{n}" in stored)
        parts.append(f"## {name}\n")
        if not runs:
            parts.append(f"No run of this block is in the store yet ({block.study}/: {', '.join(block.runs)}).\n")
            continue
        lacking = [n for n in block.runs if n not in runs]
        if lacking:
            parts.append(f"Not in the store yet: {', '.join(lacking)}.\n")
        parts.append(hsa_tables.render_block(name, records, runs=runs, source=source))
    return "\n".join(parts)


def write_report(store: str | Path, report: str | Path, printer: Callable[[str], None] = print) -> str:
    """``report/tables.md`` (``report_text``) rendered from the records of ``store``; returns its text."""
    records = result_store.read_records(store)
    if not records:
        raise ConfigError(f"{result_store.records_path(store)}: no stored results to render (run the study first)")
    text = report_text(records, str(result_store.records_path(store)))
    claim_outputs(Path(report), REPORT_FILES, REPORT_WRITER)
    atomic_write_text(Path(report) / "tables.md", text)
    printer(text)
    printer(f"wrote {Path(report) / 'tables.md'} from {result_store.records_path(store)}")
    return text


def train_command(study: Study, cell: Cell) -> str:
    """The `longsparse train` command line that trains ``cell`` (without ``--out``): task, preset, architecture,
    method, positions, seed and one ``--set`` per override, as docs/hsa.md writes them."""
    arch = cell.overrides.get("model", {}).get("arch")
    sets = [
        f"--set {key}={v if isinstance(v, str) else json.dumps(v)}"
        for key, v in _dotted(cell.overrides)
        if key != "model.arch"
    ]
    return " ".join(
        ["longsparse train", f"--task {study.task}", f"--preset {study.preset}"]
        + ([f"--arch {arch}"] if arch else [])
        + [f"--method {cell.method}", f"--positions {cell.positions}", f"--seed {cell.seed}", *sets]
    )


def _dotted(table: dict, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, value) of every leaf of a nested override table, as ``--set`` takes them."""
    out = []
    for k, v in table.items():
        out += _dotted(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
    return out


def run_reproduce(args, spec: StudyFile) -> int:
    """`longsparse reproduce` of a study file with ``report = "hsa"`` (``args``: its parsed command line)."""
    from longsparse_experiments.jobs import refuse_job_options
    from longsparse_experiments.reproduce import parse_shard, run_study

    refuse_job_options(args, "hsa")
    out = Path(args.out or f"runs/reproduce-hsa{'-quick' * args.quick}")  # not another study's folders
    report = Path(args.report or out / "report")
    store = Path(args.store) if args.store else report
    picked = spec.select([s for s in args.only.split(",") if s] if args.only else None)
    shard = parse_shard(args.shard)
    check_outputs(report, REPORT_FILES, REPORT_WRITER)  # before any work: a report it may not write is refused
    if not args.report_only:
        todo = left_to_run(picked, result_store.read_records(store))
        if args.dry_run:
            for study in todo.studies:
                for c in study.cells():
                    print(f"{c.run}: {train_command(study, c)}")
        run_study(todo, out, shard=shard, dry_run=args.dry_run, after_cell=lambda: record_runs(todo, out, store))
        if not args.dry_run:
            record_runs(todo, out, store)  # run folders evaluated before (an interrupted session)
    if args.dry_run:
        return 0
    write_report(store, report)
    return 0
