"""The attention backends: every registered backend equals the reference (values and gradients) over one grid
of mapping × bias × mask × rows (decoding, causal or not) × heads (GQA, a value head dim ≠ q/k's); the auto
selection policy; explain; named backends that refuse; the path= alias; the model's attn_backend field.

A backend registered in longsparse.attention.BACKENDS is enrolled in the grid automatically: where it
supports a call it must match the reference, where it does not, naming it must raise with its reason.
Triton runs here in its CPU interpreter (slow: a sample of its cases by default, all with -m slow)."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys

# Triton's interpreter must be on before triton is first imported (its own library functions are jitted at
# import): CPU tensors reach the triton backend only through it. Auto never picks triton for CPU tensors.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from helpers.attention_grid import BIASES, HEADS, MAPPINGS, MASKS, ROWS, B, D, H, N, grid_case, run_with_grads
from helpers.configs import decoder_section

import longsparse as ls
from longsparse.attention import BACKENDS, policy
from longsparse.attention.backends import sdpa as sdpa_backend
from longsparse.attention.backends import triton as triton_backend
from longsparse.attention.call import make_call
from longsparse.attention.policy import select_backend
from longsparse.nn import ModelConfig, Transformer

# triton in the CPU interpreter costs ~1 s per case (more under load): these run by default, all with -m slow
TRITON_SAMPLE = {("entmax15", "alibi", "none", "decode", "gqa"), ("per_head_alpha", "q_scale", "none", "causal", "mha")}
TRITON_MAPPINGS = {"entmax15", "entmax13", "per_head_alpha", "sparsemax"}


@functools.lru_cache(maxsize=None)
def _reference(case):
    q, k, v, kw = grid_case(*case)
    return run_with_grads(q, k, v, kw, backend="reference")


@functools.lru_cache(maxsize=None)
def _reference_float64(case):
    """The reference's output and gradients in float64 on the same inputs and upstream gradient: the oracle that
    says how far the float32 reference itself is from exact."""
    q, k, v, kw = grid_case(*case)
    up = torch.randn(_reference(case)[0].shape, generator=torch.Generator().manual_seed(7)).double()
    kw = {n: x.double() if torch.is_tensor(x) and x.is_floating_point() else x for n, x in kw.items()}
    return run_with_grads(q.double(), k.double(), v.double(), kw, up=up, backend="reference")


# the value head dim meets the masks nowhere a backend could get it wrong: dv without a mask only
GRID = [
    (m, b, mk, r, h)
    for m in MAPPINGS
    for b in BIASES
    for mk in MASKS
    for r in ROWS
    for h in HEADS
    if h != "dv" or mk == "none"
]


def _params():
    out = []
    for name in BACKENDS:
        for case in GRID:
            slow = (
                name == "triton"
                and case[0] in TRITON_MAPPINGS
                and case[2] == "none"
                and case[4] != "dv"  # refused at once: a value head dim other than q/k's
                and case not in TRITON_SAMPLE
            )
            out.append(
                pytest.param(name, case, id=f"{name}-{'-'.join(case)}", marks=[pytest.mark.slow] if slow else [])
            )
    return out


@pytest.mark.parametrize("name,case", _params())
def test_backend_equals_reference(name, case):
    """Where the backend supports the call: the reference's output and gradients (query 3 of the bool mask
    sees nothing: zeros). Where it does not: naming it raises with its reason."""
    q, k, v, kw = grid_case(*case)
    q, k, v = (t.requires_grad_() for t in (q, k, v))  # the call _run makes
    reason = BACKENDS[name].supports(make_call(q, k, v, **kw, chunk_size=5))
    if reason is not None:
        with pytest.raises(ValueError, match=re.escape(f"backend {name!r} cannot take this call: {reason}")):
            ls.attention(q, k, v, **kw, chunk_size=5, backend=name)
        return
    got = run_with_grads(q, k, v, kw, chunk_size=5, backend=name)
    want = _reference(case)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
    if case[0] == "entmax3":
        torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
        for a, b in zip(got[1:], want[1:]):
            assert (a - b).norm() / b.norm() < 1e-4
    else:
        # fp32 round-off of other summation orders grows with the tensor's scale (the q_scale gradient sums D
        # products); the kernels' general-α solve stops at a τ step of 1e-6. Where the float32 reference itself
        # is further than that from float64 (ill-conditioned gradients, whose round-off also depends on the
        # CPU's matmul kernels), a backend may differ from it by up to three times that distance.
        tol = 5e-5 if name in ("triton", "adasplash") else 1e-5
        for a, b, exact in zip(got, want, _reference_float64(case)):
            own_error = (b.double() - exact).abs().max().item()
            atol = max(tol * max(1.0, b.abs().max().item()), 3 * own_error)
            torch.testing.assert_close(a, b, atol=atol, rtol=tol)
    if case[2] == "bool":
        assert (got[0][:, :, 3] == 0).all() and (got[1][:, :, 3] == 0).all()


# flex compiles once per (Nq, Hkv) shape on the CPU (10-40 s each): the GQA shapes by default, all with -m slow
FLEX_SAMPLE_HEADS = "gqa"


def _forward_only_params():
    out = []
    for name in BACKENDS:
        for case in GRID:
            slow = (name == "triton" and case[0] in TRITON_MAPPINGS) or (
                name == "flex" and case[4] != FLEX_SAMPLE_HEADS
            )
            out.append(
                pytest.param(name, case, id=f"{name}-{'-'.join(case)}", marks=[pytest.mark.slow] if slow else [])
            )
    return out


@pytest.mark.parametrize("name,case", _forward_only_params())
def test_forward_only_backend_equals_reference_without_grad(name, case):
    """A backend that takes a call only without gradient (flex on the CPU: torch's CPU FlexAttention is
    inference only): its output under no_grad equals the reference's. Backends that take the gradient call
    too are compared with gradients above."""
    q, k, v, kw = grid_case(*case)
    grad_call = make_call(*(t.detach().requires_grad_() for t in (q, k, v)), **kw, chunk_size=5)
    if BACKENDS[name].supports(grad_call) is None:
        return  # compared with gradients by test_backend_equals_reference
    with torch.no_grad():
        reason = BACKENDS[name].supports(make_call(q, k, v, **kw, chunk_size=5))
        if reason is not None:
            with pytest.raises(ValueError, match=re.escape(f"backend {name!r} cannot take this call: {reason}")):
                ls.attention(q, k, v, **kw, chunk_size=5, backend=name)
            return
        got = ls.attention(q, k, v, **kw, chunk_size=5, backend=name)
    want = _reference(case)[0]
    torch.testing.assert_close(got, want, atol=1e-5 * max(1.0, want.abs().max().item()), rtol=1e-5)
    if case[2] == "bool":
        assert (got[:, :, 3] == 0).all()


SOFTMAX_GRID = [c for c in GRID if c[0] == "softmax"]


@pytest.mark.parametrize("case", SOFTMAX_GRID, ids=["-".join(c) for c in SOFTMAX_GRID])
def test_sdpa_in_query_blocks_equals_the_reference(case, monkeypatch):
    """Softmax without gradient whose bias exceeds auto's SDPA limit runs in blocks of query rows, each with
    its own bias (a limit of one single-head row here: one query row per block). Every case that needs a
    bias (ALiBi, a mask, decoding offsets) takes the blocks and gives the reference's output, with the bool
    mask's fully masked query 3 at zero; the others stay one SDPA call."""
    q, k, v, kw = grid_case(*case)
    blocks = []
    real = sdpa_backend._query_blocks

    def counted(call, *args):
        blocks.append(args[-1])
        return real(call, *args)

    monkeypatch.setattr(sdpa_backend, "_query_blocks", counted)
    monkeypatch.setattr(sdpa_backend, "SDPA_MAX_ELEMENTS", N)
    with torch.no_grad():
        got = ls.attention(q, k, v, **kw, backend="sdpa")
    torch.testing.assert_close(got, _reference(case)[0], atol=1e-5, rtol=1e-5)
    needs_bias = case[1] == "alibi" or case[2] != "none" or case[3] == "decode"
    assert blocks == ([1] if needs_bias else [])
    if case[2] == "bool":
        assert (got[:, :, 3] == 0).all()


@pytest.mark.parametrize("case", GRID, ids=["-".join(c) for c in GRID])
@pytest.mark.parametrize("grad", [True, False])
def test_explain_answers_for_every_call_and_auto_runs_its_choice(case, grad):
    q, k, v, kw = grid_case(*case)
    if grad:
        q.requires_grad_()
    choice = ls.explain_attention(q, k, v, **kw)
    assert choice.backend in BACKENDS and choice.why
    assert set(choice.passed_over) == set(BACKENDS) - {choice.backend}
    assert all(choice.passed_over.values())
    text = str(choice)
    assert all(name in text for name in BACKENDS)
    assert choice.passed_over["adasplash"]  # opt-in: never auto
    torch.testing.assert_close(
        ls.attention(q, k, v, **kw), ls.attention(q, k, v, **kw, backend=choice.backend), atol=0, rtol=0
    )


# ----------------------------------------------------------------------------- the selection policy


def _call(nq=N, nk=N, mapping="entmax", grad=False, device_type="cpu", **kw):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, nq, D, generator=g).requires_grad_(grad)
    k, v = (torch.randn(B, H, nk, D, generator=g) for _ in range(2))
    return dataclasses.replace(make_call(q, k, v, mapping=mapping, **kw), device_type=device_type)


def _all_support(name):
    return None


def _only(*names):
    return lambda name: None if name in names or name == "reference" else f"{name} refuses"


def test_policy_on_cuda_picks_triton_whenever_it_supports_the_call():
    for kw in (dict(), dict(mapping="softmax"), dict(grad=True), dict(chunk_size=4)):
        assert select_backend(_call(device_type="cuda", **kw), supports=_all_support).backend == "triton"
    choice = select_backend(_call(device_type="cuda", mapping="softmax"), supports=_only("sdpa"))
    assert choice.backend == "sdpa" and choice.passed_over["triton"] == "triton refuses"


def test_policy_never_picks_triton_for_cpu_tensors():
    choice = select_backend(_call(), supports=_all_support)
    assert choice.backend != "triton" and "CUDA tensors only" in choice.passed_over["triton"]


def test_policy_gradient_of_alpha_slopes_or_mask_goes_to_the_reference():
    for kw in (
        dict(alpha=torch.full((H,), 1.5, requires_grad=True)),
        dict(alibi_slopes=torch.full((H,), 0.5, requires_grad=True)),
        dict(attn_mask=torch.zeros(300, 300, requires_grad=True), mapping="softmax"),
    ):
        choice = select_backend(_call(nk=300, nq=300, **kw), supports=_all_support)
        assert choice.backend == "reference" and "gradient" in choice.why


def test_policy_softmax_forms_go_to_sdpa_within_its_size_limit(monkeypatch):
    for mapping in ("softmax", "topk", "adatemp"):
        assert select_backend(_call(mapping=mapping, grad=True), supports=_all_support).backend == "sdpa"
        assert select_backend(_call(mapping=mapping, alpha=1.0), supports=_all_support).backend == "sdpa"
    assert select_backend(_call(mapping="entmax", alpha=1.0), supports=_all_support).backend == "sdpa"  # α = 1
    monkeypatch.setattr(sdpa_backend, "SDPA_MAX_ELEMENTS", N * N - 1)
    # plain causal softmax needs no bias; ALiBi, a mask or decoding do, top-k / adatemp their logits
    assert select_backend(_call(mapping="softmax"), supports=_all_support).backend == "sdpa"
    for kw in (
        dict(mapping="softmax", alibi_slopes=torch.ones(H)),
        dict(mapping="topk"),
        dict(mapping="adatemp"),
        dict(mapping="softmax", attn_mask=torch.ones(N, N, dtype=torch.bool)),
    ):
        choice = select_backend(_call(**kw), supports=_all_support)
        assert choice.backend == "fused_cpu" and "limit" in choice.passed_over["sdpa"]


def test_policy_on_cuda_takes_long_softmax_without_gradient_to_sdpa_in_blocks(monkeypatch):
    """Beyond the SDPA limit, softmax with ALiBi goes to sdpa (in query blocks) on CUDA when no gradient is
    needed; with a gradient, and on the CPU (where fused_cpu takes long rows), the limit still applies."""
    monkeypatch.setattr(sdpa_backend, "SDPA_MAX_ELEMENTS", N * N - 1)
    kw = dict(mapping="softmax", alibi_slopes=torch.ones(H))
    not_triton = _only("sdpa", "chunked")
    assert select_backend(_call(device_type="cuda", **kw), supports=not_triton).backend == "sdpa"
    for call in (_call(device_type="cuda", grad=True, **kw), _call(**kw)):
        choice = select_backend(call, supports=_only("sdpa", "fused_cpu", "chunked"))
        assert choice.backend != "sdpa" and "limit" in choice.passed_over["sdpa"]


def test_policy_chunk_size_keeps_to_the_chunked_backends():
    for mapping in ("softmax", "topk", "entmax"):
        choice = select_backend(_call(mapping=mapping, chunk_size=4, grad=True), supports=_all_support)
        assert choice.backend == "fused_cpu" and "chunk_size" in choice.passed_over["reference"]
    assert select_backend(_call(mapping="topk", chunk_size=4), supports=_only("chunked")).backend == "chunked"


def test_policy_short_rows_with_gradients_go_to_the_reference():
    not_sdpa = _only("fused_cpu", "chunked")
    assert select_backend(_call(nk=64, nq=64, grad=True), supports=not_sdpa).backend == "reference"
    for call in (_call(nk=65, nq=65, grad=True), _call(nk=64, nq=64)):
        assert select_backend(call, supports=not_sdpa).backend == "fused_cpu"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        choice = select_backend(_call(nk=64, nq=64, grad=True), supports=not_sdpa)
    assert choice.backend == "fused_cpu" and "autocast" in choice.passed_over["reference"]


def test_policy_short_rows_with_gradients_go_to_fused_dense_when_it_takes_them(monkeypatch):
    """fused_dense first (also under autocast: it computes in float32), within its key and logit limits; the
    reference where fused_dense refuses the call (its own limits apply then)."""
    not_sdpa = _only("fused_dense", "fused_cpu", "chunked")
    assert select_backend(_call(nk=96, nq=96, grad=True), supports=not_sdpa).backend == "fused_dense"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert select_backend(_call(grad=True), supports=not_sdpa).backend == "fused_dense"
    for call, why in (
        (_call(nk=97, nq=97, grad=True), "too long"),
        (_call(nk=64, nq=64), "no gradient"),
        (_call(grad=True, chunk_size=8), "chunk_size"),
        (_call(mapping="sparsemax", grad=True), "α = 2"),
    ):
        choice = select_backend(call, supports=not_sdpa)
        assert choice.backend == "fused_cpu" and why in choice.passed_over["fused_dense"]
    choice = select_backend(_call(nk=64, nq=64, grad=True), supports=_only("fused_cpu"))
    assert choice.backend == "reference" and choice.passed_over["fused_dense"] == "fused_dense refuses"
    monkeypatch.setattr(policy, "FUSED_DENSE_MAX_ELEMENTS", B * H * N * N - 1)
    assert "too long" in select_backend(_call(grad=True), supports=not_sdpa).passed_over["fused_dense"]


def test_policy_falls_back_from_fused_cpu_to_chunked_to_reference():
    assert select_backend(_call(nk=300, nq=300), supports=_only("chunked")).backend == "chunked"
    choice = select_backend(_call(nk=300, nq=300), supports=_only())
    assert choice.backend == "reference" and choice.passed_over["chunked"] == "chunked refuses"


def test_policy_never_picks_adasplash():
    for device_type in ("cuda", "cpu"):
        for kw in (dict(), dict(grad=True), dict(nk=300, nq=300)):
            choice = select_backend(_call(device_type=device_type, **kw), supports=_only("adasplash"))
            assert choice.backend == "reference" and "opt-in" in choice.passed_over["adasplash"]


def test_policy_with_the_real_backends_on_cpu():
    """The CPU routes: what each kind of call runs (the kernel is built on this machine)."""
    from helpers.mappings import kernel_available

    if not kernel_available():
        pytest.skip("fused CPU kernel not available")
    expect = {
        "fused_cpu": [
            _call(nk=300, nq=300),
            _call(nk=300, nq=300, grad=True),
            _call(alibi_slopes=torch.ones(H)),
            _call(mapping="sparsemax", nq=3),
            _call(nk=128, nq=128, grad=True),
            _call(mapping="sparsemax", grad=True),
        ],
        "chunked": [
            _call(attn_mask=torch.ones(300, 300, dtype=torch.bool), nk=300, nq=300),
            _call(mapping="topk", chunk_size=4),
        ],
        "sdpa": [_call(mapping="softmax"), _call(mapping="adatemp", grad=True)],
        "fused_dense": [_call(grad=True), _call(nk=96, nq=96, grad=True)],
        "reference": [
            _call(grad=True, attn_mask=torch.ones(N, N, dtype=torch.bool)),
            _call(alpha=torch.full((H,), 1.5, requires_grad=True)),
        ],
    }
    for name, calls in expect.items():
        for call in calls:
            assert select_backend(call).backend == name, policy.describe(call)


# ----------------------------------------------------------------------------- named backends, aliases, overrides


def test_a_named_backend_that_cannot_take_the_call_raises_with_the_reason():
    q, k, v, _ = grid_case("entmax15", "none", "none", "causal", "mha")
    with pytest.raises(ValueError, match="backend 'sdpa' cannot take this call: mapping 'entmax' is not a softmax"):
        ls.attention(q, k, v, backend="sdpa")
    with pytest.raises(ValueError, match="'fused_cpu' cannot take this call: attn_mask"):
        ls.attention(q, k, v, backend="fused_cpu", attn_mask=torch.ones(N, N, dtype=torch.bool))
    with pytest.raises(ValueError, match="'fused_cpu' cannot take this call: mapping 'topk'"):
        ls.attention(q, k, v, backend="fused_cpu", mapping="topk")
    with pytest.raises(ValueError, match="'adasplash' cannot take this call: .*CUDA"):
        ls.attention(q, k, v, backend="adasplash")
    with pytest.raises(ValueError, match="'chunked' cannot take this call: .*reference"):
        ls.attention(q, k, v, backend="chunked", alpha=torch.full((H,), 1.5, requires_grad=True))
    with pytest.raises(ValueError, match="unknown attention backend 'fast'; choose auto or one of reference"):
        ls.attention(q, k, v, backend="fast")
    with pytest.raises(ValueError, match="'sdpa' cannot take"):
        ls.explain_attention(q, k, v, backend="sdpa")
    named = ls.explain_attention(q, k, v, backend="chunked")
    assert named.backend == "chunked" and "auto would pick" in named.passed_over["reference"]


def test_path_is_not_a_keyword():
    """``backend=`` names the backend; the keyword ``path=`` of 0.1 is gone (CHANGELOG)."""
    q, k, v, _ = grid_case("entmax15", "alibi", "none", "causal", "mha")
    with pytest.raises(TypeError, match="path"):
        ls.attention(q, k, v, path="reference")
    with pytest.raises(TypeError, match="path"):
        ls.explain_attention(q, k, v, path="chunked")


def test_kernel_env_override_turns_fused_cpu_off(monkeypatch):
    q, k, v, _ = grid_case("entmax15", "none", "none", "causal", "mha")
    monkeypatch.setenv("LONGSPARSE_KERNEL", "0")
    choice = ls.explain_attention(q, k, v)
    assert choice.backend == "chunked" and "LONGSPARSE_KERNEL=0" in choice.passed_over["fused_cpu"]


def test_triton_backend_reports_an_import_failure(monkeypatch):
    monkeypatch.setattr(triton_backend, "_MODULE", {})
    monkeypatch.setitem(sys.modules, "longsparse.attention.triton_entmax", None)  # import fails
    q, k, v, _ = grid_case("entmax15", "none", "none", "causal", "mha")
    reason = BACKENDS["triton"].supports(make_call(q, k, v))
    assert reason.startswith("not available: ")
    with pytest.raises(ValueError, match="'triton' cannot take this call: not available"):
        ls.attention(q, k, v, backend="triton")
    assert ls.explain_attention(q, k, v).passed_over["triton"].startswith("not available")


def test_triton_on_cpu_only_when_named_in_interpreter_mode(monkeypatch):
    q, k, v, _ = grid_case("entmax15", "none", "none", "causal", "mha")
    mod, _ = triton_backend.triton_module()  # imports triton with the interpreter on (see the top)
    if mod is None:
        pytest.skip("triton_entmax does not import here")
    from longsparse.attention import triton_ops  # the launches: they build the kernels and keep how

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if triton_ops._BUILT is None:  # before the kernels are built, the environment decides
        assert "CUDA" in BACKENDS["triton"].supports(make_call(q, k, v))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if triton_ops._BUILT is not False:
        assert BACKENDS["triton"].supports(make_call(q, k, v)) is None
    assert ls.explain_attention(q, k, v).backend != "triton"


# ----------------------------------------------------------------------------- mappings: one registry


def test_method_and_mapping_names_come_from_the_registry():
    from longsparse.mappings.registry import MAPPING_NAMES, MAPPINGS, METHODS, SCALED_METHODS
    from longsparse.nn import METHODS as nn_methods

    assert tuple(MAPPINGS) == MAPPING_NAMES
    assert nn_methods == METHODS == MAPPING_NAMES + tuple(SCALED_METHODS)
    assert set(SCALED_METHODS.values()) <= set(MAPPING_NAMES)


@pytest.mark.parametrize("method", ["asentmax", "ssmax"])
def test_scaled_methods_need_their_q_scale(method):
    q, k, v, _ = grid_case("entmax15", "none", "none", "causal", "mha")
    with pytest.raises(ValueError, match=f"mapping='{method}'.*q_scale"):
        ls.attention(q, k, v, mapping=method)
    with pytest.raises(ValueError, match="model method"):
        ls.mappings.get_mapping(method)
    scale = torch.rand(B, H, N) + 0.5
    base = {"asentmax": "entmax", "ssmax": "softmax"}[method]
    torch.testing.assert_close(
        ls.attention(q, k, v, mapping=method, q_scale=scale),
        ls.attention(q, k, v, mapping=base, q_scale=scale),
        atol=0,
        rtol=0,
    )


def test_the_mappings_are_imported_from_their_own_package():
    """The aliases ``longsparse.attention.MAPPINGS`` / ``ADATEMP_POLY`` / ``adaptive_temperature*`` are gone:
    one import path per name (``longsparse.mappings``)."""
    import longsparse.attention as attention_pkg
    from longsparse.attention import map_scores
    from longsparse.mappings import variants

    for gone in ("MAPPINGS", "ADATEMP_POLY", "adaptive_temperature", "adaptive_temperature_softmax"):
        assert not hasattr(attention_pkg, gone), gone
    z = torch.randn(3, 9) * 4
    torch.testing.assert_close(map_scores(z, "adatemp"), variants.adaptive_temperature_softmax(z))
    torch.testing.assert_close(map_scores(z, "topk", topk=2), variants.topk_softmax(z, 2))


# ----------------------------------------------------------------------------- the model names a backend


def test_model_config_names_a_backend():
    with pytest.raises(ValueError, match="unknown attention.attn_backend 'flash'"):
        ModelConfig.from_dict(decoder_section(vocab_size=10, attn_backend="flash"))
    cfg = dict(vocab_size=20, d_model=32, n_heads=4, n_layers=1, d_ff=64, method="entmax")
    ids = torch.randint(0, 20, (2, 12))
    torch.manual_seed(0)
    auto = Transformer(ModelConfig.from_dict(decoder_section(**cfg)))
    for name in ("reference", "chunked"):
        model = Transformer(ModelConfig.from_dict(decoder_section(**cfg, attn_backend=name)))
        model.load_state_dict(auto.state_dict())
        assert ModelConfig.from_dict(model.cfg.to_dict()).attention.attn_backend == name
        torch.testing.assert_close(model(ids), auto(ids), atol=1e-5, rtol=1e-5)
    model = Transformer(ModelConfig.from_dict(decoder_section(**cfg, attn_backend="sdpa")))
    with pytest.raises(ValueError, match="'sdpa' cannot take this call: mapping 'entmax'"):
        model(ids)


# ----------------------------------------------------------------------------- layers (docs/architecture.md)


@pytest.mark.parametrize(
    "package,allowed",
    [("mappings", {"mappings", "cpu_kernel"}), ("attention", {"mappings", "attention", "cpu_kernel", "io"})],
)
def test_imports_point_down_the_layers(package, allowed):
    from pathlib import Path

    root = Path(ls.__file__).parent / package
    for path in root.rglob("*.py"):
        used = set(re.findall(r"^\s*(?:from|import) longsparse\.(\w+)", path.read_text(), re.M))
        assert used <= allowed, f"{path.name} imports longsparse.{sorted(used - allowed)}"
