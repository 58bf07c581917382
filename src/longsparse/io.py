"""Atomic file writes and tolerant reads: the one place every result file of longsparse is written through.

Invariant: a reader sees either the previous complete file or the new complete file under a name, never a
partial one, whatever happens to the writer (Ctrl-C, SIGKILL, a full disk). Every writer here writes a temporary
file in the *same folder* (``os.replace`` is atomic only within one filesystem), flushes and fsyncs it, then
renames it over the final name; on an exception the temporary file is removed.

Temporary names are ``.<final name>.tmp-<random>``: hidden, and never ending in the final suffix, so globs such
as ``*.json`` or ``*.pt`` never pick one up. A writer killed by SIGKILL can still leave one behind;
``is_temp_name`` recognises them and ``remove_stale_temps`` deletes them where the caller knows no other writer
is active (e.g. under a run directory's lock). ``longsparse.models.save_checkpoint`` names its temporaries
``.tmp-*.pt``; those are recognised too.

Appended logs (``metrics.jsonl``) are not rewritten on every record; ``read_jsonl`` tolerates the one torn line
a kill can leave at their end. The results store (``records.jsonl``, ``longsparse.report.store``) is appended
through ``atomic_append_jsonl`` instead, which keeps the whole-file invariant above.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import secrets
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

TMP_MARK = ".tmp-"


def _temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}{TMP_MARK}{secrets.token_hex(4)}")


def _open_temp(path: Path) -> tuple[int, Path]:
    """A new temporary file next to ``path``; an OSError names ``path`` (what the user asked for), not the
    temporary name. O_EXCL: a fresh name; 0o666 & ~umask: the usual permissions (mkstemp would give 0600)."""
    tmp = _temp_path(path)
    try:
        return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
    except OSError as e:
        raise _renamed(e, path) from None


def _renamed(e: OSError, path: Path) -> OSError:
    try:
        return type(e)(e.errno, e.strerror or str(e), os.fspath(path))
    except TypeError:  # an OSError subclass with another constructor
        return OSError(e.errno, e.strerror or str(e), os.fspath(path))


def is_temp_name(name: str) -> bool:
    """True for a temporary file of an atomic write (this module's or ``save_checkpoint``'s)."""
    return name.startswith(".") and TMP_MARK in name


def remove_stale_temps(folder: str | os.PathLike) -> list[Path]:
    """Delete the temporary files left in ``folder`` (not recursive) by killed writers; returns what was removed.
    Only call this where no other process can be writing into ``folder`` right now."""
    folder = Path(folder)
    removed = []
    if not folder.is_dir():
        return removed
    for p in folder.iterdir():
        if is_temp_name(p.name) and p.is_file():
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
    return removed


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", *, encoding: str | None = "utf-8") -> Iterator[IO]:
    """``with atomic_open(path) as f: f.write(...)``: ``path`` gets the written content as a whole when the block
    ends normally, and is left as it was if the block raises. ``mode``: "w" (text) or "wb"."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    fd, tmp = _open_temp(path)
    try:
        with open(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and (e.filename is None or os.fspath(e.filename) == os.fspath(tmp)):
            raise _renamed(e, path) from None  # name the file the user asked for (a full disk has no name)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_open(path, "wb") as f:
        f.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    with atomic_open(path, "w", encoding=encoding) as f:
        f.write(text)
    return Path(path)


def atomic_write_json(path: str | os.PathLike, obj: Any, **dumps_kwargs) -> Path:
    """``json.dumps(obj, **dumps_kwargs)`` plus a newline, written atomically."""
    return atomic_write_text(path, json.dumps(obj, **dumps_kwargs) + "\n")


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    import torch

    with atomic_open(path, "wb") as f:
        torch.save(obj, f)
    return Path(path)


def atomic_savefig(fig, path: str | os.PathLike, **savefig_kwargs) -> Path:
    """``fig.savefig(path, ...)`` through a temporary file (the format comes from ``path``'s suffix)."""
    path = Path(path)
    savefig_kwargs.setdefault("format", path.suffix.lstrip(".").lower() or "png")
    with atomic_open(path, "wb") as f:
        fig.savefig(f, **savefig_kwargs)
    return path


def write_new(folder: str | os.PathLike, stem: str, data: str, suffix: str = ".json") -> Path:
    """Create ``folder/stem-<time>[-k]<suffix>`` holding ``data``, under a name that did not exist before (never
    overwrites, also against a concurrent writer choosing the same name). The content appears whole: the file is
    written under a temporary name, then hard-linked to the first free name (``link`` fails on an existing
    name). Where the filesystem has no hard links, the name is reserved with an exclusive create and the content
    renamed over it; a kill in between leaves an empty file, which readers skip."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ts = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    fd, tmp = _open_temp(folder / f"{stem}{suffix}")
    try:
        with open(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        k = 0
        while True:
            path = folder / (f"{stem}-{ts}{suffix}" if k == 0 else f"{stem}-{ts}-{k}{suffix}")
            try:
                os.link(tmp, path)
                return path
            except FileExistsError:
                k += 1
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                    raise
                try:
                    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
                except FileExistsError:
                    k += 1
                    continue
                os.replace(tmp, path)
                return path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def atomic_append_jsonl(path: str | os.PathLike, records: Iterable[Any]) -> Path:
    """Append ``records`` to the JSON-lines file ``path``, one line each, keeping every byte already there.

    The new content (old bytes + new lines) is written whole through a temporary file and renamed over ``path``,
    so a reader sees the file before or after the append, never part of a record, and a killed writer leaves the
    previous file. Writers of one file are serialised by an exclusive ``flock`` on its folder (no lock file is
    left behind), so concurrent appends (the shards of one study) all land. Nothing is written for no records."""
    import fcntl

    path = Path(path)
    lines = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    if not lines:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        old = path.read_bytes() if path.exists() else b""
        if old and not old.endswith(b"\n"):  # a file edited by hand: the next record still starts a line
            old += b"\n"
        atomic_write_bytes(path, old + lines.encode("utf-8"))
    finally:
        os.close(folder)  # releases the lock
    return path


# ---- outputs a command may replace -------------------------------------------------------------------------------
# A command that renders reports (tables, plots, analyses) into a folder the user names replaces only the files it
# wrote there itself: each such folder keeps a manifest (OUTPUTS_MANIFEST) of the names written and the command
# that wrote them, and a file under one of those names that the manifest does not give to the command is refused
# before anything is written. The content of the outputs carries no mark, so a rendering stays byte for byte what
# the store renders.
OUTPUTS_MANIFEST = ".longsparse-outputs.json"
_OUTPUTS_FORMAT = "longsparse-outputs"


class ForeignFileError(ValueError):
    """An output name is taken by a file that the writing command did not write (nothing was written)."""


def written_outputs(folder: str | os.PathLike) -> dict:
    """{file name: the command that wrote it} from ``folder``'s manifest ({} without one, or when unreadable: a
    writer then treats every existing output as foreign, which refuses rather than loses a file)."""
    path = Path(folder) / OUTPUTS_MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) and data.get("format") == _OUTPUTS_FORMAT else None
    return {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else {}


def check_outputs(folder: str | os.PathLike, names: Iterable[str], writer: str) -> None:
    """ForeignFileError naming the first of ``names`` that exists in ``folder`` and is not, by the folder's
    manifest, the output of ``writer`` (a command, e.g. ``"longsparse reproduce"``). Writes nothing."""
    folder = Path(folder)
    owned = written_outputs(folder)
    for name in names:
        path = folder / name
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise ForeignFileError(
                f"{path} exists and is not a plain file; nothing was written (choose another folder)"
            )
        if path.exists() and owned.get(name) != writer:
            raise ForeignFileError(
                f"{path} exists and was not written by `{writer}` (it is not in {folder / OUTPUTS_MANIFEST}); "
                f"nothing was written: move the file away or choose another folder"
            )


def claim_outputs(folder: str | os.PathLike, names: Iterable[str], writer: str) -> None:
    """`check_outputs`, then record ``names`` as ``writer``'s in the folder's manifest. Call it before writing any
    of them: a writer killed before writing leaves a claim on a missing file, which is harmless. Under an
    exclusive lock on the folder, so that concurrent writers keep each other's entries."""
    import fcntl

    folder = Path(folder)
    names = list(names)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        check_outputs(folder, names, writer)
        owned = written_outputs(folder)
        if any(owned.get(name) != writer for name in names):
            owned.update({name: writer for name in names})
            manifest = {"format": _OUTPUTS_FORMAT, "files": dict(sorted(owned.items()))}
            atomic_write_text(folder / OUTPUTS_MANIFEST, json.dumps(manifest, indent=1) + "\n")
    finally:
        os.close(fd)


def warn_stderr(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr)


def read_json_or_none(path: str | os.PathLike, warn: Callable[[str], None] | None = warn_stderr) -> Any:
    """The parsed JSON of ``path``, or None (with a warning) when the file is empty or not valid JSON: what an
    interrupted writer of an older version, or a kill during ``write_new``'s fallback, can leave."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        if not text.strip():
            raise ValueError("empty file")
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        if warn:
            warn(f"skipping {path}: unreadable ({e}); an interrupted writer probably left it")
        return None


def read_json(path: str | os.PathLike) -> Any:
    """The parsed JSON of ``path``; ValueError naming the file when it is not valid JSON."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def read_jsonl(path: str | os.PathLike, warn: Callable[[str], None] | None = None) -> list:
    """The records of a JSON-lines log; a torn or invalid line (a writer killed mid-append) is skipped. A file that
    is not UTF-8 text at all is a ValueError naming it."""
    out = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path}: not a JSON-lines text file (byte {e.start} is not UTF-8: binary or damaged?)"
        ) from None
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if warn:
                warn(f"{path}:{i}: skipping a torn line")
    return out


def os_error_message(e: OSError) -> str:
    """One line naming the path(s) of an OSError: ``PATH: reason`` (``PATH -> PATH2: reason`` for renames)."""
    reason = e.strerror or str(e)
    if e.filename is None:
        return str(e)
    name = os.fsdecode(e.filename) if isinstance(e.filename, (bytes, str, os.PathLike)) else str(e.filename)
    if e.filename2 is not None:
        name += f" -> {os.fsdecode(e.filename2)}"
    return f"{name}: {reason}"
