"""Detection power (issue #27): for each check, the smallest relative perturbation of the kernel's own result that
fails it (harness/judge/compare.py ``detection_delta``, bisection, no second kernel call), reported per backend x op x check
in summary.md and report.html as "this lane sees bugs down to ..."."""

from __future__ import annotations

import io
import json
import math

import torch

from deltacheck.cases import Case
from deltacheck.harness.judge import compare
from deltacheck.harness.judge.runner import RunOptions
from deltacheck.harness.run.execute import execute
from deltacheck.reports.render import write_reports


def test_detection_delta_is_the_smallest_failing_perturbation():
    torch.manual_seed(0)
    ref = torch.randn(64, 4, 32, dtype=torch.float64)
    actual = ref + 1e-3 * torch.randn_like(ref) * ref.pow(2).mean().sqrt()  # an error of ~1e-3 relative

    def fails(rel, max_abs):
        return rel > 4e-3

    delta = compare.detection_delta(actual, ref, fails, seed=1)
    # independent noise adds in quadrature: the check fails once sqrt(1e-3^2 + delta^2) > 4e-3
    assert abs(delta - math.sqrt(4e-3 ** 2 - 1e-3 ** 2)) < 2e-4, delta
    assert compare.detection_delta(actual, ref, fails, seed=1) == delta  # seeded
    assert compare.detection_delta(actual, ref, lambda rel, m: True, seed=1) == 0.0  # already failing
    assert compare.detection_delta(actual, ref, lambda rel, m: False, seed=1) == math.inf  # sees nothing
    assert compare.detection_delta(actual * math.nan, ref, fails, seed=1) is None


CASES = [Case.from_id(i) for i in (
    "kda-bf16-thd-N4-T[0_1_64_65]-H2/2/2-K64-V64-typical-h0-cont[1_64]-bwd",
    "gdn2-fp16-bshd-N2-L64-H2/2/4-K64-V64-zero-l2norm-sigmoid-guard-bwd",
)]


def test_the_reports_of_a_baseline_as_kernel_run_say_how_small_a_bug_each_lane_sees(tmp_path):
    status, run_dir = execute(CASES, ["baseline"], tmp_path, RunOptions(reference="oracle"), in_process=True,
                              environ={}, stream=io.StringIO())
    assert status == 0
    results = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    judged = [r for r in results if r.get("kind") == "result" and r["status"] == "pass"
              and r["check"] != "determinism"]  # bitwise, no tolerance: nothing to perturb
    assert judged and all("detects" in r["metrics"] for r in judged)
    for r in judged:
        m = r["metrics"]
        if m.get("baseline") and not m.get("floor_judged") and not m.get("negligible"):
            # the baseline is the kernel here: its error e = baseline, the limit 2e, so delta = sqrt(4 - 1) e
            assert 1.6 < m["detects_vs_baseline"] < 1.85, (r["case"], r["check"], m["detects_vs_baseline"])
    write_reports(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    detection = summary["detection"]
    checks = {(r["backend"], r["op"], r["check"]) for r in judged if "detects" in r["metrics"]}
    assert {(row["backend"], row["op"], row["check"]) for row in detection["rows"]} == checks
    markdown = (run_dir / "summary.md").read_text()
    html = (run_dir / "report.html").read_text()
    for text in (markdown, html):
        assert text.count("this lane sees bugs down to") == len(detection["rows"])
    # the target is met, or every check over it is listed by name
    assert detection["scored"] and detection["within"] + detection["exceptions_total"] == detection["scored"]
    if not detection["target_met"]:
        assert detection["exceptions"] and "NOT met" in markdown
        for e in detection["exceptions"]:
            assert e["case"] in markdown and e["floor_judged"]  # only the dtype's floor keeps a check over 3x
