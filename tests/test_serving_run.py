"""``python -m deltacheck.harness.run.serving_run``: its plan and its table."""

from __future__ import annotations

from deltacheck.cases.spec import Case
from deltacheck.harness.ci.tiers import select
from deltacheck.harness.run import serving_run


def test_a_budget_cut_leaves_every_op_some_cases():
    # select() lists L0's first gdp case 64th: without the interleave a budget of a few dozen cases judges no gdp.
    assert "gdp" not in {c.op for c in select("L0")[:60]}
    pairs = serving_run.plan("L0", "L0", ["causality", "graph_replay"])
    training = [c for name, c in pairs if name == "causality"]
    assert {c.op for c in training[:4]} == {"gdn", "kda", "gdn2", "gdp"}
    assert [name for name, _ in pairs[-2:]] == ["causality", "graph_replay"]  # one case's checks side by side
    assert len(training) == len({c.id for c in training})  # every forward case once


def test_interleave_keeps_each_ops_order_and_every_case():
    cases = [Case(op="gdn", seqlens=(n,)) for n in (1, 2, 3)] + [Case(op="kda", seqlens=(n,)) for n in (4, 5)]
    out = serving_run.interleave_ops(cases)
    assert [(c.op, c.seqlens[0]) for c in out] == [("gdn", 1), ("kda", 4), ("gdn", 2), ("kda", 5), ("gdn", 3)]


def test_table_counts_run_as_passed_failed_reported_error():
    rows = [{"backend": "b", "check": "causality", "status": s} for s in
            ("passed", "passed", "failed", "declined", "error", "not_run", "reported")]
    assert serving_run.table(rows).splitlines()[1] == "b causality 5 2 1 1 1 1 1"
