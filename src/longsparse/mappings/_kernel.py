"""Builds and loads the fused CPU entmax kernel (_entmax_cpu.cpp) on first use.

The build needs a C++ compiler and ninja (both on the project's machines); it takes ~30–60 s once and
is cached by torch under ~/.cache/torch_extensions. If it cannot be built, or LONGSPARSE_KERNEL=0 is
set, everything falls back to the pure-PyTorch solver (same results, slower) with one warning.
"""

from __future__ import annotations

import hashlib
import os
import platform
import warnings
from pathlib import Path

import torch

_SOURCE = Path(__file__).with_name("_entmax_cpu.cpp")
_module = None
_failed = False


def _build_name() -> str:
    # -march=native code is only valid on the CPU it was built for: key the cache on the CPU too
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu += next((line for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    digest = hashlib.sha1(_SOURCE.read_bytes() + cpu.encode()).hexdigest()[:12]
    return f"longsparse_entmax_cpu_{digest}"


def enabled() -> bool:
    return os.environ.get("LONGSPARSE_KERNEL", "1") != "0"


def get():
    """The compiled module, or None when unavailable (disabled, no compiler, build error)."""
    global _module, _failed
    if _module is not None or _failed or not enabled():
        return _module
    try:
        from torch.utils.cpp_extension import load

        _module = load(
            name=_build_name(),
            sources=[str(_SOURCE)],
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as exc:  # noqa: BLE001 - any build failure means: use the fallback
        _failed = True
        warnings.warn(
            f"longsparse: fused CPU entmax kernel unavailable ({type(exc).__name__}: {exc}); "
            "using the pure-PyTorch solver",
            RuntimeWarning,
            stacklevel=2,
        )
    return _module


def usable_on(device) -> bool:
    """Whether the kernel may take tensors on `device`: CPU only (it reads raw data pointers; given CUDA
    tensors it crashed the process), and only when it is built."""
    return torch.device(device).type == "cpu" and get() is not None
