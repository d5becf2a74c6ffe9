"""deltacheck compare: each kind of change on crafted pairs of runs, exit statuses, and the fixture pair."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from deltacheck.harness.cli import main as cli_main
from deltacheck.reports.compare import compare_runs
from deltacheck.reports.load import load_run

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CASE = "kda-bf16-thd-N1-T[64]-H2/2/2-K64-V64-typical"


def cli(*argv: str) -> int:
    return cli_main(list(argv))


def result(status: str, rel: float | None = None, *, case: str = CASE, backend: str = "cudnn", check: str = "forward",
           op: str = "kda") -> dict:
    metrics = {} if rel is None else {"rel_rms": rel, "headroom": rel / 2e-2}
    return {"kind": "result", "case": case, "backend": backend, "check": check, "op": op, "status": status,
            "reason": "" if status == "pass" else f"because {status}", "metrics": metrics}


def write_run(directory: Path, results: list[dict], frontend: str = "1.31.0", *, extra_lines: tuple[str, ...] = ()) -> Path:
    directory.mkdir(parents=True)
    header = {"kind": "run", "schema": 1, "run_id": directory.name, "commit": "abc", "dirty": False,
              "env": {"cuda": True, "device_name": "NVIDIA H200", "capability": [9, 0], "python": "3.12.8",
                      "versions": {"torch": "2.13.0", "cudnn_frontend": frontend}}}
    gates = [{"kind": "gate", "backend": "cudnn", "op": "kda", "runnable": True, "required": False, "reason": ""}]
    end = {"kind": "end", "counts": {}, "exit_status": 0, "required_failures": []}
    lines = [json.dumps(r) for r in (header, *gates, *results)] + list(extra_lines) + [json.dumps(end)]
    (directory / "results.jsonl").write_text("".join(line + "\n" for line in lines))
    return directory


def pair(tmp_path: Path, old: list[dict], new: list[dict]) -> tuple[Path, Path]:
    return write_run(tmp_path / "old", old, "1.31.0"), write_run(tmp_path / "new", new, "1.32.0")


KIND_CASES = {
    # kind: (old results, new results, exit status)
    "new_failure": ([result("pass", 1e-3)], [result("fail", 5e-2)], 1),
    "newly_errored": ([result("pass", 1e-3)], [result("error")], 1),
    "newly_declined": ([result("pass", 1e-3)], [result("skip")], 1),
    "worse": ([result("pass", 1e-3)], [result("pass", 3e-3)], 1),
    "worse (NaN)": ([result("fail", 3e-2)], [result("fail", float("nan"))], 1),
    "fixed": ([result("fail", 5e-2)], [result("pass", 1e-3)], 0),
    "fixed (was error)": ([result("error")], [result("pass", 1e-3)], 0),
    "better": ([result("pass", 4e-3)], [result("pass", 1e-3)], 0),
    "newly_running": ([result("skip")], [result("pass", 1e-3)], 0),
    # one run empty: the two share nothing, which is not "no regression" (a one-line error, exit 2)
    "not_comparable (only old)": ([result("pass", 1e-3)], [], 2),
    "not_comparable (only new)": ([], [result("pass", 1e-3)], 2),
    "not_comparable (metric missing)": ([result("pass", 1e-3)], [result("pass")], 0),
    "unchanged (within factor)": ([result("pass", 1e-3)], [result("pass", 1.9e-3)], 0),
    "unchanged (status-only check)": ([result("pass", check="determinism")], [result("pass", check="determinism")], 0),
    "unchanged (below the floor)": ([result("pass", 1e-15)], [result("pass", 1e-11)], 0),
    "unchanged (still declined)": ([result("skip")], [result("skip")], 0),
}


@pytest.mark.parametrize("label", list(KIND_CASES))
def test_each_kind_of_change_and_its_exit_status(tmp_path, capsys, label):
    old, new, exit_status = KIND_CASES[label]
    kind = label.split(" (")[0]
    old_dir, new_dir = pair(tmp_path, old, new)
    cmp = compare_runs(load_run(old_dir), load_run(new_dir))
    assert [c.kind for c in cmp.changes] == [kind]
    assert cmp.exit_status == exit_status
    assert cli("compare", str(old_dir), str(new_dir)) == exit_status
    out, err = capsys.readouterr()
    if exit_status == 2:
        assert not out and "share no (case, backend, check)" in err
    else:
        assert ("REGRESSION" in out.splitlines()[0]) == bool(exit_status)


def test_markdown_leads_with_version_changes_and_lists_every_kind(tmp_path, capsys):
    old = [result("pass", 1e-3, case="a"), result("fail", 5e-2, case="b"), result("pass", 1e-3, case="c"),
           result("pass", 4e-3, case="d"), result("pass", 1e-3, case="e"), result("pass", 1e-3, case="f"),
           result("pass", 1e-3, case="g")]
    new = [result("fail", 5e-2, case="a"), result("pass", 1e-3, case="b"), result("pass", 3e-3, case="c"),
           result("pass", 1e-3, case="d"), result("skip", case="e"), result("error", case="f"),
           result("pass", 1e-3, case="h"), result("pass", 1e-3, case="x", backend="fla", op="gdn2")]
    old_dir, new_dir = pair(tmp_path, old, new)
    out_file = tmp_path / "cmp" / "compare.md"
    assert cli("compare", str(old_dir), str(new_dir), "--out", str(out_file)) == 1
    text = capsys.readouterr().out
    assert out_file.read_text().strip() == text.strip()
    first_section = text.index("## Environment changes")
    assert text.index("| cudnn_frontend | 1.31.0 | **1.32.0** |") > first_section
    assert text.index("| cudnn_frontend |") < text.index("## Changes by kind")
    assert text.splitlines()[0] == "# deltacheck compare: REGRESSION (1 new failure, 1 newly errored, 1 newly declined, 1 worse)"
    for heading in ("## New failures (1)", "## Newly errored (1)", "## Newly declined (skipped now, ran before) (1)",
                    "## Worse: error grew by more than 2× (1)", "## Fixed (1)", "## Better: error shrank by more than 2× (1)",
                    "## Not comparable (3)"):
        assert heading in text, heading
    assert "| `c` | cudnn | forward | pass | 1.00e-03 | 3.00e-03 | 3.00× | 0.15 |" in text
    coverage = text.split("## Coverage changes", 1)[1]
    assert "| gdn2 | fla | 0 (0) | 1 (1) | only in the new run |" in coverage
    assert "| kda | cudnn | 7 (7) | 7 (5) |  |" in coverage


def test_factor_moves_the_line_between_worse_and_unchanged(tmp_path):
    old_dir, new_dir = pair(tmp_path, [result("pass", 1e-3)], [result("pass", 3e-3)])
    assert cli("compare", str(old_dir), str(new_dir), "--factor", "2") == 1
    assert cli("compare", str(old_dir), str(new_dir), "--factor", "4") == 0


def test_corrupt_line_in_a_run_is_skipped_and_named(tmp_path, capsys):
    old_dir = write_run(tmp_path / "old", [result("pass", 1e-3)])
    new_dir = write_run(tmp_path / "new", [result("pass", 1e-3)], "1.32.0", extra_lines=('{"kind": "result", "ca',))
    assert cli("compare", str(old_dir), str(new_dir)) == 0
    captured = capsys.readouterr()
    assert "line 4: not valid JSON" in captured.err
    assert "The new run's results.jsonl had 1 unusable line(s), skipped: line 4" in captured.out


def test_fixture_releases_compare_as_a_regression(tmp_path, capsys):
    old_dir = shutil.copytree(FIXTURES / "fe-1.31.0", tmp_path / "old")
    new_dir = shutil.copytree(FIXTURES / "fe-1.32.0", tmp_path / "new")
    cmp = compare_runs(load_run(old_dir, warn=False), load_run(new_dir, warn=False))
    counts = cmp.counts
    assert (counts["fixed"], counts["worse"], counts["newly_errored"], counts["not_comparable"]) == (1, 1, 1, 1)
    assert counts["new_failure"] == counts["newly_declined"] == 0
    assert cmp.env_changes == [("cudnn_frontend", "1.31.0", "1.32.0")]
    (fixed,) = cmp.of_kind("fixed")
    assert fixed.case == "gdn-bf16-thd-N1-T[4096]-H4/4/4-K64-V64-steep"
    assert cmp.exit_status == 1


@pytest.mark.parametrize("which", ["old", "new"])
def test_missing_or_foreign_runs_exit_2_with_one_line(tmp_path, capsys, which):
    good = write_run(tmp_path / "good", [result("pass", 1e-3)])
    missing = tmp_path / "missing"
    args = (missing, good) if which == "old" else (good, missing)
    assert cli("compare", *map(str, args)) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"deltacheck compare: error: no run directory at {missing}"

    foreign = shutil.copytree(FIXTURES / "schema2", tmp_path / "foreign")
    args = (foreign, good) if which == "old" else (good, foreign)
    assert cli("compare", *map(str, args)) == 2
    assert "written with results schema 2" in capsys.readouterr().err


@pytest.mark.parametrize("option, value, message", [
    ("--factor", "0.5", "must be greater than 1 (2.0 means 'grew more than twofold'), got 0.5"),
    ("--factor", "1", "must be greater than 1"),
    ("--factor", "two", "not a number: 'two'"),
    ("--floor", "0", "must be positive, got 0"),
    ("--floor", "-1", "must be positive, got -1"),
    ("--floor", "x", "not a number: 'x'"),
])
def test_bad_factor_or_floor_is_a_usage_error_that_says_why(capsys, option, value, message):
    with pytest.raises(SystemExit) as exc:
        cli("compare", "a", "b", option, value)
    assert exc.value.code == 2
    assert f"argument {option}: {message}" in capsys.readouterr().err
