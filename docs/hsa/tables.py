"""Tables of docs/hsa.md from the eval JSONs of the study runs (newest file per length wins, as in
`longsparse report`). Usage: python docs/hsa/tables.py runs/hsa/NAME ... > table.md; copies the JSONs to
docs/hsa/raw/NAME/."""
import json
import shutil
import sys
from pathlib import Path


def load(run: Path):
    by_len = {}
    for f in sorted((run / "eval").glob("*.json")):
        try:
            d = json.loads(f.read_text())
        except json.JSONDecodeError:        # an eval still running / interrupted before its first length
            continue
        for r in d["results"]:
            r["created"] = d["created"]
            by_len[r["length"]] = r          # newest (sorted by time stamp) wins
        raw = Path(__file__).parent / "raw" / run.name
        raw.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, raw / f.name)
    return by_len


def train_wall(run: Path):
    log = run.parent / f"{run.name}.train.log"
    if log.exists():
        for line in log.read_text().splitlines():
            if "train wall" in line:
                return float(line.split()[-2])
    return None


def losses(run: Path):
    """[(step, loss)] logged in metrics.jsonl (every log_every steps)."""
    f = run / "metrics.jsonl"
    out = []
    if f.exists():
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if "loss" in rec:
                out.append((rec["step"], rec["loss"]))
    return out


def final_loss(run: Path):
    ls = losses(run)
    return ls[-1][1] if ls else None


def plateau_exit(run: Path, below=1.0):
    """First logged step whose mean training loss is below ``below`` (chance on passkey value_len 1: 1.39)."""
    return next((s for s, v in losses(run) if v < below), None)


def num(x, fmt):
    """x formatted, '-' for None / NaN (e.g. the rank of a model without retrieval)."""
    return "-" if x is None or x != x else format(x, fmt)


def pct(x):
    return "-" if x is None else f"{100 * x:.0f}"


def main(runs):
    runs = [Path(r) for r in runs]
    data = {r.name: load(r) for r in runs}
    lengths = sorted({L for d in data.values() for L in d})
    print("| run | " + " | ".join(f"{L:,}" for L in lengths) + " |")
    print("|---|" + "---|" * len(lengths))
    for name, d in data.items():
        cells = []
        for L in lengths:
            r = d.get(L)
            if r is None:
                cells.append("not run")
            else:
                lo, hi = r["exact_match_ci"]
                cells.append(f"{pct(r['exact_match'])} [{pct(lo)}, {pct(hi)}] n={r['n']}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    print("Needle diagnostics (HSA runs): recall@k / mean rank of the needle chunk / mean weight on it / exact match "
          "given full recall (n) / given a miss (n); eval seconds (score + diagnostics)")
    print()
    print("| run | L | recall@k | full recall | rank | weight | EM given recall | EM given miss | eval s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, d in data.items():
        for L in lengths:
            r = d.get(L)
            if r is None or "needles" not in r:
                continue
            nd = r["needles"]
            g, m = nd["exact_match_given_recall"], nd["exact_match_given_miss"]
            # files written before the EOS-position fix of score_needles (15:16:30 UTC) -> marked *
            old = "" if ("query_positions" in nd or r["created"] >= "2026-11-21T15:16:30") else "*"
            print(f"| {name}{old} | {L:,} | {num(nd['recall_at_k'], '.2f')} | {num(nd['full_recall']['rate'], '.2f')} | "
                  f"{num(nd['mean_rank'], '.1f')} | {num(nd['mean_needle_weight'], '.2f')} | "
                  f"{pct(g['rate'])}% ({g['n']}) | {pct(m['rate'])}% ({m['n']}) | "
                  f"{r['seconds'] + nd['seconds']:.0f} |")
    print()
    print("| run | training wall clock (s) | final training loss | first logged step with loss < 1 |")
    print("|---|---|---|---|")
    for r in runs:
        ex = plateau_exit(r)
        print(f"| {r.name} | {train_wall(r)} | {num(final_loss(r), '.4f')} | {'never' if ex is None else ex} |")


if __name__ == "__main__":
    main(sys.argv[1:])
