"""The comparisons of docs/findings.md that `longsparse reproduce synthetic --analyse` cannot make, computed with
the same functions (longsparse.report.paired: seed-level t- and bootstrap intervals, exact sign-flip p, "robust").

`--analyse` pairs methods *by name* inside the selected studies and merges the studies' records, so it cannot
compare one method with itself across two studies (NAPE vs RoPE, reference vs scale-aware init, a rerun vs the
archived cells) and it does not read the evaluations beyond a study's own lengths (256x, 1,024x) or the HSA / LM
records. This script relabels the stored per-seed records (nothing is recomputed from models) and runs the
library's analysis on them. Inputs: the results stores results/synthetic, results/mqmtar256x_26,
results/flipflop256x_27, results/maxret256x_26 and results/prereg_mqmtar, and the HSA and LM studies' stores
results/hsa and results/lm. Run from the repository root (reads only committed files; about 10 s):

    python docs/findings/cross_study.py            # writes docs/findings/<name>/analysis.{json,md}, forest.png
                                                   # and docs/findings/forest.png (the combined forest plot)
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from longsparse.report import paired, store
from longsparse_experiments import lm_study
from longsparse_experiments.study import load_study
from longsparse_experiments.study_records import view

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "findings"
METHODS = ["softmax", "ssmax", "adatemp", "entmax", "asentmax"]


def load(rel: str) -> dict:
    return json.loads((ROOT / rel).read_text())


def records(store_dir: str) -> list[dict]:
    return store.read_records(ROOT / store_dir)


def stored_studies(store_dir: str, study_file: str | None = None) -> dict:
    """The report's view (per study, method, checkpoint, length and seed) of a results store."""
    spec = load_study("synthetic", path=str(ROOT / study_file) if study_file else None)
    return view(spec, records(store_dir), printer=None)["studies"]


def beyond(store_dir: str, study: str, length: int, ckpt: str = "last") -> dict:
    """{method: {seed: record}} of the stored evaluations of ``study``'s runs at ``length`` (a length the study
    file does not list, so not in its view): the later record of a run wins."""
    out: dict = {}
    for rec in records(store_dir):
        for r in rec["results"] if rec["study"] == study else []:
            if r["length"] == length and r["checkpoint"] == ckpt:
                out.setdefault(rec["method"], {})[str(rec["seed"])] = {k: r[k] for k in ("exact_match", "ci", "n")}
    return out


ARCHIVE = stored_studies("results/synthetic")


def series(study: dict, method: str, ckpt: str = "last") -> dict:
    """{length: {seed: record}} of one method of an archived study (records as the archive holds them)."""
    key = next(k for k in study["series"] if k.split("/")[0] == method)
    return {L: dict(v.get("per_seed", {})) for L, v in study["series"][key].get(ckpt, {}).items()}


def pseudo(named: dict[str, dict], ckpt: str = "last") -> dict:
    """An archive-shaped dict (one study) whose 'methods' are the given labels: {label: {length: {seed: rec}}}."""
    return {
        "studies": {
            "x": {
                "series": {
                    f"{label}/x": {
                        ckpt: {
                            str(L): {"per_seed": {str(s): r for s, r in seeds.items()}} for L, seeds in by_len.items()
                        }
                    }
                    for label, by_len in named.items()
                }
            }
        }
    }


def write(name: str, result: dict, train_length: int, note: str) -> dict:
    d = OUT / name
    d.mkdir(parents=True, exist_ok=True)
    result = {**result, "source": note}
    (d / "analysis.json").write_text(json.dumps(result, indent=1) + "\n")
    text = f"{note}\n\n" + paired.markdown(result, train_length=train_length)
    (d / "analysis.md").write_text(text)
    paired.forest_plot(result, d / "forest.png", train_length=train_length)
    print(f"## {name}\n{text}")
    return result


def run(name, named, pairs, *, endpoint, lengths, id_length, note, train_length=64, ckpt="last"):
    res = paired.analyse(
        pseudo(named, ckpt), pairs, endpoint=endpoint, lengths=lengths, id_length=id_length, margin=5.0, checkpoint=ckpt
    )
    return write(name, res, train_length, note)


# 1. Positions: NAPE vs RoPE, the same method in two studies of the same recipe ------------------------------
def positions():
    out = {}
    for task, nape, rope in (
        ("max_retrieval", "max_retrieval_4to64", "max_retrieval_4to64_rope"),
        ("mqmtar", "mqmtar_inline", "mqmtar_inline_rope"),
    ):
        named = {}
        for m in METHODS:
            named[f"{m}.nape"] = series(ARCHIVE[nape], m)
            named[f"{m}.rope"] = series(ARCHIVE[rope], m)
        pairs = [(f"{m}.nape", f"{m}.rope") for m in ["asentmax", "softmax", "entmax", "adatemp", "ssmax"]]
        lengths = [64, 1024, 4096]
        out[task] = run(
            f"positions_{task}",
            named,
            pairs,
            endpoint=4096,
            lengths=lengths,
            id_length=64,
            note=f"NAPE − RoPE, same method and recipe: studies `{nape}` vs `{rope}` "
            "(results/synthetic, last checkpoint).",
        )
    return out


# 2. MQMTAR headline at 256x: evaluations kept outside the archive ------------------------------------------
def mqmtar_256x():
    """Per run, 1x and 256x from the same model: seed 0 of every method and softmax/SSMax seed 1 are retrained
    runs (store results/mqmtar256x_26: 1x and 256x); the other runs of seeds 1-2 are the archived cells (1x from
    results/synthetic's study view, 256x from its records at 16,384 tokens)."""
    trial = stored_studies("results/mqmtar256x_26", "results/synthetic_trials/mqmtar256x_26.toml")
    head = ARCHIVE["mqmtar_inline_3l_lr4e-3_4k"]
    named = {m: {"64": {}, "16384": {}} for m in METHODS}
    for st in trial.values():
        for m in METHODS:
            for L, seeds in (series(st, m) if any(k.split("/")[0] == m for k in st["series"]) else {}).items():
                named[m][L].update(seeds)
    for m, seeds in beyond("results/synthetic", "mqmtar_inline_3l_lr4e-3_4k", 16384).items():
        for seed, r in seeds.items():
            assert seed not in named[m]["16384"], (m, seed)
            named[m]["16384"][seed] = r
            named[m]["64"][seed] = series(head, m)["64"][seed]
    pairs = [
        ("asentmax", "softmax"),
        ("entmax", "softmax"),
        ("adatemp", "softmax"),
        ("asentmax", "adatemp"),
        ("ssmax", "softmax"),
    ]
    return run(
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


# 3. ASEntmax init (docs/method.md §2): reference vs scale-aware, the same recipe -------------------------------------
def init():
    named = {
        "asentmax.refinit": series(ARCHIVE["mqmtar_inline_init"], "asentmax"),
        "asentmax.scaleaware": series(ARCHIVE["mqmtar_inline"], "asentmax"),
    }
    return run(
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
def flip_flop_rerun():
    rerun = stored_studies("results/flipflop256x_27", "results/synthetic_trials/flipflop256x_27.toml")["flip_flop_256x"]
    named = {}
    for m in METHODS:
        named[f"{m}.rerun"] = series(rerun, m)
        named[f"{m}.archived"] = series(ARCHIVE["flip_flop"], m)
    return run(
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
def best_checkpoint():
    """`--analyse` uses a study's last listed checkpoint ('last'); the archive also holds the best one."""
    named = {}
    for study, tag in (("mqmtar_inline_3l_lr4e-3_4k", "mqmtar"), ("flip_flop", "flip_flop")):
        for m in ("asentmax", "softmax"):
            named[f"{tag}.{m}.best"] = series(ARCHIVE[study], m, "best")
    return run(
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
def max_retrieval_1024x():
    at = beyond("results/maxret256x_26", "max_retrieval_4to64_256x", 65536)
    named = {m: {"65536": {"0": at[m]["0"]}} for m in METHODS}
    return run(
        "max_retrieval_1024x",
        named,
        [("asentmax", "softmax"), ("entmax", "softmax")],
        endpoint=65536,
        lengths=[65536],
        id_length=64,
        note="max_retrieval_4to64, seed 0 only, 1,024× (65,536 tokens), 3 examples per run, last "
        "checkpoint (results/maxret256x_26, the records at 65,536 tokens).",
    )


# 6. HSA study (docs/reports/2026-11-21-hsa-development.md section 4): full layout, ablations, decoder baselines ---------------------------
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


def hsa():
    named = {}
    stored = records("results/hsa")
    for label, run_prefix in HSA_RUNS.items():
        by_len: dict = {}
        for rec in stored:  # store order: a later evaluation of a length wins
            study, _, name = rec["run"].partition("/")
            prefix, _, seed = name.rpartition("_s")
            if study == "hsa_full" and prefix == run_prefix and seed.isdigit():
                for r in rec["results"]:
                    by_len.setdefault(str(r["length"]), {})[seed] = {k: r[k] for k in ("exact_match", "ci", "n")}
        named[label] = {L: dict(sorted(by_len[L].items())) for L in sorted(by_len, key=int)}
    pairs = [
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
    res = run(
        "hsa_passkey",
        named,
        pairs,
        endpoint=16384,
        lengths=[1024, 4096, 16384, 262144],
        id_length=256,
        train_length=256,
        note="HSA passkey study (docs/reports/2026-11-21-hsa-development.md section 4; records results/hsa), last checkpoint, trained on "
        "64–256 tokens (× = length / 256). hsa = fl_full (top-4 softmax over CLS landmarks, bypass); "
        "dec.* = full-attention decoders on the same data (softmax with RoPE, ASEntmax with NAPE: the "
        "mapping and the positions differ, so dec.asentmax_nape − dec.softmax_rope is confounded; softmax with NAPE, "
        "dec.softmax_nape, separates the two).",
    )
    lengths = ["256", "16384", "65536", "262144"]  # absolute numbers per run (not differences)
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
    with open(OUT / "hsa_passkey" / "analysis.md", "a") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return res


# 7. The pre-registered MQMTAR study: ASEntmax - alpha-entmax, a pair the protocol did not name ----------------
PREREG_STUDY_FILE = "src/longsparse_experiments/configs/reproduce/prereg_mqmtar.toml"


def prereg_scaling():
    """ASEntmax (primary runs) against alpha-entmax (control runs) of the same seeds: does the length scaler add
    anything over a fixed alpha = 1.5? Exploratory: the protocol fixed no endpoint or decision for this pair."""
    studies = stored_studies("results/prereg_mqmtar", PREREG_STUDY_FILE)
    named = {
        "asentmax": series(studies["prereg_primary"], "asentmax"),
        "entmax": series(studies["prereg_controls"], "entmax"),
    }
    return run(
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
def lm():
    runs = lm_study.stored_lm_results(ROOT / "results" / "lm")
    ppl = {(r["method"], r["positions"], r["seed"]): r["perplexity"] for r in runs}
    rows = []
    for a, b in (
        (("asentmax", "nape"), ("softmax", "nape")),
        (("entmax", "nape"), ("softmax", "nape")),
        (("asentmax", "rope"), ("softmax", "rope")),
        (("asentmax", "nape"), ("asentmax", "rope")),
        (("softmax", "nape"), ("softmax", "rope")),
    ):
        for L in ("128", "1024"):
            seeds = sorted(s for (m, p, s) in ppl if (m, p) == a and (*b, s) in ppl)
            d = [ppl[(*a, s)][L]["ppl"] - ppl[(*b, s)][L]["ppl"] for s in seeds]
            rows.append(
                {
                    "a": "/".join(a),
                    "b": "/".join(b),
                    "length": int(L),
                    "seeds": seeds,
                    "d": d,
                    "a_ppl": [ppl[(*a, s)][L]["ppl"] for s in seeds],
                    "b_ppl": [ppl[(*b, s)][L]["ppl"] for s in seeds],
                    "mean": statistics.fmean(d),
                    "ci": paired.bootstrap_mean_interval(d),
                    # perplexity differences are unbounded, unlike exact-match points
                    "t_ci": paired.t_mean_interval(d, bounds=(-math.inf, math.inf)),
                    "p": paired.sign_flip_p(d),
                }
            )
    passkey = {r["run"]: {L: v["accuracy"] for L, v in r["passkey"].items()} for r in runs}
    best = max(acc for by_len in passkey.values() for acc in by_len.values())
    d = OUT / "lm_perplexity"
    d.mkdir(parents=True, exist_ok=True)
    note = (
        "LM study (records results/lm, per-run test perplexity; T = 128, 8× = 1,024 tokens). Differences in "
        "perplexity (A − B; negative = A better), 2 seeds: the exact sign-flip p cannot go below 0.5, and no "
        "per-run interval is stored, so 'robust' does not apply."
    )
    (d / "analysis.json").write_text(
        json.dumps({"source": note, "rows": rows, "passkey_exact_match": passkey}, indent=1) + "\n"
    )
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
    (d / "analysis.md").write_text("\n".join(lines) + "\n")
    print("## lm_perplexity\n" + "\n".join(lines))


# 9. The combined forest plot of docs/findings.md ------------------------------------------------------------
def combined_forest(extra: dict):
    def from_cli(folder, a, b, L):
        res = json.loads((OUT / folder / "analysis.json").read_text())
        return next(p for p in res["pairs"] if (p["a"], p["b"]) == (a, b))["by_length"][str(L)]

    def from_res(res, a, b, L):
        return next(p for p in res["pairs"] if (p["a"], p["b"]) == (a, b))["by_length"][str(L)]

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
            from_res(extra["scaling"], "asentmax", "entmax", 4096),
        ),
        ("MQMTAR (3 seeds): ASEntmax", "softmax", 64, from_cli("mqmtar_headline", "asentmax", "softmax", 4096)),
        ("MQMTAR (3 seeds): ASEntmax", "softmax", 256, from_res(extra["m256"], "asentmax", "softmax", 16384)),
        ("max retrieval: ASEntmax", "softmax", 64, from_cli("max_retrieval_nape", "asentmax", "softmax", 4096)),
        (
            "max retrieval: ASEntmax NAPE",
            "RoPE",
            16,
            from_res(extra["pos"]["max_retrieval"], "asentmax.nape", "asentmax.rope", 1024),
        ),
        ("flip-flop: ASEntmax", "softmax", 64, from_cli("flip_flop", "asentmax", "softmax", 4096)),
        ("flip-flop (rerun): ASEntmax", "softmax", 256, from_cli("flip_flop_rerun_256x", "asentmax", "softmax", 16384)),
        ("copy: ASEntmax", "softmax", 8, from_cli("copy", "asentmax", "softmax", 512)),
        ("sort: ASEntmax", "softmax", 2, from_cli("sort", "asentmax", "softmax", 128)),
        ("reverse (5 seeds): ASEntmax", "softmax", 4, from_cli("reverse", "asentmax", "softmax", 256)),
        ("HSA passkey: HSA", "softmax/RoPE dec.", 64, from_res(extra["hsa"], "hsa", "dec.softmax_rope", 16384)),
        (
            "HSA passkey: ASEntmax/NAPE dec.",
            "softmax/RoPE dec.",
            64,
            from_res(extra["hsa"], "dec.asentmax_nape", "dec.softmax_rope", 16384),
        ),
    ]
    result = {"pairs": [{"a": a, "b": b, "by_length": {str(ratio * 64): r}} for a, b, ratio, r in rows]}
    import matplotlib

    matplotlib.rcParams["savefig.bbox"] = "tight"  # the long labels of this plot would be cut off otherwise
    paired.forest_plot(result, OUT / "forest.png", train_length=64)
    print(f"wrote {OUT / 'forest.png'}")


if __name__ == "__main__":
    pos = positions()
    m256 = mqmtar_256x()
    init()
    flip_flop_rerun()
    best_checkpoint()
    max_retrieval_1024x()
    h = hsa()
    scaling = prereg_scaling()
    lm()
    combined_forest({"pos": pos, "m256": m256, "hsa": h, "scaling": scaling})
