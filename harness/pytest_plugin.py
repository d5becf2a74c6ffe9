"""pytest plugin: the case matrix x backends as ordinary test items.

Enable it with ``-p deltacheck.harness.pytest_plugin`` (the project's own ``tests/conftest.py`` does). The module
holds the options and the fixtures; ``pytest_configure`` registers one ``DeltacheckPlugin`` object per session
(pytest's own pattern for a plugin with state) that owns the session's ``RunSession``: the verdicts, the tally
(merged from xdist workers), the optional ``--dc-out`` run directory and its end record.
then any test taking the ``dc_task`` fixture is parametrized by case x backend, with the case id in
the test id — so ``-k``, ``--junitxml`` and pytest-xdist (``-n 2``; each worker pinned to one of the
visible GPUs through ``CUDA_VISIBLE_DEVICES``) work with no extra glue. Each item carries the markers of its op and
backend. A backend that cannot serve a case is skipped with its reason; a *required* pair
(``NVTE_GDN2_TEST_REQUIRED=1``, ``NVTE_GDN_TEST_REQUIRED=1``, ``DELTACHECK_REQUIRE``) fails instead, and
the session fails if a required pair executed zero cases — never a silent pass.
"""

from __future__ import annotations

import json
import os

import pytest

from deltacheck.cases.support import OPS
from deltacheck.harness.backends.base import unknown_backends_message
from deltacheck.harness.backends.table import FUSED_DEFAULT, marker

_PLUGIN_KEY = pytest.StashKey["DeltacheckPlugin"]()
_RUN_DIR_ENV = "DELTACHECK_PYTEST_RUN_DIR"


def pytest_addoption(parser):
    group = parser.getgroup("deltacheck", "deltacheck case matrix")
    group.addoption("--dc-tier", default="L0", choices=["L0", "L1", "L2"], help="case tier (default L0)")
    group.addoption("--dc-backend", action="append", default=None,
                    help=f"backend name or pkg.mod:attr (repeatable; default: {' and '.join(FUSED_DEFAULT)})")
    group.addoption("--dc-op", action="append", default=None, choices=OPS, help="only this op (repeatable)")
    group.addoption("--dc-k", default=None, help="expression over case ids applied when generating the matrix")
    group.addoption("--dc-limit", type=_positive_int, default=None, metavar="N",
                    help="at most N cases (N >= 1), the first N after selection (default: all)")
    group.addoption("--dc-shard", default=None, type=_shard, metavar="I/N",
                    help="only shard I of N (1 <= I <= N) of the matrix (after --dc-limit): the cases `deltacheck "
                         "list --shard I/N` prints, every backend's task of a case in the case's shard (docs/ci.md)")
    group.addoption("--dc-reference", default="auto", choices=["auto", "oracle", "chunked"])
    group.addoption("--dc-device", default=None, help="torch device (default: cuda if available, else cpu)")
    group.addoption("--dc-out", default=None, metavar="DIR",
                    help="also write a run directory under DIR (results.jsonl, as `deltacheck run` does) so "
                         "`deltacheck report` and `deltacheck compare` work on pytest runs")
    group.addoption("--dc-no-baseline", action="store_true",
                    help="skip the same-precision baseline (limits fall back to the absolute thresholds)")


def _positive_int(text: str) -> int:
    """``--dc-limit``: a whole number >= 1, as `deltacheck run --limit` takes it (0 or -1 are errors, not 'all')."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def _shard(text: str):
    import argparse

    from .ci.shards import Shard, ShardError

    try:
        return Shard.parse(text)
    except ShardError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def pytest_configure(config):
    for op in OPS:
        config.addinivalue_line("markers", f"{op}: a deltacheck case of op {op}")
    from .backends.base import registered

    for name in registered():  # every registered backend has a marker; the list is the registry, not a copy
        config.addinivalue_line("markers", f"{marker(name)}: a deltacheck case run against backend {name}")
    worker = _worker_id(config) or ""
    if worker.startswith("gw"):
        # One GPU per xdist worker (of those visible), before anything initializes CUDA in this process.
        from .machine.environment import visible_gpus

        gpus = visible_gpus()
        if len(gpus) > 1:
            os.environ["CUDA_VISIBLE_DEVICES"] = gpus[int(worker[2:]) % len(gpus)]
    from .ci.known import KnownIssuesError, known_issue_paths, load_known_issues, run_backend_names
    from .ci.required import RequireSpecError, required_pairs
    from .machine.leaks import filter_at_exit

    filter_at_exit()  # cuDNN's nanobind leak report at this process's exit stays out of the terminal
    try:  # a malformed DELTACHECK_REQUIRE / NVTE_* setting or known-issues file is a usage error, reported once
        required_pairs()
        load_known_issues(known_issue_paths(), backends=run_backend_names(_specs(config)))
    except (RequireSpecError, KnownIssuesError) as exc:
        raise pytest.UsageError(str(exc)) from None
    _check_usage(config)
    plugin = DeltacheckPlugin(config)
    config.stash[_PLUGIN_KEY] = plugin
    config.pluginmanager.register(plugin, "deltacheck-run")


def _check_usage(config) -> None:
    """What `deltacheck run` refuses before it starts, refused once here too (a usage error, not one error per
    item): an unusable --dc-device, a malformed --dc-k, an unknown backend name, backends that cannot share a
    process."""
    from deltacheck.cases.kexpr import KExprError, compile_k

    from .backends.base import registered
    from .backends.table import process_conflict
    from .machine.environment import device_problem

    device = config.getoption("--dc-device")
    problem = device_problem(device, "--dc-device") if device else None
    if problem:
        raise pytest.UsageError(problem)
    if config.getoption("--dc-k"):
        try:
            compile_k(config.getoption("--dc-k"))
        except KExprError as exc:
            raise pytest.UsageError(f"--dc-k: {exc}") from None
    unknown = [s for s in _specs(config) if ":" not in s and s not in registered()]
    if unknown:
        raise pytest.UsageError(unknown_backends_message(unknown, "--dc-backend"))
    conflict = process_conflict(_specs(config))  # one test process (or xdist worker) runs every backend
    if conflict:
        raise pytest.UsageError(conflict)


def _worker_id(config) -> str | None:
    """The xdist worker id ("gw0", ...) in a worker process, None in the controller or without xdist.
    (Read from the config, not the environment: a pytest started from inside a worker inherits its env.)"""
    workerinput = getattr(config, "workerinput", None)
    return workerinput.get("workerid") if workerinput else None


def _specs(config) -> list[str]:
    return config.getoption("--dc-backend") or list(FUSED_DEFAULT)


def _selection(config) -> list:
    """The matrix's cases before ``--dc-shard``: tier, ops, expression, limit."""
    from .ci.tiers import select

    cases = []
    for op in config.getoption("--dc-op") or [None]:
        cases += select(tier=config.getoption("--dc-tier"), op=op, k=config.getoption("--dc-k"), backends=_specs(config))
    if config.getoption("--dc-limit") is not None:
        cases = cases[: config.getoption("--dc-limit")]
    return cases


@pytest.fixture(scope="session")
def dc_runner(request):
    import torch

    from .ci.known import known_issue_paths
    from .judge.runner import CaseRunner, RunOptions

    config = request.config
    device = config.getoption("--dc-device") or ("cuda" if torch.cuda.is_available() else "cpu")
    return CaseRunner(RunOptions(device=device, reference=config.getoption("--dc-reference"),
                                 baseline=not config.getoption("--dc-no-baseline"),
                                 known_issues=tuple(known_issue_paths())))


@pytest.fixture(scope="session")
def dc_env(request):
    return request.config.stash[_PLUGIN_KEY].session.env


@pytest.fixture
def dc_run(request, dc_runner):
    """Run one (case, backend) task; skip with the backend's reason or fail listing every failed check."""
    from .ci.known import no_longer_reproduces

    session = request.config.stash[_PLUGIN_KEY].session

    def run(task):
        case, spec = task
        session.select([(case, spec)])
        outcome = session.run_task(dc_runner, case, spec)
        forward = next(r for r in outcome if r.check == "forward")
        bad = [r for r in outcome if r.status in ("fail", "error")]
        if bad:
            lines = [f"{r.status.upper()} {r.check}: {r.reason}" for r in bad]
            pytest.fail("\n".join(lines) + f"\nre-run: {bad[0].repro}", pytrace=False)
        gone = [issue for issue, state in outcome.known.items() if state == "gone"]
        if gone:
            pytest.fail("\n".join(no_longer_reproduces(i, case.id, spec) for i in gone), pytrace=False)
        known = [r for r in outcome if r.status == "known"]
        if known:
            pytest.xfail("; ".join(f"{r.check}: {r.reason}" for r in known[:3]))
        if forward.status == "skip":
            # A required pair's declines are judged once, for the session, by the same tally `deltacheck run`
            # uses (harness/run/tally.py): declines outside the backend's envelope are skips there too.
            pytest.skip(forward.reason)
        return outcome

    return run


class DeltacheckPlugin:
    """The session's state and the hooks that read it: collection counts (for the nothing-ran rule), the
    ``RunSession`` every matrix item runs through, the xdist hand-over of its tally, the end of the session."""

    def __init__(self, config) -> None:
        from .ci.required import required_pairs
        from .machine.environment import probe_env

        self.config = config
        self.collected_matrix = False
        self.matrix_items = self.other_items = 0
        self.failures: list[str] = []
        self.nothing_ran = False
        self.session = self._open(config, probe_env(), required_pairs())

    def _open(self, config, env, required):
        """The controller creates the run directory (``--dc-out``) and writes the header and availability records;
        every process (each xdist worker, or the only one) streams its results to a file of its own inside it."""
        from pathlib import Path

        from .run.rundir import RunDirError
        from .run.session import RunSession

        specs, worker = _specs(config), _worker_id(config)
        if worker is None and config.getoption("--dc-out"):
            import sys

            try:
                session = RunSession.open(config.getoption("--dc-out"), specs, env, required,
                                          ["pytest", *sys.argv[1:]])
            except RunDirError as exc:
                raise pytest.UsageError(f"--dc-out: {exc}") from None
            os.environ[_RUN_DIR_ENV] = str(session.run_dir)  # xdist workers start later and inherit it
            return session
        session = RunSession(specs, env, required)
        path = os.environ.get(_RUN_DIR_ENV) if worker else None
        if path:  # an xdist worker of a --dc-out session: its own file in the controller's directory
            from .records.results import ResultStream

            session._stream = ResultStream(Path(path) / f"results.{worker}.jsonl")
        return session

    def pytest_generate_tests(self, metafunc):
        if "dc_task" not in metafunc.fixturenames:
            return
        config = metafunc.config
        cases = _selection(config)
        if config.getoption("--dc-shard") is not None:
            from .ci.shards import shard_cases

            cases = shard_cases(cases, config.getoption("--dc-shard"))
        from .backends.base import registered

        registered_names = set(registered())
        params = []
        for spec in _specs(config):
            for case in cases:
                marks = [getattr(pytest.mark, case.op)]
                if spec in registered_names:
                    marks.append(getattr(pytest.mark, marker(spec)))
                params.append(pytest.param((case, spec), id=f"{spec}::{case.id}", marks=marks))
        metafunc.parametrize("dc_task", params)

    @pytest.hookimpl(tryfirst=True)  # before -k / -m deselect anything: "-k matched none" must still count
    def pytest_collection_modifyitems(self, session, config, items):
        self.collected_matrix = any("dc_task" in getattr(i, "fixturenames", ()) for i in items)

    def pytest_collection_finish(self, session):
        """What remains after deselection: matrix items and other tests (for the nothing-ran rule)."""
        matrix = sum("dc_task" in getattr(i, "fixturenames", ()) for i in session.items)
        self.matrix_items, self.other_items = matrix, len(session.items) - matrix

    def pytest_testnodedown(self, node, error):
        raw = getattr(node, "workeroutput", {}).get("deltacheck")
        if raw:
            data = json.loads(raw)
            self.collected_matrix = self.collected_matrix or data.get("collected_matrix", False)
            self.matrix_items = max(self.matrix_items, data.get("matrix_items", 0))
            self.other_items = max(self.other_items, data.get("other_items", 0))
            self.session.tally.merge(data["tally"])

    def pytest_sessionfinish(self, session, exitstatus):
        config = self.config
        if hasattr(config, "workeroutput"):  # an xdist worker: hand the tally to the controller
            self.session.close_stream()
            config.workeroutput["deltacheck"] = json.dumps({
                "collected_matrix": self.collected_matrix, "tally": self.session.tally.to_json(),
                "matrix_items": self.matrix_items, "other_items": self.other_items})
            return
        self.failures = self._required_failures()
        if self.failures:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        elif (self._nothing_verified() and session.exitstatus == pytest.ExitCode.OK
              and not config.getoption("collectonly")):
            # A session of matrix items only, none of which judged a check: as `deltacheck run` (harness/records/exitrule.py)
            # it exits 5, so a CI job whose fused libraries were all missing cannot read green. Other tests beside
            # the matrix (the project's own suite) keep pytest's verdict; the terminal summary says it either way.
            self.nothing_ran = True
            session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
        self._close_run_dir(int(session.exitstatus))

    def _nothing_verified(self) -> bool:
        """The session ran matrix items and nothing else, and not one of them had a check judged."""
        return bool(self.matrix_items) and not self.other_items and not sum(self.session.tally.executed.values())

    def _required_failures(self) -> list[str]:
        required = self.session.required
        if not required or not self.collected_matrix:
            return []
        shard = self.config.getoption("--dc-shard")
        if shard is not None:  # pairs whose cases all lie in other shards are theirs to judge (as `run --shard`)
            from .ci.shards import pairs_elsewhere, shard_cases

            selection = _selection(self.config)
            elsewhere = pairs_elsewhere(required, shard_cases(selection, shard), selection)
            required = {pair for pair in required if pair not in elsewhere}
        return self.session.failures(required)

    def _close_run_dir(self, exit_status: int) -> None:
        """Fold the workers' files into results.jsonl and write the end record (the one exit rule, over the tally
        merged from every process)."""
        session = self.session
        if session.run_dir is None:
            return
        from .records.results import fold_parts

        session.close_stream()
        fold_parts(session.results_path, sorted(session.run_dir.glob("results.gw*.jsonl")))
        # An error pytest saw outside the matrix (a failing ordinary test, a collection error) still marks the
        # directory failed.
        recorded = session.tally.exit_status(self.failures)
        if exit_status not in (0, 5) and recorded != 1:
            recorded = 1
        session.finish(self.failures, exit_status=recorded)

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        from .ci.known import format_known_report
        from .ci.required import format_required_report

        tally = self.session.tally
        if self.failures:
            terminalreporter.section("deltacheck required mode", sep="=", red=True, bold=True)
            terminalreporter.write_line(format_required_report(self.failures))
        if tally.known_gone:
            terminalreporter.section("deltacheck known issues", sep="=", red=True, bold=True)
            terminalreporter.write_line(format_known_report(tally.known_gone))
        if self.matrix_items and not sum(tally.executed.values()) and not config.getoption("collectonly"):
            terminalreporter.section("deltacheck", sep="=", red=True, bold=True)
            exit_note = " (exit status 5)" if self.nothing_ran else ""
            terminalreporter.write_line(f"NOTHING RAN: none of the {self.matrix_items} matrix item(s) judged a "
                                        f"check (every one declined or skipped, reasons in the skips){exit_note}")
