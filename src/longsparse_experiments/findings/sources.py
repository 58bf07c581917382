"""The committed results stores as the cross-study analyses read them: per-seed exact-match records relabelled
into the study-view shape that ``longsparse.report.paired.analyse`` takes. Nothing is recomputed from models."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from longsparse.report import store
from longsparse_experiments.study import load_study
from longsparse_experiments.study_records import view

#: The five mappings of the synthetic study, in its table order.
METHODS = ["softmax", "ssmax", "adatemp", "entmax", "asentmax"]
#: The fields of a per-seed record that the paired analysis reads.
SEED_FIELDS = ("exact_match", "ci", "n")


class Stores:
    """The results stores under a repository root (``results/...``), each read once.

    ``root``: the folder holding ``results/`` (and the study files named relative to it)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._records: dict[str, list[dict]] = {}

    def records(self, store_dir: str) -> list[dict]:
        """The records of the store ``store_dir`` (relative to the root), in store order."""
        if store_dir not in self._records:
            path = self.root / store_dir
            records = store.read_records(path)
            if not records:
                raise FileNotFoundError(f"no records in {path} (run from the repository root, or pass --root)")
            self._records[store_dir] = records
        return self._records[store_dir]

    def studies(self, store_dir: str, study_file: str | None = None) -> dict:
        """The report's view (per study, method, checkpoint, length and seed) of a results store, by the studies
        of ``study_file`` (relative to the root; default: the packaged synthetic study)."""
        spec = load_study("synthetic", path=str(self.root / study_file) if study_file else None)
        return view(spec, self.records(store_dir), printer=None)["studies"]

    @cached_property
    def archive(self) -> dict:
        """The synthetic study's view of ``results/synthetic`` (the archived cells)."""
        return self.studies("results/synthetic")

    def beyond(self, store_dir: str, study: str, length: int, ckpt: str = "last") -> dict:
        """{method: {seed: record}} of the stored evaluations of ``study``'s runs at ``length`` (a length the
        study file does not list, so not in its view): the later record of a run wins."""
        out: dict = {}
        for rec in self.records(store_dir):
            for r in rec["results"] if rec["study"] == study else []:
                if r["length"] == length and r["checkpoint"] == ckpt:
                    out.setdefault(rec["method"], {})[str(rec["seed"])] = {k: r[k] for k in SEED_FIELDS}
        return out


def series(study: dict, method: str, ckpt: str = "last") -> dict:
    """{length: {seed: record}} of one method of a study view (records as the view holds them)."""
    key = next(k for k in study["series"] if k.split("/")[0] == method)
    return {L: dict(v.get("per_seed", {})) for L, v in study["series"][key].get(ckpt, {}).items()}


def has_method(study: dict, method: str) -> bool:
    """Whether the study view has a series of ``method``."""
    return any(k.split("/")[0] == method for k in study["series"])


def pseudo(named: dict[str, dict], ckpt: str = "last") -> dict:
    """A study view of one study whose 'methods' are the given labels: {label: {length: {seed: record}}} ->
    the shape ``paired.analyse`` reads (study "x", series "<label>/x")."""
    return {
        "studies": {
            "x": {
                "series": {
                    f"{label}/x": {
                        ckpt: {
                            str(L): {"per_seed": {str(s): r for s, r in seeds.items()}} for L, seeds in by_len.items()
                        }
                    }
                    for label, by_len in named.items()
                }
            }
        }
    }
