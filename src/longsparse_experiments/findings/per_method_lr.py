"""The per-method learning-rate study (protocol docs/reports/2026-11-27-per-method-lr.md): the lr each method
selects on the validation stream, then ASEntmax − softmax with each at its own lr on fresh seeds.

    longsparse findings per-method-lr [--store results/per_method_lr] [--out DIR]

reads the study's results store and prints, or writes into ``DIR`` as ``analysis.json`` and ``analysis.md``:

* the **selection stage** (studies ``lr_select_<lr>``, validation stream): per method, lr and seed the exact match
  at 1× and 16×, and the **selected lr** by the protocol's rule: among the lrs at which both seeds reach ≥ 99 % at
  1×, the highest mean exact match at 16×; if none qualifies, the highest mean at 16× (flagged); a tie within 0.5
  points goes to the lr closer to 4e-3 (on a log scale: 2e-3 and 8e-3 are equally close), then to the lower one;
* the **confirmation stage** (study ``lr_confirm``, fresh seeds and test stream), once it has results: every run's
  exact match at 1×–256× and final loss, the primary endpoint D(64×) = ASEntmax − softmax per seed (Student-t
  interval over seeds, nominal 95 %, exact sign-flip p), D(16×), D(256×), adaptive temperature − softmax, and the
  protocol's decision.
"""

from __future__ import annotations

import math
from typing import Optional

from longsparse.report.paired import is_robust, seed_difference, seed_summary
from longsparse.report.store import by_run, merge_results
from longsparse_experiments.findings.output import pair_table, store_analysis_command

WRITER = "longsparse findings per-method-lr"
METHODS = ("softmax", "asentmax", "adatemp")
SELECTION_PREFIX = "lr_select_"
CONFIRMATION = "lr_confirm"
LRS = (2e-3, 4e-3, 8e-3)
SELECTION_SEEDS = (400, 401)
CONFIRMATION_SEEDS = (402, 403, 404)
SHARED_LR = 4e-3
FIT_BAR = 99.0  # % exact match at 1x in every seed
TIE = 0.5  # points of mean exact match at 16x
ID_LENGTH, SELECTION_LENGTH = 64, 1024
LENGTHS = (1024, 4096, 16384)
ENDPOINT = 4096
NO_DIFFERENCE = 5.0  # points: |mean D(64x)| below this, with every seed's intervals overlapping, is no difference


def lr_text(lr: float) -> str:
    """4e-3 rather than 0.004: the protocol's spelling."""
    return f"{lr * 1000:g}e-3"


def runs_of(records: list[dict]) -> dict[tuple[str, str, int], dict]:
    """{(study, method, seed): {"by_length": {L: last-checkpoint result}, "final_loss"}} over the store's records, a
    later record of a run winning per length (as in the store's tables)."""
    out = {}
    for (study, _), recs in by_run(records).items():
        last = recs[-1]
        results = {L: r for (ckpt, L), r in merge_results(recs).items() if ckpt == "last"}
        final_loss = next((r["train"]["final_loss"] for r in reversed(recs) if r.get("train")), None)
        out[study, last["method"], int(last["seed"])] = {"by_length": results, "final_loss": final_loss}
    return out


def _em(run: Optional[dict], L: int) -> Optional[float]:
    r = None if run is None else run["by_length"].get(L)
    return None if r is None else 100 * r["exact_match"]


def selection_table(runs: dict, method: str) -> dict[str, dict[str, dict]]:
    """One method's selection-stage runs: {lr text: {seed: {"1x", "16x": exact match % or None, "final_loss"}}}."""
    table = {}
    for lr in LRS:
        table[lr_text(lr)] = {}
        for s in SELECTION_SEEDS:
            run = runs.get((f"{SELECTION_PREFIX}{lr_text(lr)}", method, s))
            table[lr_text(lr)][str(s)] = {
                "1x": _em(run, ID_LENGTH),
                "16x": _em(run, SELECTION_LENGTH),
                "final_loss": None if run is None else run["final_loss"],
            }
    return table


def select(table: dict[str, dict[str, dict]]) -> dict:
    """The protocol's choice from one method's `selection_table`: {"lr": the selected lr text, or None while a
    cell is missing, "how", "mean16" (per lr, None while missing), "fits" (the lrs at which every seed reaches the
    bar)}."""
    complete = {
        lr: all(c["1x"] is not None and c["16x"] is not None for c in by_seed.values()) for lr, by_seed in table.items()
    }
    mean16 = {
        lr: sum(c["16x"] for c in by_seed.values()) / len(by_seed) if complete[lr] else None
        for lr, by_seed in table.items()
    }
    fit = [lr for lr, by_seed in table.items() if complete[lr] and all(c["1x"] >= FIT_BAR for c in by_seed.values())]
    out = {"mean16": mean16, "fits": fit}
    if not all(complete.values()):
        return {"lr": None, "how": "pending", **out}
    pool, how = (fit, "the best 16× among the lrs fitting 1×") if fit else (list(table), "FLAGGED: no lr fits 1×")
    best = max(mean16[lr] for lr in pool)
    tied = [lr for lr in pool if mean16[lr] >= best - TIE]
    chosen = min(tied, key=lambda lr: (abs(math.log(float(lr) / SHARED_LR)), float(lr)))
    if len(tied) > 1:
        how += f"; a tie within {TIE} points of {', '.join(tied)}"
    return {"lr": chosen, "how": how, **out}


def pair(runs: dict, a: str, b: str, L: int) -> dict:
    """A − B at length L (points) over the confirmation seeds both have, with per-seed Wilson-interval disjointness
    and "robust" (`longsparse.report.paired.is_robust`)."""
    per_seed = []
    for s in CONFIRMATION_SEEDS:
        ra, rb = runs.get((CONFIRMATION, a, s)), runs.get((CONFIRMATION, b, s))
        xa = None if ra is None else ra["by_length"].get(L)
        xb = None if rb is None else rb["by_length"].get(L)
        if xa is None or xb is None:
            continue
        per_seed.append(seed_difference(s, xa, xb))
    summary = seed_summary([r["d"] for r in per_seed])
    return {"a": a, "b": b, "length": L, "per_seed": per_seed, **summary, "robust": is_robust(per_seed)}


def decide(primary: dict) -> str:
    """The protocol's decision rule on D(64×), once every confirmation seed has both runs."""
    if primary["n"] < len(CONFIRMATION_SEEDS):
        return f"pending: {primary['n']} of {len(CONFIRMATION_SEEDS)} seeds have both runs at 64×"
    if primary["robust"]:
        return "ASEntmax ahead at per-method lrs" if primary["mean"] > 0 else "softmax ahead at per-method lrs"
    if not any(r["disjoint"] for r in primary["per_seed"]) and abs(primary["mean"]) < NO_DIFFERENCE:
        return "no difference of practical size"
    return "inconclusive"


def analyse(records: list[dict]) -> dict:
    """The analysis of the study's store records (in store order: a later record of a run wins): {"selection": {"runs":
    {method: `selection_table`}, "selected": {method: `select`}}, "confirmation": {"runs": {method: {seed:
    {"final_loss", length: exact match %}}}, "asentmax_softmax" / "adatemp_softmax": {length: `pair`}, "decision"},
    "endpoint"}; exact match in %, differences in points, None where a result is missing."""
    runs = runs_of(records)
    selection_runs = {m: selection_table(runs, m) for m in METHODS}
    confirmation = {
        m: {
            str(s): {
                "final_loss": runs[CONFIRMATION, m, s]["final_loss"],
                **{str(L): _em(runs[CONFIRMATION, m, s], L) for L in (ID_LENGTH, *LENGTHS)},
            }
            for s in CONFIRMATION_SEEDS
            if (CONFIRMATION, m, s) in runs
        }
        for m in METHODS
    }
    asentmax_softmax = {str(L): pair(runs, "asentmax", "softmax", L) for L in LENGTHS}
    return {
        "format": "longsparse-per-method-lr-analysis",
        "selection": {"runs": selection_runs, "selected": {m: select(selection_runs[m]) for m in METHODS}},
        "confirmation": {
            "runs": confirmation,
            "asentmax_softmax": asentmax_softmax,
            "adatemp_softmax": {str(L): pair(runs, "adatemp", "softmax", L) for L in LENGTHS},
            "decision": decide(asentmax_softmax[str(ENDPOINT)]),
        },
        "endpoint": ENDPOINT,
    }


def _num(x: Optional[float], fmt: str = ".1f") -> str:
    return "–" if x is None else format(x, fmt)


def markdown(a: dict) -> str:
    """The analysis as markdown: the selection table and choices, then the confirmation stage where it has run."""
    sel = a["selection"]
    seeds = [str(s) for s in SELECTION_SEEDS]
    header = [f"{k} s{s}" for k in ("1×", "16×") for s in seeds] + ["16× mean"] + [f"final loss s{s}" for s in seeds]
    lines = [
        "Selection stage (validation stream; exact match %, last checkpoint):",
        "",
        "| method | lr | " + " | ".join(header) + " |",
        "|---|---|" + "---:|" * len(header),
    ]
    for m, by_lr in sel["runs"].items():
        for lr, by_seed in by_lr.items():
            cols = [_num(by_seed[s][k]) for k in ("1x", "16x") for s in seeds]
            cols += [_num(sel["selected"][m]["mean16"][lr], ".2f")]
            cols += [_num(by_seed[s]["final_loss"], ".5f") for s in seeds]
            lines.append(f"| {m} | {lr} | " + " | ".join(cols) + " |")
    lines.append("")
    for m, s in sel["selected"].items():
        lines.append(f"- {m}: " + ("pending" if s["lr"] is None else f"**{s['lr']}** ({s['how']})"))
    conf = a["confirmation"]
    lines += ["", "Confirmation stage (test stream; exact match %, last checkpoint):", ""]
    if not any(conf["runs"].values()):
        lines.append("not run yet.")
        return "\n".join(lines) + "\n"
    lines += ["| method | seed | 1× | 16× | 64× | 256× | final loss |", "|---|---|---:|---:|---:|---:|---:|"]
    for m, by_seed in conf["runs"].items():
        for s, r in by_seed.items():
            cells = " | ".join(_num(r[str(L)]) for L in (ID_LENGTH, *LENGTHS))
            lines.append(f"| {m} | {s} | {cells} | {_num(r['final_loss'], '.5f')} |")
    lines += ["", *pair_table(conf, ID_LENGTH)]
    lines += ["", f"**Decision** (primary, ASEntmax − softmax at {a['endpoint'] // ID_LENGTH}×): {conf['decision']}."]
    return "\n".join(lines) + "\n"


def main(args) -> int:
    return store_analysis_command(args.store, args.out, analyse, markdown, WRITER)
