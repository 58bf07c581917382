"""The paper-format trial's training curves (docs/reports/2026-11-29-paper-format-trial-result.md): per run, the
mean training loss over each 1,000-step window and the validation exact match at 64 tokens (64 examples) at the
window's last step, from the runs' metrics.jsonl kept in curves/. Reads only those files; run from the repository
root:

    python results/paper_format_trial/curves.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
WINDOW = 1000


def curve(path: Path) -> list[tuple[int, float, float | None]]:
    """[(window end, mean training loss over the window's logged steps, validation exact match at its end)]."""
    losses: dict[int, list[float]] = {}
    val: dict[int, float] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        end = -(-row["step"] // WINDOW) * WINDOW  # the window (end - WINDOW, end] holds the step
        if "loss" in row:
            losses.setdefault(end, []).append(row["loss"])
        if "val" in row:
            val[row["step"]] = row["val"]["64"]["exact_match"]
    return [(end, sum(xs) / len(xs), val.get(end)) for end, xs in sorted(losses.items())]


def main() -> None:
    for path in sorted((HERE / "curves").glob("*.metrics.jsonl")):
        rows = curve(path)
        print(f"\n{path.name.removesuffix('.metrics.jsonl')}\n")
        print("| step | " + " | ".join(f"{end:,}" for end, _, _ in rows) + " |")
        print("|---|" + "---:|" * len(rows))
        print("| loss | " + " | ".join(f"{loss:.2f}" for _, loss, _ in rows) + " |")
        print("| val EM % | " + " | ".join("–" if v is None else f"{100 * v:.1f}" for _, _, v in rows) + " |")


if __name__ == "__main__":
    main()
