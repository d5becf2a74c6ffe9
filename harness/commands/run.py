"""``deltacheck run`` and ``deltacheck verify``: select cases, size the job (``--dry-run``), and run it through
``harness.execute``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deltacheck.cases import Case, CaseError
from deltacheck.cases.support import OPS
from deltacheck.harness.backends.base import Verdict, registered, unknown_backends_message
from deltacheck.harness.backends.table import FUSED_DEFAULT, help_names, process_conflict
from deltacheck.harness.ci.known import KnownIssuesError, known_issue_paths, load_known_issues, run_backend_names
from deltacheck.harness.ci.required import RequireSpecError, format_required_report, required_failures, required_pairs
from deltacheck.harness.ci.shards import Shard, ShardError, pairs_elsewhere, shard_cases
from deltacheck.harness.ci.tiers import select
from deltacheck.harness.judge.runner import RunOptions
from deltacheck.harness.machine import leaks
from deltacheck.harness.machine.availability import case_verdict, load_backend, pair_availability
from deltacheck.harness.machine.environment import device_problem, probe_env
from deltacheck.harness.run import pool
from deltacheck.harness.run.execute import RunWriteError, execute
from deltacheck.harness.run.rundir import ResumeError, RunDirError


def _unique(values: list[str], flag: str) -> list[str]:
    """``values`` once each, in order; a repeat would run every task twice, so it is dropped with a note."""
    for value, n in Counter(values).items():
        if n > 1:
            print(f"deltacheck run: note: {flag} {value} was given {n} times; it runs once", file=sys.stderr)
    return list(dict.fromkeys(values))


def _select_cases(args) -> tuple[list[Case], list[Case]]:
    """(the cases to run, the selection they were sharded from: the same list without ``--shard``); raises
    ``CaseError`` / ``ValueError`` (a usage error) when none is selected, naming the filter that left none: an
    empty selection must not be a green run."""
    try:
        shard = Shard.parse(args.shard) if args.shard is not None else None
    except ShardError as exc:
        raise ValueError(f"--shard: {exc}") from None
    if args.case:
        cases = [Case.from_id(c) for c in _unique(args.case, "--case")]
    else:
        ops = _unique(args.op, "--op") if args.op else [None]
        cases = []
        for op in ops:
            cases += select(tier=args.tier, op=op, k=args.k, backends=args.backend or ())
        if not cases:
            where = f"tier {args.tier}" + (f" with --op {' --op '.join(ops)}" if args.op else "")
            before_k = sum(len(select(tier=args.tier, op=op, backends=args.backend or ())) for op in ops)
            if args.k and before_k:
                raise ValueError(f"no case selected: -k {args.k!r} matched none of the {before_k} cases of {where}")
            raise ValueError(f"no case selected: {where} has no cases")
    if args.limit is not None:
        cases = cases[: args.limit]
    if shard is None:
        return cases, cases
    # The shards split the whole selection (after --limit), so they add up to the run without --shard.
    mine = shard_cases(cases, shard)
    if not mine:
        raise ValueError(f"no case selected: shard {shard} is empty, since the selection has only {len(cases)} "
                         f"case(s) for {shard.count} shards; use at most {len(cases)} shards")
    return mine, cases


def _without_pairs(environ, pairs: set[tuple[str, str]]) -> dict[str, str]:
    """``environ`` with its required-mode settings requiring none of ``pairs``, all else as written: execute reads
    the required pairs from the environment it is given."""
    out = dict(environ)
    for var, value in environ.items():
        required = required_pairs({var: value})
        if not required & pairs:
            continue
        if var == "DELTACHECK_REQUIRE":
            out[var] = ",".join(e for e in value.split(",") if not required_pairs({var: e}) & pairs)
        else:  # NVTE_GDN2_TEST_REQUIRED and the like: one pair each
            out[var] = "0"
    return out


def _argument(cast, expected: str, ok) -> Callable[[str], Any]:
    """An argparse type: ``cast(text)`` that must satisfy ``ok``; otherwise a usage error naming ``expected``."""
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value
    return parse


_positive_int = _argument(int, "a whole number >= 1", lambda v: v >= 1)
_positive_seconds = _argument(float, "seconds > 0", lambda v: v > 0)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tier", default="L0", choices=["L0", "L1", "L2"], help="case tier (default L0)")
    p.add_argument("--op", action="append", choices=OPS, help="only this op (repeatable)")
    p.add_argument("-k", dest="k", default=None,
                   help="pytest-style expression over case ids (substrings with and/or/not), e.g. 'thd and not "
                        "bwd'. A bare 'bf16' also matches state_bf16; the io dtype is the token between dashes, "
                        "'-bf16-', and a value starting with '-' is attached to the flag: -k=-bf16- "
                        "(or holds a space: -k '-bf16- and thd')")
    p.add_argument("--case", action="append", help="run exactly this case id (repeatable); overrides --tier/-k")
    p.add_argument("--limit", type=_positive_int, default=None, metavar="N",
                   help="at most N cases (N >= 1), the first N after selection (default: all)")
    p.add_argument("--shard", metavar="I/N",
                   help="run only shard I of N (1 <= I <= N) of the selection (after --limit): the cases `deltacheck "
                        "list --shard I/N` prints. The N shards are disjoint and add up to the run without --shard; "
                        "fold their run directories back into one with `deltacheck merge` (docs/ci.md)")
    p.add_argument("--out", default="runs", help="root folder for run directories (default ./runs)")
    p.add_argument("--reference", default="auto", choices=["auto", "oracle", "chunked"],
                   help="fp64 reference: token oracle, chunked, or auto (oracle up to 2048 tokens)")
    p.add_argument("--device", default=None,
                   help="torch device: cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--known-issues", action="append", default=[], metavar="FILE",
                   help="a known-issues TOML file (repeatable; docs/required-mode.md): failing checks it covers are "
                        "'known', not failures, and a covered case that passes fails the run. Also read: the table "
                        "deltacheck ships and $DELTACHECK_KNOWN_ISSUES (FILE[:FILE...])")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the same-precision baseline (limits fall back to the absolute thresholds)")
    p.add_argument("--in-process", action="store_true", help="no worker process (faster start; a hard crash ends the run)")
    p.add_argument("--dry-run", action="store_true",
                   help="run nothing: print, per backend x op, how many cases would run (and with a backward) and "
                        "how many would be declined, by reason — to size a GPU job before paying for it")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue an interrupted run in its directory (--out is then unused): tasks of this "
                        "selection whose every check it holds are not run again; a task left half-judged runs "
                        "again and its new results replace the old. Refused if this is another environment, "
                        "or another selection (cases, backends, or --device/--reference/--no-baseline)")
    p.add_argument("--task-timeout", type=_positive_seconds, default=None, metavar="SECONDS",
                   help="kill a worker whose case x backend task gives no result within SECONDS (a hung kernel), "
                        "record the task as an error and go on in a fresh worker; a first Triton compile can "
                        "take minutes, so leave room for it (default: no limit)")
    p.add_argument("-j", "--jobs", type=_positive_int, default=1, metavar="N",
                   help="N worker processes side by side (default 1) taking tasks from one queue; each stays on "
                        "one compile family (backend, op, dtype, head dims) while it has tasks, so a JIT kernel "
                        "is built in few processes; with several GPUs visible, worker k uses GPU k mod count. "
                        "Speeds up first-compile-bound fused runs")
    p.add_argument("--threads", type=_positive_int, default=None, metavar="N",
                   help="torch threads in each process that runs tasks (each worker, or this one with "
                        "--in-process). Default: $OMP_NUM_THREADS if set, else each process's share of the cores "
                        "not already busy (`deltacheck env` shows it); the run header records it (options.threads)")


def _options(args) -> RunOptions:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    threads, _ = pool.torch_threads(1 if args.in_process else args.jobs, getattr(args, "threads", None))
    return RunOptions(device=device, reference=args.reference, baseline=not args.no_baseline,
                      known_issues=tuple(known_issue_paths(args.known_issues)), threads=threads)


def cmd_run(args) -> int:
    try:
        cases, selection = _select_cases(args)
    except (CaseError, ValueError) as exc:
        print(f"deltacheck run: {exc}", file=sys.stderr)
        return 2
    specs = _unique(args.backend or list(FUSED_DEFAULT), "--backend")
    unknown = [s for s in specs if ":" not in s and s not in registered()]
    if unknown:  # before a run directory, a worker or a minute is spent on it
        print(f"deltacheck run: {unknown_backends_message(unknown)}", file=sys.stderr)
        return 2
    conflict = process_conflict(specs)
    if conflict:  # before --dry-run too: it asks every backend in this one process
        print(f"deltacheck run: {conflict}", file=sys.stderr)
        return 2
    leaks.filter_at_exit()  # --in-process and --dry-run import the libraries here: cuDNN's leak report at exit
    problem = device_problem(args.device, '--device') if args.device else None
    if problem:
        print(f"deltacheck run: {problem}", file=sys.stderr)
        return 2
    if args.dry_run:
        _print_plan(plan(cases, specs, probe_env()), len(cases))
        return 0
    try:
        required = required_pairs(os.environ)
    except RequireSpecError as exc:  # a malformed setting is a usage error
        print(f"deltacheck run: {exc}", file=sys.stderr)
        return 2
    elsewhere = pairs_elsewhere(required, cases, selection)
    upfront = required_outside_selection(required, specs, cases, elsewhere)
    if upfront:  # known before the first task: fail now, in the words the end of the run would use
        print(format_required_report(upfront))  # stdout, where the end of a run prints the same report
        return 1
    if elsewhere:
        print(f"deltacheck run: note: shard {args.shard} has no case of required "
              f"{', '.join(sorted(':'.join(p) for p in elsewhere))}: the other shards judge it", file=sys.stderr)
    try:
        load_known_issues(known_issue_paths(args.known_issues), backends=run_backend_names(specs))
    except KnownIssuesError as exc:
        print(f"deltacheck run: {exc}", file=sys.stderr)
        return 2
    if args.in_process and (args.jobs > 1 or args.task_timeout):
        print("deltacheck run: --in-process runs the tasks in this process, which cannot be killed and "
              "replaced; drop it to use --jobs or --task-timeout", file=sys.stderr)
        return 2
    try:
        status, run_dir = execute(cases, specs, args.out, _options(args), in_process=args.in_process,
                                  argv=sys.argv[1:], jobs=args.jobs, resume=args.resume,
                                  task_timeout=args.task_timeout, environ=_without_pairs(os.environ, elsewhere))
    except RunDirError as exc:
        print(f"deltacheck run: --out: {exc}", file=sys.stderr)
        return 2
    except ResumeError as exc:
        print(f"deltacheck run: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        return 128 + (signal.SIGTERM if isinstance(exc, pool.Terminated) else signal.SIGINT)
    except RunWriteError as exc:
        print(f"deltacheck run: {exc}", file=sys.stderr)
        return 1
    if args.report:
        _render_report(run_dir)
    return status


def required_outside_selection(required, specs: list[str], cases: list[Case], elsewhere) -> list[str]:
    """The required-mode failure lines of required pairs this selection cannot qualify whatever runs: a backend
    not selected, or an op with no selected case (unless another shard holds it). The lines are the ones the
    end of the run would print (``required.required_failures`` with nothing executed)."""
    ops = {c.op for c in cases}
    outside = {pair for pair in required if pair not in elsewhere and (pair[0] not in specs or pair[1] not in ops)}
    if not outside:
        return []
    env = probe_env()
    verdicts = {}
    for spec, op in outside:
        if spec in specs:
            backend, load_error = load_backend(spec)
            verdicts[(spec, op)] = Verdict.no(load_error) if backend is None else pair_availability(backend, spec,
                                                                                                    op, env)
    return required_failures(outside, verdicts, {}, {})


def plan(cases: list[Case], backend_specs: list[str], env) -> list[dict]:
    """What a run would do, without running it: per backend x op, the cases each backend would run (and
    with a backward) and the ones it would decline, by reason. Asks each backend's ``check`` per case, so
    the libraries are imported here."""
    rows: dict[tuple[str, str], dict] = {}
    for spec in backend_specs:
        backend, load_error = load_backend(spec)
        for case in cases:
            row = rows.setdefault((spec, case.op), {"backend": spec, "op": case.op, "run": 0, "backward": 0,
                                                    "declined": Counter()})
            if backend is None:
                verdict = Verdict.no(load_error)
            else:
                try:
                    verdict = case_verdict(backend, spec, case, env)
                except Exception as exc:  # noqa: BLE001 - shown as that case's reason; a run records an error
                    verdict = Verdict.no(f"check() raised {type(exc).__name__}: {exc}")
            if verdict.runnable:
                row["run"] += 1
                row["backward"] += bool(case.backward and verdict.backward)
            else:
                row["declined"][verdict.reason] += 1
    return [rows[k] for k in sorted(rows)]


def _print_plan(rows: list[dict], n_cases: int, stream=None) -> None:
    stream = stream or sys.stdout
    print(f"deltacheck run --dry-run: {n_cases} cases; nothing was run", file=stream)
    for row in rows:
        declined = sum(row["declined"].values())
        print(f"  {row['backend'] + ':' + row['op']:<16} would run {row['run']:>4} (backward on {row['backward']}), "
              f"decline {declined}", file=stream)
        for reason, n in row["declined"].most_common():
            print(f"      {n:>4} × {reason}", file=stream)


def _render_report(run_dir: Path) -> None:
    from deltacheck.harness.cli import main as cli_main  # reports register themselves as `deltacheck report`

    cli_main(["report", str(run_dir)])


def cmd_verify(args) -> int:
    """The main job: the reference verifying itself plus every fused backend this machine can run."""
    # The baseline is the yardstick inside every check, not a subject: it is left out here.
    args.backend = args.backend or ["chunked", *FUSED_DEFAULT]
    args.report = True
    return cmd_run(args)


REQUIRED_HELP = """required mode (environment):
  NVTE_GDN2_TEST_REQUIRED=1          cudnn:gdn2 must run
  NVTE_GDN_TEST_REQUIRED=1           cudnn:gdn must run
  DELTACHECK_REQUIRE=cudnn:kda,fla:gdn2
                                     these backend:op pairs must run
A required pair that cannot run (package, op, runtime, version floor, GPU architecture), whose cases were
all declined, or that executed zero cases fails the run with the reason and the fix."""

REQUIRED_EPILOG = REQUIRED_HELP + """

examples:
  deltacheck run --backend cudnn --backend fla --tier L0 --report
  deltacheck run --case 'gdn2-bf16-thd-N3-T[0_63_200]-H4/4/4-K128-V128-steep-h0-cont[64]-bwd' --backend fla
  deltacheck run --backend mypkg.kernels:MyBackend --op gdn2 -k 'thd and bwd'"""

VERIFY_EPILOG = REQUIRED_HELP + """

examples:
  deltacheck verify                              # tier L0: chunked reference + cuDNN / FLA where they run
  deltacheck verify --tier L1 -j 4 --out ci-runs
  NVTE_GDN2_TEST_REQUIRED=1 deltacheck verify    # fail unless cuDNN's GDN2 runs here
  deltacheck verify --backend chunked --backend te --op gdn2"""


def add_cli(sub) -> None:
    p = sub.add_parser("run", help="run the case matrix against backends",
                       description="Run cases x backends; every check is a result in RUN_DIR/results.jsonl. "
                                   "Exit status 1 when any check fails or errors, or a required pair cannot run.",
                       epilog=REQUIRED_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(p)
    p.add_argument("--backend", action="append",
                   help=f"backend name ({help_names()}) or pkg.mod:attr "
                        f"(repeatable; default: {' and '.join(FUSED_DEFAULT)})")
    p.add_argument("--report", action="store_true", help="render the reports into the run directory afterwards")
    p.set_defaults(func=cmd_run)

    v = sub.add_parser("verify", help="the main job: reference self-check + available fused backends, with a report",
                       epilog=VERIFY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Runs the tier against the chunked reference (checked against the token "
                                   "oracle; above 2048 tokens the references swap roles, so neither is compared "
                                   "with itself) and cuDNN / FLA where this machine can run them; unavailable "
                                   "backends are reported with their reasons.")
    _add_common(v)
    v.add_argument("--backend", action="append", help="override the backend list")
    v.set_defaults(func=cmd_verify)
