"""The corpus as token streams: a tokenizer trained on the training split, and every split tokenised into one
stream whose documents are joined by the tokenizer's ``<|endoftext|>`` token.

``SAMPLE_DIR`` is a small committed sample of the corpus (the layout ``fetch_shakespeare`` writes), enough for
the quick LM study and the tests.
"""

from __future__ import annotations

import errno
import pickle
import time
from pathlib import Path
from typing import Callable, List, Optional

import torch

from longsparse.io import atomic_torch_save
from longsparse.lm.data import load_split
from longsparse.lm.tokenizer import load_tokenizer, train_tokenizer

SAMPLE_DIR = Path(__file__).resolve().parent / "sample"


def prepare(data_cfg: dict, cache_dir: Optional[str] = None, printer: Callable = print):
    """Train (or load) the tokenizer on the training split and tokenise every split (cached).

    ``data_cfg``: ``{"dir": corpus folder, "tokenizer": "bpe" | "bytes", "vocab_size": V}``; the tokenizer and
    the token cache are kept in ``cache_dir`` (default: the corpus folder). Without the ``tokenizers`` package
    "bpe" falls back to the byte-level tokenizer (with a note). Returns (tokenizer, {split: LongTensor (T_split,)})."""
    kind, V = data_cfg["tokenizer"], int(data_cfg["vocab_size"])
    if kind == "bpe":
        try:
            import tokenizers  # noqa: F401
        except ImportError:
            printer("note: `tokenizers` is not installed; falling back to the byte-level tokenizer")
            kind = "bytes"
    tag = f"{kind}{V}" if kind == "bpe" else "bytes"
    cache = Path(cache_dir or data_cfg["dir"])
    cache.mkdir(parents=True, exist_ok=True)
    tok_path, tok_cache = cache / f"tokenizer-{tag}.json", cache / f"tokens-{tag}.pt"
    if tok_path.exists():
        tok = load_tokenizer(tok_path)
    else:
        t0 = time.perf_counter()
        tok = train_tokenizer(kind, load_split(data_cfg["dir"], "train"), V)
        tok.save(tok_path)
        printer(f"tokenizer {tag}: trained on the training split in {time.perf_counter() - t0:.1f} s -> {tok_path}")
    tokens = None
    if tok_cache.exists():
        try:
            tokens = torch.load(tok_cache, weights_only=True)
        except (RuntimeError, EOFError, pickle.UnpicklingError, OSError) as e:  # cut by an interrupted writer
            if isinstance(e, OSError) and e.errno != errno.EINVAL:  # a cut zip directory reads as EINVAL
                raise OSError(e.errno, e.strerror, str(tok_cache)) from None
            printer(f"warning: {tok_cache}: unreadable token cache ({type(e).__name__}); rebuilding it")
    if tokens is None:
        tokens = {}
        for split in ("train", "validation", "test"):
            ids: List[int] = []
            for i, doc in enumerate(load_split(data_cfg["dir"], split)):
                if i:
                    ids.append(tok.eot_id)
                ids += tok.encode(doc)
            tokens[split] = torch.tensor(ids, dtype=torch.long)
        atomic_torch_save(tokens, tok_cache)
        printer("tokens: " + ", ".join(f"{k} {len(v):,}" for k, v in tokens.items()) + f" -> {tok_cache}")
    return tok, tokens
