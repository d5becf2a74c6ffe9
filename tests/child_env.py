"""What a test gives the `deltacheck` or `pytest` process it starts: tests/ importable (the fake backends), CI
mode, and none of the caller's required-mode, run-directory or xdist variables (an inner pytest is not one of our
workers, and a lane's DELTACHECK_REQUIRE must not decide a test's outcome)."""

import os
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
