"""The checks a task owes and the one place its Results are made: ``checks_for`` (in judging order), ``grad_inputs``,
``task_result`` (every result carries the same case fields and the one repro command) and the error results of
checks a task never reached. The runner, the task, the pool and the frontier all build on it; it imports no torch
and nothing of theirs, so the flow stays one way: checks <- runner <- task.
"""

from __future__ import annotations

from typing import Any

from ..records.results import Result
from ..records.results import repro_command as repro_line


def repro_command(case, backend_spec: str) -> str:
    """The command that re-runs exactly this case against this backend (``results.repro_command``'s words)."""
    return repro_line(case.id, backend_spec)


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


def stage_checks(case, stage: str) -> list[str]:
    """The checks a stage of the runner judges (what becomes an error when that stage raises)."""
    names = checks_for(case)
    if stage == "forward":
        return [c for c in names if c in ("forward", "state") or c.startswith("grad_")]
    if stage == "continuation_ref":
        return ["continuation_ref", "continuation_self"]
    return [stage]
