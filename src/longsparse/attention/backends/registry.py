"""`Backend`: a named attention backend, its capabilities as data (`attention/capabilities.py`) and how it runs
a call; `BACKENDS`, the registry in the order auto and explain list them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from torch import Tensor

from longsparse.attention.call import AttentionCall
from longsparse.attention.capabilities import Capabilities, check, table, table_row


@dataclass(frozen=True)
class Backend:
    """name; summary (one line); capabilities: what it takes, one `Capabilities` per group of devices (the
    first whose devices include the call's decides); run(call) -> (B, H, Nq, Dv) for a call it takes.

    extra(call) -> None | reason: what data cannot say, asked after the data check (a module that imports
    lazily, an environment switch, a kernel that may not have been built); also: what it checks, for the
    table. A backend without native key ranges runs the call with them folded into attn_mask."""

    name: str
    summary: str
    capabilities: Tuple[Capabilities, ...]
    run_call: Callable[[AttentionCall], Tensor]
    extra: Optional[Callable[[AttentionCall], Optional[str]]] = None
    also: str = ""

    def __post_init__(self):
        if not self.capabilities:
            raise ValueError(f"backend {self.name!r} declares no capabilities")

    def capabilities_for(self, device_type: str) -> Optional[Capabilities]:
        return next((c for c in self.capabilities if c.takes_device(device_type)), None)

    def supports(self, call: AttentionCall) -> Optional[str]:
        """None when the backend takes `call`, else a one-line reason: `check` against its capabilities for
        the call's device, then its extra check."""
        caps = self.capabilities_for(call.device_type)
        if caps is None:
            if len(self.capabilities) == 1:
                return check(self.capabilities[0], call)
            devices = [d for c in self.capabilities for d in c.devices]
            return f"tensors on {call.device_type}: {self.name} takes {', '.join(devices)} tensors only"
        reason = check(caps, call)
        if reason is None and self.extra is not None:
            reason = self.extra(call)
        return reason

    def run(self, call: AttentionCall) -> Tensor:
        caps = self.capabilities_for(call.device_type)
        return self.run_call(call if caps is not None and caps.key_ranges else call.with_key_ranges_as_mask())

    def table_rows(self):
        """This backend's rows of the capability table: one per group of devices."""
        return [table_row(self.name, caps, self.also) for caps in self.capabilities]


BACKENDS: Dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Adds `backend` to `BACKENDS` (which enrols it in tests/unit/attention/test_backends.py's equality grid)."""
    if backend.name in BACKENDS:
        raise ValueError(f"attention backend {backend.name!r} is already registered")
    BACKENDS[backend.name] = backend
    return backend


def capability_table() -> str:
    """The capability table of every registered backend (docs/architecture.md holds it)."""
    return table([row for backend in BACKENDS.values() for row in backend.table_rows()])
