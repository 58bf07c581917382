"""The `entmax` package's own test suite (v1.3), run against longsparse's drop-in names.

`import longsparse as entmax`-style switching is what longsparse.mappings.compat promises: these files are
upstream's tests with only the imports changed (and the three adaptations their headers list), so every public
callable of the package (22 names, their keywords, k / n_iter, alpha in (0, 1) for entmax_bisect, tensor alpha
and budget) is checked by the package's own authors' expectations. The rest of the comparison with the package
(values and gradients to float64 precision, fp32, masks, errors) is in tests/unit/mappings/test_compat.py.
"""
