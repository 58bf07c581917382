"""RULER-style tasks (longsparse.tasks.ruler) checked against an independent reference solver, plus the
structural guarantees (disjoint filler, needle distance, depth, lengths, seeds) and a passkey learning
sanity check of a tiny HSA model (slow)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from longsparse.tasks import BOS, EOS, IGNORE_INDEX, SEP, get_task


def reference_solve(task, prompt: list[int]) -> list[int]:
    """Solve from the decoded token strings alone (no task internals)."""
    toks = task.decode(prompt)
    assert toks[0] == "<bos>" and toks[-1] == "<sep>"
    toks = toks[1:-1]
    vl, kl = task.value_len, task.key_len
    if task.name == "passkey":
        i = toks.index("<needle>")
        return task.token_ids_of(toks[i + 1 : i + 1 + vl])
    q = toks.index("<query>")
    if task.name == "multi_query_needle":
        table = {}
        for i, t in enumerate(toks[:q]):
            if t == "<needle>":
                table[tuple(toks[i + 1 : i + 1 + kl])] = toks[i + 2 + kl : i + 2 + kl + vl]
        out = []
        for i in range(q, len(toks)):
            if toks[i] == "<query>":
                out += table[tuple(toks[i + 1 : i + 1 + kl])]
        return task.token_ids_of(out)
    env = {}
    i = 0
    while i < q:  # execute assignments in order
        if toks[i] == "<var>":
            name = tuple(toks[i + 1 : i + 1 + kl])
            rhs_start = i + 2 + kl
            if toks[rhs_start].startswith("v"):
                env[name] = toks[rhs_start : rhs_start + vl]
            else:
                env[name] = env[tuple(toks[rhs_start : rhs_start + kl])]
        i += 1
    return task.token_ids_of(env[tuple(toks[q + 1 : q + 1 + kl])])


def _ids(task, names):
    return [task.token_ids[n] for n in names]


TASKS = [
    ("passkey", dict(min_distance=16)),
    ("passkey", dict(value_len=6, num_values=4, min_distance=0, depth=0.5)),
    ("multi_query_needle", dict(min_distance=16)),
    ("multi_query_needle", dict(num_needles=6, num_queries=3, key_len=2, num_keys=5, min_distance=8, depth=0.3)),
    ("variable_tracking", dict(min_distance=16)),
    ("variable_tracking", dict(num_hops=3, num_chains=3, key_len=2, min_distance=8)),
    ("variable_tracking", dict(num_hops=2, depth=0.0, min_distance=20)),
]


@pytest.mark.parametrize("name,kw", TASKS)
@pytest.mark.parametrize("length", [None, 200])
def test_reference_solver_agrees(name, kw, length):
    task = get_task(name, **kw)
    task.token_ids_of = lambda names, t=task: _ids(t, names)
    L = task.min_length() if length is None else length
    b = task.batch(L, 40, seed=3, split="test")
    assert b.input_ids.shape[0] == 40
    filler = {task.token_ids[f"f{i}"] for i in range(task.num_filler)}
    for r in range(40):
        p = int(b.prompt_len[r])
        prompt = b.input_ids[r, :p].tolist()
        assert p == L + 2 and prompt[0] == BOS and prompt[-1] == SEP
        ans = reference_solve(task, prompt)
        tgt = b.target[r, : int(b.target_len[r])].tolist()
        assert tgt == ans + [EOS]
        assert b.input_ids[r, p : p + len(ans)].tolist() == ans
        assert b.labels[r, p - 1 : p - 1 + len(tgt)].tolist() == tgt and (b.labels[r, : p - 1] == IGNORE_INDEX).all()
        # filler tokens are disjoint from every needle/answer token
        assert not (set(ans) & filler)
        # the needle tokens found by needle_positions are the answer's tokens, far enough from the query
        npos = task.needle_positions(b)[r]
        vals = [prompt[i] for i in npos]
        assert set(ans) <= set(vals) and not (set(vals) & filler)
        q = prompt.index(task.token_ids["<query>"])
        assert q - max(npos) - 1 >= task.min_distance


def test_depth_places_the_needle():
    L = 300
    for depth in (0.0, 0.5, 1.0):
        task = get_task("passkey", depth=depth, min_distance=50)
        b = task.batch(L, 5, seed=0)
        F_ = L - (1 + task.value_len) - 1
        for r in range(5):
            i = b.input_ids[r].tolist().index(task.token_ids["<needle>"])
            assert i - 1 == round(depth * (F_ - 50))  # offset = number of filler tokens before it (−BOS)
    task = get_task("passkey", min_distance=10)
    offs = {task.needle_positions(task.batch(100, 1, seed=s))[0][0] for s in range(30)}
    assert len(offs) > 10  # depth None: spread


def test_seeds_deterministic_and_splits_differ():
    t = get_task("multi_query_needle")
    a = t.batch(150, 4, seed=1, split="train").input_ids
    assert torch.equal(a, t.batch(150, 4, seed=1, split="train").input_ids)
    assert not torch.equal(a, t.batch(150, 4, seed=1, split="test").input_ids)


def test_score_exact_match_of_all_answer_tokens():
    t = get_task("passkey", min_distance=8)
    b = t.batch(40, 3, seed=0)
    pred = b.target.clone()
    assert t.score(pred, b).exact_match == 1.0
    pred[1, 2] = 4 if int(pred[1, 2]) != 4 else 5  # one wrong digit ⇒ that example fails
    s = t.score(pred, b)
    assert s.n_exact == 2 and s.correct.tolist() == [True, False, True]


@pytest.mark.parametrize(
    "name,kw,msg",
    [
        ("passkey", dict(depth=1.5), "depth"),
        ("multi_query_needle", dict(num_queries=5), "num_queries"),
        ("variable_tracking", dict(num_hops=0), "num_hops"),
        ("passkey", dict(value_len=0), "value_len"),
    ],
)
def test_invalid_parameters(name, kw, msg):
    with pytest.raises(ValueError, match=msg):
        get_task(name, **kw)


def test_too_short_length_rejected():
    t = get_task("variable_tracking", min_distance=30)
    with pytest.raises(ValueError, match="too short"):
        t.batch(t.min_length() - 1, 2)
    t.batch(t.min_length(), 2)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=False,
    reason="known open problem (docs/reports/2026-11-21-hsa-development.md section 4.1): with lower "
    "sliding-window layers and the chunk encoder this layout stays at chance on CPU budgets; never seen passing",
)
def test_tiny_hsa_learns_passkey():
    """Slow (minutes on a shared 2-core CPU; not reliably achievable in 60 s): a tiny HSA reaches
    >= 90% exact match on a small passkey task whose needle is out of every local window."""
    from longsparse.hsa import HSAConfig, HSAModel

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        task = get_task("passkey", value_len=1, num_values=8, num_filler=16, min_distance=16)
        m = HSAModel(
            HSAConfig(
                vocab_size=task.vocab_size,
                d_model=64,
                n_heads=2,
                d_ff=128,
                n_lower=1,
                n_upper=1,
                chunk_size=8,
                window=8,
                topk=2,
                weights="softmax",
            )
        )
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0)
        t0, acc = time.time(), 0.0
        test = task.batch(64, 64, seed=0, split="test")
        for step, b in enumerate(task.batches((48, 64), 32, seed=0)):
            loss = F.cross_entropy(m(b.input_ids).flatten(0, 1), b.labels.flatten(), ignore_index=-100)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            if step % 100 == 99:
                acc = task.score(m.generate(test.prompt_ids(), test.max_new_tokens), test).exact_match
                if acc >= 0.9 or time.time() - t0 > 900:
                    break
        assert acc >= 0.9, f"exact match {acc}"
    finally:
        torch.set_num_threads(n)
