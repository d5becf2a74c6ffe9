"""What a test gives the `deltacheck` or `pytest` process it starts: tests/ importable (the fake backends), CI
mode, and none of the caller's required-mode, run-directory or xdist variables (an inner pytest is not one of our
workers, and a lane's DELTACHECK_REQUIRE must not decide a test's outcome)."""

import atexit
import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# The one limit a test puts on a child process or a wait: a hang guard only, far above what any of them needs even
# on a loaded 2-core machine (a whole test file's worth of work), so that no assertion depends on the machine's speed.
HANG_GUARD_S = 1800
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), "CI": "1"}
for _var in ("NVTE_GDN2_TEST_REQUIRED", "NVTE_GDN_TEST_REQUIRED", "DELTACHECK_REQUIRE", "DELTACHECK_PYTEST_RUN_DIR"):
    ENV.pop(_var, None)
for _var in [v for v in ENV if v.startswith("PYTEST_XDIST")]:
    ENV.pop(_var)


# --- starting `python -m pytest` / `python -m deltacheck` for a test --------------------------------------------------

# Variables read when torch or the interpreter start (thread pools, import paths, hash seed, devices): a child whose
# environment differs from the fork server's in any of them is started as a real subprocess.
_AT_START = ("PYTHON", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "TORCH", "CUDA", "LD_")
# An inner pytest session (the plugin under test): hypothesis's plugin is left out, no inner session uses it and its
# import was the largest part of a forked session's CPU left (0.6 of 1.5 s, this 2-core machine).
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:hypothesispytest"]
FORKSERVER_ENV = "DELTACHECK_TESTS_FORKSERVER"  # 0: every child is a real subprocess (to compare the two)
_server = None


def _at_start(env) -> dict:
    return {k: v for k, v in env.items() if k.startswith(_AT_START)}


def _forkserver():
    global _server
    if _server is None or _server.poll() is not None:
        import subprocess

        _server = subprocess.Popen([sys.executable, str(TESTS / "forkserver.py")], env=ENV, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True, bufsize=1)
        atexit.register(_stop, _server)
    return _server


def _stop(server) -> None:
    server.stdin.close()  # EOF: the server ends after the child it runs
    server.wait()


def run_child(argv, env=None, cwd=None, timeout=HANG_GUARD_S):
    """``subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)`` for
    ``[sys.executable, "-m", MODULE, *args]``: a fresh process forked from tests/forkserver.py, which has imported
    torch and pytest already (seconds of CPU saved per child); any other argv, or an environment that differs in what
    the interpreter and torch read at start, gets a real subprocess. Tests about the interpreter's start itself
    (hash seed, exit-time warnings) call subprocess directly."""
    import json
    import subprocess
    import tempfile
    import threading

    env = dict(ENV if env is None else env)
    cwd = str(cwd or os.getcwd())
    if (os.environ.get(FORKSERVER_ENV) == "0" or not hasattr(os, "fork") or len(argv) < 3
            or argv[:2] != [sys.executable, "-m"] or _at_start(env) != _at_start(ENV)):
        return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    server = _forkserver()
    with tempfile.TemporaryDirectory(prefix="deltacheck-child-") as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        request = {"module": argv[2], "args": list(map(str, argv[3:])), "env": env, "cwd": cwd,
                   "stdout": str(out), "stderr": str(err)}
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        pid = json.loads(server.stdout.readline())["pid"]
        fired = []
        guard = threading.Timer(timeout, lambda: (fired.append(pid), os.kill(pid, 9)))  # as subprocess.run's timeout
        guard.start()
        try:
            line = server.stdout.readline()
        finally:
            guard.cancel()
        if not line:
            raise RuntimeError(f"the fork server died running {argv}")
        if fired:
            raise subprocess.TimeoutExpired(argv, timeout)
        status = json.loads(line)["status"]
        return subprocess.CompletedProcess(argv, status, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))
