"""A run's identity: the resolved config without the settings that choose how it is computed, and its hash; the
schema version of run configs."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

# The form of the run configs this code writes and reads (the key ``schema_version`` of a resolved config). A
# config in an older form is rewritten once by ``longsparse migrate`` (``longsparse.migrate``), which keeps the hash
# it had as ``legacy_hash`` where the rewrite changes it.
SCHEMA_VERSION = 3

# Keys of a run config that say how it is written, not what it computes: its schema version and the hash it had
# before a migration. config.json keeps them; the identity, and so the hash, does not.
FORM_KEYS = ("schema_version", "legacy_hash")

# Settings that choose how a run is computed, not what it computes (every attention backend is tested equal to the
# reference, the compiled training step to the eager one; a task's cache folder only says where derived files live;
# DDP and FSDP compute the same update): they are not part of a run's identity, so a run resumes, and an archived
# result stays valid, under another choice, and configs written before such a setting existed keep their identity.
# Each entry is a key path into the resolved config.
NOT_IDENTITY = (
    ("model", "attention", "attn_backend"),
    ("task", "params", "cache_dir"),
    ("train", "compile"),
    ("train", "parallel"),
    *((key,) for key in FORM_KEYS),
)


# Settings added after run configs were first written, with the value that leaves them unused: the identity
# leaves such a setting out at that value, so that the configs written before it existed keep their identity.
ABSENT_AT = ((("train", "length_curriculum"), None),)


def run_identity(cfg: Mapping) -> dict:
    """``cfg`` as plain JSON data without the ``NOT_IDENTITY`` settings and the ``ABSENT_AT`` ones at their
    unused value: what two runs must share to be one run."""
    out = json.loads(json.dumps(cfg, sort_keys=True))
    for path in NOT_IDENTITY:
        _parent(out, path).pop(path[-1], None)
    for path, unused in ABSENT_AT:
        parent = _parent(out, path)
        if path[-1] in parent and parent[path[-1]] == unused:
            del parent[path[-1]]
    return out


def _parent(cfg: dict, path: tuple) -> dict:
    """The table holding ``path``'s last key ({} where a table on the way is missing)."""
    node = cfg
    for p in path[:-1]:
        node = node.get(p) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def config_hash(cfg: Mapping) -> str:
    """The short hash of a run's identity (``run_identity``) that checkpoints and archives record."""
    return hashlib.sha256(json.dumps(run_identity(cfg), sort_keys=True).encode()).hexdigest()[:16]


def config_diff(a: Mapping, b: Mapping, prefix: str = "") -> list[str]:
    """Human-readable differences ``key: a -> b`` between two nested dicts."""
    out = []
    for k in sorted(set(a) | set(b), key=str):
        va, vb = a.get(k, "<missing>"), b.get(k, "<missing>")
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            out += config_diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r} -> {vb!r}")
    return out
