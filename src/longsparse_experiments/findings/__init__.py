"""The analyses behind the verdict rows of docs/findings.md that ``longsparse reproduce synthetic --analyse``
cannot compute, each written into ``docs/findings/<name>/`` (``analysis.json``, ``analysis.md``, a forest plot):

    longsparse findings cross-study [--root .] [--out docs/findings]   # C2: comparisons across studies and stores
    longsparse findings interval-coverage [--out docs/findings]        # C14: coverage of the seed-level intervals

* ``sources``            the committed results stores relabelled into the study-view shape ``paired.analyse`` reads.
* ``cross_study``        C2: NAPE vs RoPE, init, reruns, best checkpoint, the 256x / 1,024x records, the HSA and LM
                         studies, and the combined forest plot (``docs/findings/forest.png``).
* ``interval_coverage``  C14: a seeded simulation of how often the t- and bootstrap intervals cover the truth.

Both read committed files only; their tests re-render the committed outputs byte for byte.
"""

from longsparse_experiments.findings.cli import add_cli

__all__ = ["add_cli"]
