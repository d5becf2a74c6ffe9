"""deltacheck merge: later runs win per (case, backend, check), environments must match, and a merge is
finished only when every input finished."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_reports_compare import result, write_run

from deltacheck.harness.cli import main as cli_main
from deltacheck.reports.load import load_run

A = "kda-bf16-thd-N1-T[64]-H2/2/2-K64-V64-typical"
B = "kda-bf16-thd-N2-T[1_64]-H2/2/2-K64-V64-steep"
C = "kda-bf16-bshd-N2-L17-H2/2/2-K64-V64-mild"


def unfinished(directory: Path, results: list[dict], frontend: str = "1.32.0") -> Path:
    write_run(directory, results, frontend)
    lines = (directory / "results.jsonl").read_text().splitlines()
    (directory / "results.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # drop the end record
    return directory


def merged_records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_a_rerun_replaces_the_interrupted_attempt_in_place_and_adds_what_it_reached(tmp_path, capsys):
    first = unfinished(tmp_path / "first", [result("pass", 1e-3, case=A),
                                            result("error", case=B, check="grad_q")])
    second = write_run(tmp_path / "second", [result("pass", 2e-3, case=B, check="grad_q"),
                                             result("pass", 3e-3, case=C)], "1.32.0")
    out = tmp_path / "merged"
    assert cli_main(["merge", str(first), str(second), "--out", str(out), "--report"]) == 0
    recs = merged_records(out)
    results = [(r["case"], r["check"], r["status"]) for r in recs if r["kind"] == "result"]
    assert results == [(A, "forward", "pass"), (B, "grad_q", "pass"), (C, "forward", "pass")]
    assert [r["kind"] for r in recs].count("gate") == 1
    assert [m["run_id"] for m in recs[0]["merged_from"]] == ["first", "second"]
    assert recs[-1]["kind"] != "end", "an input did not finish, so the merge must not claim to"
    assert "neither does the merge" in capsys.readouterr().out
    assert (out / "summary.md").exists() and not load_run(out, warn=False).finished


def test_finished_inputs_give_a_finished_merge_whose_status_counts_every_failure(tmp_path):
    first = write_run(tmp_path / "first", [result("fail", 5e-2, case=A)], "1.32.0")
    second = write_run(tmp_path / "second", [result("pass", 1e-3, case=B)], "1.32.0")
    assert cli_main(["merge", str(first), str(second), "--out", str(tmp_path / "m")]) == 0
    end = merged_records(tmp_path / "m")[-1]
    assert end["kind"] == "end" and end["counts"] == {"fail": 1, "pass": 1} and end["exit_status"] == 1


def test_runs_of_different_environments_are_refused_unless_asked(tmp_path, capsys):
    old = write_run(tmp_path / "old", [result("pass", 1e-3, case=A)], "1.31.0")
    new = write_run(tmp_path / "new", [result("pass", 1e-3, case=B)], "1.32.0")
    assert cli_main(["merge", str(old), str(new), "--out", str(tmp_path / "m")]) == 2
    assert "different environments" in capsys.readouterr().err and not (tmp_path / "m").exists()
    assert cli_main(["merge", str(old), str(new), "--out", str(tmp_path / "m"), "--allow-mixed-env"]) == 0
    sources = merged_records(tmp_path / "m")[0]["merged_from"]
    assert [s["env"]["versions"]["cudnn_frontend"] for s in sources] == ["1.31.0", "1.32.0"]


@pytest.mark.parametrize("problem", ["one input", "output not empty", "missing input"])
def test_unusable_merges_are_one_line_errors(tmp_path, capsys, problem):
    a = write_run(tmp_path / "a", [result("pass", 1e-3, case=A)], "1.32.0")
    b = write_run(tmp_path / "b", [result("pass", 1e-3, case=B)], "1.32.0")
    out = tmp_path / "m"
    inputs = [str(a), str(b)]
    if problem == "one input":
        inputs = [str(a)]
    elif problem == "output not empty":
        out.mkdir()
        (out / "x").write_text("keep me")
    else:
        inputs.append(str(tmp_path / "nowhere"))
    assert cli_main(["merge", *inputs, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("deltacheck merge: error:") and len(err.strip().splitlines()) == 1
    if problem == "output not empty":
        assert (out / "x").read_text() == "keep me"


def test_the_backend_by_op_table_counts_cases_by_how_they_ended(tmp_path):
    from deltacheck.reports.render import write_reports

    rows = [
        result("pass", 1e-3, case=A), result("pass", 4e-3, case=A, check="grad_q"),      # passed
        result("pass", 1e-3, case=B), result("fail", 9e-2, case=B, check="grad_q"),      # failed
        result("skip", case=C), result("skip", case=C, check="grad_q"),                  # declined
        result("pass", 1e-3, case="kda-x"), result("error", case="kda-x", check="grad_q"),  # errored
        result("pass", 1e-3, case=A, backend="fla"),
    ]
    for r, seconds in zip(rows, (2.0, 0, 1.5, 0, 0, 0, 3.0, 0, 7.0)):
        r["seconds"] = seconds
    written = write_reports(write_run(tmp_path / "run", rows, "1.32.0"), warn=False)
    pairs = {(p["backend"], p["op"]): p for p in written.summary["pairs"]}
    cudnn = pairs[("cudnn", "kda")]
    assert (cudnn["cases"], cudnn["ran"], cudnn["passed"], cudnn["failed"], cudnn["errored"], cudnn["declined"]) == \
        (4, 3, 1, 1, 1, 1)
    assert cudnn["checks"] == {"pass": 4, "fail": 1, "known": 0, "skip": 2, "error": 1} and cudnn["seconds"] == 6.5
    assert cudnn["worst_headroom_case"] == B and cudnn["worst_headroom_check"] == "grad_q"
    assert pairs[("fla", "kda")]["passed"] == 1
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "## By backend × op" in md and f"`{B}` (grad_q)" in md
    html = (tmp_path / "run" / "report.html").read_text()
    pair_table = html[html.index("<h2>By backend × op</h2>"):html.index("<h2>Results by")]
    assert f"<code>{B}</code> (grad_q)" in pair_table and "object at 0x" not in pair_table


def test_merge_warns_about_the_unreadable_lines_it_skips_as_report_does(tmp_path, capsys):
    first = write_run(tmp_path / "first", [result("pass", 1e-3, case=A)], "1.32.0")
    second = write_run(tmp_path / "second", [result("pass", 1e-3, case=B)], "1.32.0")
    lines = (second / "results.jsonl").read_text().splitlines(keepends=True)
    lines.insert(2, '{"kind": "result", "case": "torn\n')
    (second / "results.jsonl").write_text("".join(lines))
    capsys.readouterr()
    assert cli_main(["merge", str(first), str(second), "--out", str(tmp_path / "m")]) == 0
    err = capsys.readouterr().err
    assert f"warning: {second / 'results.jsonl'} line 3: " in err and "skipped" in err, err


def test_report_on_a_header_less_run_says_what_it_skipped_never_an_empty_list(tmp_path, capsys):
    run = write_run(tmp_path / "run", [result("pass", 1e-3, case=A)], "1.32.0")
    lines = (run / "results.jsonl").read_text().splitlines(keepends=True)
    (run / "results.jsonl").write_text("".join(line for line in lines if '"kind": "run"' not in line))
    capsys.readouterr()
    assert cli_main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "skipped: \n" not in out and not out.rstrip().endswith("skipped:"), out
    assert "unusable line" not in out, out
    assert "note: no run header: environment, versions and commit are unknown" in out, out
