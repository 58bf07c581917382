# variable_tracking: does a run answer with the queried chain's value, the OTHER chain's value, or something else?
# usage: python vt_check.py RUN L N   (the same test stream as `longsparse eval`, batch 1; first answer token,
# teacher-forced logits at the answer position = greedy first token)
import sys, torch
from longsparse.evaluate.sweep import load_run_model
from longsparse.train.config import make_task
torch.set_num_threads(1)
run, L, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model, cfg, _ = load_run_model(run, "last")     # checks the checkpoint against config.json
task = make_task(cfg["task"])
model.eval()
rng = task.rng(0, "test")
vals = set(task.values)
c = {"queried chain's value": 0, "other chain's value": 0, "other token": 0, "(both chains have the same value)": 0}
with torch.no_grad():
    for i in range(N):
        b = task.batch(L, 1, rng=rng)
        p = int(b.prompt_len[0])
        ids = b.input_ids[0, :p].tolist()
        logits = model(b.input_ids[:, :p])
        logits = logits[0] if isinstance(logits, tuple) else logits
        pred = int(logits[0, p - 1].argmax())
        tgt = int(b.target[0, 0])
        in_ctx = [t for t in ids if t in vals]
        other = [t for t in in_ctx if t != tgt]
        if not other:
            c["(both chains have the same value)"] += 1
            continue
        c["queried chain's value" if pred == tgt else "other chain's value" if pred in other else "other token"] += 1
print(run, "L", L, "N", N, c)
