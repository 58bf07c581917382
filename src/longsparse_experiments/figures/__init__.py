"""The analyses of paper [A] as figures (docs/method.md §7), each a PNG with its numbers in a JSON file next to it;
one module per analysis, one plotting style (``style``).

    longsparse figures --out docs/figures [--runs RUN ...] [--quick] [--only 1,3,6]

1. ``zero_crossing``  α-entmax(z/θ), z = [2.0, 1.8, 1.6, 1.4, 1.2], as 1/θ grows; the inverse temperature at which
                      each entry reaches exactly zero, in closed form (checked by bisection on ``ls.entmax``).
2. ``p0_grid``        p₀ of z = [0, z₁, z₂] over a grid, per α, plus top-2 softmax.
3. ``dispersion``     normalised entropy H(p)/log n and support size vs n: (a) synthetic logits (one signal logit
                      + n−1 Gaussian noise logits), (b) measured inside trained models on long inputs.
4. ``scales``         learned ASEntmax scale per head vs position in a trained model, fitted by βn, δ + β log n
                      and δ + β (log n)^γ (least squares; R² and RMSE per head per fit).
5. ``profiles``       mean attention weight vs query–key distance for 1.5-entmax under NoPE / ALiBi / RoPE.
6. ``threshold``      appending tokens whose logits are below the entmax threshold leaves every existing weight
                      exactly unchanged; softmax always leaks mass to them.

Figures 3b, 4 and 5 need trained models: the run directories given with ``--runs`` (``longsparse train``), or,
without ``--runs``, small flip-flop models trained here and cached in ``<out>/runs/`` (``--quick``:
``<out>/runs/quick/``) (``context.DEFAULT_RUNS``; a rerun finds them complete and only reloads them). Everything
is seeded. The numbers are computed in float64 where the figure is about exactness (1, 2, 6) and in the models'
own float32 otherwise.

A new analysis is a module here with ``figure(ctx: Context) -> Figure`` (``context``), entered in
``make.ANALYSES`` (its position is its figure number).
"""

from longsparse_experiments.figures.make import ANALYSES, FIGURES, add_cli, make_figures, parse_only

__all__ = ["ANALYSES", "FIGURES", "add_cli", "make_figures", "parse_only"]
