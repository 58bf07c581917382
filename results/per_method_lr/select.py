"""The per-method learning-rate selection (protocol: docs/reports/2026-11-27-per-method-lr.md): the selection
stage's table and, per method, the selected peak lr by the protocol's rule. Reads only the stored records of the
studies ``lr_select_<lr>`` (validation stream 20261128); run from the repository root:

    python results/per_method_lr/select.py

The rule, per method: among the lrs at which both seeds reach >= 99 % exact match at 1x, the lr with the highest
mean exact match at 16x over the two seeds; if no lr qualifies, the lr with the highest mean at 16x (flagged). A tie
within 0.5 points goes to the lr closer to 4e-3, then to the lower one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent
METHODS = ("softmax", "asentmax", "adatemp")
LRS = (2e-3, 4e-3, 8e-3)
SEEDS = (400, 401)
SHARED_LR = 4e-3
FIT_BAR = 99.0  # % exact match at 1x, every seed
TIE = 0.5  # points of mean exact match at 16x


def lr_text(lr: float) -> str:
    """4e-3 rather than 0.004: the protocol's spelling."""
    return f"{lr * 1000:g}e-3"


def exact_match(records_path: Path) -> dict[tuple[str, float, int], dict[int, float]]:
    """{(method, lr, seed): {length: exact match %}} from the selection studies' last-checkpoint records; a later
    record of a run wins per length, as in the store."""
    out: dict[tuple[str, float, int], dict[int, float]] = {}
    for line in records_path.read_text().splitlines():
        r = json.loads(line)
        if not r["study"].startswith("lr_select_"):
            continue
        lr = float(r["study"].removeprefix("lr_select_"))
        for x in r["results"]:
            if x["checkpoint"] == "last":
                out.setdefault((r["method"], lr, r["seed"]), {})[x["length"]] = 100 * x["exact_match"]
    return out


def select(em: dict[tuple[str, float, int], dict[int, float]], method: str) -> tuple[float | None, str]:
    """(the selected lr, how it was chosen) for ``method``; (None, "pending") while a cell is missing."""
    cells = {(lr, s): em.get((method, lr, s), {}) for lr in LRS for s in SEEDS}
    if any(64 not in c or 1024 not in c for c in cells.values()):
        return None, "pending"
    mean16 = {lr: sum(cells[lr, s][1024] for s in SEEDS) / len(SEEDS) for lr in LRS}
    fit = [lr for lr in LRS if all(cells[lr, s][64] >= FIT_BAR for s in SEEDS)]
    pool, how = (fit, "best 16x among the lrs fitting 1x") if fit else (list(LRS), "FLAGGED: no lr fits 1x")
    best = max(mean16[lr] for lr in pool)
    tied = [lr for lr in pool if mean16[lr] >= best - TIE]
    chosen = min(tied, key=lambda lr: (abs(math.log(lr / SHARED_LR)), lr))
    if len(tied) > 1:
        how += f"; tie within {TIE} points of {', '.join(map(lr_text, tied))}"
    return chosen, how


def main() -> None:
    em = exact_match(HERE / "records.jsonl")
    print("| method | lr | 1x s400 | 1x s401 | 16x s400 | 16x s401 | 16x mean |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for m in METHODS:
        for lr in LRS:
            c = [em.get((m, lr, s), {}) for s in SEEDS]
            cols = [f"{x[L]:.1f}" if L in x else "–" for L in (64, 1024) for x in c]
            mean = f"{sum(x[1024] for x in c) / len(c):.2f}" if all(1024 in x for x in c) else "–"
            print(f"| {m} | {lr_text(lr)} | " + " | ".join(cols) + f" | {mean} |")
    print()
    for m in METHODS:
        lr, how = select(em, m)
        print(f"{m}: pending" if lr is None else f"{m}: {lr_text(lr)} ({how})")


if __name__ == "__main__":
    main()
