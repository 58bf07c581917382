import torch, torch.nn.functional as F
from longsparse.tasks import get_task, IGNORE_INDEX
from longsparse.hsa import HSAConfig, HSAModel
torch.set_num_threads(1); torch.manual_seed(0)
t = get_task("passkey", None, value_len=1, num_values=16)
for enc in (0, 1):
    m = HSAModel(HSAConfig(vocab_size=t.vocab_size, d_model=64, n_heads=4, d_ff=128, n_upper=1, n_lower=0, encoder_layers=enc, landmark="mean" if enc == 0 else "encoder_cls", topk=4, weights="softmax", hsa_local=False))
    b = t.batch((64, 64), 32, rng=t.rng(0, "train"))
    loss = F.cross_entropy(m(b.input_ids).flatten(0, 1), b.labels.flatten(), ignore_index=IGNORE_INDEX)
    loss.backward()
    tot = sum(p.grad.norm()**2 for p in m.parameters() if p.grad is not None) ** .5
    print("enc", enc, "total grad norm", float(tot))
    for n, p in m.named_parameters():
        if p.grad is not None and p.grad.norm() > 0.05 * tot: print(f"   {n:40s} {p.grad.norm():.3f}")
    print("   hsa q/k:", float(m.upper[0].hsa.q_proj.weight.grad.norm()), float(m.upper[0].hsa.k_proj.weight.grad.norm()))
print("--- fix")
torch.manual_seed(0)
m = HSAModel(HSAConfig(vocab_size=t.vocab_size, d_model=64, n_heads=4, d_ff=128, n_upper=1, n_lower=0, encoder_layers=1, topk=4, weights="softmax", hsa_local=False))
torch.nn.init.normal_(m.embed.weight, 0.0, 0.125)
for n_, p_ in m.named_parameters():
    if "post_" in n_ and "norm" in n_: torch.nn.init.constant_(p_, 0.1)
b = t.batch((64, 64), 32, rng=t.rng(0, "train"))
loss = F.cross_entropy(m(b.input_ids).flatten(0, 1), b.labels.flatten(), ignore_index=IGNORE_INDEX)
loss.backward()
print("   hsa q/k:", float(m.upper[0].hsa.q_proj.weight.grad.norm()), float(m.upper[0].hsa.k_proj.weight.grad.norm()))
with torch.no_grad():
    mid = m.run_lower(b.input_ids); land, tok = m.encode_chunks(mid[:, :64])
    print("within-chunk std / rms of token states:", float(tok.std(2).mean() / tok.pow(2).mean().sqrt()))
    print("emb rms", float(mid.pow(2).mean().sqrt()))
