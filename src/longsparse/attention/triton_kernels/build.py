"""Turns the kernel modules' raw functions into Triton kernels at first use, not at import, so TRITON_INTERPRET
(Triton's CPU interpreter) may be set any time before the first kernel call.

Compile-time switches are only those that change the arithmetic (MODE: α = 1.5 / 2 / general; the tiles; the
dot precision; whether a tile mask exists). Causality, ALiBi, key ranges and per-head α are runtime arguments (a
min, a multiply-add and a few scalar loads per tile or program), so one compiled kernel serves every such call:
each Triton specialisation costs seconds of compilation. Conventions: `Slopes` (H,) fp32 (zeros = no bias),
`Starts`, `Ends` (B,) int32: batch row b's keys [start, end) (0 and Nk: no padding), `Alpha` (H,) fp32 (read in
the general mode only), `causal` 0/1, `len_class` ⌈log₂ Nk⌉, which no kernel reads: the key of the opt-in
autotuner (triton_ops.AUTOTUNE), so that one tuned choice serves every length of a class. Helpers are
inlined by triton.jit, so factoring a kernel's prologue into them costs nothing."""

import os

from . import backward, decode, forward, solve, tiles
from .lang import triton

MODULES = (tiles, solve, forward, backward, decode)
# Sizes stay runtime values: specialising on them (Triton does for 1 and multiples of 16) would
# compile a kernel per sequence length; strides keep their specialisation (contiguous loads).
SIZE_ARGS = ("H", "GROUP", "HPP", "Nq", "Nk", "n_qb", "n_kt", "split", "n_split", "cap", "causal", "len_class")
# every function a kernel module defines, as written (before `kernels` replaces the names)
RAW = {
    name: fn
    for mod in MODULES
    for name, fn in vars(mod).items()
    if callable(fn) and getattr(fn, "__module__", None) == mod.__name__
}
KERNEL_NAMES = tuple(name for name in RAW if name.endswith("_kernel"))


def interpreting() -> bool:
    """TRITON_INTERPRET as triton.jit reads it (at the moment of this call)."""
    try:
        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # Triton without knobs (< 3.4)
        return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def kernels() -> tuple[dict, bool]:
    """Wraps the raw functions with triton.jit (compiled or interpreted, by TRITON_INTERPRET now) and puts the
    wrapped ones in every kernel module that names them: a kernel looks its helpers up in its own module's
    globals, so an imported helper must be replaced there too. Returns ({kernel name: jitted kernel},
    whether they are interpreted). Call once."""
    interpret = interpreting()
    built = {}
    for name, raw in RAW.items():
        # The interpreter re-patches triton.language on every call of a jitted function, which costs ~0.5 ms
        # per helper call; plain helpers run under the kernel's patch and are exact.
        if name.endswith("_kernel"):
            sizes = [a for a in SIZE_ARGS if a in raw.__code__.co_varnames[: raw.__code__.co_argcount]]
            built[name] = triton.jit(raw, do_not_specialize=sizes)
        elif not interpret:
            built[name] = triton.jit(raw)
    for mod in MODULES:
        for name, fn in built.items():
            if name in vars(mod):
                setattr(mod, name, fn)
    return {name: built[name] for name in KERNEL_NAMES}, interpret
