import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from deltacheck.harness.cli import main as cli_main

pytest_plugins = ["deltacheck.harness.pytest_plugin"]

# The generated tiers are kept on disk (harness/ci/tiers.py); the suite keeps its own, shared by its xdist workers and
# the processes its tests start (they inherit the variable), never the user's: a test may generate under a
# monkeypatched generator. DELTACHECK_TIER_CACHE=0 (cache off) is respected. The process that made it removes it.
if os.environ.get("DELTACHECK_TIER_CACHE") != "0" and not os.environ.get("DELTACHECK_TESTS_TIER_CACHE"):
    _tier_cache = tempfile.mkdtemp(prefix="deltacheck-tests-tiers-")
    os.environ["DELTACHECK_TIER_CACHE"] = os.environ["DELTACHECK_TESTS_TIER_CACHE"] = _tier_cache
    atexit.register(shutil.rmtree, _tier_cache, ignore_errors=True)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per xdist worker: the CI machine has 2 cores and runs 2 workers. The processes a test starts
    # (deltacheck runs, their pool workers, inner pytests) inherit one thread too, unless the caller set
    # OMP_NUM_THREADS: two workers each waiting on a child that spins two OpenMP threads oversubscribe the cores.
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_addoption(parser):
    parser.addoption("--dc-exhaustive", action="store_true",
                     help="also run the checks over every case of L1 and L2 (tens of minutes on a CPU) and the "
                          "long CPU rehearsals of finished device scripts")


@pytest.fixture
def run_cli(monkeypatch, capsys):
    """``deltacheck ARGV`` in this process, as the console script runs it: ``(exit status, stdout + stderr)``.
    ``env`` sets variables for the call (None unsets one); tests/ is importable (the fake backends). In-process
    because a subprocess pays Python, torch and the tier's generation again (seconds each, on 2 cores shared by
    2 xdist workers); the console script itself is `sys.exit(main())`, and other tests start it for real."""

    def run(argv, env=None):
        monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
        monkeypatch.setenv("CI", "1")
        for name, value in (env or {}).items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        capsys.readouterr()
        try:
            status = cli_main(argv)
        except SystemExit as exit_:  # argparse's usage errors
            status = exit_.code if isinstance(exit_.code, int) else 2
        captured = capsys.readouterr()
        return status, captured.out + captured.err

    return run
