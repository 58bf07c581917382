"""The tables of the HSA study's report (``PAGE``, docs/reports/2026-11-21-hsa-development.md) and the report
pages docs/hsa/report*/, rebuilt from the HSA study's results store ``results/hsa/records.jsonl`` (one record per
`longsparse eval` result file of a study run; results/README.md). Reads only the store (nothing from models or run
folders, except ``add``); paths are relative to the repository root (``--root``, default the current folder):

    longsparse hsa tables NAME ...          # print blocks (stripped, full, decoders, decoders4, tasks)
    longsparse hsa check                    # exit 1 if a block of PAGE or a report table differs
    longsparse hsa write                    # rewrite those blocks, and the report pages with their plots
    longsparse hsa add STUDY RUN_DIR ...    # append the evaluations of run folders to the store

A block of ``PAGE`` is the text between the lines ``<!-- hsa tables NAME -->`` and ``<!-- /hsa tables -->``;
nothing else in the page is written. For a length a run was evaluated at more than once, the later record wins
(the store's rule). ``add`` reads a run folder's ``eval/*.json``, its ``metrics.jsonl`` (the logged training
losses) and the ``train wall N s`` line (the wall clock of `longsparse train`, written by the queue that ran it)
of ``RUN_DIR/train.log`` or ``RUNS/<run>.train.log``; a result file already stored (same run, same date) is not
added again. The plots need matplotlib; without it ``write`` rewrites the tables only.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Optional

from longsparse.io import (
    atomic_write_bytes,
    atomic_write_text,
    claim_outputs,
    read_json_or_none,
    read_jsonl,
    warn_stderr,
)
from longsparse.migrate import migrate_run_config
from longsparse.report import build_report, store
from longsparse.train.config import SCHEMA_VERSION, config_hash

# relative to the repository root
STORE = Path("results") / "hsa"
PAGE = Path("docs") / "reports" / "2026-11-21-hsa-development.md"
PAGES_DIR = Path("docs") / "hsa"
WRITER = "longsparse hsa write"
PAGE_FILES = ("results.md", "accuracy_vs_length.png")  # of each report page
# "left the loss plateau": the first logged step below this (chance on single-token passkey, 16 values: 1.39)
PLATEAU_LOSS = 1.0
# score_needles counts only the answer tokens from this time on; needle diagnostics written earlier (no
# ``query_positions`` field) included the EOS-predicting position, so their recall / rank are marked *
DIAGNOSTICS_FIXED = "2026-11-21T15:16:30"
DIAGNOSTICS_NOTE = (
    "Needle diagnostics (HSA runs): recall@k / mean rank of the needle chunk / mean weight on it / "
    "exact match given full recall (n) / given a miss (n); eval seconds (score + diagnostics)"
)


@dataclass(frozen=True)
class Block:
    """One generated block of ``PAGE``: the exact-match table of ``runs`` (rows, in this order) and below it
    the needle diagnostics (``diagnostics``) and a training table (``training``: ``"full"`` = wall clock, final
    loss, plateau exit; ``"wall"`` = wall clock only; ``"inline"`` = wall clock and final loss as two more
    columns of the exact-match table). ``ratio_header``: length columns read ``L (L/train×)``."""

    study: str
    runs: tuple[str, ...]
    diagnostics: bool = True
    training: str = "full"
    ratio_header: bool = False


def _seeds(*names: str, seeds=(0, 1)) -> tuple[str, ...]:
    return tuple(f"{n}_s{s}" for n in names for s in seeds)


FULL_LAYOUT = _seeds("fl_full", seeds=(0, 1, 2)) + _seeds(
    "fl_sb2warm", "fl_mean", "fl_encmean", "fl_standard", "fl_entmax", "fl_entmax_ls", "fl_dense16", "fl_swa"
)
DECODERS = _seeds("dec_softmax", "dec_asentmax") + _seeds("fl_full", seeds=(0, 1, 2))
BLOCKS = {
    "stripped": Block(
        "hsa",
        ("full_s0", "full_s1", "entmax_s0", "standard_s0", "enccls_s0", "softmax_s0", "asentmax_s0"),
        training="wall",
        ratio_header=True,
    ),
    "full": Block("hsa_full", FULL_LAYOUT),
    "decoders": Block("hsa_full", DECODERS, diagnostics=False),
    "decoders4": Block("hsa_full", _seeds("dec4_softmax", "dec4_asentmax"), diagnostics=False, training="inline"),
    "tasks": Block(
        "hsa_full",
        (
            "mqn_full_s0",
            "mqn_k16_s0",
            "mqn_dec_softmax_s0",
            "vt_full_s0",
            "vt_k16_s0",
            "vt_k16_s1",
            "vt_dec_softmax_s0",
        ),
    ),
}
# the `longsparse report` pages (table + plot) of docs/hsa/<page>/: the study and its runs, in column order
REPORT_PAGES = {
    "report": ("hsa", BLOCKS["stripped"].runs),
    "report_full": ("hsa_full", FULL_LAYOUT),
    "report_dec": ("hsa_full", DECODERS),
}


# ---- records ------------------------------------------------------------------------------------------------
def record(doc: dict, *, study: str, source: str, train: Optional[dict], **extra) -> dict:
    """The store record of one `longsparse eval` result file ``doc`` of run ``study/<run name>``: every field of
    every result (the needle diagnostics included), the run's config and its hash, the evaluating commit (and
    whether its tree had uncommitted changes), the eval command line and the run's training record ``train``. A
    config an evaluation of older code holds is recorded in today's form (``longsparse.migrate``), the hash it
    had kept as ``legacy_hash``, as ``longsparse migrate`` rewrites a record of that code."""
    cfg = doc["config"]
    if cfg.get("schema_version") != SCHEMA_VERSION:  # an evaluation by older code
        cfg = migrate_run_config(cfg, f"{source}: its config")
    if "legacy_hash" in cfg:  # the hash the run was filed under before a migration changed it
        extra = {**extra, "legacy_hash": cfg["legacy_hash"]}
    command = doc.get("command") or []
    return store.record_from_eval(
        doc,
        study=study,
        run=f"{study}/{doc['run_name']}",
        seed=cfg["train"]["seed"],
        source=source,
        config_hash=config_hash(cfg),
        all_result_fields=True,
        label=doc.get("label"),
        code_dirty=doc.get("env", {}).get("git", {}).get("dirty"),
        eval_command=" ".join(["longsparse", *command[1:]]) if command else None,
        config=cfg,
        train=train,
        **extra,
    )


def training_record(run_dir: Path, steps: Optional[int] = None) -> dict:
    """A run folder's training record: ``steps``, ``wall_seconds`` (``/usr/bin/time`` around `longsparse train`;
    else the first to the last logged step of ``metrics.jsonl``, with a ``wall_note`` saying so; None if neither is
    there), ``final_loss`` and ``first_step_loss_below_1`` (a step, "never", or None when no
    losses were logged) from ``metrics.jsonl``, and the logged ``losses`` [[step, loss], ...]."""
    metrics = run_dir / "metrics.jsonl"
    losses = [[m["step"], m["loss"]] for m in read_jsonl(metrics) if "loss" in m] if metrics.is_file() else []
    wall, note = None, None
    for log in (run_dir / "train.log", run_dir.parent / f"{run_dir.name}.train.log"):
        if wall is None and log.is_file():
            wall = next(
                (float(line.split()[-2]) for line in log.read_text().splitlines() if "train wall" in line), None
            )
    if wall is None and metrics.is_file():  # a run no queue timed (`longsparse reproduce`): its logged steps
        times = [datetime.fromisoformat(m["time"]) for m in read_jsonl(metrics) if "loss" in m and "time" in m]
        if len(times) > 1:
            wall, note = round((times[-1] - times[0]).total_seconds()), "first to last logged step"
    exit_step = next((s for s, v in losses if v < PLATEAU_LOSS), "never") if losses else None
    return {
        "steps": losses[-1][0] if losses else steps,
        "wall_seconds": wall,
        **({"wall_note": note} if note else {}),
        "final_loss": losses[-1][1] if losses else None,
        "first_step_loss_below_1": exit_step,
        "losses": losses or None,
    }


def add_runs(study: str, run_dirs: list[str | Path], store_dir: str | Path = STORE, printer=print) -> int:
    """Append the evaluations of ``run_dirs`` (runs of ``study``) that the store lacks; returns how many."""
    stored = {(r["run"], r["date"]) for r in store.read_records(store_dir)}
    new = []
    for run_dir in map(Path, run_dirs):
        files = sorted((run_dir / "eval").glob("*.json"))
        if not files:
            raise FileNotFoundError(f"{run_dir}: no evaluation results in {run_dir / 'eval'}")
        docs = [(f, read_json_or_none(f, warn_stderr)) for f in files]  # None: cut by an interrupted eval
        docs = [(f, d) for f, d in docs if d is not None]
        train = training_record(run_dir, steps=max(d.get("checkpoint_step") or 0 for _, d in docs) or None)
        for f, doc in docs:
            rec = record(doc, study=study, source=str(f), train=train)
            if (rec["run"], rec["date"]) not in stored:
                new.append(rec)
    store.append_records(store_dir, sorted(new, key=lambda r: r["date"] or ""))
    printer(f"appended {len(new)} record(s) to {store.records_path(store_dir)}")
    return len(new)


# ---- rendering ----------------------------------------------------------------------------------------------
def run_view(records: list[dict], study: str, name: str) -> dict:
    """{"by_length": {L: (result, record)}, "train": ..., "not_evaluated": {L: why}} of run ``study/name``:
    per length the result of the latest record, the training record of the latest record."""
    recs = [r for r in records if r["run"] == f"{study}/{name}"]
    if not recs:
        raise ValueError(f"no record of run {study}/{name} in the HSA store's records")
    by_length = {int(r["length"]): (r, rec) for rec in recs for r in rec["results"]}
    why = {int(L): w for rec in recs for L, w in (rec.get("not_evaluated") or {}).items()}
    return {
        "by_length": by_length,
        "train": recs[-1].get("train") or {},
        "train_hi": recs[-1]["train_hi"],
        "not_evaluated": {L: w for L, w in why.items() if L not in by_length},
    }


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}"


def _num(x, fmt: str) -> str:
    """``x`` formatted, '-' for None / NaN (the needle rank of a model without retrieval)."""
    return "-" if x is None or x != x else format(x, fmt)


def _em_cell(run: dict, length: int) -> str:
    if length not in run["by_length"]:
        why = run["not_evaluated"].get(length)
        return f"not run ({why})" if why else "not run"
    r = run["by_length"][length][0]
    lo, hi = r["ci"]
    return f"{_pct(r['exact_match'])} [{_pct(lo)}, {_pct(hi)}] n={r['n']}"


def _wall(train: dict) -> str:
    note = train.get("wall_note")
    return f"{train.get('wall_seconds')}" + (f" ({note})" if note else "")


def render_block(
    name: str,
    records: list[dict],
    runs: Optional[tuple[str, ...]] = None,
    source: str = f"{STORE.as_posix()}/records.jsonl",
) -> str:
    """The text of block ``name`` (``BLOCKS``), first line the command that rebuilds it from ``source`` (the store
    ``records`` were read from); ``runs``: only these of its runs (a study still running), in the block's order."""
    b = BLOCKS[name]
    runs = {n: run_view(records, b.study, n) for n in b.runs if runs is None or n in runs}
    lengths = sorted(
        {L for v in runs.values() for L in v["by_length"]} | {L for v in runs.values() for L in v["not_evaluated"]}
    )
    inline = b.training == "inline"
    if b.ratio_header:
        hi = next(iter(runs.values()))["train_hi"]
        head = "| run (EM % [95% Wilson], n) | " + " | ".join(f"{L:,} ({L / hi:g}×)" for L in lengths) + " |"
    else:
        head = (
            "| run | "
            + " | ".join(f"{L:,}" for L in lengths)
            + (" | training wall clock (s) | final loss" if inline else "")
            + " |"
        )
    lines = [
        f"*Rebuilt from `{source}` by `longsparse hsa tables {name}`.*",
        "",
        head,
        "|---|" + "---|" * (len(lengths) + 2 * inline),
    ]
    for n, v in runs.items():
        cells = [_em_cell(v, L) for L in lengths]
        if inline:
            cells += [_wall(v["train"]), _num(v["train"].get("final_loss"), ".4f")]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    if b.diagnostics:
        lines += [
            "",
            DIAGNOSTICS_NOTE,
            "",
            "| run | L | recall@k | full recall | rank | weight | EM given recall | EM given miss | eval s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for n, v in runs.items():
            for L in lengths:
                r, rec = v["by_length"].get(L, ({}, None))
                nd = r.get("needles")
                if nd is None:
                    continue
                g, m = nd["exact_match_given_recall"], nd["exact_match_given_miss"]
                star = "" if "query_positions" in nd or (rec["date"] or "") >= DIAGNOSTICS_FIXED else "*"
                lines.append(
                    f"| {n}{star} | {L:,} | {_num(nd['recall_at_k'], '.2f')} | "
                    f"{_num(nd['full_recall']['rate'], '.2f')} | {_num(nd['mean_rank'], '.1f')} | "
                    f"{_num(nd['mean_needle_weight'], '.2f')} | {_pct(g['rate'])}% ({g['n']}) | "
                    f"{_pct(m['rate'])}% ({m['n']}) | {r['seconds'] + nd['seconds']:.0f} |"
                )
    if b.training == "full":
        lines += [
            "",
            "| run | training wall clock (s) | final training loss | first logged step with loss < 1 |",
            "|---|---|---|---|",
        ]
        for n, v in runs.items():
            t = v["train"]
            lines.append(
                f"| {n} | {_wall(t)} | {_num(t.get('final_loss'), '.4f')} | {t.get('first_step_loss_below_1')} |"
            )
    elif b.training == "wall":
        lines += ["", "| run | training wall clock (s) |", "|---|---|"]
        lines += [f"| {n} | {_wall(v['train'])} |" for n, v in runs.items()]
    return "\n".join(lines) + "\n"


def _begin(name: str) -> str:
    return f"<!-- hsa tables {name} -->"


END = "<!-- /hsa tables -->"


def page_blocks(text: str) -> dict[str, tuple[int, int]]:
    """{name: (start, end)} character span of each block's content in the page ``text``."""
    spans = {}
    for name in BLOCKS:
        begin = text.find(_begin(name) + "\n")
        if begin < 0:
            raise ValueError(f"{PAGE}: block {name} missing (line {_begin(name)!r})")
        start = begin + len(_begin(name)) + 1
        end = text.find(END, start)
        if end < 0:
            raise ValueError(f"{PAGE}: block {name} has no closing line {END!r}")
        spans[name] = (start, end)
    return spans


def render_page(text: str, records: list[dict]) -> str:
    """``text`` (``PAGE``) with every block rebuilt from ``records``."""
    spans = sorted(page_blocks(text).items(), key=lambda kv: kv[1])
    out, pos = [], 0
    for name, (start, end) in spans:
        out += [text[pos:start], render_block(name, records)]
        pos = end
    return "".join(out + [text[pos:]])


def eval_docs(records: list[dict], study: str, runs: tuple[str, ...]) -> list[dict]:
    """The records of ``runs`` as `longsparse eval` result documents (what `longsparse report` reads), in the
    order of ``runs`` and, per run, of the store."""
    out = []
    for name in runs:
        for rec in (r for r in records if r["run"] == f"{study}/{name}"):
            out.append(
                {
                    "format": "longsparse-eval",
                    "run": rec["run"],
                    "run_name": name,
                    "label": rec["label"],
                    "task": rec["task"],
                    "method": rec["method"],
                    "positions": rec["positions"],
                    "train_lengths": rec["config"]["train"]["train_lengths"],
                    "checkpoint": rec["results"][0]["checkpoint"],
                    "created": rec["date"],
                    "results": [{**r, "exact_match_ci": r["ci"]} for r in rec["results"]],
                }
            )
    return out


def render_report_page(page: str, records: list[dict], out: Path, printer=None) -> dict:
    """`longsparse report` of the page's runs, from the store, into ``out`` (results.md, results.json, plot)."""
    study, runs = REPORT_PAGES[page]
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, doc in enumerate(eval_docs(records, study, runs)):
            files.append(Path(tmp) / f"{i:03d}.json")
            atomic_write_text(files[-1], json.dumps(doc))
        return build_report(files, out, printer=printer)


def stale_outputs(root: str | Path = ".", store_dir: str | Path | None = None, write: bool = False) -> list[str]:
    """The outputs (``PAGE`` and each report page's results.md, relative to ``root``) that differ from their
    rendering of the store; with ``write``, rewrite every output from the store (atomically) and return []. A
    report page's file that ``WRITER`` did not write is never replaced (ForeignFileError, before any write)."""
    root = Path(root)
    if write:
        for page in REPORT_PAGES:
            claim_outputs(root / PAGES_DIR / page, PAGE_FILES, WRITER)
    records = store.read_records(root / STORE if store_dir is None else store_dir)
    if not records:
        raise FileNotFoundError(f"no records in {root / STORE if store_dir is None else store_dir} (pass --root)")
    text = (root / PAGE).read_text(encoding="utf-8")
    new = render_page(text, records)
    stale = [] if new == text else [str(PAGE)]
    with tempfile.TemporaryDirectory() as tmp:
        for page in REPORT_PAGES:
            rendered = render_report_page(page, records, Path(tmp) / page)
            target = root / PAGES_DIR / page
            if (
                not (target / "results.md").is_file()
                or (target / "results.md").read_text() != Path(rendered["markdown"]).read_text()
            ):
                stale.append(str(PAGES_DIR / page / "results.md"))
            if write:
                for f in PAGE_FILES:
                    if (Path(tmp) / page / f).is_file():
                        atomic_write_bytes(target / f, (Path(tmp) / page / f).read_bytes())
    if write:
        if new != text:
            atomic_write_text(root / PAGE, new)
        return []
    return stale


# ---- command line ------------------------------------------------------------------------------------------
def add_cli(sub) -> None:
    """Register ``longsparse hsa tables|check|write|add`` on the top-level subparsers."""
    h = sub.add_parser("hsa", help="the HSA study's report tables and pages from its results store (docs/hsa.md)")
    hsub = h.add_subparsers(dest="hsa_command", required=True, metavar="tables|check|write|add")

    def common(p):
        p.add_argument("--root", default=".", help="repository root (default: the current folder)")
        p.add_argument("--store", default=None, help="the results store (default ROOT/results/hsa)")
        return p

    t = common(hsub.add_parser("tables", help="print blocks of the report's tables"))
    t.add_argument("blocks", nargs="+", metavar="NAME", help=f"blocks to print: {', '.join(BLOCKS)}")
    t.set_defaults(func=_cli_tables)
    c = common(hsub.add_parser("check", help="exit 1 if a block of the report or a report page is stale"))
    c.set_defaults(func=_cli_check)
    w = common(hsub.add_parser("write", help="rewrite the report's blocks and the report pages from the store"))
    w.set_defaults(func=_cli_write)
    a = common(hsub.add_parser("add", help="append the evaluations of run folders to the store"))
    a.add_argument("study", help="the study the runs belong to (hsa, hsa_full)")
    a.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    a.set_defaults(func=_cli_add)


def _store(args) -> Path:
    return Path(args.store) if args.store else Path(args.root) / STORE


def _cli_tables(args) -> int:
    unknown = [n for n in args.blocks if n not in BLOCKS]
    if unknown:
        raise ValueError(f"unknown block {unknown[0]!r}; choose from {', '.join(BLOCKS)}")
    records = store.read_records(_store(args))
    for name in args.blocks:
        print(render_block(name, records))
    return 0


def _cli_check(args) -> int:
    stale = stale_outputs(args.root, _store(args))
    for s in stale:
        print(f"stale: {s} (rebuild: longsparse hsa write)", file=sys.stderr)
    return 1 if stale else 0


def _cli_write(args) -> int:
    stale_outputs(args.root, _store(args), write=True)
    print(f"wrote {PAGE} and the report pages {', '.join(REPORT_PAGES)} from {_store(args)}")
    return 0


def _cli_add(args) -> int:
    add_runs(args.study, args.run_dirs, _store(args))
    return 0
