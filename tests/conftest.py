"""Fixtures every test folder shares, and the collection hook that marks tests/integration. The code that test
modules share (oracles, grids, tiny configs, paths) is in tests/helpers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.mappings import PATHS, kernel_available, solver_path


@pytest.fixture(params=PATHS)
def path(request):
    """Each mapping test once per solver path ("kernel", "torch")."""
    with solver_path(request.param):
        yield request.param


@pytest.fixture(scope="session", autouse=True)
def _kernel_built_once():
    """Build (or load) the fused CPU kernel before the first test: its build announces itself on stderr, which
    tests of one-line error messages must not see."""
    kernel_available()


@pytest.fixture(autouse=True)
def _seed_torch():
    """Deterministic torch.randn & co. in every test (hypothesis draws its own data)."""
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: a second intra-op thread only adds contention on a shared 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


INTEGRATION = Path(__file__).resolve().parent / "integration"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark every test under tests/integration `integration` (before -m selects), so that `-m integration` and
    `-m "not integration"` pick by folder; the default run keeps them."""
    for item in items:
        if item.path.is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.integration)
