"""One task: a case against one backend. The checks it owes, the one place its Results are made, running it,
and the summary a worker reports for it.

``deltacheck run`` (in-process or through ``pool`` workers) and the pytest plugin both call ``run_task``, so a
case x backend is judged the same way whichever front runs it.
"""

from __future__ import annotations

import shlex
import time
import traceback
from collections import Counter
from typing import Any

from .availability import case_verdict, envelope_verdict
from .backends.base import BackendLoadError, backend_for
from .known import applicable, mark_known, outcomes
from .results import JUDGED, Result


def repro_command(case, backend_spec: str) -> str:
    """The command that re-runs exactly this case against this backend."""
    return f"deltacheck run --case {shlex.quote(case.id)} --backend {shlex.quote(backend_spec)}"


def grad_inputs(case) -> list[str]:
    """The inputs a backward case differentiates, in a fixed order."""
    names = ["q", "k", "v", "g", "beta"] + (["w"] if case.support.write_gate else [])
    if case.initial_state:
        names.append("initial_state")
    if case.a_log:
        names.append("a_log")
    if case.dt_bias:
        names.append("dt_bias")
    return names


def checks_for(case) -> list[str]:
    """Every check a case owes, in the order they are judged (docs/verdicts.md describes each)."""
    names = ["forward", "state"]
    if case.splits:
        names += ["continuation_ref", "continuation_self"]
    if case.backward:
        names += [f"grad_{n}" for n in grad_inputs(case)]
    names.append("determinism")
    return names


def task_result(case, backend_spec: str, *, check: str, status: str, reason: str = "",
                metrics: dict[str, Any] | None = None, seconds: float = 0.0) -> Result:
    """The one place a Result is made: every result of a task carries the same case fields and repro."""
    return Result(case=case.id, backend=backend_spec, check=check, status=status, reason=reason, op=case.op,
                  io_dtype=case.io_dtype, layout=case.layout, gate=case.gate, tokens=case.total_tokens,
                  max_len=case.max_len, tier=case.tier, metrics=dict(metrics or {}),
                  repro=repro_command(case, backend_spec), seconds=seconds)


def unjudged_results(case, backend_spec: str, judged: set[str], reason: str) -> list[Result]:
    """An error result for every check of the task not in ``judged`` (a worker died, a stage raised)."""
    return [task_result(case, backend_spec, check=c, status="error", reason=reason)
            for c in checks_for(case) if c not in judged]


class TaskResults(list):
    """A task's results, plus ``known`` (per known-issues entry that applies to the case, its outcome) and
    ``phases`` (seconds per phase: check, reference, baseline, first_call, backward, continuation, steady_call,
    judging)."""

    known: dict[str, str] = {}
    phases: dict[str, float] = {}


def run_task(runner, case, spec: str, env, sink=None) -> TaskResults:
    """All checks of one case x backend, each handed to ``sink`` as soon as it exists; a backend that
    cannot even load, or whose ``check`` raises, becomes an error result. A failing check a known-issues entry
    covers (``runner.known_issues()``) leaves as ``known``."""
    emitted = TaskResults()
    entries: list = []

    def emit(result: Result) -> None:
        mark_known(result, entries)
        emitted.append(result)
        if sink is not None:
            sink(result)

    def error(reason: str, **extra) -> list[Result]:
        emit(task_result(case, spec, check="forward", status="error", reason=reason, **extra))
        return emitted

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
    emitted.phases = {"check": time.perf_counter() - started}  # the library's import and planner, the first time
    try:
        note = envelope_verdict(backend, spec, case, env, verdict)
    except Exception as exc:  # noqa: BLE001 - an envelope that cannot judge is noted, never the task's end
        note = {"envelope_disagreement": f"the envelope could not be evaluated: {type(exc).__name__}: {exc}"}
    if verdict.runnable and verdict.notes:  # what the adapter changed on the way in (Verdict.ok("...")): reported
        note = {**(note or {}), "adapter_notes": list(verdict.notes)}
    try:
        runner.run(case, backend, spec, verdict, env, sink=emit, forward_metrics=note)
    except Exception as exc:  # noqa: BLE001 - the harness's own failure on one case must not end the run
        return error(f"harness error: {type(exc).__name__}: {exc}",
                     metrics={"traceback": traceback.format_exc(limit=-4)})
    emitted.known = outcomes(emitted, entries)
    emitted.phases = {**emitted.phases, **getattr(runner, "phases", {})}
    return emitted


def task_record(case, spec: str, results, **extra) -> dict:
    """The ``task`` record a run directory keeps per case x backend: where its time went (docs/run-directory.md)."""
    phases = {name: round(seconds, 6) for name, seconds in getattr(results, "phases", {}).items()}
    phases.update(extra.pop("phases", {}))
    return {"kind": "task", "case": case.id, "backend": spec, "op": case.op, "phases": phases,
            "seconds": round(sum(phases.values()), 6), **extra}


def task_summary(results: list[Result]) -> dict:
    """What a worker reports for a finished task (and what ``required.RequiredTally.add`` reads)."""
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
        "known": dict(getattr(results, "known", {})),
        # the library declined a case its adapter declares it serves (required mode fails on it)
        "declined_inside_envelope": declined and bool(fwd.metrics.get("envelope_inside")),
    }


def _ran(result: Result) -> bool:
    """The kernel ran and was judged. An ill-posed check (skipped because the same-precision baseline misses the
    threshold too, harness/runner.py) ran as well: the case is unjudgeable at its dtype, the kernel refused
    nothing, so it is neither a decline nor, in required mode, a refusal inside the envelope."""
    return result.status in JUDGED or (result.status == "skip" and bool(result.metrics.get("ill_posed")))
