"""The shift check's table (docs/reports/2026-11-27-shift-check.md): softmax seed 1 of the MQMTAR headline as the
archive recorded it and as retrained by each code version (arm), on the archive's test stream (seed 0) and the
pre-registered one (20261126), with the six pre-registered softmax seeds for reference. Reads only the stored
records; run from the repository root:

    python results/shift_check/table.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from longsparse.report import store

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "results" / "shift_check"
LENGTHS = {0: [64, 1024, 4096], 20261126: [64, 1024, 4096]}


def from_archive(path: Path) -> tuple[dict, float | None]:
    """{(test seed, length): (exact match, n, ci)} and the final loss of the one run of an archive results.json."""
    data = json.loads(path.read_text())
    (st,) = data["studies"].values()
    ((_, run),) = st["runs"].items()
    out = {}
    for L, x in st["series"]["softmax/nape"]["last"].items():
        r = x["per_seed"]["1"]
        out[(st["test_seed"], int(L))] = (r["exact_match"], r["n"], r["ci"])
    return out, run.get("final_loss")


def from_store(folder: Path, study: str, run: str) -> tuple[dict, float | None]:
    """The same from a records store (the latest record per test stream and length)."""
    out, loss = {}, None
    for rec in store.read_records(folder):
        if rec["study"] != study or rec["run"] != run:
            continue
        for r in rec["results"]:
            if r["checkpoint"] == "last":
                out[(rec.get("test_seed") or 0, r["length"])] = (r["exact_match"], r["n"], r["ci"])
        if rec.get("train"):
            loss = rec["train"].get("final_loss")
    return out, loss


def cell(x) -> str:
    if x is None:
        return "–"
    em, n, ci = x
    return f"{100 * em:.1f} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}] (n = {n})"


def main() -> None:
    rows = []
    arch, loss = from_store(
        ROOT / "results" / "synthetic", "mqmtar_inline_3l_lr4e-3_4k", "mqmtar_inline_3l_lr4e-3_4k/softmax-nape-s1"
    )
    rows.append(("archive (recorded)", arch, loss))
    b0, loss_b = from_archive(HERE / "snapshot_archive_stream" / "results.json")
    b1, _ = from_archive(HERE / "snapshot_prereg_stream" / "results.json")
    rows.append(("B: snapshot 946520f", {**b0, **b1}, loss_b))
    for label, folder in (("C: archive code cccaf1e", "archive_code"), ("A: current 85d6dae", "current")):
        if (HERE / folder / "records.jsonl").is_file():
            got, l_ = from_store(HERE / folder, "shift_headline", "shift_headline/softmax-nape-s1")
            rows.append((label, got, l_))
    head = ["retrained softmax s1", "final loss"] + [
        f"{'stream 0' if s == 0 else 'stream 20261126'} {L // 64}×" for s, Ls in LENGTHS.items() for L in Ls
    ]
    print("| " + " | ".join(head) + " |")
    print("|---" * len(head) + "|")
    for label, got, l_ in rows:
        cells = [cell(got.get((s, L))) for s, Ls in LENGTHS.items() for L in Ls]
        print(f"| {label} | {l_ if l_ is not None else '–'} | " + " | ".join(cells) + " |")
    # the pre-registered softmax seeds on their stream
    pre = json.loads((ROOT / "results" / "prereg_mqmtar" / "results.json").read_text())
    ser = pre["studies"]["prereg_primary"]["series"]["softmax/nape"]["last"]
    runs = pre["studies"]["prereg_primary"]["runs"]
    print("\nPre-registered softmax seeds (stream 20261126): seed: final loss; 1× / 16× / 64× exact match %")
    for s in sorted(ser["64"]["per_seed"], key=int):
        vals = " / ".join(f"{100 * ser[L]['per_seed'][s]['exact_match']:.1f}" for L in ("64", "1024", "4096"))
        print(f"  s{s}: {runs[f'prereg_primary/softmax-nape-s{s}']['final_loss']}; {vals}")
    # every trained softmax model of this recipe at 64x: the archive's three, the six pre-registered ones and the
    # retrained seed 1 (one model: arms with identical weights count once), by the rank of the archive's runs
    archived = {}
    for rec in store.read_records(ROOT / "results" / "synthetic"):
        if rec["study"] == "mqmtar_inline_3l_lr4e-3_4k" and rec["method"] == "softmax":
            for r in rec["results"]:
                if r["checkpoint"] == "last" and r["length"] == 4096:
                    archived[rec["seed"]] = 100 * r["exact_match"]
    later = [100 * ser["4096"]["per_seed"][s]["exact_match"] for s in ser["4096"]["per_seed"]]
    later.append(100 * b1[(20261126, 4096)][0])
    print(
        f"\nSoftmax at 64x, archive seeds {sorted(archived)}: {[archived[s] for s in sorted(archived)]}; later models "
        f"(pre-registered seeds and the retrained seed 1): {sorted(later)}"
    )
    for keep in (sorted(archived), [s for s in sorted(archived) if s != 0]):
        n_all, k = len(later) + len(keep), len(keep)
        top = all(archived[s] > max(later) for s in keep)
        print(
            f"  archive seeds {keep} all above every later model: {top}; chance of that if all {n_all} models were "
            f"exchangeable draws: 1/C({n_all},{k}) = {1 / math.comb(n_all, k):.3f}"
        )


if __name__ == "__main__":
    main()
