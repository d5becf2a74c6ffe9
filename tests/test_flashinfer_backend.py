"""The FlashInfer backends (``flashinfer``: SM90 GDN prefill; ``flashinfer-decode``: the decode kernel fed one token
per call) against FlashInfer 0.7.2's contract double (tests/doubles/flashinfer_gdn.py). FlashInfer's CuTe DSL kernels
need an SM90 GPU and nvidia-cutlass-dsl, so the double is the CI test. Every agreement test has a twin that breaks
the adapter (a state left value-major, a log-space g handed over as alpha — FlashInfer issue 2490's all-NaN — a
layout not packed) and shows it is caught.

Tolerances: the prefill's alpha is float32 by FlashInfer's contract, so ``exp(g)`` rounds there (~3e-8 relative
after the reference takes its log again); the decode's state pool is float32 and rounds at every step. Both are
the API's precision, far below what a wrong conversion gives (O(1), or NaN).
"""

from __future__ import annotations

import pytest
import torch
from caught import caught
from doubles import flashinfer_gdn

from deltacheck.cases import Case, make_inputs
from deltacheck.harness.backends.base import Verdict, get_backend
from deltacheck.harness.backends.flashinfer import adapter, facts
from deltacheck.harness.judge.runner import CaseRunner, RunOptions
from deltacheck.harness.machine import environment

ENV = environment.Env(cuda=True, device_name="NVIDIA H200 (test double)", capability=(9, 0),
                      versions={"flashinfer": "0.7.2.post1", "cutlass_dsl": "4.8.1"})
TOL = 1e-6

PREFILL = [
    Case(op="gdn", layout="thd", seqlens=(0, 1, 6, 3), H=4, HK=2, HV=2, K=128, V=128, l2norm=True, initial_state=True),
    Case(op="gdn", layout="bhsd", seqlens=(5, 5), H=2, HK=2, HV=4, K=128, V=128, gate_domain="linear",
         initial_state=True, state_dtype="bf16"),
    Case(op="gdn", layout="sbhd", seqlens=(4, 4, 4), io_dtype="fp16", K=128, V=128, scale=0.3, gate="steep"),
    Case(op="gdn", layout="bshd", seqlens=(7,), K=128, V=128, initial_state=True),
]
DECODE = [
    Case(op="gdn", layout="thd", seqlens=(3, 0, 5), H=2, HK=2, HV=4, K=128, V=128, safe_gate=True, a_log=True,
         dt_bias=True, beta_sigmoid=True, initial_state=True, l2norm=True),
    Case(op="gdn", layout="sbhd", seqlens=(4, 4), K=128, V=128, safe_gate=True, beta_sigmoid=True, scale=0.3,
         initial_state=True, state_dtype="bf16"),
    Case(op="gdn", layout="bhsd", seqlens=(3,), io_dtype="fp16", K=256, V=256, safe_gate=True, dt_bias=True,
         beta_sigmoid=True),
]


@pytest.fixture
def open_gate(monkeypatch):
    monkeypatch.setattr(adapter.FlashInferBackend, "pair_verdict", lambda self, op, env: Verdict.ok())


def fi_backend(decode=False, double=None):
    return adapter.FlashInferBackend(double or flashinfer_gdn.make(), decode=decode)


def error(backend, case) -> float:
    inputs = make_inputs(case)
    out, state = backend.run(case, inputs)
    ref_out, ref_state = get_backend("oracle").run(case, inputs)
    if out.shape != ref_out.shape or state.shape != ref_state.shape:
        return float("inf")
    errs = [float((a.double() - b).abs().max() / b.abs().max()) for a, b in ((out, ref_out), (state, ref_state))]
    return float("nan") if any(e != e for e in errs) else max(errs)


def agrees(backend, case) -> bool:
    return error(backend, case) <= TOL  # NaN compares False: a NaN result never agrees


# ================================================================================ agreement

@pytest.mark.parametrize("decode, case", [(False, c) for c in PREFILL] + [(True, c) for c in DECODE],
                         ids=lambda x: x.id if isinstance(x, Case) else ("decode" if x else "prefill"))
def test_flashinfer_matches_oracle(open_gate, decode, case):
    backend = fi_backend(decode)
    verdict = backend.check(case, ENV)
    assert verdict.runnable and not verdict.backward, verdict.reason
    assert agrees(backend, case)


def test_through_the_runner_forward_checks_pass(open_gate):
    runner = CaseRunner(RunOptions(reference="oracle"))
    for decode, case in ((False, PREFILL[0].replace(splits=(5,))), (True, DECODE[0].replace(splits=(4,)))):
        backend = fi_backend(decode)
        results = runner.run(case, backend, backend.name, backend.check(case, ENV))
        assert {r.check for r in results} >= {"forward", "state", "continuation_ref"}
        assert all(r.status == "pass" for r in results), [(r.check, r.reason) for r in results if r.status != "pass"]


def test_prefill_call_in_flashinfers_terms(open_gate):
    """Packed tokens with int32 cu_seqlens (a dense case as B sequences of S), alpha = exp(g) and beta in fp32,
    the state value-major as FlashInfer keeps it, output_final_state=True."""
    double = flashinfer_gdn.make()
    case = PREFILL[2]
    inputs = make_inputs(case)
    fi_backend(double=double).run(case, inputs)
    call = double.calls[-1]
    assert call["q"].shape == (12, 2, 128) and call["cu_seqlens"].tolist() == [0, 4, 8, 12]
    assert call["g"].dtype == torch.float32 and bool((call["g"] > 0).all())
    assert torch.equal(call["g"], torch.exp(inputs["g"].transpose(0, 1).flatten(0, 1).float()))
    assert call["beta"].dtype == torch.float32 and call["scale"] == 0.3


def test_decode_steps_one_token_per_sequence_through_the_pool(open_gate):
    double = flashinfer_gdn.make()
    case = DECODE[0]  # lengths 3, 0, 5: steps 0-2 carry sequences 0 and 2, steps 3-4 sequence 2
    fi_backend(True, double).run(case, make_inputs(case))
    steps = [c for c in double.calls if c["fn"] == "decode"]
    assert len(steps) == 5
    assert [c["initial_state_indices"].tolist() for c in steps] == [[0, 2]] * 3 + [[2]] * 2
    assert steps[0]["q"].shape == (2, 1, 2, 128) and steps[0]["a"].shape == (2, 1, 4)
    assert steps[0]["a"].dtype == torch.float32 and steps[0]["A_log"].dtype == torch.float32


# ================================================================================ breaking the adapter is caught

def test_state_left_value_major_is_caught(open_gate, monkeypatch):
    case = PREFILL[3]  # K == V: the untransposed state has the right shape
    assert agrees(fi_backend(), case)
    original = adapter.FlashInferBackend._run_prefill

    def no_flip(self, case, inputs):
        out, state = original(self, case, inputs)
        return out, state.transpose(-1, -2)  # undo the adapter's flip: FlashInfer's [N, H, V, K] as is

    monkeypatch.setattr(adapter.FlashInferBackend, "_run_prefill", no_flip)
    assert caught(lambda: agrees(fi_backend(), case))


def test_log_space_g_passed_as_alpha_is_caught(open_gate, monkeypatch):
    """FlashInfer issue 2490: log-space g where alpha belongs gives all-NaN output; the comparison refuses it."""
    case = PREFILL[0]
    monkeypatch.setattr(adapter, "library_alpha", lambda case, g: g.float())
    assert error(fi_backend(), case) != error(fi_backend(), case)  # NaN
    assert caught(lambda: agrees(fi_backend(), case))


def test_dense_layout_not_transposed_is_caught(open_gate, monkeypatch):
    case = PREFILL[2]  # sbhd
    monkeypatch.setattr(adapter, "to_packed", lambda x, case: None if x is None else (
        x.flatten(0, 1).contiguous() if case.layout != "thd" else x.contiguous()))
    assert caught(lambda: agrees(fi_backend(), case))


# ================================================================================ declines

@pytest.mark.parametrize("decode, case, words", [
    (False, Case(op="gdn", K=64, V=64), "head dims"),
    (False, Case(op="gdn", K=128, V=64), "head dims"),
    (False, Case(op="gdn", K=128, V=128, beta_sigmoid=True), "post-activation"),
    (False, Case(op="gdn", K=128, V=128, safe_gate=True), "post-activation"),
    (False, Case(op="gdn", K=128, V=128, beta_sigmoid=True, neg_eigval=True), "allow_neg_eigval"),
    (True, Case(op="gdn", K=128, V=128), "softplus"),
    (True, Case(op="gdn", K=128, V=128, safe_gate=True), "softplus"),
    (True, Case(op="gdn", K=128, V=128, H=4, HK=2, HV=2, safe_gate=True, beta_sigmoid=True), "no GQA"),
    (True, Case(op="gdn", K=64, V=64, safe_gate=True, beta_sigmoid=True), "head dims"),
], ids=lambda x: x.id if isinstance(x, Case) else None)
def test_declines_with_reason(open_gate, decode, case, words):
    verdict = fi_backend(decode).check(case, ENV)
    assert not verdict.runnable and words in verdict.reason


def test_gdp_and_other_ops_are_declined_with_where_to_go():
    backend = adapter.FlashInferBackend()
    assert "SM100" in backend.pair_verdict("gdp", ENV).reason and not backend.pair_verdict("gdp", ENV).runnable
    assert "not 'kda'" in backend.load("kda").reason


@pytest.mark.parametrize("env, words", [
    (environment.Env(cuda=False), "needs a CUDA GPU"),
    (environment.Env(cuda=True, capability=(10, 0), versions=ENV.versions), "needs an SM90 GPU"),
    (environment.Env(cuda=True, capability=(9, 0), versions={"cutlass_dsl": "4.8.1"}), "flashinfer-python is not installed"),
    (environment.Env(cuda=True, capability=(9, 0), versions={"flashinfer": "0.7.2"}), "nvidia-cutlass-dsl is not installed"),
])
def test_floors(env, words):
    verdict = adapter.FlashInferBackend().pair_verdict("gdn", env)
    assert not verdict.runnable and words in verdict.reason


def test_the_served_prefill_path_is_flashinfers_own_routing(open_gate):
    """Small batches go to the context-parallel kernel under use_cp='auto' (num_seqs * heads below half the SMs);
    the result records which path served, as FlashInfer's helper decides it."""
    backend = fi_backend()
    case = PREFILL[0]  # 4 sequences x 4 heads = 16 < 66
    backend.run(case, make_inputs(case))
    assert backend.served() == {"path": "cp"}
    wide = case.replace(seqlens=(1,) * 17)  # 17 x 4 = 68
    backend.run(wide, make_inputs(wide))
    assert backend.served() == {"path": "chunked"}
    assert fi_backend(decode=True).served() == {}


def test_reports_count_cases_per_served_prefill_path(open_gate):
    """summary.md's 'Results per served path' shows FlashInfer's cp and chunked prefill kernels apart (issue 25:
    results per served path), from the path each forward result records."""
    from deltacheck.reports.served import served_paths

    runner = CaseRunner(RunOptions(reference="oracle"))
    backend = fi_backend()
    records = []
    for case in (PREFILL[0], PREFILL[0].replace(seqlens=(1,) * 17)):  # 16 and 68 sequence-heads: cp, chunked
        for r in runner.run(case, backend, backend.name, backend.check(case, ENV)):
            records.append({"backend": backend.name, "op": case.op, "case": case.id, "check": r.check,
                            "status": r.status, "metrics": dict(r.metrics)})
    rows = {(r["direction"], r["engine"]): (r["cases"], r["pass"]) for r in served_paths(records)}
    assert rows == {("forward", "cp path"): (1, 1), ("forward", "chunked path"): (1, 1)}


# ================================================================================ CUDA-graph capture

class _Capturing:
    """``torch`` as the adapter sees it inside a CUDA graph's capture: a tensor made from host data
    (``torch.tensor(list, device=...)``, a host-to-device copy) is refused, in torch's words."""

    def __getattr__(self, name):
        return getattr(torch, name)

    def tensor(self, *args, **kwargs):
        raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor "
                           "is pinned")


@pytest.mark.parametrize("decode, case", [(False, PREFILL[1]), (False, PREFILL[2]), (True, DECODE[0]),
                                          (True, DECODE[1])], ids=lambda x: x.id if isinstance(x, Case) else str(x))
def test_a_call_after_the_warm_up_makes_no_tensor_from_host_data(open_gate, monkeypatch, decode, case):
    """Session 5 on the H200: graph replay declined every dense flashinfer case (23) and both flashinfer-decode cases
    with "capture refused: ... Cannot copy between CPU and CUDA tensors during CUDA graph capture": the adapter's own
    index tensors (packed offsets, decode rows), made from Python lists on every call. They are made once per
    lengths now, in the warm-up calls the capture starts with."""
    backend = fi_backend(decode)
    inputs = make_inputs(case)
    out, state = backend.run(case, inputs)
    monkeypatch.setattr(adapter, "torch", _Capturing())
    out2, state2 = backend.run(case, inputs)
    assert torch.equal(out, out2) and torch.equal(state, state2)
