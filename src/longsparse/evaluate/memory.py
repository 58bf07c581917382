"""How much memory scoring one length needs, checked before anything is allocated.

``estimate_bytes`` is an upper-bound-minded estimate of the peak memory of ``score_length`` at one length and
batch size (float32, which autocast never exceeds):

* the batch as built on the host: the task's Python lists and the collated int64 tensors (~60-85 bytes per
  token measured on copy / flip_flop / two_back at 10^6 tokens; ``HOST_BYTES_PER_TOKEN`` leaves margin);
* activations of one layer (layers run one after another; nothing is kept for a backward pass);
* the KV cache of greedy generation (seq2seq tasks): keys and values of every layer plus the copy of one
  layer's cache that appending a token makes;
* the logits: every position for token classification, the last one for generation;
* the attention workspace: the chunked attention path keeps ``ATTN_BUFFERS`` blocks of at most
  ``max(2^24, B·N)`` logits (``longsparse.attention.core``'s block size; one query row per block at most).

``available_bytes`` is what the device can still give: on CPU the least of ``MemAvailable`` of /proc/meminfo, the
room left under the process's memory cgroup (v2 or v1) and under its RLIMIT_AS / RLIMIT_DATA; on CUDA
``torch.cuda.mem_get_info``. A length is refused when its estimate
exceeds ``HEADROOM`` of that, since the allocator, fragmentation and the rest of the process need the remainder.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

HOST_BYTES_PER_TOKEN = 128
ATTN_BLOCK_ELEMENTS = 1 << 24  # = longsparse.attention.chunked._AUTO_CHUNK_ELEMENTS
ATTN_BUFFERS = 6  # logits, mapped weights, masks/bias and the mapping's temporaries
HEADROOM = 0.8
FLOAT_BYTES = 4
PROBE_LENGTH = 64  # token counts are extrapolated linearly from two probes at small lengths


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_room() -> int | None:
    """Bytes the process's memory cgroup still allows (the tightest of its limits, v2 or v1); None if unlimited
    or unreadable. /proc/self/cgroup names the process's cgroup; inside a container the mounted hierarchy is
    often that cgroup itself, so the mount's root is read too."""
    v2, v1 = [""], [""]
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            if hierarchy == "0" and not controllers:
                v2.append(path.lstrip("/"))
            elif "memory" in controllers.split(","):
                v1.append(path.lstrip("/"))
    except (OSError, ValueError):
        pass
    rooms = []
    for root, names, paths in (
        (Path("/sys/fs/cgroup"), ("memory.max", "memory.current"), v2),
        (Path("/sys/fs/cgroup/memory"), ("memory.limit_in_bytes", "memory.usage_in_bytes"), v1),
    ):
        for path in dict.fromkeys(paths):
            limit, used = (_read_int(str(root / path / name)) for name in names)
            if limit is not None and used is not None:
                rooms.append(limit - used)
    return min(rooms) if rooms else None


def _rlimit_room() -> int | None:
    """Bytes the process may still map under its soft RLIMIT_AS (virtual size) and RLIMIT_DATA (data segment,
    which counts anonymous mappings on Linux ≥ 4.7); None if neither is set or readable."""
    try:
        import resource

        status = Path("/proc/self/status").read_text()
    except (ImportError, OSError):
        return None
    used = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmSize", "VmData") and value.split():
            used[key] = int(value.split()[0]) * 1024
    rooms = []
    for limit, key in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
        soft, _ = resource.getrlimit(limit)
        if soft != resource.RLIM_INFINITY and key in used:
            rooms.append(soft - used[key])
    return min(rooms) if rooms else None


def available_bytes(device: torch.device | str = "cpu") -> int | None:
    """Free memory on ``device`` in bytes; None when it cannot be read (then nothing is refused). On the CPU the
    least of: MemAvailable, what the process's memory cgroup still allows, what its RLIMIT_AS / RLIMIT_DATA
    leave (a process limit set by ``ulimit -v`` or a job scheduler is the one that fails the allocation)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    rooms = [_cgroup_room(), _rlimit_room()]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                rooms.append(int(line.split()[1]) * 1024)
                break
    except (OSError, ValueError, IndexError):
        pass
    rooms = [max(0, r) for r in rooms if r is not None]
    return min(rooms) if rooms else None


def model_dims(model) -> dict:
    """d_model, layers, attention width (heads × head_dim), d_ff and vocabulary of a Transformer or HSAModel."""
    cfg = model.cfg
    d = int(cfg.d_model)
    heads = int(getattr(cfg, "n_heads", 1))
    head_dim = getattr(cfg, "head_dim", None) or d // max(1, heads)
    layers = getattr(cfg, "n_layers", None)
    if layers is None:  # HSAModel: lower + upper decoder layers and the chunk encoder
        layers = sum(int(getattr(cfg, k, 0) or 0) for k in ("n_lower", "n_upper", "encoder_layers")) or 1
    return {
        "d_model": d,
        "layers": int(layers),
        "heads": heads,
        "attn_width": heads * int(head_dim),
        "d_ff": int(getattr(cfg, "d_ff", 4 * d)),
        "vocab": int(cfg.vocab_size),
    }


class TokenCounter:
    """Tokens of one example at a task length, without building it: linear in the length, fitted on two small
    probe examples (every task's sequence is a fixed overhead plus a fixed number of tokens per length unit)."""

    def __init__(self, task):
        self.a = max(task.min_length(), PROBE_LENGTH)
        self.b = 2 * self.a
        rng = task.rng(0, "test")
        self.na = len(task.sample(self.a, rng).input_ids)
        try:
            self.nb = len(task.sample(self.b, rng).input_ids)
        except ValueError:  # a task with a longest length: the proportional estimate below is used
            self.nb = self.na

    def __call__(self, length: int) -> int:
        slope = (self.nb - self.na) / (self.b - self.a) if self.nb > self.na else self.na / self.a
        return max(1, math.ceil(self.na + slope * (length - self.a)))


def estimate_bytes(dims: dict, kind: str, tokens: int, batch: int, device_type: str = "cpu") -> dict:
    """Peak bytes of scoring ``batch`` examples of ``tokens`` tokens each: {"host", "device", parts...}.
    On CPU host and device are the same memory (``device`` then includes ``host``)."""
    bn = batch * tokens
    f = FLOAT_BYTES
    d, w, ff, layers, V = dims["d_model"], dims["attn_width"], dims["d_ff"], dims["layers"], dims["vocab"]
    parts = {
        "batch": bn * HOST_BYTES_PER_TOKEN,
        "activations": bn * (6 * d + 4 * w + 4 * ff) * f,
        "kv_cache": (layers + 1) * 2 * bn * w * f if kind == "seq2seq" else 0,
        "logits": batch * V * f if kind == "seq2seq" else bn * (V * f + 8),
        "attention": ATTN_BUFFERS * min(batch * dims["heads"] * tokens * tokens, max(ATTN_BLOCK_ELEMENTS, bn)) * f,
    }
    device = sum(v for k, v in parts.items() if k != "batch")
    if device_type == "cpu":
        return {**parts, "host": device + parts["batch"], "device": device + parts["batch"]}
    return {**parts, "host": parts["batch"], "device": device}


def fmt_bytes(n: float) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _default_batch_tokens(task) -> int:
    from longsparse.tasks.scoring import DECODE_BATCH_TOKENS, DEFAULT_BATCH_TOKENS

    return DECODE_BATCH_TOKENS if task.kind == "seq2seq" else DEFAULT_BATCH_TOKENS


def check_lengths_fit(
    model, task, lengths, samples: int, batch_tokens: int | None, device: torch.device, available: dict | None = None
) -> None:
    """Raise ValueError (one line) for the first length whose scoring would not fit in the free memory, naming
    the largest length that would. ``available``: {"host": bytes, "device": bytes} instead of reading them."""
    device = torch.device(device)
    if available is None:
        available = {
            "host": available_bytes("cpu"),
            "device": available_bytes(device) if device.type == "cuda" else None,
        }
    host_free, dev_free = available.get("host"), available.get("device")
    if host_free is None and dev_free is None:
        return
    dims, count = model_dims(model), TokenCounter(task)
    bt = batch_tokens or _default_batch_tokens(task)

    def need(length: int, batch: int | None = None) -> dict:
        n = count(length)
        b = batch or max(1, min(samples, bt // n))
        return {**estimate_bytes(dims, task.kind, n, b, device.type), "tokens": n, "batch_size": b}

    def fits(e: dict) -> bool:
        if device.type == "cpu":
            return host_free is None or e["device"] <= HEADROOM * host_free
        return (host_free is None or e["host"] <= HEADROOM * host_free) and (
            dev_free is None or e["device"] <= HEADROOM * dev_free
        )

    for L in sorted(lengths):
        e = need(L)
        if fits(e):
            continue
        lo, hi = task.min_length(), L  # fits(lo) ... not fits(hi)
        if not fits(need(lo)):
            largest = "no length fits"
        else:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if fits(need(mid)) else (lo, mid)
            largest = f"the largest length that fits is {lo}"
        short = device.type == "cpu" or (dev_free is not None and e["device"] > HEADROOM * dev_free)
        where = "RAM" if device.type == "cpu" or not short else "GPU memory"
        total, free = (
            (e["device"], dev_free if device.type == "cuda" else host_free) if short else (e["host"], host_free)
        )
        parts = ", ".join(
            f"{k.replace('_', ' ')} {fmt_bytes(e[k])}"
            for k in ("batch", "activations", "kv_cache", "logits", "attention")
            if e[k]
        )
        hint = ""
        if e["batch_size"] > 1 and fits(need(L, 1)):
            hint = f"; or lower --batch-tokens to {e['tokens']} (batch size 1 fits)"
        raise ValueError(
            f"length {L} does not fit in memory: scoring {e['batch_size']} example(s) of "
            f"{e['tokens']:,} tokens needs about {fmt_bytes(total)} of {where} ({parts}) but only "
            f"{fmt_bytes(free)} is available (usable: {HEADROOM:.0%}); {largest}{hint}"
        )
