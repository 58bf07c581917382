"""A study's results as data: the records that `longsparse reproduce` appends to a study's store (one per run
evaluation, with the cell's config hash), the view of a store that the report is drawn from (per study,
method / positions, checkpoint, length and seed; records of another config hash are left out, never mixed in),
and the report rendered from that view (tables.md, a PNG per study, results.json).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Callable, Optional, Sequence

from longsparse.io import atomic_write_text, check_outputs, claim_outputs, read_jsonl
from longsparse.migrate import schema2_hash
from longsparse.report import plotting
from longsparse.report import store as result_store
from longsparse.train.config import ConfigError, config_hash, resolve
from longsparse_experiments.study import CHECKPOINTS, Cell, Study, StudyFile

FORMAT = "longsparse-reproduce"


def load_store(store: str | Path) -> list[dict]:
    """The result records of the store folder ``store`` ([] if it has none yet; see ``longsparse.report.store``).
    A folder holding a ``results.json`` that is not a study archive is an error: building on it would lose what
    it holds."""
    try:
        return result_store.read_records(store)
    except result_store.StoreError as e:
        raise ConfigError(str(e)) from None


def check_report_folder(report: str | Path, store: str | Path) -> None:
    """Refuse (ConfigError) before anything runs when the view ``report/results.json`` would be written over a
    file that is not a study archive or view, or over an archive that is not in the store ``store`` (one that
    is, when report and store are the same folder, is imported into ``records.jsonl`` first)."""
    p = Path(report) / "results.json"
    if not p.exists():
        return
    try:
        data = result_store.read_archive(p)
    except result_store.StoreError as e:
        raise ConfigError(str(e)) from None
    if not data.get(result_store.VIEW_MARK) and Path(report).resolve() != Path(store).resolve():
        raise ConfigError(
            f"{p} is an archive of earlier results that is not in the store {store}; nothing was "
            f"written: import it (longsparse.report.store.import_archive_file({str(p)!r}, "
            f"{str(store)!r})) or choose another --report"
        )


def cell_hash(cfg: dict) -> str:
    """The config hash a cell's run folder gets (the identity that training resumes under)."""
    return config_hash(resolve(cfg))


def cell_identities(cfg: dict) -> frozenset[str]:
    """The hashes a record of the cell of config ``cfg`` may carry: its hash today (``cell_hash``), and the hash
    the same config had in run config schema 2 (``longsparse.migrate.schema2_hash``), which records written then
    without their config keep."""
    resolved = resolve(cfg)
    return frozenset({config_hash(resolved), schema2_hash(resolved)})


def _records_of(index: dict, study: Study, cell: Cell) -> list[dict]:
    """The store's records of a cell on the study's test stream (records that name no test stream, written
    before it was kept, are taken as they are)."""
    return [r for r in index.get((study.name, cell.run), []) if r.get("test_seed") in (None, study.test_seed)]


def archived(index: dict, study: Study, cell: Cell, hashes: frozenset[str]) -> dict:
    """A cell's results in the store (``index``: ``longsparse.report.store.by_run`` of its records), the later
    record winning: ``{"kept": {(checkpoint, length): per-seed entry} at the checkpoints, lengths and sample counts
    the study asks for now, "all": every such entry of a matching config (a record whose ``config_hash`` is one
    of ``hashes``: ``cell_identities``), "off_spec": how many of those "kept" leaves out, "stale": {config hash:
    number of results} recorded for another config (left out), "record": the
    latest matching record with a training record (or None), "train_hi": the latest matching record's longest
    training length (or None)}``. Records written before config hashes were kept carry none and are taken as
    they are."""
    recs = _records_of(index, study, cell)
    fresh = [r for r in recs if r.get("config_hash") is None or r["config_hash"] in hashes]
    every = {k: result_store.result_entry(r) for k, r in result_store.merge_results(fresh).items()}
    kept = {
        (ck, L): r
        for (ck, L), r in every.items()
        if ck in study.checkpoints and L in study.lengths and r.get("n") == study.samples_for(L)
    }
    stale: dict[str, int] = {}
    for r in recs:
        if r.get("config_hash") is not None and r["config_hash"] not in hashes:
            stale[r["config_hash"]] = stale.get(r["config_hash"], 0) + len(r["results"])
    record = next((r for r in reversed(fresh) if r.get("train") is not None), None)
    train_hi = next((r["train_hi"] for r in reversed(fresh) if r.get("train_hi") is not None), None)
    return {
        "kept": kept,
        "all": every,
        "off_spec": len(every) - len(kept),
        "stale": stale,
        "record": record,
        "train_hi": train_hi,
    }


# ---- report ------------------------------------------------------------------------------------------------
def train_record(run: Path) -> dict:
    """Steps, wall clock (first to last training record of metrics.jsonl), the final logged loss and the
    config hash of the run (what an archived result is matched against later)."""
    from longsparse.train.rundir import read_config

    rec = {
        "steps": None,
        "train_seconds": None,
        "final_loss": None,
        "config_hash": config_hash(read_config(run)) if (run / "config.json").is_file() else None,
    }
    mfile = run / "metrics.jsonl"
    if mfile.is_file():
        from datetime import datetime

        lines = read_jsonl(mfile)  # a run still training may have a torn last line
        steps = [x for x in lines if "loss" in x]
        if steps:
            t = [datetime.fromisoformat(x["time"]) for x in steps]
            rec["steps"] = steps[-1]["step"]
            rec["train_seconds"] = round((t[-1] - t[0]).total_seconds(), 1)
            rec["final_loss"] = round(steps[-1]["loss"], 5)
    return rec


def _run_results(run: Path, study: Study) -> dict:
    """A run folder's evaluations on the study's test stream: ``{"results": {(checkpoint, length): per-seed entry}``
    at the study's checkpoints, lengths and sample counts (a later file wins), ``"train_hi"``: the longest training
    length the model saw, ``"eval_seconds"``: the evaluation wall clock of those entries (summed; None without
    any), ``"code_commit"`` and ``"date"``: the git commit and time of the newest evaluation among them}``."""
    from longsparse.report import collect as collect_runs

    res, train_hi, seconds, newest = {}, None, {}, {}
    for f in sorted((run / "eval").glob("*.json")) if (run / "eval").is_dir() else []:
        try:
            d = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):  # an evaluation killed before its first length
            continue
        if d.get("checkpoint") not in study.checkpoints or d.get("seed", 0) != study.test_seed:
            continue
        train_hi = d["train_lengths"][1]
        for L, r in collect_runs([f])[0]["results"].items():
            if L in study.lengths and r["n"] == study.samples_for(L):
                res[(d["checkpoint"], L)] = {
                    "exact_match": r["exact_match"],
                    "ci": r["exact_match_ci"],
                    "n": r["n"],
                    "token_accuracy": r["token_accuracy"],
                    "checkpoint_step": d.get("checkpoint_step"),
                }
                seconds[(d["checkpoint"], L)] = r.get("seconds")
                if d.get("created", "") >= newest.get("created", ""):
                    newest = d
    timed = [x for x in seconds.values() if x is not None]
    return {
        "results": res,
        "train_hi": train_hi,
        "eval_seconds": round(sum(timed), 1) if timed else None,
        "code_commit": newest.get("env", {}).get("git", {}).get("commit"),
        "date": newest.get("created"),
    }


def run_record(study: Study, cell: Cell, run: Path) -> Optional[dict]:
    """The store record of what the run folder of ``cell`` holds for the study now (None: no result yet)."""
    got = _run_results(run, study)
    if not got["results"]:
        return None
    train = train_record(run)
    chash = train.pop("config_hash")
    return result_store.new_record(
        study=study.name,
        run=cell.run,
        task=study.task,
        preset=study.preset,
        method=cell.method,
        positions=cell.positions,
        seed=cell.seed,
        config_hash=chash,
        code_commit=got["code_commit"],
        date=got["date"],
        test_seed=study.test_seed,
        train_hi=got["train_hi"],
        train=train if (run / "metrics.jsonl").is_file() else None,
        eval_seconds=got["eval_seconds"],
        results=[{"checkpoint": ck, "length": L, **r} for (ck, L), r in sorted(got["results"].items())],
        source=f"run folder {cell.run}",
    )


def new_records(
    spec: StudyFile, out: str | Path, archive: Sequence[dict] = (), printer: Callable[[str], None] = print
) -> list[dict]:
    """The records of the run folders under ``out`` that add to or change what ``archive`` (the store's
    records) holds for their cells; an unchanged run folder gives none, so recording twice appends nothing.
    Prints each stored exact match that a run folder's result replaces."""
    out, stored, new = Path(out), result_store.by_run(archive), []
    for study in spec.studies:
        for c in study.cells():
            run = out / c.run
            rec = run_record(study, c, run) if run.is_dir() else None
            if rec is None:
                continue
            cell_ids = cell_identities(study.cell_config(c))
            ids = cell_ids if rec["config_hash"] in (None, *cell_ids) else frozenset({rec["config_hash"]})
            have = archived(stored, study, c, ids)
            old, prev = have["all"], have["record"]
            fresh = {(r["checkpoint"], r["length"]): result_store.result_entry(r) for r in rec["results"]}
            for k in old.keys() & fresh.keys():
                if old[k]["exact_match"] != fresh[k]["exact_match"]:
                    printer(
                        f"{c.run}: {k[0]} checkpoint at {k[1]}: stored exact match "
                        f"{old[k]['exact_match']:.4f} replaced by this run folder's {fresh[k]['exact_match']:.4f}"
                    )
            same_run = (
                prev is not None
                and rec["train"] in (None, prev["train"])
                and (prev.get("config_hash"), prev.get("eval_seconds")) == (rec["config_hash"], rec["eval_seconds"])
            )
            if not same_run or any(old.get(k) != v for k, v in fresh.items()):
                new.append(rec)
    return new


def _run_info(rec: dict) -> dict:
    """The view's record of a run (steps, train seconds, final loss, config hash, eval seconds) from its record."""
    info = dict(rec["train"] or {})
    if rec.get("config_hash") is not None:
        info["config_hash"] = rec["config_hash"]
    if "eval_seconds" in rec:
        info["eval_seconds"] = rec["eval_seconds"]
    return info


def view(
    spec: StudyFile, records: Sequence[dict], printer: Optional[Callable[[str], None]] = print, *, strict: bool = True
) -> dict:
    """The study view of ``records``: per study, per (method/positions, checkpoint, length) the seeds' results
    (exact match, n, CI, ...) with their mean, min, max, std, and per run its training record. ``strict``: only
    the checkpoints, lengths and sample counts the study file asks for (the report); otherwise every stored
    result of a cell (the paired analysis). Results recorded for another config of a cell are always left out,
    with a message."""
    say = printer or (lambda s: None)
    index = result_store.by_run(records)
    data = {"format": FORMAT, "study_file": spec.path, "studies": {}}
    for study in spec.studies:
        sd = {
            "task": study.task,
            "preset": study.preset,
            "lengths": list(study.lengths),
            "series": {},
            "runs": {},
            "test_seed": study.test_seed,
        }
        off_spec = 0
        for c in study.cells():
            cfg = study.cell_config(c)
            chash = cell_hash(cfg)
            got = archived(index, study, c, cell_identities(cfg))
            for h, n in got["stale"].items():
                say(f"{c.run}: {n} stored results left out: recorded for config {h}, the study file now gives {chash}")
            off_spec += got["off_spec"] if strict else 0
            results = got["kept"] if strict else got["all"]
            if not results:
                continue
            if got["train_hi"] is not None:
                sd["train_hi"] = got["train_hi"]
            sd["runs"][c.run] = _run_info(got["record"]) if got["record"] is not None else None
            by_ck = sd["series"].setdefault(f"{c.method}/{c.positions}", {})
            keys = [(ck, L) for ck in study.checkpoints for L in study.lengths] if strict else sorted(results)
            for ck, L in keys:
                if (ck, L) in results:
                    by_ck.setdefault(ck, {}).setdefault(str(L), {})[str(c.seed)] = results[(ck, L)]
        if off_spec:
            say(
                f"{study.name}: {off_spec} stored results are at checkpoints, lengths or sample counts the study "
                "does not ask for; they stay in the store, not in the tables"
            )
        for by_ck in sd["series"].values():
            for by_L in by_ck.values():
                for L, per in by_L.items():
                    ems = [v["exact_match"] for v in per.values()]
                    per_summary = {
                        "mean": statistics.fmean(ems),
                        "min": min(ems),
                        "max": max(ems),
                        "std": statistics.stdev(ems) if len(ems) > 1 else 0.0,
                        "seeds": len(ems),
                    }
                    by_L[L] = {"per_seed": per, **per_summary}
        data["studies"][study.name] = sd
    return data


def collect(
    spec: StudyFile, out: str | Path, archive: Sequence[dict] = (), printer: Callable[[str], None] = print
) -> dict:
    """The study view (``view``) of ``archive`` (store records) and what the run folders under ``out`` add to it,
    without writing anything."""
    records = list(archive)
    return view(spec, records + new_records(spec, out, records, printer), printer)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def markdown(data: dict, checkpoint: str) -> str:
    """One table per study: rows = lengths, columns = method/positions (with its number of seeds), cells = mean
    [min–max] over seeds (and "(s=k)" where fewer seeds than the column's are evaluated at that length)."""
    parts = []
    for name, sd in data["studies"].items():
        keys = [k for k in sd["series"] if sd["series"][k].get(checkpoint)]  # a study may not evaluate it
        if not keys:
            continue
        train_hi = sd.get("train_hi", 64)
        seeds = {k: max((r["seeds"] for r in sd["series"][k].get(checkpoint, {}).values()), default=0) for k in keys}
        head = "| length | × |" + "".join(f" {k} ({seeds[k]} seed{'s' * (seeds[k] != 1)}) |" for k in keys)
        parts.append(
            f"**{name}** ({checkpoint} checkpoint; exact match %, mean [min–max] over seeds)\n\n{head}\n"
            + "|---:|---:|"
            + "---:|" * len(keys)
        )
        for L in sd["lengths"]:
            row = f"| {L} | {L / train_hi:g} |"
            for k in keys:
                r = sd["series"][k].get(checkpoint, {}).get(str(L))
                if r is None:
                    row += " – |"
                else:
                    spread = "" if r["seeds"] == 1 else f" [{_pct(r['min'])}–{_pct(r['max'])}]"
                    fewer = f" (s={r['seeds']})" if r["seeds"] != seeds[k] else ""
                    row += f" {_pct(r['mean'])}{spread}{fewer} |"
            parts.append(row)
        if checkpoint == "best":
            steps = []
            for k in keys:
                per = next(iter(sd["series"][k].get("best", {}).values()), {}).get("per_seed", {})
                steps.append(f"{k} " + ", ".join(f"s{sd_}: {v['checkpoint_step']}" for sd_, v in sorted(per.items())))
            parts.append("\nbest-checkpoint steps: " + "; ".join(steps))
        parts.append("")
    return "\n".join(parts)


def markdown_per_seed(data: dict, checkpoint: str) -> str:
    """The same tables with every seed's value ("s0 / s1 / s2", "–" where that seed is not evaluated yet)."""
    parts = []
    for name, sd in data["studies"].items():
        keys = [k for k in sd["series"] if sd["series"][k].get(checkpoint)]  # a study may not evaluate it
        if not keys:
            continue
        seeds = sorted(
            {int(x) for k in keys for r in sd["series"][k].get(checkpoint, {}).values() for x in r["per_seed"]}
        )
        train_hi = sd.get("train_hi", 64)
        parts.append(
            f"**{name}** ({checkpoint} checkpoint; exact match % per seed: "
            + " / ".join(f"s{x}" for x in seeds)
            + ")\n\n| length | × |"
            + "".join(f" {k} |" for k in keys)
            + "\n|---:|---:|"
            + "---:|" * len(keys)
        )
        for L in sd["lengths"]:
            row = f"| {L} | {L / train_hi:g} |"
            for k in keys:
                per = sd["series"][k].get(checkpoint, {}).get(str(L), {}).get("per_seed", {})
                row += (
                    " " + " / ".join(_pct(per[str(x)]["exact_match"]) if str(x) in per else "–" for x in seeds) + " |"
                )
            parts.append(row)
        parts.append("")
    return "\n".join(parts)


def plot(data: dict, out_dir: Path) -> list[Path]:
    """Per study: exact match vs length (log x), mean over seeds with the min–max band; a panel per checkpoint
    the study evaluates (best, last)."""
    plt = plotting.pyplot_or_none()
    if plt is None:
        return []
    paths = []
    for name, sd in data["studies"].items():
        if not sd["series"]:
            continue
        cks = [ck for ck in CHECKPOINTS if any(by_ck.get(ck) for by_ck in sd["series"].values())]
        fig, axes = plt.subplots(1, len(cks), figsize=(5.5 * len(cks), 4), sharey=True, squeeze=False)
        axes = axes[0]
        for ax, ck in zip(axes, cks):
            for key, by_ck in sd["series"].items():
                pts = sorted((int(L), r) for L, r in by_ck.get(ck, {}).items())
                if not pts:
                    continue
                xs = [L for L, _ in pts]
                (line,) = ax.plot(xs, [100 * r["mean"] for _, r in pts], marker="o", label=key)
                ax.fill_between(
                    xs,
                    [100 * r["min"] for _, r in pts],
                    [100 * r["max"] for _, r in pts],
                    color=line.get_color(),
                    alpha=0.15,
                )
            ax.set_xscale("log", base=2)
            ax.set_ylim(-3, 103)  # the full 0-100 scale: a study near 100 % must not look like a spread
            ax.set_xlabel(f"test length L (trained up to {sd.get('train_hi', 64)})")
            ax.set_title(f"{name}: {ck} checkpoint")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("exact match %: seed mean, band min–max")
        axes[-1].legend(fontsize=8)
        paths.append(plotting.save(fig, out_dir / f"{name}.png", dpi=90))
    return paths


def update_archive(
    spec: StudyFile,
    out: str | Path,
    report_dir: str | Path,
    printer: Callable[[str], None] = print,
    store: Optional[str | Path] = None,
) -> dict:
    """Append what the run folders under ``out`` add to the store (``store``, default ``report_dir``), then write
    the study view of the whole store as ``report_dir/results.json``; no tables or plots. Returns the view.
    Shards of one study call this after each of their cells: two of them may append the same run folder's
    record, which is harmless (identical records; the later wins)."""
    report_dir = Path(report_dir)
    store = Path(store) if store is not None else report_dir
    check_report_folder(report_dir, store)
    records = load_store(store)
    new = new_records(spec, out, records, printer)
    if not records and not new:
        raise ConfigError(
            f"{result_store.records_path(store)}: no stored results, and no run folders under {out} to add; nothing "
            f"was written (run the study first, or give --store the folder that holds its records.jsonl)"
        )
    try:
        result_store.append_records(store, new)
        if store.resolve() == report_dir.resolve():  # the view is written over the archive it was read from
            result_store.adopt_archive(store)
    except result_store.StoreError as e:
        raise ConfigError(str(e)) from None
    data = {**view(spec, records + new, printer), result_store.VIEW_MARK: True}
    report_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(report_dir / "results.json", json.dumps(data, indent=1) + "\n")
    return data


def tables_markdown(data: dict) -> str:
    """The report's tables.md: mean [min–max] per study and checkpoint, then every seed."""
    return "\n".join(
        [
            *(markdown(data, ck) for ck in CHECKPOINTS),
            "### Per seed\n",
            *(markdown_per_seed(data, ck) for ck in CHECKPOINTS),
        ]
    )


REPORT_WRITER = "longsparse reproduce"


def report_outputs(spec: StudyFile) -> list[str]:
    """The files a report writes besides the view results.json (guarded by `check_report_folder`): the tables
    and a plot per study."""
    return ["tables.md", *(f"{s.name}.png" for s in spec.studies)]


def build_report(
    spec: StudyFile,
    out: str | Path,
    report_dir: str | Path,
    printer: Callable[[str], None] = print,
    store: Optional[str | Path] = None,
) -> dict:
    """The store and the view (``update_archive``), then tables and plots from the view, in ``report_dir``."""
    report_dir = Path(report_dir)
    check_report_folder(report_dir, Path(store) if store is not None else report_dir)
    check_outputs(report_dir, report_outputs(spec), REPORT_WRITER)
    data = update_archive(spec, out, report_dir, printer, store=store)
    claim_outputs(report_dir, report_outputs(spec), REPORT_WRITER)
    tables = tables_markdown(data)
    atomic_write_text(report_dir / "tables.md", tables)
    pngs = plot(data, report_dir)
    printer(tables)
    printer(f"wrote {report_dir / 'results.json'}, {report_dir / 'tables.md'}" + "".join(f", {p}" for p in pngs))
    return {"data": data, "tables": tables, "png": pngs}
