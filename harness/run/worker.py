"""``python -m deltacheck.harness.run.worker``: the crash-isolated worker process of a run (the parent side is
``pool``). It reads a config line (``pool.worker_config``: results file, options, the run's pair verdicts) and then
one task per line on its stdin (the parent sends the next after each ``DONE``); results stream to the file the
config names, and each finished task is reported on the protocol pipe, never on stdout, which the kernel libraries
share."""

from __future__ import annotations

import json
import os
import sys
import time

from deltacheck.cases import Case
from deltacheck.harness.judge.runner import CaseRunner, RunOptions
from deltacheck.harness.machine.availability import verdicts_from_json
from deltacheck.harness.machine.environment import probe_env
from deltacheck.harness.records.results import ResultStream
from deltacheck.harness.run.pool import PROTOCOL_FD_ENV
from deltacheck.harness.run.task import run_task, task_record, task_summary


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
    with ResultStream(config["results"]) as stream:
        for line in sys.stdin:
            task = json.loads(line)
            case, spec = Case.from_id(task["case"]), task["backend"]
            outcome = run_task(runner, case, spec, env, sink=stream.write, pair=pairs.get((spec, case.op)))
            stream.write(task_record(case, spec, outcome, phases=start, worker=os.getpid()))
            start = {}
            protocol.write(f"DONE {task['i']} {json.dumps(task_summary(outcome))}\n")
            protocol.flush()
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
