"""The fused CPU kernel's build time under the name the training loop reads it by (``_kernel.build_seconds()``);
the kernel itself is built and loaded by `longsparse.cpu_kernel`."""

from __future__ import annotations

from longsparse.cpu_kernel import build_seconds

__all__ = ["build_seconds"]
