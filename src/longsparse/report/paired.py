"""Seed-level comparison of two methods of a study: the pre-registered analysis of docs/reports.

For methods A and B trained on the same seeds, the per-seed paired difference D_s = EM_A,s − EM_B,s (percentage
points) at one test length is summarised by

* its mean over seeds with a 95 % Student-t interval (mean ± t · sd / √n, n − 1 degrees of freedom; exact
  coverage for normal differences at any n ≥ 2, clipped to the ±100 points a difference can take), and a 95 %
  percentile bootstrap interval (resampling the seeds' differences with replacement, a fixed generator seed, so
  the interval is the same on every rebuild) — the interval the pre-registered protocol fixed. With few seeds the
  bootstrap covers less than its nominal 95 % (its resamples cannot spread wider than the seeds themselves), so
  it is reported beside the t-interval, never alone;
* an exact two-sided sign-flip test: under "no difference" every D_s is as likely to have either sign, so p is the
  fraction of the 2^n sign patterns whose mean is at least as far from 0 as the observed one (exact for n ≤ 16);
* "robust" (`is_robust`): the same sign in every seed with the two runs' Wilson intervals disjoint in every seed,
  over at least two seeds (over one seed "every seed" holds trivially);
* the intercept of D_s(L) = a + b·Δ_s, Δ_s the same difference at the in-distribution length: the difference at
  equal in-distribution accuracy, separating "extrapolates better" from "converged better".

The decision rule maps the primary endpoint to supported / refuted / inconclusive (see ``decide``). Everything is
computed from a study view (``longsparse_experiments.study_records.view`` of a results store: per study, method, checkpoint,
length and seed); nothing from models.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Sequence

from longsparse.report import plotting

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def bootstrap_mean_interval(
    xs: Sequence[float], *, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``xs`` (resampled with replacement, ``random.Random(seed)``)."""
    if not xs:
        raise ValueError("bootstrap of an empty sample")
    rng, n = random.Random(seed), len(xs)
    means = sorted(statistics.fmean(rng.choices(xs, k=n)) for _ in range(resamples))
    lo = means[int((1 - level) / 2 * resamples)]
    hi = means[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return lo, hi


def _t_two_sided_mass(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer ``df`` degrees of freedom (the closed forms of Abramowitz & Stegun
    26.7.3-4: a finite series in cos(theta), theta = atan(t / sqrt(df)))."""
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:  # odd: (2/pi)(theta + sin cos (1 + (2/3)cos^2 + (2*4)/(3*5)cos^4 + ... up to cos^(df-3)))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 3) // 2 + 1):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + s * math.cos(theta) * total)
    term, total = 1.0, 1.0  # even: sin (1 + (1/2)cos^2 + (1*3)/(2*4)cos^4 + ... up to cos^(df-2))
    for k in range(1, (df - 2) // 2 + 1):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return s * total


def t_quantile(q: float, df: int) -> float:
    """The ``q`` quantile (0.5 < q < 1) of Student's t with integer ``df`` >= 1 degrees of freedom, by bisection
    on the exact two-sided mass (|error| < 1e-10)."""
    if not 0.5 < q < 1:
        raise ValueError(f"t_quantile takes 0.5 < q < 1, got {q!r}")
    if not isinstance(df, int) or df < 1:
        raise ValueError(f"t_quantile needs an integer df >= 1, got {df!r}")
    mass, lo, hi = 2 * q - 1, 0.0, 1.0
    while _t_two_sided_mass(hi, df) < mass:
        hi *= 2
    while hi - lo > 1e-10:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_two_sided_mass(mid, df) < mass else (lo, mid)
    return (lo + hi) / 2


def t_mean_interval(
    xs: Sequence[float], *, level: float = 0.95, bounds: tuple[float, float] = (-100.0, 100.0)
) -> tuple[float, float] | None:
    """Student-t interval of the mean of ``xs`` (n − 1 degrees of freedom), clipped to ``bounds`` (the range a
    difference of two percentages can take); None for fewer than 2 values (no spread to estimate)."""
    n = len(xs)
    if n < 2:
        return None
    half = t_quantile((1 + level) / 2, n - 1) * statistics.stdev(xs) / math.sqrt(n)
    m = statistics.fmean(xs)
    return max(bounds[0], m - half), min(bounds[1], m + half)


def sign_flip_p(xs: Sequence[float]) -> float:
    """Exact two-sided sign-flip p-value of mean(xs) = 0 (all 2^n sign patterns; n ≤ 16)."""
    n = len(xs)
    if not 1 <= n <= 16:
        raise ValueError(f"the exact sign-flip test takes 1 to 16 differences, got {n}")
    observed = abs(sum(xs)) - 1e-9  # ties (equal |sum|) count as "at least as far"
    hits = sum(abs(sum(s * x for s, x in zip(signs, xs))) >= observed for signs in itertools.product((1, -1), repeat=n))
    return hits / 2**n


def seed_summary(d: Sequence[float]) -> dict:
    """Per-seed differences ``d`` summarised: n, and when there are any the mean, the Student-t interval
    (`t_mean_interval`, None for one value), the exact sign-flip p and the counts of positive and negative seeds."""
    out: dict = {"n": len(d)}
    if d:
        out.update(
            mean=statistics.fmean(d),
            t_ci=t_mean_interval(d),
            p=sign_flip_p(d),
            positive=sum(x > 0 for x in d),
            negative=sum(x < 0 for x in d),
        )
    return out


#: "Robust" is a statement over seeds: fewer than this many seeds are never called robust.
ROBUST_MIN_SEEDS = 2


def seed_difference(seed: int, x: dict, y: dict, **extra) -> dict:
    """One seed's A − B in points from the two runs' results ``x`` and ``y`` (``exact_match`` in [0, 1], Wilson
    ``ci``): both numbers, the difference ``d``, any ``extra`` fields, and whether the two intervals are
    ``disjoint`` — the per-seed record ``is_robust`` reads."""
    return {
        "seed": seed,
        "a": 100 * x["exact_match"],
        "b": 100 * y["exact_match"],
        "d": 100 * (x["exact_match"] - y["exact_match"]),
        **extra,
        "disjoint": x["ci"][0] > y["ci"][1] or y["ci"][0] > x["ci"][1],
    }


def is_robust(per_seed: Sequence[dict], min_seeds: int = ROBUST_MIN_SEEDS) -> bool:
    """Whether per-seed records (each with the difference ``d`` and whether the two runs' intervals are
    ``disjoint``) are "robust": at least ``min_seeds`` of them, ``d`` of one sign in all, disjoint in every one."""
    d = [r["d"] for r in per_seed]
    same_sign = all(x > 0 for x in d) or all(x < 0 for x in d)
    return len(d) >= min_seeds and same_sign and all(r["disjoint"] for r in per_seed)


def intercept_interval(
    d: Sequence[float],
    delta: Sequence[float],
    *,
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict:
    """Least-squares d = a + b·delta over seeds; a (the difference at delta = 0) and b with bootstrap intervals
    over seeds (resamples where every delta is equal leave the slope undefined and are skipped)."""

    def fit(pairs):
        xs, ys = [p[1] for p in pairs], [p[0] for p in pairs]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        if sxx < 1e-12:
            return None
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        return my - b * mx, b

    pairs = list(zip(d, delta))
    point = fit(pairs)
    if point is None:
        return {"a": None, "b": None, "a_ci": None, "b_ci": None}
    rng, fits = random.Random(seed), []
    for _ in range(resamples):
        f = fit(rng.choices(pairs, k=len(pairs)))
        if f is not None:
            fits.append(f)

    def q(vals):
        return (
            vals[int((1 - level) / 2 * len(vals))],
            vals[min(len(vals) - 1, int((1 + level) / 2 * len(vals)))],
        )

    return {"a": point[0], "b": point[1], "a_ci": q(sorted(f[0] for f in fits)), "b_ci": q(sorted(f[1] for f in fits))}


def decide(ci: tuple[float, float], p: float, *, margin: float, alpha: float = 0.05) -> str:
    """The pre-registered rule: "supported" if the interval lies above 0 and p < alpha; "refuted" if it lies below
    0 and p < alpha, or lies entirely within ±margin (no difference of practical size); else "inconclusive"."""
    lo, hi = ci
    if lo > 0 and p < alpha:
        return "supported"
    if (hi < 0 and p < alpha) or (-margin < lo and hi < margin):
        return "refuted"
    return "inconclusive"


def _seed_records(sd: dict, method: str, checkpoint: str, length: int) -> dict[str, dict]:
    key = next((k for k in sd["series"] if k.split("/")[0] == method), None)
    if key is None:
        return {}
    return sd["series"][key].get(checkpoint, {}).get(str(length), {}).get("per_seed", {})


def compare(
    studies: dict, a: str, b: str, length: int, *, id_length: int | None = None, checkpoint: str = "last"
) -> dict:
    """A − B at ``length`` over the seeds both have, from an archive's ``studies`` (methods may sit in different
    studies of the file). Differences in percentage points; per-seed records keep both runs' numbers."""

    def records(method, L):
        out = {}
        for sd in studies.values():
            out.update(_seed_records(sd, method, checkpoint, L))
        return out

    ra, rb = records(a, length), records(b, length)
    seeds = sorted(set(ra) & set(rb), key=int)
    per_seed = []
    for s in seeds:
        x, y = ra[s], rb[s]
        per_seed.append(seed_difference(int(s), x, y, n=[x["n"], y["n"]]))
    out = {
        "a": a,
        "b": b,
        "length": length,
        "checkpoint": checkpoint,
        "seeds": [r["seed"] for r in per_seed],
        "per_seed": per_seed,
    }
    if not per_seed:
        return out
    d = [r["d"] for r in per_seed]
    s = seed_summary(d)  # in the stored analyses' key order, the bootstrap interval after the mean
    out.update(mean=s["mean"], ci=bootstrap_mean_interval(d), t_ci=s["t_ci"], p=s["p"])
    out.update(positive=s["positive"], negative=s["negative"], robust=is_robust(per_seed))
    if id_length is not None and id_length != length:
        ia, ib = records(a, id_length), records(b, id_length)
        both = [r for r in per_seed if str(r["seed"]) in ia and str(r["seed"]) in ib]
        delta = [100 * (ia[str(r["seed"])]["exact_match"] - ib[str(r["seed"])]["exact_match"]) for r in both]
        for r, x in zip(both, delta):
            r["d_id"] = x
        out["id_difference"] = delta
        out["regression"] = intercept_interval([r["d"] for r in both], delta) if len(both) >= 3 else None
    return out


def converged_subset(
    studies: dict, a: str, b: str, length: int, id_length: int, *, bar: float = 0.99, checkpoint: str = "last"
) -> dict:
    """``compare`` restricted to the seeds where both runs reach ``bar`` at the in-distribution length."""
    full = compare(studies, a, b, length, checkpoint=checkpoint)
    at_id = compare(studies, a, b, id_length, checkpoint=checkpoint)["per_seed"]
    ok = {r["seed"] for r in at_id if r["a"] >= 100 * bar and r["b"] >= 100 * bar}
    kept = [r for r in full["per_seed"] if r["seed"] in ok]
    out = {
        **{k: full[k] for k in ("a", "b", "length", "checkpoint")},
        "bar": bar,
        "seeds": [r["seed"] for r in kept],
        "per_seed": kept,
        # how many seeds of each method reach the bar at all: says why the subset is small or empty
        "at_bar": {"a": sum(r["a"] >= 100 * bar for r in at_id), "b": sum(r["b"] >= 100 * bar for r in at_id)},
        "of_seeds": len(at_id),
    }
    if kept:
        d = [r["d"] for r in kept]
        out.update(mean=statistics.fmean(d), ci=bootstrap_mean_interval(d), t_ci=t_mean_interval(d), p=sign_flip_p(d))
    return out


def analyse(
    archive: dict,
    pairs: Sequence[tuple[str, str]],
    *,
    endpoint: int,
    lengths: Sequence[int],
    id_length: int,
    margin: float,
    checkpoint: str = "last",
) -> dict:
    """The pre-registered analysis of a study archive: for each pair (A, B) the comparison at every length of
    ``lengths``; for the first pair (the primary one) also the decision at ``endpoint``, the converged-seed subset
    and the regression on the in-distribution difference."""
    studies = archive["studies"]
    out = {
        "format": "longsparse-paired-analysis",
        "checkpoint": checkpoint,
        "endpoint": endpoint,
        "id_length": id_length,
        "margin": margin,
        "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED},
        "pairs": [],
    }
    for i, (a, b) in enumerate(pairs):
        row = {
            "a": a,
            "b": b,
            "by_length": {
                str(L): compare(studies, a, b, L, id_length=id_length, checkpoint=checkpoint) for L in lengths
            },
        }
        if i == 0:
            prim = compare(studies, a, b, endpoint, id_length=id_length, checkpoint=checkpoint)
            row["primary"] = prim
            row["verdict"] = decide(prim["ci"], prim["p"], margin=margin) if "ci" in prim else "no data"
            row["converged"] = converged_subset(studies, a, b, endpoint, id_length, checkpoint=checkpoint)
        out["pairs"].append(row)
    return out


def _fmt_ci(ci) -> str:
    return f"[{ci[0]:+.1f}, {ci[1]:+.1f}]" if ci else "–"


def markdown(result: dict, train_length: int = 64) -> str:
    """Tables of an ``analyse`` result: per pair and length the mean difference with its interval, p, signs and
    robustness, then the per-seed numbers of the primary pair."""
    lines = []
    prim = result["pairs"][0] if result["pairs"] else None
    if prim is not None:
        p = prim["primary"]
        n = len(p["seeds"])
        lines.append(
            f"**Primary endpoint** ({prim['a']} − {prim['b']} at {result['endpoint']} tokens, "
            f"{result['endpoint'] // train_length}×, {result['checkpoint']} checkpoint, {n} seeds): "
            + (
                f"{p['mean']:+.1f} points, 95 % bootstrap interval {_fmt_ci(p['ci'])} (the decision's), "
                f"t-interval {_fmt_ci(p.get('t_ci'))}, sign-flip p = {p['p']:.3f} → **{prim['verdict']}** "
                f"(margin ±{result['margin']:g} points)."
                if n
                else "no seed has both runs yet."
            )
        )
        reg = p.get("regression")
        if reg and reg.get("a") is not None:
            lines.append(
                f"At equal in-distribution accuracy (intercept of D = a + b·Δ1×): a = {reg['a']:+.1f} "
                f"{_fmt_ci(reg['a_ci'])}, b = {reg['b']:+.2f} {_fmt_ci(reg['b_ci'])}."
            )
        c = prim["converged"]
        bar = f"{100 * c['bar']:g} %"
        if c["seeds"]:
            lines.append(
                f"Seeds where both reach ≥ {bar} at 1× ({len(c['seeds'])}): {c['mean']:+.1f}, t-interval "
                f"{_fmt_ci(c.get('t_ci'))}, bootstrap {_fmt_ci(c['ci'])}, p = {c['p']:.3f}."
            )
        elif n and "at_bar" in c:
            lines.append(
                f"No seed has both runs at ≥ {bar} at 1× ({prim['a']} reaches it in {c['at_bar']['a']} of "
                f"{c['of_seeds']} seeds, {prim['b']} in {c['at_bar']['b']})."
            )
        lines.append("")
    lines += [
        "| A − B | length | × | seeds | mean (points) | 95 % t-interval | 95 % bootstrap (below 95 % at few seeds) "
        "| sign-flip p | + / − | robust |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["pairs"]:
        for L, r in row["by_length"].items():
            if not r["seeds"]:
                continue
            lines.append(
                f"| {row['a']} − {row['b']} | {L} | {int(L) // train_length} | {len(r['seeds'])} | "
                f"{r['mean']:+.1f} | {_fmt_ci(r.get('t_ci'))} | {_fmt_ci(r['ci'])} | {r['p']:.3f} | {r['positive']} / "
                f"{r['negative']} | {'yes' if r['robust'] else 'no'} |"
            )
    if prim is not None and prim["primary"]["seeds"]:
        rows = prim["primary"]["per_seed"]
        with_id = all("d_id" in r for r in rows)  # the in-distribution difference, when both runs have it
        caption = (
            f"Per seed at {result['endpoint']} tokens ({prim['a']} / {prim['b']} exact match %, "
            "difference; * = Wilson intervals disjoint" + ("; the same difference at 1×" if with_id else "") + "):"
        )
        head = f"| seed | {prim['a']} | {prim['b']} | difference |" + (" difference at 1× |" if with_id else "")
        lines += ["", caption, "", head, "|---|---|---|---|" + ("---|" if with_id else "")]
        for r in rows:
            lines.append(
                f"| {r['seed']} | {r['a']:.1f} | {r['b']:.1f} | {r['d']:+.1f}{'*' if r['disjoint'] else ''} |"
                + (f" {r['d_id']:+.1f} |" if with_id else "")
            )
    return "\n".join(lines) + "\n"


def forest_plot(result: dict, path, train_length: int = 64, tight: bool = False):
    """Per-seed differences (dots) and the mean with its t-interval (bar; none for one seed) for every pair and
    length; returns the path, or None without matplotlib. ``tight``: crop the PNG to the drawing's bounding box
    (long pair labels would be cut off otherwise)."""
    plt = plotting.pyplot_or_none()
    if plt is None:
        return None
    rows = [
        (f"{row['a']} − {row['b']}, {int(L) // train_length}×", r)
        for row in result["pairs"]
        for L, r in row["by_length"].items()
        if r["seeds"]
    ]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    for y, (_, r) in enumerate(reversed(rows)):
        if r.get("t_ci"):
            ax.plot(r["t_ci"], [y, y], color="black", lw=2)
        ax.plot([r["mean"]], [y], "D", color="black")
        ax.scatter([s["d"] for s in r["per_seed"]], [y + 0.18] * len(r["per_seed"]), s=12, color="tab:blue")
    ax.axvline(0, color="grey", lw=1)
    ax.set_yticks(range(len(rows)), [label for label, _ in reversed(rows)], fontsize=8)
    ax.set_xlabel("exact match difference, points (dots: seeds; bar: mean, 95 % t-interval over seeds)")
    return plotting.save(fig, path, dpi=100, **({"bbox_inches": "tight"} if tight else {}))
