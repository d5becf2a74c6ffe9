"""``python -m deltacheck.harness.run.serving_run``: its plan and its table."""

from __future__ import annotations

import json

import pytest

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


def test_table_counts_run_as_passed_failed_reported_error_known():
    rows = [{"backend": "b", "check": "causality", "status": s} for s in
            ("passed", "passed", "failed", "declined", "error", "not_run", "reported", "known")]
    assert serving_run.table(rows).splitlines()[0].endswith(" not_run known")
    assert serving_run.table(rows).splitlines()[1] == "b causality 6 2 1 1 1 1 1 1"


def test_shards_split_the_cases_whole_and_cover_them_once():
    pairs = serving_run.plan("L0", "L0", ["causality", "graph_replay"])
    parts = [serving_run.shard(pairs, f"{i}/3") for i in (1, 2, 3)]
    assert sorted(map(len, parts)) != [0, 0, len(pairs)] and sum(map(len, parts)) == len(pairs)
    ids = [{c.id for _, c in part} for part in parts]
    assert not (ids[0] & ids[1]) and not (ids[1] & ids[2]) and not (ids[0] & ids[2])
    assert all(len(part) == 2 * len(i) for part, i in zip(parts, ids))  # both checks of a case in one shard



@pytest.mark.parametrize("spec", ["x", "0/3", "4/3", "1/2/3"])
def test_a_malformed_shard_is_a_usage_error_that_names_it(spec, capsys):
    with pytest.raises(SystemExit) as exit_:
        serving_run.main(["--backend", "oracle", "--device", "cpu", "--checks", "causality", "--shard", spec])
    assert exit_.value.code == 2 and f"--shard {spec}" in capsys.readouterr().err.replace("'", "")

def test_resume_keeps_results_runs_the_rest_and_defers_the_pair_that_died(tmp_path, monkeypatch):
    cases = [Case(op="gdn", seqlens=(n,)) for n in (3, 4, 5)]
    pairs = [("causality", c) for c in cases]
    ran = []

    def fake(backend, case, env, device):
        ran.append(case.id)
        from deltacheck.harness.judge.serving_checks import CheckResult
        return CheckResult("causality", "b", case.id, "passed")

    monkeypatch.setitem(serving_run.INVARIANCE_CHECKS, "causality", fake)
    monkeypatch.setattr(serving_run, "backend_for", lambda spec: object())
    path = tmp_path / "r.jsonl"
    kept = {"check": "causality", "backend": "b", "case": cases[0].id, "status": "passed", "reason": "", "numbers": {}}
    cut = dict(kept, case=cases[2].id, status="not_run")
    path.write_text(json.dumps(kept) + "\n" + json.dumps(cut) + "\n")
    (tmp_path / "r.jsonl.inflight").write_text(json.dumps(["b", "causality", cases[1].id]))
    done, last = serving_run.load_done(str(path))
    assert [r["case"] for r in done] == [cases[0].id] and last == ("b", "causality", cases[1].id)
    with open(path, "a") as lines:
        results = serving_run.run(["b"], pairs, "cpu", lines=lines, done=done, inflight_path=str(path) + ".inflight",
                                  last=last)
    assert ran == [cases[2].id, cases[1].id]  # the kept one not again; the one in flight at a death last
    assert sorted(r["case"] for r in results) == sorted(c.id for c in cases)
    assert not (tmp_path / "r.jsonl.inflight").exists()
    again, last = serving_run.load_done(str(path))
    assert len(again) == 3 and last is None


def test_case_ids_plan_their_own_checks_and_reproduce_on_the_reference(capsys):
    ids = ["kda-bf16-thd-N3-T[1_64_200]-H2/2/2-K128-V128-steep-h0",
           "kda-bf16-thd-N3-T[4_4_4]-H2/2/2-K64-V64-typical-pool15-spec3[0_2_3]"]
    pairs = serving_run.plan_cases(ids, ["causality", "graph_replay", "speculative"])
    assert [(name, c.id) for name, c in pairs] == [("causality", ids[0]), ("graph_replay", ids[0]),
                                                  ("speculative", ids[1])]
    code = serving_run.main(["--backend", "oracle", "--case", "gdn-bf16-thd-N2-T[3_4]-H1/1/1-K32-V32-typical",
                             "--checks", "causality", "--device", "cpu"])
    assert code == 0 and "oracle causality 1 1 0" in capsys.readouterr().out
