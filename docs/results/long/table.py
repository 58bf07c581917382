"""Markdown table of the evaluations beyond a study's lengths (the JSON files beside this script, written by
eval_long.sh): one row per (study, run, length, checkpoint), exact match and token accuracy with 95% intervals.

    python docs/results/long/table.py
"""
import json
from pathlib import Path


def main() -> None:
    print("| study | run | length | checkpoint | exact match % [95% CI] (k / n) | token accuracy % [95% CI] "
          "(n tokens) | seconds |")
    print("|---|---|---:|---|---|---|---:|")
    for f in sorted(Path(__file__).parent.glob("*.json")):
        d = json.loads(f.read_text())
        study = f.name.split("__")[0]
        for r in d["results"]:
            lo, hi = r["exact_match_ci"]
            tlo, thi = r["token_accuracy_ci"]
            print(f"| {study} | {d['run_name']} | {r['length']:,} ({r['ratio']:g}×) | {d['checkpoint']} "
                  f"(step {d['checkpoint_step']}) | {100 * r['exact_match']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}] "
                  f"({r['n_exact']} / {r['n']}) | {100 * r['token_accuracy']:.1f} [{100 * tlo:.1f}, {100 * thi:.1f}] "
                  f"({r['n_tokens']}) | {r['seconds']:.0f} |")


if __name__ == "__main__":
    main()
