"""Stability frontiers in the run directory's reports: the loader, summary.json's ``frontiers``, summary.md's section,
report.html's plot, merge, and ``deltacheck compare`` (a frontier that moved the wrong way is a regression)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
from pathlib import Path

import pytest

from deltacheck.harness.cli import main as cli_main
from deltacheck.reports.frontier import compare_frontiers, growth_slope
from deltacheck.reports.load import load_run

TESTS = Path(__file__).resolve().parent
DOUBLE = "fake_backends:SteepGateBreaks"
BASE = "kda-bf16-thd-N2-T[70_40]-H1/1/1-K64-V64-typical-bwd"


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli_main(list(argv))
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """A real frontier run directory: the double's kda gate frontier, rendered with --report."""
    root = tmp_path_factory.mktemp("frontier")
    sys.path.insert(0, str(TESTS))
    try:
        status, _, _ = cli("frontier", "--backend", DOUBLE, "--op", "kda", "--base-case", BASE, "--out", str(root),
                           "--report")
    finally:
        sys.path.remove(str(TESTS))
    assert status == 0
    return next(p for p in root.iterdir() if p.is_dir())


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


def rewrite_frontier(src: Path, dst: Path, **changes) -> Path:
    """A copy of a run directory whose frontier record has ``changes``; its results are left as they are."""
    shutil.copytree(src, dst)
    lines = [({**r, **changes} if r["kind"] == "frontier" else r) for r in records(dst)]
    (dst / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return dst


def test_the_loader_reads_frontier_records(measured):
    run = load_run(measured, warn=False)
    assert len(run.frontiers) == 1 and not run.problems
    assert run.frontiers[0]["axis"] == "gate" and run.frontiers[0]["base_case"] == BASE


def test_a_broken_frontier_record_is_an_input_problem_and_a_later_record_wins(measured, tmp_path):
    copy = shutil.copytree(measured, tmp_path / "copy")
    frontier = next(r for r in records(copy) if r["kind"] == "frontier")
    with open(copy / "results.jsonl", "a") as fh:
        fh.write(json.dumps({"kind": "frontier", "backend": DOUBLE, "points": []}) + "\n")
        fh.write(json.dumps({**frontier, "last_pass": -6.5}) + "\n")
    run = load_run(copy, warn=False)
    assert [str(p) for p in run.problems] == [f"line {len(records(measured)) + 1}: frontier record without op, dtype, axis"]
    assert [f["last_pass"] for f in run.frontiers] == [-6.5]


def test_summary_json_lists_the_frontiers(measured):
    summary = json.loads((measured / "summary.json").read_text())
    (entry,) = summary["frontiers"]
    frontier = next(r for r in records(measured) if r["kind"] == "frontier")
    assert {k: entry[k] for k in frontier if k != "kind"} == {k: v for k, v in frontier.items() if k != "kind"}
    assert entry["first_fail_repro"].startswith("deltacheck run --case ") and "unif" in entry["first_fail_repro"]


def test_summary_md_has_a_frontier_section(measured):
    text = (measured / "summary.md").read_text()
    frontier = next(r for r in records(measured) if r["kind"] == "frontier")
    assert "## Stability frontiers" in text
    row = f"| {DOUBLE} | kda | bf16 | gate | {frontier['last_pass']:g} | {frontier['first_fail']:g} |"
    assert row in text


def test_report_html_draws_one_plot_per_frontier(measured):
    html = (measured / "report.html").read_text()
    assert "<h2>Stability frontiers</h2>" in html
    assert html.count(f'alt="Frontier: {DOUBLE} kda bf16, gate axis"') == 1


def test_compare_flags_a_frontier_that_moved_toward_zero_as_a_regression(measured, tmp_path):
    frontier = next(r for r in records(measured) if r["kind"] == "frontier")
    worse = rewrite_frontier(measured, tmp_path / "worse", last_pass=-3.9, first_fail=-4.0)
    status, out, _ = cli("compare", str(measured), str(worse))
    assert status == 1 and "1 frontier moved the wrong way" in out.splitlines()[0]
    assert "| **regressed** |" in out
    better = rewrite_frontier(measured, tmp_path / "better", first_fail=None, last_pass=-1000)
    status, out, _ = cli("compare", str(measured), str(better))
    assert status == 0 and "| improved |" in out
    same = rewrite_frontier(measured, tmp_path / "same", first_fail=frontier["first_fail"])
    assert cli("compare", str(measured), str(same))[0] == 0


def test_merge_keeps_the_frontier_records(measured, tmp_path):
    assert cli("merge", str(measured), str(measured), "--out", str(tmp_path / "m"))[0] == 0
    assert sum(r["kind"] == "frontier" for r in records(tmp_path / "m")) == 1


# --- the comparison rules per axis ------------------------------------------------------------------


def rec(axis, last_pass, first_fail, values=(), base="b", verdicts=None):
    points = [{"value": v, "verdict": (verdicts or {}).get(v, "pass")} for v in values]
    return {"backend": "x", "op": "kda", "dtype": "bf16", "axis": axis, "last_pass": last_pass,
            "first_fail": first_fail, "resolution": 0.1, "base_case": base, "points": points}


@pytest.mark.parametrize("old,new,kind", [
    (rec("gate", -6.95, -7.03), rec("gate", -6.95, -7.03), "unchanged"),
    (rec("gate", -6.95, -7.03), rec("gate", -6.95, -7.0), "regressed"),  # fails nearer zero
    (rec("gate", -6.95, -7.03), rec("gate", -6.9, -7.03), "regressed"),  # stopped passing sooner
    (rec("gate", -1000, None), rec("gate", -500, -512), "regressed"),  # fails where nothing failed
    (rec("gate", -6.95, -7.03), rec("gate", -12.0, -12.2), "improved"),
    (rec("gate", -6.95, -7.03), rec("gate", None, -0.5), "regressed"),
    (rec("gate", -8, None, [-8, -16], verdicts={-16: "declined"}), rec("gate", -4, None, [-4, -8],
                                                                         verdicts={-8: "declined"}), "regressed"),
    (rec("length", 4096, None, [2048, 4096]), rec("length", 65536, None, [32768, 65536]), "improved"),
    (rec("length", 65536, None, [65536]), rec("length", 4096, None, [2048, 4096]), "not_comparable"),  # a lower cap
    (rec("length", 65536, None, [65536]), rec("length", 4096, None, [4096, 8192], verdicts={8192: "out_of_memory"}),
     "regressed"),
    (rec("length", 8192, 16384), rec("length", 4096, 8192), "regressed"),
    (rec("scale", [0.01, 300], [0.008, 350]), rec("scale", [0.01, 300], [0.008, 350]), "unchanged"),
    (rec("scale", [0.01, 300], [0.008, 350]), rec("scale", [0.02, 300], [0.016, 350]), "regressed"),  # low end rose
    (rec("scale", [0.01, 300], [0.008, 350]), rec("scale", [0.01, 100], [0.008, 120]), "regressed"),  # high end fell
    (rec("scale", [0.01, 300], [0.008, 350]), rec("scale", [0.001, 1000], None), "improved"),
    (rec("scale", [0.01, 300], [0.008, 350]), rec("scale", [0.001, 100], [None, 120]), "regressed"),  # one side each
])
def test_frontier_comparison_rules(old, new, kind):
    (change,) = compare_frontiers([old], [new])
    assert change.kind == kind, change.detail


def test_frontiers_in_one_run_only_are_not_comparable_and_base_case_changes_are_said():
    a, b = rec("gate", -6.95, -7.03), rec("length", 4096, None, [4096])
    kinds = {c.axis: (c.kind, c.detail) for c in compare_frontiers([a], [b])}
    assert kinds == {"gate": ("not_comparable", "only in the old run"), "length": ("not_comparable", "only in the new run")}
    (moved,) = compare_frontiers([a], [rec("gate", -6.95, -7.03, base="c")])
    assert moved.kind == "unchanged" and "base cases differ (b → c)" in moved.detail


def test_growth_slope_is_the_log_log_fit_of_the_error_against_length():
    points = [{"value": t, "rel_rms": {"forward": 1e-4 * t ** 0.5}, "baseline": {"forward": 2e-4}} for t in
              (64, 128, 256, 512)]
    points.append({"value": 1024, "rel_rms": {"forward": None}, "baseline": {}})  # a NaN point is left out
    assert growth_slope(points, "forward") == pytest.approx(0.5)
    assert growth_slope(points, "forward", "baseline") == pytest.approx(0.0)
    assert growth_slope(points[:1], "forward") is None
