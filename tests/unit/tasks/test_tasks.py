"""Tests of the synthetic task generators (longsparse.tasks).

The reference solvers below read only the decoded token *names* produced by ``describe`` and recompute the
answer with their own logic, independently of the generators' code paths.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longsparse.tasks import BOS, EOS, IGNORE_INDEX, PAD, SEP, TASKS, Batch, Example, Score, collate, get_task, make_rng

ALL = sorted(TASKS)
SEQ2SEQ = ["copy", "max_retrieval", "mqmtar", "reverse", "sort"]
TOKCLS = ["flip_flop", "local_count", "mqmtar_inline", "two_back"]


def parse(task, ex):
    """Split ``describe`` output back into token-name lists."""
    lines = dict(line.split(": ", 1) for line in task.describe(ex).splitlines())
    return {k: v.split(" ") if v else [] for k, v in lines.items()}


# ---- independent reference solvers: token names in, expected target names out --------------------------
def solve_copy(src):
    return list(src)


def solve_reverse(src):
    return list(reversed(src))


def solve_sort(src):
    return sorted(src, key=lambda s: int(s[1:]))


def solve_max_retrieval(src):
    assert len(src) % 2 == 0
    items, prios = src[0::2], [int(p[1:]) for p in src[1::2]]
    assert all(i.startswith("i") for i in items) and all(p.startswith("p") for p in src[1::2])
    top = max(prios)
    assert prios.count(top) == 1, "the maximum must be unique"
    return [items[prios.index(top)]]


def mqmtar_table(ctx, L, key_len=2, value_len=2, density=0.8):
    """key -> value of an MQMTAR context, read back from its rows."""
    n = int(density * L / (key_len + value_len + 2) + 1e-9)
    w = L // n
    table = {}
    for r in range(n):  # every row holds exactly one pair, the rest is space
        row = ctx[r * w : (r + 1) * w]
        kv = row.index("<kv>")
        key, val = tuple(row[kv - key_len : kv]), tuple(row[kv + 1 : kv + 1 + value_len])
        rest = row[: kv - key_len] + row[kv + 1 + value_len :]
        assert all(t == "_" for t in rest) and len(key) == key_len and len(val) == value_len
        assert key not in table, "keys are distinct within an example"
        table[key] = val
    assert all(t == "_" for t in ctx[n * w :])
    return table


def solve_mqmtar(src, L, key_len=2, value_len=2, n_queries=4):
    ctx, queries = src[:L], src[L:]
    table = mqmtar_table(ctx, L, key_len, value_len)
    assert len(queries) == n_queries * (1 + key_len)
    out = []
    for q in range(n_queries):
        block = queries[q * (1 + key_len) : (q + 1) * (1 + key_len)]
        assert block[0] == "<Q>"
        out += ["<Q>", *table[tuple(block[1:])]]
    return out


def solve_mqmtar_inline(x, L, n_queries=4):
    table = mqmtar_table(x[:L], L)
    blocks = x[L:]
    assert len(blocks) == n_queries * 6
    y = ["."] * L
    for q in range(n_queries):
        b = blocks[6 * q : 6 * q + 6]
        assert b[0] == "<Q>" and b[3] == "<kv>" and tuple(b[4:]) == table[tuple(b[1:3])]
        y += [".", ".", ".", *table[tuple(b[1:3])], "."]  # <kv> predicts v1, v1 predicts v2
    return y


def solve_local_count(x):
    y, run = [], 0
    for t, s in enumerate(x):
        run = run + 1 if t > 0 and x[t - 1] == s else 0
        y.append(f"c{run}")
    return y


def solve_two_back(x):
    return ["."] * 2 + x[:-2]


def solve_flip_flop(x):
    assert len(x) % 2 == 0 and x[0] == "w" and x[-2] == "r"
    y, mem = [], None
    for j in range(0, len(x), 2):
        ins, bit = x[j], x[j + 1]
        assert ins in "wir" and bit in "01"
        if ins == "w":
            mem = bit
        if ins == "r":
            assert bit == mem, "the bit after a read is the last written bit"
        y += [mem if ins == "r" else ".", "."]
    return y


def reference(task, ex):
    p = parse(task, ex)
    name = task.name
    if task.kind == "seq2seq":
        src = p["src"]
        solver = {
            "copy": solve_copy,
            "reverse": solve_reverse,
            "sort": solve_sort,
            "max_retrieval": solve_max_retrieval,
        }.get(name)
        got = solve_mqmtar(src, ex.length) if name == "mqmtar" else solver(src)
        return got, p["trg"]
    if name == "mqmtar_inline":
        return solve_mqmtar_inline(p["x"], ex.length), p["y"]
    solver = {"local_count": solve_local_count, "two_back": solve_two_back, "flip_flop": solve_flip_flop}[name]
    return solver(p["x"]), p["y"]


@pytest.mark.parametrize("name", ALL)
def test_reference_solver_agrees(name):
    task = get_task(name)
    lengths = sorted({task.min_length(), task.min_length() + 1, 37, 64, 128, 1000})
    for L in lengths:
        for ex in task.examples(L, 5, seed=3):
            expected, trg = reference(task, ex)
            assert trg == expected, (name, L)
            assert len(trg) > 0


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(ALL), L=st.integers(8, 300), seed=st.integers(0, 2**31))
def test_reference_solver_property(name, L, seed):
    task = get_task(name)
    ex = task.sample(L, make_rng(name, seed, "validation"))
    expected, trg = reference(task, ex)
    assert trg == expected


def test_reference_solver_at_65536():
    for name in ("mqmtar", "mqmtar_inline", "flip_flop", "sort"):
        task = get_task(name)
        ex = task.sample(65536, task.rng(0, "test"))
        expected, trg = reference(task, ex)
        assert trg == expected


# ---- lengths, layout, label conventions ----------------------------------------------------------------
def total_len(name, L):
    return {
        "copy": 2 * L + 3,
        "reverse": 2 * L + 3,
        "sort": 2 * L + 3,
        "mqmtar": L + 27,
        "mqmtar_inline": L + 25,
        "max_retrieval": 2 * (L // 2) + 4,
        "local_count": L + 1,
        "two_back": L + 1,
        "flip_flop": 2 * (L // 2) + 1,
    }[name]


def target_len(name, L):
    return {
        "copy": L + 1,
        "reverse": L + 1,
        "sort": L + 1,
        "mqmtar": 13,
        "mqmtar_inline": 8,
        "max_retrieval": 2,
        "local_count": L,
        "two_back": L - 2,
    }[name]


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("L", [33, 64, 257])
def test_lengths_and_label_conventions(name, L):
    task = get_task(name)
    b = task.batch(L, 8, seed=1)
    T = total_len(name, L)
    assert b.input_ids.shape == b.labels.shape == b.attention_mask.shape == (8, T)
    assert b.attention_mask.all() and (b.input_ids != PAD).all()
    assert (b.input_ids[:, 0] == BOS).all() and (b.labels[:, 0] == IGNORE_INDEX).all()
    assert (b.length == L).all()
    assert b.input_ids.min() >= 0 and b.input_ids.max() < task.vocab_size
    lab = b.labels[b.labels != IGNORE_INDEX]
    assert lab.max() < task.vocab_size and (lab >= 4).sum() == lab.numel() - (8 if task.kind == "seq2seq" else 0)
    if name != "flip_flop":
        assert (b.target_len == target_len(name, L)).all()
    for i in range(8):
        n = int(b.target_len[i])
        assert (b.labels[i] != IGNORE_INDEX).sum() == n
        assert (b.labels[i][b.labels[i] != IGNORE_INDEX] == b.target[i, :n]).all()
    if task.kind == "seq2seq":
        p = int(b.prompt_len[0])
        assert (b.prompt_len == p).all() and (b.input_ids[:, p - 1] == SEP).all()
        assert (b.input_ids[:, -1] == EOS).all() and (b.target[:, -1] == EOS).all()
        # teacher forcing: labels already shifted, target = the continuation of the prompt
        assert (b.labels[:, p - 1 : -1] == b.input_ids[:, p:]).all()
        assert (b.labels[:, : p - 1] == IGNORE_INDEX).all() and (b.labels[:, -1] == IGNORE_INDEX).all()
        assert torch.equal(b.prompt_ids(), b.input_ids[:, :p])
        assert b.max_new_tokens == T - p
    else:
        assert (b.prompt_len == T).all()


def test_mqmtar_spec_layout():
    task = get_task("mqmtar")
    assert task.alphabet_size == 256 and len(task.keys) == len(set(task.keys)) == 10_000
    assert len(task.values) == len(set(task.values)) == 10_000
    assert task.pairs_for(64) == 8 and task.pairs_for(32) == 4 and task.pairs_for(65536) == 8738
    assert task.pairs_for(30) == 4  # floor(0.8 * 30 / 6) = 4 exactly, despite float rounding
    ex = task.sample(64, task.rng(0))
    assert len(ex.target) == 13 and ex.prompt_len == 1 + 64 + 12 + 1
    # the key/value vocabulary is fixed by vocab_seed: shared by instances (and so by splits), changed by seed
    assert get_task("mqmtar").keys == task.keys
    assert get_task("mqmtar", vocab_seed=1).keys != task.keys
    # queries draw from the pairs present, with replacement: repeats occur across many draws
    reps = sum(
        len(set(map(tuple, [ex.target[i : i + 3] for i in (0, 3, 6, 9)]))) < 4 for ex in task.examples(32, 200, seed=0)
    )
    assert reps > 0


def test_training_length_stream():
    task = get_task("copy")
    it = task.batches(batch_size=4, seed=0)
    Ls = [int(next(it).length[0]) for _ in range(60)]
    assert min(Ls) >= 32 and max(Ls) <= 64 and len(set(Ls)) > 10
    assert get_task("local_count").train_lengths == (64, 128)
    assert len(list(task.batches(8, batch_size=2, num_batches=3))) == 3


def test_local_count_runs():
    task = get_task("local_count")
    ex = task.sample(5000, task.rng(0))
    x = parse(task, ex)["x"]
    runs, cur = [], 1
    for a, b in zip(x, x[1:]):
        if a == b:
            cur += 1
        else:
            runs.append(cur)
            cur = 1
    assert all(2 <= r <= 48 for r in runs) and len(set(runs)) > 30  # last run may be cut; excluded
    assert task.vocab_size == 4 + 16 + 48


def test_flip_flop_probabilities():
    task = get_task("flip_flop", write_prob=0.1)
    x = parse(task, task.sample(100_000, task.rng(0)))["x"][0::2][1:-1]
    freq = {c: x.count(c) / len(x) for c in "wir"}
    assert abs(freq["w"] - 0.1) < 0.01 and abs(freq["r"] - 0.1) < 0.01 and abs(freq["i"] - 0.8) < 0.015
    t2 = get_task("flip_flop", write_prob=0.5, read_prob=0.5)
    assert "i" not in parse(t2, t2.sample(1000, t2.rng(0)))["x"]


def test_max_retrieval_winner_position_varies():
    task = get_task("max_retrieval")
    wins = set()
    for ex in task.examples(64, 100, seed=0):
        src = parse(task, ex)["src"]
        prios = [int(p[1:]) for p in src[1::2]]
        wins.add(prios.index(max(prios)))
    assert len(wins) > 15


# ---- determinism and splits ----------------------------------------------------------------------------
def _same(a: Batch, b: Batch):
    return torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)


@pytest.mark.parametrize("name", ALL)
def test_determinism_and_split_disjointness(name):
    task = get_task(name)
    assert _same(task.batch(40, 16, seed=5), get_task(name).batch(40, 16, seed=5))
    s1, s2 = task.batches(batch_size=8, seed=2), get_task(name).batches(batch_size=8, seed=2)
    for _ in range(3):
        assert _same(next(s1), next(s2))
    train = task.batch(40, 16, seed=5, split="train")
    assert not _same(train, task.batch(40, 16, seed=5, split="test"))
    assert not _same(train, task.batch(40, 16, seed=5, split="validation"))
    assert not _same(train, task.batch(40, 16, seed=6, split="train"))
    # no test example equals a train example of the same length (L = 200: chance repeats are negligible)
    tr = {tuple(r) for r in task.batch(200, 64, seed=0, split="train").input_ids.tolist()}
    te = {tuple(r) for r in task.batch(200, 64, seed=0, split="test").input_ids.tolist()}
    assert not tr & te


# ---- scoring -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SEQ2SEQ)
def test_seq2seq_scorer(name):
    task = get_task(name)
    b = task.batch(40, 4, seed=0)
    s = task.score(b.target, b)
    assert s.exact_match == 1.0 and s.token_accuracy == 1.0 and s.correct.all()
    bad = b.target.clone()
    bad[0, 0] = bad[0, 0] % (task.vocab_size - 1) + 1  # a different, valid token
    s = task.score(bad, b)
    assert s.exact_match == 0.75 and s.correct.tolist() == [False, True, True, True]
    n = int(b.target_len.sum())
    assert s.token_accuracy == pytest.approx((n - 1) / n)
    # too-short generations count missing tokens as wrong; extra tokens beyond the target are ignored
    assert task.score(b.target[:, :1], b).exact_match == (1.0 if b.target.shape[1] == 1 else 0.0)
    longer = torch.cat([b.target, torch.full((4, 3), 7)], 1)
    assert task.score(longer, b).exact_match == 1.0


def test_seq2seq_token_accuracy_known_case():
    task = get_task("copy")
    ex = Example.seq2seq([4, 5, 6], [4, 5, 6], 3)
    b = task.collate([ex])
    s = task.score(torch.tensor([[4, 9, 6, 8]]), b)  # target = 4 5 6 EOS: two of four right
    assert s.token_accuracy == 0.5 and s.exact_match == 0.0 and s.n_tokens == 4


@pytest.mark.parametrize("name", TOKCLS)
def test_tokcls_scorer(name):
    task = get_task(name)
    b = task.batch(40, 4, seed=0)
    pred = torch.where(b.labels == IGNORE_INDEX, torch.full_like(b.labels, 5), b.labels)
    s = task.score(pred, b)
    assert s.exact_match == 1.0 and s.token_accuracy == 1.0
    # logits work too
    logits = torch.nn.functional.one_hot(pred, task.vocab_size).float()
    assert task.score(logits, b).exact_match == 1.0
    bad = pred.clone()
    pos = int((b.labels[1] != IGNORE_INDEX).nonzero()[0])
    bad[1, pos] = 4 if int(bad[1, pos]) != 4 else 5
    s = task.score(bad, b)
    assert s.correct.tolist() == [True, False, True, True]
    n = int((b.labels != IGNORE_INDEX).sum())
    assert s.token_accuracy == pytest.approx((n - 1) / n)


def test_tokcls_token_accuracy_known_case():
    task = get_task("two_back")
    b = task.collate([Example.tokcls([4, 5, 6, 7], [IGNORE_INDEX, IGNORE_INDEX, 4, 5], 4)])
    s = task.score(torch.tensor([[0, 9, 9, 4, 9]]), b)
    assert (s.n_tokens, s.n_correct_tokens, s.exact_match, s.token_accuracy) == (2, 1, 0.0, 0.5)


def test_scores_add_up():
    task = get_task("copy")
    b1, b2 = task.batch(10, 3, seed=0), task.batch(10, 5, seed=1)
    bad = b2.target.clone()
    bad[:, 0] = PAD
    total = sum([task.score(b1.target, b1), task.score(bad, b2)], Score())
    assert total.n_examples == 8 and total.exact_match == 3 / 8 and total.correct.tolist() == [True] * 3 + [False] * 5


def test_mixed_length_collate_and_prompts():
    task = get_task("reverse")
    rng = task.rng(0)
    b = collate([task.sample(L, rng) for L in (3, 7)], task.kind)
    assert b.input_ids.shape == (2, 17) and (b.input_ids[0, 9:] == PAD).all()
    assert (b.labels[0, 9:] == IGNORE_INDEX).all() and b.attention_mask[0].sum() == 9
    assert [len(p) for p in b.prompts()] == [5, 9] and all(int(p[-1]) == SEP for p in b.prompts())
    with pytest.raises(ValueError, match="prompt lengths differ"):
        b.prompt_ids()
    assert b.to("cpu").input_ids.equal(b.input_ids)


# ---- errors --------------------------------------------------------------------------------------------
def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="unknown task 'nope'.*copy.*mqmtar"):
        get_task("nope")
    with pytest.raises(ValueError, match="no parameter"):
        get_task("copy", alphabet=3)
    with pytest.raises(ValueError, match="unknown preset"):
        get_task("copy", preset="huge")
    mq = get_task("mqmtar")
    with pytest.raises(ValueError, match="too short"):
        mq.sample(7, mq.rng(0))
    mq.sample(8, mq.rng(0))  # the minimum works
    with pytest.raises(ValueError, match="num_keys"):
        get_task("mqmtar", alphabet_size=16)  # 10,000 keys > 16^2 words
    with pytest.raises(ValueError, match="distinct keys"):
        get_task("mqmtar", num_keys=50).sample(1000, mq.rng(0))
    with pytest.raises(ValueError, match="too short"):
        get_task("mqmtar", num_pairs=10).batch(40)
    for name in ALL:
        t = get_task(name)
        with pytest.raises(ValueError, match="too short"):
            t.batch(0, 2)
    with pytest.raises(ValueError, match="write_prob"):
        get_task("flip_flop", write_prob=1.5)
    with pytest.raises(ValueError, match="read_prob"):
        get_task("flip_flop", read_prob=-0.1)
    with pytest.raises(ValueError, match="<= 1"):
        get_task("flip_flop", write_prob=0.6, read_prob=0.6)
    with pytest.raises(ValueError, match="split"):
        get_task("copy").batch(8, 2, split="dev")
    with pytest.raises(ValueError, match="length"):
        get_task("copy").batch((10, 5), 2)
    with pytest.raises(ValueError, match="batch_size"):
        get_task("copy").batch(8, 0)
    with pytest.raises(ValueError, match="pred must have shape"):
        t = get_task("two_back")
        b = t.batch(8, 2)
        t.score(b.labels[:, :-1], b)


def test_presets_and_aliases():
    cpu = get_task("mqmtar", preset="cpu")
    assert (cpu.alphabet_size, cpu.num_keys) == (64, 1000) and cpu.vocab_size == 4 + 64 + 3
    assert get_task("mqmtar", preset="paper").params() == get_task("mqmtar").params()
    assert get_task("mqmtar", preset="cpu", num_queries=2).num_queries == 2
    assert isinstance(get_task("flipflop"), type(get_task("flip_flop")))
