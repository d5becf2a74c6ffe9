"""deltacheck frontier: the searches on plain judges, a point's verdict from its results, the base-case choice, and
the command end to end on a CPU double whose gate frontier is -7 by construction (tests/fake_backends.py)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from deltacheck.cases import Case
from deltacheck.harness.cli import main as cli_main
from deltacheck.harness.records.results import Result
from deltacheck.harness.run import frontier_search as fr

TESTS = Path(__file__).resolve().parent
DOUBLE = "fake_backends:SteepGateBreaks"
# Small base cases keep a whole search to a second or two; the double's -7 is still crossed by many draws.
SMALL = {op: f"{op}-bf16-thd-N2-T[70_40]-H1/1/1-K64-V64-typical-bwd" for op in ("kda", "gdn2")}
CONTRACT_KEYS = ["backend", "op", "dtype", "axis", "last_pass", "first_fail", "resolution", "base_case", "points"]


def threshold_judge(passes, verdict_when_not="fail", log=None):
    """A judge passing where ``passes(value)``; elsewhere ``verdict_when_not`` (or a function of the value)."""
    def judge(value):
        if log is not None:
            log.append(value)
        if passes(value):
            return fr.Point(value, fr.PASS, worst_rel_rms=1e-3)
        verdict = verdict_when_not(value) if callable(verdict_when_not) else verdict_when_not
        return fr.Point(value, verdict, reason="because")
    return judge


# --- the searches --------------------------------------------------------------------------------


@pytest.mark.parametrize("edge", [-0.83, -7.0, -63.3, -999.0])
def test_gate_search_brackets_the_edge_within_its_resolution(edge):
    got = fr.search_gate(threshold_judge(lambda x: x >= edge))
    assert got.last_pass >= edge > got.first_fail
    assert got.last_pass - got.first_fail <= max(0.1, 0.02 * abs(got.first_fail)) + 1e-9
    assert got.resolution == pytest.approx(max(0.1, 0.02 * abs(got.first_fail)))
    assert [p.value for p in got.points] == sorted((p.value for p in got.points), reverse=True)


def test_gate_search_brackets_on_a_log_scale_from_minus_half_to_minus_1000_first():
    log = []
    fr.search_gate(threshold_judge(lambda x: x >= -100, log=log))
    assert log[:9] == [-0.5, -1, -2, -4, -8, -16, -32, -64, -128]
    assert fr.gate_ladder()[-2:] == [-512, -1000]


def test_gate_search_where_nothing_fails_or_the_first_point_fails():
    clean = fr.search_gate(threshold_judge(lambda x: True))
    assert (clean.last_pass, clean.first_fail) == (-1000, None)
    broken = fr.search_gate(threshold_judge(lambda x: False))
    assert (broken.last_pass, broken.first_fail, [p.value for p in broken.points]) == (None, -0.5, [-0.5])


def test_an_exception_counts_as_a_failure_but_a_decline_stops_the_search():
    raised = fr.search_gate(threshold_judge(lambda x: x > -10, verdict_when_not=fr.ERROR))
    assert raised.last_pass >= -10 > raised.first_fail
    declined = fr.search_gate(threshold_judge(lambda x: x > -10, verdict_when_not=fr.DECLINED))
    assert (declined.last_pass, declined.first_fail) == (-8, None)
    assert declined.points[-1].verdict == fr.DECLINED and declined.points[-1].value == -16


def test_a_decline_inside_the_bracket_leaves_the_bracket_as_it_was():
    def verdict(x):
        return fr.DECLINED if -12 < x < -8 else fr.FAIL
    got = fr.search_gate(threshold_judge(lambda x: x >= -8, verdict_when_not=verdict))
    assert (got.last_pass, got.first_fail) == (-8, -16)
    assert got.resolution == 8  # what the bracket is, not what it should have been narrowed to


def test_length_search_doubles_to_the_cap_and_stops_at_the_first_failure():
    got = fr.search_length(threshold_judge(lambda t: t < 1000), cap=65536)
    assert (got.last_pass, got.first_fail, [p.value for p in got.points]) == (512, 1024, [64, 128, 256, 512, 1024])
    capped = fr.search_length(threshold_judge(lambda t: True), cap=300)
    assert (capped.last_pass, capped.first_fail, capped.resolution) == (256, None, 2.0)


def test_running_out_of_memory_on_the_length_axis_is_not_a_failure():
    got = fr.search_length(threshold_judge(lambda t: t < 2048, verdict_when_not=fr.OUT_OF_MEMORY), cap=65536)
    assert (got.last_pass, got.first_fail) == (1024, None)


@pytest.mark.parametrize("low,high", [(0.02, 300.0), (1e-3, 55.0), (0.5, 1e3)])
def test_scale_search_finds_both_ends_of_the_passing_range(low, high):
    got = fr.search_scale(threshold_judge(lambda m: low <= m <= high))
    (lo_pass, hi_pass) = got.last_pass
    first = got.first_fail
    assert lo_pass >= low and hi_pass <= high
    if low > 1e-3:
        assert first[0] < low and lo_pass / first[0] <= fr.SCALE_STEP * (1 + 1e-9)
    else:
        assert first[0] is None and lo_pass == 1e-3
    if high < 1e3:
        assert first[1] > high and first[1] / hi_pass <= fr.SCALE_STEP * (1 + 1e-9)
    else:
        assert first[1] is None and hi_pass == 1e3


def test_scale_search_where_nothing_fails_says_null():
    got = fr.search_scale(threshold_judge(lambda m: True))
    assert (got.last_pass, got.first_fail) == ([1e-3, 1e3], None)


# --- points and cases ------------------------------------------------------------------------------


def _result(check, status, rel=None, **metrics):
    m = {} if rel is None else {"rel_rms": rel, "headroom": rel / metrics.pop("limit", 1e-2), **metrics}
    return Result(case="c", backend="b", check=check, status=status, reason="" if status == "pass" else "why",
                  metrics=m)


def test_a_point_passes_when_every_judged_check_passes_and_reports_the_check_nearest_its_limit():
    case = Case.from_id(SMALL["kda"])
    results = [_result("forward", "pass", 4e-3, limit=8e-3), _result("state", "pass", 1e-3, limit=8e-3),
               _result("grad_q", "pass", 6e-3, limit=2e-2), _result("determinism", "fail")]
    point = fr.point_of(-3.0, case, results)
    assert point.verdict == fr.PASS  # determinism is not a stability question
    assert (point.worst_check, point.worst_rel_rms) == ("forward", 4e-3)  # headroom 0.5 beats grad_q's 0.3
    assert point.to_dict()["rel_rms"] == {"forward": 4e-3, "state": 1e-3, "grad_q": 6e-3}


def test_a_point_fails_on_a_grad_and_flags_nan():
    case = Case.from_id(SMALL["kda"])
    results = [_result("forward", "pass", 4e-3), _result("state", "pass", 1e-3),
               _result("grad_k", "fail", math.inf, nan=12)]
    point = fr.point_of(-9.0, case, results)
    assert point.verdict == fr.FAIL and point.nonfinite and point.reason.startswith("grad_k")
    assert point.to_dict()["worst_rel_rms"] is None  # strict JSON: NaN/Inf never written as a number


def test_a_skipped_backward_is_not_judged_and_a_declined_forward_is_a_decline():
    case = Case.from_id(SMALL["kda"])
    ran = fr.point_of(-1.0, case, [_result("forward", "pass", 1e-3), _result("grad_q", "skip")])
    assert ran.verdict == fr.PASS and "grad_q" not in ran.rel_rms
    declined = fr.point_of(-1.0, case, [_result("forward", "skip"), _result("state", "skip")])
    assert declined.verdict == fr.DECLINED


def test_out_of_memory_and_reference_failures_are_not_verdicts_on_the_kernel():
    case = Case.from_id(SMALL["kda"])
    oom = Result(case="c", backend="b", check="forward", status="error",
                 reason="OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert fr.point_of(65536, case, [oom]).verdict == fr.OUT_OF_MEMORY
    boom = Result(case="c", backend="b", check="forward", status="error", reason="RuntimeError: illegal address")
    assert fr.point_of(-9.0, case, [boom]).verdict == fr.ERROR
    assert fr.point_of(-9.0, case, [boom], "the oracle reference failed").verdict == fr.REFERENCE_FAILED


def test_each_axis_value_is_an_ordinary_case_with_an_id():
    base = Case.from_id(SMALL["kda"])
    assert fr.case_at("gate", base, -7.03).id == "kda-bf16-thd-N2-T[70_40]-H1/1/1-K64-V64-unif7.03-bwd"
    assert fr.case_at("gate", base, -1000).gate == "unif1000"
    assert fr.case_at("length", base, 4096).seqlens == (4096,) and fr.case_at("length", base, 64).gate == "long"
    assert fr.case_at("scale", base, 316.0).id.endswith("-mag316.0-bwd") and fr.case_at("scale", base, 1.0) == base


def test_the_base_case_is_the_first_candidate_the_backend_accepts(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    from fake_backends import SteepGateBreaks, Working

    candidates = fr.base_candidates("kda", "fp16")
    assert candidates[0].id == "kda-fp16-thd-N3-T[192_130_160]-H2/2/2-K128-V128-typical-h0-bwd"
    assert all(c.layout == "thd" and c.gate_domain == "log" and not c.safe_gate for c in candidates)
    chosen, refused = fr.choose_base_case(SteepGateBreaks(), DOUBLE, "kda", "bf16", None)
    assert chosen.id == "kda-bf16-thd-N3-T[192_130_160]-H2/2/2-K64-V64-typical-h0-bwd"
    assert len(refused) == 2 and all("K = V = 64 only" in r for r in refused)
    assert fr.choose_base_case(Working(), "w", "gdn2", "bf16", None)[0] == fr.base_candidates("gdn2", "bf16")[0]


# --- the command ---------------------------------------------------------------------------------


def frontier_cli(tmp_path, *argv):
    sys.path.insert(0, str(TESTS))
    try:
        return cli_main(["frontier", "--out", str(tmp_path / "runs"), *argv])
    finally:
        sys.path.remove(str(TESTS))


@pytest.fixture(scope="module")
def double_gate_runs(tmp_path_factory):
    """The double's gate frontier for kda and gdn2, one command each: {op: (exit status, records, run dir)}."""
    out = {}
    for op in ("kda", "gdn2"):
        tmp = tmp_path_factory.mktemp(op)
        status = frontier_cli(tmp, "--backend", DOUBLE, "--op", op, "--base-case", SMALL[op], "--json",
                              str(tmp / "f.json"))
        out[op] = status, json.loads((tmp / "f.json").read_text()), next((tmp / "runs").iterdir())
    return out


@pytest.mark.parametrize("op", ["kda", "gdn2"])
def test_a_backend_exact_except_below_minus_7_gets_a_frontier_bracketing_minus_7(double_gate_runs, op):
    status, records, _ = double_gate_runs[op]
    assert status == 0 and len(records) == 1
    rec = records[0]
    assert (rec["backend"], rec["op"], rec["dtype"], rec["axis"]) == (DOUBLE, op, "bf16", "gate")
    assert -8 < rec["first_fail"] <= -7 < rec["last_pass"] + 0.05 and rec["last_pass"] < -6
    assert rec["last_pass"] - rec["first_fail"] <= rec["resolution"] <= 0.15
    assert rec["base_case"] == SMALL[op]
    verdicts = {p["value"]: p["verdict"] for p in rec["points"]}
    assert all(v == "pass" for x, v in verdicts.items() if x >= rec["last_pass"])
    assert all(v == "fail" for x, v in verdicts.items() if x <= rec["first_fail"])


def test_the_json_contract_has_exactly_its_keys_and_is_strict_json(double_gate_runs):
    _, records, run_dir = double_gate_runs["kda"]
    assert list(records[0]) == CONTRACT_KEYS
    point = records[0]["points"][-1]
    assert {"value", "verdict", "worst_rel_rms"} <= set(point) and point["verdict"] == "fail"
    assert point["worst_rel_rms"] is None and point["nonfinite"] is True
    json.loads(json.dumps(records, allow_nan=False))
    lines = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    frontier = [r for r in lines if r["kind"] == "frontier"]
    assert len(frontier) == 1 and {k: v for k, v in frontier[0].items() if k != "kind"} == records[0]
    assert lines[0]["command"] == "frontier" and lines[-1]["kind"] == "end" and lines[-1]["exit_status"] == 0
    judged = {r["case"] for r in lines if r["kind"] == "result"}
    assert judged == {p["case"] for p in records[0]["points"]}  # every point's checks are ordinary results


def test_the_default_base_case_and_the_length_axis_end_to_end(tmp_path, capsys):
    assert frontier_cli(tmp_path, "--backend", DOUBLE, "--op", "gdn2", "--axis", "length", "--max-length", "128",
                        "--json", str(tmp_path / "f.json")) == 0
    rec = json.loads((tmp_path / "f.json").read_text())[0]
    assert rec["base_case"] == "gdn2-bf16-thd-N3-T[192_130_160]-H2/2/2-K64-V64-typical-h0-bwd"
    assert (rec["last_pass"], rec["first_fail"], [p["value"] for p in rec["points"]]) == (128, None, [64, 128])
    assert rec["points"][0]["case"] == "gdn2-bf16-thd-N1-T[64]-H2/2/2-K64-V64-long-h0-bwd"
    assert "gdn2 bf16 length: last pass 128, first fail none" in capsys.readouterr().out


def test_no_base_case_inside_the_envelope_is_exit_1_with_every_reason(tmp_path, capsys):
    assert frontier_cli(tmp_path, "--backend", "fake_backends:Declining", "--op", "kda") == 1
    out = capsys.readouterr().out
    assert "no frontier: the backend declined every candidate base case" in out
    assert out.count("fake engine declined: head dim must be 256") == len(fr.base_candidates("kda", "bf16"))


@pytest.mark.parametrize("argv,message", [
    (["--backend", "nosuchbackend", "--op", "kda"], "backend 'nosuchbackend': unknown backend"),
    (["--backend", DOUBLE, "--op", "gdn"], f"backend {DOUBLE!r} does not serve gdn (it serves gdn2, kda)"),
    (["--backend", DOUBLE, "--op", "kda", "--dtype", "fp32"], "--dtype: unknown value 'fp32'; expected one of bf16, fp16"),
    (["--backend", DOUBLE, "--op", "mamba"], "--op: unknown value 'mamba'"),
    (["--backend", DOUBLE, "--op", "kda", "--axis", "heads"], "--axis: unknown value 'heads'"),
    (["--backend", DOUBLE, "--op", "kda", "--max-length", "32", "--axis", "length"], "--max-length: expected at least 64"),
    (["--backend", DOUBLE, "--op", "gdn2", "--base-case", SMALL["kda"]], "is a kda bf16 case: give exactly --op kda"),
    (["--backend", DOUBLE, "--op", "kda", "--base-case", "kda-bf16-thd-N1-T[64]-H2/2/2-K64-V64-typical-safegate"],
     "--base-case cannot carry the gate axis"),
])
def test_unusable_requests_are_one_line_errors_with_exit_2(tmp_path, capsys, argv, message):
    assert frontier_cli(tmp_path, *argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("deltacheck frontier: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()  # nothing was started


def test_the_fp16_length_axis_also_judges_the_safe_gate_backward():
    from deltacheck.harness.run import frontier_search as fr

    base = Case(op="kda", io_dtype="fp16", layout="thd", seqlens=(192, 130, 160), K=64, V=64, gate="typical",
                initial_state=True, backward=True)
    at = fr.case_at("length", base, 256)
    [safe] = fr.companion_cases("length", at)
    assert safe.safe_gate and safe.backward and safe.seqlens == (256,)
    assert fr.companion_cases("gate", at) == []
    assert fr.companion_cases("length", at.replace(io_dtype="bf16")) == []
    assert fr.companion_cases("length", fr.case_at("length", base.replace(op="gdn"), 256)) == []  # softplus gate
    judge = fr.CaseJudge(None, None, "fake", base, "length", None)
    judge._judge = lambda value, case: (fr.Point(value, fr.FAIL, case.id, worst_rel_rms=3.0, limit=1.0, reason="dq")
                                        if case.safe_gate else fr.Point(value, fr.PASS, case.id, 0.5, "forward", 1.0))
    point = judge(256)
    assert point.verdict == fr.FAIL and point.case == safe.id and point.reason.startswith(safe.id)
    judge._judge = lambda value, case: fr.Point(value, fr.PASS, case.id, 0.9 if case.safe_gate else 0.5, "forward", 1.0)
    assert judge(256).case == safe.id  # both pass: the one nearer its limit
