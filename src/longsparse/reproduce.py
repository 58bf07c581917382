"""`longsparse reproduce synthetic`: the length-generalisation study of docs/results.md, rerunnable.

    longsparse reproduce synthetic [--quick] [--out runs/reproduce] [--report docs/results] [--only sort,copy]

The study is ``src/longsparse/configs/reproduce/synthetic.toml`` (``--quick``: ``synthetic-quick.toml``): a list of cells
(task × method × positions × seed), each trained with ``longsparse train``'s loop from the task's preset plus the
cell's ``sets``, then evaluated at every length with the best and the last checkpoint. Everything is resumable:
a finished training is not redone (an interrupted one resumes from its last checkpoint), an evaluation whose
(checkpoint, length, samples, seed) already has a result file is skipped. The report (markdown tables, JSON,
PNG per study) is rebuilt from the saved evaluation JSON and the archive below, never from anything else.

The report's ``results.json`` is also the study's archive: run folders (checkpoints, eval files) live outside git
and are gone on a fresh machine, so a rebuild keeps every per-seed result of the previous ``results.json`` that
no run folder replaces, and a cell whose results are all archived is not trained again. An archived cell whose
recorded config hash differs from the study file's current one is dropped (with a message), never mixed in.
The CLI updates the archive (``results.json``; tables and plots only at the end of the command) after every
cell that trained or evaluated something, so the archive holds every cell a session finished.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from longsparse.io import atomic_savefig, atomic_write_text, read_jsonl
from longsparse.train.config import ConfigError, build_config, config_hash, configs_dir, load_toml, resolve

FORMAT = "longsparse-reproduce"
CHECKPOINTS = ("best", "last")


def load_study(name: str = "synthetic", quick: bool = False, path: Optional[str] = None) -> dict:
    """The study file, validated and with defaults filled in: ``{"path": ..., "studies": [study, ...]}``.

    A ``[[study]]`` may say ``like = "<earlier study>"`` to take that study's settings (not its name or
    description) and override some of them; ``more_sets = [...]`` appends train overrides to the ``sets``
    it has (the later of two settings of one key wins), so a variant names only what it changes."""
    p = Path(path) if path else configs_dir() / "reproduce" / f"{name}{'-quick' if quick else ''}.toml"
    if not p.is_file():
        raise ConfigError(f"no study file {p}")
    raw = load_toml(p)
    studies = raw.get("study")
    if not isinstance(studies, list) or not studies:
        raise ConfigError(f"{p}: needs at least one [[study]] table")
    defaults = raw.get("defaults", {})
    out = []
    for i, s in enumerate(studies):
        if "like" in s:      # inherit an earlier study's settings (not its name/description), then override
            base = next((dict(b) for b in out if b["name"] == s["like"]), None)
            if base is None:
                raise ConfigError(f"{p}: study #{i + 1}: like = {s['like']!r} names no earlier study")
            for k in ("name", "description"):
                base.pop(k, None)
            s = {**base, **{k: v for k, v in s.items() if k != "like"}}
        s = {**defaults, **s}
        if "more_sets" in s:
            s["sets"] = [*s.get("sets", []), *s.pop("more_sets")]
        missing = [k for k in ("name", "task", "methods", "positions", "seeds", "lengths", "samples") if k not in s]
        if missing:
            raise ConfigError(f"{p}: study #{i + 1} lacks {missing}")
        unknown = sorted(set(s) - {"name", "task", "preset", "methods", "positions", "seeds", "lengths", "samples",
                                   "long_samples", "long_from", "id_samples", "sets", "method_sets",
                                   "description", "checkpoints", "test_seed"})
        if unknown:
            raise ConfigError(f"{p}: study {s['name']!r} has unknown key(s) {unknown}")
        _check_study(p, s)
        s.setdefault("preset", "cpu")
        s.setdefault("sets", [])
        s.setdefault("method_sets", {})
        s.setdefault("long_samples", s["samples"])
        s.setdefault("long_from", max(s["lengths"]) + 1)
        s.setdefault("id_samples", s["samples"])
        s.setdefault("checkpoints", list(CHECKPOINTS))
        s.setdefault("test_seed", 0)
        out.append(s)
    names = [s["name"] for s in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"{p}: study names must be unique, got {names}")
    return {"path": str(p), "studies": out}


def _check_study(path: Path, s: dict) -> None:
    """Fail before any training on what would fail later (unknown task/method/positions, impossible length)."""
    from longsparse.nn.config import METHODS
    from longsparse.nn.positions import POSITIONS
    from longsparse.tasks import get_task

    where = f"{path}: study {s['name']!r}"
    try:
        task = get_task(s["task"], s.get("preset", "cpu"))
        for L in s["lengths"]:
            task.check_length(L)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    if list(s["lengths"]) != sorted(set(s["lengths"])):
        raise ConfigError(f"{where}: lengths must be increasing (the first is the in-distribution one), "
                          f"got {s['lengths']}")
    for key in ("samples", "long_samples", "id_samples"):
        v = s.get(key, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{where}: {key} must be an integer >= 1, got {v!r}")
    ts = s.get("test_seed", 0)
    if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
        raise ConfigError(f"{where}: test_seed must be an integer >= 0, got {ts!r}")
    for key, known in (("methods", METHODS), ("positions", POSITIONS), ("checkpoints", CHECKPOINTS)):
        bad = [x for x in s.get(key, known) if x not in known]
        if bad:
            raise ConfigError(f"{where}: unknown {key} {bad}; known: {', '.join(known)}")


def samples_for(study: dict, length: int) -> int:
    """Examples evaluated at ``length``: ``id_samples`` at the first (in-distribution) length, where the
    ≥ 99 % bar is checked, ``long_samples`` from ``long_from`` on, ``samples`` in between."""
    if length == study["lengths"][0]:
        return study["id_samples"]
    return study["long_samples"] if length >= study["long_from"] else study["samples"]


def cells(study: dict) -> list[dict]:
    """Every (method, positions, seed) of a study with its run sub-folder and train overrides; seed-major, so
    that a partial run has every method at the first seed before any at the second."""
    out = []
    for seed in study["seeds"]:
        for m in study["methods"]:
            for pos in study["positions"]:
                out.append({"method": m, "positions": pos, "seed": seed,
                            "run": f"{study['name']}/{m}-{pos}-s{seed}",
                            "sets": [*study["sets"], *study["method_sets"].get(m, [])]})
    return out


def parse_shard(text: Optional[str]) -> tuple[int, int]:
    """``"K/N"`` -> (K, N): this process takes every N-th cell starting at the K-th (0-based)."""
    if not text:
        return 0, 1
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard must look like K/N (e.g. 0/2), got {text!r}") from None
    if n < 1 or not 0 <= k < n:
        raise ValueError(f"--shard K/N needs 0 <= K < N, got {text!r}")
    return k, n


def load_archive(report_dir: str | Path) -> Optional[dict]:
    """The ``results.json`` of an earlier report in ``report_dir`` (None if there is none yet). A file that is not
    such a report is an error: building over it would lose what it holds."""
    p = Path(report_dir) / "results.json"
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{p} is not readable JSON ({e}); it is the archive of earlier results, so nothing was "
                          "written: repair it (git checkout) or choose another --report") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("studies"), dict):
        raise ConfigError(f"{p} is not a {FORMAT} report; nothing was written: choose another --report")
    return data


def cell_config(study: dict, cell: dict) -> dict:
    """The training config of a cell: the task's preset plus the study's and the method's overrides."""
    return build_config(study["task"], preset=study["preset"], method=cell["method"], positions=cell["positions"],
                        seed=cell["seed"], sets=cell["sets"])


def cell_hash(cfg: dict) -> str:
    """The config hash a cell's run folder gets (the identity that training resumes under)."""
    return config_hash(resolve(cfg))


def archived(archive: Optional[dict], study: dict, cell: dict, chash: str) -> tuple[dict[tuple[str, int], dict], int]:
    """A cell's results in the archive, ``{(checkpoint, length): per-seed record}``, for the lengths and sample
    counts the study asks for now, and how many other archived results of the cell that leaves out. Nothing is
    taken if the archive's record of the run names another config hash (records written before hashes were kept
    carry none and are taken as they are)."""
    sd = (archive or {}).get("studies", {}).get(study["name"], {})
    by_ck = sd.get("series", {}).get(f"{cell['method']}/{cell['positions']}", {})
    mine = {(ck, int(L)): per["per_seed"][str(cell["seed"])] for ck, by_L in by_ck.items()
            for L, per in by_L.items() if str(cell["seed"]) in per.get("per_seed", {})}
    if sd.get("runs", {}).get(cell["run"], {}).get("config_hash") not in (None, chash):
        return {}, len(mine)
    kept = {(ck, L): r for (ck, L), r in mine.items()
            if ck in study["checkpoints"] and L in study["lengths"] and r.get("n") == samples_for(study, L)}
    return kept, len(mine) - len(kept)


def _evaluated(run: Path, seed: int = 0) -> set[tuple[str, int, int]]:
    """(checkpoint, length, samples) already evaluated on test seed ``seed`` in ``run/eval`` (one read per file)."""
    done = set()
    for f in sorted((run / "eval").glob("*.json")) if (run / "eval").is_dir() else []:
        try:
            d = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):     # an evaluation killed before its first length
            continue
        if d.get("seed") == seed:
            done.update((d.get("checkpoint"), int(r["length"]), d.get("samples")) for r in d.get("results", []))
    return done


def _to_evaluate(study: dict, run: Path) -> list[tuple[str, int, list[int]]]:
    """(checkpoint, samples, lengths) still to evaluate in ``run`` on the study's test stream: one entry per
    evaluation call."""
    done, out = _evaluated(run, study["test_seed"]), []
    for ck in study["checkpoints"]:
        by_n: dict[int, list[int]] = {}
        for L in study["lengths"]:
            n = samples_for(study, L)
            if (ck, L, n) not in done:
                by_n.setdefault(n, []).append(L)
        out += [(ck, n, lengths) for n, lengths in by_n.items()]
    return out


def selected(study: dict, only: Sequence[str], spec: dict) -> bool:
    """Whether ``--only`` picks ``study``: an entry that is a study's name picks that study alone; any other
    entry picks every study of that task (so ``--only mqmtar_inline`` is not also its _3l/_rope variants)."""
    names = {s["name"] for s in spec["studies"]}
    return study["name"] in only or any(x not in names and x == study["task"] for x in only)


def run_study(spec: dict, out: str | Path, *, only: Optional[Sequence[str]] = None, shard: tuple[int, int] = (0, 1),
              archive: Optional[dict] = None, dry_run: bool = False,
              after_cell: Optional[Callable[[], None]] = None,
              printer: Callable[[str], None] = print) -> list[Path]:
    """Train and evaluate every cell (resumable); returns the run folders. ``shard=(K, N)`` takes every N-th
    of the selected cells (after ``only``) from the K-th, so N processes (one per core) can share a study;
    the same run is never trained by two processes at once (run directories are locked). A cell whose every
    evaluation is in ``archive`` (an earlier report, see ``load_archive``) and that has no run folder here is
    skipped: it was run on another machine. A cell that is trained again is evaluated again at every length, so
    each seed's numbers come from one model (the report prints any archived number that changes).
    ``dry_run``: only print what would be done. ``after_cell`` is called after each cell that trained or evaluated
    anything (the CLI updates the archive there, so a session that ends mid-study keeps its finished cells)."""
    from longsparse.evaluate import evaluate_run
    from longsparse.train import train

    out = Path(out)
    runs, index = [], -1
    for study in spec["studies"]:
        if only and not selected(study, only, spec):
            continue
        for c in cells(study):
            index += 1
            if index % shard[1] != shard[0]:
                continue
            run = out / c["run"]
            cfg = cell_config(study, c)
            old, _ = archived(archive, study, c, cell_hash(cfg))
            if not run.exists() and len(old) == len(study["checkpoints"]) * len(study["lengths"]):
                printer(f"{c['run']}: every result is in the archive (run elsewhere); skipped")
                continue
            if dry_run:
                pairs = sum(len(lengths) for _, _, lengths in _to_evaluate(study, run))
                steps = cfg["train"]["steps"]
                # the loop always logs the loss of its last step, so metrics.jsonl tells a finished run
                done = _train_record(run)["steps"] if run.exists() else None
                if done is not None and done >= steps:
                    plan = f"trained already ({done} steps)"
                elif run.exists():    # stopped, or still training in another process
                    plan = (f"partly trained ({done or 0} of {steps} steps logged); would resume from its last "
                            f"checkpoint")
                else:
                    plan = f"would train ({steps} steps; new)"
                printer(f"{c['run']}: {plan} and would evaluate {pairs} (checkpoint, length) pairs")
                continue
            t0 = time.perf_counter()
            printer(f"{c['run']}: training ({cfg['train']['steps']} steps; log in {run / 'train.log'})")
            res = train(cfg, str(run), progress=False, printer=lambda s: None)
            if res["trained_steps"]:
                printer(f"{c['run']}: trained to step {res['step']} in {time.perf_counter() - t0:.0f} s, "
                        f"loss {res['first_loss']:.3f} -> {res['last_loss']:.3f}")
            pending = _to_evaluate(study, run)
            for ck, n, lengths in pending:
                evaluate_run(run, lengths, samples=n, checkpoint=ck, seed=study["test_seed"], printer=printer)
            runs.append(run)
            if after_cell is not None and (res["trained_steps"] or pending):    # only when something new is saved
                after_cell()
    return runs


# ---- report ------------------------------------------------------------------------------------------------
def _train_record(run: Path) -> dict:
    """Steps, wall clock (first to last training record of metrics.jsonl), the final logged loss and the
    config hash of the run (what an archived result is matched against later)."""
    from longsparse.train.rundir import read_config

    rec = {"steps": None, "train_seconds": None, "final_loss": None,
           "config_hash": config_hash(read_config(run)) if (run / "config.json").is_file() else None}
    mfile = run / "metrics.jsonl"
    if mfile.is_file():
        from datetime import datetime

        lines = read_jsonl(mfile)    # a run still training may have a torn last line
        steps = [x for x in lines if "loss" in x]
        if steps:
            t = [datetime.fromisoformat(x["time"]) for x in steps]
            rec["steps"] = steps[-1]["step"]
            rec["train_seconds"] = round((t[-1] - t[0]).total_seconds(), 1)
            rec["final_loss"] = round(steps[-1]["loss"], 5)
    return rec


def _run_results(run: Path, study: dict) -> tuple[dict[tuple[str, int], dict], Optional[int], Optional[float]]:
    """A run folder's evaluations, ``{(checkpoint, length): per-seed record}`` at the study's lengths and sample
    counts (a later file wins), the training length the model saw at most, and the evaluation wall clock of
    those records (seconds, summed; None without any)."""
    from longsparse.report import collect as collect_runs

    res, train_hi, seconds = {}, None, {}
    for f in sorted((run / "eval").glob("*.json")) if (run / "eval").is_dir() else []:
        try:
            d = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):    # an evaluation killed before its first length
            continue
        if d.get("checkpoint") not in study["checkpoints"] or d.get("seed", 0) != study["test_seed"]:
            continue
        train_hi = d["train_lengths"][1]
        for L, r in collect_runs([f])[0]["results"].items():
            if L in study["lengths"] and r["n"] == samples_for(study, L):
                res[(d["checkpoint"], L)] = {"exact_match": r["exact_match"], "ci": r["exact_match_ci"], "n": r["n"],
                                             "token_accuracy": r["token_accuracy"],
                                             "checkpoint_step": d.get("checkpoint_step")}
                seconds[(d["checkpoint"], L)] = r.get("seconds")
    timed = [x for x in seconds.values() if x is not None]
    return res, train_hi, round(sum(timed), 1) if timed else None


def collect(spec: dict, out: str | Path, archive: Optional[dict] = None,
            printer: Callable[[str], None] = print) -> dict:
    """Per study: per (method/positions, checkpoint, length) the seeds' exact match (and n, CI per seed), from the
    run folders under ``out`` and, for what no run folder holds, from ``archive`` (an earlier report)."""
    out = Path(out)
    data = {"format": FORMAT, "study_file": spec["path"], "studies": {}}
    for study in spec["studies"]:
        old_sd = (archive or {}).get("studies", {}).get(study["name"], {})
        sd = {"task": study["task"], "preset": study["preset"], "lengths": study["lengths"], "series": {},
              "runs": {}, "test_seed": study["test_seed"]}
        if "train_hi" in old_sd:
            sd["train_hi"] = old_sd["train_hi"]
        for c in cells(study):
            run, chash = out / c["run"], cell_hash(cell_config(study, c))
            (old, dropped), old_rec = archived(archive, study, c, chash), old_sd.get("runs", {}).get(c["run"])
            if dropped:
                stale = (old_rec or {}).get("config_hash") not in (None, chash)
                why = (f"recorded for config {old_rec['config_hash']}, the study file now gives {chash}" if stale
                       else "at lengths or sample counts the study no longer asks for")
                printer(f"{c['run']}: {dropped} archived results dropped: {why}")
            new, train_hi, eval_seconds = _run_results(run, study)
            for k in old.keys() & new.keys():
                if old[k]["exact_match"] != new[k]["exact_match"]:
                    printer(f"{c['run']}: {k[0]} checkpoint at {k[1]}: archived exact match "
                            f"{old[k]['exact_match']:.4f} replaced by this run folder's {new[k]['exact_match']:.4f}")
            results = {**old, **new}
            if not results:
                continue
            if train_hi is not None:
                sd["train_hi"] = train_hi
            sd["runs"][c["run"]] = ({**_train_record(run), "eval_seconds": eval_seconds}
                                    if (run / "metrics.jsonl").is_file() else old_rec)
            by_ck = sd["series"].setdefault(f"{c['method']}/{c['positions']}", {})
            for ck in study["checkpoints"]:
                for L in study["lengths"]:
                    if (ck, L) in results:
                        by_ck.setdefault(ck, {}).setdefault(str(L), {})[str(c["seed"])] = results[(ck, L)]
        for by_ck in sd["series"].values():
            for by_L in by_ck.values():
                for L, per in by_L.items():
                    ems = [v["exact_match"] for v in per.values()]
                    per_summary = {"mean": statistics.fmean(ems), "min": min(ems), "max": max(ems),
                                   "std": statistics.stdev(ems) if len(ems) > 1 else 0.0, "seeds": len(ems)}
                    by_L[L] = {"per_seed": per, **per_summary}
        data["studies"][study["name"]] = sd
    return data


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def markdown(data: dict, checkpoint: str) -> str:
    """One table per study: rows = lengths, columns = method/positions (with its number of seeds), cells = mean
    [min–max] over seeds (and "(s=k)" where fewer seeds than the column's are evaluated at that length)."""
    parts = []
    for name, sd in data["studies"].items():
        keys = list(sd["series"])
        if not keys:
            continue
        train_hi = sd.get("train_hi", 64)
        seeds = {k: max((r["seeds"] for r in sd["series"][k].get(checkpoint, {}).values()), default=0) for k in keys}
        head = "| length | × |" + "".join(f" {k} ({seeds[k]} seed{'s' * (seeds[k] != 1)}) |" for k in keys)
        parts.append(f"**{name}** ({checkpoint} checkpoint; exact match %, mean [min–max] over seeds)\n\n{head}\n"
                     + "|---:|---:|" + "---:|" * len(keys))
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
        keys = list(sd["series"])
        if not keys:
            continue
        seeds = sorted({int(x) for k in keys for r in sd["series"][k].get(checkpoint, {}).values()
                        for x in r["per_seed"]})
        train_hi = sd.get("train_hi", 64)
        parts.append(f"**{name}** ({checkpoint} checkpoint; exact match % per seed: "
                     + " / ".join(f"s{x}" for x in seeds) + ")\n\n| length | × |" + "".join(f" {k} |" for k in keys)
                     + "\n|---:|---:|" + "---:|" * len(keys))
        for L in sd["lengths"]:
            row = f"| {L} | {L / train_hi:g} |"
            for k in keys:
                per = sd["series"][k].get(checkpoint, {}).get(str(L), {}).get("per_seed", {})
                row += " " + " / ".join(_pct(per[str(x)]["exact_match"]) if str(x) in per else "–"
                                        for x in seeds) + " |"
            parts.append(row)
        parts.append("")
    return "\n".join(parts)


def plot(data: dict, out_dir: Path) -> list[Path]:
    """Per study: exact match vs length (log x), mean over seeds with the min–max band; best and last panels."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    paths = []
    for name, sd in data["studies"].items():
        if not sd["series"]:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        for ax, ck in zip(axes, CHECKPOINTS):
            for key, by_ck in sd["series"].items():
                pts = sorted((int(L), r) for L, r in by_ck.get(ck, {}).items())
                if not pts:
                    continue
                xs = [L for L, _ in pts]
                line, = ax.plot(xs, [100 * r["mean"] for _, r in pts], marker="o", label=key)
                ax.fill_between(xs, [100 * r["min"] for _, r in pts], [100 * r["max"] for _, r in pts],
                                color=line.get_color(), alpha=0.15)
            ax.set_xscale("log", base=2)
            ax.set_ylim(-3, 103)    # the full 0-100 scale: a study near 100 % must not look like a spread
            ax.set_xlabel(f"test length L (trained up to {sd.get('train_hi', 64)})")
            ax.set_title(f"{name}: {ck} checkpoint")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("exact match %: seed mean, band min–max")
        axes[1].legend(fontsize=8)
        fig.tight_layout()
        p = out_dir / f"{name}.png"
        atomic_savefig(fig, p, dpi=90)
        plt.close(fig)
        paths.append(p)
    return paths


def update_archive(spec: dict, out: str | Path, report_dir: str | Path,
                   printer: Callable[[str], None] = print) -> dict:
    """Rebuild ``report_dir/results.json`` (the archive) from the run folders under ``out`` on top of the previous
    one (so results whose run folders are gone are kept); no tables or plots. Returns the data written."""
    report_dir = Path(report_dir)
    data = collect(spec, out, load_archive(report_dir), printer)
    report_dir.mkdir(parents=True, exist_ok=True)
    # written whole, then renamed: a killed rebuild leaves the old one; the temporary name is per process because
    # the shards of a study update the same archive after each of their cells
    tmp = report_dir / f"results.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(report_dir / "results.json")
    return data


def build_report(spec: dict, out: str | Path, report_dir: str | Path, printer: Callable[[str], None] = print) -> dict:
    """The archive (``update_archive``), then tables and plots from it, in ``report_dir``."""
    report_dir = Path(report_dir)
    data = update_archive(spec, out, report_dir, printer)
    tables = "\n".join([*(markdown(data, ck) for ck in CHECKPOINTS), "### Per seed\n",
                         *(markdown_per_seed(data, ck) for ck in CHECKPOINTS)])
    atomic_write_text(report_dir / "tables.md", tables)
    pngs = plot(data, report_dir)
    printer(tables)
    printer(f"wrote {report_dir / 'results.json'}, {report_dir / 'tables.md'}"
            + "".join(f", {p}" for p in pngs))
    return {"data": data, "tables": tables, "png": pngs}


# ---- CLI ---------------------------------------------------------------------------------------------------
def add_cli(sub) -> None:
    r = sub.add_parser("reproduce", help="rerun a study from src/longsparse/configs/reproduce (train + evaluate + report)")
    r.add_argument("study", choices=["synthetic"], help="src/longsparse/configs/reproduce/<study>.toml")
    r.add_argument("--quick", action="store_true", help="the tiny smoke version (<study>-quick.toml)")
    r.add_argument("--config", default=None, help="a study TOML file instead of src/longsparse/configs/reproduce/<study>.toml")
    r.add_argument("--out", default=None, help="run folder (default runs/reproduce[-quick])")
    r.add_argument("--report", default=None,
                   help="tables/JSON/PNG here (default OUT/report); its results.json, if any, is the archive the "
                        "report is rebuilt on (results of run folders that are gone are kept; archived cells are "
                        "not retrained)")
    r.add_argument("--only", default=None,
                   help="comma list of study names, or tasks (every study of the task) where no study has that name")
    r.add_argument("--shard", default=None, help="K/N: run every N-th cell from the K-th (one process per core)")
    r.add_argument("--report-only", action="store_true", help="rebuild the report from saved results")
    r.add_argument("--dry-run", action="store_true",
                   help="print which cells would be trained / evaluated / skipped as archived; change nothing")
    r.add_argument("--analyse", default=None, metavar="A-B[,A-B...]",
                   help="only the paired seed-level analysis of the archive in --report: method pairs A - B, the "
                        "first one primary (decision at --endpoint); writes analysis.json/.md and forest.png there")
    r.add_argument("--endpoint", type=int, default=None,
                   help="the primary endpoint's test length for --analyse (default: the study's third length)")
    r.add_argument("--analysis-out", default=None,
                   help="--analyse: write analysis.json/.md and forest.png here (default: the --report folder)")
    r.add_argument("--margin", type=float, default=5.0,
                   help="--analyse: a difference within +-margin points is of no practical size (default 5)")
    r.set_defaults(func=_cli)


def _cli(args) -> int:
    spec = load_study(args.study, quick=args.quick, path=args.config)
    out = Path(args.out or ("runs/reproduce-quick" if args.quick else "runs/reproduce"))
    only = [s for s in args.only.split(",") if s] if args.only else None
    if only:
        known = {s["name"] for s in spec["studies"]} | {s["task"] for s in spec["studies"]}
        if set(only) - known:
            raise ConfigError(f"--only: unknown {sorted(set(only) - known)}; the study file has {sorted(known)}")
    shard = parse_shard(args.shard)
    report = args.report or out / "report"
    if args.analyse:
        studies = [s for s in spec["studies"] if not only or selected(s, only, spec)]
        return _analyse(studies, Path(report), Path(args.analysis_out or report), args.analyse, args.endpoint,
                        args.margin)
    if args.dry_run:
        run_study(spec, out, only=only, shard=shard, archive=load_archive(report), dry_run=True)
        return 0
    if not args.report_only:
        def after_cell() -> None:     # the archive only (cheap); tables and plots once, below
            update_archive(spec, out, report, printer=lambda s: None)
            print(f"archive updated: {Path(report) / 'results.json'}")

        run_study(spec, out, only=only, shard=shard, archive=load_archive(report), after_cell=after_cell)
    build_report(spec, out, report)
    return 0


def _analyse(studies: list[dict], report: Path, out: Path, pairs_text: str, endpoint: Optional[int],
             margin: float) -> int:
    """``--analyse``: the paired analysis (longsparse.report.paired) of ``studies`` in the archive in ``report``
    (lengths, checkpoint and in-distribution length from the first of them), written to ``out``."""
    from longsparse.report import paired

    archive = load_archive(report)
    if archive is None:
        raise ConfigError(f"{report / 'results.json'}: no archive to analyse (run the study first)")
    names = {s["name"] for s in studies}
    archive = {**archive, "studies": {k: v for k, v in archive["studies"].items() if k in names}}
    pairs = []
    for item in pairs_text.split(","):
        a, sep, b = item.strip().partition("-")
        if not sep or not a or not b:
            raise ConfigError(f"--analyse: each pair must look like A-B (method names), got {item!r}")
        pairs.append((a, b))
    first = studies[0]
    lengths = first["lengths"][1:]
    endpoint = endpoint if endpoint is not None else lengths[min(1, len(lengths) - 1)]
    if endpoint not in first["lengths"]:
        raise ConfigError(f"--endpoint {endpoint} is not a length of the study ({first['lengths']})")
    ck = first["checkpoints"][-1]
    result = paired.analyse(archive, pairs, endpoint=endpoint, lengths=lengths, id_length=first["lengths"][0],
                            margin=margin, checkpoint=ck)
    text = paired.markdown(result, train_length=first["lengths"][0])
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "analysis.json", json.dumps(result, indent=1) + "\n")
    atomic_write_text(out / "analysis.md", text)
    png = paired.forest_plot(result, out / "forest.png", train_length=first["lengths"][0])
    print(text)
    print(f"wrote {out / 'analysis.json'}, {out / 'analysis.md'}" + (f", {png}" if png else ""))
    return 0
