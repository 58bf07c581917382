"""Triton, or what stands in for it where it is not installed: the kernel modules import `tl` from here so
their annotations (`tl.constexpr`) evaluate either way, and `TRITON_ERROR` says why the kernels cannot run."""

try:  # the kernels need Triton; without it, `supports` says so and nothing else is built
    import triton
    import triton.language as tl

    TRITON_ERROR: str | None = None
except ImportError as exc:  # pragma: no cover - exercised only where triton is absent
    import types

    triton = None
    tl = types.SimpleNamespace(constexpr=object)  # kernels' annotations still evaluate
    TRITON_ERROR = f"triton is not installed ({exc}); pip install 'longsparse[gpu]'"
