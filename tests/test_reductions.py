"""Reduced parameter gradients (d a_log, d dt_bias) judged for what they are: consistency with the backend's own
dg, and a limit scaled by the reduction's measured conditioning (issue 15, harness/judge/reductions.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from deltacheck.cases import Case
from deltacheck.harness.judge.runner import CaseRunner, RunOptions
from deltacheck.harness.run.task import run_task

TESTS = Path(__file__).resolve().parent
# The L0 case on which FLA 0.6's chunk_kda dA_log missed 2x the baseline by 7.5% on the H200 (2026-11-30) while
# its dg was more accurate than the baseline's and its dA_log exactly the sum its own dg implies.
FLA_CASE = "kda-bf16-thd-N3-T[65_1_129]-H2/2/2-K128-V128-extreme-l2norm-sigmoid-safegate-alog-dtbias-h0-bwd"


@pytest.fixture(scope="module")
def runner():
    return CaseRunner(RunOptions(reference="oracle"))


def _results(runner, case_id, spec):
    sys.path.insert(0, str(TESTS))
    try:
        return {r.check: r for r in run_task(runner, Case.from_id(case_id), spec, None)}
    finally:
        sys.path.remove(str(TESTS))


def test_a_dropped_chain_rule_factor_in_da_log_fails(runner):
    results = _results(runner, FLA_CASE, "fake_backends:DroppedChainFactor")
    r = results["grad_a_log"]
    assert r.status == "fail" and "not the sum the backend's own dg implies" in r.reason, r.reason
    assert r.metrics["consistency_rel_rms"] > 0.1
    # ...and nothing else is wrong with it
    assert all(x.status == "pass" for c, x in results.items() if c != "grad_a_log"), \
        [(c, x.status, x.reason) for c, x in results.items() if x.status != "pass"]


def test_a_consistent_reduction_of_a_slightly_noisy_dg_passes_for_the_right_reason(runner):
    results = _results(runner, FLA_CASE, "fake_backends:NoisyDgConsistentReduction")
    dg, da = results["grad_g"], results["grad_a_log"]
    assert dg.status == "pass", dg.reason
    assert da.status == "pass", da.reason
    # its d a_log is the sum of its own dg (which reaches us rounded to g's fp32: ~u(fp32) apart)
    assert da.metrics["consistent"] and da.metrics["consistency_rel_rms"] < 1e-6
    # the sum is ill-conditioned here (its terms cancel), and that is what the limit was widened by
    assert da.metrics["conditioning"] > 3
    assert da.metrics["limit"] == pytest.approx(2 * dg.metrics["baseline"] * da.metrics["conditioning"])
