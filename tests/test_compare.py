"""The judging rules of harness/judge/compare.py."""

import math

import pytest
import torch

from deltacheck.harness.judge import compare


def test_rel_rms_and_metrics():
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert compare.rel_rms(ref * 1.1, ref) == pytest.approx(0.1)
    m = compare.metrics(torch.tensor([3.0, math.nan]), ref)
    assert m["nan"] == 1 and m["rel_rms"] == math.inf
    assert "shape_mismatch" in compare.metrics(torch.zeros(3), ref)


def test_limit_is_baseline_relative_with_floor_and_cap():
    tol = compare.tolerance("gdn2", "bf16", "out")
    assert compare.judge("gdn2", "bf16", "out", 0.009, 0.004)["passed"] is False  # 2 x 0.004 = 0.008
    assert compare.judge("gdn2", "bf16", "out", 0.007, 0.004)["passed"] is True
    assert compare.judge("gdn2", "bf16", "out", tol.floor * 0.9, 0.0)["passed"] is True  # floor, not 0
    assert compare.judge("gdn2", "bf16", "out", 0.019, 0.5)["limit"] == tol.threshold  # cap
    assert compare.judge("gdn2", "bf16", "out", 0.019, None)["passed"] is True


def test_negligible_quantities_pass_on_max_abs_only():
    j = compare.judge("kda", "bf16", "dbeta", 1.0, 1.0, max_abs=1e-9)
    assert j["passed"] and j["headroom"] < 1
    assert not compare.judge("kda", "bf16", "dbeta", 1.0, 1.0, max_abs=1e-3)["passed"]


def test_every_entry_names_its_source():
    assert all(t.source for t in compare.TOLERANCES.values())
    assert {q for (_, _, q) in compare.TOLERANCES} == set(compare.QUANTITIES)


def test_localize_finds_the_divergent_token_sequence_and_head():
    ref = torch.ones(10, 2, 3, dtype=torch.float64)
    bad = ref.clone()
    bad[7:, 1] += 1.0  # sequence 1 ([5, 10)), head 1, from token 7
    loc = compare.localize(bad, ref, [0, 5, 10], limit=0.02)
    assert (loc["first_bad_token"], loc["worst_seq"], loc["worst_head"]) == (7, 1, 1)
    assert len(loc["token_curve"]) == 10
