"""GDP (gated delta product) as a case op (issue 18): the Case's num_householder, the inputs, the hand-written
GDP_CASES, continuation splits that cut between real tokens, the reference backends, and cuDNN's
``gated_delta_product`` adapter against its contract double (the TE module is in test_te.py)."""

from __future__ import annotations

import functools
import io
import json

import pytest
import torch
from caught import caught
from doubles import cudnn_la

from deltacheck.cases import Case, CaseError, interaction_coverage, make_inputs, matrix, tier_cases
from deltacheck.cases.axes import compatible
from deltacheck.cases.gdp import GDP_CASES, GDP_IDS
from deltacheck.cases.matrix import tier_axes
from deltacheck.cases.support import TIER_OPS
from deltacheck.harness.backends.base import Verdict, get_backend
from deltacheck.harness.backends.cudnn import adapter as cudnn_adapter
from deltacheck.harness.backends.cudnn import facts as cudnn_facts
from deltacheck.harness.judge.runner import RunOptions, segment_inputs
from deltacheck.harness.machine import environment
from deltacheck.harness.run.execute import execute

ENV = environment.Env(cuda=True, device_name="NVIDIA B200 (test double)", capability=(10, 0),
                      versions={"cudnn_frontend": "1.32.0"})
TOL = 1e-12
# Small GDP cases (the oracle backward over GDP_CASES' hundreds of sub-tokens is slow on two cores).
SMALL = [
    Case(op="gdp", seqlens=(0, 1, 6, 3), K=64, V=128, num_householder=2, l2norm=True, beta_sigmoid=True,
         neg_eigval=True, scale=0.3, initial_state=True),
    Case(op="gdp", seqlens=(5, 4), H=4, HK=2, HV=2, K=128, V=64, num_householder=3, safe_gate=True, a_log=True,
         dt_bias=True, initial_state=True, state_dtype="bf16"),
    Case(op="gdp", seqlens=(4, 1, 4), H=1, HK=1, HV=2, num_householder=2, gate_domain="linear", gate="steep",
         initial_state=True),
    Case(op="gdp", seqlens=(7,), num_householder=1, safe_gate=True, beta_sigmoid=True),
]


# ================================================================================ the Case and its inputs

def test_gdp_ids_name_the_householder_steps_and_other_ids_are_unchanged():
    case = Case(op="gdp", seqlens=(3, 0), num_householder=3, l2norm=True)
    assert case.id == "gdp-bf16-thd-N2-T[3_0]-H2/2/2-K64-V64-typical-nh3-l2norm"
    assert Case.from_id(case.id) == case
    assert Case.from_id("gdp-bf16-thd-N2-T[3_0]-H2/2/2-K64-V64-typical-l2norm").id.endswith("-nh1-l2norm")
    assert Case(op="gdn2").id == "gdn2-bf16-thd-N1-T[64]-H2/2/2-K64-V64-typical"
    assert not any("-nh" in c.id for tier in ("L0", "L1", "L2") for c in tier_cases(tier) if c.op != "gdp")
    with pytest.raises(CaseError, match="num_householder: op kda has no Householder steps"):
        Case.from_id("kda-bf16-thd-N1-T[3]-H2/2/2-K64-V64-typical-nh2")
    with pytest.raises(CaseError, match="num_householder: expected an int >= 1"):
        Case.from_id("gdp-bf16-thd-N1-T[3]-H2/2/2-K64-V64-typical-nh0")
    with pytest.raises(CaseError, match="layout: op gdp accepts layouts"):
        Case(op="gdp", layout="sbhd", seqlens=(3, 3))


def test_gdp_cases_are_canonical_and_pinned_in_l0():
    assert [c.id for c in GDP_CASES] == list(GDP_IDS)
    assert {c.num_householder for c in GDP_CASES} == {1, 2, 3, 4}
    assert {c.head_config for c in GDP_CASES} == {"mha", "gqa", "gva"}
    assert "gdp" not in TIER_OPS  # the shared array's op axis; GDP has its own array
    assert set(GDP_IDS) <= {c.id for c in tier_cases("L0")}


@pytest.mark.parametrize("tier", ["L0", "L1", "L2"])
def test_every_tier_covers_gdp_pairwise_over_its_own_axes(tier):
    """GDP's array: every compatible pair of the tier's axes narrowed to GDP (thd; no guard) and the Householder
    steps, and every GDP case valid for the op."""
    gdp = [c for c in tier_cases(tier) if c.op == "gdp"]
    axes = tier_axes(tier, "gdp")
    covered, total, missing = interaction_coverage(gdp, axes, 2, compatible=functools.partial(compatible, axes=axes))
    assert gdp and covered == total, missing[:5]
    assert {c.layout for c in gdp} == {"thd"} and not any(c.beta_guard for c in gdp)
    assert {str(c.num_householder) for c in gdp} >= set(axes["nh"])


def test_generating_gdp_leaves_every_other_case_as_it_was(monkeypatch):
    """GDP's arrays draw from their own seeds: without them the other ops' cases are the same, in the same order (a
    run directory or a compare across the change still lines up)."""
    from deltacheck.harness.ci import tiers

    envelopes = tiers.target_envelopes()
    # the tiers as they run: generated over these envelopes, read from the suite's tier cache when another test made them
    with_gdp = {tier: tiers.tier_cases(tier) for tier in ("L0", "L2")}
    monkeypatch.setattr(matrix, "HOUSEHOLDER_OPS", ())
    monkeypatch.setattr(matrix, "GDP_CASES", ())
    matrix._reference_tier.cache_clear()
    try:
        for tier, cases in with_gdp.items():
            without = matrix.tier_cases(tier, [e for e in envelopes if e.op != "gdp"])
            assert [c.id for c in cases if c.op != "gdp"] == [c.id for c in without]
            assert not any(c.op == "gdp" for c in without)
    finally:
        matrix._reference_tier.cache_clear()


def test_gdp_inputs_carry_n_rows_per_token_for_k_v_beta():
    case = SMALL[1]  # T = 9, n = 3, GQA 4/2/2
    x = make_inputs(case)
    assert x["q"].shape == (9, 4, 128) and x["g"].shape == (9, 4)
    assert x["k"].shape == (27, 2, 128) and x["v"].shape == (27, 2, 64) and x["beta"].shape == (27, 4)
    assert x["beta"].dtype == torch.float32 and x["a_log"].shape == x["dt_bias"].shape == (4,)
    assert torch.allclose(x["k"].float().norm(dim=-1), torch.ones(27, 2), atol=1e-2)  # each sub-token's key normalised
    assert x["cu_seqlens"].tolist() == [0, 5, 9]  # real tokens


def test_continuation_segments_cut_between_real_tokens():
    case = Case(op="gdp", seqlens=(5, 0, 3), num_householder=3, splits=(2,))
    x = make_inputs(case)
    seg, lens = segment_inputs(case, x, 1)  # tokens 2..4 of sequence 0, 2 of sequence 2
    assert lens == [3, 0, 1]
    tokens = [2, 3, 4, 5 + 2]
    rows = [t * 3 + j for t in tokens for j in range(3)]
    assert torch.equal(seg["q"], x["q"][tokens]) and torch.equal(seg["g"], x["g"][tokens])
    for name in ("k", "v", "beta"):
        assert torch.equal(seg[name], x[name][rows]), name
    assert seg["cu_seqlens"].tolist() == [0, 3, 3, 4]


# ================================================================================ the reference backends

@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.id)
def test_reference_backends_serve_gdp(case):
    inputs = make_inputs(case)
    out, state = get_backend("oracle").run(case, inputs)
    assert out.shape == (case.total_tokens, case.HO, case.V) and state.shape == (case.N, case.HO, case.K, case.V)
    chunked_out, chunked_state = get_backend("chunked").run(case, inputs)
    assert torch.allclose(chunked_out, out, atol=1e-10) and torch.allclose(chunked_state, state, atol=1e-10)
    base_out, _ = get_backend("baseline").run(case, inputs)
    assert base_out.dtype == torch.bfloat16


def test_the_runner_judges_gdp_end_to_end(tmp_path):
    """deltacheck run --case <gdp id> --backend chunked: forward, state, continuation, every gradient."""
    case = Case(op="gdp", seqlens=(0, 1, 5, 7), num_householder=2, initial_state=True, splits=(1, 4),
                backward=True, safe_gate=True, a_log=True, l2norm=True)
    status, run_dir = execute([case], ["chunked"], tmp_path, RunOptions(reference="oracle"), in_process=True,
                              environ={}, stream=io.StringIO())
    results = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    statuses = {r["check"]: r["status"] for r in results if r["kind"] == "result"}
    assert status == 0, statuses
    assert {"continuation_ref", "continuation_self", "grad_k", "grad_beta", "grad_a_log", "grad_initial_state"} <= set(
        statuses)
    assert set(statuses.values()) == {"pass"}


# ================================================================================ cuDNN gated_delta_product

@pytest.fixture
def open_gate(monkeypatch):
    monkeypatch.setattr(cudnn_adapter.CudnnBackend, "pair_verdict", lambda self, op, env: Verdict.ok())


def cudnn_backend(double=None):
    return cudnn_adapter.CudnnBackend(double or cudnn_la.make(), device="cpu")


def agrees(backend, case) -> bool:
    inputs = make_inputs(case)
    out, state = backend.run(case, inputs)
    ref_out, ref_state = get_backend("oracle").run(case, inputs)
    return all(a.shape == b.shape and float((a.double() - b).abs().max() / b.abs().max()) <= TOL
               for a, b in ((out, ref_out), (state, ref_state)))


def fails(backend, case) -> bool:
    """The mutation is caught: the comparison rejects the backend, or the library's own check refuses the call
    (tests/caught.py); any other exception is a bug and propagates."""
    return caught(lambda: agrees(backend, case))


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.id)
def test_cudnn_gdp_matches_oracle(open_gate, case):
    backend = cudnn_backend()
    verdict = backend.check(case, ENV)
    assert verdict.runnable and verdict.notes == (), verdict
    assert agrees(backend, case)


def test_cudnn_gdp_gradients_match_oracle(open_gate):
    case = SMALL[1].replace(backward=True, seqlens=(3, 2))  # short: the oracle's backward is the slow part

    def grads(backend):
        inputs = make_inputs(case)
        leaves = {n: x.requires_grad_() for n, x in inputs.items() if isinstance(x, torch.Tensor) and x.is_floating_point()}
        out, state = backend.run(case, inputs)
        torch.manual_seed(0)
        ((out.double() * torch.randn(out.shape, dtype=torch.float64)).sum()
         + (state.double() * torch.randn(state.shape, dtype=torch.float64)).sum()).backward()
        return {n: x.grad for n, x in leaves.items()}

    got, want = grads(cudnn_backend()), grads(get_backend("oracle"))
    for name in want:
        assert float((got[name] - want[name]).abs().max() / want[name].abs().max()) < TOL, name


def test_cudnn_gdp_is_called_its_way(open_gate):
    double = cudnn_la.make()
    case = SMALL[0]
    cudnn_backend(double).run(case, make_inputs(case))
    call = double.calls[-1]
    assert call["fn"] == "gated_delta_product" and call["num_householder"] == 2
    assert call["k"].shape == (20, 2, 64) and call["beta"].shape == (20, 2) and call["g"].shape == (10, 2)
    assert call["cu_seqlens"].tolist() == [0, 0, 1, 7, 10] and call["initial_state"].shape == (4, 2, 128, 64)


_DROPS = [("scale", 0), ("use_qk_l2norm_in_kernel", 0), ("use_beta_sigmoid_in_kernel", 3), ("allow_neg_eigval", 0),
          ("safe_gate", 3), ("a_log", 1), ("dt_bias", 1), ("gate_domain", 2), ("initial_state", 2)]


@pytest.mark.parametrize("flag, which", _DROPS, ids=[d[0] for d in _DROPS])
def test_cudnn_gdp_dropped_flag_is_caught(open_gate, flag, which):
    case = SMALL[which]
    assert agrees(cudnn_backend(), case)
    double = cudnn_la.make()
    real = double.gated_delta_product

    def drops(*args, **kwargs):
        assert flag in kwargs, f"adapter never passed {flag}"
        kwargs.pop(flag)
        return real(*args, **kwargs)

    double.gated_delta_product = drops
    assert fails(cudnn_backend(double), case)


def test_cudnn_gdp_wrong_householder_count_is_caught(open_gate):
    """An adapter that hands the op a different n than the case's: the op's row check, or the numbers, catch it."""
    case = SMALL[0]
    double = cudnn_la.make()
    real = double.gated_delta_product
    double.gated_delta_product = lambda q, k, v, g, beta, cu, n, **kw: real(
        q, k.unflatten(0, (-1, n)).flatten(0, 1), v, g, beta, cu, 1, **kw)
    assert fails(cudnn_backend(double), case)


def test_cudnn_double_takes_gdp_expanded_or_token_major_and_words_bad_rows_as_fe():
    case = SMALL[0]
    x = make_inputs(case)
    op = cudnn_la.make().gated_delta_product
    n, T = 2, case.total_tokens
    expanded, _ = op(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"], n)
    token_major, _ = op(x["q"], x["k"].unflatten(0, (T, n)), x["v"].unflatten(0, (T, n)), x["g"],
                        x["beta"].unflatten(0, (T, n)), x["cu_seqlens"], n)
    assert torch.equal(expanded, token_major)
    with pytest.raises(ValueError, match=r"gated_delta_product: k must carry 30 rows \(q rows \* num_householder\), got 20"):
        op(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"], 3)


def test_cudnn_gdp_floors_are_frost_only():
    hopper = environment.Env(cuda=True, device_name="NVIDIA H200", capability=(9, 0),
                             versions={"cudnn_frontend": "1.32.0", "cutlass_dsl": "4.7.0"}, importable={"cutlass": True})
    verdict = cudnn_facts.floors("cudnn", "gdp", hopper)
    assert not verdict.runnable and "SM100/101/102/103/107" in verdict.reason
    blackwell = environment.Env(cuda=True, device_name="NVIDIA B200", capability=(10, 0),
                                versions={"cudnn_frontend": "1.32.0", "cutlass_dsl": "4.7.0"},
                                importable={"cutlass": True})
    assert cudnn_facts.floors("cudnn", "gdp", blackwell).runnable
