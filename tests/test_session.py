"""The run owner (harness/run/session.py): availability asked once per pair, one tally that merges across shards and
fails on a known issue gone, and the frontier's points through the pool (a crash costs one point)."""

from __future__ import annotations

import json
import sys

import fake_backends
import pytest
from child_env import TESTS
from test_runner import CASE_IDS, records, run

from deltacheck.cases import Case
from deltacheck.harness.backends.base import Verdict, forget_backends
from deltacheck.harness.cli import main as cli_main
from deltacheck.harness.judge.runner import RunOptions
from deltacheck.harness.machine.availability import verdicts_from_json, verdicts_to_json
from deltacheck.harness.records.exitrule import EXIT_FAILED, EXIT_OK
from deltacheck.harness.records.results import Result
from deltacheck.harness.run.pool import worker_config
from deltacheck.harness.run.tally import RunTally
from deltacheck.harness.run.task import task_summary


def test_availability_is_computed_once_per_pair_and_handed_to_each_task(tmp_path):
    forget_backends()
    fake_backends.FloorCounting.asked = {}
    # three tasks, one per op: the floors are asked once per op (the availability record), never per task
    status, run_dir = run(["fake_backends:FloorCounting"], tmp_path)
    assert status == EXIT_OK
    assert fake_backends.FloorCounting.asked == {"gdn": 1, "kda": 1, "gdn2": 1}
    forget_backends()
    fake_backends.FloorCounting.asked = {}
    cases = [Case.from_id(CASE_IDS[1])] * 3  # three tasks of one pair
    run(["fake_backends:FloorCounting"], tmp_path / "again", cases=cases)
    assert fake_backends.FloorCounting.asked["kda"] == 1
    forward = [r for r in records(next((tmp_path / "again").iterdir())) if r.get("check") == "forward"]
    assert len(forward) == 3 and {r["status"] for r in forward} == {"pass"}


def test_a_worker_receives_the_runs_verdicts_with_its_config():
    verdicts = {("fla", "kda"): Verdict.no("fla:kda needs a CUDA GPU"), ("x", "gdn"): Verdict.ok("cast beta")}
    config = json.loads(worker_config("r.jsonl", RunOptions(), verdicts))
    assert verdicts_from_json(config["pairs"]) == verdicts
    assert verdicts_from_json(verdicts_to_json({})) == {}


def _summary(status: str, known=None) -> dict:
    result = Result(case=CASE_IDS[1], backend="cudnn", check="forward", status=status, metrics={})
    return task_summary([result], known or {})


def test_a_tally_merged_from_two_shards_one_with_a_known_issue_gone_fails():
    first, second = RunTally(), RunTally()
    first.add("cudnn", "kda", _summary("pass", {"cudnn-kda-nan": "gone"}), CASE_IDS[1])
    second.add("cudnn", "kda", _summary("pass"), CASE_IDS[1])
    assert second.exit_status() == EXIT_OK and first.exit_status() == EXIT_FAILED
    merged = RunTally.from_json(second.to_json())
    merged.merge(RunTally.of_end(first.end_record()))  # as merge reads a shard: through its end record
    assert merged.statuses["pass"] == 2 and merged.executed[("cudnn", "kda")] == 2
    assert merged.known_gone and "cudnn-kda-nan" in merged.known_gone[0]
    end = merged.end_record()
    assert end["exit_status"] == EXIT_FAILED and end["known_gone"] == merged.known_gone
    # an end record written before it carried a tally still says what it holds
    old = {k: v for k, v in first.end_record().items() if k != "tally"}
    assert RunTally.of_end(old).exit_status() == EXIT_FAILED


def test_a_crashing_kernel_costs_the_frontier_one_point_not_the_search(tmp_path, capsys):
    base = "kda-bf16-thd-N2-T[70_40]-H1/1/1-K64-V64-typical-bwd"
    sys.path.insert(0, str(TESTS))
    try:
        status = cli_main(["frontier", "--out", str(tmp_path / "runs"), "--backend", "fake_backends:SteepGateCrashes",
                           "--op", "kda", "--base-case", base, "--json", str(tmp_path / "f.json")])
    finally:
        sys.path.remove(str(TESTS))
    assert status == EXIT_OK
    [record] = json.loads((tmp_path / "f.json").read_text())
    crashed = [p for p in record["points"] if "worker process died" in p["reason"]]
    assert [p["value"] for p in crashed] == [-4.0] and crashed[0]["verdict"] == "error"
    assert len(record["points"]) > 3  # the search went on after the crash
    assert record["last_pass"] is not None and record["last_pass"] > -4.0 > record["first_fail"] - 1e-9
    lines = records(next((tmp_path / "runs").iterdir()))
    assert lines[-1]["kind"] == "end" and not list((tmp_path / "runs").glob("*/results.w*.jsonl"))
    died = [r for r in lines if r.get("kind") == "result" and "worker process died" in r.get("reason", "")]
    assert died and {r["case"] for r in died} == {crashed[0]["case"]}


def test_a_plugin_with_envelopes_gets_generated_cases_like_the_builtins():
    from deltacheck.harness.ci.tiers import select
    from deltacheck.harness.machine.availability import backend_envelope

    spec = "fake_backends:NarrowEnvelope"
    sys.path.insert(0, str(TESTS))
    try:
        plain = {c.id for c in select("L0")}
        with_plugin = select("L0", backends=[spec])
        envelope = backend_envelope(spec, "gdn2")
    finally:
        sys.path.remove(str(TESTS))
    added = [c for c in with_plugin if c.id not in plain]
    assert plain <= {c.id for c in with_plugin}  # the tier grows, nothing of it is dropped
    assert added and all(envelope.serves(c)[0] for c in added), [c.id for c in added][:3]


@pytest.mark.parametrize("spec", ["jax", "flashinfer-decode"])
def test_a_builtin_without_tier_targets_gets_its_envelope_cases_when_named(spec):
    """jax-linear-attention and FlashInfer are not generated for in L0 (TIER_TARGETS); naming one in a run appends
    the cases inside its envelopes, the tier's own ids unchanged and first, so an L0 run of it judges what it serves."""
    from deltacheck.harness.backends.base import get_backend
    from deltacheck.harness.backends.table import TIER_ON_DEMAND, TIER_TARGETS
    from deltacheck.harness.ci.tiers import select

    assert spec in TIER_ON_DEMAND and spec not in {s for s, _ in TIER_TARGETS}
    plain = [c.id for c in select("L0")]
    named = select("L0", backends=[spec])
    assert [c.id for c in named[:len(plain)]] == plain
    backend = get_backend(spec)
    served = lambda cases: [c for c in cases if c.op in backend.ops and backend.unsupported(c) is None]  # noqa: E731
    assert len(served(named)) > len(served(select("L0"))) + 5
    assert select("L0", backends=["fla"]) == select("L0")  # a built-in with tier targets adds nothing


def test_a_plugin_written_against_the_old_api_still_runs_in_process_and_in_workers(tmp_path):
    from deltacheck.harness.backends.base import backend_for
    from deltacheck.harness.machine.availability import library_verdict
    from deltacheck.harness.machine.environment import probe_env

    forget_backends()
    fake_backends.OldStyle.loads = 0
    cases = [Case.from_id(CASE_IDS[1])]
    for in_process in (True, False):
        status, run_dir = run(["fake_backends:OldStyle"], tmp_path / str(in_process), cases=cases,
                              in_process=in_process)
        assert status == EXIT_OK
        results = [r for r in records(run_dir) if r.get("kind") == "result"]
        assert results and {r["status"] for r in results} == {"pass"}
    sys.path.insert(0, str(TESTS))
    try:  # its version_key names nothing the probe knows: its load() still runs (`deltacheck env --import`)
        assert library_verdict(backend_for("fake_backends:OldStyle"), "fake_backends:OldStyle", "kda",
                               probe_env()).runnable
    finally:
        sys.path.remove(str(TESTS))
    assert fake_backends.OldStyle.loads == 1
