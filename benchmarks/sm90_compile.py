"""Every Triton kernel of the entmax attention through Triton's full compiler for sm_90 (H100), on any machine
(no GPU needed: TTIR -> PTX -> Triton's bundled ptxas -v): registers, spilled bytes, shared memory, async copies
and the CTAs per SM they allow, with the CUDA launch configuration (`triton_ops._config`) or one of
benchmarks/gpu_check.py's launch variants over it. tests/unit/attention/test_triton_kernel.py checks the default
configuration's facts (no more than a few spilled bytes, async copies in every K/V loop) with the same code.

    python benchmarks/sm90_compile.py [--out benchmarks/results/FILE.json] [--variants 128:bfloat16:1 ...]
        [--launch-variant d128_bn32 | --tune-space]
    longsparse bench table --out benchmarks/results/FILE.json      # the table of a stored result
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from longsparse_experiments.bench import markdown, write_result

# Run in a fresh interpreter (argv: the variants as JSON [[D, dtype name, mode], ...], then the launch
# configuration's overrides as a JSON object); prints one JSON list, a dict per kernel compiled.
COMPILE_SCRIPT = textwrap.dedent("""
    import inspect, json, os, re, subprocess, sys, tempfile
    import torch, triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from longsparse.attention import triton_ops as ops
    ops._kernels()
    assert ops._BUILT is False
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas-blackwell")
    POINTERS = {"Stats": "*fp32", "TileMask": "*i8", "Alpha": "*fp32", "Slopes": "*fp32", "Starts": "*i32",
                "Ends": "*i32", "UV": "*fp32", "Counts": "*i32", "Live": "*i32", "KNorm": "*fp32", "Cand": "*fp32",
                "Cnt": "*i32",
                "Blocks": "*i32", "NBlocks": "*i32", "Tiles": "*i32", "NTiles": "*i32",
                "Delta": "*fp32", "Z": "*fp32", "Mpart": "*fp32", "Opart": "*fp32", "Lpart": "*fp32"}
    FLOATS = ("scale",)
    UNIT_STRIDES = ("sqd", "skd", "svd", "sod")
    STRIDES_16 = ("sqb", "sqh", "sqn", "skb", "skh", "skn", "svb", "svh", "svn", "sob", "soh", "son")
    results = []
    overrides = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}  # over the launch configuration
    for D, dtype_name, mode in json.loads(sys.argv[1]):
        dtype = getattr(torch, dtype_name)
        tdt = {"float32": "*fp32", "bfloat16": "*bf16", "float16": "*fp16"}[dtype_name]
        cfg = dict(ops._config(D, dtype, "cuda"), **overrides)
        blk = dict(D=D, BM=cfg["BM"], BN=cfg["BN"], MODE=mode, DOT_PREC=cfg["prec"])
        dec = dict(D=D, BM=16, BN=cfg["dec_BN"], DOT_PREC=cfg["prec"])
        p0, p1 = ops.SOLVER_POINTS[mode]
        solve = dict(P0=p0, P=p1, MAX_SWEEPS=24, TOL=1e-6, FTOL=0.0)
        stages = cfg["stages"]
        top = min(ops.TOP_SCORES, cfg["BN"]) if mode == 1 and p1 == 1 else 0
        fwd = dict(blk, **solve, BAND_EPS=ops.ROUNDING_MARGIN, COUNT=False, ANCHOR=mode == 1 and p1 == 1 and top == 0,
               FOLD_FROM=ops.FOLD_FROM if mode == 1 and p1 == 1 else -1, TOP=top)
        fwd_warps = cfg["fwd_general"] if mode == 0 else cfg["fwd"]
        plan = [("_fwd_kernel", dict(fwd, BAND=True, STORE_UV=True), fwd_warps, stages),
                ("_fwd_kernel", dict(fwd, BAND=False, STORE_UV=False), fwd_warps, stages),
                ("_fwd_kernel", dict(fwd, BAND=False, STORE_UV=True, FTOL=1e-2), fwd_warps, stages),
                ("_bwd_prep_kernel", blk, cfg["prep"], stages),
                ("_bwd_dkdv_kernel", blk, cfg["dkdv"], stages),
                ("_bwd_dq_kernel", blk, cfg["dq"], stages),
                ("_dec_scores_kernel", dec, cfg["dec"], stages),
                ("_dec_filter_kernel", dict(BLOCK_J=cfg["dec_BJ"], BLOCK_S=64, MODE=mode), cfg["dec"], stages),
                ("_dec_solve_kernel", dict(BLOCK_J=cfg["dec_BJ"], BLOCK_S=64, MODE=mode, **solve), cfg["dec"], stages),
                ("_dec_out_kernel", dict(dec, MODE=mode), cfg["dec"], stages),
                ("_dec_combine_kernel", dict(D=D, BLOCK_S=16), cfg["dec_combine"], stages)]
        if mode == 1 and p1 == 1:  # the options off by default: the certifying sweep as the output pass, and
            # the largest scores kept by the max pass
            plan.append(("_fwd_kernel", dict(fwd, BAND=True, STORE_UV=True, FOLD_FROM=2), cfg["fwd_fold"], stages))
            plan.append(("_fwd_kernel", dict(fwd, BAND=True, STORE_UV=True, ANCHOR=False, TOP=min(16, cfg["BN"])),
                         cfg["fwd"], stages))
            plan.append(("_fwd_kernel", dict(fwd, BAND=True, STORE_UV=True, ANCHOR=False, TOP=min(32, cfg["BN"]),
                                             FOLD_FROM=2), cfg["fwd_fold"], stages))
        only = json.loads(sys.argv[3]) if len(sys.argv) > 3 else []  # kernel names (empty: all)
        for name, consts, warps, stages in plan:
            if only and name not in only:
                continue
            fn = getattr(ops, name)
            names = list(inspect.signature(fn.fn).parameters)
            # as a launch specialises them: the head dims' strides (1: a constant), 16-byte aligned pointers
            # and the other strides multiples of 16 (they are multiples of D)
            consts = dict(consts, **{p: 1 for p in UNIT_STRIDES if p in names})
            # a constexpr left out would compile as a runtime integer: another kernel than the launch's
            missing = [p for p in names if p not in consts
                       and "constexpr" in str(inspect.signature(fn.fn).parameters[p].annotation)]
            assert not missing, (name, missing)
            sig = {}
            for p in names:
                sig[p] = ("constexpr" if p in consts else POINTERS.get(p) or
                          (tdt if p in ("Q", "K", "V", "O", "Out", "DO", "DQ", "DK", "DV") else
                           "fp32" if p in FLOATS else "i32"))
            attrs = {(names.index(p),): [["tt.divisibility", 16]] for p in names
                     if sig[p].startswith("*") or p in STRIDES_16}
            ck = triton.compile(ASTSource(fn, signature=sig, constexprs=consts, attrs=attrs),
                                target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
            with tempfile.TemporaryDirectory() as d:
                f = os.path.join(d, "k.ptx")
                open(f, "w").write(ck.asm["ptx"])
                r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f, "-o", os.path.join(d, "k.cubin")],
                                   capture_output=True, text=True)
            spills = [int(x) for x in re.findall(r"(\\d+) bytes spill stores", r.stdout + r.stderr)]
            regs = [int(x) for x in re.findall(r"Used (\\d+) registers", r.stdout + r.stderr)]
            ptx = ck.asm["ptx"]
            results.append(dict(kernel=name, D=D, dtype=dtype_name, mode=mode, ptxas_rc=r.returncode,
                                consts={k: v for k, v in consts.items() if k in ("BAND", "STORE_UV", "FTOL", "FOLD_FROM", "TOP")},
                                shared=ck.metadata.shared, spill_bytes=max(spills, default=0),
                                registers=max(regs, default=0), warps=warps, stages=stages,
                                async_copies=ptx.count("cp.async.cg") + ptx.count("cp.async.ca")
                                + ptx.count("cp.async.bulk")))
    print(json.dumps(results))
""")


class PtxasMissing(RuntimeError):
    """Triton's bundled ptxas is not installed (a Triton build without the NVIDIA backend's binaries)."""


def compile_for_sm90(variants, overrides=None, kernels=()) -> list[dict]:
    """Compile every kernel (or those named in ``kernels``) of each (D, dtype name, mode) of ``variants`` for
    sm_90 with the CUDA launch configuration (``overrides``: entries replacing some of it); one result dict per
    kernel compiled."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            COMPILE_SCRIPT,
            json.dumps(variants),
            json.dumps(overrides or {}),
            json.dumps(list(kernels)),
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if proc.returncode != 0 and "ptxas" in proc.stderr and "No such file" in proc.stderr:
        raise PtxasMissing("Triton's bundled ptxas is not available")
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-4000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


# the launch-configuration entries holding the warps of the kernels the opt-in autotuner launches
TUNED_WARPS = ("fwd", "fwd_fold", "fwd_general", "dkdv", "dq")


def compile_tune_space(variants) -> list[dict]:
    """The autotuned kernels compiled at every (num_warps, num_stages) of triton_ops.TUNE_CONFIGS: one result
    dict per kernel and configuration, with its `tune_config` "w{warps}s{stages}"."""
    from longsparse.attention import triton_ops

    rows = []
    for warps, stages in triton_ops.TUNE_CONFIGS:
        overrides = dict.fromkeys(TUNED_WARPS, warps) | {"stages": stages}
        for r in compile_for_sm90(variants, overrides, tuple(triton_ops._TUNE_KEYS)):
            rows.append(dict(r, tune_config=f"w{warps}s{stages}"))
    return rows


def _variant(text: str) -> list:
    parts = text.split(":")
    if len(parts) != 3 or not parts[0].isdigit() or parts[2] not in ("0", "1", "2"):
        raise argparse.ArgumentTypeError(f"{text!r}: give D:dtype:mode, e.g. 128:bfloat16:1 (mode 0, 1 or 2)")
    if parts[1] not in ("bfloat16", "float16", "float32"):
        raise argparse.ArgumentTypeError(f"{text!r}: dtype is bfloat16, float16 or float32")
    return [int(parts[0]), parts[1], int(parts[2])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON file to write (default benchmarks/results/sm90_compile-cpu-DATE.json)")
    ap.add_argument("--variants", type=_variant, nargs="*", default=[[64, "bfloat16", 1], [128, "bfloat16", 1]])
    ap.add_argument("--launch-variant", default=None, help="a launch variant of benchmarks/gpu_check.py")
    ap.add_argument(
        "--tune-space",
        action="store_true",
        help="compile the autotuned kernels at every configuration the autotuner times (triton_ops.TUNE_CONFIGS)",
    )
    args = ap.parse_args(argv)
    if args.tune_space and args.launch_variant:
        ap.error("--tune-space and --launch-variant: choose one")
    if args.out and Path(args.out).exists():
        ap.error(f"--out {args.out} exists: choose a new file (stored results are not overwritten)")
    overrides = {}
    if args.launch_variant:
        sys.path.insert(0, str(Path(__file__).parent))
        from gpu_check import KERNEL_VARIANTS

        if args.launch_variant not in KERNEL_VARIANTS or not KERNEL_VARIANTS[args.launch_variant][1]:
            names = [n for n, v in KERNEL_VARIANTS.items() if v[1]]
            ap.error(f"--launch-variant {args.launch_variant}: choose one of {', '.join(names)}")
        overrides = KERNEL_VARIANTS[args.launch_variant][1]
    if args.tune_space:
        rows = compile_tune_space(args.variants)
    else:
        rows = [dict(r, launch_variant=args.launch_variant) for r in compile_for_sm90(args.variants, overrides)]
    meta = {"variants": args.variants, "overrides": overrides, "tune_space": args.tune_space}
    path = write_result("sm90_compile", rows, args.out, meta)
    print(markdown(str(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
