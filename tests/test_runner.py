"""The runner end to end: streaming, errors, crash isolation, repro commands, CLI and pytest agreement."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from child_env import ENV, HANG_GUARD_S, PYTEST, TESTS, run_child

from deltacheck.harness.ci.tiers import select
from deltacheck.harness.cli import main as cli_main
from deltacheck.harness.judge.runner import RunOptions
from deltacheck.harness.run.execute import execute
from deltacheck.harness.run.pool import _Watchdog as _REAL_WATCHDOG

# One small case per op keeps these end-to-end runs to seconds.
CASE_IDS = [
    "gdn-bf16-thd-N2-T[1_20]-H2/2/2-K64-V64-steep-h0-cont[7]-bwd",
    "kda-bf16-bshd-N2-L17-H2/2/2-K64-V64-mild-bwd",
    "gdn2-fp16-thd-N1-T[33]-H2/2/2-K64-V64-typical",
]


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


def run(specs, tmp_path, in_process=True, environ=None, cases=None, jobs=1, resume=None):
    cases = cases if cases is not None else [__import__("deltacheck.cases", fromlist=["Case"]).Case.from_id(c)
                                             for c in CASE_IDS]
    sys.path.insert(0, str(TESTS))
    try:
        return execute(cases, specs, tmp_path, RunOptions(reference="oracle"), in_process=in_process,
                       environ=environ or {}, stream=io.StringIO(), jobs=jobs, resume=resume)
    finally:
        sys.path.remove(str(TESTS))


def test_results_stream_with_header_gates_and_end(tmp_path):
    status, run_dir = run(["fake_backends:Working"], tmp_path)
    recs = records(run_dir)
    assert status == 0
    assert recs[0]["kind"] == "run" and recs[-1]["kind"] == "end" and recs[-1]["exit_status"] == 0
    assert {r["op"] for r in recs if r["kind"] == "gate"} == {"gdn", "kda", "gdn2"}
    results = [r for r in recs if r["kind"] == "result"]
    assert results and all(r["status"] == "pass" for r in results)
    assert {"forward", "state", "continuation_ref", "continuation_self", "grad_q", "determinism"} <= {
        r["check"] for r in results}


def test_exception_becomes_that_case_error_and_the_run_goes_on(tmp_path):
    status, run_dir = run(["fake_backends:Raising"], tmp_path)
    results = [r for r in records(run_dir) if r["kind"] == "result"]
    assert status == 1
    kda = [r for r in results if r["op"] == "kda"]
    assert kda and all(r["status"] == "error" for r in kda)
    assert "illegal memory access (fake)" in kda[0]["reason"]
    assert all(r["status"] == "pass" for r in results if r["op"] != "kda")


def test_hard_crash_is_recorded_and_the_run_continues_in_a_fresh_worker(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    status, run_dir = run(["fake_backends:Crashing"], tmp_path, in_process=False)
    results = [r for r in records(run_dir) if r["kind"] == "result"]
    assert status == 1
    crashed = [r for r in results if r["op"] == "kda"]
    assert crashed and all("worker process died (exit status 139)" in r["reason"] for r in crashed)
    # the cases before and after the crash were all written and judged
    assert {r["op"] for r in results if r["status"] == "pass"} == {"gdn", "gdn2"}


def test_every_failure_carries_a_repro_command_that_reruns_just_that_case(tmp_path):
    status, run_dir = run(["fake_backends:Raising"], tmp_path)
    bad = next(r for r in records(run_dir) if r.get("status") == "error")
    argv = bad["repro"].split()
    assert argv[:2] == ["deltacheck", "run"]
    import shlex

    args = shlex.split(bad["repro"])[1:] + ["--out", str(tmp_path / "again"), "--in-process"]
    sys.path.insert(0, str(TESTS))
    try:
        assert cli_main(args) == 1
    finally:
        sys.path.remove(str(TESTS))
    again = records(next((tmp_path / "again").iterdir()))
    assert {r["case"] for r in again if r["kind"] == "result"} == {bad["case"]}


# --- required mode: the CLI and the pytest plugin agree -----------------------------------------

SITUATIONS = {
    # name: (backend spec, -k expression, DELTACHECK_REQUIRE pair, --limit, exit status when required / when not;
    # 5: nothing was verified, harness/records/exitrule.py)
    "engine declines every case": ("fake_backends:Declining", None, "fake_backends:Declining:kda", 2, 1, 5),
    # a backend that cannot load is an error result in every task, required or not (it is not a decline)
    "backend raises on import": ("broken_backend_module:Obj", None, "broken_backend_module:Obj:kda", 2, 1, 1),
    "-k selects zero cases of the pair": ("fake_backends:Working", "gdn2 and K64-V64", "fake_backends:Working:kda", 2,
                                          1, 0),
    "pair runs": ("fake_backends:Working", "kda and K64-V64", "fake_backends:Working:kda", 2, 0, 0),
    "backward declined on every case": ("fake_backends:NoBackward", "kda and bwd and K64-V64",
                                        "fake_backends:NoBackward:kda", 2, 1, 0),
    "a forward-only selection of a backend without backward": (
        "fake_backends:NoBackward", "kda and K64-V64 and not bwd", "fake_backends:NoBackward:kda", 2, 0, 0),
    "some cases declined outside the envelope, the rest pass": (
        "fake_backends:DeclinesOutsideItsEnvelope", "kda and (K64-V64 or K128-V128) and not bwd",
        "fake_backends:DeclinesOutsideItsEnvelope:kda", 6, 0, 0),
    "cases declined inside the declared envelope": (
        "fake_backends:DeclinesInsideItsEnvelope", "kda and K64-V64 and not bwd",
        "fake_backends:DeclinesInsideItsEnvelope:kda", 6, 1, 0),
    "one case NaN": ("fake_backends:NaNOnOneCase", "kda-bf16-thd-N3-T[0_1_127] or (kda and K64-V64 and not bwd)",
                     "fake_backends:NaNOnOneCase:kda", 3, 1, 1),
}


def cli_outcome(run_cli, spec, k, require, tmp_path, limit=2):
    argv = ["run", "--backend", spec, "--tier", "L0", "--limit", str(limit), "--out", str(tmp_path / "cli"),
            "--in-process", "--no-baseline", "--reference", "oracle"]
    if k:
        argv += ["-k", k]
    return run_cli(argv, env={"DELTACHECK_REQUIRE": require, "NVTE_GDN2_TEST_REQUIRED": None,
                              "NVTE_GDN_TEST_REQUIRED": None})


def pytest_outcome(spec, k, require, limit=2):
    env = dict(ENV, DELTACHECK_REQUIRE=require) if require else dict(ENV)
    argv = [*PYTEST, str(TESTS / "test_matrix.py"), "-q", "-p", "no:cacheprovider",
            "--dc-backend", spec, "--dc-limit", str(limit), "--dc-reference", "oracle", "--dc-no-baseline"]
    if k:
        argv += ["--dc-k", k]
    proc = run_child(argv, env=env, cwd=TESTS.parent)  # forked: the plugin's side of the agreement, not Python's start
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("required", [True, False], ids=["required", "not-required"])
@pytest.mark.parametrize("situation", list(SITUATIONS))
def test_cli_and_pytest_agree(situation, required, tmp_path, run_cli):
    """One required-mode verdict: `deltacheck run` and the pytest plugin reach the same exit status in every
    situation, and say why in the same words (harness/ci/required.py owns the tally and the report)."""
    spec, k, pair, limit, status_required, status_otherwise = SITUATIONS[situation]
    require = pair if required else None
    cli_rc, cli_text = cli_outcome(run_cli, spec, k, require, tmp_path, limit)
    py_rc, py_text = pytest_outcome(spec, k, require, limit)
    assert cli_rc == py_rc, f"CLI exit {cli_rc}, pytest exit {py_rc}\nCLI:\n{cli_text}\npytest:\n{py_text}"
    expected = status_required if required else status_otherwise
    assert cli_rc == expected, f"CLI:\n{cli_text}\npytest:\n{py_text}"
    if expected == 5:  # a run that verified nothing says so, loudly, on both fronts
        assert "NOTHING RAN" in cli_text and "NOTHING RAN" in py_text, (cli_text, py_text)
    if required and status_required and situation != "one case NaN":
        cli_lines = {line.strip() for line in cli_text.splitlines() if line.strip().startswith("* REQUIRED")}
        py_lines = {line.strip() for line in py_text.splitlines() if line.strip().startswith("* REQUIRED")}
        assert cli_lines and cli_lines == py_lines, (cli_lines, py_lines)  # the same report, word for word
    if situation == "backend raises on import":
        assert "cannot import module 'broken_backend_module'" in cli_text + py_text


def test_thousands_of_tasks_through_the_worker_do_not_deadlock(tmp_path, monkeypatch):
    """Pipes are fed by a thread: writing every task before reading would block once both buffers fill."""
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    cases = select("L1")
    status, run_dir = run(["fake_backends:Declining"], tmp_path, in_process=False, cases=cases)
    end = records(run_dir)[-1]
    # every case declined: a finished run that verified nothing (exit 5, harness/records/exitrule.py)
    assert status == 5 and end["kind"] == "end" and end["counts"]["skip"] >= len(cases)


def test_a_decline_without_a_reason_is_reported_not_silent(tmp_path):
    status, run_dir = run(["fake_backends:Mute"], tmp_path)
    skips = [r for r in records(run_dir) if r.get("status") == "skip"]
    assert skips and all("declined without giving a reason" in r["reason"] for r in skips)


def test_malformed_require_setting_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DELTACHECK_REQUIRE", "cudnn")
    assert cli_main(["run", "--backend", "oracle", "--limit", "1", "--out", str(tmp_path), "--in-process"]) == 2


def test_the_reference_is_never_the_backend_under_test():
    from deltacheck.cases import Case
    from deltacheck.harness.judge.expected import reference_name

    short = Case.from_id(CASE_IDS[0])
    long = Case(op="gdn", layout="thd", seqlens=(3000,), H=2, HK=2, HV=2, K=64, V=64, tier="L1")
    assert reference_name(short, "auto", "oracle") == "chunked"
    assert reference_name(long, "auto", "chunked") == "oracle"
    assert reference_name(long, "auto", "cudnn") == "chunked"


def test_pytest_runs_write_a_run_directory_that_reports_read(tmp_path):
    argv = [sys.executable, "-m", "pytest", str(TESTS / "test_matrix.py"), "-q", "-p", "no:cacheprovider",
            "--dc-backend", "fake_backends:Working", "--dc-limit", "3", "--dc-reference", "oracle",
            "--dc-no-baseline", "--dc-k", "K64-V64", "--dc-out", str(tmp_path), "-n", "2"]
    proc = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=TESTS.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list(tmp_path.iterdir())
    recs = records(run_dir)
    assert recs[0]["kind"] == "run" and recs[-1]["kind"] == "end"
    results = [r for r in recs if r["kind"] == "result"]
    assert len({r["case"] for r in results}) == 3 and recs[-1]["counts"] == {"pass": len(results)}
    assert not list(run_dir.glob("results.gw*.jsonl"))  # the workers' parts were folded in
    assert cli_main(["report", str(run_dir)]) == 0 and (run_dir / "summary.md").exists()


def test_a_crash_in_the_backward_keeps_the_forward_results_already_judged(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    status, run_dir = run(["fake_backends:CrashingBackward"], tmp_path, in_process=False)
    gdn = {r["check"]: r for r in records(run_dir) if r.get("kind") == "result" and r["op"] == "gdn"}
    assert status == 1
    assert gdn["forward"]["status"] == "pass" and gdn["state"]["status"] == "pass"
    assert gdn["grad_q"]["status"] == "error" and "worker process died" in gdn["grad_q"]["reason"]
    assert all(r["status"] == "pass" for r in records(run_dir) if r.get("kind") == "result" and r["op"] != "gdn")


# --- --jobs: parallel workers on one queue that keeps each on a compile family ----------------------------------


def _comparable(run_dir: Path) -> list[dict]:
    """The result records without timings, in a fixed order."""
    results = [{k: v for k, v in r.items() if k != "seconds"} for r in records(run_dir) if r["kind"] == "result"]
    return sorted(results, key=lambda r: (r["case"], r["backend"], r["check"]))


def test_jobs_give_the_results_one_worker_gives(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    specs = ["fake_backends:Working", "fake_backends:Raising"]
    status1, one = run(specs, tmp_path / "one", in_process=False)
    status3, three = run(specs, tmp_path / "three", in_process=False, jobs=3)
    assert status1 == status3 == 1  # Raising errs on kda in both
    assert _comparable(three) == _comparable(one) and len(_comparable(one)) > 20
    recs = records(three)
    assert recs[0]["kind"] == "run" and recs[-1]["kind"] == "end"
    assert not list(three.glob("results.w*.jsonl")), "worker files must be folded into results.jsonl"


def test_a_hard_crash_in_one_worker_is_recorded_and_the_others_finish(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    status, run_dir = run(["fake_backends:Crashing"], tmp_path, in_process=False, jobs=3)
    results = [r for r in records(run_dir) if r["kind"] == "result"]
    assert status == 1
    crashed = [r for r in results if r["op"] == "kda"]
    assert crashed and all("worker process died (exit status 139)" in r["reason"] for r in crashed)
    assert {r["op"] for r in results if r["status"] == "pass"} == {"gdn", "gdn2"}
    assert records(run_dir)[-1]["kind"] == "end"


def test_the_queue_keeps_workers_on_their_family_spreads_new_ones_and_hands_out_every_task_once():
    from deltacheck.harness.run.pool import TaskQueue, compile_family

    cases = select(tier="L0")
    tasks = list(enumerate((c, s) for c in cases for s in ("fla", "cudnn")))
    queue = TaskQueue(tasks)
    family = lambda task: compile_family(*task[1])  # noqa: E731
    sizes = {}
    for t in tasks:
        sizes[family(t)] = sizes.get(family(t), 0) + 1
    first = queue.take()
    assert sizes[family(first)] == max(sizes.values())  # the biggest family starts first
    second = queue.take()
    assert family(second) != family(first)  # a new worker starts a family nobody is on
    again = queue.take(family(first))
    assert family(again) == family(first)  # a worker stays on its family while it has tasks
    handed = [first, second, again]
    workers = [family(second), family(again)]
    k = 0
    while True:  # two workers drain the rest, alternating
        task = queue.take(workers[k % 2])
        if task is None:
            break
        workers[k % 2] = family(task)
        handed.append(task)
        k += 1
    assert sorted(i for i, _ in handed) == list(range(len(tasks)))  # every task exactly once
    assert TaskQueue([]).take() is None


def test_a_cases_flashqla_and_fla_dispatch_tasks_go_to_one_worker_back_to_back():
    """FLA's dispatch serves GDN through FlashQLA's kernels: both backends' tasks of a case are one family, handed
    one after the other, so the second finds the first's TileLang kernels built in its process. Other backends and
    ops keep families of their own."""
    from deltacheck.harness.run.pool import TaskQueue, compile_family

    cases = [c for c in select(tier="L0", op="gdn") if c.K == c.V == 128]
    specs = ("fla-dispatch", "flashqla", "fla")
    tasks = list(enumerate((c, s) for c in cases for s in specs))
    assert compile_family(cases[0], "fla-dispatch") == compile_family(cases[0], "flashqla")
    assert compile_family(cases[0], "fla") != compile_family(cases[0], "flashqla")
    kda = select(tier="L0", op="kda")[0]
    assert compile_family(kda, "fla-dispatch")[0] == "fla-dispatch"  # no FlashQLA kernel for KDA
    queue = TaskQueue(tasks)
    family = compile_family(cases[0], "flashqla")
    handed, last = [], None
    while (task := queue.take(family, last)) is not None and compile_family(*task[1]) == family:
        handed.append(task[1])
        last = task[1][0].id
    assert len(handed) == 2 * sum(compile_family(c, "flashqla") == family for c in cases)
    pairs = [handed[i:i + 2] for i in range(0, len(handed), 2)]
    assert all(a[0].id == b[0].id and (a[1], b[1]) == ("fla-dispatch", "flashqla") for a, b in pairs)


def test_workers_sharing_a_family_never_split_a_case_between_them():
    """Three workers on the shared FlashQLA family (more workers than families, as at -j 8): each case's
    fla-dispatch and flashqla tasks go to one worker, the second right after the first, never to two workers at
    once; a fresh worker after a crash gets the crashed case's held task; every task is handed exactly once."""
    from deltacheck.harness.run.pool import TaskQueue, compile_family

    cases = [c for c in select(tier="L0", op="gdn") if c.K == c.V == 128 and c.io_dtype == "bf16"]
    tasks = list(enumerate((c, s) for c in cases for s in ("fla-dispatch", "flashqla")))
    family = compile_family(cases[0], "flashqla")
    assert all(compile_family(*t[1]) == family for t in tasks) and len(cases) >= 6
    queue = TaskQueue(tasks)
    running = [queue.take(), queue.take(), queue.take()]  # three workers start: three different cases
    assert len({t[1][0].id for t in running}) == 3 and all(t[1][1] == "fla-dispatch" for t in running)
    handed = list(running)
    # worker 0 "crashes": its fresh worker asks with the crashed task's family and case, and gets the held task
    crashed = running[0]
    again = queue.take(family, crashed[1][0].id)
    assert again[1] == (crashed[1][0], "flashqla")
    handed.append(again)
    running[0] = again
    k = 0
    while any(t is not None for t in running):
        w = k % 3
        k += 1
        if running[w] is None:
            continue
        done = running[w]
        nxt = queue.take(family, done[1][0].id)
        if done[1][1] == "fla-dispatch":  # the case's other task comes next, to the same worker
            assert nxt is not None and nxt[1] == (done[1][0], "flashqla")
        if nxt is not None:
            others = {t[1][0].id for i, t in enumerate(running) if i != w and t is not None}
            assert nxt[1][0].id not in others  # never a case another worker is on
            handed.append(nxt)
        running[w] = nxt
    assert sorted(i for i, _ in handed) == list(range(len(tasks)))


def test_a_slow_family_does_not_hold_back_the_others(tmp_path, monkeypatch):
    """Work balances itself: with two workers, one stuck on a long task, the other does everything else."""
    from deltacheck.harness.run.pool import TaskQueue

    cases = [__import__("deltacheck.cases", fromlist=["Case"]).Case.from_id(c) for c in CASE_IDS]
    queue = TaskQueue(list(enumerate((c, "b") for c in cases)))
    slow = queue.take()  # worker 1 takes one task and never comes back
    rest = []
    previous = None
    while (task := queue.take(previous)) is not None:
        rest.append(task)
        previous = (task[1][1], task[1][0].op, task[1][0].io_dtype, task[1][0].K, task[1][0].V)
    assert len(rest) == len(CASE_IDS) - 1 and slow not in rest


def test_with_several_gpus_each_worker_is_pinned_to_one(tmp_path, monkeypatch):
    from deltacheck.harness.run import pool

    seen, threads = {}, {}
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the suite's own setting (conftest.py) is not a user's

    def fake_workers(queue, results_path, opts, on_done, env=None, task_timeout=None):
        seen[results_path.name] = env["CUDA_VISIBLE_DEVICES"]
        threads[results_path.name] = env["OMP_NUM_THREADS"]

    monkeypatch.setattr(pool, "visible_gpus", lambda: ["4", "6"])
    monkeypatch.setattr(pool, "run_in_workers", fake_workers)
    cases = [select(tier="L0", op=op)[0] for op in ("gdn", "kda", "gdn2")]
    execute(cases, ["oracle"], tmp_path, RunOptions(device="cuda", reference="oracle"), jobs=3,
            environ={}, stream=io.StringIO())
    assert seen == {"results.w0.jsonl": "4", "results.w1.jsonl": "6", "results.w2.jsonl": "4"}
    # each worker gets its share of the cores, not one thread per core (oversubscription ran 2-5x slower)
    assert set(threads.values()) == {str(max(1, (os.cpu_count() or 1) // 3))}
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # a user's own setting is kept
    execute(cases, ["oracle"], tmp_path, RunOptions(device="cuda", reference="oracle"), jobs=3,
            environ={}, stream=io.StringIO())
    assert set(threads.values()) == {"7"}


@pytest.mark.parametrize("pinned, smi, expected", [
    ("", "GPU 0: H200\n", []),
    ("2,3", "GPU 0: H200\n", ["2", "3"]),
    (None, "GPU 0: NVIDIA H200 (UUID: x)\nGPU 1: NVIDIA H200 (UUID: y)\n", ["0", "1"]),
    (None, OSError("no nvidia-smi"), []),
])
def test_visible_gpus(pinned, smi, expected):
    from types import SimpleNamespace

    from deltacheck.harness.machine.environment import visible_gpus

    def fake_run(*args, **kwargs):
        if isinstance(smi, Exception):
            raise smi
        return SimpleNamespace(stdout=smi)

    environ = {} if pinned is None else {"CUDA_VISIBLE_DEVICES": pinned}
    assert visible_gpus(environ, run=fake_run) == expected


@pytest.mark.parametrize("jobs", ["0", "-1", "two"])
def test_jobs_must_be_a_positive_whole_number(jobs, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["run", "--backend", "oracle", "--limit", "1", "--out", str(tmp_path), "--jobs", jobs])
    assert exc.value.code == 2 and "expected a whole number >= 1" in capsys.readouterr().err


def test_jobs_with_in_process_is_a_usage_error(tmp_path, capsys):
    assert cli_main(["run", "--backend", "oracle", "--limit", "1", "--out", str(tmp_path), "-j", "2",
                     "--in-process"]) == 2
    assert "--in-process" in capsys.readouterr().err


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _stop_a_parallel_run(tmp_path, backend: str, signum: int, target: str):
    """Start ``run -j 3`` of CASE_IDS on ``backend`` (its kda task hangs), wait until the two other tasks are judged,
    send ``signum`` to the controller or its whole process group; (return code, stderr, worker pids, records)."""
    import signal
    import time

    argv = [sys.executable, "-m", "deltacheck", "run", "-j", "3", "--backend", backend,
            "--reference", "oracle", "--out", str(tmp_path)]
    for case_id in CASE_IDS:
        argv += ["--case", case_id]
    proc = subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + HANG_GUARD_S  # a hang guard only
        while time.monotonic() < deadline:  # until the two tasks that do not hang have finished
            parts = "".join(p.read_text() for p in tmp_path.glob("*/results.w*.jsonl"))
            if parts.count('"check": "determinism"') >= 2:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the non-hanging tasks did not finish within {HANG_GUARD_S} s")
        workers = _children(proc.pid)
        if target == "controller":
            proc.send_signal(signum)
        else:
            os.killpg(proc.pid, signum)
        _, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        proc.kill()
    (run_dir,) = tmp_path.iterdir()
    assert not list(run_dir.glob("results.w*.jsonl")), f"worker files must be folded on {signal.Signals(signum).name}"
    assert workers and all(not Path(f"/proc/{pid}").exists() for pid in workers), "a worker outlived the run"
    return proc.returncode, err, records(run_dir)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads worker pids from /proc (Linux)")
@pytest.mark.parametrize("target", ["controller", "process group"])  # `kill PID` / `timeout` and Ctrl-C
def test_sigterm_ends_a_parallel_run_keeping_every_judged_check_and_no_worker(tmp_path, target):
    import signal

    code, err, recs = _stop_a_parallel_run(tmp_path, "fake_backends:Hanging", signal.SIGTERM, target)
    assert code == 128 + signal.SIGTERM, err
    assert "SIGTERM" in err and "results.jsonl" in err
    assert recs[-1]["kind"] != "end"  # an interrupted run says it did not finish
    judged = {(r["op"], r["check"]) for r in recs if r["kind"] == "result" and r["status"] == "pass"}
    assert {("gdn", "determinism"), ("gdn2", "determinism"), ("gdn", "forward")} <= judged
    # the interrupted kda task was not a kernel crash and must not be reported as one
    assert not [r for r in recs if r["kind"] == "result" and r["status"] != "pass"]


def test_a_report_reads_worker_files_a_killed_run_never_folded(tmp_path):
    from deltacheck.reports.load import load_run

    # the records of a finished run (in this process: the worker files below are written by hand, as a kill leaves them)
    _, run_dir = run(["fake_backends:Working"], tmp_path)
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    head = [ln for ln in lines if json.loads(ln)["kind"] in ("run", "gate")]
    body = [ln for ln in lines if json.loads(ln)["kind"] == "result"]
    # as SIGKILL leaves it: header and gates in results.jsonl, the results still in two worker files
    (run_dir / "results.jsonl").write_text("\n".join(head) + "\n")
    (run_dir / "results.w0.jsonl").write_text("\n".join(body[:5]) + "\n")
    (run_dir / "results.w1.jsonl").write_text("\n".join(body[5:]) + "\n")
    loaded = load_run(run_dir, warn=False)
    assert len(loaded.results) == len(body) and not loaded.finished
    assert any("never folded" in str(p) and "results.w1.jsonl" in str(p) for p in loaded.problems)


# --- --resume: continue an interrupted run in its own directory --------------------------------------


def _interrupt(run_dir: Path, drop) -> None:
    """Rewrite results.jsonl as an interruption leaves it: no end record, and without the results ``drop``
    selects."""
    kept = [r for r in records(run_dir) if r["kind"] != "end" and not (r["kind"] == "result" and drop(r))]
    (run_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))


def _after_resume(run_dir: Path) -> list[dict]:
    recs = records(run_dir)
    start = max(i for i, r in enumerate(recs) if r["kind"] == "resume")
    return recs[start + 1:]


def test_resume_runs_only_what_the_interrupted_run_did_not_judge(tmp_path):
    from deltacheck.reports.load import load_run

    _, run_dir = run(["fake_backends:Working"], tmp_path)
    before = {(r["case"], r["check"]) for r in records(run_dir) if r["kind"] == "result"}
    kda, gdn2 = CASE_IDS[1], CASE_IDS[2]
    # kda half-judged (its gradients lost), gdn2 never reached, gdn complete
    _interrupt(run_dir, lambda r: (r["case"] == kda and r["check"].startswith("grad_")) or r["case"] == gdn2)
    status, again = run(["fake_backends:Working"], tmp_path / "unused", resume=run_dir)
    assert status == 0 and again == run_dir and not (tmp_path / "unused").exists()
    rerun = {r["case"] for r in _after_resume(run_dir) if r["kind"] == "result"}
    assert rerun == {kda, gdn2}, "only the half-judged and the unreached task run again"
    loaded = load_run(run_dir, warn=False)
    assert loaded.finished and len(loaded.resumes) == 1
    assert {(r["case"], r["check"]) for r in loaded.results} == before  # each check once, none lost
    assert len(loaded.results) == len(before)


def test_resume_reruns_a_half_judged_task_and_the_summary_lists_final_results(tmp_path, capsys):
    # (the legacy shim that treated an old build's "killed by SIGTERM" records as unjudged is gone; the
    # closing-summary property it guarded is asserted on a half-judged task instead)
    _, run_dir = run(["fake_backends:Working"], tmp_path)
    recs = records(run_dir)
    for r in recs:
        if r["kind"] == "result" and r["case"] == CASE_IDS[0] and r["check"] == "determinism":
            r.update(status="error", reason="stage raised before the run was cut (simulated)")
    kept = [r for r in recs if r["kind"] != "end"
            and not (r["kind"] == "result" and r["case"] == CASE_IDS[0] and r["check"] == "state")]
    (run_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    assert cli_main(["run", "--backend", "fake_backends:Working", "--reference", "oracle", "--in-process",
                     *[a for c in CASE_IDS for a in ("--case", c)], "--resume", str(run_dir)]) == 0
    assert {r["case"] for r in _after_resume(run_dir) if r["kind"] == "result"} == {CASE_IDS[0]}
    # the closing summary lists what failed in the end, not the records the rerun replaced
    assert "stage raised before the run was cut" not in capsys.readouterr().out


def test_resuming_a_finished_run_runs_nothing_and_keeps_required_pairs_satisfied(tmp_path, capsys):
    _, run_dir = run(["fake_backends:Working"], tmp_path)
    status, _ = run(["fake_backends:Working"], tmp_path, resume=run_dir,
                    environ={"DELTACHECK_REQUIRE": "fake_backends:Working:kda"})
    assert status == 0, "the required pair executed its cases before the resume; zero new ones is not a failure"
    assert [r["kind"] for r in _after_resume(run_dir)] == ["end"]
    assert f"{len(CASE_IDS)} of {len(CASE_IDS)} tasks were judged before" in capsys.readouterr().err


@pytest.mark.parametrize("problem", ["no run directory", "another environment"])
def test_resume_refuses_what_it_cannot_continue(tmp_path, capsys, problem):
    target = tmp_path / "nowhere"
    if problem == "another environment":
        _, target = run(["fake_backends:Working"], tmp_path)
        recs = records(target)
        recs[0]["env"]["versions"]["torch"] = "1.0.0"
        (target / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert cli_main(["run", "--backend", "oracle", "--limit", "1", "--in-process", "--resume", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("deltacheck run: --resume") and len(err.strip().splitlines()) == 1
    if problem == "another environment":
        assert "torch 1.0.0" in err and "deltacheck compare" in err


def test_the_task_watchdog_kills_a_worker_that_outlives_its_seconds_and_not_one_that_answers():
    from deltacheck.harness.run.pool import _Watchdog

    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        dog = _Watchdog(hung, 0.5)
        dog.arm()
        assert hung.wait(timeout=HANG_GUARD_S) == -9 and dog.fired  # a process that never ends on its own
    finally:
        hung.kill()
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    dog = _Watchdog(quick, 0.5)
    dog.arm()
    quick.wait(timeout=HANG_GUARD_S)
    dog.disarm()  # the answer came: the timer is gone and can no longer fire
    assert dog._timer is None and not dog.fired


class _FiresOnTheHang:
    """A task watchdog that fires when the hung task says it has begun hanging, never on a task that is merely
    slow: what the kill / record / go-on path does is then independent of how fast this machine runs the others
    (the timer itself is tested above)."""

    def __init__(self, proc, seconds):
        self._dog, self._stop = _REAL_WATCHDOG(proc, seconds), None

    @property
    def fired(self):
        return self._dog.fired

    def arm(self):
        import threading

        self.disarm()
        stop = self._stop = threading.Event()

        def watch():
            while not stop.wait(0.05):
                if os.path.exists(os.environ[MARKER]):
                    os.remove(os.environ[MARKER])
                    self._dog._fire()
                    return

        threading.Thread(target=watch, daemon=True).start()

    def disarm(self):
        if self._stop is not None:
            self._stop.set()


MARKER = "DELTACHECK_TEST_HANG_MARKER"


def test_a_task_over_the_timeout_is_killed_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    from deltacheck.harness.run import pool

    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    monkeypatch.setenv(MARKER, str(tmp_path / "hanging"))
    monkeypatch.setattr(pool, "_Watchdog", _FiresOnTheHang)
    sys.path.insert(0, str(TESTS))
    try:  # the hung kda task sleeps 600 s: the hang guard, should the watchdog never fire
        status, run_dir = execute([__import__("deltacheck.cases", fromlist=["Case"]).Case.from_id(c) for c in CASE_IDS],
                                  ["fake_backends:Hanging"], tmp_path / "runs", RunOptions(reference="oracle"),
                                  environ={}, stream=io.StringIO(), task_timeout=20)
    finally:
        sys.path.remove(str(TESTS))
    results = [r for r in records(run_dir) if r["kind"] == "result"]
    assert status == 1
    hung = [r for r in results if r["op"] == "kda"]
    assert hung and all(r["status"] == "error" and "timed out" in r["reason"] for r in hung)
    assert "--task-timeout 20 s" in hung[0]["reason"]
    assert {r["op"] for r in results if r["status"] == "pass"} == {"gdn", "gdn2"}
    assert {r["status"] for r in results if r["op"] != "kda"} == {"pass"}


def test_an_interrupt_a_library_turns_into_an_exception_is_not_recorded_as_the_kernels_error(tmp_path, monkeypatch):
    """`timeout -s INT` reaches every worker; a library that swallows the KeyboardInterrupt (tvm-ffi made TileLang's
    interrupted nvcc compile a bare RuntimeError on the H200, issue 25) must not turn it into judged errors: the
    worker dies by SIGINT (the pool's interruption, never a crash) and writes nothing of the task in flight, so
    `--resume` runs it again."""
    import signal
    import threading
    import time

    from deltacheck.cases import Case
    from deltacheck.harness.run import pool

    marker = tmp_path / "hanging"
    env = dict(ENV, **{MARKER: str(marker)})
    results = tmp_path / "results.jsonl"
    client = pool.WorkerClient(results, RunOptions(reference="oracle"), env=env)
    gdn, kda = Case.from_id(CASE_IDS[0]), Case.from_id(CASE_IDS[1])
    spec = "fake_backends:InterruptToRuntimeError"
    assert not client.run(gdn, spec).get("crashed")  # a task before the interrupt is judged and kept

    def interrupt_once_hung():
        deadline = time.monotonic() + HANG_GUARD_S
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(client._proc.pid, signal.SIGINT)

    threading.Thread(target=interrupt_once_hung, daemon=True).start()
    with pytest.raises(pool.Terminated, match="SIGINT"):
        client.run(kda, spec)
    recs = [json.loads(line) for line in results.read_text().splitlines()]
    assert {r["case"] for r in recs} == {gdn.id}, [r.get("reason") for r in recs if r["case"] == kda.id]
    assert all(r["status"] == "pass" for r in recs if r["kind"] == "result")


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_task_timeout_must_be_positive_seconds(value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["run", "--backend", "oracle", "--limit", "1", "--out", str(tmp_path), "--task-timeout", value])
    assert exc.value.code == 2 and "expected seconds > 0" in capsys.readouterr().err


def test_dry_run_counts_what_would_run_and_why_the_rest_is_declined_and_runs_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    assert cli_main(["run", "--dry-run", "--op", "kda", "--backend", "fake_backends:Declining",
                     "--backend", "fake_backends:NoBackward", "--backend", "oracle", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    n_kda = len(select(tier="L0", op="kda"))
    n_bwd = sum(c.backward for c in select(tier="L0", op="kda"))
    assert f"{n_kda} cases; nothing was run" in out
    assert f"{n_kda} × fake engine declined: head dim must be 256" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert f"would run {n_kda:>4} (backward on 0)" in lines["fake_backends:NoBackward:kda"]  # run.py's {:>4}
    assert f"would run {n_kda:>4} (backward on {n_bwd})" in lines["oracle:kda"]
    assert not list(tmp_path.iterdir()), "a dry run writes no run directory"


def test_continuation_self_applies_the_negligible_rule_to_a_decayed_state(tmp_path):
    """H200, FLA chunk_gdn2, L0 (2026-12-01): the final state had decayed to ~1e-46 and the chained state 'differed
    from the single call's by rel RMS 1.0'. Both are negligible (FLA's absolute rule), so the check passes."""
    case = "gdn2-fp16-sbhd-N1-L128-H4/4/4-K128-V128-typical-state_bf16-beta_zero-l2norm-safegate-alog-dtbias-scale1.0-h0-cont[65]"
    from deltacheck.cases import Case
    from deltacheck.harness.judge.runner import CaseRunner
    from deltacheck.harness.run.task import run_task

    sys.path.insert(0, str(TESTS))
    try:
        results = {r.check: r for r in run_task(CaseRunner(RunOptions(reference="oracle")), Case.from_id(case),
                                                "fake_backends:TinyState", None)}
    finally:
        sys.path.remove(str(TESTS))
    r = results["continuation_self"]
    assert r.metrics["state_rel_rms_vs_self"] > 0.5 and r.status == "pass", r.reason


# --- torch threads: each process's share of the cores, an explicit setting respected, the header saying it -------


def test_each_process_gets_its_share_of_the_free_cores_unless_told():
    from deltacheck.harness.run.pool import torch_threads

    assert torch_threads(1, environ={}, cores=8, load=0.0)[0] == 8
    assert torch_threads(4, environ={}, cores=8, load=0.0)[0] == 2
    assert torch_threads(1, environ={}, cores=2, load=5.3)[0] == 1  # a busy shared machine: one thread, not two
    assert torch_threads(3, environ={}, cores=2, load=0.0)[0] == 1
    assert torch_threads(4, environ={"OMP_NUM_THREADS": "3"}, cores=8, load=0.0) == (3, "OMP_NUM_THREADS")
    assert torch_threads(4, 5, environ={"OMP_NUM_THREADS": "3"}, cores=8, load=0.0) == (5, "--threads")
    assert torch_threads(1, environ={"OMP_NUM_THREADS": "many"}, cores=2, load=0.0)[0] == 2


@pytest.mark.parametrize("where", ["worker", "in-process"])
def test_threads_reach_the_process_that_runs_the_tasks_and_the_header(where, tmp_path, run_cli):
    import torch

    before = torch.get_num_threads()
    try:
        rc, text = run_cli(["run", "--backend", "fake_backends:ReportsThreads", "--case", CASE_IDS[0], "--threads", "1",
                            "--out", str(tmp_path), "--reference", "oracle", "--no-baseline",
                            *(["--in-process"] if where == "in-process" else [])],
                           env={"OMP_NUM_THREADS": "2", "PYTHONPATH": ENV["PYTHONPATH"]})
    finally:
        torch.set_num_threads(before)
    (run_dir,) = tmp_path.iterdir()
    recs = records(run_dir)
    assert recs[0]["options"]["threads"] == 1, recs[0]
    skips = {r["reason"] for r in recs if r["kind"] == "result"}
    assert skips == {"torch threads in this process: 1"}, (skips, text)


def test_env_says_how_many_torch_threads_a_run_would_use(run_cli):
    rc, text = run_cli(["env"], env={"OMP_NUM_THREADS": "1"})
    assert "torch threads: 1 per process for a one-process run (OMP_NUM_THREADS)" in text, text
