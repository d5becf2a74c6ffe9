"""FlashKDA's checkpoint state as the serving hook's "checkpoints" mode (harness/backends/flashkda/serving.py),
against the contract double (tests/doubles/flashkda_ops.py: vllm-project/FlashKDA's checkpoint_state /
checkpoint_offsets, one checkpoint per sequence per call, stored where an offset ends a 16-token tile). The clean
double passes the checkpoints check; each planted defect of the store fails it; what FlashKDA cannot do declines
with the source's reason."""

from __future__ import annotations

import pytest
import torch
from doubles import flashkda_ops

from deltacheck.cases import Case, make_inputs
from deltacheck.harness.backends.flashkda import FlashKdaBackend
from deltacheck.harness.backends.flashkda import facts as kda_facts
from deltacheck.harness.backends.flashkda.serving import checkpoint_offsets
from deltacheck.harness.backends.serving import SERVING_MODES, ServingCall
from deltacheck.harness.judge.serving_checks import checkpoints
from deltacheck.harness.machine import environment as gate

H200 = gate.Env(cuda=True, device_name="NVIDIA H200 (test double)", capability=(9, 0),
                versions={"vllm": "0.33.0", "triton": "3.6.0"})
KDA = dict(op="kda", K=128, V=128, H=2, HK=2, HV=2, l2norm=True, beta_sigmoid=True, safe_gate=True, a_log=True,
           dt_bias=True)
CASES = [
    Case(layout="thd", seqlens=(40, 0, 33, 16, 5), initial_state=True, checkpoint_every=16, **KDA),
    Case(layout="thd", seqlens=(70, 31), checkpoint_every=32, **KDA),
    Case(layout="thd", seqlens=(48, 48), initial_state=True, state_dtype="bf16", checkpoint_every=16, **KDA),
]


def backend(double=None, flavour=kda_facts.VLLM):
    return FlashKdaBackend(flavour, double or flashkda_ops.make(flavour), probe_device="cpu")


@pytest.fixture(autouse=True)
def open_gate(monkeypatch):
    monkeypatch.setattr(FlashKdaBackend, "pair_verdict", lambda self, op, env: gate_ok())


def gate_ok():
    from deltacheck.harness.backends.base import Verdict

    return Verdict.ok()


def test_offsets_are_one_call_per_checkpoint_after_the_first_row():
    # rows p = 0, 16, 32 for 40 tokens; none past 0 for 16 or 5 tokens; 0 never matches a tile end
    assert checkpoint_offsets([40, 0, 33, 16, 5], 16) == [[16, 0, 16, 0, 0], [32, 0, 32, 0, 0]]
    assert checkpoint_offsets([16, 5], 16) == []


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_clean_double_passes_the_checkpoints_check(case):
    double = flashkda_ops.make()
    r = checkpoints(backend(double), case, H200)
    assert r.status == "passed", (r.reason, r.numbers)
    # the adapter rounds g and beta to bf16 (FlashKDA's dtypes): 5.5e-4..7.8e-4 here, bf16-level as the forward's
    assert r.numbers["checkpoint_err"] < 1e-2
    assert double.calls, "the kernel ran"


@pytest.mark.parametrize("bug", flashkda_ops.CHECKPOINT_BUGS)
@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: c.id)
def test_a_planted_store_defect_fails_the_checkpoints_check(case, bug):
    r = checkpoints(backend(flashkda_ops.make(checkpoint_bug=bug)), case, H200)
    assert r.status == "failed", (bug, r.status, r.reason, r.numbers)
    assert r.numbers["checkpoint_err"] > 0.05


def test_the_call_is_flashkdas_the_first_row_is_the_initial_state():
    double = flashkda_ops.make()
    case = CASES[0]
    inputs = make_inputs(case)
    got = backend(double).serve(case, inputs, ServingCall("checkpoints", checkpoint_every=16))
    assert got.checkpoints.shape == (3 + 3 + 1 + 1, 2, 128, 128)  # rows per sequence: 3, 0, 3, 1, 1
    for first, n in ((0, 0), (3, 2), (6, 3), (7, 4)):
        assert torch.equal(got.checkpoints[first], inputs["initial_state"][n].float())
    assert got.out.shape == (sum(case.seqlens), 2, 128) and got.final_state.shape == (5, 2, 128, 128)


def test_what_flashkda_cannot_serve_declines_with_the_sources_reason():
    b = backend()
    reasons = {mode: b.serving_verdict(CASES[0], mode, H200) for mode in SERVING_MODES}
    assert reasons["checkpoints"].runnable
    assert "no state indices" in reasons["pool"].reason and "no state indices" in reasons["spec"].reason
    assert "no batch invariance" in reasons["batch_invariant"].reason
    v = b.serving_verdict(CASES[0].replace(checkpoint_every=8), "checkpoints", H200)
    assert not v.runnable and "not a multiple of 16" in v.reason
    standalone = backend(flavour=kda_facts.STANDALONE)
    v = standalone.serving_verdict(CASES[0], "checkpoints", H200)
    assert not v.runnable and "no checkpoint" in v.reason
    r = checkpoints(b, CASES[0].replace(checkpoint_every=8), H200)
    assert r.status == "declined" and "multiple of 16" in r.reason
