"""The one owner of a run: its directory (opened or resumed), the availability verdicts of its backend x op pairs, its
result stream, its tally and its end record. Its backend objects are ``backends.base.backend_for``'s: one per spec
per process, whichever front asks.

Every front drives a run through a ``RunSession``: ``deltacheck run`` / ``verify`` (``execute``: in this process or
through the pool), ``warmup`` (an ordinary run), ``frontier`` (its points through the pool) and the pytest plugin
(``pytest_plugin.DeltacheckPlugin``). So each computes a pair's availability once — ``open`` / ``resume`` write it
as the run's availability records, and every task of the pair is handed that verdict instead of asking the
backend's floors again (a pool worker receives them in its config line) — keeps one tally, and closes with the one
exit rule.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from deltacheck.cases.support import OPS

from ..backends.base import BackendLoadError, Verdict
from ..machine.availability import load_backend, pair_availability
from ..records.results import Result, ResultStream
from .rundir import new_run_dir, open_run, resume_run
from .tally import RunTally
from .task import run_task, task_record, task_summary

Pair = tuple[str, str]


class RunSession:
    """One run. ``run_dir`` is None for a run that keeps no directory (a pytest session without ``--dc-out``);
    the verdicts, the tally and the exit rule are the same either way."""

    def __init__(self, backend_specs: list[str], env, required=frozenset(), *, run_dir: Path | None = None,
                 verdicts: dict[Pair, Verdict] | None = None,
                 already: dict[tuple[str, str], list[Result]] | None = None) -> None:
        self.backend_specs, self.env, self.required = list(backend_specs), env, required
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.verdicts: dict[Pair, Verdict] = dict(verdicts or {})
        self.already = already or {}  # a resumed run's results, by (case id, backend)
        self.tally = RunTally()
        self._stream: ResultStream | None = None

    # --- the run directory -------------------------------------------------------------------------------------

    @classmethod
    def open(cls, out_root, backend_specs: list[str], env, required, argv: list[str], extra: dict | None = None,
             ) -> RunSession:
        """A new run directory under ``out_root`` with its header and availability records (removed again if
        writing them fails: no half-made run directory for reports to trip on)."""
        run_dir = new_run_dir(out_root)
        try:
            verdicts = open_run(run_dir / "results.jsonl", backend_specs, env, required, argv, extra)
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        return cls(backend_specs, env, required, run_dir=run_dir, verdicts=verdicts)

    @classmethod
    def resume(cls, run_dir, backend_specs: list[str], env, required, argv: list[str], extra: dict,
               case_ids: list[str]) -> RunSession:
        """Continue an interrupted run (``rundir.resume_run``; raises ``ResumeError``)."""
        run_dir = Path(run_dir)
        verdicts, already = resume_run(run_dir, backend_specs, env, required, argv, extra, case_ids)
        return cls(backend_specs, env, required, run_dir=run_dir, verdicts=verdicts, already=already)

    @property
    def results_path(self) -> Path | None:
        return None if self.run_dir is None else self.run_dir / "results.jsonl"

    @property
    def stream(self) -> ResultStream | None:
        """The run's results file, opened on first use (None without a run directory)."""
        if self._stream is None and self.run_dir is not None:
            self._stream = ResultStream(self.results_path)
        return self._stream

    def write(self, record) -> None:
        if self.stream is not None:
            self.stream.write(record)

    def close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    # --- backends and their verdicts --------------------------------------------------------------------------

    def verdict(self, spec: str, op: str) -> Verdict:
        """The availability verdict of ``spec:op``: the run's record of it, or computed now and kept (a pair a
        process meets first, e.g. in an xdist worker)."""
        pair = (spec, op)
        if pair not in self.verdicts:
            backend, why = load_backend(spec)
            self.verdicts[pair] = Verdict.no(why) if backend is None else pair_availability(backend, spec, op,
                                                                                            self.env)
        return self.verdicts[pair]

    def verdicts_for(self, pairs) -> dict[Pair, Verdict]:
        """The verdicts of ``pairs`` whose backend is part of this run (a required pair of another backend has
        none: required mode says it was not selected)."""
        return {pair: self.verdict(*pair) for pair in pairs if pair[0] in self.backend_specs}

    # --- tasks ------------------------------------------------------------------------------------------------

    def select(self, tasks) -> None:
        """Note the selected (case, spec) tasks before any runs (the tally sees backward cases that never ran)."""
        for case, spec in tasks:
            self.tally.select(spec, case)

    def judged_before(self, case, spec: str, checks: list[str]) -> list[Result]:
        """A resumed run's results of this task when it holds every one of ``checks``; else []."""
        held = self.already.get((case.id, spec), [])
        return held if held and set(checks) <= {r.check for r in held} else []

    def run_task(self, runner, case, spec: str, *, sink=None):
        """One task in this process: judged with the pair's verdict, streamed, recorded, tallied. Returns the
        ``task.TaskOutcome``."""
        def emit(result: Result) -> None:
            self.write(result)
            if sink is not None:
                sink(result)

        outcome = run_task(runner, case, spec, self.env, sink=emit, pair=self._pair_or_none(spec, case.op))
        self.write(task_record(case, spec, outcome))
        self.done(case, spec, task_summary(outcome.results, outcome.known))
        return outcome

    def _pair_or_none(self, spec: str, op: str) -> Verdict | None:
        if op not in OPS:
            return None
        try:
            return self.verdict(spec, op)
        except BackendLoadError:
            return None

    def done(self, case, spec: str, summary: dict) -> None:
        """A finished task's summary (from this process or a worker) into the tally."""
        self.tally.add(spec, case.op, summary, case.id)

    # --- the end ----------------------------------------------------------------------------------------------

    def failures(self, required=None) -> list[str]:
        required = self.required if required is None else required
        return self.tally.failures(required, self.verdicts_for(required))

    def finish(self, failures: list[str] | None = None, *, exit_status: int | None = None) -> int:
        """Write the end record (the one exit rule over the tally) and close the stream; returns the status."""
        failures = self.failures() if failures is None else failures
        record = self.tally.end_record(failures, exit_status=exit_status)
        self.write(record)
        self.close_stream()
        return record["exit_status"]
