# Which examples does a run "miss" (needle chunk not selected at the answer position) yet answer correctly?
# usage: python miss_check.py RUN L N   (the same test stream/batches as `longsparse eval`'s score_needles, batch 1)
import sys, torch
from longsparse.evaluate.sweep import load_run_model
from longsparse.train.config import make_task
from longsparse.hsa import needle_diagnostics
torch.set_num_threads(1)
run, L, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model, cfg, _ = load_run_model(run, "last")     # checks the checkpoint against config.json
task = make_task(cfg["task"])
model.eval()
rng = task.rng(0, "test")
S = model.cfg.chunk_size
for i in range(N):
    b = task.batch(L, 1, rng=rng)
    d = needle_diagnostics(model, task, b)
    pred = int(d["logits"][0, 0].argmax()); tgt = int(b.target[0, 0])
    sel = bool(d["selected"][0, 0, 0]); rank = float(d["rank"][0, 0, 0])
    npos = task.needle_positions(b)[0]; q = int(b.prompt_len[0]) - 1
    if not sel:
        print(f"example {i}: needle value at {npos} (chunk {npos[0] // S}), answer position {q} "
              f"(distance {q - npos[0]}), rank {rank}, selected={sel}, pred {pred} target {tgt} "
              f"{'correct' if pred == tgt else 'wrong'}")
print("checked", N)
