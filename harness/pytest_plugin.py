"""pytest plugin: the case matrix x backends as ordinary test items.

Enable it with ``-p deltacheck.harness.pytest_plugin`` (the project's own ``tests/conftest.py`` does),
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
from collections import Counter

import pytest

from deltacheck.cases.support import OPS
from deltacheck.harness.backends.base import unknown_backends_message

_STATE_KEY = pytest.StashKey[dict]()


def pytest_addoption(parser):
    group = parser.getgroup("deltacheck", "deltacheck case matrix")
    group.addoption("--dc-tier", default="L0", choices=["L0", "L1", "L2"], help="case tier (default L0)")
    group.addoption("--dc-backend", action="append", default=None,
                    help="backend name or pkg.mod:attr (repeatable; default: cudnn and fla)")
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

    from .shards import Shard, ShardError

    try:
        return Shard.parse(text)
    except ShardError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def pytest_configure(config):
    for op in OPS:
        config.addinivalue_line("markers", f"{op}: a deltacheck case of op {op}")
    from .backends.base import registered

    for name in registered():  # every registered backend has a marker; the list is the registry, not a copy
        config.addinivalue_line("markers", f"{_marker(name)}: a deltacheck case run against backend {name}")
    worker = _worker_id(config) or ""
    if worker.startswith("gw"):
        # One GPU per xdist worker (of those visible), before anything initializes CUDA in this process.
        from .environment import visible_gpus

        gpus = visible_gpus()
        if len(gpus) > 1:
            os.environ["CUDA_VISIBLE_DEVICES"] = gpus[int(worker[2:]) % len(gpus)]
    from .leaks import filter_at_exit
    from .required import RequiredTally, RequireSpecError, required_pairs

    filter_at_exit()  # cuDNN's nanobind leak report at this process's exit stays out of the terminal
    config.stash[_STATE_KEY] = {"tally": RequiredTally()}
    _open_run_dir(config)
    from .known import KnownIssuesError, known_issue_paths, load_known_issues, run_backend_names

    try:  # a malformed DELTACHECK_REQUIRE / NVTE_* setting or known-issues file is a usage error, reported once
        required_pairs()
        load_known_issues(known_issue_paths(), backends=run_backend_names(_specs(config)))
    except (RequireSpecError, KnownIssuesError) as exc:
        raise pytest.UsageError(str(exc)) from None
    _check_usage(config)


def _check_usage(config) -> None:
    """What `deltacheck run` refuses before it starts, refused once here too (a usage error, not one error per
    item): an unusable --dc-device, a malformed --dc-k, an unknown backend name."""
    from deltacheck.cases.kexpr import KExprError, compile_k

    from .backends.base import registered
    from .environment import device_problem

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


def _worker_id(config) -> str | None:
    """The xdist worker id ("gw0", ...) in a worker process, None in the controller or without xdist.
    (Read from the config, not the environment: a pytest started from inside a worker inherits its env.)"""
    workerinput = getattr(config, "workerinput", None)
    return workerinput.get("workerid") if workerinput else None


def _marker(name: str) -> str:
    return "backend_" + name.replace("-", "_").replace("@", "_")  # cudnn@gdn_cutile -> backend_cudnn_gdn_cutile


def _specs(config) -> list[str]:
    return config.getoption("--dc-backend") or ["cudnn", "fla"]


def pytest_generate_tests(metafunc):
    if "dc_task" not in metafunc.fixturenames:
        return
    config = metafunc.config
    cases = _selection(config)
    if config.getoption("--dc-shard") is not None:
        from .shards import shard_cases

        cases = shard_cases(cases, config.getoption("--dc-shard"))
    from .backends.base import registered

    registered_names = set(registered())
    params = []
    for spec in _specs(config):
        for case in cases:
            marks = [getattr(pytest.mark, case.op)]
            if spec in registered_names:
                marks.append(getattr(pytest.mark, _marker(spec)))
            params.append(pytest.param((case, spec), id=f"{spec}::{case.id}", marks=marks))
    metafunc.parametrize("dc_task", params)


def _selection(config) -> list:
    """The matrix's cases before ``--dc-shard``: tier, ops, expression, limit."""
    from .tiers import select

    cases = []
    for op in config.getoption("--dc-op") or [None]:
        cases += select(tier=config.getoption("--dc-tier"), op=op, k=config.getoption("--dc-k"))
    if config.getoption("--dc-limit") is not None:
        cases = cases[: config.getoption("--dc-limit")]
    return cases


@pytest.fixture(scope="session")
def dc_runner(request):
    import torch

    from .known import known_issue_paths
    from .runner import CaseRunner, RunOptions

    config = request.config
    device = config.getoption("--dc-device") or ("cuda" if torch.cuda.is_available() else "cpu")
    return CaseRunner(RunOptions(device=device, reference=config.getoption("--dc-reference"),
                                 baseline=not config.getoption("--dc-no-baseline"),
                                 known_issues=tuple(known_issue_paths())))


@pytest.fixture(scope="session")
def dc_env():
    from .environment import probe_env

    return probe_env()


@pytest.fixture
def dc_run(request, dc_runner, dc_env):
    """Run one (case, backend) task; skip with the backend's reason or fail listing every failed check."""
    from .known import no_longer_reproduces
    from .task import run_task, task_record, task_summary

    state = request.config.stash[_STATE_KEY]

    def run(task):
        case, spec = task
        stream = state.get("stream")
        results = run_task(dc_runner, case, spec, dc_env, sink=stream.write if stream is not None else None)
        if stream is not None:
            stream.write(task_record(case, spec, results))
        state["tally"].select(spec, case)
        state["tally"].add(spec, case.op, task_summary(results), case.id)
        forward = next(r for r in results if r.check == "forward")
        bad = [r for r in results if r.status in ("fail", "error")]
        if bad:
            lines = [f"{r.status.upper()} {r.check}: {r.reason}" for r in bad]
            pytest.fail("\n".join(lines) + f"\nre-run: {bad[0].repro}", pytrace=False)
        gone = [issue for issue, outcome in results.known.items() if outcome == "gone"]
        if gone:
            pytest.fail("\n".join(no_longer_reproduces(i, case.id, spec) for i in gone), pytrace=False)
        known = [r for r in results if r.status == "known"]
        if known:
            pytest.xfail("; ".join(f"{r.check}: {r.reason}" for r in known[:3]))
        if forward.status == "skip":
            # A required pair's declines are judged once, for the session, by the same tally `deltacheck run`
            # uses (harness/required.py): declines outside the backend's envelope are skips there too.
            pytest.skip(forward.reason)
        return results

    return run


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    state = config.stash.get(_STATE_KEY, None)
    if state is None:
        return
    if state.get("stream") is not None:
        state["stream"].close()
    if hasattr(config, "workeroutput"):  # an xdist worker: hand the counts to the controller
        config.workeroutput["deltacheck"] = json.dumps(_dump(state))
        return
    failures = _required_failures(config, state)
    if failures:
        state["failures"] = failures
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif (_nothing_verified(state) and session.exitstatus == pytest.ExitCode.OK
          and not config.getoption("collectonly")):
        # A session of matrix items only, none of which judged a check: as `deltacheck run` (harness/exitrule.py)
        # it exits 5, so a CI job whose fused libraries were all missing cannot read green. Other tests beside
        # the matrix (the project's own suite) keep pytest's verdict; the terminal summary says it either way.
        state["nothing_ran"] = True
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
    _close_run_dir(state, failures, int(session.exitstatus))


def _nothing_verified(state) -> bool:
    """The session ran matrix items and nothing else, and not one of them had a check judged."""
    return bool(state.get("matrix_items")) and not state.get("other_items") and not sum(
        state["tally"].executed.values())


def pytest_testnodedown(node, error):
    raw = getattr(node, "workeroutput", {}).get("deltacheck")
    if raw:
        state = node.config.stash[_STATE_KEY]
        data = json.loads(raw)
        state["collected_matrix"] = state.get("collected_matrix") or data.get("collected_matrix", False)
        state["matrix_items"] = max(state.get("matrix_items", 0), data.get("matrix_items", 0))
        state["other_items"] = max(state.get("other_items", 0), data.get("other_items", 0))
        state["tally"].merge(data["tally"])


def _dump(state) -> dict:
    return {"collected_matrix": bool(state.get("collected_matrix")), "tally": state["tally"].to_json(),
            "matrix_items": state.get("matrix_items", 0), "other_items": state.get("other_items", 0)}


def _required_failures(config, state) -> list[str]:
    from .availability import load_backend, pair_availability
    from .backends.base import Verdict
    from .environment import probe_env
    from .required import required_pairs

    required = required_pairs()
    if not required or not _uses_matrix(config):
        return []
    shard = config.getoption("--dc-shard")
    if shard is not None:  # pairs whose cases all lie in other shards are theirs to judge (as `run --shard`)
        from .shards import pairs_elsewhere, shard_cases

        selection = _selection(config)
        elsewhere = pairs_elsewhere(required, shard_cases(selection, shard), selection)
        required = {pair for pair in required if pair not in elsewhere}
    env = probe_env()
    verdicts = {}
    selected = set(_specs(config))
    for spec, op in required:
        if spec not in selected:  # not part of this session: the verdict says so ("select it with ...")
            continue
        backend, load_error = load_backend(spec)
        verdicts[(spec, op)] = (Verdict.no(load_error) if backend is None
                                else pair_availability(backend, spec, op, env))
    return state["tally"].failures(required, verdicts)


def _uses_matrix(config) -> bool:
    return bool(config.stash[_STATE_KEY].get("collected_matrix"))


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselect anything: "-k matched none" must still count
def pytest_collection_modifyitems(session, config, items):
    config.stash[_STATE_KEY]["collected_matrix"] = any("dc_task" in getattr(i, "fixturenames", ()) for i in items)


def pytest_collection_finish(session):
    """What remains after deselection: matrix items and other tests (for the nothing-ran rule)."""
    state = session.config.stash.get(_STATE_KEY, None)
    if state is None:
        return
    matrix = sum("dc_task" in getattr(i, "fixturenames", ()) for i in session.items)
    state["matrix_items"], state["other_items"] = matrix, len(session.items) - matrix


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = config.stash.get(_STATE_KEY, None)
    if not state:
        return
    from .known import format_known_report
    from .required import format_required_report

    if state.get("failures"):
        terminalreporter.section("deltacheck required mode", sep="=", red=True, bold=True)
        terminalreporter.write_line(format_required_report(state["failures"]))
    if state["tally"].known_gone:
        terminalreporter.section("deltacheck known issues", sep="=", red=True, bold=True)
        terminalreporter.write_line(format_known_report(state["tally"].known_gone))
    if (state.get("matrix_items") and not sum(state["tally"].executed.values())
            and not config.getoption("collectonly")):
        terminalreporter.section("deltacheck", sep="=", red=True, bold=True)
        exit_note = " (exit status 5)" if state.get("nothing_ran") else ""
        terminalreporter.write_line(f"NOTHING RAN: none of the {state['matrix_items']} matrix item(s) judged a check "
                                    f"(every one declined or skipped, reasons in the skips){exit_note}")


# --- --dc-out: a run directory, as `deltacheck run` writes it --------------------------------------

_RUN_DIR_ENV = "DELTACHECK_PYTEST_RUN_DIR"


def _open_run_dir(config) -> None:
    """The controller creates the run directory and writes the header and availability records; every process
    (each xdist worker, or the only one) streams its results to a file of its own inside it."""
    from pathlib import Path

    from .results import ResultStream

    state = config.stash[_STATE_KEY]
    worker = _worker_id(config)
    if worker is None and config.getoption("--dc-out"):
        import sys

        from .environment import probe_env
        from .required import required_pairs
        from .rundir import RunDirError, new_run_dir, open_run

        try:
            run_dir = new_run_dir(config.getoption("--dc-out"))
        except RunDirError as exc:
            raise pytest.UsageError(f"--dc-out: {exc}") from None
        os.environ[_RUN_DIR_ENV] = str(run_dir)  # xdist workers start later and inherit it
        open_run(run_dir / "results.jsonl", _specs(config), probe_env(), required_pairs(),
                 ["pytest", *sys.argv[1:]])
        state["run_dir"] = run_dir
    path = os.environ.get(_RUN_DIR_ENV) if worker else state.get("run_dir")
    if path:
        name = f"results.{worker}.jsonl" if worker else "results.jsonl"
        state["stream"] = ResultStream(Path(path) / name)


def _close_run_dir(state, failures, exit_status: int) -> None:
    """Fold the workers' files into results.jsonl and write the end record."""
    run_dir = state.get("run_dir")
    if run_dir is None:
        return
    from .exitrule import run_exit_status
    from .results import ResultStream, end_record, fold_parts, read_records

    main = run_dir / "results.jsonl"
    fold_parts(main, sorted(run_dir.glob("results.gw*.jsonl")))
    counts = Counter(rec["status"] for _, rec, _ in read_records(main) if rec and rec["kind"] == "result")
    # The run directory's status is the one rule's (as `deltacheck run` writes it); an error pytest saw outside
    # the matrix (a failing ordinary test, a collection error) still marks the directory failed.
    recorded = run_exit_status(counts, failures, state["tally"].known_gone)
    if exit_status not in (0, 5) and recorded != 1:
        recorded = 1
    with ResultStream(main) as out:
        out.write(end_record(counts, recorded, failures,
                             {f"{b}:{o}": n for (b, o), n in state["tally"].executed.items()},
                             known_gone=state["tally"].known_gone))
