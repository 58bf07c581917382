# Standalone recipe-search script (not part of the library): HSA on passkey, 1 thread.
import json, math, sys, time, torch, torch.nn.functional as F
from longsparse.tasks import get_task, IGNORE_INDEX
from longsparse.hsa import HSAConfig, HSAModel, needle_diagnostics
torch.set_num_threads(1)
a = json.loads(sys.argv[1])
task = get_task("passkey", None, **a.get("task", {}))
torch.manual_seed(a.get("seed", 0))
if a.get("arch") == "tf":
    from longsparse.nn import ModelConfig, Transformer
    m = Transformer(ModelConfig(vocab_size=task.vocab_size, **a.get("model", {})))
else:
    m = HSAModel(HSAConfig(vocab_size=task.vocab_size, **a.get("model", {})))
    if a.get("tok_identity"):
        enc = m.encoder; orig = enc.forward
        def fwd(mid, _o=orig, _e=enc):
            land, tok = _o(mid)
            B, C, S, d = mid.shape
            return land, _e.token_norm(mid)
        enc.forward = fwd
    if "embed_std" in a:
        torch.nn.init.normal_(m.embed.weight, 0.0, a["embed_std"])
    if a.get("post_zero"):
        for n_, p_ in m.named_parameters():
            if "post_" in n_ and "norm" in n_: torch.nn.init.constant_(p_, a["post_zero"])
steps, lr, bs, warm = a.get("steps", 600), a.get("lr", 1e-3), a.get("bs", 32), a.get("warm", 50)
budget = a.get("budget_s", 450)
opt = torch.optim.AdamW(m.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
rng = task.rng(a.get("seed", 0), "train")
cur = a.get("curriculum", [[0, a.get("lengths", [256, 256])]])  # [[from_step, [lo, hi]], ...]
t0 = time.time(); acc = 0; n = 0
for step in range(steps):
    lens = [c[1] for c in cur if step >= c[0]][-1]
    b = task.batch(tuple(lens), bs, rng=rng)
    cur_lr = lr * min(1, (step + 1) / warm) * (0.5 * (1 + math.cos(math.pi * min(1, step / steps))) if a.get("cos", True) else 1)
    for g in opt.param_groups: g["lr"] = cur_lr
    logits = m(b.input_ids)
    loss = F.cross_entropy(logits.flatten(0, 1), b.labels.flatten(), ignore_index=IGNORE_INDEX)
    loss.backward(); torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); opt.zero_grad()
    acc += loss.item(); n += 1
    if (step + 1) % 25 == 0:
        print(f"step {step+1} len {lens} loss {acc/n:.4f} t {time.time()-t0:.0f}s", flush=True); acc = n = 0
    if time.time() - t0 > budget: print("budget hit at step", step + 1); break
m.eval()
from longsparse.evaluate.core import score_length
for L in a.get("eval", [256]):
    r = score_length(m, task, L, 64, seed=0, split="test")
    if a.get("arch") == "tf":
        print(f"EVAL L={L} EM {r['exact_match']:.3f} tok {r['token_accuracy']:.3f}", flush=True); continue
    b = task.batch(L, 16, rng=task.rng(0, "test"))
    d = needle_diagnostics(m, task, b)
    print(f"EVAL L={L} EM {r['exact_match']:.3f} tok {r['token_accuracy']:.3f} recall {d['recall_at_k'].nanmean():.3f} "
          f"rank {d['mean_rank'].mean():.2f} weight {d['mean_weight'].mean():.3f}", flush=True)
print("total", round(time.time() - t0), "s")
