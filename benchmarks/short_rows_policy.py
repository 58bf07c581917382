"""The numbers behind auto's rule 4 (policy.FUSED_DENSE_MAX_KEYS, the α = 2 exclusion): fwd+bwd CPU time of
fused_dense and reference against fused_cpu at the training shape (B 64, H 4, D 32, causal, ALiBi on 2 heads,
q-scales), one thread, median of 9 interleaved rounds.

    python benchmarks/short_rows_policy.py [--lengths 32,64,96,128]
"""

import argparse
import json
import time

import torch

import longsparse as ls

BACKENDS = ("fused_cpu", "fused_dense", "reference")


def step(backend, q, k, v, slopes, q_scale, mapping, alpha):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    ls.attention(
        q, k, v, mapping=mapping, alpha=alpha, is_causal=True, alibi_slopes=slopes, q_scale=q_scale, backend=backend
    ).sum().backward()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="32,64,96,128")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    B, H, D = 64, 4, 32
    rows = []
    for n in map(int, args.lengths.split(",")):
        q, k, v = (torch.randn(B, H, n, D) for _ in range(3))
        slopes, q_scale = torch.tensor([0.5, 0.25, 0.0, 0.0]), torch.rand(B, H, n) + 0.5
        for mapping, alpha in (("entmax", 1.5), ("sparsemax", 2.0)):
            times = {b: [] for b in BACKENDS}
            for _ in range(args.repeats):
                for b in BACKENDS:
                    t0 = time.process_time()
                    step(b, q, k, v, slopes, q_scale, mapping, alpha)
                    times[b].append(time.process_time() - t0)
            med = {b: sorted(t)[len(t) // 2] for b, t in times.items()}
            rows.append(
                {
                    "keys": n,
                    "mapping": mapping,
                    **{f"{b}_ms": round(1e3 * m, 2) for b, m in med.items()},
                    **{f"{b}/fused_cpu": round(med[b] / med["fused_cpu"], 2) for b in BACKENDS[1:]},
                }
            )
            print(json.dumps(rows[-1]))


if __name__ == "__main__":
    main()
