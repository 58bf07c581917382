"""The analyses behind the verdict rows of docs/findings.md that ``longsparse reproduce synthetic --analyse``
cannot compute, each written into ``docs/findings/<name>/`` (``analysis.json``, ``analysis.md``, a forest plot):

    longsparse findings cross-study [--root .] [--out docs/findings]   # C2: comparisons across studies and stores
    longsparse findings interval-coverage [--out docs/findings]        # C14: coverage of the seed-level intervals
    longsparse findings mechanism measure|summary|figure ...           # attention mass on the queried pair
    longsparse findings hsa-seeds [--store results/hsa_seeds] [--out DIR]
    longsparse findings matched-convergence [--prereg DIR] [--matched DIR] [--out DIR]
    longsparse findings per-method-lr [--store results/per_method_lr] [--out DIR]

* ``sources``            the committed results stores relabelled into the study-view shape ``paired.analyse`` reads.
* ``cross_study``        C2: NAPE vs RoPE, init, reruns, best checkpoint, the 256x / 1,024x records, the HSA and LM
                         studies, and the combined forest plot (``docs/findings/forest.png``).
* ``interval_coverage``  C14: a seeded simulation of how often the t- and bootstrap intervals cover the truth.
* ``mechanism``          the attention mass on the queried pair in trained models (``longsparse findings mechanism``).
* ``hsa_seeds``          the HSA six-seed study: how often each variant trains, rows B1-B7
                         (``longsparse findings hsa-seeds``).
* ``matched_convergence`` the matched-convergence study: each (method, seed) at the budget that fits 1×, ASEntmax −
                         softmax at equal fit and the protocol's decision (``longsparse findings matched-convergence``).
* ``per_method_lr``      the per-method lr study: the lr each method selects, then ASEntmax − softmax at those lrs
                         and the protocol's decision (``longsparse findings per-method-lr``).
* ``output``             the one-line per-seed summary and the analysis.json / analysis.md writer they share.

``cross-study`` and ``interval-coverage`` read committed files only, and their tests re-render the committed outputs
byte for byte; ``mechanism measure`` reads run folders (trained models), the rest read its measured files.
"""

from longsparse_experiments.findings.cli import add_cli

__all__ = ["add_cli"]
