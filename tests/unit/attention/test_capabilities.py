"""The backends' capabilities as data: `check` refuses a call outside each capability of each backend with that
capability's one-line reason (and the backend's `supports` says the same), the table in docs/architecture.md is
the rendering of the same data byte for byte, and the command that writes it."""

from __future__ import annotations

import dataclasses
import os

from helpers.paths import REPO_ROOT

# the interpreter must be on before triton is first imported (see tests/unit/attention/test_backends.py)
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from longsparse.attention import BACKENDS
from longsparse.attention.backends import __main__ as command
from longsparse.attention.backends import triton as triton_backend
from longsparse.attention.call import make_call
from longsparse.attention.capabilities import Capabilities, check

ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
B, H, N = 1, 2, 64

PROFILES = [
    pytest.param(name, i, id=f"{name}-{caps.devices[0] if caps.devices else 'any'}")
    for name, backend in BACKENDS.items()
    for i, caps in enumerate(backend.capabilities)
]


def _base(caps: Capabilities) -> dict:
    """Arguments of a call that `caps` takes: float32, (B, H, N, D) with N = 64, no mask, bias or gradient."""
    d = caps.head_dims[0] if caps.head_dims else max(16, caps.min_head_dim)
    mapping = "entmax" if "entmax" in caps.mappings else caps.mappings[0]
    return dict(nq=N, nk=N, d=d, dv=d, dtypes=(torch.float32,) * 3, kw=dict(mapping=mapping), grad=False)


def _call(caps: Capabilities, nq, nk, d, dv, dtypes, kw, grad):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, nq, d, generator=g).to(dtypes[0]).requires_grad_(grad)
    k = torch.randn(B, kw.pop("hkv", H), nk, d, generator=g).to(dtypes[1])
    v = torch.randn(B, k.shape[1], nk, dv, generator=g).to(dtypes[2])
    device = kw.pop("device_type", caps.devices[0] if caps.devices else "cpu")
    return dataclasses.replace(make_call(q, k, v, **kw), device_type=device)


def _outside(caps: Capabilities):
    """(field, changes to `_base`, the reason's start) for each capability that `caps` restricts: a call that
    lies outside that one capability only."""
    base_mapping = _base(caps)["kw"]["mapping"]
    alpha_entmax = base_mapping in ("entmax", "sparsemax")
    if caps.devices is not None:
        yield "devices", dict(kw=dict(mapping=base_mapping, device_type="meta")), "tensors on meta: "
    if caps.dtypes is not None:
        yield "dtypes", dict(dtypes=(torch.float64,) * 3), "dtype float64 is not "
        yield "dtypes", dict(dtypes=(torch.float32, torch.float32, torch.float16)), "q, k, v dtypes differ: "
    if caps.head_dims is not None:
        yield "head_dims", dict(d=24, dv=24), "head dim 24 not one of "
    if caps.min_head_dim > 1:
        yield "min_head_dim", dict(d=8, dv=8), f"head dim 8 < {caps.min_head_dim}"
    if not caps.value_head_dim:
        d = _base(caps)["d"]
        yield "value_head_dim", dict(dv=2 * d), f"value head dim {2 * d} differs from q/k's {d}"
    for name in ("softmax", "entmax", "sparsemax", "topk", "adatemp"):
        taken = name in caps.mappings or (name == "entmax" and "softmax" in caps.mappings and caps.alpha is None)
        if not taken:
            yield "mappings", dict(kw=dict(mapping=name)), f"mapping {name!r} "
    if caps.alpha is not None and alpha_entmax:
        yield "alpha", dict(kw=dict(mapping="entmax", alpha=2.5)), "α = 2.5 outside (1, 2]"
        if caps.alpha_tensor != "none":
            yield "alpha", dict(kw=dict(mapping="entmax", alpha=torch.tensor([1.5, 2.5]))), "per-head α outside (1, 2]"
    if caps.alpha_tensor != "any" and alpha_entmax:
        if caps.alpha_tensor == "none":
            yield "alpha_tensor", dict(kw=dict(mapping="entmax", alpha=torch.tensor([1.5, 1.5]))), "α as a tensor: "
        else:
            per_row = torch.full((1, 1, N, 1), 1.5)  # one α per query row
            yield "alpha_tensor", dict(kw=dict(mapping="entmax", alpha=per_row)), "α of shape (1, 1, 64, 1): "
    if not caps.attn_mask:
        mask = torch.ones(N, N, dtype=torch.bool)
        yield "attn_mask", dict(kw=dict(mapping=base_mapping, attn_mask=mask)), "attn_mask"
        if not caps.key_ranges:
            ranges = dict(mapping=base_mapping, key_start=torch.tensor([3]))
            yield "attn_mask", dict(kw=ranges), "key_start / key_end reach it as an attn_mask, and attn_mask"
    if not caps.alibi:
        yield "alibi", dict(kw=dict(mapping=base_mapping, alibi_slopes=torch.ones(H))), "ALiBi slopes"
    if not caps.q_scale:
        yield "q_scale", dict(kw=dict(mapping=base_mapping, q_scale=torch.ones(B, H, N))), "q_scale"
    if not caps.decoding:
        yield "decoding", dict(nq=N // 2), f"decoding (Nq = {N // 2} < Nk = {N})"
    if not caps.gqa:
        yield "gqa", dict(kw=dict(mapping=base_mapping, hkv=1)), "GQA "
    if caps.power_of_two_length:
        yield "min_length", dict(nq=96, nk=96), "length 96: needs a power of two"
    if caps.min_length > 1:
        yield "min_length", dict(nq=caps.min_length // 2, nk=caps.min_length // 2), f"length {caps.min_length // 2}"
    if not caps.grad:
        yield "grad", dict(grad=True), "a gradient of q, k, v or q_scale"
    if not caps.grad_of_bias:
        slopes = torch.ones(H, requires_grad=True)
        # asked before ALiBi and masks are: the reason names the gradient, also where slopes or masks are refused
        yield "grad_of_bias", dict(kw=dict(mapping=base_mapping, alibi_slopes=slopes)), "alibi_slopes requires grad"
        if alpha_entmax and caps.alpha_tensor != "none":
            alpha = torch.full((H,), 1.5, requires_grad=True)
            yield "grad_of_bias", dict(kw=dict(mapping="entmax", alpha=alpha)), "alpha requires grad"
        mask = torch.zeros(N, N, requires_grad=True)
        yield "grad_of_bias", dict(kw=dict(mapping=base_mapping, attn_mask=mask)), "attn_mask requires grad"


@pytest.mark.parametrize("name,index", PROFILES)
def test_each_capability_refuses_a_call_outside_it_with_its_reason(name, index):
    backend = BACKENDS[name]
    caps = backend.capabilities[index]
    base = _base(caps)
    assert check(caps, _call(caps, **{**base, "kw": dict(base["kw"])})) is None
    seen = set()
    for field, changes, start in _outside(caps):
        args = {**base, **changes}
        args["kw"] = dict(args["kw"])
        call = _call(caps, **args)
        reason = check(caps, call)
        assert reason is not None and reason.startswith(start), (field, reason)
        assert "\n" not in reason
        note = caps.notes.get(field) or caps.notes.get(f"mapping {call.mapping_name}")
        if note and field != "mappings":
            assert reason.endswith(f": {note}"), (field, reason)
        if field != "devices" or len(backend.capabilities) == 1:
            assert backend.supports(call) == reason, field  # the data is asked before any extra check
        seen.add(field)
    everything = Capabilities(grad_of_bias=True)
    restricted = {f.name for f in dataclasses.fields(caps) if getattr(caps, f.name) != getattr(everything, f.name)}
    restricted -= {"notes", "key_ranges", "power_of_two_length"}  # key ranges: no refusal of their own
    assert restricted <= seen, f"no refusal tested for {sorted(restricted - seen)}"


def test_a_call_on_a_device_no_profile_takes_names_them_all():
    q = torch.randn(1, 2, 8, 16)
    call = dataclasses.replace(make_call(q, q, q, mapping="softmax"), device_type="meta")
    assert BACKENDS["flex"].supports(call) == "tensors on meta: flex takes cuda, cpu tensors only"


def test_capabilities_refuse_unknown_notes_and_mappings():
    with pytest.raises(ValueError, match="notes for unknown capabilities: head_dim"):
        Capabilities(notes={"head_dim": "typo"})
    with pytest.raises(ValueError, match="unknown mappings in capabilities: relu"):
        Capabilities(mappings=("relu",))
    with pytest.raises(ValueError, match="alpha_tensor"):
        Capabilities(alpha_tensor="some")


def test_triton_capabilities_are_the_kernels_limits():
    """The triton backend declares the kernels' limits without importing them (Triton loads on first use);
    triton_entmax's own `supports` checks the same ones."""
    te, why = triton_backend.triton_module()
    if te is None:
        pytest.skip(why)
    caps = triton_backend.CAPABILITIES
    assert caps.head_dims == te.HEAD_DIMS and caps.dtypes == te.DTYPES and caps.alpha == te.ALPHA_RANGE


# ----------------------------------------------------------------------------- the table in docs/architecture.md


def test_the_documented_capability_table_is_the_rendering_of_the_data():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert command.table_in(text) == BACKENDS_TABLE()
    assert "python -m longsparse.attention.backends --update docs/architecture.md" in text
    assert command.with_table(text, BACKENDS_TABLE()) == text


def BACKENDS_TABLE():
    from longsparse.attention.backends import capability_table

    return capability_table()


def test_the_command_prints_and_writes_the_table(tmp_path, capsys):
    assert command.main(["--table"]) == 0
    assert capsys.readouterr().out == BACKENDS_TABLE() + "\n"
    doc = tmp_path / "a.md"
    doc.write_text(f"# A\n\n{command.BEGIN}\nold\n{command.END}\n\nafter\n", encoding="utf-8")
    assert command.main(["--update", str(doc)]) == 0
    assert doc.read_text(encoding="utf-8") == f"# A\n\n{command.BEGIN}\n{BACKENDS_TABLE()}\n{command.END}\n\nafter\n"
    assert "updated" in capsys.readouterr().out
    assert command.main(["--update", str(doc)]) == 0 and "unchanged" in capsys.readouterr().out


def test_the_command_leaves_a_file_without_markers_as_it_is(tmp_path, capsys):
    doc = tmp_path / "a.md"
    doc.write_text("no markers\n", encoding="utf-8")
    assert command.main(["--update", str(doc)]) == 2
    err = capsys.readouterr().err
    assert "needs one line" in err and "\n" not in err.rstrip("\n")
    assert doc.read_text(encoding="utf-8") == "no markers\n"
    assert command.main(["--update", str(tmp_path / "missing.md")]) == 2
    assert "missing.md" in capsys.readouterr().err
