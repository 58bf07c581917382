"""The architectures by name: what a run config's ``model.arch`` and a checkpoint's ``arch`` tag select.

An architecture is a config dataclass (``vocab_size`` plus its own fields, ``to_dict`` / strict ``from_dict``)
and the ``nn.Module`` built from it (``Model(config)``, ``model.cfg`` the config). Method (the attention mapping
and its length scaler: softmax, entmax, asentmax, ...) and positions are fields of every architecture's config,
never an architecture.

This module imports no other part of longsparse when it loads: entries name their classes by import path and
resolve them on first use, so looking an architecture up by name (``longsparse.models.checkpoint`` rebuilding a
saved model) imports only the model code of that architecture.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

DEFAULT_ARCH = "transformer"


def _resolve(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Architecture:
    """One registered architecture.

    config_path, model_path: ``"module:Class"`` of its config dataclass and of its model.
    label_keys: keys of the config's stored form that a run's label lists when they differ from the defaults
    (``longsparse.train.run_label``; ``attention.X`` a key of its attention table). needles_path:
    ``"module:function"`` scoring needle retrieval of a trained model on the RULER-style tasks
    (``longsparse.evaluate`` adds it to a length sweep), or None."""

    name: str
    summary: str
    config_path: str
    model_path: str
    label_keys: Tuple[str, ...] = ()
    needles_path: Optional[str] = None

    @property
    def config_cls(self) -> type:
        return _resolve(self.config_path)

    @property
    def model_cls(self) -> type:
        return _resolve(self.model_path)

    @property
    def needle_scorer(self) -> Optional[Callable]:
        return None if self.needles_path is None else _resolve(self.needles_path)


ARCHITECTURES: Dict[str, Architecture] = {}


def register_architecture(arch: Architecture) -> Architecture:
    """Add ``arch`` to the registry (a name is registered once)."""
    if not isinstance(arch, Architecture):
        raise TypeError(f"expected an Architecture, got {type(arch).__name__}")
    if arch.name in ARCHITECTURES:
        raise ValueError(f"architecture {arch.name!r} is already registered")
    ARCHITECTURES[arch.name] = arch
    return arch


register_architecture(
    Architecture(
        "transformer",
        "Gemma-2-style decoder with full causal attention (longsparse.nn.Transformer)",
        "longsparse.nn.config:ModelConfig",
        "longsparse.nn.model:Transformer",
    )
)
register_architecture(
    Architecture(
        "hsa",
        "hierarchical sparse attention: sliding windows, chunk memory, per-token chunk retrieval "
        "(longsparse.hsa.HSAModel)",
        "longsparse.hsa.config:HSAConfig",
        "longsparse.hsa.model:HSAModel",
        label_keys=(
            "attention.method",
            "attention.positions",
            "landmark",
            "fusion",
            "weights",
            "retrieval",
            "topk",
            "encoder_layers",
            "hsa_positions",
            "length_scale",
            "hsa_local",
        ),
        needles_path="longsparse.hsa.diagnostics:score_needles",
    )
)


def get_architecture(name: str) -> Architecture:
    """The registered architecture ``name``; ValueError naming the registered ones otherwise."""
    if not isinstance(name, str) or name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; choose one of {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def architecture_of(obj: Any) -> str:
    """The name of the architecture of a model or a config (by type); TypeError for anything else."""
    for arch in ARCHITECTURES.values():
        if isinstance(obj, (arch.model_cls, arch.config_cls)):
            return arch.name
    raise TypeError(
        f"{type(obj).__name__} is not a model or config of a registered architecture ({', '.join(ARCHITECTURES)})"
    )


def model_config(section: Mapping[str, Any], vocab_size: Optional[int] = None):
    """The config object of a model section: ``{"arch": NAME (default transformer), <config fields>}``, with
    ``vocab_size`` given here or in the section. Unknown fields raise ValueError naming them."""
    fields = dict(section)
    arch = get_architecture(fields.pop("arch", DEFAULT_ARCH))
    if vocab_size is not None:
        fields["vocab_size"] = vocab_size
    return arch.config_cls.from_dict(fields)


def config_section(config) -> Dict[str, Any]:
    """The model section of a config object: its fields plus ``arch``, which is left out for the default
    architecture (so transformer sections read as they did before architectures had names)."""
    name = architecture_of(config)
    d = config.to_dict()
    return d if name == DEFAULT_ARCH else {"arch": name, **d}


def build_model(config, vocab_size: Optional[int] = None):
    """A fresh model of a config object, or of a model section (see ``model_config``)."""
    if isinstance(config, Mapping):
        config = model_config(config, vocab_size)
    return get_architecture(architecture_of(config)).model_cls(config)
