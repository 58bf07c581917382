"""Portable run bundles: what a job with a wall-clock limit hands to the next job, on this machine or another.

    write_bundles(dest, runs, todo, ...)      # `longsparse reproduce ... --bundle-out DEST`
    restore_bundles(src, runs, store)         # `longsparse reproduce ... --resume-from SRC`

A bundle folder holds

* ``manifest.json`` (format ``longsparse-bundles``): every file with its size and SHA-256, the bundles placed and
  those left out by the size caps, and the job's summary (``summary``);
* ``records.tar.gz``: every file of the study's run folders except checkpoints (configs, metrics, logs, result
  files, unfinished evaluation states), the results store (``store/``), the report (``report/``) and the files
  at the top of the run root (a job script's logs);
* ``resume-<study>-<cell>.tar.gz`` for each cell with work left, in the study's cell order, as many as the caps
  allow: the run folder with its checkpoints. The ``last.pt`` of a finished training goes without the AdamW
  moments (a third of its size; `train` loads it, finds the run complete and trains nothing, so the moments are
  never read again); an unfinished one goes whole and resumes exactly. ``best.pt`` goes when the study evaluates
  that checkpoint. A bundle larger than ``part_bytes`` is split into ``.partK`` files of that size.

While a job runs, ``snapshot_records`` keeps a current ``records.tar.gz`` alone in the folder, so that a job
ended before its last step still leaves its records; ``write_bundles`` replaces it at the end.

Restoring checks every file against the manifest before anything is unpacked, unpacks each run folder whole (or
not at all) and never replaces what exists: a local run folder or store is newer than a bundle (a job on the
same machine left it).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from longsparse.io import atomic_open, atomic_torch_save, atomic_write_bytes, atomic_write_text, is_temp_name

FORMAT, VERSION = "longsparse-bundles", 1
MANIFEST, RECORDS = "manifest.json", "records.tar.gz"
PART_BYTES = 15 << 20
MANIFEST_RESERVE = 256 << 10  # bytes kept for manifest.json when the bundles are sized against a cap
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}


class BundleError(ValueError):
    """A bundle folder that cannot be written or restored (one line naming the file and the problem)."""


def parse_size(text: str | int, what: str = "size") -> int:
    """``"15MiB"``, ``"15M"``, ``"512k"``, ``"1G"`` or a number of bytes -> bytes (units are powers of 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise BundleError(f"{what} {text!r}: give bytes or a number with K, M or G (KiB, MiB, GiB), e.g. 15MiB")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value < 1:
        raise BundleError(f"{what} {text!r} must be at least 1 byte")
    return value


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def bundle_name(run: str) -> str:
    """The bundle file of the run folder ``run`` (``<study>/<cell>``, relative to the run root)."""
    return "resume-" + run.replace("/", "-") + ".tar.gz"


def check_destination(dest: str | Path, *, own_snapshot: bool = False) -> Path:
    """``dest`` if bundles may be written there: absent or an empty folder (checked before a job starts, so that
    its end never fails on, or writes over, an earlier job's files), or, with ``own_snapshot`` (the job's end,
    after that check), a folder holding only the job's own ``snapshot_records``."""
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise BundleError(f"--bundle-out {dest}: not a folder; give a new or empty one (nothing was written)")
    there = sorted(p.name for p in dest.iterdir()) if dest.is_dir() else []
    if there and not (own_snapshot and there == [RECORDS]):
        raise BundleError(f"--bundle-out {dest}: not an empty folder; give a new or empty one (nothing was written)")
    return dest


# ---- packing ----------------------------------------------------------------------------------------------------
def slim_checkpoint(src: Path, dest: Path) -> None:
    """``src`` (a finished run's last.pt) without the AdamW moments, written to ``dest``: the model, the step,
    the RNG states and an optimizer state without per-parameter entries (AdamW loads it; `train` stops at once
    because the step is the last)."""
    from longsparse.models import read_checkpoint

    payload = read_checkpoint(str(src))
    opt = payload.get("optimizer") or {}
    payload["optimizer"] = {"state": {}, "param_groups": opt.get("param_groups", [])}
    atomic_torch_save(payload, dest)


def _skipped(p: Path) -> bool:
    return p.is_dir() or p.name == ".lock" or is_temp_name(p.name)


def pack_run(run: Path, runs: Path, dest: Path, *, finished: bool, checkpoints: Sequence[str]) -> tuple[Path, int]:
    """Pack the run folder ``run`` (under the run root ``runs``) into ``dest`` (.tar.gz): every file but locks
    and temporaries, of the checkpoints only those named in ``checkpoints`` ("last" always), last.pt slimmed
    (``slim_checkpoint``) when the training is ``finished``. Returns (dest, its size)."""
    keep = {"last.pt", *(f"{c}.pt" for c in checkpoints)}
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(dest, "w:gz", compresslevel=1) as tf:
        for p in sorted(run.rglob("*")):
            if _skipped(p):
                continue
            name = p.relative_to(runs).as_posix()
            if p.parent.name == "checkpoints" and p.parent.parent == run:
                if p.name not in keep:
                    continue
                if p.name == "last.pt" and finished:
                    slim = Path(tmp) / "last.pt"
                    slim_checkpoint(p, slim)
                    tf.add(slim, arcname=name)
                    continue
            tf.add(p, arcname=name)
    return dest, dest.stat().st_size


def _add_copy(tf: tarfile.TarFile, path: Path, arcname: str) -> None:
    """Add ``path``'s content as read now (a worker may be rewriting it: the member is that one read, whole);
    a file gone since it was listed (a temporary state replaced) is left out."""
    try:
        data, mtime = path.read_bytes(), path.stat().st_mtime
    except FileNotFoundError:
        return
    info = tarfile.TarInfo(arcname)
    info.size, info.mtime, info.mode = len(data), int(mtime), 0o644
    tf.addfile(info, io.BytesIO(data))


def pack_records(
    dest: Path, runs: Path, study_dirs: Iterable[str], store: Optional[Path], report: Optional[Path]
) -> int:
    """``records.tar.gz``: the run folders of ``study_dirs`` without checkpoints (``runs/...``), the store's
    records (``store/``), the report folder (``report/``) and the files at the top of ``runs``. Returns its
    size. Written atomically, and safe while workers still write into the run folders (each file as read once)."""
    with atomic_open(dest, "wb") as f, tarfile.open(fileobj=f, mode="w:gz") as tf:
        for d in study_dirs:
            for p in sorted((runs / d).rglob("*")) if (runs / d).is_dir() else []:
                if not _skipped(p) and p.suffix != ".pt":
                    _add_copy(tf, p, "runs/" + p.relative_to(runs).as_posix())
        for p in sorted(runs.iterdir()) if runs.is_dir() else []:
            if p.is_file() and not _skipped(p):
                _add_copy(tf, p, "runs/" + p.name)
        for prefix, folder in (("store", store), ("report", report)):
            if folder is None or not folder.is_dir() or (prefix == "report" and store is not None and folder == store):
                continue
            for p in sorted(folder.iterdir()):
                if p.is_file() and not _skipped(p):
                    _add_copy(tf, p, f"{prefix}/{p.name}")
    return dest.stat().st_size


def snapshot_records(
    dest: str | Path,
    runs: str | Path,
    study_dirs: Iterable[str],
    store: Optional[str | Path] = None,
    report: Optional[str | Path] = None,
) -> int:
    """The records as they are now (``pack_records``) into ``dest/records.tar.gz``, so that a job ended early
    leaves them there; ``dest`` must be new, empty or hold only an earlier snapshot. Returns its size."""
    dest = check_destination(dest, own_snapshot=True)
    dest.mkdir(parents=True, exist_ok=True)
    return pack_records(
        dest / RECORDS,
        Path(runs),
        study_dirs,
        Path(store).resolve() if store is not None else None,
        Path(report).resolve() if report is not None else None,
    )


def write_bundles(
    dest: str | Path,
    runs: str | Path,
    todo: Sequence[dict],
    *,
    study_dirs: Iterable[str],
    store: Optional[str | Path] = None,
    report: Optional[str | Path] = None,
    summary: Optional[dict] = None,
    max_bytes: Optional[int] = None,
    max_files: Optional[int] = None,
    part_bytes: int = PART_BYTES,
    printer: Callable[[str], None] = print,
) -> dict:
    """Write a bundle folder (module docstring) to ``dest`` (absent or empty): ``records.tar.gz``, then one
    bundle per entry of ``todo`` ({"run": "<study>/<cell>", "finished": training done, "checkpoints": the
    study's}), in that order, while ``max_bytes`` (all files together) and ``max_files`` allow; a bundle that
    does not fit is left out (named in the manifest) and a later, smaller one may still fit. Writes
    ``manifest.json`` last and returns it. ``dest`` may hold this job's ``snapshot_records`` (replaced)."""
    dest, runs = check_destination(dest, own_snapshot=True), Path(runs)
    dest.mkdir(parents=True, exist_ok=True)
    store_p = Path(store).resolve() if store is not None else None
    report_p = Path(report).resolve() if report is not None else None
    size = pack_records(dest / RECORDS, runs, study_dirs, store_p, report_p)
    files = [{"name": RECORDS, "bytes": size, "sha256": sha256_file(dest / RECORDS)}]
    count, total = 2, size + MANIFEST_RESERVE  # records.tar.gz and manifest.json
    placed, left_out = [], []
    tmp = Path(tempfile.mkdtemp(dir=dest, prefix=".packing-"))
    try:
        for item in todo:
            run = item["run"]
            path, n = pack_run(
                runs / run,
                runs,
                tmp / bundle_name(run),
                finished=item["finished"],
                checkpoints=item.get("checkpoints", ("last",)),
            )
            nparts = 1 if n <= part_bytes else math.ceil(n / part_bytes)
            if (max_files is not None and count + nparts > max_files) or (
                max_bytes is not None and total + n > max_bytes
            ):
                left_out.append({"run": run, "bytes": n, "finished": item["finished"]})
                path.unlink()
                continue
            whole = sha256_file(path)
            names = []
            if nparts == 1:
                path.replace(dest / path.name)
                names.append(path.name)
            else:
                with open(path, "rb") as src:
                    for k in range(nparts):
                        names.append(f"{path.name}.part{k}")
                        atomic_write_bytes(dest / names[-1], src.read(part_bytes))
                path.unlink()
            parts = [{"name": x, "bytes": (dest / x).stat().st_size, "sha256": sha256_file(dest / x)} for x in names]
            files += parts
            count, total = count + nparts, total + n
            placed.append(
                {
                    "run": run,
                    "files": names,
                    "bytes": n,
                    "sha256": whole,
                    "checkpoint": "last.pt without AdamW moments (training finished)"
                    if item["finished"]
                    else "last.pt whole (training unfinished)",
                }
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "files": files,
        "bundles": placed,
        "left_out": left_out,
        "limits": {"max_bytes": max_bytes, "max_files": max_files, "part_bytes": part_bytes},
        "summary": summary,
    }
    atomic_write_text(dest / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    for b in placed:
        printer(f"bundle {b['run']}: {', '.join(b['files'])} ({b['bytes'] / 1e6:.1f} MB; {b['checkpoint']})")
    for b in left_out:
        printer(f"bundle {b['run']} left out by the caps ({b['bytes'] / 1e6:.1f} MB): its run folder stays in {runs}")
    return manifest


# ---- restoring --------------------------------------------------------------------------------------------------
def read_manifest(src: str | Path) -> dict:
    """The manifest of the bundle folder ``src``, after checking that every file it lists is there with its size
    and SHA-256 (BundleError naming the first that is not)."""
    src = Path(src)
    if not src.is_dir():
        raise BundleError(f"--resume-from {src}: no such folder")
    try:
        manifest = json.loads((src / MANIFEST).read_text())
    except FileNotFoundError:
        raise BundleError(f"--resume-from {src}: no {MANIFEST} (not a folder written by --bundle-out)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise BundleError(f"{src / MANIFEST}: unreadable ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{src / MANIFEST}: not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise BundleError(f"{src / MANIFEST}: version {manifest.get('version')!r}; this longsparse reads {VERSION}")
    for f in manifest["files"]:
        p = src / f["name"]
        if not p.is_file():
            raise BundleError(f"{p}: missing (listed in {MANIFEST}); nothing was restored")
        if p.stat().st_size != f["bytes"] or sha256_file(p) != f["sha256"]:
            raise BundleError(
                f"{p}: size or SHA-256 differs from {MANIFEST} (damaged or incomplete); nothing was restored"
            )
    return manifest


def _members_inside(tf: tarfile.TarFile, top: str) -> bool:
    for m in tf.getmembers():
        parts = Path(m.name).parts
        if m.name.startswith("/") or ".." in parts or "/".join(parts[: len(Path(top).parts)]) != top:
            return False
        if not (m.isfile() or m.isdir()):
            return False
    return True


def restore_bundles(
    src: str | Path, runs: str | Path, store: Optional[str | Path] = None, printer: Callable[[str], None] = print
) -> list[str]:
    """Restore the bundle folder ``src`` (verified first: ``read_manifest``) into the run root ``runs``: each
    bundled run folder that does not exist there, whole or not at all, and the store's records into ``store``
    when it has none. Returns what was restored (run folders, and "store")."""
    src, runs = Path(src), Path(runs)
    manifest = read_manifest(src)
    runs.mkdir(parents=True, exist_ok=True)
    done = []
    for b in manifest["bundles"]:
        run = b["run"]
        if (runs / run).exists():
            printer(f"restore: {runs / run} exists here; kept it (it is newer than the bundle)")
            continue
        with tempfile.TemporaryDirectory(dir=runs, prefix=".restore-") as tmp:
            whole = Path(tmp) / "bundle.tar.gz"
            with open(whole, "wb") as out:
                for name in b["files"]:
                    with open(src / name, "rb") as part:
                        shutil.copyfileobj(part, out)
            if sha256_file(whole) != b["sha256"]:
                raise BundleError(f"{src}: the parts of {run} do not join to the bundle the manifest names")
            with tarfile.open(whole, "r:gz") as tf:
                if not _members_inside(tf, run):
                    raise BundleError(f"{src / b['files'][0]}: holds files outside {run}; not restored")
                tf.extractall(Path(tmp) / "x", filter="data")
            (runs / run).parent.mkdir(parents=True, exist_ok=True)
            os.replace(Path(tmp) / "x" / run, runs / run)  # the whole run folder appears at once
        done.append(run)
        printer(f"restore: {run} from {', '.join(b['files'])}")
    if store is not None:
        store = Path(store)
        have = store / "records.jsonl"
        with tarfile.open(src / RECORDS, "r:gz") as tf:
            member = next((m for m in tf.getmembers() if m.name == "store/records.jsonl" and m.isfile()), None)
            if member is None:
                pass
            elif have.exists():
                printer(f"restore: {have} exists here; kept it (the bundle's records are in {src / RECORDS})")
            else:
                store.mkdir(parents=True, exist_ok=True)
                atomic_write_text(have, tf.extractfile(member).read().decode("utf-8"))
                done.append("store")
                printer(f"restore: the results store {have}")
    return done
