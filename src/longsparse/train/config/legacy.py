"""Run configs in the forms older code wrote, read as today's. ``resolve`` passes every model section through
here, so an old run folder keeps its identity, resumes and evaluates."""

from __future__ import annotations

from collections.abc import Mapping

from longsparse.models import ARCHITECTURES


def upgrade_legacy_model(model: Mapping) -> dict:
    """A model section written before ``model.arch`` existed, in today's form. Such sections named the HSA
    architecture as the method with the positions "hsa" and had no other token attention than softmax with RoPE
    (today's HSA defaults): the method becomes the architecture and both are dropped. Any other section is
    returned as it is."""
    model = dict(model)
    if "arch" not in model and model.get("method") in ARCHITECTURES:
        model["arch"] = model.pop("method")
        if model.get("positions") == model["arch"]:
            del model["positions"]
    return model
