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
