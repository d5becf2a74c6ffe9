"""Issue 26's H200 tally (bench/serving_i26_tally.py) and the session-5 case lists (bench/serving_i26_s5_lists.py):
the lists are what the recorded results leave, and the tally counts every planned pair once, as recorded, as an
unrecorded decline before a session-4 cut, or as not run, with the known-issue entries applied."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
S4, R2 = REPO / "bench/results/serving-i26-h200", REPO / "bench/results/serving-i26-h200-r2"


def _bench(name):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}_test", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tally():
    return _bench("serving_i26_tally")


def test_the_committed_case_lists_are_what_the_records_leave():
    lists = _bench("serving_i26_s5_lists").lists()
    gdn = [cid for k, ids in lists.items() if k.startswith("gdn_cutile-") for cid in ids]
    routed = [cid for k, ids in lists.items() if k.startswith("cudnn_gdn-") for cid in ids]
    # R2's table: 43 gdn_cutile pairs per check not run, 38 routed (one more listed: a decline after the cut), 2 kda;
    # S4's: 31 flashqla.
    assert (len(gdn), len(set(gdn)), len(routed), len(lists["kda_cutile"]), len(lists["flashqla"])) == (43, 43, 39, 2, 31)
    assert set(routed) <= set(gdn) and lists["cudnn_kda"] == []
    for name, ids in lists.items():
        assert (REPO / "bench/serving_i26_s5_cases" / f"{name}.txt").read_text() == "".join(f"{i}\n" for i in ids)


def test_the_tally_of_s4_and_r2_matches_their_recorded_tables(tally):
    results = tally.read([S4, R2])
    counts, inferred = tally.tally(results)
    # As R2's table.txt: 43 not run, 41 declined (unrecorded) for gdn_cutile; routed cudnn 91 declined of which one
    # is listed again (90 + 39 not run).
    assert counts[("cudnn@gdn_cutile", "causality")] == {"passed": 31, "declined": 41, "not_run": 43}
    assert counts[("cudnn", "graph_replay")]["declined"] + counts[("cudnn", "graph_replay")]["not_run"] == 91 + 38
    assert inferred[("fla", "causality")] == 128 and counts[("fla", "causality")]["not_run"] == 0


def test_the_tally_applies_the_known_issues_and_reads_session_5_files(tally, tmp_path, capsys):
    listed = (REPO / "bench/serving_i26_s5_cases/kda_cutile.txt").read_text().split()[0]
    s5 = tmp_path / "d26-s5"
    (s5 / "train-a/run").mkdir(parents=True)
    (s5 / "kda_cutile.jsonl").write_text(json.dumps(
        {"check": "causality", "backend": "cudnn@kda_cutile", "case": listed, "status": "declined",
         "reason": "FE: no plan", "numbers": {}}) + "\n{\"check\": \"caus")  # a line cut by a kill
    (s5 / "train-a/run/results.jsonl").write_text(json.dumps({"case": listed, "check": "forward",
                                                               "status": "fail"}) + "\n")
    assert tally.main([str(S4), str(R2), str(s5)]) == 0
    out = capsys.readouterr().out
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in out.splitlines()[1:] if len(line.split()) == 10}
    # run passed failed known error declined reported not_run: one listed kda_cutile case now declined, one not run
    assert rows[("cudnn@kda_cutile", "causality")] == ["87", "60", "0", "27", "0", "29", "0", "1"]
    assert rows[("cudnn@kda_cutile", "graph_replay")][-1] == "2"
    assert tally.main([str(S4), str(R2), "--no-known"]) == 0
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in capsys.readouterr().out.splitlines()[1:]
            if len(line.split()) == 10}
    assert rows[("cudnn@kda_cutile", "causality")][:4] == ["87", "60", "27", "0"]


def test_a_refused_pin_recorded_as_an_error_counts_as_declined_with_its_case(tally):
    """Session 5's records, made before the pinned-engine fix: FE's "no <engine> plan" error, and the same backend's
    other results on that case (another engine's, on FE's cached unpinned graph), are declines; a routed backend's
    error and another case's results stay as recorded."""
    words = "no kda_hopper plan for this graph (offered: ['kda_hopper_cuda', 'kda_cutile'])"
    rows = [{"backend": "cudnn@kda_hopper", "check": "causality", "case": "A", "status": "error",
             "reason": f"cudnnGraphNotSupportedError: {words}"},
            {"backend": "cudnn@kda_hopper", "check": "graph_replay", "case": "A", "status": "passed", "reason": ""},
            {"backend": "cudnn@kda_hopper", "check": "graph_replay", "case": "B", "status": "passed", "reason": ""},
            {"backend": "cudnn", "check": "causality", "case": "A", "status": "error",
             "reason": f"cudnnGraphNotSupportedError: {words}"}]
    results = {(r["backend"], r["check"], r["case"]): r for r in rows}
    lines = tally.redeclare_refused_pins(results)
    assert [r["status"] for r in rows] == ["declined", "declined", "passed", "error"]
    assert lines == ["REDECLARED cudnn@kda_hopper causality A: recorded error",
                     "REDECLARED cudnn@kda_hopper graph_replay A: recorded passed"]
    assert rows[1]["reason"].startswith(f"cuDNN declined (plan_name='kda_hopper'): {words}; served by "
                                        "cudnn@kda_hopper_cuda, cudnn@kda_cutile (or routed `cudnn`), not by kda_hopper")


def test_the_tally_over_s4_r2_and_s5_leaves_no_failure_and_no_error(tally, tmp_path, capsys):
    """The README's table: S4, R2 and session 5 (bench/results/s5/d26-S5.tgz) with the shipped entries and the
    refused pins re-declared: every result passed, known, reported or declined; the pinned Hopper engines' counts."""
    import tarfile

    with tarfile.open(REPO / "bench/results/s5/d26-S5.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    assert tally.main([str(S4), str(R2), str(tmp_path / "d26-s5"), "--json", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "FAILED " not in out and "ERROR " not in out and "NO LONGER REPRODUCE" not in out
    assert out.count("REDECLARED ") == 14
    counts = json.loads((tmp_path / "t.json").read_text())
    assert counts["cudnn@kda_hopper causality"] == {"passed": 5, "known": 2, "declined": 110}
    assert counts["cudnn@kda_hopper_cuda graph_replay"] == {"passed": 36, "known": 4, "declined": 77}
    assert not any(c.get("failed") or c.get("error") for c in counts.values())


# (archive, the folder it unpacks, where it is unpacked), later ones replacing a pair's record
SESSION_ARCHIVES = (("s5/d26-S5.tgz", "d26-s5", "."), ("s7/d26-S6.tgz", "d26-s6", "."),
                    ("s7/d26-S7.tgz", "d26-s7", "."), ("s8/d26-S7b.tgz", "d26-s7", "s8"),
                    ("s8/d26-S8.tgz", "d26-s8", "s8"))


def _unpacked(tmp_path, upto: int | None = None) -> list[str]:
    """S4, R2, session 5's call, session 7's two (the kda_hopper_cuda check of the pinned-engine fix, the
    fla-dispatch shards resumed) and session 8's two (those shards resumed to their end; FlashInfer's serving checks
    again after the adapter's capture fix), in that order; ``upto``: only the first so many session archives."""
    import tarfile

    dirs = []
    for name, top, where in SESSION_ARCHIVES[:upto]:
        with tarfile.open(REPO / "bench/results" / name) as tar:
            tar.extractall(tmp_path / where, filter="data")
        dirs.append(str(tmp_path / where / top))
    return [str(S4), str(R2), *dirs]


def test_the_tally_through_session_7_leaves_no_failure_and_no_error(tally, tmp_path, capsys):
    """With session 7's calls: the fixed adapter's records of kda_hopper_cuda decline FE's refused pins themselves
    (no error left to re-declare there), and fla-dispatch's resumed shards add runs with no failure and no error."""
    assert tally.main([*_unpacked(tmp_path, 3), "--json", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "FAILED " not in out and "ERROR " not in out and "NO LONGER REPRODUCE" not in out
    assert out.count("REDECLARED ") == 12 and "REDECLARED cudnn@kda_hopper_cuda" not in out
    counts = json.loads((tmp_path / "t.json").read_text())
    assert counts["cudnn@kda_hopper_cuda causality"] == {"passed": 35, "known": 5, "declined": 77}
    assert counts["fla-dispatch causality"] == {"passed": 227, "known": 5, "declined": 128, "not_run": 18}
    assert counts["fla-dispatch graph_replay"] == {"passed": 157, "known": 5, "declined": 196, "not_run": 20}
    assert not any(c.get("failed") or c.get("error") for c in counts.values())


def test_the_tally_through_session_8_runs_every_fla_dispatch_pair(tally, tmp_path, capsys):
    """Session 8 resumed fla-dispatch's three shards to their end: no pair left unrun, none failed, none errored."""
    assert tally.main([*_unpacked(tmp_path, 4), "--json", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "FAILED " not in out and "ERROR " not in out and "NO LONGER REPRODUCE" not in out
    counts = json.loads((tmp_path / "t.json").read_text())
    assert counts["fla-dispatch causality"] == {"passed": 244, "known": 6, "declined": 128}
    assert counts["fla-dispatch graph_replay"] == {"passed": 168, "known": 6, "declined": 204}
    assert not any(c.get("failed") or c.get("error") or c.get("not_run") for c in counts.values())


def test_flashinfer_graph_replays_run_since_the_capture_fix(tally, tmp_path, capsys):
    """Session 8 ran FlashInfer's serving checks again after the adapter stopped copying to the device inside a
    capture: the 25 graph replays session 5 recorded as "capture refused" ran (23 of flashinfer, 2 of
    flashinfer-decode; all passed), and every remaining decline is an envelope's."""
    assert tally.main([*_unpacked(tmp_path), "--json", str(tmp_path / "t.json")]) == 0
    assert "FAILED " not in capsys.readouterr().out
    counts = json.loads((tmp_path / "t.json").read_text())
    assert counts["flashinfer graph_replay"] == {"passed": 31, "known": 1, "declined": 83}
    assert counts["flashinfer-decode graph_replay"] == {"passed": 2, "declined": 113}
    for backend in ("flashinfer", "flashinfer-decode"):
        for line in (tmp_path / f"s8/d26-s8/{backend}.jsonl").read_text().splitlines():
            assert "capture" not in json.loads(line).get("reason", "")


@pytest.mark.parametrize("doc", ["README.md", "docs/serving.md"])
def test_the_documented_table_is_the_tallys(tally, tmp_path, capsys, doc):
    """Every row of the table in the README and docs/serving.md is a row the tally prints over the recorded results
    (S4 + R2 + S5 + session 7's two calls + session 8's two; W2 for vllm-fla-recurrent and flashkda), and every row
    it prints is there."""
    tally.main([*_unpacked(tmp_path), "--markdown"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    tally.main([str(REPO / "bench/results/serving-h200-w26"), "--backend", "vllm-fla-recurrent", "--backend",
                "flashkda", "--markdown"])
    w2 = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    w2 = [line.replace("| flashkda |", "| flashkda (W2) |").replace("| vllm-fla-recurrent |",
                                                                   "| vllm-fla-recurrent (W2) |") for line in w2]
    text = (REPO / doc).read_text()
    start = text.index(rows[0])
    documented = text[start:text.index("\n\n", start)].splitlines()
    assert documented == rows + w2
