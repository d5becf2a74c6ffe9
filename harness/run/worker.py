"""``python -m deltacheck.harness.run.worker``: the crash-isolated worker process of a run (the parent side is
``pool``). It reads a config line (``pool.worker_config``: results file, options, the run's pair verdicts) and then
one task per line on its stdin (the parent sends the next after each ``DONE``); results stream to the file the
config names, and each finished task is reported on the protocol pipe, never on stdout, which the kernel libraries
share.

An interrupt (Ctrl-C, ``timeout -s INT`` reaching the process group) ends the worker by SIGINT, before anything the
task in flight judges after it is written: a library can swallow the KeyboardInterrupt raised inside it (tvm-ffi
turned one raised in TileLang's nvcc callback into a bare RuntimeError on the H200), and the runner would then record
the interrupt as the kernel's error, a task ``--resume`` never runs again. So the task stays half-judged (it runs
again on resume) and the parent sees a worker stopped by SIGINT (pool: an interruption, never a crash)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from deltacheck.cases import Case
from deltacheck.harness.judge.runner import CaseRunner, RunOptions
from deltacheck.harness.machine.availability import verdicts_from_json
from deltacheck.harness.machine.environment import probe_env
from deltacheck.harness.records.results import ResultStream
from deltacheck.harness.run.pool import PROTOCOL_FD_ENV
from deltacheck.harness.run.task import run_task, task_record, task_summary


class _Interrupt:
    seen = False


def _on_sigint(signum, frame):
    _Interrupt.seen = True
    raise KeyboardInterrupt


def _stop_if_interrupted() -> None:
    """Die by SIGINT (the default action) once one arrived, whatever the libraries did with its KeyboardInterrupt."""
    if _Interrupt.seen:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


def worker_main() -> int:
    fd = int(os.environ.pop(PROTOCOL_FD_ENV))
    os.set_inheritable(fd, False)  # a compiler the libraries spawn must not hold the pipe open
    protocol = os.fdopen(fd, "w", buffering=1, encoding="utf-8")
    config = json.loads(sys.stdin.readline())
    runner = CaseRunner(RunOptions(**config["opts"]))
    env = probe_env()
    pairs = verdicts_from_json(config.get("pairs"))  # the run's availability verdicts, computed once by its session
    # interpreter start, imports and the environment probe: the first task's record carries it
    start = {"worker_start": max(0.0, time.time() - config["spawned"])} if "spawned" in config else {}
    signal.signal(signal.SIGINT, _on_sigint)

    def write(record) -> None:
        _stop_if_interrupted()  # nothing judged after an interrupt reaches the file
        stream.write(record)

    with ResultStream(config["results"]) as stream:
        for line in sys.stdin:
            task = json.loads(line)
            case, spec = Case.from_id(task["case"]), task["backend"]
            outcome = run_task(runner, case, spec, env, sink=write, pair=pairs.get((spec, case.op)))
            _stop_if_interrupted()
            stream.write(task_record(case, spec, outcome, phases=start, worker=os.getpid()))
            start = {}
            protocol.write(f"DONE {task['i']} {json.dumps(task_summary(outcome))}\n")
            protocol.flush()
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
