"""A process that has imported torch and pytest once and forks a fresh child for each `python -m MODULE ARGS` a
test asks for (child_env.run_child): the child is a new process with its own pid, exit status, stdout and stderr, and
imports everything else (deltacheck, the tests, pytest's plugins) itself, exactly as a fresh interpreter would; only
torch's and pytest's import (about 2 s of CPU on the 2-core CI machine, paid by each of the suite's dozens of inner
runs) is shared. Nothing of the project is imported here, so no module a child imports is already loaded.

Protocol (one JSON object a line): request {"module", "args", "env", "cwd", "stdout", "stderr"} on stdin; replies
{"pid": P} once forked and {"status": S} once it ended, on the pipe that was stdout at start. EOF on stdin ends it.
"""

import atexit
import gc
import json
import os
import runpy
import sys

import _pytest.config  # noqa: F401 - the import being shared
import pytest  # noqa: F401 - the import being shared
import torch  # noqa: F401 - the import being shared


def _child(request) -> int:
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = [request["module"], *request["args"]]
    status = 0
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as exit_:  # as the interpreter turns it into an exit status
        if exit_.code is None:
            status = 0
        elif isinstance(exit_.code, int):
            status = exit_.code
        else:
            print(exit_.code, file=sys.stderr)
            status = 1
    except BaseException:  # noqa: BLE001 - an uncaught exception: the traceback and status 1, as the interpreter
        import traceback

        traceback.print_exc()
        status = 1
    atexit._run_exitfuncs()  # what the child registered, as a normal interpreter exit runs it
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return status & 0xFF


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing but the replies goes to the pipe
    gc.freeze()  # the shared imports stay out of each child's collections (pytest collects at exit)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                status = _child(request)
            finally:
                os._exit(status)
        replies.write(json.dumps({"pid": pid}) + "\n")
        _, wait_status = os.waitpid(pid, 0)
        replies.write(json.dumps({"status": os.waitstatus_to_exitcode(wait_status)}) + "\n")


if __name__ == "__main__":
    main()
