"""The backends: reference backends, and the cuDNN / FLA adapters against contract doubles (issue #7, #5).

The doubles (tests/doubles/) have the libraries' exact signatures and conventions and compute with our
reference in fp64, so an adapter that gets every conversion right agrees with the oracle backend to
~1e-12. Every agreement test has a twin proving it can fail: the same comparison with a deliberately
broken adapter or double (transposed state, mis-packed THD, wrong gate layout, each flag dropped).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from caught import caught
from child_env import ENV as CHILD_ENV
from doubles import cudnn_la, fla_ops

from deltacheck.cases import Case, make_inputs
from deltacheck.harness.backends import reference as ref_backends
from deltacheck.harness.backends.base import Verdict, get_backend
from deltacheck.harness.backends.cudnn import adapter as cudnn_adapter
from deltacheck.harness.backends.fla import adapter as fla_adapter
from deltacheck.harness.machine import environment as gate

TOL = 1e-12
ENV = gate.Env(cuda=True, device_name="NVIDIA B200 (test double)", capability=(10, 0),
               versions={"nvidia-cudnn-frontend": "1.32.0", "fla-core": "0.6.0", "triton": "3.7.1"})


@pytest.fixture
def open_gate(monkeypatch):
    """Our floors have their own tests (test_availability.py); here the doubles stand in for a capable machine."""
    for adapter in (cudnn_adapter.CudnnBackend, fla_adapter.FlaBackend):
        monkeypatch.setattr(adapter, "pair_verdict", lambda self, op, env: Verdict.ok())


# A handful of cases per op: all four layouts, MHA/GQA/GVA, ragged thd with 0- and 1-token sequences,
# initial state (fp32 and bf16), K != V both ways, and every flag on somewhere.
def _cases(op: str) -> list[Case]:
    return [
        Case(op=op, layout="thd", seqlens=(0, 1, 6, 3), H=2, HK=2, HV=4, K=64, V=128, initial_state=True,
             l2norm=True, beta_sigmoid=True, neg_eigval=True, scale=0.3),
        Case(op=op, layout="bshd", seqlens=(5, 5), H=4, HK=2, HV=2, K=128, V=64, initial_state=True,
             state_dtype="bf16", safe_gate=True, a_log=True, dt_bias=True),
        Case(op=op, layout="sbhd", seqlens=(4, 4, 4), H=2, HK=2, HV=2, K=64, V=64, initial_state=True,
             gate_domain="linear", gate="steep"),
        Case(op=op, layout="bhsd", seqlens=(7, 7), H=1, HK=1, HV=2, K=64, V=64, safe_gate=True, dt_bias=True,
             l2norm=True, gate="steep"),
        Case(op=op, layout="thd", seqlens=(3, 0, 5), H=2, HK=2, HV=2, K=64, V=64, safe_gate=True, a_log=True,
             beta_sigmoid=True, initial_state=True),
    ]


OPS = ("gdn", "kda", "gdn2")
ALL_CASES = [pytest.param(c, id=c.id) for op in OPS for c in _cases(op)]


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max abs difference relative to the reference's max magnitude."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def agrees(backend, case, tol=TOL) -> bool:
    """Does ``backend`` reproduce the oracle backend on ``case`` (output and key-major final state)?"""
    inputs = make_inputs(case)
    out, state = backend.run(case, inputs)
    ref_out, ref_state = get_backend("oracle").run(case, inputs)
    if out.shape != ref_out.shape or state.shape != ref_state.shape:
        return False
    return _err(out, ref_out) <= tol and _err(state, ref_state) <= tol


def drop_flag(double, name: str, flag: str) -> None:
    """Make ``double.name`` lose the keyword ``flag`` on the way in (asserting the adapter passed it)."""
    real = getattr(double, name)

    def drops(*args, **kwargs):
        assert flag in kwargs, f"adapter never passed {flag}"
        kwargs.pop(flag)
        return real(*args, **kwargs)

    setattr(double, name, drops)


def fails(backend, case) -> bool:
    """The mutation is caught: the comparison rejects the backend, or the library's own check refuses the call
    (tests/caught.py); any other exception is a bug and propagates."""
    return caught(lambda: agrees(backend, case))


def cudnn_backend(**double_kwargs):
    return cudnn_adapter.CudnnBackend(cudnn_la.make(**double_kwargs), device="cpu")


def fla_backend(recurrent=False, **double_kwargs):
    return fla_adapter.FlaBackend(fla_ops.make(**double_kwargs), recurrent=recurrent)


# ================================================================================ reference backends

def test_reference_backends_registered():
    for name in ("oracle", "chunked", "baseline"):
        backend = get_backend(name)
        assert backend.name == name
        assert backend.ops == frozenset({"gdn", "kda", "gdn2", "gdp"})


@pytest.mark.parametrize("case", ALL_CASES)
def test_chunked_backend_matches_oracle(case):
    # A broken import of the chunked reference is a failure here, never a skip: it is the reference under test.
    assert ref_backends.chunked_import_error() is None, ref_backends.chunked_import_error()
    backend = get_backend("chunked")
    assert backend.check(case, ENV).runnable
    assert agrees(backend, case, tol=1e-10)


@pytest.mark.parametrize("op", OPS)
def test_oracle_backend_contract(op):
    """fp64, the case's layout, key-major state equal to the reference's own key-major output."""
    from deltacheck import reference

    case = _cases(op)[1]  # bshd, GQA, bf16 state, K != V
    inputs = make_inputs(case)
    out, state = get_backend("oracle").run(case, inputs)
    assert out.dtype == state.dtype == torch.float64
    assert out.shape == (case.N, case.seqlens[0], case.HO, case.V)
    assert state.shape == (case.N, case.HO, case.K, case.V)
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")] + ([inputs["w"]] if op == "gdn2" else [])
    _, direct = getattr(reference, op)(
        *args, **case.reference_kwargs(), initial_state=inputs["initial_state"].transpose(-1, -2),
        state_layout="kv", a_log=inputs["a_log"], dt_bias=inputs["dt_bias"])
    assert torch.equal(state, direct)


@pytest.mark.parametrize("op", OPS)
def test_baseline_is_same_precision(op):
    case = _cases(op)[0]
    backend = get_backend("baseline")
    verdict = backend.check(case, ENV)
    assert verdict.runnable and any("bf16" in n for n in verdict.notes)
    out, state = backend.run(case, make_inputs(case))
    assert out.dtype == state.dtype == torch.bfloat16
    ref_out, ref_state = get_backend("oracle").run(case, make_inputs(case))
    # Close to the oracle at bf16 accuracy, and visibly not at fp64 accuracy.
    assert 1e-6 < _err(out, ref_out) < 0.1
    assert _err(state, ref_state) < 0.1


def test_baseline_falls_back_to_oracle_without_chunked(monkeypatch):
    monkeypatch.setattr(ref_backends, "chunked_import_error", lambda: "ModuleNotFoundError: no chunked yet")
    case = _cases("kda")[0]
    verdict = get_backend("baseline").check(case, ENV)
    assert verdict.runnable
    assert any("method='oracle'" in n and "no chunked yet" in n for n in verdict.notes)
    out, _ = get_backend("baseline").run(case, make_inputs(case))
    assert out.dtype == torch.bfloat16
    chunked = get_backend("chunked").check(case, ENV)
    assert not chunked.runnable and "no chunked yet" in chunked.reason


@pytest.mark.parametrize("name", ["oracle", "baseline"])
def test_reference_backends_are_differentiable(name):
    case = _cases("gdn2")[4].replace(backward=True)
    inputs = make_inputs(case)
    leaves = {n: x.requires_grad_() for n, x in inputs.items()
              if isinstance(x, torch.Tensor) and x.is_floating_point()}
    out, state = get_backend(name).run(case, inputs)
    (out.double().sum() + state.double().sum()).backward()
    for n, x in leaves.items():
        assert x.grad is not None and torch.isfinite(x.grad).all(), n


# ================================================================================ cuDNN adapter

@pytest.mark.parametrize("case", ALL_CASES)
def test_cudnn_adapter_matches_oracle(open_gate, case):
    backend = cudnn_backend()
    verdict = backend.check(case, ENV)
    assert verdict.runnable, verdict.reason
    assert verdict.notes == ()  # make_inputs' dtypes are all ones cuDNN accepts: nothing converted
    assert agrees(backend, case)


def test_cudnn_adapter_calls_the_library_its_way(open_gate):
    """THD int32 cu_seqlens [0, L, 2L], value-major state, gate_lower_bound by keyword, final state asked."""
    double = cudnn_la.make()
    backend = cudnn_adapter.CudnnBackend(double, device="cpu", plan_name="kda_frost")
    case = _cases("kda")[1]  # bshd N=2 L=5, safe gate
    backend.run(case, make_inputs(case))
    call = double.calls[-1]
    assert call["q"].shape == (10, case.H, case.K)
    assert call["cu_seqlens"].dtype == torch.int32 and call["cu_seqlens"].tolist() == [0, 5, 10]
    assert call["initial_state"].shape == (case.N, case.HO, case.V, case.K)
    assert call["gate_lower_bound"] == -5.0 and call["output_final_state"] is True
    assert call["plan_name"] == "kda_frost"


@pytest.mark.parametrize("op", OPS)
def test_cudnn_adapter_gradients_match_oracle(open_gate, op):
    case = _cases(op)[0].replace(backward=True)

    def grads(backend):
        inputs = make_inputs(case)
        leaves = {n: x.requires_grad_() for n, x in inputs.items()
                  if isinstance(x, torch.Tensor) and x.is_floating_point()}
        out, state = backend.run(case, inputs)
        wo, ws = torch.randn(out.shape, dtype=torch.float64), torch.randn(state.shape, dtype=torch.float64)
        ((out.double() * wo).sum() + (state.double() * ws).sum()).backward()
        return {n: x.grad for n, x in leaves.items()}

    torch.manual_seed(0)
    got = grads(cudnn_backend())
    torch.manual_seed(0)
    want = grads(get_backend("oracle"))
    for name in want:
        assert _err(got[name], want[name]) < TOL, name


# --- the comparison can fail ---------------------------------------------------------------------

def test_cudnn_transposed_state_is_caught(open_gate, monkeypatch):
    case = _cases("gdn2")[2]  # K == V: the transposed state has the right shape, wrong values
    assert agrees(cudnn_backend(), case)
    monkeypatch.setattr(cudnn_adapter, "state_from_cudnn", lambda s: s.float())
    assert fails(cudnn_backend(), case)


def test_cudnn_transposed_initial_state_is_caught(open_gate, monkeypatch):
    case = _cases("kda")[2]  # K == V
    monkeypatch.setattr(cudnn_adapter, "state_to_cudnn",
                        lambda s: None if s is None else s.transpose(-1, -2).contiguous())
    assert fails(cudnn_backend(), case)


@pytest.mark.parametrize("op", OPS)
def test_cudnn_mispacked_thd_is_caught(open_gate, monkeypatch, op):
    """bshd packed as if it were sbhd (the classic batch/sequence mix-up)."""
    case = _cases(op)[1].replace(seqlens=(5, 5, 5))
    assert agrees(cudnn_backend(), case)
    real = cudnn_adapter.to_thd
    monkeypatch.setattr(cudnn_adapter, "to_thd", lambda x, layout: real(x, "sbhd" if layout == "bshd" else layout))
    assert fails(cudnn_backend(), case)


@pytest.mark.parametrize("op", ["kda", "gdn2"])
def test_cudnn_wrong_gate_layout_is_caught(open_gate, op):
    """A library reading g as [T, K, HO] instead of [T, HO, K]."""
    case = _cases(op)[0]
    double = cudnn_la.make()
    real = getattr(double, cudnn_adapter.ENTRY_POINTS[op])

    def misreads_gate(q, k, v, g, *args, **kwargs):
        T, HO, K = g.shape
        return real(q, k, v, g.reshape(T, K, HO).transpose(1, 2), *args, **kwargs)

    setattr(double, cudnn_adapter.ENTRY_POINTS[op], misreads_gate)
    assert fails(cudnn_adapter.CudnnBackend(double, device="cpu"), case)


# (flag dropped on the way to the library, case that turns it on)
_DROPS = [
    ("scale", 0), ("use_qk_l2norm_in_kernel", 0), ("allow_neg_eigval", 0), ("use_beta_sigmoid_in_kernel", 4),
    ("safe_gate", 3), ("a_log", 1), ("dt_bias", 1), ("gate_domain", 2), ("initial_state", 2),
]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("flag,which", _DROPS, ids=[d[0] for d in _DROPS])
def test_cudnn_dropped_flag_is_caught(open_gate, op, flag, which):
    case = _cases(op)[which]
    double = cudnn_la.make()
    drop_flag(double, cudnn_adapter.ENTRY_POINTS[op], flag)
    assert agrees(cudnn_backend(), case)
    assert fails(cudnn_adapter.CudnnBackend(double, device="cpu"), case)


# --- declines ------------------------------------------------------------------------------------

def test_cudnn_not_installed(open_gate, monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)  # `import cudnn` now raises ModuleNotFoundError
    verdict = cudnn_adapter.CudnnBackend().check(_cases("gdn")[0], ENV)
    assert not verdict.runnable
    assert verdict.reason == "cudnn:gdn: nvidia-cudnn-frontend is not installed (pip install 'deltacheck[cudnn]')"


def test_cudnn_op_missing_names_attribute_and_version(open_gate):
    double = cudnn_la.make(version="1.27.0")
    del double.gated_delta_net_v2
    verdict = cudnn_adapter.CudnnBackend(double, device="cpu").check(_cases("gdn2")[0], ENV)
    assert not verdict.runnable
    assert "gated_delta_net_v2" in verdict.reason and "1.27.0" in verdict.reason


def test_cudnn_graph_not_supported_becomes_decline_with_library_message(open_gate):
    why = "gdn2_frost: Gdn2FrostEngine requires SM100 / SM103 / SM107 (found 90)"
    backend = cudnn_backend(decline=lambda fn, call: why if fn == "gated_delta_net_v2" else None)
    verdict = backend.check(_cases("gdn2")[0], ENV)
    assert not verdict.runnable
    assert verdict.reason.startswith("cuDNN declined: no engine")
    assert why in verdict.reason
    assert backend.check(_cases("gdn")[0], ENV).runnable


def test_cudnn_decisions_are_cached_per_configuration(open_gate):
    probes = []
    backend = cudnn_backend(decline=lambda fn, call: probes.append(fn))
    case = _cases("kda")[0]
    for variant in (case, case.replace(seqlens=(9, 2, 0, 4)), case.replace(gate="steep", seed=3)):
        assert backend.check(variant, ENV).runnable
    assert len(probes) == 1  # lengths, gate profile and seed do not change the plan
    backend.check(case.replace(l2norm=False), ENV)
    assert len(probes) == 2


def test_cudnn_unknown_plan_name_is_declined(open_gate, monkeypatch):
    monkeypatch.setenv(cudnn_adapter.PLAN_ENV, "kda_cake")
    backend = cudnn_adapter.CudnnBackend(cudnn_la.make(), device="cpu")
    assert backend.plan_name == "kda_cake"
    verdict = backend.check(_cases("gdn")[0], ENV)
    assert not verdict.runnable and "no kda_cake plan" in verdict.reason and "gdn_frost" in verdict.reason


def test_cudnn_forward_only_plan_gives_backward_false(open_gate):
    backend = cudnn_backend(backward_decline=lambda fn, call: "kda_hopper: forward only")
    case = _cases("kda")[0]
    assert backend.check(case, ENV).backward  # forward-only case: nothing to decline
    verdict = backend.check(case.replace(backward=True), ENV)
    assert verdict.runnable and not verdict.backward
    assert "kda_hopper: forward only" in verdict.backward_reason


def test_cudnn_refusing_the_forward_that_records_for_a_backward_declines_only_the_backward(open_gate):
    """FE may refuse the training forward (the call with inputs that need gradients) where it plans the plain one:
    the probe's second call. That is the backward's decline; the forward stays runnable."""
    calls = []

    def training_refused(fn, call):
        calls.append(fn)
        return "kda_hopper: no training graph" if len(calls) > 1 else None

    backend = cudnn_backend(decline=training_refused)
    verdict = backend.check(_cases("kda")[0].replace(backward=True), ENV)
    assert verdict.runnable and not verdict.backward and len(calls) == 2
    assert verdict.backward_reason.startswith("the backward: cuDNN declined: ")
    assert "kda_hopper: no training graph" in verdict.backward_reason


def test_cudnn_missing_tileiras_is_a_decline(open_gate):
    backend = cudnn_backend(first_call_error=FileNotFoundError(2, "No such file or directory", "tileiras"))
    verdict = backend.check(_cases("gdn")[0], ENV)
    assert not verdict.runnable and "tileiras" in verdict.reason


def test_cudnn_gate_verdict_comes_first():
    verdict = cudnn_backend().check(_cases("gdn")[0], gate.Env(cuda=False))
    assert not verdict.runnable and "CUDA" in verdict.reason


def test_cudnn_conversions_are_recorded():
    io = torch.bfloat16
    tensors = {"g": torch.zeros(3, 2, dtype=torch.float64), "beta": torch.zeros(3, 2, 4, dtype=torch.float32),
               "w": torch.zeros(3, 2, 4, dtype=io), "initial_state": torch.zeros(1, 2, 4, 4)}
    out, notes = cudnn_adapter.conform("gdn2", tensors, io)
    assert out["beta"].dtype == io and out["g"].dtype == torch.float32 and out["w"] is tensors["w"]
    assert out["initial_state"] is tensors["initial_state"]
    assert len(notes) == 2 and any(n.startswith("beta cast fp32 -> bf16") for n in notes)
    # GDN/KDA accept an fp32 beta as it is.
    assert cudnn_adapter.conform("kda", {"beta": tensors["beta"]}, io)[1] == []


def test_importing_adapters_imports_no_library():
    """In a fresh interpreter (in this one another test may have imported a double under the library's name):
    building every built-in backend imports no fused library; that happens in ``check``."""
    code = (
        "import sys\n"
        "from deltacheck.harness.backends.base import get_backend, registered\n"
        "for name in registered():\n"
        "    get_backend(name)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('cudnn', 'fla', 'transformer_engine', 'triton'))\n"
        "print('LOADED', loaded)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=CHILD_ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "LOADED []" in proc.stdout, proc.stdout


# ================================================================================ FLA adapters

def _fla_decline(case, recurrent=False) -> str | None:
    """What FLA cannot express for our cases (the adapter must decline these, with a reason)."""
    if case.H > case.HV:
        return "GQA"
    if case.op == "gdn2" and case.HV != case.H and not recurrent:  # fused_recurrent_gdn2 does GVA
        return "no GVA"
    if case.gate_domain == "linear":
        return "linear gate domain"
    if case.op == "gdn2" and case.beta_sigmoid:
        return "no use_beta_sigmoid_in_kernel"
    return None


@pytest.mark.parametrize("recurrent", [False, True], ids=["chunk", "recurrent"])
@pytest.mark.parametrize("case", ALL_CASES)
def test_fla_adapter_matches_oracle_or_declines(open_gate, case, recurrent):
    backend = fla_backend(recurrent=recurrent)
    verdict = backend.check(case, ENV)
    expected = _fla_decline(case, recurrent)
    if expected:
        assert not verdict.runnable and expected in verdict.reason
        return
    assert verdict.runnable, verdict.reason
    assert verdict.backward is not recurrent
    assert agrees(backend, case)


def test_fla_adapter_calls_the_library_its_way(open_gate):
    double = fla_ops.make()
    case = _cases("kda")[4]  # thd (3, 0, 5), safe gate with a_log, h0
    fla_adapter.FlaBackend(double).run(case, make_inputs(case))
    call = double.calls[-1]
    assert call["q"].shape == (1, 8, case.H, case.K)
    assert call["cu_seqlens"].dtype == torch.int64 and call["cu_seqlens"].tolist() == [0, 3, 3, 8]
    assert call["initial_state"].dtype == torch.float32
    assert call["initial_state"].shape == (case.N, case.HV, case.K, case.V)
    assert call["use_gate_in_kernel"] and call["safe_gate"] and call["lower_bound"] == -5.0


@pytest.mark.parametrize("op", OPS)
def test_fla_adapter_gradients_match_oracle(open_gate, op):
    case = _fla_case(op, 4).replace(backward=True)

    def grads(backend):
        inputs = make_inputs(case)
        leaves = {n: x.requires_grad_() for n, x in inputs.items()
                  if isinstance(x, torch.Tensor) and x.is_floating_point()}
        out, state = backend.run(case, inputs)
        ((out.double() * 1.5).sum() + (state.double() * 0.5).sum()).backward()
        return {n: x.grad for n, x in leaves.items()}

    assert fla_backend().check(case, ENV).runnable
    got, want = grads(fla_backend()), grads(get_backend("oracle"))
    for name in want:
        assert _err(got[name], want[name]) < TOL, name


def test_fla_transposed_state_is_caught(open_gate, monkeypatch):
    case = _cases("kda")[4].replace(K=64, V=64)
    assert agrees(fla_backend(), case)
    monkeypatch.setattr(fla_adapter, "state_to_key_major_fp32", lambda s: None if s is None else s.float().contiguous())
    assert fails(fla_backend(), case)


def test_fla_mispacked_layout_is_caught(open_gate, monkeypatch):
    case = _cases("gdn")[3].replace(seqlens=(7, 7, 7))  # bhsd
    assert agrees(fla_backend(), case)
    real = fla_adapter.to_btd
    monkeypatch.setattr(fla_adapter, "to_btd", lambda x, layout: real(x, "sbhd" if layout == "bhsd" else layout))
    assert fails(fla_backend(), case)


_FLA_DROPS = [
    ("scale", "kda", 0), ("use_qk_l2norm_in_kernel", "gdn", 0), ("allow_neg_eigval", "kda", 0),
    ("use_beta_sigmoid_in_kernel", "gdn", 4), ("use_gate_in_kernel", "gdn2", 4), ("A_log", "kda", 4),
    ("dt_bias", "gdn", 3), ("lower_bound", "kda", 4), ("initial_state", "gdn2", 4), ("cu_seqlens", "kda", 0),
]


def _fla_case(op: str, which: int) -> Case:
    """``_cases(op)[which]``, minus the beta sigmoid FLA's gdn2 does not have."""
    case = _cases(op)[which]
    return case.replace(beta_sigmoid=False, neg_eigval=False) if op == "gdn2" else case


@pytest.mark.parametrize("flag,op,which", _FLA_DROPS, ids=[f"{d[0]}-{d[1]}" for d in _FLA_DROPS])
def test_fla_dropped_flag_is_caught(open_gate, flag, op, which):
    case = _fla_case(op, which)
    assert agrees(fla_backend(), case)
    double = fla_ops.make()
    drop_flag(double, fla_adapter.CHUNK[op][1], flag)
    assert fails(fla_adapter.FlaBackend(double), case)


def test_fla_not_installed_sets_dispatch_env_first(open_gate, monkeypatch):
    monkeypatch.delenv(fla_adapter.DISPATCH_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "fla", None)
    verdict = fla_adapter.FlaBackend().check(_cases("kda")[0], ENV)
    assert not verdict.runnable
    assert verdict.reason == "fla:kda: fla-core is not installed (pip install 'deltacheck[fla]')"
    import os

    assert os.environ[fla_adapter.DISPATCH_ENV] == "1"


def test_fla_op_missing_names_attribute_and_version(open_gate):
    double = fla_ops.make(version="0.5.0")
    del double.chunk_gdn2
    verdict = fla_adapter.FlaBackend(double).check(_cases("gdn2")[4].replace(beta_sigmoid=False), ENV)
    assert not verdict.runnable and "chunk_gdn2" in verdict.reason and "0.5.0" in verdict.reason


def test_fla_hopper_guard_becomes_backward_false(open_gate):
    case = _cases("gdn")[4].replace(backward=True)
    backend = fla_backend(hopper_guard_fires=True)
    verdict = backend.check(case, ENV)
    assert verdict.runnable and not verdict.backward
    assert "#640" in verdict.backward_reason and "3.7.1" in verdict.backward_reason
    # The guard is real: FLA itself raises in the backward.
    inputs = make_inputs(case)
    inputs["q"].requires_grad_()
    out, _ = backend.run(case, inputs)
    with pytest.raises(RuntimeError, match="#640"):
        out.double().sum().backward()
    # KDA / GDN2 use their own backward kernels: unaffected.
    assert backend.check(_cases("kda")[4].replace(backward=True), ENV).backward
    # Without the guard, GDN backward is fine.
    assert fla_backend().check(case, ENV).backward


def test_fla_recurrent_is_forward_only(open_gate):
    case = _cases("kda")[0].replace(backward=True)
    backend = fla_backend(recurrent=True)
    verdict = backend.check(case, ENV)
    assert verdict.runnable and not verdict.backward and "forward-only" in verdict.backward_reason
    inputs = make_inputs(case)
    inputs["v"].requires_grad_()
    out, _ = backend.run(case, inputs)
    with pytest.raises(NotImplementedError):
        out.double().sum().backward()


def test_fla_conversions_are_recorded(open_gate):
    notes = fla_backend().check(_cases("gdn")[3].replace(initial_state=True, state_dtype="bf16"), ENV).notes
    assert any("bf16 -> fp32" in n for n in notes)
    assert any("A_log = 0" in n for n in notes)  # GDN safe gate without a_log


def test_fla_gate_verdict_comes_first():
    verdict = fla_backend().check(_cases("gdn")[0], gate.Env(cuda=False))
    assert not verdict.runnable and "CUDA" in verdict.reason


@pytest.mark.parametrize("make_backend", [cudnn_backend, fla_backend], ids=["cudnn", "fla"])
def test_gate_verdict_is_merged_not_dropped(monkeypatch, make_backend):
    """The gate's own backward refusal and notes survive the library's (runnable) answer."""
    for adapter in (cudnn_adapter.CudnnBackend, fla_adapter.FlaBackend):
        monkeypatch.setattr(adapter, "pair_verdict", lambda self, op, env: Verdict.ok(
            "KNOWN-WRONG: gate note", backward=False, backward_reason="gate: backward refused"))
    verdict = make_backend().check(_cases("kda")[4].replace(backward=True), ENV)
    assert verdict.runnable and not verdict.backward
    assert "gate: backward refused" in verdict.backward_reason
    assert "KNOWN-WRONG: gate note" in verdict.notes


def test_cudnn_gdn2_beta_guard_is_passed_and_dropping_it_is_caught(open_gate):
    # zero decay gives the guard no budget, so it flattens beta and the result really depends on the flag
    case = Case(op="gdn2", layout="thd", seqlens=(9, 0, 5), H=2, HK=2, HV=2, K=64, V=64, gate="zero",
                l2norm=True, beta_guard=True, initial_state=True)
    assert agrees(cudnn_backend(), case)
    double = cudnn_la.make()
    drop_flag(double, "gated_delta_net_v2", "beta_guard")
    assert fails(cudnn_adapter.CudnnBackend(double, device="cpu"), case)


def test_reference_arguments_give_every_keyword_docs_backends_lists_and_the_guard_dtype():
    """docs/backends.md's mapping from Case fields to the reference's keywords is what the helper gives."""
    import torch

    from deltacheck.cases import Case, make_inputs
    from deltacheck.harness.backends.reference import reference_arguments

    docs = (Path(__file__).resolve().parent.parent / "docs" / "backends.md").read_text()
    guard = Case.from_id("gdn2-bf16-thd-N3-T[0_65_130]-H2/2/2-K128-V128-mild-l2norm-guard-h0-cont[64]-bwd")
    args, kwargs = reference_arguments(guard, make_inputs(guard))
    assert len(args) == 7 and kwargs["beta_guard"] is True and kwargs["guard_dtype"] is torch.bfloat16
    assert kwargs["gate_lower_bound"] == guard.support.gate_lower_bound and kwargs["state_layout"] == "vk"
    for key in kwargs:
        if key not in ("method", "a_log", "dt_bias"):
            assert f"`{key}" in docs, f"docs/backends.md does not list the reference keyword {key}"
    gdn = Case.from_id("gdn-bf16-thd-N4-T[0_1_64_65]-H2/2/2-K64-V64-typical-h0-cont[1_64]-bwd")
    _, plain = reference_arguments(gdn, make_inputs(gdn))
    assert "beta_guard" not in plain and "guard_dtype" not in plain and "gate_lower_bound" not in plain
