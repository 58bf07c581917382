"""Checkpoints: model weights + config (as a plain dict) [+ optimizer state, + extra metadata].

Saved with torch.save, loaded with torch.load(weights_only=True). A file is written to a temporary
name in the same folder and moved into place with os.replace, so a crash never leaves a half-written
checkpoint under the real name; an existing file is replaced only with overwrite=True.

The file names its model's architecture (``arch``; files without the key are "transformer") and stores the
architecture's config as a dict; ``load_checkpoint`` rebuilds the model through the registry of
``longsparse.models`` (``longsparse.models.registry``, which loads no model code until an architecture is used).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from longsparse.models.registry import DEFAULT_ARCH, architecture_of, get_architecture

FORMAT = "longsparse-checkpoint"
# The layout of a checkpoint; 2: its model config in the stored form of run config schema 3 (the attention
# settings as the table ``attention``). An older one is rewritten once by ``longsparse migrate``.
VERSION = 2


def save_checkpoint(
    path: str,
    model: nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = None,
    extra: Optional[Dict[str, Any]] = None,
    overwrite: bool = False,
    model_state: Optional[Dict[str, torch.Tensor]] = None,
) -> str:
    """Save ``model`` (its config and state dict), optionally the optimizer state and ``extra``
    (plain python values / tensors). ``model_state``: the weights to store instead of ``model.state_dict()``
    (the whole model gathered from FSDP shards). Raises FileExistsError if ``path`` exists and not overwrite."""
    path = os.fspath(path)
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it")
    cfg = getattr(model, "cfg", None)
    try:
        arch = architecture_of(cfg)
    except TypeError:
        raise TypeError(
            f"save_checkpoint needs a model of a registered architecture (its .cfg a config of one), "
            f"got a {type(model).__name__} with .cfg of type {type(cfg).__name__}"
        ) from None
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "arch": arch,
        "config": cfg.to_dict(),
        "model": {k: v.detach().cpu() for k, v in (model.state_dict() if model_state is None else model_state).items()},
    }
    if optimizer is not None:
        payload["optimizer"] = optimizer.state_dict()
    if extra is not None:
        payload["extra"] = extra
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_checkpoint(path: str, map_location="cpu") -> Dict[str, Any]:
    """The raw payload, validated; ValueError naming the file if unreadable or not a checkpoint."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated zip, garbage, pickle errors, ...
        raise ValueError(f"{path}: not a readable checkpoint (corrupt or truncated?): {type(e).__name__}: {e}") from e
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path}: not a longsparse checkpoint (missing format tag)")
    if payload.get("version") != VERSION:
        older = isinstance(payload.get("version"), int) and payload["version"] < VERSION
        hint = f": rewrite it once with `longsparse migrate {path}`" if older else ""
        raise ValueError(f"{path}: unsupported checkpoint version {payload.get('version')!r}{hint}")
    for key in ("config", "model"):
        if not isinstance(payload.get(key), dict):
            raise ValueError(f"{path}: checkpoint has no {key!r} dict")
    for name, t in payload["model"].items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(
                f"{path}: not a usable checkpoint: weight {name!r} holds NaN or inf (the run diverged, or the file "
                f"was damaged); use another checkpoint"
            )
    return payload


def load_checkpoint(
    path: str, map_location="cpu", optimizer: Optional[torch.optim.Optimizer] = None, model: Optional[nn.Module] = None
) -> Tuple[nn.Module, Dict[str, Any]]:
    """Rebuild the model of the stored architecture from the stored config (or fill the given ``model``) and
    load its weights; load the optimizer state into ``optimizer`` if given. Returns (model, extra)."""
    payload = read_checkpoint(path, map_location)
    try:
        arch = get_architecture(payload.get("arch", DEFAULT_ARCH))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    config_cls, model_cls = arch.config_cls, arch.model_cls
    try:
        cfg = config_cls.from_dict(dict(payload["config"]))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: invalid model config: {e}") from e
    if model is None:
        model = model_cls(cfg)
    elif getattr(model, "cfg", None) is not None and model.cfg.to_dict() != cfg.to_dict():
        raise ValueError(f"{path}: the checkpoint's config differs from the given model's config")
    try:
        model.load_state_dict(payload["model"], strict=True)
    except RuntimeError as e:
        raise ValueError(f"{path}: weights do not match the config: {e}") from e
    if optimizer is not None:
        if "optimizer" not in payload:
            raise ValueError(f"{path}: no optimizer state stored")
        try:
            optimizer.load_state_dict(payload["optimizer"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise ValueError(f"{path}: optimizer state does not match: {e}") from e
    return model.to(map_location) if isinstance(map_location, (str, torch.device)) else model, payload.get("extra", {})
