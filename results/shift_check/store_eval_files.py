"""Store a run folder's `longsparse eval` files as records (results/README.md): the shift check's arm C, whose
archive-era runner kept no store. Run from the repository root:

    python results/shift_check/store_eval_files.py RUN_DIR STORE_DIR

Each eval file becomes one record (study `shift_headline`, run `shift_headline/softmax-nape-s1`, seed 1, its test
stream seed), the first one carrying the training record read from the run's metrics.jsonl; a store that already
holds records is refused (nothing is appended twice).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

from longsparse.report import store


def main(run_dir: str, store_dir: str) -> int:
    run, out = Path(run_dir), Path(store_dir)
    if store.records_path(out).is_file():
        print(f"{store.records_path(out)} exists; nothing written", file=sys.stderr)
        return 2
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    t = [datetime.fromisoformat(x["time"]) for x in steps]
    train = {
        "steps": steps[-1]["step"],
        "train_seconds": round((t[-1] - t[0]).total_seconds(), 1),
        "final_loss": round(steps[-1]["loss"], 5),
    }
    recs = []
    for f in sorted((run / "eval").glob("*.json")):
        doc = json.loads(f.read_text())
        rec = store.record_from_eval(
            doc, study="shift_headline", run="shift_headline/softmax-nape-s1", seed=1, source=f"eval file {f.name}"
        )
        rec["test_seed"] = doc.get("seed", 0)
        if not recs:
            rec["train"] = train
        recs.append(rec)
    store.append_records(out, recs)
    print(f"{len(recs)} records -> {store.records_path(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
