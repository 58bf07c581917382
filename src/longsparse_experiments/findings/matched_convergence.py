"""The matched-convergence study (protocol docs/reports/2026-11-27-matched-convergence.md): each (method, seed) at
the smallest training budget that fits 1× to the bar, and ASEntmax − softmax at equal fit.

    longsparse findings matched-convergence [--prereg results/prereg_mqmtar] [--matched results/matched_convergence]
        [--out DIR]

reads the two study archives (``results.json``: the pre-registered runs at 4,000 steps, the retrained ones at
8,000 and 16,000) and prints, or writes into ``DIR`` as ``analysis.json`` and ``analysis.md``:

* per (method, seed) its runs by budget (1× and final training loss) and its **matched run**: the smallest budget
  whose 1× exact match reaches the bar (99.5 %); a seed whose 16,000-step run is under it is *never matched*
  (reported with that run), one still waiting for a larger budget is *pending*;
* the **primary endpoint** D(64×) = ASEntmax − softmax over the seeds where both are matched (Student-t interval
  over seeds, nominal 95 %, exact sign-flip p, the robust rule), and the same at 16× and 256×;
* adaptive temperature − softmax at 16×, 64×, 256× (matched runs);
* each method's gain from more training: its reported run minus its 4,000-step run, paired by seed, for the seeds
  it retrained;
* the protocol's decision, once no (method, seed) is pending.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from longsparse.io import read_json
from longsparse.report.paired import is_robust, seed_difference, seed_summary
from longsparse_experiments.findings.output import pair_table, summary_text, write_analysis

WRITER = "longsparse findings matched-convergence"
METHODS = ("softmax", "asentmax", "adatemp")
BAR = 0.995
ID_LENGTH = 64
LENGTHS = (1024, 4096, 16384)
ENDPOINT = 4096
#: The largest budget of the protocol (its cap): a seed under the bar there is never matched.
CAP = 16000


def runs_by_seed(*archives: dict) -> dict[str, dict[int, dict[int, dict]]]:
    """{method: {seed: {budget: run}}} of the archives' runs of ``METHODS`` (a run: {"by_length": {L: record},
    "final_loss"}); the budget is the run's training steps."""
    out: dict[str, dict[int, dict[int, dict]]] = {}
    for archive in archives:
        for study in archive["studies"].values():
            for key, series in study["series"].items():
                method = key.split("/")[0]
                if method not in METHODS:
                    continue
                for L, cell in series.get("last", {}).items():
                    for seed, rec in cell["per_seed"].items():
                        run_key = next(r for r in study["runs"] if r.endswith(f"/{method}-{key.split('/')[1]}-s{seed}"))
                        info = study["runs"][run_key]
                        run = (
                            out.setdefault(method, {})
                            .setdefault(int(seed), {})
                            .setdefault(
                                int(info["steps"]),
                                {"by_length": {}, "final_loss": info.get("final_loss"), "run": run_key},
                            )
                        )
                        run["by_length"][int(L)] = rec
    return {m: {s: dict(sorted(b.items())) for s, b in sorted(out[m].items())} for m in METHODS if m in out}


def fits(run: dict) -> Optional[bool]:
    """Whether a run reaches the bar at 1× (None before 1× is evaluated)."""
    r = run["by_length"].get(ID_LENGTH)
    return None if r is None else r["exact_match"] >= BAR - 1e-12


def matched(budgets: dict[int, dict]) -> dict:
    """The status of one (method, seed): "matched" (the smallest budget at the bar), "never matched" (under it at
    the cap: that run is reported), or "pending" (under it at every budget run so far, below the cap)."""
    for steps, run in budgets.items():
        if fits(run):
            return {"status": "matched", "steps": steps}
    largest = max(budgets)
    return {"status": "never matched" if largest >= CAP else "pending", "steps": largest}


def _em(run: dict, L: int) -> Optional[float]:
    r = run["by_length"].get(L)
    return None if r is None else 100 * r["exact_match"]


def pair(runs: dict, status: dict, a: str, b: str, L: int) -> dict:
    """A − B at length L (points) over the seeds where both are matched: per seed, the summary and "robust"
    (`longsparse.report.paired.is_robust`: one seed, while the others are pending, is never robust)."""
    per_seed = []
    for s in sorted(set(status.get(a, {})) & set(status.get(b, {}))):
        sa, sb = status[a][s], status[b][s]
        if sa["status"] != "matched" or sb["status"] != "matched":
            continue
        ra, rb = runs[a][s][sa["steps"]]["by_length"].get(L), runs[b][s][sb["steps"]]["by_length"].get(L)
        if ra is None or rb is None:
            continue
        per_seed.append(seed_difference(s, ra, rb, steps=[sa["steps"], sb["steps"]]))
    summary = seed_summary([r["d"] for r in per_seed])
    return {"a": a, "b": b, "length": L, "per_seed": per_seed, **summary, "robust": is_robust(per_seed)}


def gain(runs: dict, status: dict, method: str, L: int) -> dict:
    """The method's reported run (matched, or never matched at the cap) minus its 4,000-step run at L, for the
    seeds it retrained (points)."""
    per_seed = []
    for s, st in status.get(method, {}).items():
        if st["status"] == "pending" or st["steps"] == min(runs[method][s]):
            continue
        now, before = _em(runs[method][s][st["steps"]], L), _em(runs[method][s][min(runs[method][s])], L)
        if now is not None and before is not None:
            per_seed.append({"seed": s, "steps": st["steps"], "d": now - before})
    return {"method": method, "length": L, "per_seed": per_seed, **seed_summary([r["d"] for r in per_seed])}


def decide(primary: dict, softmax_gain: dict, pending: list) -> str:
    """The protocol's decision rule on D(64×) and softmax's gain at 64×."""
    if pending:
        return "pending: " + ", ".join(pending) + " not yet at the bar or the cap"
    if primary["n"] < 2 or primary.get("t_ci") is None:
        return "inconclusive (fewer than 2 matched pairs)"
    lo, hi = primary["t_ci"]
    if lo > 0 and primary["p"] < 0.05:
        return "extrapolates better at equal fit"
    if hi < 0 and primary["p"] < 0.05:
        return "softmax ahead at equal fit"
    g = softmax_gain.get("t_ci")
    if lo <= 0 <= hi and g is not None and g[0] > 0:
        return "explained by convergence"
    return "inconclusive"


def analyse(prereg: dict, retrained: dict) -> dict:
    runs = runs_by_seed(prereg, retrained)
    if "softmax" not in runs or "asentmax" not in runs:
        raise ValueError("the archives hold no softmax and ASEntmax runs of the pre-registered study")
    status = {m: {s: matched(b) for s, b in seeds.items()} for m, seeds in runs.items()}
    pending = [f"{m} s{s}" for m in status for s, st in status[m].items() if st["status"] == "pending"]
    primary = pair(runs, status, "asentmax", "softmax", ENDPOINT)
    softmax_gain = {str(L): gain(runs, status, "softmax", L) for L in LENGTHS}
    return {
        "format": "longsparse-matched-convergence-analysis",
        "bar": BAR,
        "endpoint": ENDPOINT,
        "runs": {
            m: {
                str(s): {
                    "status": status[m][s],
                    "budgets": {
                        str(steps): {
                            "run": run["run"],
                            "final_loss": run["final_loss"],
                            **{str(L): _em(run, L) for L in (ID_LENGTH, *LENGTHS)},
                        }
                        for steps, run in budgets.items()
                    },
                }
                for s, budgets in seeds.items()
            }
            for m, seeds in runs.items()
        },
        "pending": pending,
        "primary": primary,
        "asentmax_softmax": {str(L): pair(runs, status, "asentmax", "softmax", L) for L in LENGTHS},
        "adatemp_softmax": {str(L): pair(runs, status, "adatemp", "softmax", L) for L in LENGTHS},
        "gain": {
            "softmax": softmax_gain,
            **{m: {str(L): gain(runs, status, m, L) for L in LENGTHS} for m in ("asentmax", "adatemp") if m in runs},
        },
        "decision": decide(primary, softmax_gain[str(ENDPOINT)], pending),
    }


def _x(L: int) -> str:
    return f"{L // ID_LENGTH:,}×"


def markdown(a: dict) -> str:
    """The analysis as markdown: the runs and their status, the pairs, the gains and the decision."""
    lines = [
        f"Matched run: the smallest budget at ≥ {100 * a['bar']:.1f} % at 1×. Differences in points; intervals:"
        " Student-t over seeds (nominal 95 %), p the exact sign-flip p.",
        "",
        "| method | seed | budget (steps) | 1× | 16× | 64× | 256× | final loss | status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m, seeds in a["runs"].items():
        for s, r in seeds.items():
            for steps, b in r["budgets"].items():
                cells = " | ".join("–" if b[str(L)] is None else f"{b[str(L)]:.1f}" for L in (ID_LENGTH, *LENGTHS))
                st = r["status"]
                mark = st["status"] if str(st["steps"]) == steps else ""
                loss = "–" if b["final_loss"] is None else f"{b['final_loss']:.5f}"
                lines.append(f"| {m} | {s} | {int(steps):,} | {cells} | {loss} | {mark} |")
    lines += ["", *pair_table(a, ID_LENGTH)]
    lines += ["", "Gain from more training (reported run − 4,000-step run, seeds retrained):", ""]
    lines += ["| method | length | gain |", "|---|---|---|"]
    for m, by_len in a["gain"].items():
        for L, g in by_len.items():
            lines.append(f"| {m} | {_x(int(L))} | {summary_text(g)} |")
    lines += ["", f"**Decision** (primary, ASEntmax − softmax at {_x(a['endpoint'])}): {a['decision']}."]
    return "\n".join(lines) + "\n"


def main(args) -> int:
    archives = []
    for folder in (args.prereg, args.matched):
        path = Path(folder) / "results.json"
        if not path.is_file():
            raise FileNotFoundError(f"no study archive {path}")
        archives.append(read_json(path))
    a = analyse(*archives)
    text = markdown(a)
    print(text, end="")
    if args.out:
        write_analysis(args.out, a, text, f"{args.prereg}/results.json and {args.matched}/results.json", WRITER)
    return 0
