# Copyright (c) 2019 DeepSPIN. MIT License: see LICENSE in this folder.
# entmax/test_topk.py of the `entmax` package at tag v1.3 (github.com/deep-spin/entmax, commit 4a9eb7f), run against
# longsparse's drop-in names. Adapted: the import (entmax.activations -> longsparse); test_entmax_topk and test_sparsemax_topk removed: they test the package's private sort helpers (_entmax_threshold_and_support, _sparsemax_threshold_and_support), which are not part of its public names. Kept otherwise as upstream wrote it (not reformatted, so that it
# diffs against upstream); tests/entmax_v13/__init__.py says what the suite checks.
import pytest
import torch
from torch.autograd import gradcheck


from longsparse import (
    Sparsemax,
    Entmax15,
)


@pytest.mark.parametrize("dim", (0, 1, 2))
@pytest.mark.parametrize("Map", (Sparsemax, Entmax15))
def test_mapping(dim, Map):
    f = Map(dim=dim, k=3)
    x = torch.randn(3, 4, 5, requires_grad=True, dtype=torch.float64)
    gradcheck(f, (x,))
