"""The ``flashqla`` adapter against a contract double of flash-qla 0.1.3 (tests/doubles/flash_qla.py): conversions
(layouts, thd packing, state orientation and dtype), the call's keywords, declines with their reasons, our floors
(including TileLang's tvm-ffi pin that cuDNN FE breaks), and that breaking a conversion is caught."""

from __future__ import annotations

import pytest
import torch
from caught import caught
from doubles import flash_qla

from deltacheck.cases import Case, make_inputs
from deltacheck.harness.backends.base import Verdict, get_backend
from deltacheck.harness.backends.flashqla import adapter, facts
from deltacheck.harness.judge.runner import CaseRunner, RunOptions
from deltacheck.harness.machine import environment

TOL = 1e-12
VERSIONS = {"flash_qla": "0.1.3", "tilelang": "0.1.15", "tvm_ffi": "0.1.12", "z3": "4.15.4.0"}
H200 = environment.Env(cuda=True, device_name="NVIDIA H200 (test double)", capability=(9, 0), versions=VERSIONS)

CASES = [
    Case(op="gdn", layout="thd", seqlens=(2, 1, 6, 3), H=2, HK=2, HV=4, K=128, V=128, initial_state=True,
         l2norm=True, scale=0.3),
    Case(op="gdn", layout="bshd", seqlens=(5, 5), H=2, HK=2, HV=2, K=128, V=128, initial_state=True,
         state_dtype="bf16"),
    Case(op="gdn", layout="sbhd", seqlens=(4, 4, 4), H=1, HK=1, HV=2, K=128, V=128, gate="steep"),
    Case(op="gdn", layout="bhsd", seqlens=(7, 7), H=2, HK=2, HV=2, K=128, V=128, initial_state=True, io_dtype="fp16"),
]


def backend(double=None):
    return adapter.FlashQlaBackend(double or flash_qla.make())


def _err(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def agrees(b, case) -> bool:
    inputs = make_inputs(case)
    out, state = b.run(case, inputs)
    ref_out, ref_state = get_backend("oracle").run(case, inputs)
    if out.shape != ref_out.shape or state.shape != ref_state.shape:
        return False
    return _err(out, ref_out) <= TOL and _err(state, ref_state) <= TOL


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_flashqla_matches_the_oracle(case):
    b = backend()
    assert b.check(case, H200).runnable, b.check(case, H200).reason
    assert agrees(b, case)


def test_the_call_is_flash_qlas_own_defaults_and_packing():
    double = flash_qla.make()
    case = CASES[0]
    backend(double).run(case, make_inputs(case))
    call = double.calls[-1]
    assert call["shape"][0] == 1 and call["cu_seqlens"].dtype == torch.int64  # thd: B = 1, LongTensor offsets
    assert call["auto_cp"] is True and call["state_v_first"] is False  # FLA's dispatch passes these
    assert call["initial_state"].dtype == torch.float32 and call["output_final_state"] is True
    assert call["use_qk_l2norm_in_kernel"] is True and call["scale"] == 0.3


def test_the_runner_judges_flashqla_on_every_check():
    b = backend()
    case = Case(op="gdn", layout="thd", seqlens=(3, 2, 5), H=2, HK=2, HV=2, K=128, V=128, initial_state=True,
                splits=(1,), backward=True)
    results = CaseRunner(RunOptions(reference="oracle")).run(case, b, b.name, b.check(case, H200))
    assert {r.check for r in results} >= {"forward", "state", "continuation_ref", "grad_q", "grad_g", "grad_beta"}
    assert all(r.status == "pass" for r in results), [(r.check, r.reason) for r in results if r.status != "pass"]


def test_an_empty_sequence_is_flash_qlas_refusal_reported_as_an_error():
    """FlashQLA 0.1.3's auto-CP refuses a packed batch holding an empty sequence (seen on the H200, 2026-12-02):
    the adapter neither declines it nor works around it; every check of the call is an error naming the refusal.
    A continuation whose later segment holds an ended sequence errors the same way, its single call passes."""
    b = backend()
    runner = CaseRunner(RunOptions(reference="oracle"))
    case = Case(op="gdn", layout="thd", seqlens=(3, 0, 5), H=2, HK=2, HV=2, K=128, V=128)
    assert b.check(case, H200).runnable
    results = runner.run(case, b, b.name, b.check(case, H200))
    assert results and all(r.status == "error" for r in results), [(r.check, r.status) for r in results]
    assert "invalid sequence lengths: [1, 0, 1]" in results[0].reason
    ended = Case(op="gdn", layout="thd", seqlens=(1, 70, 5), H=2, HK=2, HV=2, K=128, V=128, splits=(3,))
    status = {r.check: r.status for r in runner.run(ended, b, b.name, b.check(ended, H200))}
    assert status["forward"] == status["state"] == "pass"
    assert status["continuation_ref"] == status["continuation_self"] == "error"


# ================================================================================ breaking the adapter is caught

def test_a_state_left_value_major_is_caught(monkeypatch):
    monkeypatch.setattr(adapter, "state_to_key_major_fp32", lambda s: None if s is None else s.float().contiguous())
    assert caught(lambda: agrees(backend(), CASES[1]))


def test_a_final_state_returned_as_is_but_transposed_is_caught(monkeypatch):
    monkeypatch.setattr(adapter, "state_widened_to_fp32", lambda s: s.transpose(-1, -2))
    assert caught(lambda: agrees(backend(), CASES[3]))


@pytest.mark.parametrize("flag", ["use_qk_l2norm_in_kernel", "scale", "initial_state"])
def test_a_dropped_keyword_is_caught(flag):
    double = flash_qla.make()
    real = double.chunk_gated_delta_rule

    def drops(*args, **kwargs):
        kwargs.pop(flag)
        return real(*args, **kwargs)

    double.chunk_gated_delta_rule = drops
    assert caught(lambda: agrees(backend(double), CASES[0]))


def test_bhsd_without_its_transpose_is_caught(monkeypatch):
    monkeypatch.setattr(adapter, "from_btd", lambda o, layout: o)
    assert caught(lambda: agrees(backend(), CASES[3]))


# ================================================================================ declines and floors

@pytest.mark.parametrize("change, words", [
    ({"K": 64, "V": 64}, "K == V == 128"),
    ({"H": 4, "HK": 2, "HV": 2}, "no GQA"),
    ({"gate_domain": "linear"}, "log-space gate"),
    ({"safe_gate": True, "a_log": True}, "no in-kernel gate"),
    ({"beta_sigmoid": True}, "post-activation"),
])
def test_what_flashqla_cannot_express_is_declined_with_the_reason(change, words):
    verdict = backend().check(CASES[1].replace(**change), H200)
    assert not verdict.runnable and words in verdict.reason


def test_the_bf16_state_widening_is_noted():
    verdict = backend().check(CASES[1], H200)
    assert verdict.runnable and any("bf16 -> fp32" in n for n in verdict.notes)


@pytest.mark.parametrize("change, words", [
    ({"capability": (8, 0), "device_name": "NVIDIA A100"}, "SM90/100/103"),
    ({"versions": {**VERSIONS, "tvm_ffi": "0.1.15"}}, "apache-tvm-ffi 0.1.15 is outside >=0.1.11,<0.1.13"),
    ({"versions": {**VERSIONS, "z3": "4.15.5"}}, "z3-solver 4.15.5 is outside"),
    ({"versions": {**VERSIONS, "flash_qla": None}}, "flash-qla is not installed"),
    ({"versions": {**VERSIONS, "tilelang": "0.1.9"}}, "tilelang 0.1.9 < 0.1.12"),
    ({"cuda": False, "capability": None}, "needs a CUDA GPU"),
])
def test_floors_name_what_is_missing(change, words):
    env = environment.Env(**{"cuda": True, "device_name": "NVIDIA H200", "capability": (9, 0), "versions": VERSIONS,
                             **change})
    verdict = adapter.FlashQlaBackend().pair_verdict("gdn", env)
    assert not verdict.runnable and words in verdict.reason, verdict.reason
    assert adapter.FlashQlaBackend().pair_verdict("gdn", H200).runnable


def test_ops_other_than_gdn_are_not_flashqlas():
    assert not adapter.FlashQlaBackend().pair_verdict("kda", H200).runnable
    assert facts.envelopes("kda", sm=90) == [] and facts.envelopes("gdn", sm=80) == []
    assert facts.envelopes("gdn", sm=90) == [facts.ENVELOPE]


def test_the_envelope_holds_exactly_what_the_adapter_accepts():
    from deltacheck.cases import select_generated as select

    b = backend()
    for case in select("L0", op="gdn"):
        inside = facts.ENVELOPE.contains(case)
        verdict = b.check(case, H200)
        assert verdict.runnable == inside, (case.id, verdict.reason)


def test_not_installed_is_a_decline_with_the_install_hint():
    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    verdict = adapter.FlashQlaBackend(importer=missing).load("gdn")
    assert not verdict.runnable and "pip install 'flash-qla" in verdict.reason


@pytest.mark.parametrize("backend", ["flashqla", "fla-dispatch"])
def test_tilelangs_caches_go_under_deltachecks_cache_dir(monkeypatch, tmp_path, backend):
    """TileLang's kernel cache and tvm-ffi's JIT-built torch DLPack addon (built where torch lacks the exchange
    API and torch-c-dlpack-ext ships no binary) live in deltacheck's cache directory, set before either library is
    imported; a place the user chose is kept."""
    import os

    from deltacheck.harness.backends.fla.dispatch import FlaDispatchBackend
    from deltacheck.harness.records.cachedir import TILELANG_CACHES

    monkeypatch.setenv("DELTACHECK_CACHE_DIR", str(tmp_path))
    for name in (*TILELANG_CACHES, "TRITON_CACHE_DIR", "TRITON_CACHE_AUTOTUNING", "FLA_DISABLE_BACKEND_DISPATCH"):
        monkeypatch.setenv(name, "")  # recorded, so whatever the import sets is undone after the test
        monkeypatch.delenv(name)
    assert TILELANG_CACHES == {"TILELANG_CACHE_DIR": "tilelang", "TVM_FFI_CACHE_DIR": "tvm-ffi"}

    def first_import_sees(user: dict) -> dict:
        for name in TILELANG_CACHES:
            os.environ.pop(name, None)
        os.environ.update(user)
        seen = []

        def importer(name):
            seen.append({k: os.environ.get(k) for k in TILELANG_CACHES})
            return flash_qla.make()

        if backend == "flashqla":
            adapter.FlashQlaBackend(importer=importer).load("gdn")
        else:
            FlaDispatchBackend(importer=importer)._import_fla()
        return seen[0]  # the environment when the first library was imported

    assert first_import_sees({}) == {"TILELANG_CACHE_DIR": str(tmp_path / "tilelang"),
                                     "TVM_FFI_CACHE_DIR": str(tmp_path / "tvm-ffi")}
    assert first_import_sees({"TVM_FFI_CACHE_DIR": "/mine"}) == {"TILELANG_CACHE_DIR": str(tmp_path / "tilelang"),
                                                                 "TVM_FFI_CACHE_DIR": "/mine"}


def test_registered_and_importing_it_imports_no_library():
    import sys

    assert get_backend("flashqla").name == "flashqla"
    assert "flash_qla" not in sys.modules and "tilelang" not in sys.modules
    assert Verdict  # the protocol's verdict type is what check returns


# ======================================================== the shipped known issue, through `deltacheck run`

def known_refusal_run(run_cli, monkeypatch, tmp_path, spec: str, env: environment.Env):
    """``deltacheck run`` of an adapter over its double on an H200 Env (the machine the entry was measured on):
    an empty sequence, a continuation ending a 1-token sequence, and a control without either. Returns (exit status,
    output, {case: {check: status}})."""
    import json

    from deltacheck.harness.commands import run as run_command
    from deltacheck.harness.run import execute

    for module in (execute, run_command):
        monkeypatch.setattr(module, "probe_env", lambda: env)
    base = Case(op="gdn", layout="thd", seqlens=(3, 2, 5), H=2, HK=2, HV=2, K=128, V=128)
    cases = [base.replace(seqlens=(3, 0, 5)), base.replace(seqlens=(1, 70, 5), splits=(3,)), base]
    argv = ["run", "--backend", spec, "--out", str(tmp_path), "--in-process", "--no-baseline", "--reference", "oracle"]
    rc, text = run_cli([*argv, *(a for c in cases for a in ("--case", c.id))], env={"DELTACHECK_KNOWN_ISSUES": None})
    statuses: dict = {c.id: {} for c in cases}
    for line in next(tmp_path.iterdir()).joinpath("results.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "result":
            statuses[record["case"]][record["check"]] = record["status"]
    return rc, text, statuses


def test_the_shipped_entry_makes_flashqlas_refusal_known_under_the_cli(run_cli, monkeypatch, tmp_path):
    """flash-qla 0.1.3 on SM90: the refusal is known (run green), the passing checks stay passes; on 0.1.4, where no
    one has looked, the same errors fail the run."""
    rc, text, statuses = known_refusal_run(run_cli, monkeypatch, tmp_path / "a", "fake_backends:FlashQlaOnItsDouble",
                                           H200)
    empty, ended, control = statuses.values()
    assert rc == 0, text
    assert "failed as known issues (flashqla-auto-cp-refuses-empty-sequence)" in text, text
    assert set(empty.values()) == {"known"} and set(control.values()) == {"pass"}, statuses
    assert ended["continuation_ref"] == ended["continuation_self"] == "known" and ended["forward"] == "pass"
    newer = environment.Env(cuda=True, device_name=H200.device_name, capability=(9, 0),
                            versions={**VERSIONS, "flash_qla": "0.1.4"})
    rc, text, statuses = known_refusal_run(run_cli, monkeypatch, tmp_path / "b", "fake_backends:FlashQlaOnItsDouble",
                                           newer)
    assert rc == 1 and "error" in set(next(iter(statuses.values())).values()), text


@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: c.id)
def test_causality_is_judged_by_the_chunked_rule_and_passes(case):
    # FlashQLA is a chunk kernel: the one-ulp rule (docs/serving.md); the double (exact, token by token) moves 0 ulps.
    from deltacheck.harness.judge.invariance_checks import causality
    got = causality(backend(), case, H200, "cpu")
    assert got.status == "passed" and got.numbers["rule"] == "chunked" and got.numbers["max_ulps_before"] == 0.0
