"""The comparisons of docs/findings.md that ``longsparse reproduce synthetic --analyse`` cannot make (row command
C2), computed with the same functions (``longsparse.report.paired``: seed-level t- and bootstrap intervals, exact
sign-flip p, "robust").

``--analyse`` pairs methods *by name* inside the selected studies and merges the studies' records, so it cannot
compare one method with itself across two studies (NAPE vs RoPE, reference vs scale-aware init, a rerun vs the
archived cells) and it does not read the evaluations beyond a study's own lengths (256x, 1,024x) or the HSA / LM
records. This module relabels the stored per-seed records (``sources``) and runs the library's analysis on them.
Inputs, relative to the repository root: the results stores results/synthetic, results/mqmtar256x_26,
results/flipflop256x_27, results/maxret256x_26, results/prereg_mqmtar, results/hsa and results/lm, and, for the
combined forest plot, the ``reproduce --analyse`` outputs under docs/findings/ (C1, C3-C5, C8, C9, C10, C12).

    longsparse findings cross-study [--root .] [--out docs/findings]   # about 10 s; reads committed files only

writes ``<out>/<name>/analysis.{json,md}`` and ``forest.png`` per analysis (``ANALYSES``) and ``<out>/forest.png``,
the combined forest plot.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Callable, Sequence

from longsparse.io import atomic_write_text, claim_outputs, read_json
from longsparse.report import paired
from longsparse_experiments import lm_report
from longsparse_experiments.findings.sources import METHODS, SEED_FIELDS, Stores, has_method, pseudo, series

WRITER = "longsparse findings cross-study"
#: Where the ``reproduce --analyse`` outputs that the combined forest plot reads lie, relative to the root.
ANALYSE_OUTPUTS = Path("docs") / "findings"
#: Every analysis folder this module writes, with its files.
ANALYSES = {
    **{
        name: ("analysis.json", "analysis.md", "forest.png")
        for name in (
            "positions_max_retrieval",
            "positions_mqmtar",
            "mqmtar_headline_256x",
            "asentmax_init",
            "flip_flop_rerun_drift",
            "best_checkpoint",
            "max_retrieval_1024x",
            "hsa_passkey",
            "prereg_scaling",
        )
    },
    "lm_perplexity": ("analysis.json", "analysis.md"),
}
COMBINED_FOREST = "forest.png"


class Writer:
    """Writes the analyses into ``out`` (atomically; each file claimed for ``WRITER`` before any is written)."""

    def __init__(self, out: str | Path, log: Callable[[str], None] = print):
        self.out = Path(out)
        self.log = log

    def claim(self) -> None:
        for name, files in ANALYSES.items():
            claim_outputs(self.out / name, files, WRITER)
        claim_outputs(self.out, [COMBINED_FOREST], WRITER)

    def paired(self, name: str, result: dict, train_length: int, note: str, appendix: str = "") -> dict:
        """``analysis.json`` (the result and its ``source`` note), ``analysis.md`` (the note, the paired tables and
        ``appendix``) and ``forest.png`` of one analysis."""
        d = self.out / name
        result = {**result, "source": note}
        atomic_write_text(d / "analysis.json", json.dumps(result, indent=1) + "\n")
        text = f"{note}\n\n" + paired.markdown(result, train_length=train_length)
        atomic_write_text(d / "analysis.md", text + appendix)
        paired.forest_plot(result, d / "forest.png", train_length=train_length)
        self.log(f"## {name}\n{text}" + (f"\n{appendix}" if appendix else ""))
        return result


def analyse(
    w: Writer, name, named, pairs, *, endpoint, lengths, id_length, note, train_length=64, ckpt="last", appendix=""
):
    """``paired.analyse`` of the labelled series ``named`` ({label: {length: {seed: record}}}), margin 5 points,
    written by ``w`` as the analysis ``name``."""
    res = paired.analyse(
        pseudo(named, ckpt), pairs, endpoint=endpoint, lengths=lengths, id_length=id_length, margin=5.0, checkpoint=ckpt
    )
    return w.paired(name, res, train_length, note, appendix)


# 1. Positions: NAPE vs RoPE, the same method in two studies of the same recipe ------------------------------
def positions(st: Stores, w: Writer) -> dict:
    out = {}
    for task, nape, rope in (
        ("max_retrieval", "max_retrieval_4to64", "max_retrieval_4to64_rope"),
        ("mqmtar", "mqmtar_inline", "mqmtar_inline_rope"),
    ):
        named = {}
        for m in METHODS:
            named[f"{m}.nape"] = series(st.archive[nape], m)
            named[f"{m}.rope"] = series(st.archive[rope], m)
        pairs = [(f"{m}.nape", f"{m}.rope") for m in ["asentmax", "softmax", "entmax", "adatemp", "ssmax"]]
        out[task] = analyse(
            w,
            f"positions_{task}",
            named,
            pairs,
            endpoint=4096,
            lengths=[64, 1024, 4096],
            id_length=64,
            note=f"NAPE − RoPE, same method and recipe: studies `{nape}` vs `{rope}` "
            "(results/synthetic, last checkpoint).",
        )
    return out


# 2. MQMTAR headline at 256x: evaluations kept outside the archive ------------------------------------------
def mqmtar_256x(st: Stores, w: Writer) -> dict:
    """Per run, 1x and 256x from the same model: seed 0 of every method and softmax/SSMax seed 1 are retrained
    runs (store results/mqmtar256x_26: 1x and 256x); the other runs of seeds 1-2 are the archived cells (1x from
    results/synthetic's study view, 256x from its records at 16,384 tokens)."""
    trial = st.studies("results/mqmtar256x_26", "results/synthetic_trials/mqmtar256x_26.toml")
    head = st.archive["mqmtar_inline_3l_lr4e-3_4k"]
    named = {m: {"64": {}, "16384": {}} for m in METHODS}
    for study in trial.values():
        for m in METHODS:
            for L, seeds in (series(study, m) if has_method(study, m) else {}).items():
                named[m][L].update(seeds)
    for m, seeds in st.beyond("results/synthetic", "mqmtar_inline_3l_lr4e-3_4k", 16384).items():
        for seed, r in seeds.items():
            if seed in named[m]["16384"]:  # a run is either retrained or archived, never both
                raise ValueError(f"{m} seed {seed} at 16,384 is both in results/mqmtar256x_26 and results/synthetic")
            named[m]["16384"][seed] = r
            named[m]["64"][seed] = series(head, m)["64"][seed]
    pairs = [
        ("asentmax", "softmax"),
        ("entmax", "softmax"),
        ("adatemp", "softmax"),
        ("asentmax", "adatemp"),
        ("ssmax", "softmax"),
    ]
    return analyse(
        w,
        "mqmtar_headline_256x",
        named,
        pairs,
        endpoint=16384,
        lengths=[16384],
        id_length=64,
        note="MQMTAR headline at 256× (20 examples per run), last checkpoint. Seed 0 (all methods) and "
        "softmax/SSMax seed 1 are retrained runs of the same recipe (results/mqmtar256x_26); "
        "the other seed-1/2 runs are the archived cells (results/synthetic). Mixed provenance: "
        "ASEntmax − softmax at seed 1 compares an archived run with a retrained one.",
    )


# 3. ASEntmax init (docs/method.md §2): reference vs scale-aware, the same recipe ----------------------------
def init(st: Stores, w: Writer) -> dict:
    named = {
        "asentmax.refinit": series(st.archive["mqmtar_inline_init"], "asentmax"),
        "asentmax.scaleaware": series(st.archive["mqmtar_inline"], "asentmax"),
    }
    return analyse(
        w,
        "asentmax_init",
        named,
        [("asentmax.refinit", "asentmax.scaleaware")],
        endpoint=1024,
        lengths=[64, 1024, 4096],
        id_length=64,
        note="ASEntmax reference init − scale-aware init, 2-layer mqmtar_inline recipe "
        "(`mqmtar_inline_init` vs `mqmtar_inline`, last checkpoint).",
    )


# 4. Flip-flop: a rerun of the same 15 cells (same settings and seeds) vs the archived cells -----------------
def flip_flop_rerun(st: Stores, w: Writer) -> dict:
    rerun = st.studies("results/flipflop256x_27", "results/synthetic_trials/flipflop256x_27.toml")["flip_flop_256x"]
    named = {}
    for m in METHODS:
        named[f"{m}.rerun"] = series(rerun, m)
        named[f"{m}.archived"] = series(st.archive["flip_flop"], m)
    return analyse(
        w,
        "flip_flop_rerun_drift",
        named,
        [(f"{m}.rerun", f"{m}.archived") for m in METHODS],
        endpoint=4096,
        lengths=[64, 4096],
        id_length=64,
        note="Flip-flop: rerun (same settings and seeds, retrained; results/flipflop256x_27) − archived cell, per method, "
        "last checkpoint. A difference here is run-to-run variation of identical cells.",
    )


# 4b. Checkpoint sensitivity: the same comparisons with the best (validation-picked) checkpoint ----------------
def best_checkpoint(st: Stores, w: Writer) -> dict:
    """`--analyse` uses a study's last listed checkpoint ('last'); the archive also holds the best one."""
    named = {}
    for study, tag in (("mqmtar_inline_3l_lr4e-3_4k", "mqmtar"), ("flip_flop", "flip_flop")):
        for m in ("asentmax", "softmax"):
            named[f"{tag}.{m}.best"] = series(st.archive[study], m, "best")
    return analyse(
        w,
        "best_checkpoint",
        named,
        [("mqmtar.asentmax.best", "mqmtar.softmax.best"), ("flip_flop.asentmax.best", "flip_flop.softmax.best")],
        endpoint=4096,
        lengths=[1024, 4096],
        id_length=64,
        ckpt="best",
        note="ASEntmax − softmax with the **best** checkpoint (highest in-distribution validation exact "
        "match) instead of the last: MQMTAR headline and flip-flop (results/synthetic).",
    )


# 5. Max retrieval (NAPE) at 1,024x, seed 0 (3 examples per run) --------------------------------------------
def max_retrieval_1024x(st: Stores, w: Writer) -> dict:
    at = st.beyond("results/maxret256x_26", "max_retrieval_4to64_256x", 65536)
    named = {m: {"65536": {"0": at[m]["0"]}} for m in METHODS}
    return analyse(
        w,
        "max_retrieval_1024x",
        named,
        [("asentmax", "softmax"), ("entmax", "softmax")],
        endpoint=65536,
        lengths=[65536],
        id_length=64,
        note="max_retrieval_4to64, seed 0 only, 1,024× (65,536 tokens), 3 examples per run, last "
        "checkpoint (results/maxret256x_26, the records at 65,536 tokens).",
    )


# 6. HSA study (docs/reports/2026-11-21-hsa-development.md section 4): full layout, ablations, decoders -------
#: label -> the run-name prefix of its runs in study hsa_full of results/hsa (runs "<prefix>_s<seed>")
HSA_RUNS = {
    "hsa": "fl_full",
    "hsa.meanlm": "fl_mean",
    "hsa.encmeanlm": "fl_encmean",
    "hsa.standard": "fl_standard",
    "hsa.top16": "fl_dense16",
    "hsa.sb2warm": "fl_sb2warm",
    "hsa.entmax": "fl_entmax",
    "hsa.entmax_ls": "fl_entmax_ls",
    "swa_only": "fl_swa",
    "dec.softmax_rope": "dec_softmax",
    "dec.asentmax_nape": "dec_asentmax",
    "dec.softmax_nape": "dec_softmax_nape",
    "dec4.softmax_rope": "dec4_softmax",
    "dec4.asentmax_nape": "dec4_asentmax",
}
HSA_PAIRS = [
    ("hsa", "dec.softmax_rope"),
    ("hsa", "swa_only"),
    ("hsa", "hsa.meanlm"),
    ("hsa", "hsa.encmeanlm"),
    ("hsa", "hsa.standard"),
    ("hsa", "hsa.top16"),
    ("hsa.sb2warm", "hsa"),
    ("hsa.entmax", "hsa"),
    ("dec.asentmax_nape", "dec.softmax_rope"),
    ("dec.asentmax_nape", "dec.softmax_nape"),
    ("dec.softmax_nape", "dec.softmax_rope"),
    ("dec4.asentmax_nape", "dec4.softmax_rope"),
    ("hsa", "dec.asentmax_nape"),
]


def hsa_series(records: list[dict]) -> dict:
    """{label: {length: {seed: record}}} of the ``HSA_RUNS`` in the HSA store's records (store order: a later
    evaluation of a length wins); lengths ascending, seeds sorted."""
    named = {}
    for label, run_prefix in HSA_RUNS.items():
        by_len: dict = {}
        for rec in records:
            study, _, name = rec["run"].partition("/")
            prefix, _, seed = name.rpartition("_s")
            if study == "hsa_full" and prefix == run_prefix and seed.isdigit():
                for r in rec["results"]:
                    by_len.setdefault(str(r["length"]), {})[seed] = {k: r[k] for k in SEED_FIELDS}
        named[label] = {L: dict(sorted(by_len[L].items())) for L in sorted(by_len, key=int)}
    return named


def hsa_per_run_table(named: dict, lengths: Sequence[str] = ("256", "16384", "65536", "262144")) -> str:
    """The absolute exact match of every run (not differences): a markdown table, one row per label."""
    lines = [
        "",
        "Per run, exact match % (n examples), by training seed:",
        "",
        "| run | " + " | ".join(f"{int(L):,}" for L in lengths) + " |",
        "|---" * (len(lengths) + 1) + "|",
    ]
    for label, by_len in named.items():
        cells = [
            " / ".join(f"s{s} {100 * by_len[L][s]['exact_match']:.0f} ({by_len[L][s]['n']})" for s in sorted(by_len[L]))
            if L in by_len
            else "not run"
            for L in lengths
        ]
        lines.append(f"| {label} ({HSA_RUNS[label]}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def hsa(st: Stores, w: Writer) -> dict:
    named = hsa_series(st.records("results/hsa"))
    return analyse(
        w,
        "hsa_passkey",
        named,
        HSA_PAIRS,
        endpoint=16384,
        lengths=[1024, 4096, 16384, 262144],
        id_length=256,
        train_length=256,
        note="HSA passkey study (docs/reports/2026-11-21-hsa-development.md section 4; records results/hsa), last "
        "checkpoint, trained on 64–256 tokens (× = length / 256). hsa = fl_full (top-4 softmax over CLS landmarks, "
        "bypass); dec.* = full-attention decoders on the same data (softmax with RoPE, ASEntmax with NAPE: the "
        "mapping and the positions differ, so dec.asentmax_nape − dec.softmax_rope is confounded; softmax with NAPE, "
        "dec.softmax_nape, separates the two).",
        appendix=hsa_per_run_table(named),
    )


# 7. The pre-registered MQMTAR study: ASEntmax - alpha-entmax, a pair the protocol did not name ----------------
PREREG_STUDY_FILE = "src/longsparse_experiments/configs/reproduce/prereg_mqmtar.toml"


def prereg_scaling(st: Stores, w: Writer) -> dict:
    """ASEntmax (primary runs) against alpha-entmax (control runs) of the same seeds: does the length scaler add
    anything over a fixed alpha = 1.5? Exploratory: the protocol fixed no endpoint or decision for this pair."""
    studies = st.studies("results/prereg_mqmtar", PREREG_STUDY_FILE)
    named = {
        "asentmax": series(studies["prereg_primary"], "asentmax"),
        "entmax": series(studies["prereg_controls"], "entmax"),
    }
    return analyse(
        w,
        "prereg_scaling",
        named,
        [("asentmax", "entmax")],
        endpoint=4096,
        lengths=[64, 1024, 4096, 16384],
        id_length=64,
        note="Not pre-registered (exploratory): ASEntmax − α-entmax (α = 1.5, no length scaler) on the "
        "pre-registered study's runs (results/prereg_mqmtar, seeds 100–105, last checkpoint). The protocol named "
        "no decision for this pair; the verdict word below is the analysis's generic rule, not a pre-registered one.",
    )


# 8. Language model (docs/lm.md): perplexity at 8x, 2 seeds --------------------------------------------------
LM_PAIRS = (
    (("asentmax", "nape"), ("softmax", "nape")),
    (("entmax", "nape"), ("softmax", "nape")),
    (("asentmax", "rope"), ("softmax", "rope")),
    (("asentmax", "nape"), ("asentmax", "rope")),
    (("softmax", "nape"), ("softmax", "rope")),
)
LM_LENGTHS = ("128", "1024")


def perplexity_difference(a: tuple, b: tuple, length: str, ppl: dict) -> dict:
    """A − B in test perplexity at ``length`` over the seeds both (method, positions) cells have.

    ``ppl``: {(method, positions, seed): {length: {"ppl": float}}}. Returns the per-seed differences ``d``, their
    mean, 95 % bootstrap (``ci``) and unbounded t-interval (``t_ci``) and the exact sign-flip ``p``."""
    seeds = sorted(s for (m, p, s) in ppl if (m, p) == a and (*b, s) in ppl)
    if not seeds:
        raise ValueError(f"no seed has both {'/'.join(a)} and {'/'.join(b)}")
    d = [ppl[(*a, s)][length]["ppl"] - ppl[(*b, s)][length]["ppl"] for s in seeds]
    return {
        "a": "/".join(a),
        "b": "/".join(b),
        "length": int(length),
        "seeds": seeds,
        "d": d,
        "a_ppl": [ppl[(*a, s)][length]["ppl"] for s in seeds],
        "b_ppl": [ppl[(*b, s)][length]["ppl"] for s in seeds],
        "mean": statistics.fmean(d),
        "ci": paired.bootstrap_mean_interval(d),
        # perplexity differences are unbounded, unlike exact-match points
        "t_ci": paired.t_mean_interval(d, bounds=(-math.inf, math.inf)),
        "p": paired.sign_flip_p(d),
    }


def lm_markdown(note: str, rows: list[dict], passkey: dict) -> str:
    """The perplexity differences as a markdown table and the highest passkey exact match of any run."""
    best = max(acc for by_len in passkey.values() for acc in by_len.values())
    lines = [
        note,
        "",
        "| A − B | length | seeds | per seed (A / B) | mean | 95 % t-interval | 95 % bootstrap | sign-flip p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ps = ", ".join(f"{x:.2f} / {y:.2f}" for x, y in zip(r["a_ppl"], r["b_ppl"]))
        lines.append(
            f"| {r['a']} − {r['b']} | {r['length']} ({r['length'] // 128}×) | {len(r['seeds'])} | {ps} | "
            f"{r['mean']:+.2f} | [{r['t_ci'][0]:+.2f}, {r['t_ci'][1]:+.2f}] | [{r['ci'][0]:+.2f}, {r['ci'][1]:+.2f}] | "
            f"{r['p']:.3f} |"
        )
    lines += [
        "",
        f"Passkey (needle) exact match, all {len(passkey)} runs × lengths 1×–16× (40 examples each): "
        f"highest value {100 * best:.0f} %.",
    ]
    return "\n".join(lines) + "\n"


def lm(st: Stores, w: Writer) -> None:
    runs = lm_report.stored_lm_results(st.root / "results" / "lm")
    ppl = {(r["method"], r["positions"], r["seed"]): r["perplexity"] for r in runs}
    rows = [perplexity_difference(a, b, L, ppl) for a, b in LM_PAIRS for L in LM_LENGTHS]
    passkey = {r["run"]: {L: v["accuracy"] for L, v in r["passkey"].items()} for r in runs}
    note = (
        "LM study (records results/lm, per-run test perplexity; T = 128, 8× = 1,024 tokens). Differences in "
        "perplexity (A − B; negative = A better), 2 seeds: the exact sign-flip p cannot go below 0.5, and no "
        "per-run interval is stored, so 'robust' does not apply."
    )
    d = w.out / "lm_perplexity"
    atomic_write_text(
        d / "analysis.json", json.dumps({"source": note, "rows": rows, "passkey_exact_match": passkey}, indent=1) + "\n"
    )
    text = lm_markdown(note, rows, passkey)
    atomic_write_text(d / "analysis.md", text)
    w.log("## lm_perplexity\n" + text)


# 9. The combined forest plot of docs/findings.md ------------------------------------------------------------
def pair_at(result: dict, a: str, b: str, length: int) -> dict:
    """The record of the pair (a, b) at ``length`` in a ``paired.analyse`` result."""
    return next(p for p in result["pairs"] if (p["a"], p["b"]) == (a, b))["by_length"][str(length)]


def combined_forest(st: Stores, w: Writer, extra: dict) -> None:
    """One row per verdict of docs/findings.md: the ``reproduce --analyse`` outputs (under ``ANALYSE_OUTPUTS``)
    and this module's results ``extra`` ({"pos", "m256", "hsa", "scaling"})."""
    saved: dict = {}

    def from_cli(folder, a, b, L):
        if folder not in saved:
            saved[folder] = read_json(st.root / ANALYSE_OUTPUTS / folder / "analysis.json")
        return pair_at(saved[folder], a, b, L)

    rows = [  # (label A, label B, ratio, record); lengths are re-keyed to ratio x 64 so the labels read as "N x"
        *(
            ("MQMTAR pre-registered: ASEntmax", "softmax", ratio, from_cli("prereg_mqmtar", "asentmax", "softmax", L))
            for ratio, L in ((16, 1024), (64, 4096), (256, 16384))
        ),
        *(
            (f"MQMTAR pre-registered: {label_a}", label_b, 64, from_cli("prereg_mqmtar", a, b, 4096))
            for label_a, label_b, a, b in (
                ("α-entmax", "softmax", "entmax", "softmax"),
                ("adaptive temp.", "softmax", "adatemp", "softmax"),
                ("ASEntmax", "adaptive temp.", "asentmax", "adatemp"),
            )
        ),
        (
            "MQMTAR pre-reg. (exploratory): ASEntmax",
            "α-entmax",
            64,
            pair_at(extra["scaling"], "asentmax", "entmax", 4096),
        ),
        ("MQMTAR (3 seeds): ASEntmax", "softmax", 64, from_cli("mqmtar_headline", "asentmax", "softmax", 4096)),
        ("MQMTAR (3 seeds): ASEntmax", "softmax", 256, pair_at(extra["m256"], "asentmax", "softmax", 16384)),
        ("max retrieval: ASEntmax", "softmax", 64, from_cli("max_retrieval_nape", "asentmax", "softmax", 4096)),
        (
            "max retrieval: ASEntmax NAPE",
            "RoPE",
            16,
            pair_at(extra["pos"]["max_retrieval"], "asentmax.nape", "asentmax.rope", 1024),
        ),
        ("flip-flop: ASEntmax", "softmax", 64, from_cli("flip_flop", "asentmax", "softmax", 4096)),
        ("flip-flop (rerun): ASEntmax", "softmax", 256, from_cli("flip_flop_rerun_256x", "asentmax", "softmax", 16384)),
        ("copy: ASEntmax", "softmax", 8, from_cli("copy", "asentmax", "softmax", 512)),
        ("sort: ASEntmax", "softmax", 2, from_cli("sort", "asentmax", "softmax", 128)),
        ("reverse (5 seeds): ASEntmax", "softmax", 4, from_cli("reverse", "asentmax", "softmax", 256)),
        ("HSA passkey: HSA", "softmax/RoPE dec.", 64, pair_at(extra["hsa"], "hsa", "dec.softmax_rope", 16384)),
        (
            "HSA passkey: ASEntmax/NAPE dec.",
            "softmax/RoPE dec.",
            64,
            pair_at(extra["hsa"], "dec.asentmax_nape", "dec.softmax_rope", 16384),
        ),
    ]
    result = {"pairs": [{"a": a, "b": b, "by_length": {str(ratio * 64): r}} for a, b, ratio, r in rows]}
    # the long labels of this plot would be cut off without the tight bounding box
    paired.forest_plot(result, w.out / COMBINED_FOREST, train_length=64, tight=True)
    w.log(f"wrote {w.out / COMBINED_FOREST}")


def run_cross_study(root: str | Path = ".", out: str | Path | None = None, log: Callable[[str], None] = print) -> Path:
    """Every analysis of this module from the stores under ``root`` into ``out`` (default ``root``/docs/findings);
    returns ``out``. A file of ``out`` that this command did not write is never replaced (ForeignFileError)."""
    st = Stores(root)
    w = Writer(Path(root) / ANALYSE_OUTPUTS if out is None else out, log)
    w.claim()
    pos = positions(st, w)
    m256 = mqmtar_256x(st, w)
    init(st, w)
    flip_flop_rerun(st, w)
    best_checkpoint(st, w)
    max_retrieval_1024x(st, w)
    h = hsa(st, w)
    scaling = prereg_scaling(st, w)
    lm(st, w)
    combined_forest(st, w, {"pos": pos, "m256": m256, "hsa": h, "scaling": scaling})
    return w.out
