"""The `chunked` backend: query blocks with a recomputing backward in PyTorch (attention/chunked.py): O(block ×
Nk) memory, every mapping, any device."""

from __future__ import annotations

from longsparse.attention.backends.registry import Backend
from longsparse.attention.capabilities import Capabilities
from longsparse.attention.chunked import chunked_attention

CAPABILITIES = Capabilities()

BACKEND = Backend(
    "chunked",
    "query blocks with a recomputing backward (PyTorch): O(block × Nk) memory",
    (CAPABILITIES,),
    chunked_attention,
)
