"""bench/lanes.py over backend families (issue 25): each family a run of its own, side by side, with its share of
the workers and its own site directory in front of PYTHONPATH; the pass's numbers summed over the families."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _lanes():
    spec = importlib.util.spec_from_file_location("_bench_lanes_test", REPO / "bench" / "lanes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lanes = _lanes()


def test_a_family_is_a_name_with_optional_workers_and_site_directory():
    assert lanes.parse_family("qla") == ("qla", None, None)
    assert lanes.parse_family("qla:5") == ("qla", 5, None)
    assert lanes.parse_family("jax:3=/tmp/h25-jax") == ("jax", 3, "/tmp/h25-jax")
    assert lanes.parse_family("vllm=/a/b:c") == ("vllm", None, "/a/b:c")  # a PATH may hold os.pathsep
    for bad, said in (("nope", "no backend family 'nope'"), ("qla:0", "JOBS"), ("qla:x", "JOBS")):
        with pytest.raises(argparse.ArgumentTypeError, match=said):
            lanes.parse_family(bad)


def test_families_get_their_registered_backends_and_a_share_of_the_workers():
    known = {"flashqla", "fla-dispatch", "jax", "vllm-fla", "flashkda"}
    specs = [("qla", None, "/q"), ("jax", None, None), ("vllm", 2, "/v")]
    runs = lanes.family_runs(specs, 8, known=known)
    assert runs == [("qla", ["flashqla", "fla-dispatch"], 3, "/q"), ("jax", ["jax"], 3, None),
                    ("vllm", ["vllm-fla", "flashkda"], 2, "/v")]  # 8 - 2 given = 6, split 3 + 3
    assert [r[2] for r in lanes.family_runs([("qla", None, None), ("jax", None, None)], 5, known=known)] == [3, 2]
    # --backend narrows every family; a family left without a backend is dropped
    assert lanes.family_runs(specs, 8, backends=["jax", "flashkda"], known=known) == [
        ("jax", ["jax"], 3, None), ("vllm", ["flashkda"], 2, "/v")]
    assert lanes.family_runs([("nvidia", None, None)], 8, known=known) == []


class _FakeRun:
    """Stands for one ``deltacheck run`` process: writes a run directory with two task records under --out."""

    def __init__(self, argv, env=None, **kw):
        self.argv, self.env = argv, env
        root = Path(argv[argv.index("--out") + 1]) / "20261202-000000-abcdef"
        root.mkdir(parents=True)
        task = {"kind": "task", "backend": argv[argv.index("--backend") + 1],
                "phases": {"check": 1.5, "first_call": 2.0}}
        tasks = [task, task]
        (root / "results.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks), encoding="utf-8")

    def wait(self, timeout=None):
        return 0


def test_a_pass_runs_each_family_side_by_side_and_sums_them(tmp_path, monkeypatch):
    started = []

    def popen(argv, env=None, **kw):
        started.append(_FakeRun(argv, env, **kw))
        return started[-1]

    monkeypatch.setattr(lanes.subprocess, "Popen", popen)
    monkeypatch.setattr(lanes, "registered", lambda: ["flashqla", "fla-dispatch", "jax", "vllm-fla", "flashkda"])
    monkeypatch.setenv("PYTHONPATH", "/mine")
    out, report = tmp_path / "out", tmp_path / "lanes.json"
    assert lanes.main(["--passes", "cold", "-j", "8", "--op", "gdn", "--out", str(out), "--json", str(report),
                       "--family", "qla:5=/site/qla", "--family", "vllm"]) == 0
    assert [r.argv[r.argv.index("--out") + 1] for r in started] == [str(out / "cold" / f) for f in ("qla", "vllm")]
    assert [r.argv[r.argv.index("-j") + 1] for r in started] == ["5", "3"]
    assert [[r.argv[i + 1] for i, x in enumerate(r.argv) if x == "--backend"] for r in started] == [
        ["flashqla", "fla-dispatch"], ["vllm-fla", "flashkda"]]
    assert [r.env["PYTHONPATH"] for r in started] == ["/site/qla:/mine", "/mine"]
    assert all(r.env["DELTACHECK_CACHE_DIR"] == started[0].env["DELTACHECK_CACHE_DIR"] for r in started)  # one cache
    row, = json.loads(report.read_text())
    assert row["tasks"] == 4 and row["worker_s"] == pytest.approx(14.0) and row["exit"] == "qla:0 vllm:0"
    assert row["families"] == {"qla": {"backends": ["flashqla", "fla-dispatch"], "jobs": 5, "exit": 0},
                               "vllm": {"backends": ["vllm-fla", "flashkda"], "jobs": 3, "exit": 0}}


def test_without_families_a_pass_is_one_run_as_before(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(lanes.subprocess, "Popen",
                        lambda argv, env=None, **kw: started.append(_FakeRun(argv, env)) or started[-1])
    report = tmp_path / "lanes.json"
    assert lanes.main(["--passes", "cold", "-j", "8", "--out", str(tmp_path / "out"), "--json", str(report)]) == 0
    run, = started
    assert run.argv[run.argv.index("--out") + 1] == str(tmp_path / "out" / "cold")
    assert run.argv[run.argv.index("-j") + 1] == "8"
    assert [run.argv[i + 1] for i, x in enumerate(run.argv) if x == "--backend"] == list(lanes.LANES_DEFAULT)
    row, = json.loads(report.read_text())
    assert row["exit"] == 0 and row["tasks"] == 2 and row["families"] == {}
