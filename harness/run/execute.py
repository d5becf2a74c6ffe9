"""One run from start to end, as ``deltacheck run`` / ``verify`` (and ``warmup``) make it: a ``RunSession`` opens (or
resumes) the directory and owns the verdicts, tally and end record; this module skips what a resumed run already
judged, hands the tasks to the pool (or runs them in this process), shows progress and prints the closing summary.
Tests call ``execute`` directly.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

from deltacheck.cases import Case

from ..ci.known import format_known_report
from ..ci.required import format_required_report, required_pairs
from ..judge.checks import checks_for
from ..judge.runner import CaseRunner, RunOptions
from ..machine.environment import probe_env
from ..records.exitrule import EXIT_NOTHING_RAN
from ..records.results import latest_per_check, read_records
from . import pool
from .session import RunSession
from .task import task_summary


class Progress:
    """Progress with ETA: a one-line bar on a terminal; elsewhere (CI logs, a file) a plain line at most
    once a minute, so a long or stuck run shows where it is without flooding the log."""

    LOG_EVERY_S = 60.0

    def __init__(self, total: int, stream=None, will_run: int | None = None):
        stream = stream or sys.stderr  # looked up per run: a default bound at import would outlive a redirect
        self.total, self.stream, self.done, self.t0 = total, stream, 0, time.monotonic()
        # The ETA is estimated over the tasks that will run: a task of a pair that cannot run here (declined
        # before any case) or one a resumed run already judged costs ~nothing, not a reference task's time.
        self.will_run = total if will_run is None else will_run
        self.runnable_done, self.timed = 0, 0
        self.bar = stream.isatty() and not os.environ.get("CI")
        self.last_line = self.t0
        self.open = True

    def update(self, label: str, *, runnable: bool = True, resumed: bool = False) -> None:
        self.done += 1
        self.runnable_done += runnable
        self.timed += runnable and not resumed
        now = time.monotonic()
        elapsed = now - self.t0
        left = max(0, self.will_run - self.runnable_done)
        eta = f"{elapsed / self.timed * left:5.0f}s" if self.timed else ("    0s" if not left else "    ?")
        line = f"[{self.done}/{self.total}] {100 * self.done // max(self.total, 1)}% ETA {eta}  {label}"
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


# A write that failed for want of room (or a read-only or broken disk): one line and a resume hint, not a chain
# of tracebacks from every writer that tried after it.
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO}


class RunWriteError(OSError):
    """The run directory could not be written; ``str()`` is the one line a person reads."""

    def __init__(self, path: Path, run_dir: Path, exc: OSError) -> None:
        where = exc.filename or path
        super().__init__(exc.errno, f"cannot write {where}: {exc.strerror or exc}; every check judged before "
                                    f"that is kept in {path}. Free space, then continue with the same selection "
                                    f"and `--resume {run_dir}`")

    def __str__(self) -> str:
        return self.strerror


def execute(cases: list[Case], backend_specs: list[str], out_root: str | Path, opts: RunOptions, *,
            in_process: bool = False, argv: list[str] | None = None, environ=os.environ,
            stream=None, jobs: int = 1, resume: str | Path | None = None,
            task_timeout: float | None = None) -> tuple[int, Path]:
    """Run ``cases`` x ``backend_specs``; returns (exit status, run directory).
    ``jobs`` > 1 runs that many worker processes side by side on one ``TaskQueue``. ``resume``: an
    interrupted run's directory to continue — tasks whose every check it holds are not run again, the
    rest run and append to it (raises ``ResumeError`` when it cannot be continued here)."""
    stream = stream or sys.stdout  # looked up per call, so redirected output (and pytest's capture) is honoured
    env = probe_env()
    required = required_pairs(environ)
    extra = {"options": asdict(opts), "cases": len(cases)}
    case_ids = [case.id for case in cases]
    if resume is not None:
        session = RunSession.resume(resume, backend_specs, env, required, argv or [], extra, case_ids)
    else:
        session = RunSession.open(out_root, backend_specs, env, required, argv or [], {**extra, "case_ids": case_ids})
    run_dir, results_path, verdicts = session.run_dir, session.results_path, session.verdicts

    tasks = [(i, (case, spec)) for i, (case, spec) in enumerate((c, s) for c in cases for s in backend_specs)]

    def runnable(case, spec) -> bool:
        verdict = verdicts.get((spec, case.op))  # none: the backend does not implement the op (declined)
        return verdict is not None and verdict.runnable

    progress = Progress(len(tasks), will_run=sum(runnable(c, s) for _, (c, s) in tasks))
    by_index = dict(tasks)
    session.select(by_index.values())
    resumed: set[int] = set()

    def on_done(i, summary):
        case, spec = by_index[i]
        session.done(case, spec, summary)
        progress.update(f"{spec} {case.id}", runnable=runnable(case, spec), resumed=i in resumed)

    for i, (case, spec) in tasks:
        held = session.judged_before(case, spec, checks_for(case))
        if held:
            resumed.add(i)
            on_done(i, task_summary(held))
    if resumed:
        print(f"resuming {run_dir}: {len(resumed)} of {len(tasks)} tasks were judged before; "
              f"running the other {len(tasks) - len(resumed)}", file=sys.stderr)
        tasks = [t for t in tasks if t[0] not in resumed]

    try:
        pool.STOPPING.clear()
        in_main_thread = threading.current_thread() is threading.main_thread()
        previous_handler = signal.signal(signal.SIGTERM, pool.raise_terminated) if in_main_thread else None
        try:
            if in_process:
                runner = CaseRunner(opts)
                for _, (case, spec) in tasks:
                    session.run_task(runner, case, spec)
                    progress.update(f"{spec} {case.id}", runnable=runnable(case, spec))
            elif jobs > 1:
                pool.run_parallel(tasks, run_dir, opts, on_done, jobs, task_timeout, pairs=verdicts)
            else:
                pool.run_in_workers(pool.TaskQueue(tasks, verdicts), results_path, opts, on_done,
                                    task_timeout=task_timeout)
        except KeyboardInterrupt as exc:
            progress.close()
            print(f"\ndeltacheck run: {exc or 'interrupted'}; every check judged so far is in {results_path} "
                  "(no end record: reports will say the run did not finish). Continue it with the same selection "
                  f"and `--resume {run_dir}`", file=sys.stderr)
            raise
        finally:
            pool.stop_workers()
            session.close_stream()
            if in_main_thread:
                signal.signal(signal.SIGTERM, previous_handler)
        progress.close()
        failures = session.failures()
        status = session.finish(failures)
    except OSError as exc:
        if exc.errno not in DISK_ERRNOS:
            raise
        raise RunWriteError(results_path, run_dir, exc) from None
    tally = session.tally
    print_summary(stream, run_dir, verdicts, required, tally.executed, tally.statuses, failures, results_path,
                  tally.known_gone)
    if status == EXIT_NOTHING_RAN:
        stream.write(f"NOTHING RAN: no check of the {len(by_index)} task(s) was judged (every one declined or "
                     f"skipped, reasons above); exit status {EXIT_NOTHING_RAN}, as pytest's for no tests run\n")
    return status, run_dir


def print_summary(stream, run_dir, verdicts, required, executed, statuses, failures, results_path,
                  known_gone=()):
    w = stream.write
    w(f"\ndeltacheck run {run_dir.name}: "
      + ", ".join(f"{statuses[s]} {s}" for s in ("pass", "fail", "known", "skip", "error")) + "\n")
    w("backend x op availability:\n")
    for (spec, op), v in sorted(verdicts.items()):
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
    known = [rec for rec in final if rec["status"] == "known"]
    if known:
        issues = sorted({str(rec["metrics"].get("known_issue")) for rec in known})
        w(f"  {len(known)} check(s) failed as known issues ({', '.join(issues)}): not failures; listed in the reports\n")
    if failures:
        w(format_required_report(failures) + "\n")
    if known_gone:
        w(format_known_report(known_gone) + "\n")
    w(f"results: {results_path}\n")
