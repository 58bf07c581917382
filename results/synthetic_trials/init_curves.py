"""The ASEntmax initialisation comparison of docs/results.md: training curves of ASEntmax on mqmtar_inline with
the scale-aware default init (study mqmtar_inline) and the reference init (study mqmtar_inline_init).

    python results/synthetic_trials/init_curves.py [runs/reproduce] > /dev/null   # writes results/synthetic_trials/init_curves.json

Reads only the runs' metrics.jsonl (training loss every 100 steps, validation every 250) and prints a markdown
table: the first step whose loss is below 4 (leaving the initial plateau at ~5.5 = ln 256), the first step with
mean validation exact match >= 50% and >= 90%, the final loss and the final validation exact match. Also the
per-query scales s the two inits give at step 0 (ASEntmaxScaler on random unit-RMS inputs, as its input is the
RMS-normalised layer input) at d_model 64 (ours) and 512 (the paper's), at positions 0-63 and at 4,095.
"""

import json
import sys
from pathlib import Path

RUNS = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/reproduce")
OUT = Path(__file__).with_name("init_curves.json")
STUDIES = {"scale_aware (default)": "mqmtar_inline", "reference": "mqmtar_inline_init"}


def curve(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    loss = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    val = [(r["step"], r["val_mean_exact_match"]) for r in rows if "val_mean_exact_match" in r]

    def first(pairs, ok):
        return next((s for s, v in pairs if ok(v)), None)

    return {
        "loss": loss,
        "val": val,
        "steps": max(s for s, _ in loss),
        "first_loss_below_4": first(loss, lambda v: v < 4.0),
        "first_val_50": first(val, lambda v: v >= 0.5),
        "first_val_90": first(val, lambda v: v >= 0.9),
        "final_loss": loss[-1][1],
        "final_val": val[-1][1] if val else None,
    }


def init_scales(d_model: int, init: str, seed: int = 0) -> dict:
    import torch

    from longsparse.nn.scalers import ASEntmaxScaler

    torch.manual_seed(seed)
    scaler = ASEntmaxScaler(d_model, torch.ones(4, dtype=torch.bool), init=init)
    out = {}
    for name, pos in (("positions 0-63", torch.arange(64)), ("position 4095", torch.full((64,), 4095))):
        h = torch.randn(16, 64, d_model)
        h = h / h.pow(2).mean(-1, keepdim=True).sqrt()
        with torch.no_grad():
            s = scaler(h, pos.expand(16, 64))
        out[name] = {"min": s.min().item(), "median": s.median().item(), "max": s.max().item()}
    return out


def main() -> None:
    out = {}
    print("Per-query scale s at step 0 (min / median / max over 4 heads x 16 x 64 random unit-RMS inputs):\n")
    print("| init | d_model | positions 0-63 | position 4095 |")
    print("|---|---:|---|---|")
    for init in ("scale_aware", "reference"):
        for d in (64, 512):
            sc = init_scales(d, init)
            out[f"init_scales/{init}/d{d}"] = sc
            cells = [f"{v['min']:.2f} / {v['median']:.2f} / {v['max']:.2f}" for v in sc.values()]
            print(f"| {init} | {d} | {cells[0]} | {cells[1]} |")
    print()
    print(
        "| init | seed | steps | loss < 4 at step | val EM ≥ 50% at step | val EM ≥ 90% at step | final loss | final val EM |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for init, study in STUDIES.items():
        for run in sorted((RUNS / study).glob("asentmax-nape-s*")):
            if not (run / "metrics.jsonl").is_file():
                continue
            c = curve(run)
            out[f"{study}/{run.name}"] = {"init": init, **c}
            seed = run.name.rsplit("-s", 1)[1]
            fmt = lambda v: "never" if v is None else str(v)  # noqa: E731
            final_val = "-" if c["final_val"] is None else f"{100 * c['final_val']:.1f}%"
            print(
                f"| {init} | {seed} | {c['steps']} | {fmt(c['first_loss_below_4'])} | {fmt(c['first_val_50'])} | "
                f"{fmt(c['first_val_90'])} | {c['final_loss']:.3f} | {final_val} |"
            )
    OUT.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
