"""``deltacheck report``, ``deltacheck compare`` and ``deltacheck merge``.

Exit statuses: report and merge 0 when the files were written; compare 0 without a regression, 1 with
one; all 2 when an input cannot be read (missing directory, other schema) or an output cannot be written, and
compare 2 when the two runs share no (case, backend, check); 3 on an internal error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from .load import RunInputError

EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3


def _guarded(command: str, body: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn every failure into one line on stderr and an exit status: no tracebacks for a person to decode."""

    def run(args: argparse.Namespace) -> int:
        try:
            return body(args)
        except RunInputError as exc:
            print(f"deltacheck {command}: error: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except OSError as exc:
            where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
            print(f"deltacheck {command}: error: {exc.strerror or exc}{where}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except Exception as exc:
            if os.environ.get("DELTACHECK_DEBUG"):
                raise
            print(f"deltacheck {command}: internal error: {type(exc).__name__}: {exc} "
                  f"(set DELTACHECK_DEBUG=1 for the traceback, and please report it)", file=sys.stderr)
            return EXIT_INTERNAL

    return run


def _report(args: argparse.Namespace) -> int:
    from .formatting import counts_line
    from .render import write_reports

    written = write_reports(args.run_dir)
    summary = written.summary
    print(f"wrote {', '.join(str(p) for p in written.files)}")
    print(f"{summary['verdict']}: {counts_line(summary)}")
    for line in summary["required_failures"]:
        print(f"  {line}")
    skipped = [p for p in written.run.problems if p.line is not None]
    if skipped:
        print(f"  {len(skipped)} unusable line(s) of results.jsonl skipped: " + ", ".join(str(p.line) for p in skipped))
    for p in written.run.problems:
        if p.line is None:  # about the file as a whole (no header, unfolded worker files): said, never a count
            print(f"  note: {p}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from .compare import compare_runs, render_comparison
    from .load import load_run

    old = load_run(args.old)
    new = load_run(args.new)
    cmp = compare_runs(old, new, factor=args.factor, floor=args.floor)
    if not cmp.shared:
        raise RunInputError(cmp.nothing_shared())
    text = render_comparison(cmp)
    if args.out:  # written first: a --out that cannot be written fails before the comparison scrolls by
        out = Path(args.out)
        try:
            if out.parent != Path(""):
                out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text + "\n", encoding="utf-8")
        except OSError as exc:
            raise RunInputError(f"--out {out}: cannot write it: {exc.strerror or exc}") from None
    print(text)
    if args.out:
        print(f"wrote {out}", file=sys.stderr)
    return cmp.exit_status


def _merge(args: argparse.Namespace) -> int:
    from .merge import merge_runs

    merged = merge_runs(args.runs, args.out, allow_mixed_env=args.allow_mixed_env, fold=args.fold)
    print(merged)
    if args.report:
        return _report(argparse.Namespace(run_dir=str(merged.directory)))
    return 0


def _number_above(bound: float, must_be: str) -> Callable[[str], float]:
    """An argparse type: a float strictly above ``bound``; ``must_be`` says so in the error."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > bound:
            raise argparse.ArgumentTypeError(f"must be {must_be}, got {text}")
        return value
    return parse


_factor = _number_above(1.0, "greater than 1 (2.0 means 'grew more than twofold')")
_positive = _number_above(0.0, "positive")


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="render summary.json, junit.xml, summary.md and report.html for a run directory",
        description="Render a run directory's results.jsonl into summary.json (the machine-readable summary), "
                    "junit.xml (for CI), summary.md and a self-contained report.html with plots. Corrupt lines "
                    "are reported with their line numbers and skipped.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holding results.jsonl) or a results.jsonl file")
    p.set_defaults(func=_guarded("report", _report))

    c = subparsers.add_parser(
        "compare", help="compare two runs: new failures, fixed, worse, better, declined, coverage, versions",
        description="Match the results of two runs by (case id, backend, check) and list what changed, "
                    "with the environment and version differences first. Exit status 1 when something regressed "
                    "(a new failure, a worse error, a newly declined or errored result, a stability frontier that "
                    "moved the wrong way) or the new run did not finish (no end record), 0 otherwise, "
                    "2 when a run cannot be read or the two runs share no (case, backend, check) — runs of "
                    "different selections have nothing to compare, which is not 'no regression'.")
    c.add_argument("old", metavar="OLD", help="the baseline run directory")
    c.add_argument("new", metavar="NEW", help="the run directory to judge against it")
    c.add_argument("--factor", type=_factor, default=2.0,
                   help="how much the relative RMS error must grow (or shrink) to count as worse (better); default 2.0")
    c.add_argument("--floor", type=_positive, default=1e-9,
                   help="errors below this count as this, so tiny exact-ish errors are not 'worse'; default 1e-9")
    c.add_argument("--out", metavar="FILE.md", help="also write the Markdown to this file")
    c.set_defaults(func=_guarded("compare", _compare))

    m = subparsers.add_parser(
        "merge", help="merge runs of one environment (CI shards, a rerun of an interrupted run) into one run",
        description="Write a new run directory holding the results of several runs of the same environment: "
                    "one result per (case, backend, check), the last input that has it winning, so a rerun "
                    "replaces the attempt it repeats. The merge is finished only if every input finished. "
                    "Runs of different environments are refused (compare them instead).")
    m.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories, oldest first (later ones win)")
    m.add_argument("--out", required=True, metavar="DIR", help="the merged run directory to create (new or empty)")
    m.add_argument("--allow-mixed-env", action="store_true",
                   help="merge runs whose environment fingerprints differ (each input's environment is kept)")
    m.add_argument("--fold", action="store_true",
                   help="fold runs of one machine made in separate Python environments, one per backend family "
                        "(same GPU, driver and torch; disjoint backends; docs/ci.md 'Backends that cannot share "
                        "an environment')")
    m.add_argument("--report", action="store_true", help="render the reports into the merged directory")
    m.set_defaults(func=_guarded("merge", _merge))
