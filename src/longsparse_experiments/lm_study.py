"""The LM study pipeline: prepare (tokenizer + token streams) → train each method/positions/seed → evaluate →
report (tables, JSON, PNG). Driven by ``configs/lm/<preset>.toml`` of this package, read into a typed
``LMStudyConfig`` by ``load_study_config`` (``longsparse_experiments.lm_config``); ``longsparse lm run [--quick]``.
The corpus, tokenizers, token streams, passkey rows and evaluation are the library's ``longsparse.lm``; each
run is the library's one trainer (``longsparse.train.train``) on the task ``lm`` (``longsparse.tasks.CorpusLM``),
so an LM run folder is an ordinary run folder (``config.json``, ``checkpoints/last.pt``, ``metrics.jsonl``).

Every step is resumable: a completed run is not retrained, a killed one resumes from its last checkpoint, and a
run with ``eval.json`` (for the same eval config) is not re-evaluated.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from longsparse.io import atomic_write_text, check_outputs, read_json, read_json_or_none
from longsparse.lm.evaluate import bucket_positions, passkey_accuracy, perplexity_by_length
from longsparse.lm.streams import prepare
from longsparse.models import load_checkpoint
from longsparse.train import ConfigError, train
from longsparse.train.config import attention_of, load_toml
from longsparse.train.rundir import checkpoint_path
from longsparse_experiments.lm_config import LMEval, LMStudyConfig, load_study_config, run_model_section
from longsparse_experiments.lm_report import (
    LM_REPORT_OUTPUTS,
    LM_REPORT_WRITER,
    LM_STUDY,
    build_lm_report,
    store_lm_results,
)


# ---- one run ----------------------------------------------------------------------------------------------
def run_config(cfg: LMStudyConfig, method: str, positions: str, seed: int, cache_dir: Optional[str] = None) -> dict:
    """The library run config of one LM run: the task ``lm`` on the study's corpus, the study's model with
    ``method`` / ``positions``, and its training budget at the fixed length ``seq_len`` (validation: perplexity on
    ``val_windows`` validation windows of that length, at the end only; the last checkpoint is evaluated).
    ``cache_dir``: where the tokenizer and token streams are cached (not part of the run's identity)."""
    d, t = cfg.data, cfg.train
    T = t.seq_len
    return {
        "task": {
            "name": "lm",
            "params": {
                "corpus": d.corpus,
                "tokenizer": d.tokenizer,
                "tokenizer_vocab": d.vocab_size,
                "passkey_frac": t.passkey_frac,
                "passkey_digits": t.passkey_digits,
                "cache_dir": cache_dir,
            },
        },
        "model": run_model_section(cfg.model, method, positions),
        "train": {
            "steps": t.steps,
            "batch_size": t.batch_size,
            "lr": t.lr,
            "warmup_steps": t.warmup_steps,
            "min_lr_ratio": t.min_lr_ratio,
            "betas": list(t.betas),
            "grad_clip": t.grad_clip,
            "seed": seed,
            "threads": t.threads,
            "log_every": t.log_every,
            "ckpt_every": t.ckpt_every,
            "train_lengths": [T, T],
            "val_every": 0,
            "val_lengths": [T],
            "val_samples": t.val_windows,
        },
    }


def _run_facts(run_dir: Path) -> dict:
    """What evaluation needs from an LM run folder's config: training length, passkey digits, method, positions,
    seed, threads, and the path of its last checkpoint (whose ``extra`` holds the step and the update seconds)."""
    rc = read_json(run_dir / "config.json")
    return {
        "T": rc["train"]["train_lengths"][1],
        "digits": rc["task"]["params"]["passkey_digits"],
        "method": attention_of(rc)["method"],
        "positions": attention_of(rc)["positions"],
        "seed": rc["train"]["seed"],
        "threads": rc["train"].get("threads"),
        "checkpoint": checkpoint_path(run_dir, "last"),
    }


def evaluate_lm_run(run_dir, ev: LMEval, tok, tokens, printer: Callable = print, split: str = "test") -> dict:
    """Evaluate the last checkpoint of the LM run folder ``run_dir`` on the token stream ``tokens[split]``
    (``tokenizer``: the study's): perplexity by length and per position, passkey exact match by length and depth,
    as ``ev`` says; written to ``run_dir/eval.json`` (with ``ev`` in its JSON form, ``eval_config``) and returned.
    An ``eval.json`` of the same eval config and split is returned as it is (an older one without the per-position
    delta gets it added)."""
    run_dir = Path(run_dir)
    eval_config = ev.as_dict()  # what eval.json stores and compares: JSON lists, never tuples
    facts = _run_facts(run_dir)
    T = facts["T"]
    out_path = run_dir / "eval.json"
    old = None
    if out_path.exists():
        old = read_json_or_none(out_path, lambda m: printer(f"warning: {m}; evaluating again"))
        if not isinstance(old, dict) or old.get("eval_config") != eval_config or old.get("split") != split:
            old = None
        elif "per_position_delta_nll" in old:
            return old
    if facts["threads"]:
        torch.set_num_threads(facts["threads"])
    model, extra = load_checkpoint(str(facts["checkpoint"]))
    model.eval()
    stream = tokens[split]
    t0 = time.perf_counter()
    lengths = sorted({max(1, int(round(m * T))) for m in ev.length_mults})
    ppl = perplexity_by_length(
        model, stream, lengths, ev.n_windows, ev.batch_tokens, ref_length=T if T in lengths else None
    )
    t_ppl = time.perf_counter() - t0
    per_pos = ppl[max(lengths)].pop("per_position")
    per_pos_delta = ppl[max(lengths)].pop("per_position_delta", None)
    if old is not None:  # an evaluation from before the delta existed: add it, keep the rest
        old.update(
            {
                "per_position_nll": per_pos,
                "per_position_delta_nll": per_pos_delta,
                "position_buckets": bucket_positions(per_pos, T),
                "position_delta_buckets": _delta_buckets(per_pos_delta, T),
            }
        )
        atomic_write_text(out_path, json.dumps(old, indent=1) + "\n")
        return old
    pk_lengths = [int(m * T) for m in ev.passkey_mults]
    pk = passkey_accuracy(
        model,
        tok,
        stream,
        pk_lengths,
        ev.passkey_depths,
        ev.passkey_samples,
        n_digits=facts["digits"],
        batch_tokens=ev.batch_tokens,
    )
    res = {
        "run": run_dir.name,
        "method": facts["method"],
        "positions": facts["positions"],
        "seed": facts["seed"],
        "seq_len": T,
        "split": split,
        "eval_config": eval_config,
        "train_wall_s": round(float(extra.get("train_seconds", 0.0)), 1),
        "params": model.num_parameters(),
        "steps": extra.get("step"),
        "perplexity": {str(L): v for L, v in ppl.items()},
        "per_position_nll": per_pos,
        "position_buckets": bucket_positions(per_pos, T),
        "per_position_delta_nll": per_pos_delta,
        "position_delta_buckets": _delta_buckets(per_pos_delta, T),
        "passkey": {str(L): v for L, v in pk.items()},
        "eval_wall_s": {"perplexity": round(t_ppl, 1), "total": round(time.perf_counter() - t0, 1)},
    }
    atomic_write_text(out_path, json.dumps(res, indent=1) + "\n")
    printer(
        f"{run_dir.name}: ppl "
        + "  ".join(f"{L // 1}:{v['ppl']:.1f}" for L, v in ppl.items())
        + " | passkey "
        + "  ".join(f"{L}:{v['accuracy']:.2f}" for L, v in pk.items())
        + f"  ({res['eval_wall_s']['total']:.0f} s)"
    )
    return res


def _delta_buckets(delta, T: int):
    if delta is None:
        return None
    return [{"start": b["start"], "end": b["end"], "delta_nll": b["nll"]} for b in bucket_positions(delta, T)]


def run_name(method: str, positions: str, seed: int) -> str:
    """The folder of an LM run (and, under ``lm/``, its run in the results store)."""
    return f"{method}-{positions}-s{seed}"


def train_and_evaluate(
    cfg: LMStudyConfig,
    method: str,
    positions: str,
    seed: int,
    run_dir: Path,
    streams: tuple,
    cache_dir: Optional[str],
    printer: Callable = print,
) -> dict:
    """Train (or resume, or find complete) the LM run ``run_dir`` of ``method`` / ``positions`` / ``seed`` and
    evaluate its last checkpoint on the test stream (``streams``: the tokenizer and token streams of ``prepare``);
    returns the evaluation (its ``eval.json``)."""
    printer(f"== {run_dir.name}")
    train(run_config(cfg, method, positions, seed, cache_dir), str(run_dir), printer=printer, progress=False)
    return evaluate_lm_run(run_dir, cfg.eval, *streams, printer=printer)


def run_study(
    cfg: LMStudyConfig,
    out,
    *,
    methods: Optional[Sequence[str]] = None,
    positions: Optional[Sequence[str]] = None,
    seeds: Optional[Sequence[int]] = None,
    report_dir: Optional[str] = None,
    printer: Callable = print,
) -> dict:
    """Prepare the corpus, then train and evaluate every run of ``cfg.study`` (``methods`` / ``positions`` /
    ``seeds``, when given, replace the config's; checked before anything runs) into ``out/<method>-<positions>-
    s<seed>``, seed-major; a report of the whole folder into ``report_dir`` when given. Returns {"results": the
    evaluations, "report": build_lm_report's answer or None}."""
    grid = cfg.study
    cfg = replace(
        cfg,
        study=replace(
            grid,
            methods=tuple(methods or grid.methods),
            positions=tuple(positions or grid.positions),
            seeds=grid.seeds if seeds is None else tuple(seeds),
        ),
    )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cache_dir = str(out / "data") if cfg.data.is_sample else None
    tok, tokens = prepare(cfg.data.as_dict(), cache_dir=cache_dir, printer=printer)
    results = []
    t0 = time.perf_counter()
    for seed in cfg.study.seeds:  # seed-major: a cut study still has every method at seed 0
        for pos in cfg.study.positions:
            for method in cfg.study.methods:
                run_dir = out / run_name(method, pos, seed)
                results.append(train_and_evaluate(cfg, method, pos, seed, run_dir, (tok, tokens), cache_dir, printer))
    printer(f"study: {len(results)} run(s) in {time.perf_counter() - t0:.0f} s")
    rep = None
    if report_dir is not None:
        rep = build_lm_report([out], report_dir, printer=printer)
    return {"results": results, "report": rep}


# ---- the study as cells of `longsparse reproduce lm` ----------------------------------------------------------
FILE_KEYS = ("report", "description", "preset", "study")
STUDY_KEYS = ("name", "methods", "positions", "seeds")


@dataclass(frozen=True)
class LMCell:
    """One run of an LM study file: ``run`` is its folder below ``OUT/lm`` and, as ``lm/<run>``, its run in the
    results store."""

    study: str
    method: str
    positions: str
    seed: int
    run: str


@dataclass(frozen=True)
class LMStudyFile:
    """An LM study file (``report = "lm"``): the LM preset every run is made by (``config``: corpus, model,
    training, evaluation) and the cells of its ``[[study]]`` grids, in file order, each grid seed-major."""

    path: str
    preset: str
    config: LMStudyConfig
    cells: tuple[LMCell, ...]


def load_lm_study(path: str | Path) -> LMStudyFile:
    """The LM study file ``path``: ``preset`` names ``configs/lm/<preset>.toml``; each ``[[study]]`` has a
    ``name`` and the ``methods``, ``positions`` and ``seeds`` of its runs (each checked as the preset's own
    ``[study]`` is, with the preset's model). Raises ConfigError naming the file and the problem."""
    raw = load_toml(path)
    unknown = sorted(set(raw) - set(FILE_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; an LM study file has {', '.join(FILE_KEYS)}")
    preset, tables = raw.get("preset"), raw.get("study")
    if not isinstance(preset, str) or not isinstance(tables, list) or not tables:
        raise ConfigError(f"{path}: needs preset = NAME (configs/lm/NAME.toml) and at least one [[study]] table")
    cfg, cells, names = load_study_config(preset), [], set()
    for i, t in enumerate(tables):
        where = f"{path}: study #{i + 1}"
        if not isinstance(t, dict):
            raise ConfigError(f"{where}: must be a [[study]] table, got {t!r}")
        bad = sorted(set(t) - set(STUDY_KEYS)) + [k for k in STUDY_KEYS if k not in t]
        if bad:
            raise ConfigError(f"{where}: unknown or missing key(s) {bad}; a study has {', '.join(STUDY_KEYS)}")
        if not isinstance(t["name"], str) or not t["name"] or t["name"] in names:
            raise ConfigError(f"{where}: name must be a non-empty string, unique in the file, got {t['name']!r}")
        names.add(t["name"])
        try:
            grid = replace(cfg, study=replace(cfg.study, **{k: t[k] for k in STUDY_KEYS[1:]})).study
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        cells += [
            LMCell(t["name"], m, pos, seed, run_name(m, pos, seed))
            for seed in grid.seeds
            for pos in grid.positions
            for m in grid.methods
        ]
    runs = [c.run for c in cells]
    if len(set(runs)) != len(runs):
        raise ConfigError(f"{path}: two studies share the run(s) {sorted({r for r in runs if runs.count(r) > 1})}")
    return LMStudyFile(str(path), preset, cfg, tuple(cells))


def is_stored(study: LMStudyFile, cell: LMCell, latest: dict) -> bool:
    """Whether ``latest`` (run -> its latest ``lm_eval`` in the store) holds ``cell``'s evaluation as the study
    makes it: the preset's evaluation config, test split, training length and step count."""
    ev = latest.get(f"{LM_STUDY}/{cell.run}")
    t = study.config.train
    return ev is not None and (ev.get("eval_config"), ev.get("split"), ev.get("seq_len"), ev.get("steps")) == (
        study.config.eval.as_dict(),
        "test",
        t.seq_len,
        t.steps,
    )


def run_reproduce(args, spec) -> int:
    """`longsparse reproduce` of a study file with ``report = "lm"`` (``args``: its parsed command line): train
    and evaluate every cell whose evaluation the store lacks into ``OUT/lm/<run>``, append each to the store,
    then the report (tables, JSON, plots) from the store."""
    from longsparse.report import store as result_store
    from longsparse_experiments.jobs import refuse_job_options

    refuse_job_options(args, "lm", also=[("shard", "--shard")])
    study = load_lm_study(spec.path)
    only = [x for x in args.only.split(",") if x] if args.only else None
    if only and set(only) - {c.study for c in study.cells}:
        known = sorted({c.study for c in study.cells})
        raise ConfigError(f"--only: unknown {sorted(set(only) - set(known))}; the study file has {known}")
    cells = [c for c in study.cells if not only or c.study in only]
    out = Path(args.out or f"runs/reproduce-lm{'-quick' * args.quick}")  # not another study's folders or store
    report = Path(args.report or out / "report")
    store = Path(args.store) if args.store else report
    check_outputs(report, LM_REPORT_OUTPUTS, LM_REPORT_WRITER)  # before any work
    latest = {r["run"]: r["lm_eval"] for r in result_store.read_records(store) if "lm_eval" in r}
    todo = []
    for c in [] if args.report_only else cells:
        if is_stored(study, c, latest):
            print(f"{LM_STUDY}/{c.run}: its evaluation is in the store; skipped")
        else:
            todo.append(c)
    if args.dry_run:
        for c in todo:
            print(
                f"{LM_STUDY}/{c.run}: would train ({study.config.train.steps} steps) and evaluate, as `longsparse "
                f"lm run --preset {study.preset} --methods {c.method} --positions {c.positions} --seeds {c.seed}`"
            )
        return 0
    if todo:
        cache_dir = str(out / "data") if study.config.data.is_sample else None
        streams = prepare(study.config.data.as_dict(), cache_dir=cache_dir)
        for c in todo:
            run_dir = out / LM_STUDY / c.run
            train_and_evaluate(study.config, c.method, c.positions, c.seed, run_dir, streams, cache_dir)
            store_lm_results([run_dir], store)
    build_lm_report([], report, store_dir=store)
    return 0


# ---- command line (registered in longsparse_experiments.cli) -----------------------------------------------------
def add_cli(sub) -> None:
    """Register ``longsparse lm`` on the top-level subparsers (``longsparse data``, which fetches the corpus, is
    the library's)."""
    lm = sub.add_parser("lm", help="language-modelling study: perplexity + passkey beyond the training length")
    lsub = lm.add_subparsers(dest="lm_command", required=True)
    r = lsub.add_parser("run", help="prepare, train every method/positions/seed, evaluate, report (resumable)")
    r.add_argument("--preset", default="cpu", help="src/longsparse_experiments/configs/lm/<preset>.toml (default cpu)")
    r.add_argument("--config", default=None, help="a TOML file instead of the preset")
    r.add_argument("--quick", action="store_true", help="the committed sample + tiny models (seconds)")
    r.add_argument("--out", default=None, help="run folder (default runs/lm, runs/lm-quick with --quick)")
    r.add_argument("--methods", default=None, help="comma list (default: the config's)")
    r.add_argument("--positions", default=None, help="comma list (default: the config's)")
    r.add_argument("--seeds", default=None, help="comma list (default: the config's)")
    r.add_argument("--steps", type=int, default=None, help="override train.steps")
    r.add_argument("--report", default=None, help="write tables/JSON/PNG here (default OUT/report)")
    r.set_defaults(func=_cli_lm_run)
    r.add_argument("--store", default=None, help="also append the evaluations to this results store (e.g. results/lm)")
    p = lsub.add_parser("report", help="tables + JSON + PNG from evaluated LM runs or a results store")
    p.add_argument(
        "runs",
        nargs="*",
        help="study folders, run folders, eval.json files or a saved lm_results.json (none: the runs of --store)",
    )
    p.add_argument("--out", required=True)
    p.add_argument(
        "--store",
        default=None,
        help="results store (e.g. results/lm): with runs, their evaluations "
        "are appended to it; without, the report is rendered from it",
    )
    p.set_defaults(func=_cli_lm_report)


def _csv(s, typ=str):
    return None if s is None else [typ(x) for x in s.split(",") if x.strip()]


def _cli_lm_run(args) -> int:
    cfg = load_study_config("quick" if args.quick else args.preset, args.config)
    if args.steps is not None:
        try:
            cfg = replace(cfg, train=replace(cfg.train, steps=args.steps))
        except ConfigError as e:
            raise ConfigError(f"--steps: {e}") from None
    out = args.out or ("runs/lm-quick" if args.quick else "runs/lm")
    run_study(
        cfg,
        out,
        methods=_csv(args.methods),
        positions=_csv(args.positions),
        seeds=_csv(args.seeds, int),
        report_dir=args.report or str(Path(out) / "report"),
    )
    if args.store:
        store_lm_results([out], args.store)
    return 0


def _cli_lm_report(args) -> int:
    build_lm_report(args.runs, args.out, store_dir=args.store)
    return 0
