"""The experiments built on the library: the study runner (``reproduce``), the demo, the LM study
(``lm_study``), the paper's figures (``figures``, one module per analysis) and their presets (``configs/``,
package data: ``presets``). The ``longsparse`` command is ``longsparse_experiments.cli``.

This package imports ``longsparse``; ``longsparse`` never imports it (tests/integration/test_import_direction.py).
"""
