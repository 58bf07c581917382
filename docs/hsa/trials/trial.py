# Standalone recipe-search script (not part of the library): HSA on passkey, 1 thread. Options added in session 2 (per-part post-norm gains "gain", "gain_by_name", "freeze", diagnostics "diag"/"diag_steps") are opt-in, so session-1 trial configs run as before.
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
    for part, g in a.get("gain", {}).items():   # post-norm gains at init, per part: encoder | lower | local | hsa
        mods = {"encoder": [m.encoder], "lower": list(m.lower),
                "local": [b.post_attn_norm for b in m.upper if getattr(b, "attn", None) is not None],
                "hsa": [b.post_hsa_norm for b in m.upper if hasattr(b, "post_hsa_norm")]}[part]
        for mod in mods:
            for n_, p_ in mod.named_parameters():
                if ("post_" in n_ and "norm" in n_) or part in ("local", "hsa"): torch.nn.init.constant_(p_, g)
    for n_, g in a.get("gain_by_name", {}).items():   # e.g. {"encoder.layers.0.post_mlp_norm.weight": 0}
        torch.nn.init.constant_(dict(m.named_parameters())[n_], g)
    if a.get("freeze"):                                   # parameter-name substrings kept fixed
        for n_, p_ in m.named_parameters():
            if any(f in n_ for f in a["freeze"]): p_.requires_grad_(False)
    if a.get("post_zero"):
        for n_, p_ in m.named_parameters():
            if "post_" in n_ and "norm" in n_: torch.nn.init.constant_(p_, a["post_zero"])
steps, lr, bs, warm = a.get("steps", 600), a.get("lr", 1e-3), a.get("bs", 32), a.get("warm", 50)
budget = a.get("budget_s", 450)
opt = torch.optim.AdamW(m.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
rng = task.rng(a.get("seed", 0), "train")
cur = a.get("curriculum", [[0, a.get("lengths", [256, 256])]])  # [[from_step, [lo, hi]], ...]
def run_diag(tag):
    # in-chunk attention of the answer-predicting position on the needle value token (mean over heads/examples)
    was = m.training; m.eval()
    with torch.no_grad():
        L = a["diag"]; b = task.batch(L, 32, rng=task.rng(1, "test")); S = m.cfg.chunk_size
        mid = m.run_lower(b.input_ids); mem = m.build_memory(mid); blk = m.upper[0]
        h = blk.pre_attn_norm(mid); hs = blk.hsa
        ps, pos_ = [], torch.arange(L)
        for i in range(b.input_ids.shape[0]):
            ids = b.input_ids[i].tolist(); t_ans = int((b.labels[i] != IGNORE_INDEX).nonzero()[0])
            vpos = ids.index(task.NEEDLE) + 1; c = vpos // S
            if (c + 1) * S > t_ans: continue
            q = hs.split(hs.q_proj(h[i:i+1, t_ans:t_ans+1]))[0, :, 0]             # (H, Dh)
            k, v = hs._chunk_kv(mem.tokens[i, c], pos_[c*S:(c+1)*S])               # (H, S, Dh)
            p = torch.softmax(torch.einsum("hd,hsd->hs", q, k) * hs.scale, -1)
            ps.append(p[:, vpos - c * S].mean())
        tok = mem.tokens
        # linear probe: is the value X decodable from the retrieved output r at the answer position?
        feats, ys = [], []
        for sd in (2, 3, 4, 5, 6):
            bb = task.batch(L, 128, rng=task.rng(sd, "test"))
            mid2 = m.run_lower(bb.input_ids); mem2 = m.build_memory(mid2); h2 = blk.pre_attn_norm(mid2)
            r2 = blk.post_hsa_norm(hs(h2, torch.arange(h2.shape[1]), mem2))
            ta = (bb.labels != IGNORE_INDEX).float().argmax(1)
            feats.append(r2[torch.arange(len(ta)), ta]); ys.append(bb.labels[torch.arange(len(ta)), ta])
        vals = sorted(set(torch.cat(ys).tolist())); Yall = torch.tensor([vals.index(y) for y in torch.cat(ys).tolist()])
        Xall = torch.cat(feats); Xtr, Xte = Xall[:512], Xall[512:]; Y = (Yall[:512], Yall[512:])
        Ytr = F.one_hot(Y[0], len(vals)).float()
        Wp = torch.linalg.solve(Xtr.T @ Xtr + 1e-2 * torch.eye(Xtr.shape[1]), Xtr.T @ Ytr)
        print(f"{tag} PROBE acc {float(((Xte @ Wp).argmax(1) == Y[1]).float().mean()):.3f} (train {float(((Xtr @ Wp).argmax(1) == Y[0]).float().mean()):.3f})")
        print(f"{tag} DIAG p(value) {float(torch.stack(ps).mean()):.3f} (uniform {1/S:.3f}) within-chunk "
              f"{float(tok.std(2).mean() / tok.pow(2).mean().sqrt()):.2f} enc gains " +
              " ".join(f"{n_.split('.')[-2]}={float(p_.mean()):.2f}" for n_, p_ in m.encoder.named_parameters() if "post_" in n_), flush=True)
    m.train(was)
t0 = time.time(); acc = 0; n = 0
for step in range(steps):
    if step in a.get("diag_steps", []): run_diag(f"step{step}")
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
if a.get("diag") and a.get("arch") != "tf":
    run_diag("final")
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
