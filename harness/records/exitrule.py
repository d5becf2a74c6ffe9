"""The one rule that turns what a run found into its exit status and its verdict word.

``deltacheck run`` / ``verify``, the pytest plugin's run directory, ``merge`` and the summary all call these two
functions, so a merged run, a resumed run and a report can never disagree about whether a run failed. The module
imports nothing (reports, which must work without torch, read it).

Exit statuses of a run (docs/run-directory.md):

- 0 every judged check passed (or failed as a known issue), and at least one check was judged;
- 1 a check failed or errored, a required pair failed, or a known issue no longer reproduces (``known_gone``);
- 2 a usage or configuration error, before anything ran (the commands' own);
- 5 nothing was verified: every check was declined or skipped (pytest's answer for "no tests ran"), so a CI job
  whose fused backends were all missing cannot read green.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOTHING_RAN = 5

# Statuses that count as a check the kernel ran and was judged on ('known' is a failure a known-issues entry covers).
VERIFYING = ("pass", "fail", "known")


def run_exit_status(counts: Mapping[str, int], required_failures: Iterable[str] = (),
                    known_gone: Iterable[str] = ()) -> int:
    """The exit status of a finished run whose results by status are ``counts``."""
    if counts.get("fail") or counts.get("error") or list(required_failures) or list(known_gone):
        return EXIT_FAILED
    if not any(counts.get(s) for s in VERIFYING):
        return EXIT_NOTHING_RAN
    return EXIT_OK


def run_verdict(counts: Mapping[str, int], required_failures: Iterable[str] = (), known_gone: Iterable[str] = (),
                *, finished: bool, recorded_exit: object = None) -> str:
    """FAILED, INCOMPLETE (no end record), NOTHING RAN or PASSED. A failure found so far wins over an unfinished
    run; an end record that says it failed (an exit status this rule did not derive, e.g. a required pair the
    results alone cannot show) is believed."""
    status = run_exit_status(counts, required_failures, known_gone)
    if status == EXIT_FAILED or (isinstance(recorded_exit, int) and recorded_exit not in (EXIT_OK, EXIT_NOTHING_RAN)):
        return "FAILED"
    if not finished:
        return "INCOMPLETE"
    if status == EXIT_NOTHING_RAN:
        return "NOTHING RAN"
    return "PASSED"


def frontier_exit_status(unmeasured: Iterable[str]) -> int:
    """``deltacheck frontier``: its failing points are the measurement, not an error; a backend x op x dtype
    with no base case inside the backend's envelope is (1)."""
    return EXIT_FAILED if list(unmeasured) else EXIT_OK
