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


def test_a_shard_and_the_threads_reach_each_run(tmp_path, monkeypatch):
    """``--shard 1/4 --threads 1``: a pass over a quarter of the tier (a cold and a warm pass that fit one device call)
    hands both to every run it starts; without them neither is passed."""
    started = []
    monkeypatch.setattr(lanes.subprocess, "Popen",
                        lambda argv, env=None, **kw: started.append(_FakeRun(argv, env)) or started[-1])
    assert lanes.main(["--passes", "cold", "--shard", "1/4", "--threads", "1", "--out", str(tmp_path / "a"),
                       "--json", str(tmp_path / "a.json")]) == 0
    assert lanes.main(["--passes", "cold", "--out", str(tmp_path / "b")]) == 0
    sharded, plain = started
    assert sharded.argv[sharded.argv.index("--shard") + 1] == "1/4"
    assert sharded.argv[sharded.argv.index("--threads") + 1] == "1"
    assert "--shard" not in plain.argv and "--threads" not in plain.argv
    row, = json.loads((tmp_path / "a.json").read_text())
    assert (row["shard"], row["threads"]) == ("1/4", 1)  # a shard's numbers never read as the whole tier's


def _bench_file(path: Path):
    spec = importlib.util.spec_from_file_location(f"_bench_{path.stem}_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench(name):
    return _bench_file(REPO / "bench" / f"{name}.py")


def test_tilelang_compile_log_is_counted_per_kernel_and_a_key_built_twice_is_found(tmp_path):
    """bench/i25_tilelang_compiles.py over TileLang 0.1.15's JIT diagnostics lines (jit/diagnostics.py's format:
    the context fields sorted, values repr'd): compiles, distinct keys, the seconds a key built twice cost."""
    tl = _bench("i25_tilelang_compiles")

    def line(phase, seconds, key, kernel, done=True):
        return (f"2026-12-02 18:30:01  [TileLang:tilelang.jit.diagnostics:INFO] (diagnostics.py:44): TileLang JIT "
                f"phase {'done' if done else 'failed'}: {phase} elapsed={seconds:.3f}s backend='tvm_ffi', "
                f"cache_key='{key}', cache_path='/tmp/c/{key}', kernel='{kernel}', target='cuda -arch=sm_90', "
                f"target_host=None\n")

    log = tmp_path / "A-cold.log"
    log.write_text("".join([
        "[1/10] 10% ETA ?  unrelated progress line\n",
        line("lower", 9.0, "k1", "tilelang_fused_chunk_gdr_fwd_kernel"),
        line("cache.compile", 10.0, "k1", "tilelang_fused_chunk_gdr_fwd_kernel"),
        line("cache.compile", 12.0, "k1", "tilelang_fused_chunk_gdr_fwd_kernel"),  # a second worker, same key
        line("cache.compile", 30.0, "k2", "kernel"),
        line("cache.compile", 5.0, "k3", "kernel", done=False),
    ]))
    s = tl.summarize(tl.phases(log.read_text().splitlines()))
    assert s["compiles"] == 3 and s["distinct_keys"] == 2 and s["failed"] == 1
    assert s["phases"]["lower"] == {"count": 1, "seconds": 9.0}
    assert s["built_again"] == {"keys": 1, "extra_compiles": 1, "extra_seconds": 10.0}
    assert s["kernels"]["kernel"]["seconds"] == 30.0 and s["kernels"]["tilelang_fused_chunk_gdr_fwd_kernel"]["count"] == 2
    out = subprocess.run(["python3", str(REPO / "bench" / "i25_tilelang_compiles.py"), str(log)], capture_output=True,
                         text=True, check=True).stdout
    assert out.startswith("TileLang: 3 kernel compiles (2 distinct cache keys), 1 failed phases")


def test_issue_25_table_counts_a_case_once_takes_the_latest_record_and_shows_served_paths(tmp_path, capsys):
    """bench/results/h25/table.py over a cut, resumed run: a task rerun on --resume replaces its earlier error, a
    worker file never folded is read, and fla-dispatch's engine and FlashInfer's prefill path each get a row."""
    table = _bench_file(REPO / "bench" / "results" / "h25" / "table.py")
    run = tmp_path / "A" / "20261202-180000-abcdef"
    run.mkdir(parents=True)

    def res(backend, case, check, status, **metrics):
        return {"kind": "result", "backend": backend, "op": case.split("-")[0], "case": case, "check": check,
                "status": status, "metrics": metrics}

    records = [
        {"kind": "run", "started": "2026-12-02T18:00:00Z", "case_ids": ["gdn-a", "gdn-b", "kda-c"],
         "backends": ["fla-dispatch", "flashinfer"]},
        res("fla-dispatch", "gdn-a", "forward", "pass", engine="flash_qla", headroom=0.4),
        res("fla-dispatch", "gdn-a", "grad_q", "pass", engine="flash_qla", headroom=0.5),
        res("fla-dispatch", "gdn-b", "forward", "error", engine="triton"),
        {"kind": "resume", "started": "2026-12-02T18:05:00Z"},
        res("fla-dispatch", "gdn-b", "forward", "pass", engine="triton", headroom=0.3),
        res("flashinfer", "gdn-a", "forward", "known", path="cp"),
        res("flashinfer", "kda-c", "forward", "skip"),
    ]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "results.w0.jsonl").write_text(json.dumps(res("flashinfer", "gdn-b", "forward", "pass", path="chunked",
                                                         headroom=0.2)) + "\n")
    table.main([str(run), "--json", str(tmp_path / "t.json")])
    out = capsys.readouterr().out
    rows = {(r["backend"], r["op"]): r for r in json.loads((tmp_path / "t.json").read_text())["rows"]}
    assert (rows["fla-dispatch", "gdn"]["passed"], rows["fla-dispatch", "gdn"]["errored"]) == (2, 0)
    assert rows["fla-dispatch", "gdn"]["worst"] == 0.5 and not rows["fla-dispatch", "gdn"]["finished"]
    assert (rows["flashinfer", "gdn"]["passed"], rows["flashinfer", "gdn"]["known"]) == (1, 1)
    assert rows["flashinfer", "kda"]["declined"] == 1 and rows["flashinfer", "kda"]["ran"] == 0
    for line in ("| fla-dispatch | gdn | backward | `flash_qla` | 1 | 1 |", "| flashinfer | gdn | forward | `cp path` | 1 | 0 |",
                 "| flashinfer | gdn | forward | `chunked path` | 1 | 1 |", "| fla-dispatch | gdn | forward | `triton` | 1 | 1 |"):
        assert line in out, line
