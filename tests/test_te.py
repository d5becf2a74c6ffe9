"""The TransformerEngine backends (``te``, ``te-checkpoint``) against TE's contract double (issue 18).

TE cannot be installed on the machines here (its compiled core is a ~264 MiB wheel) and its GDN2/GDP kernels need
Blackwell, so the double (tests/doubles/te_la.py: TE 2.20.2's signatures, checks and marshalling, running on the
cuDNN double and so on our reference) is the test. Every agreement test has a twin that breaks the adapter the
way a real integration breaks (a transposed state, a mis-mapped qkv_format, GDP's sub-token axis folded the wrong
way, each flag dropped) and shows the comparison catches it.
"""

from __future__ import annotations

import sys

import pytest
import torch
from caught import caught
from doubles import cudnn_la, te_la

from deltacheck.cases import Case, make_inputs
from deltacheck.harness.backends.base import Verdict, get_backend
from deltacheck.harness.backends.te import adapter, facts
from deltacheck.harness.judge.runner import CaseRunner, RunOptions
from deltacheck.harness.machine import environment

ENV = environment.Env(cuda=True, device_name="NVIDIA B200 (test double)", capability=(10, 0),
                      versions={"transformer_engine": "2.20.2", "cudnn_frontend": "1.32.0", "cutlass_dsl": "4.7.0"},
                      importable={"cutlass": True})
TOL = 1e-12


@pytest.fixture
def open_gate(monkeypatch):
    """The floors have their own tests below; here the double stands in for a capable machine."""
    monkeypatch.setattr(adapter.TeBackend, "pair_verdict", lambda self, op, env: Verdict.ok())


def te_backend(checkpoint=False, double=None, **double_kwargs):
    return adapter.TeBackend(double or te_la.make(**double_kwargs), checkpoint=checkpoint, device="cpu")


# What each module can express, in every layout its cases map to: thd (ragged, with 0- and 1-token sequences),
# bshd, sbhd, and bhsd (passed as bshd); fp32 and bf16 states; K != V both ways; every flag TE takes.
CASES = {
    "gdn": [
        Case(op="gdn", layout="thd", seqlens=(0, 1, 6, 3), K=64, V=128, l2norm=True, scale=0.3, initial_state=True),
        Case(op="gdn", layout="bshd", seqlens=(5, 5), H=4, HK=4, HV=4, K=128, V=64, initial_state=True,
             state_dtype="bf16"),
        Case(op="gdn", layout="sbhd", seqlens=(4, 4, 4), initial_state=True, gate="steep"),
        Case(op="gdn", layout="bhsd", seqlens=(7, 7), l2norm=True, K=256, V=64),  # GDN: no head-size check in TE
    ],
    "gdn2": [
        Case(op="gdn2", layout="thd", seqlens=(0, 1, 6, 3), K=64, V=128, l2norm=True, beta_sigmoid=True,
             neg_eigval=True, scale=0.3, initial_state=True),
        Case(op="gdn2", layout="bshd", seqlens=(5, 5), H=4, HK=4, HV=4, K=128, V=64, beta_sigmoid=True,
             initial_state=True, state_dtype="bf16"),
        Case(op="gdn2", layout="sbhd", seqlens=(4, 4, 4), initial_state=True, gate="steep"),
        Case(op="gdn2", layout="bhsd", seqlens=(7, 7), gate="zero", l2norm=True, beta_guard=True, initial_state=True),
    ],
    "gdp": [
        Case(op="gdp", seqlens=(0, 1, 6, 3), K=64, V=128, num_householder=2, l2norm=True, beta_sigmoid=True,
             neg_eigval=True, scale=0.3, initial_state=True),
        Case(op="gdp", seqlens=(5, 4), H=4, HK=4, HV=4, K=128, V=64, num_householder=3, safe_gate=True, a_log=True,
             dt_bias=True, initial_state=True, state_dtype="bf16"),
        Case(op="gdp", seqlens=(4, 1, 4), num_householder=2, gate_domain="linear", gate="steep", initial_state=True),
        Case(op="gdp", seqlens=(7,), num_householder=1, safe_gate=True, beta_sigmoid=True),
    ],
}
ALL = [pytest.param(c, id=c.id) for cases in CASES.values() for c in cases]
BACKENDS = pytest.mark.parametrize("checkpoint", [False, True], ids=["te", "te-checkpoint"])


def agrees(backend, case, tol=TOL) -> bool:
    """Does ``backend`` reproduce the oracle backend on ``case`` (output in the case's layout, key-major state)?"""
    inputs = make_inputs(case)
    out, state = backend.run(case, inputs)
    ref_out, ref_state = get_backend("oracle").run(case, inputs)
    if out.shape != ref_out.shape or state.shape != ref_state.shape:
        return False
    err = max(float((a.double() - b).abs().max() / b.abs().max()) for a, b in ((out, ref_out), (state, ref_state)))
    return err <= tol


def fails(backend, case) -> bool:
    """The mutation is caught: the comparison rejects the backend, or the library's own check refuses the call
    (tests/caught.py); any other exception is a bug and propagates."""
    return caught(lambda: agrees(backend, case))


def grads(backend, case) -> dict:
    """Gradients of a weighted loss over output and final state, through ``loss.backward()``."""
    inputs = make_inputs(case)
    leaves = {n: x.requires_grad_() for n, x in inputs.items() if isinstance(x, torch.Tensor) and x.is_floating_point()}
    out, state = backend.run(case, inputs)
    torch.manual_seed(0)
    wo, ws = torch.randn(out.shape, dtype=torch.float64), torch.randn(state.shape, dtype=torch.float64)
    ((out.double() * wo).sum() + (state.double() * ws).sum()).backward()
    return {n: x.grad for n, x in leaves.items()}


# ================================================================================ agreement

@BACKENDS
@pytest.mark.parametrize("case", ALL)
def test_te_matches_oracle(open_gate, case, checkpoint):
    backend = te_backend(checkpoint)
    verdict = backend.check(case, ENV)
    assert verdict.runnable, verdict.reason
    assert agrees(backend, case)


@BACKENDS
@pytest.mark.parametrize("op", sorted(CASES))
def test_te_gradients_match_oracle(open_gate, op, checkpoint):
    """Backward through the module, checkpointed or not; GDP's case has a_log and dt_bias, which TE's reentrant
    checkpoint only differentiates because they travel positionally."""
    case = CASES[op][1]
    case = case.replace(backward=True, seqlens=(3, 2) if case.layout == "thd" else (3, 3))  # short: the oracle's backward
    backend = te_backend(checkpoint)
    assert backend.check(case, ENV).backward
    got, want = grads(backend, case), grads(get_backend("oracle"), case)
    assert set(got) == set(want)
    for name in want:
        assert got[name] is not None, name
        assert float((got[name] - want[name]).abs().max() / want[name].abs().max()) < TOL, name


def test_te_calls_the_modules_their_way(open_gate):
    """Constructor by keyword, every flag by keyword, qkv_format per call, int32 cu_seqlens for thd only, the
    state fp32 value-major, GDP's k/v/beta with the num_householder axis after the token one."""
    double = te_la.make()
    backend = te_backend(double=double)
    case = CASES["gdp"][1]  # thd (5, 4), n = 3, safe gate with a_log, dt_bias, bf16 state
    backend.run(case, make_inputs(case))
    module = backend._instance(case)
    assert (module.heads, module.qk_head_dim, module.v_head_dim, module.num_householder) == (4, 128, 64, 3)
    assert module.qkv_format == "sbhd"  # TE's default: the format is given per call, not at construction
    call = double.calls[-1]
    q, k, v, g, beta = call["args"]
    assert q.shape == (9, 4, 128) and k.shape == (9, 3, 4, 128) and v.shape == (9, 3, 4, 64)
    assert g.shape == (9, 4) and beta.shape == (9, 3, 4)
    kw = call["kwargs"]
    assert kw["qkv_format"] == "thd" and kw["cu_seqlens"].dtype == torch.int32 and kw["cu_seqlens"].tolist() == [0, 5, 9]
    assert kw["initial_state"].dtype == torch.float32 and kw["initial_state"].shape == (2, 4, 64, 128)
    assert kw["output_final_state"] is True and kw["checkpoint_core_attention"] is False
    assert kw["safe_gate"] is True and kw["gate_domain"] == "log" and kw["a_log"].shape == (4,)
    # ...and what TE hands the cuDNN op: expanded rows t*n + j, num_householder as its 7th argument.
    op_call = double.ops.calls[-1]
    assert op_call["fn"] == "gated_delta_product" and op_call["num_householder"] == 3
    assert op_call["k"].shape == (27, 4, 128) and op_call["beta"].shape == (27, 4)
    assert torch.equal(op_call["k"], make_inputs(case)["k"])

    dense = CASES["gdn2"][2]  # sbhd
    backend.run(dense, make_inputs(dense))
    kw = double.calls[-1]["kwargs"]
    assert kw["qkv_format"] == "sbhd" and kw["cu_seqlens"] is None
    assert double.ops.calls[-1]["cu_seqlens"].tolist() == [0, 4, 8, 12]


def test_bhsd_goes_in_as_bshd_and_says_so(open_gate):
    double = te_la.make()
    case = CASES["gdn"][3]
    verdict = te_backend(double=double).check(case, ENV)
    assert any("bhsd passed as qkv_format='bshd'" in n for n in verdict.notes)
    te_backend(double=double).run(case, make_inputs(case))
    assert double.calls[-1]["kwargs"]["qkv_format"] == "bshd" and double.calls[-1]["args"][0].shape == (2, 7, 2, 256)


def test_bf16_state_is_widened_and_noted(open_gate):
    verdict = te_backend().check(CASES["gdn2"][1], ENV)
    assert any("initial_state cast bf16 -> fp32" in n for n in verdict.notes)


# ================================================================================ checkpoint_core_attention

@pytest.mark.parametrize("checkpoint, kernel_calls", [(False, 1), (True, 2)], ids=["te", "te-checkpoint"])
def test_checkpoint_reruns_the_forward_in_the_backward(open_gate, checkpoint, kernel_calls):
    double = te_la.make()
    backend = te_backend(checkpoint, double=double)
    case = CASES["gdn2"][0].replace(backward=True)
    grads(backend, case)
    assert double.calls[-1]["kwargs"]["checkpoint_core_attention"] is checkpoint
    assert len(double.ops.calls) == kernel_calls


def test_dropping_checkpoint_core_attention_is_caught(open_gate):
    double = te_la.make()
    drop_keyword(double, "GatedDeltaNet2Attention", "forward", "checkpoint_core_attention")
    grads(te_backend(True, double=double), CASES["gdn2"][0].replace(backward=True))
    assert len(double.ops.calls) == 1  # the recomputation the flag asks for never happened


def test_reentrant_checkpoint_refuses_autograd_grad(open_gate):
    """Why the runner differentiates with loss.backward(): TE's checkpoint raises under torch.autograd.grad."""
    case = CASES["gdp"][0].replace(backward=True)
    inputs = make_inputs(case)
    inputs["q"].requires_grad_()
    out, state = te_backend(True).run(case, inputs)
    with pytest.raises(RuntimeError, match="Checkpointing is not compatible with .grad()"):
        torch.autograd.grad(out.double().sum() + state.double().sum(), [inputs["q"]])


@BACKENDS
def test_the_runner_judges_te_on_every_check(open_gate, checkpoint):
    """The whole task through the runner: forward, state, continuation (GDP's splits fall between real
    tokens), every gradient, determinism — all pass against the fp64 reference."""
    backend = te_backend(checkpoint)
    runner = CaseRunner(RunOptions(reference="oracle"))
    for case in (Case(op="gdp", seqlens=(0, 1, 5, 7), num_householder=2, initial_state=True, splits=(1, 4),
                      backward=True, safe_gate=True, dt_bias=True),
                 Case(op="gdn2", layout="sbhd", seqlens=(6, 6), initial_state=True, splits=(4,), backward=True,
                      beta_sigmoid=True)):
        results = runner.run(case, backend, backend.name, backend.check(case, ENV))
        assert {r.check for r in results} >= {"forward", "state", "continuation_ref", "grad_q", "grad_beta", "determinism"}
        assert all(r.status == "pass" for r in results), [(r.check, r.reason) for r in results if r.status != "pass"]


# ================================================================================ breaking the adapter is caught

def test_transposed_final_state_is_caught(open_gate, monkeypatch):
    case = CASES["gdn2"][2]  # K == V: a transposed state has the right shape and the wrong values
    assert agrees(te_backend(), case)
    monkeypatch.setattr(adapter, "_state_from_te", lambda s: s.float())
    assert fails(te_backend(), case)


def test_transposed_initial_state_is_caught(open_gate, monkeypatch):
    case = CASES["gdp"][2]  # K == V
    monkeypatch.setattr(adapter, "_state_to_te", lambda s: None if s is None else s.transpose(-1, -2).float())
    assert fails(te_backend(), case)


@pytest.mark.parametrize("layout, wrong", [("bshd", "sbhd"), ("sbhd", "bshd"), ("thd", "sbhd")])
def test_mismapped_qkv_format_is_caught(open_gate, monkeypatch, layout, wrong):
    case = {"bshd": CASES["gdn"][1], "sbhd": CASES["gdn2"][2], "thd": CASES["gdp"][0]}[layout]
    assert agrees(te_backend(), case)
    monkeypatch.setitem(adapter.QKV_FORMAT, layout, wrong)
    assert fails(te_backend(), case)


def test_bhsd_without_its_transpose_is_caught(open_gate, monkeypatch):
    case = CASES["gdn"][3].replace(K=64, V=64)  # H == L would hide nothing: 2 heads, length 7
    real = adapter._to_te
    monkeypatch.setattr(adapter, "_to_te", lambda x, c, n: real(x, c.replace(layout="bshd"), n))
    assert fails(te_backend(), case)


def test_gdp_subtokens_folded_the_wrong_way_are_caught(open_gate, monkeypatch):
    """k/v/beta read as [n, T, ...] (sub-token major) instead of TE's [T, n, ...]: same shape after the
    transpose, wrong rows."""
    case = CASES["gdp"][1]
    real = adapter._to_te

    def sub_token_major(x, c, name):
        if x is not None and name in c.support.subtoken_inputs:
            n = c.num_householder
            return x.unflatten(0, (n, x.shape[0] // n)).transpose(0, 1)
        return real(x, c, name)

    monkeypatch.setattr(adapter, "_to_te", sub_token_major)
    assert fails(te_backend(), case)


def drop_keyword(double, cls_name: str, where: str, flag: str) -> None:
    """Make ``double.cls_name`` lose the keyword ``flag`` of its forward or constructor (asserting it was passed)."""
    real = getattr(double, cls_name)

    def drop(kwargs):
        assert flag in kwargs, f"adapter never passed {flag}"
        kwargs.pop(flag)

    class Dropping(real):
        if where == "forward":
            def forward(self, *args, **kwargs):
                drop(kwargs)
                return super().forward(*args, **kwargs)
        else:
            def __init__(self, *args, **kwargs):
                drop(kwargs)
                super().__init__(*args, **kwargs)

    setattr(double, cls_name, Dropping)


# (keyword, where it goes, op, case index that turns it on)
_DROPS = [
    ("qkv_format", "forward", "gdn", 1), ("qkv_format", "forward", "gdp", 0), ("cu_seqlens", "forward", "gdn2", 0),
    ("initial_state", "forward", "gdn", 2), ("output_final_state", "forward", "gdp", 2),
    ("use_qk_l2norm_in_kernel", "forward", "gdn", 0), ("use_qk_l2norm_in_kernel", "forward", "gdp", 0),
    ("use_beta_sigmoid_in_kernel", "forward", "gdn2", 1), ("allow_neg_eigval", "forward", "gdn2", 0),
    ("allow_neg_eigval", "forward", "gdp", 0), ("beta_guard", "forward", "gdn2", 3),
    ("safe_gate", "forward", "gdp", 3), ("gate_domain", "forward", "gdp", 2), ("a_log", "forward", "gdp", 1),
    ("dt_bias", "forward", "gdp", 1), ("scale", "constructor", "gdn", 0), ("scale", "constructor", "gdp", 0),
    ("num_householder", "constructor", "gdp", 1),
]


@pytest.mark.parametrize("flag, where, op, which", _DROPS, ids=[f"{d[0]}-{d[2]}" for d in _DROPS])
def test_dropped_keyword_is_caught(open_gate, flag, where, op, which):
    case = CASES[op][which]
    assert agrees(te_backend(), case)
    double = te_la.make()
    drop_keyword(double, facts.ENTRY_POINTS[op], where, flag)
    assert fails(te_backend(double=double), case)


# ================================================================================ declines

@pytest.mark.parametrize("op", sorted(CASES))
@pytest.mark.parametrize("heads, config", [((4, 2, 2), "GQA"), ((2, 2, 4), "GVA")])
def test_grouped_heads_are_declined(open_gate, op, heads, config):
    H, HK, HV = heads
    case = CASES[op][0].replace(H=H, HK=HK, HV=HV)
    verdict = te_backend().check(case, ENV)
    assert not verdict.runnable
    assert f"has no {config}" in verdict.reason and "num_attention_heads" in verdict.reason
    assert get_backend("oracle").check(case, ENV).runnable  # a real case: only TE cannot express it


@pytest.mark.parametrize("case, words", [
    (Case(op="gdn", beta_sigmoid=True), "use_beta_sigmoid_in_kernel"),
    (Case(op="gdn", beta_sigmoid=True, neg_eigval=True), "use_beta_sigmoid_in_kernel, allow_neg_eigval"),
    (Case(op="gdn", safe_gate=True, a_log=True), "safe_gate, a_log"),
    (Case(op="gdn", gate_domain="linear"), "gate_domain='linear'"),
    (Case(op="gdn2", safe_gate=True, dt_bias=True), "safe_gate, dt_bias"),
    (Case(op="gdn2", gate_domain="linear"), "gate_domain='linear'"),
], ids=lambda x: x.id if isinstance(x, Case) else None)
def test_flags_the_module_has_not_are_declined(open_gate, case, words):
    verdict = te_backend().check(case, ENV)
    assert not verdict.runnable
    assert verdict.reason.startswith(f"TE {facts.ENTRY_POINTS[case.op]} cannot express {words}:")


def test_head_sizes_outside_tes_check_are_declined():
    """Cases never carry such sizes for GDN2/GDP (64/128 is the op's contract too), so the rule is asked
    directly; the double's constructor shows TE's own refusal of the same sizes."""
    case = CASES["gdn2"][2]
    fake = type("FakeCase", (), {name: getattr(case, name) for name in (
        "op", "H", "HK", "HV", "head_config", "l2norm", "scale", "beta_sigmoid", "neg_eigval", "gate_domain",
        "safe_gate", "a_log", "dt_bias", "beta_guard")})()
    fake.K, fake.V = 96, 64
    assert "accepts head sizes (64, 128) only" in te_backend().unsupported(fake)
    fake.K = 64
    assert te_backend().unsupported(fake) is None
    with pytest.raises(ValueError, match=r"query/key head size must be one of \(64, 128\), got 96"):
        te_la.make().GatedDeltaProductAttention(2, (96, 64), 2)


def test_construction_without_cuda_is_a_decline_with_tes_words(open_gate):
    verdict = te_backend(cuda=False).check(CASES["gdn"][0], ENV)
    assert not verdict.runnable
    assert "refused to construct GatedDeltaNetAttention(num_attention_heads=2, kv_channels=(64, 128)" in verdict.reason
    assert "RuntimeError: TransformerEngine needs CUDA." in verdict.reason


def test_cudnn_refusal_under_the_module_is_a_decline(open_gate):
    why = "gdn2_frost: Gdn2FrostEngine requires SM100 / SM103 / SM107 (found 90)"
    ops = cudnn_la.make(decline=lambda fn, call: why if fn == "gated_delta_net_v2" else None)
    backend = te_backend(double=te_la.make(ops=ops))
    verdict = backend.check(CASES["gdn2"][0], ENV)
    assert not verdict.runnable and why in verdict.reason and "GatedDeltaNet2Attention" in verdict.reason
    assert backend.check(CASES["gdn"][0], ENV).runnable


def test_cudnn_forward_only_plan_under_the_module_refuses_the_backward(open_gate):
    ops = cudnn_la.make(backward_decline=lambda fn, call: "gdp_frost: forward only here")
    verdict = te_backend(double=te_la.make(ops=ops)).check(CASES["gdp"][0].replace(backward=True), ENV)
    assert verdict.runnable and not verdict.backward and "forward only here" in verdict.backward_reason


def test_not_installed(open_gate, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformer_engine", None)
    verdict = adapter.TeBackend().check(CASES["gdn"][0], ENV)
    assert not verdict.runnable
    assert verdict.reason == f"te:gdn: transformer-engine is not installed ({facts.INSTALL})"


def test_module_missing_names_class_and_version(open_gate):
    double = te_la.make(version="2.19.0")
    del double.GatedDeltaProductAttention
    verdict = te_backend(double=double).check(CASES["gdp"][0], ENV)
    assert not verdict.runnable and "GatedDeltaProductAttention" in verdict.reason and "2.19.0" in verdict.reason


def test_kda_is_not_a_te_op():
    backend = get_backend("te")
    assert backend.ops == frozenset({"gdn", "gdn2", "gdp"})
    assert "TE 2.20 has no KDA module" in backend.load("kda").reason


# ================================================================================ floors (Env alone)

def _env(sm=(10, 0), te="2.20.2", fe="1.32.0", cuda=True):
    versions = {"transformer_engine": te, "cudnn_frontend": fe, "cutlass_dsl": "4.7.0"}
    return environment.Env(cuda=cuda, device_name="GPU", capability=sm if cuda else None, versions=versions,
                           importable={"cutlass": True})


def test_floors():
    assert facts.floors("te", "gdp", _env()).runnable
    assert facts.floors("te-checkpoint", "gdn2", _env()).runnable
    old = facts.floors("te", "gdn2", _env(te="2.19.0"))
    assert not old.runnable and "transformer-engine 2.19.0 < 2.20" in old.reason
    missing = facts.floors("te", "gdn", _env(te=None))
    assert not missing.runnable and "transformer-engine is not installed" in missing.reason
    cpu = facts.floors("te", "gdn", _env(cuda=False, fe=None))
    assert "needs a CUDA GPU" in cpu.reason and "nvidia-cudnn-frontend is not installed (TE's modules" in cpu.reason
    # On an H200 the FROST-only ops cannot run under TE either: the cuDNN op's reason, named as such.
    hopper = facts.floors("te", "gdp", _env(sm=(9, 0)))
    assert not hopper.runnable
    assert "the cuDNN frontend op under GatedDeltaProductAttention (gated_delta_product) cannot run here" in hopper.reason
    assert "SM100/101/102/103/107" in hopper.reason
    # A KNOWN-WRONG note of the op underneath travels with the pair.
    assert any("KNOWN-WRONG" in n for n in facts.floors("te", "gdn2", _env(fe="1.31.0")).notes)


def test_floors_come_first():
    verdict = te_backend().check(CASES["gdn"][0], environment.Env(cuda=False))
    assert not verdict.runnable and "CUDA" in verdict.reason


def test_registered_and_importing_imports_no_library():
    assert get_backend("te").name == "te" and get_backend("te-checkpoint").name == "te-checkpoint"
    assert get_backend("te-checkpoint").checkpoint is True
    assert "transformer_engine" not in sys.modules


def test_env_lists_te_pairs_and_required_mode_fails_without_te(monkeypatch):
    from deltacheck.harness.commands.env import env_report

    cpu = environment.Env(cuda=False)
    report = env_report(cpu, {"DELTACHECK_REQUIRE": "te:gdn2"})
    assert {"te:gdn", "te:gdn2", "te:gdp", "te-checkpoint:gdp", "cudnn:gdp"} <= set(report["pairs"])
    assert "te:kda" not in report["pairs"] and "fla:gdp" not in report["pairs"]
    assert report["required"] == {"te:gdn2": "DELTACHECK_REQUIRE=te:gdn2"}
    (failure,) = report["required_failures"]
    assert failure.startswith("REQUIRED te:gdn2 cannot run:") and "transformer-engine is not installed" in failure
