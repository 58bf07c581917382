"""The Triton kernels of α-entmax attention, by role: `tiles` (per-tile logits, masks, the ALiBi band's bounds),
`solve` (the threshold solve), `forward`, `backward`, `decode`; `build` wraps them with triton.jit at first use.
attention/triton_ops.py launches them; attention/triton_entmax.py holds the design notes and the public API."""
