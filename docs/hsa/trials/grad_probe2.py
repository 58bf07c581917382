# Gradient probe at init (1 thread): in-chunk q/k grads of the HSA layer under variants.
import sys, json, torch, torch.nn.functional as F
from longsparse.tasks import get_task, IGNORE_INDEX
from longsparse.hsa import HSAConfig, HSAModel
torch.set_num_threads(1)
t = get_task("passkey", None, value_len=1, num_values=16, min_distance=32)
base = dict(vocab_size=t.vocab_size, d_model=64, n_heads=4, d_ff=128, n_upper=1, n_lower=0, encoder_layers=0,
            landmark="mean", topk=4, weights="softmax", hsa_local=False)
variants = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {
    "mean": {}, "enc": {"encoder_layers": 1, "landmark": "encoder_cls"},
    "lower2": {"n_lower": 2}, "local": {"hsa_local": True}}
for name, v in variants.items():
    torch.manual_seed(0)
    v = dict(v); ex = v.pop("x", {})
    m = HSAModel(HSAConfig(**{**base, **v}))
    if "embed_std" in ex: torch.nn.init.normal_(m.embed.weight, 0.0, ex["embed_std"])
    for part, g in ex.get("gain", {}).items():   # part: encoder | lower | local
        mods = {"encoder": [m.encoder], "lower": list(m.lower), "local": [b.post_attn_norm for b in m.upper]}[part]
        for mod in mods:
            for n_, p_ in mod.named_parameters():
                if ("post_" in n_ and "norm" in n_) or part == "local": torch.nn.init.constant_(p_, g)
    b = t.batch((64, 64), 32, rng=t.rng(0, "train"))
    loss = F.cross_entropy(m(b.input_ids).flatten(0, 1), b.labels.flatten(), ignore_index=IGNORE_INDEX)
    loss.backward()
    h = m.upper[0].hsa
    g = {k: float(getattr(h, k).weight.grad.norm()) for k in ("q_proj", "k_proj", "v_proj", "o_proj", "q_ret", "k_ret")}
    with torch.no_grad():
        mid = m.run_lower(b.input_ids); land, tok = m.encode_chunks(mid[:, :64])
        wc = float(tok.std(2).mean() / tok.pow(2).mean().sqrt())
    print(f"{name:12s} loss {loss.item():.3f} within-chunk {wc:.2f} " + " ".join(f"{k} {x:.1e}" for k, x in g.items()), flush=True)
