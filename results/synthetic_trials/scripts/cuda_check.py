"""ls.attention on a CUDA device against the float64 CPU reference (session 25, the first session with a GPU).

For every mapping, with and without ALiBi slopes and a per-query scale, and for each path (auto, chunked,
reference): the output and the gradients of q, k, v (of a fixed random projection of the output) on CUDA in
float32, compared with path="reference" in float64 on the CPU. Writes the largest absolute differences to JSON.
usage: python results/synthetic_trials/scripts/cuda_check.py OUT.json
"""
import importlib.util
import json
import sys
import time

import torch

import longsparse as ls


def run(q, k, v, w, **kw):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = ls.attention(q, k, v, **kw)
    (out * w).sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad]


def main(out_path: str) -> None:
    if not torch.cuda.is_available():
        raise SystemExit("cuda_check.py needs a CUDA device")
    g = torch.Generator().manual_seed(0)
    B, H, N, D = 2, 4, 200, 32
    q, k, v, w = (torch.randn(B, H, N, D, generator=g, dtype=torch.float64) for _ in range(4))
    slopes = torch.tensor([0.5, 0.25, 0.0, 0.0], dtype=torch.float64)
    q_scale = 0.5 + torch.rand(B, H, N, generator=g, dtype=torch.float64)
    rows = []
    for mapping, extra in [("softmax", {}), ("entmax", {"alpha": 1.5}), ("entmax", {"alpha": 1.25}),
                           ("sparsemax", {}), ("topk", {"topk": 8}), ("adatemp", {})]:
        for with_alibi in (False, True):
            for with_scale in (False, True):
                kw = dict(mapping=mapping, **extra)
                if with_alibi:
                    kw["alibi_slopes"] = slopes
                if with_scale:
                    kw["q_scale"] = q_scale
                ref = run(q, k, v, w, path="reference", **kw)
                kc = {a: (b.float().cuda() if isinstance(b, torch.Tensor) else b) for a, b in kw.items()}
                for path in ("auto", "chunked", "reference"):
                    row = {"mapping": mapping, **extra, "alibi": with_alibi, "q_scale": with_scale, "path": path}
                    case = f"{mapping:9s} {extra} alibi={with_alibi:d} scale={with_scale:d} {path:9s} "
                    t0 = time.perf_counter()
                    try:   # a failing case is recorded and the others still run
                        got = run(*(t.float().cuda() for t in (q, k, v, w)), path=path, **kc)
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001
                        rows.append({**row, "error": f"{type(e).__name__}: {e}"})
                        print(case + f"ERROR {type(e).__name__}: {e}", flush=True)
                        continue
                    diffs = [(a.double().cpu() - b).abs().max().item() for a, b in zip(got, ref)]
                    rows.append({**row, "max_abs_diff_out_dq_dk_dv": diffs, "seconds": time.perf_counter() - t0})
                    print(case + " ".join(f"{d:.1e}" for d in diffs), flush=True)
    ok = [r for r in rows if "error" not in r]
    worst = max((max(r["max_abs_diff_out_dq_dk_dv"]) for r in ok), default=float("nan"))
    print(f"worst difference over {len(ok)} cases: {worst:.2e}; {len(rows) - len(ok)} cases failed")
    with open(out_path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "adasplash_installed": importlib.util.find_spec("adasplash") is not None,
                   "shape_BHND": [B, H, N, D], "worst": worst,
                   "failed": len(rows) - len(ok), "cases": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
