"""The worker pool: crash-isolated worker processes taking case x backend tasks from one queue.

A worker (``python -m deltacheck.harness.run.worker``) reads a config line and then one task per line on its
stdin, streams every result into its results file as it is judged, and reports each finished task on a pipe
of its own (``DONE <i> <summary json>``): the worker's stdout stays the user's, and its stderr reaches the
user's line by line, so whatever a kernel library prints reaches the terminal or the CI log unchanged — all
but nanobind's leak report, which cuDNN's extension prints by the page at every worker's exit (``leaks``).

If a worker dies hard (segfault, CUDA illegal address, ``os._exit``), everything it wrote is on disk; the pool
records an ``error`` for each check of the task in flight it never reached and goes on in a fresh worker. A
``--task-timeout`` watchdog turns a hung kernel into the same path. ``TaskQueue`` keeps each worker on one
compile family so JIT kernels are built in few processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from ..ci.shards import compile_family
from ..judge.checks import unjudged_results
from ..machine.availability import verdicts_to_json
from ..machine.cores import torch_threads, usable_cores  # noqa: F401 - torch_threads is asked here by run and env
from ..machine.environment import visible_gpus
from ..machine.leaks import LeakFilter
from ..records.results import Result, ResultStream, fold_parts, read_records
from .task import task_summary
from .taskqueue import TaskQueue

PROTOCOL_FD_ENV = "DELTACHECK_WORKER_FD"  # the worker's end of the protocol pipe (harness/run/worker.py)


def _importable_paths(environ: dict) -> str:
    """PYTHONPATH for a worker: the caller's, then what this process added to ``sys.path`` beyond the
    interpreter's own directories, so a ``--backend pkg.mod:attr`` importable here is importable there."""
    own = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    added = [p for p in sys.path if p and os.path.isdir(p)
             and not any(os.path.realpath(p).startswith(root + os.sep) or os.path.realpath(p) == root for root in own)]
    parts = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(parts + added))


def spawn_worker(env: dict | None = None) -> tuple[subprocess.Popen, object]:
    """A worker process and the parent's end of its protocol pipe (a text file to iterate by line). The
    worker's stderr reaches ours through ``_forward_stderr`` (``proc.stderr_forwarder``, joined once it ends)."""
    read_fd, write_fd = os.pipe()
    child_env = dict(os.environ if env is None else env)
    child_env[PROTOCOL_FD_ENV] = str(write_fd)
    child_env["PYTHONPATH"] = _importable_paths(child_env)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "deltacheck.harness.run.worker"], stdin=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, bufsize=1, env=child_env, pass_fds=(write_fd,))
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)  # the child holds its copy: EOF here means the worker is gone
    proc.stderr_forwarder = threading.Thread(target=_forward_stderr, args=(proc.stderr.buffer,), daemon=True)
    proc.stderr_forwarder.start()
    return proc, os.fdopen(read_fd, "r", encoding="utf-8")


def _forward_stderr(pipe) -> None:
    """Copy a worker's stderr to ours as it comes, line by line and byte for byte, leaving out nanobind's leak
    report (``leaks``): cuDNN's extension prints pages of it at every worker's exit."""
    leak_filter = LeakFilter()
    for line in iter(pipe.readline, b""):
        if not leak_filter.keep(line):
            continue
        stream = sys.stderr  # looked up per line, so a redirected stderr (pytest's capture) is honoured
        target = getattr(stream, "buffer", None)
        stream.flush()
        if target is not None:
            target.write(line)
            target.flush()
        else:
            stream.write(line.decode("utf-8", errors="replace"))
            stream.flush()
    pipe.close()


def _end_forwarding(proc: subprocess.Popen) -> None:
    """Wait for the rest of an ended worker's stderr, so it comes before what the run prints next. A process the
    worker left behind may hold the pipe open: the wait is bounded, the thread a daemon."""
    forwarder = getattr(proc, "stderr_forwarder", None)
    if forwarder is not None:
        forwarder.join(timeout=5)


# Worker processes alive right now, so an interrupted run can end them instead of leaving them running.
_LIVE_WORKERS: set[subprocess.Popen] = set()


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI timeout, ``kill``) turned into an interrupt, so a run ends the way Ctrl-C ends it."""


def raise_terminated(signum, frame):
    raise Terminated("terminated by SIGTERM")


# Set while a run is ending on purpose (an interrupt), so the workers it kills are not recorded as crashes.
STOPPING = threading.Event()


def stop_workers() -> None:
    STOPPING.set()
    for proc in list(_LIVE_WORKERS):
        proc.kill()
        proc.wait()
        _end_forwarding(proc)
        _LIVE_WORKERS.discard(proc)


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


def worker_config(results_path, opts, pairs=None, spawned: float | None = None) -> str:
    """A worker's config line: where its results go, the run's options, and the run's pair verdicts (computed
    once by the ``RunSession``, handed to every task instead of being asked again)."""
    return json.dumps({"results": str(results_path), "opts": asdict(opts), "pairs": verdicts_to_json(pairs or {}),
                       "spawned": time.time() if spawned is None else spawned})


def crash_reason(code: int, timed_out: float | None = None) -> str:
    """The error a task in flight gets when its worker dies (or is killed by the watchdog)."""
    if timed_out:
        return (f"timed out: no result within --task-timeout {timed_out:g} s (a hung kernel, or a limit too short "
                "for this case's first compile); the worker was killed and the run continued in a fresh one")
    return f"worker process died ({_describe_exit(code)}) while running this case; the run continued in a fresh worker"


def record_crash(results_path, case, spec: str, reason: str) -> dict:
    """What a dead worker judged of its task is on disk; the checks it never reached become errors. Returns the
    task's summary."""
    judged = [Result(**{k: v for k, v in rec.items() if k != "kind"}) for _, rec, _ in read_records(results_path)
              if rec and rec.get("kind") == "result" and rec["case"] == case.id and rec["backend"] == spec]
    lost = unjudged_results(case, spec, {r.check for r in judged}, reason)
    with ResultStream(results_path) as stream:
        for r in lost:
            stream.write(r)
    return {**task_summary(judged + lost), "crashed": reason}


def run_in_workers(queue: TaskQueue, results_path, opts, on_done, max_restarts=50, env=None,
                   task_timeout: float | None = None):
    """Run tasks from ``queue`` in a worker process, one in flight at a time, until the queue is empty;
    on a hard crash (or a task over ``task_timeout`` seconds), record it and continue in a fresh worker."""
    restarts = 0
    family = None
    task = queue.take()
    while task is not None:
        spawned = time.time()
        proc, protocol = spawn_worker(env)
        _LIVE_WORKERS.add(proc)
        watchdog = _Watchdog(proc, task_timeout)
        in_flight = task
        _send(proc, worker_config(results_path, opts, queue.pairs, spawned), in_flight)
        watchdog.arm()
        for line in protocol:
            word, _, rest = line.strip().partition(" ")
            if word != "DONE":
                continue
            watchdog.disarm()
            idx, _, summary = rest.partition(" ")
            on_done(int(idx), json.loads(summary))
            family = compile_family(*in_flight[1])
            in_flight = queue.take(family, in_flight[1][0].id)
            _send(proc, None, in_flight)  # the next task, or end of input: the worker exits
            if in_flight is not None:
                watchdog.arm()
        protocol.close()
        code = proc.wait()
        watchdog.disarm()
        _end_forwarding(proc)
        _LIVE_WORKERS.discard(proc)
        try:
            proc.stdin.close()  # already closed after the last task; open when the worker died
        except OSError:
            pass  # a broken pipe's unflushed bytes: the worker is gone
        if in_flight is None:
            return
        if STOPPING.is_set():
            return  # the run is being stopped and ended this worker: not a crash, nothing to record
        if code in (-signal.SIGTERM, -signal.SIGINT):
            # A timeout or Ctrl-C reaches the whole process group: the run is being interrupted, and the
            # task in flight did not crash. Recording it as a kernel crash would be a false finding.
            raise Terminated(f"a worker was stopped ({_describe_exit(code)}): the run was interrupted")
        i, (case, spec) = in_flight
        on_done(i, record_crash(results_path, case, spec, crash_reason(code, task_timeout if watchdog.fired else None)))
        restarts += 1
        if restarts > max_restarts:
            raise RuntimeError(f"worker crashed {restarts} times; giving up (see {results_path})")
        task = queue.take(compile_family(case, spec), case.id)  # the crashed case's other tasks, if held


class WorkerClient:
    """One worker process for tasks handed over one at a time, each waited for (the frontier: the next point depends
    on the last verdict). A worker that dies (or outlives ``task_timeout``) costs the task in flight — its checks
    it never reached become errors — and the next task starts a fresh worker."""

    def __init__(self, results_path, opts, pairs=None, env=None, task_timeout: float | None = None) -> None:
        self.results_path, self.opts, self.pairs, self.env = results_path, opts, pairs, env
        self.task_timeout = task_timeout
        self._proc = self._protocol = self._watchdog = None
        self._sent = 0

    def run(self, case, spec: str) -> dict:
        """Run one task; its summary (``crashed`` set when the worker died on it)."""
        config = None
        if self._proc is None:
            spawned = time.time()
            self._proc, self._protocol = spawn_worker(self.env)
            _LIVE_WORKERS.add(self._proc)
            self._watchdog = _Watchdog(self._proc, self.task_timeout)
            config = worker_config(self.results_path, self.opts, self.pairs, spawned)
        self._sent += 1
        _send(self._proc, config, (self._sent, (case, spec)))
        self._watchdog.arm()
        for line in self._protocol:
            word, _, rest = line.strip().partition(" ")
            if word == "DONE":
                self._watchdog.disarm()
                return json.loads(rest.partition(" ")[2])
        code, fired = self._end(), self._watchdog.fired
        if STOPPING.is_set() or code in (-signal.SIGTERM, -signal.SIGINT):
            raise Terminated(f"a worker was stopped ({_describe_exit(code)}): the run was interrupted")
        return record_crash(self.results_path, case, spec, crash_reason(code, self.task_timeout if fired else None))

    def _end(self) -> int:
        proc, self._proc = self._proc, None
        self._protocol.close()
        code = proc.wait()
        self._watchdog.disarm()
        _end_forwarding(proc)
        _LIVE_WORKERS.discard(proc)
        try:
            proc.stdin.close()
        except OSError:
            pass  # a broken pipe's unflushed bytes: the worker is gone
        return code

    def close(self) -> None:
        """End the worker (end of input: it exits on its own)."""
        if self._proc is not None:
            _send(self._proc, None, None)
            self._end()


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


def run_parallel(tasks, run_dir: Path, opts, on_done, jobs: int, task_timeout: float | None = None,
                 pairs=None) -> None:
    """``jobs`` workers side by side on one shared ``TaskQueue``, each with its own results file; the
    files are folded into results.jsonl when the workers end — also when one raised or the run was
    interrupted. With several GPUs visible, worker k is pinned to GPU k mod count."""
    queue = TaskQueue(tasks, pairs)
    gpus = visible_gpus() if opts.device.startswith("cuda") else []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def locked_on_done(i, summary):
        with lock:
            on_done(i, summary)

    # Each worker's torch would start one thread per core: N workers oversubscribe the cores N times, and
    # spinning OpenMP threads then run several times slower than one worker alone. A share each instead
    # (opts.threads, set by `deltacheck run`; the worker's CaseRunner applies it too).
    cpu_share = str(opts.threads or max(1, usable_cores() // jobs))

    def one(k: int) -> None:
        env = dict(os.environ)
        if opts.threads:
            env["OMP_NUM_THREADS"] = cpu_share
        else:
            env.setdefault("OMP_NUM_THREADS", cpu_share)
        if len(gpus) > 1:
            env["CUDA_VISIBLE_DEVICES"] = gpus[k % len(gpus)]
        try:
            run_in_workers(queue, run_dir / f"results.w{k}.jsonl", opts, locked_on_done, env=env,
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
        stop_workers()  # on an interrupt; a no-op when every worker ended
        for t in threads:  # let each thread see its worker gone before its file is folded
            t.join(timeout=10)
        fold_parts(run_dir / "results.jsonl", sorted(run_dir.glob("results.w*.jsonl")))
    if errors:
        raise errors[0]
