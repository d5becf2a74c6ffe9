"""The generated matrix: tier budgets, coverage, required edge cases, selection, CLI. Tiers as they run (the
reference-level arrays plus the cases of each fused backend's envelope) come from ``harness.tiers``."""

from __future__ import annotations

import itertools
import random

import pytest

from deltacheck.cases import (
    MAIN_AXES,
    OP_SUPPORT,
    TIER_AXES,
    TIER_BUDGETS,
    Case,
    CaseError,
    axis_values,
    coverage_table,
    interaction_coverage,
    pair_coverage,
)
from deltacheck.cases.matrix import L0_MAX_HEADS, L0_MAX_TOKENS, covering_rows
from deltacheck.cases.support import HOUSEHOLDER_OPS, TIER_OPS
from deltacheck.harness.ci.tiers import select, tier_cases
from deltacheck.harness.cli import main as cli_main


@pytest.mark.parametrize("tier", ["L0", "L1", "L2"])
def test_tier_sizes_stay_within_budget_and_ids_are_unique_and_round_trip(tier):
    cases = tier_cases(tier)
    low, high = TIER_BUDGETS[tier]
    assert low <= len(cases) <= high, f"{tier}: {len(cases)} cases, budget {low}..{high}"
    ids = [case.id for case in cases]
    assert len(set(ids)) == len(ids)
    assert all(case.tier == tier for case in cases)
    assert [Case.from_id(i) for i in ids] == cases


@pytest.mark.parametrize("tier", ["L0", "L1", "L2"])
def test_every_pair_of_the_tiers_axis_values_is_covered(tier):
    covered, total, missing = pair_coverage(tier_cases(tier), TIER_AXES[tier])
    assert not missing, f"{tier}: {covered}/{total}, missing {missing[:5]}"


def test_l0_covers_every_pair_of_main_axis_values_and_every_op_dtype_layout_triple():
    cases = tier_cases("L0")
    l0_axes = TIER_AXES["L0"]
    # L0 narrows only the head dims (each a kernel specialization a GPU lane compiles cold), nothing else.
    assert {k: v for k, v in MAIN_AXES.items() if k != "dims"} == {k: v for k, v in l0_axes.items() if k != "dims"}
    assert set(MAIN_AXES["dims"]) - set(l0_axes["dims"]) == {"32x32", "256x256"}
    assert not pair_coverage(cases, l0_axes)[2]
    assert not interaction_coverage(cases, l0_axes, 3, ("op", "io_dtype", "state_dtype", "layout"))[2]


def test_l1_covers_every_triple_of_main_axis_values():
    covered, total, missing = interaction_coverage(tier_cases("L1"), MAIN_AXES, 3)
    assert not missing, f"{covered}/{total}"


def test_the_coverage_check_can_fail():
    cases = [c for c in tier_cases("L0") if not (c.op == "kda" and c.layout == "sbhd")]
    covered, total, missing = pair_coverage(cases, TIER_AXES["L0"])
    assert ((("op", "kda"), ("layout", "sbhd"))) in missing and covered < total
    assert "100.0%" not in coverage_table(cases).split("pairs")[1].splitlines()[0]


def test_l0_cases_are_small_and_hold_the_required_edges():
    cases = tier_cases("L0")
    assert max(c.total_tokens for c in cases) <= L0_MAX_TOKENS
    assert max(max(c.H, c.HK, c.HV) for c in cases) <= L0_MAX_HEADS
    assert {c.K for c in cases} | {c.V for c in cases} == {64, 96, 128}
    ragged_edges = [c for c in cases if c.layout == "thd" and 0 in c.seqlens and 1 in c.seqlens]
    assert {c.op for c in ragged_edges} == set(TIER_OPS) | set(HOUSEHOLDER_OPS)
    lengths = {n for c in cases for n in c.seqlens}
    assert {0, 1, 63, 64, 65} <= lengths
    assert any(c.layout == "thd" and c.N == 1 for c in cases)
    # Every op meets every feature (each main-axis value) at least once.
    for op in TIER_OPS:
        seen = {(name, value) for c in cases if c.op == op for name, value in axis_values(c).items()}
        for name, values in TIER_AXES["L0"].items():
            for value in values:
                if name == "op" or (name == "dims" and not OP_SUPPORT[op].supports_dims(*map(int, value.split("x")))):
                    continue
                if (name, value) == ("guard", "on") and "beta_guard" not in OP_SUPPORT[op].flags:
                    continue
                assert (name, value) in seen, (op, name, value)


def test_l1_and_l2_reach_their_lengths():
    l1, l2 = tier_cases("L1"), tier_cases("L2")
    assert max(c.max_len for c in l1) == 8192
    assert any(c.K == 256 for c in l1 if c.op == "gdn")
    assert max(c.max_len for c in l2) == 65536
    assert max(c.N for c in l2) >= 32
    assert {"steep", "extreme"} <= {c.gate for c in l2}


def test_every_declared_dtype_and_dim_appears_in_l1_for_each_op():
    cases = tier_cases("L1")
    for op in TIER_OPS:
        support, mine = OP_SUPPORT[op], [c for c in cases if c.op == op]
        assert {c.io_dtype for c in mine} == set(support.io_dtypes)
        assert {c.state_dtype for c in mine} == set(support.state_dtypes)
        assert {c.K for c in mine} == set(support.key_dims)
        assert {c.V for c in mine} == set(support.value_dims)
        assert {c.head_config for c in mine} == set(support.head_configs)


def test_covering_rows_cover_all_pairs_on_a_toy_space():
    axes = {"a": ("1", "2", "3"), "b": ("x", "y"), "c": ("p", "q", "r"), "d": ("on", "off")}
    rows = covering_rows(axes, random.Random(0))
    for (n1, v1s), (n2, v2s) in itertools.combinations(axes.items(), 2):
        for v1, v2 in itertools.product(v1s, v2s):
            assert any(r[n1] == v1 and r[n2] == v2 for r in rows)
    assert len(rows) < 3 * 2 * 3 * 2  # far from the full product


def test_select_filters_by_op_and_k_expression():
    gdn2 = select("L0", op="gdn2")
    assert gdn2 and all(c.op == "gdn2" for c in gdn2)
    picked = select("L0", k="thd and bwd and not fp16")
    assert picked and all(c.layout == "thd" and c.backward and c.io_dtype == "bf16" for c in picked)
    one = tier_cases("L0")[7]
    assert select("L0", k=one.id) == [one]
    with pytest.raises(CaseError):
        select("L0", op="mamba2")
    with pytest.raises(CaseError):
        select("L9")


def test_coverage_table_is_readable():
    text = coverage_table(tier_cases("L0"))
    assert text.splitlines()[0] == f"{len(tier_cases('L0'))} cases"
    for name in MAIN_AXES:
        assert f"  {name} " in text
    assert "pairs of axis values covered" in text and "(100.0%)" in text


def test_cli_lists_ids_and_counts(capsys):
    assert cli_main(["list", "--tier", "L0", "--op", "kda", "-k", "h0"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [c.id for c in select("L0", op="kda", k="h0")]
    assert cli_main(["list", "--count", "--op", "gdn"]) == 0
    assert "pairs of axis values covered" in capsys.readouterr().out
    assert cli_main(["list", "-k", "gdn and"]) == 2
