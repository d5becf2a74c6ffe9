"""The one tally of a run: results by status, what each backend x op pair did (cases executed, declined, refused
inside the envelope, backward cases and their gradients) and the known issues that no longer reproduce.

Every front feeds it the same way (``add`` of a ``task.task_summary``) and it crosses process boundaries the same
way (``to_json`` / ``merge``): pool workers report summaries to the parent, xdist workers hand their tally to the
controller, and the end record of every run directory carries it, so ``deltacheck merge`` folds shards' tallies
instead of re-deriving them. ``end_record`` closes a run with the one exit rule (``exitrule``). Its module level
needs only the standard library: ``merge`` runs where only that exists (tests/test_architecture.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..records.exitrule import run_exit_status
from ..records.results import end_record


@dataclass
class RunTally:
    """What the finished tasks of a run say. ``statuses``: results by status; per backend x op pair: cases
    executed, cases declined (with the first reason), backward cases that ran forward and whether their
    gradients were judged, declines inside the declared envelope; ``known_gone``: known issues that no longer
    reproduce (``harness/ci/known.py``)."""

    statuses: Counter = field(default_factory=Counter)
    executed: Counter = field(default_factory=Counter)
    declined: Counter = field(default_factory=Counter)
    decline_reason: dict = field(default_factory=dict)
    backward_runs: dict = field(default_factory=dict)  # pair -> [backward cases run forward, with grads, reason]
    backward_selected: set = field(default_factory=set)  # pairs with at least one backward case selected
    declined_inside: dict = field(default_factory=dict)  # pair -> [count, first case id, its reason]
    known_gone: list = field(default_factory=list)  # "known issue no longer reproduces" lines

    def select(self, spec: str, case) -> None:
        """Note a selected task (before it runs), so a pair whose backward cases never ran is still seen."""
        if case.backward:
            self.backward_selected.add((spec, case.op))

    def add(self, spec: str, op: str, summary: Mapping[str, Any], case_id: str = "") -> None:
        """One finished task's ``task.task_summary``."""
        pair = (spec, op)
        self.statuses.update(summary.get("statuses") or {})
        if summary.get("declined_inside_envelope"):
            inside = self.declined_inside.setdefault(pair, [0, case_id, summary.get("decline_reason", "")])
            inside[0] += 1
        from ..ci.known import no_longer_reproduces  # packaging: not needed to merge or to close a run

        for issue, outcome in (summary.get("known") or {}).items():
            if outcome == "gone":
                self.known_gone.append(no_longer_reproduces(issue, case_id, spec))
        if summary.get("executed"):
            self.executed[pair] += 1
        if summary.get("declined"):
            self.declined[pair] += 1
            self.decline_reason.setdefault(pair, summary.get("decline_reason", ""))
        if summary.get("backward_case"):
            runs = self.backward_runs.setdefault(pair, [0, 0, ""])
            runs[0] += 1
            runs[1] += bool(summary.get("backward_ran"))
            runs[2] = runs[2] or summary.get("backward_reason", "")

    def failures(self, required, verdicts) -> list[str]:
        """The required-mode failure lines (``required.required_failures``) of this tally."""
        from ..ci.required import required_failures

        return required_failures(
            required, verdicts, self.executed,
            declined={k: (n, self.decline_reason.get(k, "")) for k, n in self.declined.items()},
            backward_selected=self.backward_selected,
            backward_runs={k: tuple(v) for k, v in self.backward_runs.items()},
            declined_inside={k: tuple(v) for k, v in self.declined_inside.items()},
        )

    def exit_status(self, failures=()) -> int:
        return run_exit_status(self.statuses, failures, self.known_gone)

    def end_record(self, failures=(), *, exit_status: int | None = None) -> dict:
        """The end record of a run this tally describes; ``exit_status`` only where a front knows more than the
        tally (pytest's own failures outside the matrix)."""
        failures = list(failures)
        status = self.exit_status(failures) if exit_status is None else exit_status
        record = end_record(self.statuses, status, failures, {f"{b}:{o}": n for (b, o), n in self.executed.items()},
                            known_gone=self.known_gone)
        record["tally"] = self.to_json()
        return record

    def to_json(self) -> dict:
        return {
            "statuses": dict(self.statuses),
            "executed": [[*k, n] for k, n in self.executed.items()],
            "declined": [[*k, n] for k, n in self.declined.items()],
            "decline_reason": [[*k, r] for k, r in self.decline_reason.items()],
            "backward_runs": [[*k, *v] for k, v in self.backward_runs.items()],
            "backward_selected": [list(k) for k in self.backward_selected],
            "declined_inside": [[*k, *v] for k, v in self.declined_inside.items()],
            "known_gone": list(self.known_gone),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunTally:
        tally = cls()
        tally.merge(data)
        return tally

    def merge(self, data: Mapping[str, Any] | RunTally) -> None:
        """Add another process's (or shard's) tally, as ``to_json()`` or a ``RunTally``."""
        if isinstance(data, RunTally):
            data = data.to_json()
        self.statuses.update(data.get("statuses") or {})
        for spec, op, n in data.get("executed", []):
            self.executed[(spec, op)] += n
        for spec, op, n in data.get("declined", []):
            self.declined[(spec, op)] += n
        for spec, op, reason in data.get("decline_reason", []):
            self.decline_reason.setdefault((spec, op), reason)
        for spec, op, n, ran, reason in data.get("backward_runs", []):
            runs = self.backward_runs.setdefault((spec, op), [0, 0, ""])
            runs[0] += n
            runs[1] += ran
            runs[2] = runs[2] or reason
        self.backward_selected.update(tuple(k) for k in data.get("backward_selected", []))
        for spec, op, n, case_id, reason in data.get("declined_inside", []):
            inside = self.declined_inside.setdefault((spec, op), [0, case_id, reason])
            inside[0] += n
        self.known_gone += [line for line in data.get("known_gone", []) if line not in self.known_gone]

    @classmethod
    def of_end(cls, end: Mapping[str, Any] | None) -> RunTally:
        """The tally a run's end record holds; for an end record written before it carried one, what it says
        (counts, executed, known_gone)."""
        end = end or {}
        if isinstance(end.get("tally"), Mapping):
            return cls.from_json(end["tally"])
        executed = [[*str(k).rsplit(":", 1), int(n)] for k, n in (end.get("executed") or {}).items()]
        return cls.from_json({"statuses": end.get("counts") or {}, "executed": executed,
                              "known_gone": [str(x) for x in end.get("known_gone") or []]})
