"""The ``jax`` backend (jax-linear-attention 0.1.0 through DLPack, gradients by ``jax.vjp``) against a contract
double of JAX and ``jla.ops`` (tests/doubles/jax_la.py; real JAX is not installed in CI, and jla's kernels need
an SM90 GPU). Every agreement test has a twin that breaks the adapter the way an integration breaks — a
transposed state, the gate in the wrong domain, a layout not converted — and shows it is caught.
"""

from __future__ import annotations

import pytest
import torch
from caught import caught
from doubles import jax_la

from deltacheck.cases import Case, make_inputs
from deltacheck.harness.backends.base import Verdict, get_backend
from deltacheck.harness.backends.jaxla import adapter, bridge, facts
from deltacheck.harness.judge.runner import CaseRunner, RunOptions
from deltacheck.harness.machine import environment

ENV = environment.Env(cuda=True, device_name="NVIDIA H200 (test double)", capability=(9, 0),
                      versions={"jax_linear_attention": "0.1.0", "jax": "0.11.2"})
TOL = 1e-12

CASES = [
    Case(op="gdn", layout="bshd", seqlens=(5, 5), H=2, HK=2, HV=4, K=64, V=128, l2norm=True, initial_state=True),
    Case(op="gdn", layout="thd", seqlens=(6, 6, 6), K=128, V=64, scale=0.3, initial_state=True, state_dtype="bf16"),
    Case(op="gdn", layout="bhsd", seqlens=(7,), io_dtype="fp16", K=64, V=64, gate="steep"),
    Case(op="kda", layout="sbhd", seqlens=(4, 4), K=128, V=64, initial_state=True),
    Case(op="gdn2", layout="thd", seqlens=(6,), K=64, V=64, l2norm=True, initial_state=True),
    Case(op="gdp", layout="thd", seqlens=(5, 5), num_householder=2, K=64, V=128, initial_state=True),
]


@pytest.fixture
def open_gate(monkeypatch):
    """The floors have their own tests below; here the double stands in for an SM90 machine."""
    monkeypatch.setattr(adapter.JaxBackend, "pair_verdict", lambda self, op, env: Verdict.ok())


def jax_backend():
    jax, ops = jax_la.make()
    return adapter.JaxBackend(ops, jax=jax)


def agrees(backend, case, tol=TOL) -> bool:
    inputs = make_inputs(case)
    out, state = backend.run(case, inputs)
    ref_out, ref_state = get_backend("oracle").run(case, inputs)
    if out.shape != ref_out.shape or state.shape != ref_state.shape:
        return False
    err = max(float((a.double() - b).abs().max() / b.abs().max()) for a, b in ((out, ref_out), (state, ref_state)))
    return err <= tol


def grads(backend, case) -> dict:
    inputs = make_inputs(case)
    leaves = {n: x.requires_grad_() for n, x in inputs.items() if isinstance(x, torch.Tensor) and x.is_floating_point()}
    out, state = backend.run(case, inputs)
    torch.manual_seed(0)
    wo, ws = torch.randn(out.shape, dtype=torch.float64), torch.randn(state.shape, dtype=torch.float64)
    ((out.double() * wo).sum() + (state.double() * ws).sum()).backward()
    return {n: x.grad for n, x in leaves.items()}


# ================================================================================ agreement

@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_jax_matches_oracle(open_gate, case):
    backend = jax_backend()
    verdict = backend.check(case, ENV)
    assert verdict.runnable, verdict.reason
    assert agrees(backend, case)


@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[4], CASES[5]], ids=lambda c: c.op)
def test_gradients_through_jax_vjp_match_oracle(open_gate, case):
    case = case.replace(backward=True)
    backend = jax_backend()
    got, want = grads(backend, case), grads(get_backend("oracle"), case)
    assert "vjp" in backend._jax.calls
    assert set(got) == set(want)
    for name in want:
        assert got[name] is not None, name
        assert float((got[name].double() - want[name]).abs().max() / want[name].abs().max()) < 1e-10, name


def test_through_the_runner_every_check_passes(open_gate):
    backend = jax_backend()
    runner = CaseRunner(RunOptions(reference="oracle"))
    case = Case(op="gdn", layout="bshd", seqlens=(6, 6), H=2, HK=2, HV=4, initial_state=True, splits=(4,),
                backward=True)
    results = runner.run(case, backend, backend.name, backend.check(case, ENV))
    assert {r.check for r in results} >= {"forward", "state", "continuation_ref", "grad_q", "grad_beta"}
    assert all(r.status == "pass" for r in results), [(r.check, r.reason) for r in results if r.status != "pass"]


def test_calls_jla_by_name_in_its_layout(open_gate):
    """impl='mosaic_gpu' (never 'auto', which would fall back to jla's chunked JAX quietly), FLA's [B, T, H, D],
    a thd batch of equal lengths as [N, L, ...], GDN2's erase gate as b, the state key-major, jitted once."""
    backend = jax_backend()
    case = CASES[4].replace(seqlens=(6, 6))
    backend.run(case, make_inputs(case))
    backend.run(case, make_inputs(case))
    call = backend._module.calls[-1]
    assert call["kind"] == "gdn2" and call["q"].shape == (2, 6, 2, 64)
    assert [g.shape for g in call["gates"]] == [(2, 6, 2, 64), (2, 6, 2, 64), (2, 6, 2, 64)]
    assert call["initial_state"].shape == (2, 2, 64, 64) and call["use_qk_l2norm"] is True
    assert call["output_final_state"] is True
    assert len(backend._jitted) == 1 and backend._jax.calls.count("jit") == 2


# ================================================================================ breaking the adapter is caught

def test_untransposed_initial_state_is_caught(open_gate, monkeypatch):
    case = CASES[2].replace(initial_state=True)  # K == V: a value-major state has jla's shape and wrong values
    assert agrees(jax_backend(), case)
    monkeypatch.setattr(adapter, "library_state", lambda h0: h0)
    assert caught(lambda: agrees(jax_backend(), case))


def test_gate_in_the_linear_domain_is_caught(open_gate, monkeypatch):
    """jla reads g as a log-space decay; alpha = exp(g) handed over instead is refused by the library's check."""
    case = CASES[0]
    monkeypatch.setattr(adapter, "library_gate", lambda case, g: torch.exp(g))
    assert caught(lambda: agrees(jax_backend(), case))


@pytest.mark.parametrize("layout", ["sbhd", "bhsd"])
def test_layout_not_converted_is_caught(open_gate, monkeypatch, layout):
    case = CASES[3].replace(layout=layout, seqlens=(4, 4), K=128, V=128)
    assert agrees(jax_backend(), case)
    monkeypatch.setattr(adapter, "to_btd", lambda x, case: x.reshape(x.shape) if case.layout != "thd" else x)
    assert caught(lambda: agrees(jax_backend(), case))


# ================================================================================ declines

@pytest.mark.parametrize("case, words", [
    (Case(op="gdn", gate_domain="linear"), "gate_domain='linear'"),
    (Case(op="gdn", beta_sigmoid=True), "beta sigmoid"),
    (Case(op="kda", safe_gate=True), "safe gate"),
    (Case(op="gdn", H=4, HK=2, HV=2), "no GQA"),
    (Case(op="kda", H=2, HK=2, HV=4), "no GVA"),
    (Case(op="gdn", layout="thd", seqlens=(3, 5)), "no cu_seqlens"),
    (Case(op="gdn", K=96, V=96), "head dims"),
    (Case(op="kda", io_dtype="fp16"), "bf16"),
    (Case(op="kda", H=1, HK=1, HV=1, K=64, V=64), "H * K a multiple of 128"),
], ids=lambda x: x.id if isinstance(x, Case) else None)
def test_declines_with_reason(open_gate, case, words):
    verdict = jax_backend().check(case, ENV)
    assert not verdict.runnable and words in verdict.reason


@pytest.mark.parametrize("env, words", [
    (environment.Env(cuda=False), "needs a CUDA GPU"),
    (environment.Env(cuda=True, capability=(10, 0), versions=ENV.versions), "needs an SM90 GPU"),
    (environment.Env(cuda=True, capability=(9, 0), versions={"jax": "0.11.2"}), "jax-linear-attention is not installed"),
    (environment.Env(cuda=True, capability=(9, 0), versions={"jax_linear_attention": "0.1.0"}), "jax is not installed"),
])
def test_floors(env, words):
    verdict = adapter.JaxBackend().pair_verdict("gdn", env)
    assert not verdict.runnable and words in verdict.reason


def test_another_jax_is_a_note_not_a_refusal():
    env = environment.Env(cuda=True, capability=(9, 0), versions={"jax_linear_attention": "0.1.0", "jax": "0.12.0"})
    verdict = adapter.JaxBackend().pair_verdict("kda", env)
    assert verdict.runnable and any("0.11.2" in n for n in verdict.notes)


def test_envelopes_are_sm90_only():
    backend = adapter.JaxBackend()
    assert backend.envelopes("gdn", sm=100) == [] and backend.envelopes("gdn", env=environment.Env(cuda=False)) == []
    (gdn,) = backend.envelopes("gdn", sm=90)
    assert gdn.sms == (90,) and "linear" not in gdn.allowed["gate_mode"]


# ================================================================================ the bridge

def test_jax_configured_before_import_and_cache_under_deltacheck(tmp_path, monkeypatch):
    monkeypatch.setenv("DELTACHECK_CACHE_DIR", str(tmp_path))
    environ: dict = {}
    made = {}

    def importer(name):
        assert name == "jax"
        made["jax"] = jax_la.make_jax(environ)  # what the environment held when jax was imported
        return made["jax"]

    jax = bridge.configure_jax(importer, environ)
    assert jax.environ_at_import["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert jax.config.values["jax_compilation_cache_dir"] == str(tmp_path / "jax")


def test_a_users_preallocation_setting_is_kept():
    environ = {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    bridge.configure_jax(lambda name: jax_la.make_jax(environ), environ)
    assert environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"


def test_dlpack_hand_off_shares_memory_and_waits_for_xla():
    jax = jax_la.make_jax()
    x = torch.arange(6.0).reshape(2, 3)
    array = bridge.to_jax(jax, x)
    x[0, 0] = 42.0  # zero-copy: the JAX array sees the torch tensor's memory
    assert array.tensor[0, 0] == 42.0
    strided = bridge.to_jax(jax, x.t())  # made contiguous first: the double (like XLA) takes row-major only
    assert strided.shape == (3, 2)
    back = bridge.to_torch(array)
    assert array.ready_calls == 1 and back.data_ptr() == x.data_ptr()


def test_importing_the_adapters_imports_no_library():
    """Building the backends (as `deltacheck env` does) imports neither JAX, jla nor FlashInfer."""
    import subprocess
    import sys

    code = ("import sys; from deltacheck.harness.backends.base import get_backend; "
            "[get_backend(s) for s in ('jax', 'flashinfer', 'flashinfer-decode')]; "
            "print(sorted(m for m in ('jax', 'jla', 'flashinfer') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_unaligned_view_reaches_jax_as_an_aligned_copy():
    """XLA takes only 256-byte-aligned DLPack buffers; the NaN-margin views the harness hands adapters start
    mid-allocation (the H200 run of 2026-12-02 errored on 25 checks before this)."""
    from deltacheck.harness.backends.jaxla import bridge

    seen = []

    class FakeDlpack:
        @staticmethod
        def from_dlpack(x):
            seen.append(x.data_ptr() % bridge.XLA_ALIGNMENT)
            return x

    class FakeJax:
        dlpack = FakeDlpack

    base = torch.zeros(1024, dtype=torch.float32)
    view = base[3:67]
    assert view.data_ptr() % bridge.XLA_ALIGNMENT
    out = bridge.to_jax(FakeJax, view, align=True)
    assert seen == [0] and torch.equal(out, view)
    seen.clear()
    bridge.to_jax(FakeJax, view)  # a CPU tensor is handed over as it is (the refusal was XLA's on the GPU)
    assert seen == [view.data_ptr() % bridge.XLA_ALIGNMENT]


def test_declines_exactly_outside_its_envelope_on_every_l0_case(open_gate):
    """The adapter's own declines (what jla cannot express) and its declared envelope agree on every case of
    L0 with jax's appended cases, so neither drifts. The H200 run of 2026-12-02 (issue 25) noted 29 cases
    "declined inside its declared envelope": KDA and GDN2 cases with GVA heads, which vector_gate_ops.py refuses
    (v.shape[:3] == q.shape[:3]) while the envelope allowed them."""
    from deltacheck.harness.ci.tiers import tier_cases
    from deltacheck.harness.machine.availability import backend_envelope

    backend = jax_backend()
    disagree = []
    for case in tier_cases("L0", ("jax",)):
        verdict = backend.check(case, ENV)
        forward, backward = backend_envelope("jax", case.op, env=ENV, backend=backend).serves(case)
        if verdict.runnable != forward or (case.backward and verdict.runnable and verdict.backward != backward):
            disagree.append((case.id, verdict.reason))
    assert disagree == []


def test_graph_replay_declines_with_why_and_causality_runs(open_gate):
    # A torch graph around the bridge would hold no XLA kernel (and its synchronize is illegal while capturing):
    # the graph-replay check declines with that reason; causality (no capture) runs on the double and passes.
    from deltacheck.harness.judge.invariance_checks import causality, graph_replay
    case = CASES[0]
    got = graph_replay(jax_backend(), case, ENV, "cuda")
    assert got.status == "declined" and "XLA" in got.reason and "synchronize" in got.reason
    judged = causality(jax_backend(), case, ENV, "cpu")
    assert judged.status == "passed" and judged.numbers["rule"] == "chunked"  # jla's kernels are chunked
