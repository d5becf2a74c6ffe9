"""One task: a case against one backend, run and summarized. ``run_task`` drives the runner (which judges) and
applies, as each result streams past, what only the task knows: the known-issues entries that cover the case and
the envelope note on the ``forward`` result. The checks a task owes and the making of its Results are
``harness/judge/checks.py``'s.

``deltacheck run`` (in-process or through ``pool`` workers), the pytest plugin and the frontier all reach it through
``session.RunSession``, so a case x backend is judged the same way whichever front runs it.
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

from ..backends.base import BackendLoadError, Verdict, backend_for
from ..ci.known import applicable, mark_known, outcomes
from ..judge.checks import (  # noqa: F401 - re-exported
    checks_for,
    grad_inputs,
    repro_command,
    task_result,
    unjudged_results,
)
from ..machine.availability import case_verdict, envelope_note
from ..records.results import JUDGED, Result


@dataclass
class TaskOutcome:
    """A task's results in the order they were judged, the outcome per known-issues entry that applies to the case
    (``known.outcomes``), and where the time went (seconds per phase: check, reference, baseline, first_call,
    backward, continuation, steady_call, judging). Iterating it yields the results."""

    results: list[Result] = field(default_factory=list)
    known: dict[str, str] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)

    def __iter__(self):
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)


def run_task(runner, case, spec: str, env, sink=None, *, pair: Verdict | None = None) -> TaskOutcome:
    """All checks of one case x backend, each handed to ``sink`` as soon as it exists; a backend that cannot even
    load, or whose ``check`` raises, becomes an error result. A failing check a known-issues entry covers
    (``runner.known_issues()``) leaves as ``known``. ``pair``: the run's availability verdict of ``spec:case.op``
    (``RunSession`` hands it over), so the backend's floors are not asked again per task."""
    outcome = TaskOutcome()
    entries: list = []
    note: dict = {}

    def emit(result: Result) -> None:
        if result.check == "forward" and note:  # the task-level facts travel on the forward result
            result.metrics.update(note)
        mark_known(result, entries)
        outcome.results.append(result)
        if sink is not None:
            sink(result)

    def error(reason: str, **extra) -> TaskOutcome:
        emit(task_result(case, spec, check="forward", status="error", reason=reason, **extra))
        return outcome

    try:
        backend = backend_for(spec)
    except BackendLoadError as exc:
        return error(str(exc))
    entries[:] = applicable(runner.known_issues(), case, spec, getattr(backend, "name", spec), env)
    started = time.perf_counter()
    try:
        verdict = case_verdict(backend, spec, case, env)
    except Exception as exc:  # noqa: BLE001 - a crashing check is that case's error, not the run's end
        return error(f"check() raised {type(exc).__name__}: {exc}")
    outcome.phases = {"check": time.perf_counter() - started}  # the library's import and planner, the first time
    try:
        note.update(envelope_note(backend, spec, case, env, verdict, pair=pair))
    except Exception as exc:  # noqa: BLE001 - an envelope that cannot judge is noted, never the task's end
        note.update({"envelope_disagreement": f"the envelope could not be evaluated: {type(exc).__name__}: {exc}"})
    if verdict.runnable and verdict.notes:  # what the adapter changed on the way in (Verdict.ok("...")): reported
        note["adapter_notes"] = list(verdict.notes)
    try:
        runner.run(case, backend, spec, verdict, env, sink=emit)
    except Exception as exc:  # noqa: BLE001 - the harness's own failure on one case must not end the run
        return error(f"harness error: {type(exc).__name__}: {exc}",
                     metrics={"traceback": traceback.format_exc(limit=-4)})
    outcome.known = outcomes(outcome.results, entries)
    outcome.phases = {**outcome.phases, **getattr(runner, "phases", {})}
    return outcome


def task_record(case, spec: str, results, **extra) -> dict:
    """The ``task`` record a run directory keeps per case x backend: where its time went (docs/run-directory.md)."""
    phases = {name: round(seconds, 6) for name, seconds in getattr(results, "phases", {}).items()}
    phases.update(extra.pop("phases", {}))
    return {"kind": "task", "case": case.id, "backend": spec, "op": case.op, "phases": phases,
            "seconds": round(sum(phases.values()), 6), **extra}


def task_summary(results, known: dict | None = None) -> dict:
    """What a worker reports for a finished task (and what ``tally.RunTally.add`` reads). ``results``: a
    ``TaskOutcome`` or a list of Results (then ``known``: the outcome per known-issues entry, if any)."""
    if known is None:
        known = getattr(results, "known", {})
    results = list(results)
    statuses = Counter(r.status for r in results)
    fwd = next((r for r in results if r.check == "forward"), None)
    executed = fwd is not None and _ran(fwd)
    declined = fwd is not None and not executed and fwd.status == "skip"
    grads = [r for r in results if r.check.startswith("grad_")]
    return {
        "statuses": dict(statuses),
        "executed": executed,
        "declined": declined,
        "decline_reason": fwd.reason if declined else "",
        # a backward case that ran forward: were its gradients judged, or declined?
        "backward_case": executed and bool(grads),
        "backward_ran": any(_ran(r) for r in grads),
        "backward_reason": next((r.reason for r in grads if r.status == "skip" and not _ran(r)), ""),
        "known": dict(known),
        # the library declined a case its adapter declares it serves (required mode fails on it)
        "declined_inside_envelope": declined and bool(fwd.metrics.get("envelope_inside")),
    }


def _ran(result: Result) -> bool:
    """The kernel ran and was judged. An ill-posed check (skipped because the same-precision baseline misses the
    threshold too, harness/judge/runner.py) ran as well: the case is unjudgeable at its dtype, the kernel refused
    nothing, so it is neither a decline nor, in required mode, a refusal inside the envelope."""
    return result.status in JUDGED or (result.status == "skip" and bool(result.metrics.get("ill_posed")))
