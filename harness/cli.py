"""The ``deltacheck`` command line. Each subcommand lives beside the code it drives and registers
itself through ``add_cli(subparsers)``; this file only lists them."""

from __future__ import annotations

import argparse
import importlib
import sys

from deltacheck import __version__

# Modules exposing ``add_cli(subparsers)``; each parser sets ``func(args) -> int`` (the exit status).
# Listed in the order `--help` shows them: what to run first, then inspection, then reporting.
COMMAND_MODULES = [
    "deltacheck.harness.commands.list",
    "deltacheck.harness.commands.run",
    "deltacheck.harness.commands.frontier",
    "deltacheck.harness.commands.env",
    "deltacheck.harness.commands.warmup",
    "deltacheck.reports.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deltacheck",
        description=(
            "Reference-vs-fused numerical verification for gated delta-rule linear attention "
            "(GDN, KDA, GDN2, GDP): an fp64 reference, a generated case matrix, fused-kernel adapters "
            "(cuDNN frontend, flash-linear-attention, TransformerEngine (TE)), an arch/runtime availability check "
            "with required mode, and reports."
        ),
        epilog="Run `deltacheck COMMAND --help` for each command's options.",
    )
    parser.add_argument("--version", action="version", version=f"deltacheck {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
