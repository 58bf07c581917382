"""What the study analyses of ``longsparse findings`` (hsa-seeds, matched-convergence, per-method-lr) share in
their outputs: the one-line text of a per-seed summary, the markdown table of the method pairs, writing
``analysis.json`` and ``analysis.md``, and the command of an analysis that reads one results store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

from longsparse.io import atomic_write_text, claim_outputs
from longsparse.report.store import read_records

ANALYSIS_FILES = ("analysis.json", "analysis.md")


def summary_text(s: dict) -> str:
    """A ``longsparse.report.paired.seed_summary`` as one line: mean, Student-t interval ("–" for one seed), exact
    sign-flip p, the seeds of each sign and n; "no seeds" for none."""
    if not s["n"]:
        return "no seeds"
    ci = s["t_ci"]
    interval = "–" if ci is None else f"[{ci[0]:+.1f}, {ci[1]:+.1f}]"
    return f"{s['mean']:+.1f} t {interval}, p = {s['p']:.3f}, {s['positive']}+ / {s['negative']}−, n = {s['n']}"


#: The method pairs of the MQMTAR studies' analyses: the key of each pair's {length: summary} and its label.
PAIR_LABELS = (("asentmax_softmax", "ASEntmax − softmax"), ("adatemp_softmax", "adaptive temperature − softmax"))


def pair_table(pairs: dict, id_length: int) -> list[str]:
    """Markdown lines of the table "pair | length | difference | robust" from ``pairs`` {`PAIR_LABELS` key: {length
    (str): a seed summary with "robust"}}; lengths shown as multiples of ``id_length``."""
    lines = ["| pair | length | difference | robust |", "|---|---|---|---|"]
    for key, label in PAIR_LABELS:
        for L, p in pairs[key].items():
            lines.append(
                f"| {label} | {int(L) // id_length:,}× | {summary_text(p)} | {'yes' if p['robust'] else 'no'} |"
            )
    return lines


def write_analysis(out: str | Path, analysis: dict, text: str, source: str, writer: str) -> None:
    """Write ``analysis`` as ``out/analysis.json`` and ``text`` under a "Source: ``source``." line as
    ``out/analysis.md``, each atomically; files there that ``writer`` did not write are refused, never replaced
    (``longsparse.io.claim_outputs``)."""
    out = Path(out)
    claim_outputs(out, list(ANALYSIS_FILES), writer)
    atomic_write_text(out / "analysis.json", json.dumps(analysis, indent=1) + "\n")
    atomic_write_text(out / "analysis.md", f"Source: {source}.\n\n" + text)
    print(f"wrote {out / 'analysis.json'} and {out / 'analysis.md'}")


def store_analysis_command(
    store_dir: str,
    out: Optional[str],
    analyse: Callable[[list[dict]], dict],
    markdown: Callable[[dict], str],
    writer: str,
) -> int:
    """An analysis of one results store as a command: ``analyse`` its records, print ``markdown`` of the result
    and, with ``out``, write both files there (`write_analysis`). A store without records is an error."""
    records = read_records(Path(store_dir))
    if not records:
        raise FileNotFoundError(f"no records in the store {store_dir}")
    analysis = analyse(records)
    text = markdown(analysis)
    print(text, end="")
    if out:
        write_analysis(out, analysis, text, f"the records of {store_dir}", writer)
    return 0
