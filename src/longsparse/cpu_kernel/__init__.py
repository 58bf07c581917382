"""Builds and loads the fused CPU kernels on first use: one extension module from the C++ sources of the mapping
(mappings/csrc/: the α-entmax rows and their solver) and of attention (attention/csrc/: the fused_dense backend's
in-place scores and the fused_cpu backend's flash-style attention), which module.cpp includes and binds. This
module depends on no other layer of the library, so both layers use it.

The build needs a C++ compiler and ninja; it takes about a minute, once per machine, torch version and Python
version, and says so on stderr while it runs. If it cannot be built, or LONGSPARSE_KERNEL=0 is set, everything
falls back to the pure-PyTorch paths (same results, slower) with one warning.

The cache. Each build lives in its own folder under ``$XDG_CACHE_HOME/longsparse/kernels`` (default
``~/.cache/longsparse/kernels``; ``LONGSPARSE_KERNEL_CACHE`` overrides it), named by a hash of what the binary
depends on: every source and header (`FILES`), the CPU (``-march=native``), the torch version and the Python ABI.
A finished build is imported directly. torch's own loader is used only to build, on copies of the sources in the
build folder: it re-runs ninja whenever the recorded absolute paths change (another virtual environment's torch
headers, another checkout of the source), which rebuilt the same binary every time one switched environments.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch

_PACKAGE = Path(__file__).parents[1]  # longsparse/
# What the module is built from, relative to the package: the one translation unit, then the files it includes (by
# paths relative to themselves, so the build folder keeps this layout). The build's name hashes them all;
# tests/integration/test_packaging.py checks that every C++ file of the package is listed here and shipped in the wheel.
SOURCES = ("cpu_kernel/module.cpp",)
INCLUDED = (
    "mappings/csrc/entmax_cpu.cpp",
    "mappings/csrc/entmax_rows.h",
    "mappings/csrc/tau_solve.h",
    "attention/csrc/scores_cpu.cpp",
    "attention/csrc/attention_cpu.cpp",
)
FILES = SOURCES + INCLUDED
_CFLAGS = ["-O3", "-march=native", "-fopenmp"]
_LDFLAGS = ["-fopenmp"]
_module = None
_failed = False
_build_seconds = 0.0


def _build_name() -> str:
    # -march=native code is only valid on the CPU it was built for; the binary links against this torch and Python
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu += next((line for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    key = "\0".join([cpu, torch.__version__, sys.implementation.cache_tag or "", *_CFLAGS, *_LDFLAGS])
    digest = hashlib.sha1(key.encode())
    for rel in FILES:
        digest.update(b"\0" + rel.encode() + b"\0" + (_PACKAGE / rel).read_bytes())
    return f"longsparse_cpu_{digest.hexdigest()[:12]}"


def cache_root() -> Path:
    """The folder that holds one subfolder per kernel build."""
    env = os.environ.get("LONGSPARSE_KERNEL_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "longsparse" / "kernels"


def enabled() -> bool:
    return os.environ.get("LONGSPARSE_KERNEL", "1") != "0"


def build_seconds() -> float:
    """Seconds this process has spent compiling the kernel (0 when it was cached): a training loop leaves them
    out of its speed and ETA."""
    return _build_seconds


def _import_built(name: str, folder: Path):
    """The finished build in ``folder`` as a module, or None (not built yet, a build in progress, unloadable)."""
    lib = folder / f"{name}.so"
    if not lib.is_file() or (folder / "lock").exists():  # torch's build holds "lock" until the library is whole
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, lib)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except (ImportError, OSError):
        return None


def _build(name: str, folder: Path):
    global _build_seconds
    from torch.utils.cpp_extension import load

    for rel in FILES:  # fixed paths and contents: ninja sees the same sources on every later build
        copy, original = folder / rel, _PACKAGE / rel
        if not copy.is_file() or copy.read_bytes() != original.read_bytes():
            copy.parent.mkdir(parents=True, exist_ok=True)
            tmp = copy.with_name(f".{copy.name}.tmp-{os.getpid()}")
            shutil.copyfile(original, tmp)
            os.replace(tmp, copy)
    print(
        f"longsparse: building the fused CPU kernel in {folder} (once per machine, torch and Python version; "
        f"about a minute)...",
        file=sys.stderr,
        flush=True,
    )
    t0 = time.perf_counter()
    module = load(
        name=name,
        sources=[str(folder / rel) for rel in SOURCES],
        extra_cflags=_CFLAGS,
        extra_ldflags=_LDFLAGS,
        build_directory=str(folder),
        verbose=False,
    )
    _build_seconds += time.perf_counter() - t0
    print(f"longsparse: kernel built in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return module


def get():
    """The compiled module, or None when unavailable (disabled, no compiler, build error)."""
    global _module, _failed
    if _module is not None or _failed or not enabled():
        return _module
    try:
        name = _build_name()
        folder = cache_root() / name
        _module = _import_built(name, folder) or _build(name, folder)
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
