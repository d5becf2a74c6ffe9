"""``fla-dispatch`` / ``fla-dispatch-cp`` against a double of FLA's backend dispatch (tests/doubles/fla_dispatch.py):
the served implementation recorded per result from FLA's registry objects (forward and backward), rejections
with FLA's reasons, the Hopper guard as dispatch changes it, the inference-mode intra-card CP lane, and the
decline when dispatch is off in the process."""

from __future__ import annotations

import os

import pytest
import torch
from doubles import fla_dispatch

from deltacheck.cases import Case, make_inputs
from deltacheck.harness.backends.base import get_backend
from deltacheck.harness.backends.fla import dispatch
from deltacheck.harness.backends.fla.served import ServedLog
from deltacheck.harness.judge.runner import CaseRunner, RunOptions
from deltacheck.harness.machine import environment

H200 = environment.Env(cuda=True, device_name="NVIDIA H200 (test double)", capability=(9, 0),
                       versions={"fla": "0.6.0", "triton": "3.6.0"})
K128 = Case(op="gdn", layout="thd", seqlens=(3, 2, 5), H=2, HK=2, HV=2, K=128, V=128, initial_state=True)
K64 = K128.replace(K=64, V=64, seqlens=(3, 0, 5))


def backend(inference_cp=False, **double_kwargs):
    ops, backends = fla_dispatch.make(**double_kwargs)
    return dispatch.FlaDispatchBackend(ops, backends_module=backends, inference_cp=inference_cp), ops


def judged(b, case):
    return CaseRunner(RunOptions(reference="oracle")).run(case, b, b.name, b.check(case, H200))


def test_a_call_flashqla_accepts_is_recorded_as_served_by_it():
    b, ops = backend()
    b.run(K128, make_inputs(K128))
    served = b.served()
    assert served["engine"] == "flash_qla"
    assert served["served_calls"] == ["gated_delta_rule.chunk_gated_delta_rule -> flash_qla"]
    assert ops.flash_qla.calls and ops.flash_qla.calls[-1]["auto_cp"] is True  # FlashQLA really ran


def test_a_call_flashqla_rejects_runs_tritons_and_keeps_flas_reason():
    b, ops = backend()
    b.run(K64, make_inputs(K64))
    served = b.served()
    assert served["engine"] == "triton"
    assert served["dispatch_rejected"] == [
        "gated_delta_rule.chunk_gated_delta_rule: flash_qla rejected: FlashQLA requires K=128, got 64"]
    assert not ops.flash_qla.calls


@pytest.mark.parametrize("how", ["not installed", "FLA_FLASH_QLA=0"])
def test_without_flashqla_triton_serves_and_nothing_is_rejected(how, monkeypatch):
    if how == "FLA_FLASH_QLA=0":
        monkeypatch.setenv("FLA_FLASH_QLA", "0")
    b, _ = backend(flash_qla_installed=how != "not installed")
    b.run(K128, make_inputs(K128))
    assert b.served() == {"engine": "triton"}


def test_the_runner_puts_the_served_path_on_forward_and_gradient_results():
    b, _ = backend(hopper_guard_fires=True)
    results = judged(b, K64.replace(backward=True))
    forward = next(r for r in results if r.check == "forward")
    assert forward.metrics["engine"] == "triton"
    grads = [r for r in results if r.check.startswith("grad_")]
    assert grads and all(r.status == "pass" for r in grads), [(r.check, r.reason) for r in grads]
    assert {r.metrics["engine"] for r in grads} == {"triton + tilelang:chunk_bwd_dqkwg"}
    assert all(r.status == "pass" for r in results), [(r.check, r.reason) for r in results if r.status != "pass"]


def test_a_flashqla_forward_brings_its_own_backward():
    b, _ = backend(hopper_guard_fires=True)
    results = judged(b, K128.replace(backward=True))
    grads = [r for r in results if r.check.startswith("grad_")]
    assert grads and {r.metrics["engine"] for r in grads} == {"flash_qla"}
    assert all(r.status == "pass" for r in results)


def test_the_hopper_guard_binds_only_where_tilelang_cannot_replace_the_piece():
    with_tilelang, _ = backend(hopper_guard_fires=True)
    assert with_tilelang.check(K64.replace(backward=True), H200).backward
    without, _ = backend(hopper_guard_fires=True, tilelang_usable=False)
    verdict = without.check(K64.replace(backward=True), H200)
    assert verdict.runnable and not verdict.backward
    assert "#640" in verdict.backward_reason and "install tilelang" in verdict.backward_reason


def test_dispatch_off_in_the_process_is_a_decline_with_the_fix():
    b, _ = backend(dispatch_disabled=True)
    verdict = b.check(K128, H200)
    assert not verdict.runnable and "FLA_DISABLE_BACKEND_DISPATCH=1" in verdict.reason
    assert "without 'fla'" in verdict.reason


def test_the_cp_lane_reaches_intracard_cp_under_inference_mode_and_restores_the_environment(monkeypatch):
    monkeypatch.delenv(dispatch.INTRACARD_ENV, raising=False)
    b, _ = backend(inference_cp=True)
    case = K64.replace(seqlens=(3, 5))
    verdict = b.check(case, H200)
    assert verdict.runnable and not verdict.backward and verdict.backward_reason == dispatch.CP_LANE_REASON
    out, state = b.run(case, make_inputs(case))
    assert b.served()["engine"] == "triton + intracard_cp:chunk_gated_delta_rule_fwd_h"
    assert b.served()["intracard_subseqs"] == 0  # short sequences: FLA's rule leaves them whole
    assert dispatch.INTRACARD_ENV not in os.environ
    assert not out.is_inference() and not state.is_inference()


def test_the_same_call_outside_the_lane_does_not_reach_intracard_cp(monkeypatch):
    monkeypatch.setenv(dispatch.INTRACARD_ENV, "1")  # enabled, but not in inference mode: FLA's verifier says no
    b, _ = backend()
    b.run(K64, make_inputs(K64))
    served = b.served()
    assert served["engine"] == "triton"
    assert "common.chunk_gated_delta_rule_fwd_h: intracard_cp rejected: Not in inference mode" in served[
        "dispatch_rejected"]


def test_a_long_sequence_is_split_by_flas_rule():
    b, _ = backend(inference_cp=True)
    case = K64.replace(seqlens=(32768,), H=4, HK=4, HV=4, initial_state=False)
    inputs = {n: (x[:1] if isinstance(x, torch.Tensor) and x.dim() and n not in ("cu_seqlens",) else x)
              for n, x in make_inputs(K64.replace(seqlens=(1,))).items()}
    inputs["cu_seqlens"] = torch.tensor([0, 32768])
    b._forward_served = {"served_calls": ["common.chunk_gated_delta_rule_fwd_h -> intracard_cp"]}
    assert b._intracard_split(case, inputs) == {"intracard_subseqs": 4}  # 512 chunks, 128 per piece on 132 SMs


def test_the_served_log_does_not_change_what_fla_selects():
    ops, backends = fla_dispatch.make()
    log = ServedLog()
    assert log.attach(backends) == 2
    log.attach(backends)  # twice: no nested wrappers
    inputs = make_inputs(K128)
    dispatch.FlaDispatchBackend(ops, backends_module=backends).run(K128, inputs)
    assert len(ops.flash_qla.calls) == 1


def test_registered_names():
    assert get_backend("fla-dispatch").name == "fla-dispatch"
    assert get_backend("fla-dispatch-cp").name == "fla-dispatch-cp"
    assert get_backend("fla-dispatch").dispatch_off is False and get_backend("fla").dispatch_off is True


def test_reports_count_cases_per_served_path():
    from deltacheck.reports.markdown import table
    from deltacheck.reports.served import served_paths, served_section

    b, _ = backend(hopper_guard_fires=True)
    records = [r.to_record() for case in (K128.replace(backward=True), K64.replace(backward=True), K64)
               for r in judged(b, case)]
    rows = {(r["direction"], r["engine"]): (r["cases"], r["pass"]) for r in served_paths(records)}
    assert rows == {("forward", "flash_qla"): (1, 1), ("backward", "flash_qla"): (1, 1),
                    ("forward", "triton"): (2, 2), ("backward", "triton + tilelang:chunk_bwd_dqkwg"): (1, 1)}
    broken = [dict(r, status="fail") if r["check"] == "grad_q" and "K64" in r["case"] else r for r in records]
    failing = {(r["direction"], r["engine"]): r["fail"] for r in served_paths(broken)}
    assert failing[("backward", "triton + tilelang:chunk_bwd_dqkwg")] == 1 and failing[("forward", "triton")] == 0
    text = "\n".join(served_section(served_paths(records), table, lambda s: f"`{s}`"))
    assert "## Results per served path" in text and "`triton + tilelang:chunk_bwd_dqkwg`" in text



def test_the_run_header_records_flas_version():
    """The H200 run of 2026-12-02 wrote backend_versions {"fla-dispatch": null}: FlaBackend had no version() hook
    (the header's backend_versions asks each backend's version(), harness/machine/availability.py)."""
    b, ops = backend()
    assert b.version() == ops.__version__ == "0.6.0"


def test_dispatch_hands_flashqla_an_empty_sequence_and_the_user_gets_its_error():
    """FLA 0.6's FlashQLA verifier never looks at the sequence lengths, so a packed batch with an empty sequence goes
    to FlashQLA, whose auto-CP refuses it (H200, 2026-12-02): an error on the result, where FLA's Triton (K=64 here,
    which FlashQLA rejects) serves the same lengths."""
    b, _ = backend()
    empty = K128.replace(seqlens=(3, 0, 5))
    results = judged(b, empty)
    assert results and all(r.status == "error" for r in results), [(r.check, r.status) for r in results]
    assert "invalid sequence lengths" in results[0].reason
    assert all(r.status == "pass" for r in judged(b, K64) if r.status != "skip")


def test_the_shipped_entry_makes_the_refusal_known_under_the_cli_where_flashqla_serves(run_cli, monkeypatch, tmp_path):
    """The same refusal through FLA's dispatch (fla-core 0.6.0 + flash-qla 0.1.3, SM90) is known under ``deltacheck
    run``, by the fla-dispatch entry; the case without an empty sequence passes every check."""
    from test_flashqla import known_refusal_run

    env = environment.Env(cuda=True, device_name=H200.device_name, capability=(9, 0),
                          versions={**H200.versions, "flash_qla": "0.1.3"})
    rc, text, statuses = known_refusal_run(run_cli, monkeypatch, tmp_path, "fake_backends:FlaDispatchOnItsDouble", env)
    empty, ended, control = statuses.values()
    assert rc == 0, text
    assert "failed as known issues (flashqla-auto-cp-refuses-empty-sequence-via-fla-dispatch)" in text, text
    assert set(empty.values()) == {"known"} and set(control.values()) == {"pass"}, statuses
    assert ended["continuation_ref"] == ended["continuation_self"] == "known" and ended["forward"] == "pass"
