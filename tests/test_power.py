"""Test power (issue 14): no vacuous case — a kernel that writes zeros fails at least one check of every case of
L0 and L1 — and fp16 judged as fp16 — a bf16-precision step inside an fp16 kernel is caught.

Why the zero-writer test can be exact and cheap: a zero output, state or gradient has relative RMS error 1
against any reference, above every limit (thresholds are <= 6e-2), so it fails a check exactly when that
check's reference quantity is not negligible (max |ref| > 1e-6, FLA's absolute pass rule, compare.py). And the
recurrence is causal: the output on the first tokens of each sequence is the prefix of the full output, so a
non-negligible prefix settles the forward check of a long L1 case without computing all of it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from deltacheck.cases import Case, make_inputs
from deltacheck.cases.axes import axis_values, compatible
from deltacheck.cases.support import TIER_OPS
from deltacheck.harness.backends.base import get_backend
from deltacheck.harness.ci.tiers import tier_cases
from deltacheck.harness.judge.compare import NEGLIGIBLE_MAX_ABS
from deltacheck.harness.judge.expected import grad_leaves, weighted_loss
from deltacheck.harness.judge.runner import CaseRunner, RunOptions
from deltacheck.harness.run.task import grad_inputs, run_task

TESTS = Path(__file__).resolve().parent
F64 = torch.float64
PREFIX = 16  # tokens per sequence that settle the forward check of a long case


def _fp64(inputs: dict) -> dict:
    return {n: (x.to(F64) if x is not None and x.is_floating_point() else x) for n, x in inputs.items()}


def _prefix(case: Case, inputs: dict, length: int) -> tuple[Case, dict]:
    """The first ``length`` tokens of every sequence, with the very same numbers (a causal prefix)."""
    clipped = tuple(min(n, length) for n in case.seqlens)
    short = case.replace(seqlens=clipped, splits=())
    out = dict(inputs)
    tokenwise = ("q", "k", "v", "g", "beta", "w")
    if case.layout == "thd":
        starts = [0]
        for n in case.seqlens:
            starts.append(starts[-1] + n)
        idx = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, clipped)])
        # GDP's k, v and beta hold n rows per token (token-major), the rest one
        steps = case.num_householder if case.support.householder else 1
        per_step = (idx[:, None] * steps + torch.arange(steps)).reshape(-1)
        for name in tokenwise:
            if inputs.get(name) is not None:
                rows = per_step if name in case.support.subtoken_inputs else idx
                out[name] = inputs[name].index_select(0, rows)
        offsets = [0]
        for n in clipped:
            offsets.append(offsets[-1] + n)
        out["cu_seqlens"] = torch.tensor(offsets, dtype=inputs["cu_seqlens"].dtype)
    else:
        axis = {"bshd": 1, "sbhd": 0, "bhsd": 2}[case.layout]
        for name in tokenwise:
            if inputs.get(name) is not None:
                out[name] = inputs[name].narrow(axis, 0, clipped[0])
    return short, out


def _biggest(*tensors) -> float:
    return max((float(t.detach().abs().max()) for t in tensors if t is not None and t.numel()), default=0.0)


def zero_writer_passes(case: Case, prefix: int | None = None) -> bool:
    """Whether a kernel that writes zeros would pass every check of ``case`` (every reference quantity it is
    judged on is negligible)."""
    chunked = get_backend("chunked")
    inputs = _fp64(make_inputs(case))
    if prefix is not None:
        short, sliced = _prefix(case, inputs, prefix)
        out, _ = get_backend("oracle").run(short, sliced)
        if _biggest(out) > NEGLIGIBLE_MAX_ABS:
            return False
    out, state = chunked.run(case, inputs)
    if _biggest(out, state) > NEGLIGIBLE_MAX_ABS:
        return False
    if not case.backward:
        return True
    names = grad_inputs(case)
    leaves = grad_leaves(inputs, [n for n, x in inputs.items() if x is not None and x.is_floating_point()])
    with torch.enable_grad():
        out, state = chunked.run(case, leaves)
        grads = torch.autograd.grad(weighted_loss(case, out, state, "cpu"), [leaves[n] for n in names],
                                    allow_unused=True)
    return _biggest(*grads) <= NEGLIGIBLE_MAX_ABS


@pytest.mark.parametrize("tier", ["L0", "L1"])
def test_a_kernel_that_writes_zeros_fails_every_case(tier, request):
    if tier == "L1" and not request.config.getoption("--dc-exhaustive"):
        pytest.skip("drawing every L1 case's inputs takes tens of minutes on a CPU; run with --dc-exhaustive "
                    "(test_no_case_of_any_tier_has_the_vacuous_shape covers L1 and L2 here)")
    vacuous = [c.id for c in tier_cases(tier) if zero_writer_passes(c, prefix=PREFIX)]
    assert not vacuous, f"{len(vacuous)} {tier} case(s) a zero-writing kernel passes: {vacuous[:5]}"


@pytest.mark.parametrize("tier", ["L0", "L1", "L2"])
def test_no_case_of_any_tier_has_the_vacuous_shape(tier):
    """The generator's rule, on every case: nothing written and nothing read needs a backward that sees."""
    shaped = [c.id for c in tier_cases(tier) if not compatible(axis_values(c))]
    assert not shaped, shaped[:5]


# The vacuous shape the generator used to make: nothing is ever written (beta zero) and nothing read (no h0).
VACUOUS = "kda-bf16-thd-N2-T[65_3]-H2/2/2-K64-V64-typical-beta_zero"


def test_the_zero_writer_really_passes_a_vacuous_case_and_the_generator_refuses_it():
    case = Case.from_id(VACUOUS)
    assert zero_writer_passes(case)  # the measure can tell
    sys.path.insert(0, str(TESTS))
    try:
        runner = CaseRunner(RunOptions(reference="oracle", baseline=False))
        results = run_task(runner, case, "fake_backends:ZeroWriting", None)
        assert {r.status for r in results} == {"pass"}, [(r.check, r.status, r.reason) for r in results]
        # ...while on a real L0 case the same kernel fails through the runner
        real = next(c for c in tier_cases("L0") if c.op == "kda" and c.backward)
        assert "fail" in {r.status for r in run_task(runner, real, "fake_backends:ZeroWriting", None)}
    finally:
        sys.path.remove(str(TESTS))
    assert not compatible(axis_values(case))
    assert not compatible({**axis_values(case), "beta_mode": "sigmoid", "bwd": "on"})  # dbeta flattened to ~1e-13
    assert compatible({**axis_values(case), "bwd": "on"})
    assert compatible({**axis_values(case), "op": "gdn2", "beta_mode": "sigmoid", "bwd": "on"})  # dw sees it


def test_fp16_is_judged_as_fp16_a_bf16_gate_cumsum_is_caught():
    """An fp16 kernel that keeps one internal step in bf16 (its chunk-local gate cumsum) is caught on several
    cases, while the same kernel without the bug passes every one of them: the fp16 floors are fp16's."""
    # the fake kernels implement the main arrays' ops (gdn, kda, gdn2)
    cases = [c for c in tier_cases("L0") if c.io_dtype == "fp16" and c.gate != "zero" and c.gate_domain == "log"
             and not c.safe_gate and not c.backward and c.op in TIER_OPS][:8]
    assert len(cases) == 8
    runner = CaseRunner(RunOptions(reference="oracle"))
    caught = []
    sys.path.insert(0, str(TESTS))
    try:
        for case in cases:
            clean = run_task(runner, case, "fake_backends:Fp32Compute", None)
            assert all(r.status == "pass" for r in clean), [(r.check, r.reason) for r in clean if r.status != "pass"]
            buggy = run_task(runner, case, "fake_backends:Fp32ComputeBf16Gate", None)
            caught += [case.id] if any(r.status == "fail" for r in buggy) else []
    finally:
        sys.path.remove(str(TESTS))
    assert len(caught) >= 5, caught
