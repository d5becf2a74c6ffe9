"""Planning a run, running it crash-safe, and the ``run`` / ``verify`` commands.

The tasks (case x backend) run in a worker process that streams results into ``results.jsonl`` and
tells the parent which task it starts and finishes. If the worker dies hard (segfault, CUDA illegal
address, ``os._exit``), everything it wrote is already on disk; the parent records an ``error`` for
the task in flight and continues with the rest in a fresh worker. Workers take one task at a time from
a ``TaskQueue`` that keeps each on one compile family. With ``--jobs N``, N such workers share the queue,
each streaming to its own ``results.wK.jsonl``, folded into ``results.jsonl`` when they end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from deltacheck import __version__
from deltacheck.cases import Case, CaseError, select
from deltacheck.cases.support import OPS

from . import gate
from .backends.base import BackendLoadError, Verdict, get_backend
from .results import (
    SCHEMA,
    Result,
    ResultStream,
    end_record,
    fingerprint,
    fold_parts,
    latest_per_check,
    read_records,
    utc_now,
)
from .rundir import new_run_dir, provenance
from .runner import CaseRunner, RunOptions, checks_for, repro_command

FUSED_DEFAULT = ("cudnn", "fla")


def pair_availability(backend, spec: str, op: str, env) -> Verdict:
    """The backend x op verdict before any case: our floors, then the adapter's own pair check."""
    if op not in backend.ops:
        return Verdict.no(f"{spec} does not implement {op}")
    verdict = gate.pair_verdict(backend.name, op, env)
    available = getattr(backend, "available", None)
    if verdict.runnable and available is not None:
        own = available(op, env)
        if not own.runnable:
            return own
        verdict = Verdict(True, "", verdict.backward and own.backward,
                          verdict.backward_reason or own.backward_reason, verdict.notes + own.notes)
    return verdict


class Progress:
    """Progress with ETA: a one-line bar on a terminal; elsewhere (CI logs, a file) a plain line at most
    once a minute, so a long or stuck run shows where it is without flooding the log."""

    LOG_EVERY_S = 60.0

    def __init__(self, total: int, stream=sys.stderr):
        self.total, self.stream, self.done, self.t0 = total, stream, 0, time.monotonic()
        self.bar = stream.isatty() and not os.environ.get("CI")
        self.last_line = self.t0
        self.open = True

    def update(self, label: str) -> None:
        self.done += 1
        now = time.monotonic()
        elapsed = now - self.t0
        eta = elapsed / self.done * (self.total - self.done)
        line = f"[{self.done}/{self.total}] {100 * self.done // max(self.total, 1)}% ETA {eta:5.0f}s  {label}"
        if self.bar:
            self.stream.write("\r" + line[:120].ljust(120))
        elif now - self.last_line >= self.LOG_EVERY_S:
            self.last_line = now
            self.stream.write(f"{line}  (elapsed {elapsed:.0f}s)\n")
        else:
            return
        self.stream.flush()

    def close(self) -> None:
        if self.bar and self.open:
            self.stream.write("\n")
        self.open = False


def case_verdict(backend, spec: str, case: Case, env) -> Verdict:
    """The backend's verdict on one case (what ``check`` raises propagates), with every decline and every
    refused backward carrying a reason: a silent one would become a silent skip."""
    if case.op not in backend.ops:
        return Verdict.no(f"{spec} does not implement {case.op}")
    verdict = backend.check(case, env)
    if not verdict.runnable and not verdict.reason:
        return Verdict.no(f"{spec}.check() declined without giving a reason")
    if verdict.runnable and not verdict.backward and not verdict.backward_reason:
        return Verdict(True, "", False, f"{spec}.check() refused the backward without giving a reason",
                       verdict.notes)
    return verdict


def run_task(runner: CaseRunner, case: Case, spec: str, env, sink=None) -> list[Result]:
    """All checks of one case x backend, each handed to ``sink`` as soon as it exists; a backend that
    cannot even load becomes an error result."""
    emitted: list[Result] = []

    def emit(result: Result) -> None:
        emitted.append(result)
        if sink is not None:
            sink(result)

    def finish(extra: list[Result]) -> list[Result]:
        for r in extra:
            emit(r)
        return emitted

    try:
        backend = get_backend(spec)
    except BackendLoadError as exc:
        base = dict(case=case.id, backend=spec, op=case.op, repro=repro_command(case, spec))
        return finish([Result(check="forward", status="error", reason=str(exc), **base)])
    base = dict(case=case.id, backend=spec, op=case.op, repro=repro_command(case, spec))
    try:
        verdict = case_verdict(backend, spec, case, env)
    except Exception as exc:  # noqa: BLE001 - a crashing check is that case's error, not the run's end
        return finish([Result(check="forward", status="error",
                              reason=f"check() raised {type(exc).__name__}: {exc}", **base)])
    try:
        runner.run(case, backend, spec, verdict, env, sink=emit)
    except Exception as exc:  # noqa: BLE001 - the harness's own failure on one case must not end the run
        import traceback

        return finish([Result(check="forward", status="error", reason=f"harness error: {type(exc).__name__}: {exc}",
                              metrics={"traceback": traceback.format_exc(limit=-4)}, **base)])
    return emitted


def _task_summary(results: list[Result]) -> dict:
    statuses = Counter(r.status for r in results)
    fwd = next((r for r in results if r.check == "forward"), None)
    executed = fwd is not None and fwd.status in ("pass", "fail")
    grads = [r for r in results if r.check.startswith("grad_")]
    return {
        "statuses": dict(statuses),
        "executed": executed,
        "declined": fwd is not None and fwd.status == "skip",
        "decline_reason": fwd.reason if fwd is not None and fwd.status == "skip" else "",
        # a backward case that ran forward: were its gradients judged, or declined?
        "backward_case": executed and bool(grads),
        "backward_ran": any(r.status in ("pass", "fail") for r in grads),
        "backward_reason": next((r.reason for r in grads if r.status == "skip"), ""),
    }


# --- the worker process --------------------------------------------------------------------------


def worker_main() -> int:
    """Entry of ``python -m deltacheck.harness.worker``: a config line, then one task per line on stdin
    (the parent sends the next after each ``DONE``); results stream to the file the config names."""
    config = json.loads(sys.stdin.readline())
    opts = RunOptions(**config["opts"])
    runner = CaseRunner(opts)
    env = gate.probe_env()
    with ResultStream(config["results"]) as stream:
        for line in sys.stdin:
            task = json.loads(line)
            case = Case.from_id(task["case"])
            results = run_task(runner, case, task["backend"], env, sink=stream.write)
            print(f"DONE {task['i']} {json.dumps(_task_summary(results))}", flush=True)
    return 0


# Worker processes alive right now, so an interrupted run can end them instead of leaving them running.
_LIVE_WORKERS: set[subprocess.Popen] = set()


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI timeout, ``kill``) turned into an interrupt, so a run ends the way Ctrl-C ends it."""


def _raise_terminated(signum, frame):
    raise Terminated("terminated by SIGTERM")


# Set while a run is ending on purpose (an interrupt), so the workers it kills are not recorded as crashes.
_STOPPING = threading.Event()


def _stop_workers() -> None:
    _STOPPING.set()
    for proc in list(_LIVE_WORKERS):
        proc.kill()
        proc.wait()
        _LIVE_WORKERS.discard(proc)


class TaskQueue:
    """The run's tasks, handed to workers one at a time (thread-safe).

    A worker gets the next task of the compile family it last ran while that family has tasks left (its
    kernels are built and autotuned in that process); otherwise it starts the family that the fewest
    workers are on, most tasks left first. So each family is compiled by as few processes as possible,
    and the work balances itself however long each family takes — no family is stuck behind a slow one.
    """

    def __init__(self, tasks: list) -> None:
        self._lock = threading.Lock()
        self._left: dict[tuple, deque] = {}
        for task in tasks:
            self._left.setdefault(compile_family(*task[1]), deque()).append(task)
        self._active: Counter = Counter()

    def take(self, previous: tuple | None = None):
        """The next task for a worker whose last task was of family ``previous``; None when none is left."""
        with self._lock:
            if previous is not None:
                self._active[previous] -= 1
            if previous is not None and self._left.get(previous):
                family = previous
            else:
                open_families = [f for f, q in self._left.items() if q]
                if not open_families:
                    return None
                family = min(open_families, key=lambda f: (self._active[f], -len(self._left[f])))
            self._active[family] += 1
            return self._left[family].popleft()


class _Watchdog:
    """Kills a worker whose task runs longer than ``seconds`` (a hung kernel never returns and never
    crashes); the crash path then records that task as timed out and the run goes on in a fresh worker."""

    def __init__(self, proc: subprocess.Popen, seconds: float | None) -> None:
        self.proc, self.seconds, self.fired = proc, seconds, False
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        self.disarm()
        if self.seconds:
            self._timer = threading.Timer(self.seconds, self._fire)
            self._timer.daemon = True
            self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self.fired = True
        self.proc.kill()


def _run_in_workers(queue: TaskQueue, results_path, opts, on_done, max_restarts=50, env=None,
                    task_timeout: float | None = None):
    """Run tasks from ``queue`` in a worker process, one in flight at a time, until the queue is empty;
    on a hard crash (or a task over ``task_timeout`` seconds), record it and continue in a fresh worker."""
    restarts = 0
    family = None
    task = queue.take()
    while task is not None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deltacheck.harness.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=env,
        )
        _LIVE_WORKERS.add(proc)
        watchdog = _Watchdog(proc, task_timeout)
        in_flight = task
        _send(proc, json.dumps({"results": str(results_path), "opts": asdict(opts)}), in_flight)
        watchdog.arm()
        for line in proc.stdout:
            word, _, rest = line.strip().partition(" ")
            if word != "DONE":
                continue
            watchdog.disarm()
            idx, _, summary = rest.partition(" ")
            on_done(int(idx), json.loads(summary))
            family = compile_family(*in_flight[1])
            in_flight = queue.take(family)
            _send(proc, None, in_flight)  # the next task, or end of input: the worker exits
            if in_flight is not None:
                watchdog.arm()
        proc.stdout.close()
        code = proc.wait()
        watchdog.disarm()
        _LIVE_WORKERS.discard(proc)
        try:
            proc.stdin.close()  # already closed after the last task; open when the worker died
        except OSError:
            pass  # a broken pipe's unflushed bytes: the worker is gone
        if in_flight is None:
            return
        if _STOPPING.is_set():
            return  # the run is being stopped and ended this worker: not a crash, nothing to record
        if code in (-signal.SIGTERM, -signal.SIGINT):
            # A timeout or Ctrl-C reaches the whole process group: the run is being interrupted, and the
            # task in flight did not crash. Recording it as a kernel crash would be a false finding.
            raise Terminated(f"a worker was stopped ({_describe_exit(code)}): the run was interrupted")
        i, (case, spec) = in_flight
        if watchdog.fired:
            reason = (f"timed out: no result within --task-timeout {task_timeout:g} s (a hung kernel, or a limit "
                      "too short for this case's first compile); the worker was killed and the run continued "
                      "in a fresh one")
        else:
            reason = (f"worker process died ({_describe_exit(code)}) while running this case; the run continued "
                      "in a fresh worker")
        # What the worker judged before dying is on disk; the checks it never reached become errors.
        judged = [Result(**{k: v for k, v in rec.items() if k != "kind"}) for _, rec, _ in read_records(results_path)
                  if rec and rec.get("kind") == "result" and rec["case"] == case.id and rec["backend"] == spec]
        done = {r.check for r in judged}
        lost = [Result(case=case.id, backend=spec, check=check, status="error", reason=reason, op=case.op,
                       io_dtype=case.io_dtype, layout=case.layout, gate=case.gate, tokens=case.total_tokens,
                       max_len=case.max_len, tier=case.tier, repro=repro_command(case, spec))
                for check in checks_for(case) if check not in done]
        with ResultStream(results_path) as stream:
            for r in lost:
                stream.write(r)
        on_done(i, {**_task_summary(judged + lost), "crashed": reason})
        restarts += 1
        if restarts > max_restarts:
            raise RuntimeError(f"worker crashed {restarts} times; giving up (see {results_path})")
        task = queue.take(compile_family(case, spec))


def _send(proc, config: str | None, task) -> None:
    """Write the config line (first time) and one task, or close stdin when there is no task left."""
    try:
        if config is not None:
            proc.stdin.write(config + "\n")
        if task is None:
            proc.stdin.close()
        else:
            i, (case, spec) = task
            proc.stdin.write(json.dumps({"i": i, "case": case.id, "backend": spec}) + "\n")
            proc.stdin.flush()
    except (BrokenPipeError, OSError, ValueError):
        pass  # the worker died; reading its stdout to the end finds that out and records the crash


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def compile_family(case: Case, spec: str) -> tuple:
    """Tasks that share a kernel specialization: same backend, op, dtype and head dims. JIT backends
    (Triton, cuDNN's runtime compile) build and autotune a kernel per family and process, so keeping a
    worker on one family saves compiles."""
    return (spec, case.op, case.io_dtype, case.K, case.V)


def _run_parallel(tasks, run_dir: Path, opts, on_done, jobs: int, task_timeout: float | None = None) -> None:
    """``jobs`` workers side by side on one shared ``TaskQueue``, each with its own results file; the
    files are folded into results.jsonl when the workers end — also when one raised or the run was
    interrupted. With several GPUs visible, worker k is pinned to GPU k mod count."""
    queue = TaskQueue(tasks)
    gpus = gate.visible_gpus() if opts.device.startswith("cuda") else []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def locked_on_done(i, summary):
        with lock:
            on_done(i, summary)

    # Each worker's torch would start one thread per core: N workers oversubscribe the cores N times, and
    # spinning OpenMP threads then run several times slower than one worker alone. A share each instead.
    cpu_share = str(max(1, (os.cpu_count() or 1) // jobs))

    def one(k: int) -> None:
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", cpu_share)
        if len(gpus) > 1:
            env["CUDA_VISIBLE_DEVICES"] = gpus[k % len(gpus)]
        try:
            _run_in_workers(queue, run_dir / f"results.w{k}.jsonl", opts, locked_on_done, env=env,
                            task_timeout=task_timeout)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller after every worker ends
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(min(jobs, len(tasks)))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        _stop_workers()  # on an interrupt; a no-op when every worker ended
        for t in threads:  # let each thread see its worker gone before its file is folded
            t.join(timeout=10)
        fold_parts(run_dir / "results.jsonl", sorted(run_dir.glob("results.w*.jsonl")))
    if errors:
        raise errors[0]


# --- a whole run ---------------------------------------------------------------------------------


def execute(cases: list[Case], backend_specs: list[str], out_root: str | Path, opts: RunOptions, *,
            in_process: bool = False, argv: list[str] | None = None, environ=os.environ,
            stream=None, jobs: int = 1, resume: str | Path | None = None,
            task_timeout: float | None = None) -> tuple[int, Path]:
    """Run ``cases`` x ``backend_specs``; returns (exit status, run directory).
    ``jobs`` > 1 runs that many worker processes side by side on one ``TaskQueue``. ``resume``: an
    interrupted run's directory to continue — tasks whose every check it holds are not run again, the
    rest run and append to it (raises ``ResumeError`` when it cannot be continued here)."""
    stream = stream or sys.stdout  # looked up per call, so redirected output (and pytest's capture) is honoured
    env = gate.probe_env()
    required = gate.required_pairs(environ)
    extra = {"options": asdict(opts), "cases": len(cases)}
    already: dict[tuple[str, str], list[Result]] = {}
    if resume is not None:
        run_dir = Path(resume)
        gate_verdicts, already = resume_run(run_dir, backend_specs, env, required, argv or [], extra)
    else:
        run_dir = new_run_dir(out_root)
        gate_verdicts = open_run(run_dir / "results.jsonl", backend_specs, env, required, argv or [], extra)
    results_path = run_dir / "results.jsonl"

    tasks = [(i, (case, spec)) for i, (case, spec) in enumerate((c, s) for c in cases for s in backend_specs)]
    executed: Counter = Counter()
    declined: Counter = Counter()
    decline_reasons: dict = {}
    statuses: Counter = Counter()
    progress = Progress(len(tasks))
    by_index = dict(tasks)

    backward_runs: dict = defaultdict(lambda: [0, 0, ""])

    def on_done(i, summary):
        case, spec = by_index[i]
        statuses.update(summary["statuses"])
        if summary["executed"]:
            executed[(spec, case.op)] += 1
        if summary.get("backward_case"):
            tally = backward_runs[(spec, case.op)]
            tally[0] += 1
            tally[1] += summary["backward_ran"]
            tally[2] = tally[2] or summary["backward_reason"]
        if summary["declined"]:
            declined[(spec, case.op)] += 1
            decline_reasons.setdefault((spec, case.op), summary["decline_reason"])
        progress.update(f"{spec} {case.id}")

    finished_before = []
    for i, (case, spec) in tasks:
        held = already.get((case.id, spec), [])
        if held and set(checks_for(case)) <= {r.check for r in held}:
            finished_before.append(i)
            on_done(i, _task_summary(held))
    if finished_before:
        print(f"resuming {run_dir}: {len(finished_before)} of {len(tasks)} tasks were judged before; "
              f"running the other {len(tasks) - len(finished_before)}", file=sys.stderr)
        skip = set(finished_before)
        tasks = [t for t in tasks if t[0] not in skip]

    _STOPPING.clear()
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous_handler = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    try:
        if in_process:
            runner = CaseRunner(opts)
            with ResultStream(results_path) as out:
                for i, (case, spec) in tasks:
                    on_done(i, _task_summary(run_task(runner, case, spec, env, sink=out.write)))
        elif jobs > 1:
            _run_parallel(tasks, run_dir, opts, on_done, jobs, task_timeout)
        else:
            _run_in_workers(TaskQueue(tasks), results_path, opts, on_done, task_timeout=task_timeout)
    except KeyboardInterrupt as exc:
        progress.close()
        print(f"\ndeltacheck run: {exc or 'interrupted'}; every check judged so far is in {results_path} "
              "(no end record: reports will say the run did not finish). Continue it with the same selection "
              f"and `--resume {run_dir}`", file=sys.stderr)
        raise
    finally:
        _stop_workers()
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous_handler)
    progress.close()

    failures = gate.required_failures(
        required, gate_verdicts, executed,
        declined={k: (n, decline_reasons.get(k, "")) for k, n in declined.items()},
        backward_selected={(spec, case.op) for case, spec in by_index.values() if case.backward},
        backward_runs={k: tuple(v) for k, v in backward_runs.items()},
    )
    status = 1 if (statuses["fail"] or statuses["error"] or failures) else 0
    with ResultStream(results_path) as out:
        out.write(end_record(statuses, status, failures, {f"{b}:{o}": n for (b, o), n in executed.items()}))
    _print_summary(stream, run_dir, gate_verdicts, required, executed, statuses, failures, results_path)
    return status, run_dir


def _load_backend(spec: str):
    """(backend, None), or (None, why it cannot be loaded) — a backend that fails to load is a verdict."""
    try:
        return get_backend(spec), None
    except BackendLoadError as exc:
        return None, str(exc)


def gate_records(backend_specs: list[str], env, required) -> dict[tuple[str, str], tuple[Verdict, dict]]:
    """Each backend x op pair's gate verdict and the record that reports it."""
    gates: dict[tuple[str, str], tuple[Verdict, dict]] = {}
    for spec in backend_specs:
        backend, load_error = _load_backend(spec)
        for op in OPS:
            if backend is None:
                v = Verdict.no(load_error)
            elif op not in backend.ops and (spec, op) not in required:
                continue
            else:
                v = pair_availability(backend, spec, op, env)
            gates[(spec, op)] = v, {"kind": "gate", "backend": spec, "op": op, "runnable": v.runnable,
                                    "reason": v.reason, "backward": v.backward, "backward_reason": v.backward_reason,
                                    "notes": list(v.notes), "required": (spec, op) in required}
    return gates


def open_run(results_path: Path, backend_specs: list[str], env, required, argv: list[str],
             extra: dict | None = None) -> dict[tuple[str, str], Verdict]:
    """Write a run's header and one gate record per backend x op; return the gate verdicts.
    Shared by `deltacheck run` and the pytest plugin's ``--dc-out``, so both runs read the same."""
    gates = gate_records(backend_specs, env, required)
    with ResultStream(results_path) as out:
        out.write({"kind": "run", "schema": SCHEMA, "deltacheck": __version__, "started": utc_now(), "argv": argv,
                   "env": env.to_dict(), "run_id": results_path.parent.name, "backends": backend_specs,
                   "required": sorted(":".join(p) for p in required), **(extra or {}), **provenance()})
        for _, record in gates.values():
            out.write(record)
    return {pair: verdict for pair, (verdict, _) in gates.items()}


class ResumeError(ValueError):
    """A run directory that ``--resume`` cannot continue; the message says why and what to do."""


# Written by deltacheck before an interrupted run stopped being mistaken for a crash: not a judgement.
_LEGACY_INTERRUPT = ("worker process died (killed by SIGTERM)", "worker process died (killed by SIGINT)")


def resume_run(run_dir: Path, backend_specs: list[str], env, required, argv: list[str],
               extra: dict) -> tuple[dict[tuple[str, str], Verdict], dict[tuple[str, str], list[Result]]]:
    """Reopen an interrupted run: fold worker files it left, check that this is its environment, append a
    ``resume`` record (and gate records for backends it did not have); return the gate verdicts and the
    results it already holds, by (case id, backend)."""
    results_path = run_dir / "results.jsonl"
    if not results_path.is_file():
        raise ResumeError(f"--resume {run_dir}: not a run directory (no results.jsonl)")
    fold_parts(results_path, sorted(run_dir.glob("results.*w*.jsonl")))
    header, gated, judged = None, set(), defaultdict(dict)
    for _, rec, _ in read_records(results_path):
        if rec is None:
            continue
        if rec["kind"] == "run" and header is None:
            header = rec
        elif rec["kind"] == "gate":
            gated.add((rec.get("backend"), rec.get("op")))
        elif rec["kind"] == "result" and not str(rec.get("reason", "")).startswith(_LEGACY_INTERRUPT):
            result = Result(**{k: v for k, v in rec.items() if k != "kind"})
            judged[(result.case, result.backend)][result.check] = result  # a later record wins
    if header is None:
        raise ResumeError(f"--resume {run_dir}: results.jsonl has no run header")
    if header.get("schema") != SCHEMA:
        raise ResumeError(f"--resume {run_dir}: written with results schema {header.get('schema')!r}, "
                          f"this deltacheck writes {SCHEMA}; start a new run")
    theirs, ours = header.get("env") or {}, env.to_dict()
    if fingerprint(theirs) != fingerprint(ours):
        def describe(e):
            return f"{e.get('device_name') or 'no GPU'}, " + ", ".join(
                f"{k} {v}" for k, v in sorted((e.get("versions") or {}).items()) if v)
        raise ResumeError(f"--resume {run_dir}: it ran in another environment ({describe(theirs)}) than this one "
                          f"({describe(ours)}); resume it there, or start a new run and `deltacheck compare` the two")
    gates = gate_records(backend_specs, env, required)
    with ResultStream(results_path) as out:
        out.write({"kind": "resume", "started": utc_now(), "argv": argv, "env": ours, "backends": backend_specs,
                   **extra, **provenance()})
        for pair, (_, record) in gates.items():
            if pair not in gated:
                out.write(record)
    return ({pair: verdict for pair, (verdict, _) in gates.items()},
            {key: list(checks.values()) for key, checks in judged.items()})


def _print_summary(stream, run_dir, gate_verdicts, required, executed, statuses, failures, results_path):
    w = stream.write
    w(f"\ndeltacheck run {run_dir.name}: " + ", ".join(f"{statuses[s]} {s}" for s in ("pass", "fail", "skip", "error"))
      + "\n")
    w("backend x op availability:\n")
    for (spec, op), v in sorted(gate_verdicts.items()):
        req = " [REQUIRED]" if (spec, op) in required else ""
        state = f"ran {executed.get((spec, op), 0)} cases" if v.runnable else f"unavailable: {v.reason}"
        extra = "" if (not v.runnable or v.backward) else f" (no backward: {v.backward_reason})"
        w(f"  {spec:>10}:{op:<5}{req} {state}{extra}\n")
    # each check's final result: a resumed run's rerun replaces what it reran
    final = latest_per_check([rec for _, rec, _ in read_records(results_path) if rec and rec["kind"] == "result"])
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for rec in final:
        if rec["status"] in ("fail", "error"):
            groups[(rec["case"], rec["backend"])].append(rec)
    for (case_id, spec), recs in list(groups.items())[:20]:
        checks = ", ".join(f"{r['check']}({r['status']})" for r in recs)
        w(f"  {spec} {case_id}\n      failed: {checks}\n      first: {recs[0]['reason'][:240]}\n"
          f"      re-run: {recs[0]['repro']}\n")
    if len(groups) > 20:
        w(f"  ... and {len(groups) - 20} more failing case x backend pairs (see the results file)\n")
    if failures:
        w(gate.format_required_report(failures) + "\n")
    w(f"results: {results_path}\n")


# --- CLI -----------------------------------------------------------------------------------------


def _select_cases(args) -> list[Case]:
    if args.case:
        cases = [Case.from_id(c) for c in args.case]
    else:
        cases = []
        for op in args.op or [None]:
            cases += select(tier=args.tier, op=op, k=args.k)
    if args.limit:
        cases = cases[: args.limit]
    return cases


def _argument(cast, expected: str, ok) -> Callable[[str], Any]:
    """An argparse type: ``cast(text)`` that must satisfy ``ok``; otherwise a usage error naming ``expected``."""
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value
    return parse


_positive_int = _argument(int, "a whole number >= 1", lambda v: v >= 1)
_positive_seconds = _argument(float, "seconds > 0", lambda v: v > 0)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tier", default="L0", choices=["L0", "L1", "L2"], help="case tier (default L0)")
    p.add_argument("--op", action="append", choices=OPS, help="only this op (repeatable)")
    p.add_argument("-k", dest="k", default=None, help="pytest-style expression over case ids, e.g. 'thd and not bwd'")
    p.add_argument("--case", action="append", help="run exactly this case id (repeatable); overrides --tier/-k")
    p.add_argument("--limit", type=int, default=0, help="at most this many cases (after selection)")
    p.add_argument("--out", default="runs", help="root folder for run directories (default ./runs)")
    p.add_argument("--reference", default="auto", choices=["auto", "oracle", "chunked"],
                   help="fp64 reference: token oracle, chunked, or auto (oracle up to 2048 tokens)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the same-precision baseline (limits fall back to the absolute thresholds)")
    p.add_argument("--in-process", action="store_true", help="no worker process (faster start; a hard crash ends the run)")
    p.add_argument("--dry-run", action="store_true",
                   help="run nothing: print, per backend x op, how many cases would run (and with a backward) and "
                        "how many would be declined, by reason — to size a GPU job before paying for it")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue an interrupted run in its directory (--out is then unused): tasks of this "
                        "selection whose every check it holds are not run again; a task left half-judged runs "
                        "again and its new results replace the old. Refused if this is another environment")
    p.add_argument("--task-timeout", type=_positive_seconds, default=None, metavar="SECONDS",
                   help="kill a worker whose case x backend task gives no result within SECONDS (a hung kernel), "
                        "record the task as an error and go on in a fresh worker; a first Triton compile can "
                        "take minutes, so leave room for it (default: no limit)")
    p.add_argument("-j", "--jobs", type=_positive_int, default=1, metavar="N",
                   help="N worker processes side by side (default 1) taking tasks from one queue; each stays on "
                        "one compile family (backend, op, dtype, head dims) while it has tasks, so a JIT kernel "
                        "is built in few processes; with several GPUs visible, worker k uses GPU k mod count. "
                        "Speeds up first-compile-bound fused runs")


def _options(args) -> RunOptions:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return RunOptions(device=device, reference=args.reference, baseline=not args.no_baseline)


def cmd_run(args) -> int:
    try:
        cases = _select_cases(args)
    except (CaseError, ValueError) as exc:
        print(f"deltacheck run: {exc}", file=sys.stderr)
        return 2
    specs = args.backend or list(FUSED_DEFAULT)
    if args.dry_run:
        _print_plan(plan(cases, specs, gate.probe_env()), len(cases))
        return 0
    try:
        gate.required_pairs(os.environ)
    except ValueError as exc:  # gate.RequireSpecError: a malformed setting is a usage error
        print(f"deltacheck run: {exc}", file=sys.stderr)
        return 2
    if args.in_process and (args.jobs > 1 or args.task_timeout):
        print("deltacheck run: --in-process runs the tasks in this process, which cannot be killed and "
              "replaced; drop it to use --jobs or --task-timeout", file=sys.stderr)
        return 2
    try:
        status, run_dir = execute(cases, specs, args.out, _options(args), in_process=args.in_process,
                                  argv=sys.argv[1:], jobs=args.jobs, resume=args.resume,
                                  task_timeout=args.task_timeout)
    except ResumeError as exc:
        print(f"deltacheck run: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
    if args.report:
        _render_report(run_dir)
    return status


def plan(cases: list[Case], backend_specs: list[str], env) -> list[dict]:
    """What a run would do, without running it: per backend x op, the cases each backend would run (and
    with a backward) and the ones it would decline, by reason. Asks each backend's ``check`` per case, so
    the libraries are imported here."""
    rows: dict[tuple[str, str], dict] = {}
    for spec in backend_specs:
        backend, load_error = _load_backend(spec)
        for case in cases:
            row = rows.setdefault((spec, case.op), {"backend": spec, "op": case.op, "run": 0, "backward": 0,
                                                    "declined": Counter()})
            if backend is None:
                verdict = Verdict.no(load_error)
            else:
                try:
                    verdict = case_verdict(backend, spec, case, env)
                except Exception as exc:  # noqa: BLE001 - shown as that case's reason; a run records an error
                    verdict = Verdict.no(f"check() raised {type(exc).__name__}: {exc}")
            if verdict.runnable:
                row["run"] += 1
                row["backward"] += bool(case.backward and verdict.backward)
            else:
                row["declined"][verdict.reason] += 1
    return [rows[k] for k in sorted(rows)]


def _print_plan(rows: list[dict], n_cases: int, stream=None) -> None:
    stream = stream or sys.stdout
    print(f"deltacheck run --dry-run: {n_cases} cases; nothing was run", file=stream)
    for row in rows:
        declined = sum(row["declined"].values())
        print(f"  {row['backend'] + ':' + row['op']:<16} would run {row['run']:>4} (backward on {row['backward']}), "
              f"decline {declined}", file=stream)
        for reason, n in row["declined"].most_common():
            print(f"      {n:>4} × {reason}", file=stream)


def _render_report(run_dir: Path) -> None:
    from deltacheck.harness.cli import main as cli_main  # reports register themselves as `deltacheck report`

    cli_main(["report", str(run_dir)])


def cmd_verify(args) -> int:
    """The main job: the reference verifying itself plus every fused backend this machine can run."""
    # The baseline is the yardstick inside every check, not a subject: it is left out here.
    args.backend = args.backend or ["chunked", *FUSED_DEFAULT]
    args.report = True
    return cmd_run(args)


REQUIRED_EPILOG = """required mode (environment):
  NVTE_GDN2_TEST_REQUIRED=1          cudnn:gdn2 must run
  NVTE_GDN_TEST_REQUIRED=1           cudnn:gdn must run
  DELTACHECK_REQUIRE=cudnn:kda,fla:gdn2
                                     these backend:op pairs must run
A required pair that cannot run (package, op, runtime, version floor, GPU architecture), whose cases were
all declined, or that executed zero cases fails the run with the reason and the fix.

examples:
  deltacheck run --backend cudnn --backend fla --tier L0 --report
  deltacheck run --case 'gdn2-bf16-thd-N3-T[0_63_200]-H4/4/4-K128-V128-steep-h0-cont[64]-bwd' --backend fla
  deltacheck run --backend mypkg.kernels:MyBackend --op gdn2 -k 'thd and bwd'"""


def add_cli(sub) -> None:
    p = sub.add_parser("run", help="run the case matrix against backends",
                       description="Run cases x backends; every check is a result in RUN_DIR/results.jsonl. "
                                   "Exit status 1 when any check fails or errors, or a required pair cannot run.",
                       epilog=REQUIRED_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(p)
    p.add_argument("--backend", action="append",
                   help="backend name (cudnn, fla, fla-recurrent, oracle, chunked, baseline) or pkg.mod:attr "
                        "(repeatable; default: cudnn and fla)")
    p.add_argument("--report", action="store_true", help="render the reports into the run directory afterwards")
    p.set_defaults(func=cmd_run)

    v = sub.add_parser("verify", help="the main job: reference self-check + available fused backends, with a report",
                       epilog=REQUIRED_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Runs the tier against the chunked reference (checked against the token "
                                   "oracle; above 2048 tokens the references swap roles, so neither is compared "
                                   "with itself) and cuDNN / FLA where this machine can run them; unavailable "
                                   "backends are reported with their reasons.")
    _add_common(v)
    v.add_argument("--backend", action="append", help="override the backend list")
    v.set_defaults(func=cmd_verify)
