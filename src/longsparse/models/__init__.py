"""Models by architecture: ``transformer`` (``longsparse.nn.Transformer``) and ``hsa``
(``longsparse.hsa.HSAModel``, built from the ``longsparse.nn`` layers and calling ``longsparse.attention``).

    from longsparse.models import build_model, get_architecture, save_checkpoint
    model = build_model({"arch": "hsa", "method": "entmax", "chunk_size": 16}, vocab_size=64)
    save_checkpoint("m.pt", model)      # stores the arch; load_checkpoint rebuilds the right class

Every architecture takes every method (mapping + length scaler) and position scheme of ``longsparse.nn``.
A new architecture is an ``Architecture`` entry passed to ``register_architecture``.
"""

from longsparse.models.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from longsparse.models.registry import (
    ARCHITECTURES,
    DEFAULT_ARCH,
    Architecture,
    architecture_of,
    build_model,
    config_section,
    get_architecture,
    model_config,
    register_architecture,
)

__all__ = [
    "ARCHITECTURES",
    "DEFAULT_ARCH",
    "Architecture",
    "architecture_of",
    "build_model",
    "config_section",
    "get_architecture",
    "load_checkpoint",
    "model_config",
    "read_checkpoint",
    "register_architecture",
    "save_checkpoint",
]
