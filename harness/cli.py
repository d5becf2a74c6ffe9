"""The ``deltacheck`` command line. Each subcommand lives beside the code it drives and registers itself through
``add_cli(subparsers)``; this file only lists them, and imports only the module of the command being run: the
reports (``report``, ``compare``, ``merge``) need no torch and start in a fraction of a second, and ``--help``
imports nothing."""

from __future__ import annotations

import argparse
import importlib
import sys

from deltacheck import __version__
from deltacheck.harness.machine import leaks

# command -> (the module whose ``add_cli(subparsers)`` registers it, its one-line help). Each parser sets
# ``func(args) -> int`` (the exit status). In the order `--help` shows them: what to run first, then inspection,
# then reporting. The help here is what `deltacheck --help` prints without importing the module; a test holds it
# equal to the module's own.
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("deltacheck.harness.commands.list",
             "list the case ids of a tier (or counts and coverage, per backend envelope)"),
    "run": ("deltacheck.harness.commands.run", "run the case matrix against backends"),
    "verify": ("deltacheck.harness.commands.run",
               "the main job: reference self-check + available fused backends, with a report"),
    "frontier": ("deltacheck.harness.commands.frontier",
                 "measure where a kernel stops being right: steeper decays, longer sequences, larger or smaller "
                 "inputs"),
    "env": ("deltacheck.harness.commands.env",
            "show this machine (GPU, runtimes, libraries) and which backend:op pairs can run"),
    "warmup": ("deltacheck.harness.commands.warmup", "autotune FLA's kernels once and record the winners for later runs"),
    "report": ("deltacheck.reports.cli", "render summary.json, junit.xml, summary.md and report.html for a run directory"),
    "compare": ("deltacheck.reports.cli",
                "compare two runs: new failures, fixed, worse, better, declined, coverage, versions"),
    "merge": ("deltacheck.reports.cli",
              "merge runs of one environment (CI shards, a rerun of an interrupted run) into one run"),
}
COMMAND_MODULES = list(dict.fromkeys(module for module, _ in COMMANDS.values()))


def _command_of(argv: list[str]) -> str | None:
    """The command named in ``argv`` (its first word that is not an option), if it is one of ours."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def build_parser(command: str | None = None, *, every: bool = False) -> argparse.ArgumentParser:
    """The parser with ``command``'s module registered (``every``: all modules); the other commands are listed
    by name and help only, so that naming one needs no import."""
    parser = argparse.ArgumentParser(
        prog="deltacheck",
        description=(
            "Reference-vs-fused numerical verification for gated delta-rule linear attention "
            "(GDN, KDA, GDN2, GDP): an fp64 reference, a generated case matrix, fused-kernel adapters "
            "(cuDNN frontend, flash-linear-attention, TransformerEngine (TE), or your own), an arch/runtime "
            "availability check with required mode, and reports."
        ),
        epilog="Run `deltacheck COMMAND --help` for each command's options.",
    )
    parser.add_argument("--version", action="version", version=f"deltacheck {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = COMMAND_MODULES if every else ([COMMANDS[command][0]] if command else [])
    for name in modules:
        importlib.import_module(name).add_cli(sub)
    for name, (_, help_text) in COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # Any command may have imported cuDNN by its exit (frontier, env, warmup, a report of a run in this process);
    # the filter costs nothing unless a nanobind extension is loaded then.
    leaks.filter_at_exit()
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
