"""The markdown table of each kind of benchmark result (what docs/benchmarks.md shows)."""

from __future__ import annotations


def train_step_table(rows: list[dict]) -> list[str]:
    out = [
        "| task length (tokens) | method | step wall (ms) | / base | step CPU (ms) | / base | peak RSS (MiB) | "
        "/ base | above the model (MiB) | / base |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['length']} ({r['tokens']}) | {r['method']} | {r['wall_s'] * 1e3:.1f} | "
            f"{r['wall_vs_base']:.2f} | {r['cpu_s'] * 1e3:.1f} | {r['cpu_vs_base']:.2f} | "
            f"{r['peak_rss_bytes'] / 2**20:.0f} | {r['peak_vs_base']:.2f} | "
            f"{r['extra_peak_bytes'] / 2**20:.0f} | {r['extra_peak_vs_base']:.2f} |"
        )
    return out


def train_run_table(rows: list[dict]) -> list[str]:
    out = [
        "| method | steps | wall (s) | / base | CPU (s) | / base | peak RSS (MiB) | / base | validation (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['method']} | {r['steps']} | {r['wall_s']:.1f} | {r['wall_vs_base']:.2f} | "
            f"{r['cpu_s']:.1f} | {r['cpu_vs_base']:.2f} | {r['peak_rss_bytes'] / 2**20:.0f} | "
            f"{r['peak_vs_base']:.2f} | {r['val_s']:.1f} |"
        )
    return out


def eval_table(rows: list[dict]) -> list[str]:
    out = [
        "| length (tokens) | model | examples/s | wall / base | CPU / base | attention backend |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['length']} ({r['tokens']}) | {r['model']} | {r['examples_per_s']:.4f} | "
            f"{r['time_vs_base']:.2f} | {r['cpu_vs_base']:.2f} | {r['backend']} |"
        )
    return out


def short_table(rows: list[dict]) -> list[str]:
    out = ["| N | mapping | auto (ms) | chunked (ms) | auto / chunked |", "|---:|---|---:|---:|---:|"]
    for r in rows:
        out.append(
            f"| {r['n']} | {r['mapping']} | {r['auto_s'] * 1e3:.1f} | {r['chunked_s'] * 1e3:.1f} | "
            f"{r['auto_vs_chunked']:.2f} |"
        )
    return out


def sdpa_blocks_table(rows: list[dict]) -> list[str]:
    out = ["| N | backend | median (s) | / sdpa blocks | max abs difference |", "|---:|---|---:|---:|---|"]
    for r in rows:
        out.append(
            f"| {r['n']} | {r['backend']} | {r['median_s']:.3f} | {r['vs_sdpa_blocks']:.2f} | "
            f"{r['max_abs_diff']:.1e} (vs {r['diff_against']}) |"
        )
    return out


def alibi_band_table(rows: list[dict]) -> list[str]:
    out = [
        "| N | source | NAPE (s) | NoPE (s) | SDPA (s) | NAPE / NoPE | NAPE / NoPE, CPU time |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        w = r["median_wall_s"]
        out.append(
            f"| {r['n']} | {r['src']} | {w['nape']:.2f} | {w['nope']:.2f} | {w['sdpa']:.2f} | "
            f"{r['nape_vs_nope_wall_s']:.2f} | {r['nape_vs_nope_cpu_s']:.2f} |"
        )
    return out


def compile_table(rows: list[dict]) -> list[str]:
    out = ["| method | mode | batch | first step (s) | median step (s) | / eager |", "|---|---|---|---:|---:|---:|"]
    for r in rows:
        out.append(
            f"| {r['method']} | {r['mode']} | {tuple(r['batch'])} | {r['first_step_s']:.2f} | "
            f"{r['median_step_s']:.3f} | {r['vs_eager']:.2f} |"
        )
    return out


def mapping_table(rows: list[dict]) -> list[str]:
    out = [
        "| n | mapping | fwd / softmax | fwd+bwd / softmax | entmax pkg / ours (fwd) | entmax pkg / ours (fwd+bwd) |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['n']} | {r['mapping']} | {r['fwd_vs_softmax']:.2f} | {r['fwdbwd_vs_softmax']:.2f} | "
            f"{r.get('speedup_vs_package_fwd', float('nan')):.1f} | "
            f"{r.get('speedup_vs_package_fwdbwd', float('nan')):.1f} |"
        )
    return out


def attention_table(rows: list[dict]) -> list[str]:
    out = [
        "| N | direction | method | time (s) | / SDPA | / SDPA, interleaved | / SDPA, interleaved CPU time | "
        "extra peak (MiB) | × (H·N² fp32) |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['n']} | {r['direction']} | {r['method']} | error: {r['error']} | | | | | |")
            continue
        inter, cpu = (
            f"{r[key]:.2f}" if key in r else "—" for key in ("time_vs_sdpa_interleaved", "time_vs_sdpa_interleaved_cpu")
        )
        out.append(
            f"| {r['n']} | {r['direction']} | {r['method']} | {r['seconds']:.3f} | "
            f"{r.get('time_vs_sdpa', float('nan')):.2f} | {inter} | {cpu} | "
            f"{r['extra_peak_bytes'] / 2**20:.0f} | {r['buffers']:.2f} |"
        )
    return out


SM90_MODES = {0: "general α", 1: "α = 1.5", 2: "α = 2"}


def ctas_per_sm(r: dict) -> int:
    """Resident CTAs per H100 SM of a kernel compiled for sm_90 (a row of benchmarks/sm90_compile.py): registers
    are allocated per warp in units of 256 (65,536 per SM), shared memory per CTA with 1 KiB reserved (228 KiB
    per SM)."""
    per_warp = -(-r["registers"] * 32 // 256) * 256
    return min(65536 // (per_warp * r["warps"]), (228 * 1024) // (r["shared"] + 1024))


def sm90_compile_table(rows: list[dict]) -> list[str]:
    out = [
        "| launch | D | dtype | mode | kernel | options | warps | stages | registers | spilled bytes | shared KiB "
        "| async copies | CTAs/SM |",
        "|---|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        opts = ", ".join(f"{k}={v}" for k, v in r["consts"].items()) or "-"
        launch = r.get("launch_variant") or (f"tune {r['tune_config']}" if r.get("tune_config") else "default")
        out.append(
            f"| {launch} | {r['D']} | {r['dtype']} | {SM90_MODES[r['mode']]} | "
            f"{r['kernel']} | {opts} | {r['warps']} | {r.get('stages', '-')} | {r['registers']} | {r['spill_bytes']} | "
            f"{r['shared'] / 1024:.1f} | {r['async_copies']} | {ctas_per_sm(r)} |"
        )
    return out


def decode_host_table(rows: list[dict]) -> list[str]:
    """benchmarks/decode_host.py: host cost of one decoding call, the kernels' launches stubbed."""
    out = [
        "| version | B × H × Nq × Nk × D | Triton launches | torch ops | µs per call, median [min, max] | vs baseline |",
        "|---|---|---:|---:|---|---:|",
    ]
    base = next((r["us_per_call"] for r in rows if r["version"] == "baseline"), None)
    for r in rows:
        ratio = f"{r['us_per_call'] / base:.2f}" if base else "-"
        out.append(
            f"| {r['version']} | {r['B']} × {r['H']} × {r['Nq']} × {r['Nk']} × {r['D']} | {r['triton_launches']} | "
            f"{r['torch_ops']} | {r['us_per_call']:.0f} [{r['us_min']:.0f}, {r['us_max']:.0f}] | {ratio} |"
        )
    return out
