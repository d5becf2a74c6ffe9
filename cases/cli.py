"""`deltacheck list`: print the ids of a tier (filtered by op and a -k expression), or counts per axis.

`deltacheck list` is this module's ``add_cli`` (registered by harness/cli.py); `python -m deltacheck.cases
list ...` runs it on its own, without the harness.
"""

from __future__ import annotations

import argparse
import sys

from .coverage import coverage_table
from .kexpr import KExprError
from .matrix import select
from .spec import TIERS, CaseError
from .support import OP_SUPPORT


def add_list_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--tier", default="L0", choices=TIERS, help="which tier (default L0)")
    parser.add_argument("--op", choices=tuple(OP_SUPPORT), help="only cases of this op")
    parser.add_argument("-k", dest="k", metavar="EXPR",
                        help="pytest-like expression over ids: substrings with and/or/not/(). A bare bf16 also "
                             "matches state_bf16; the io dtype is the token between dashes, attached to the flag "
                             "since it starts with '-': -k=-bf16-")
    parser.add_argument("--count", action="store_true",
                        help="print the number of cases and counts per axis value instead of ids")
    return parser


def run_list(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    try:
        cases = select(tier=args.tier, op=args.op, k=args.k)
    except (CaseError, KExprError) as error:
        print(f"deltacheck list: {error}", file=sys.stderr)
        return 2
    try:
        if args.count:
            print(coverage_table(cases), file=out)
        else:
            for case in cases:
                print(case.id, file=out)
            print(f"{len(cases)} cases", file=sys.stderr)
        out.flush()
    except BrokenPipeError:  # `deltacheck list | head`: the reader left; that is not an error
        sys.stderr.close()
    return 0


def add_cli(commands) -> None:
    parser = commands.add_parser("list", help="list the case ids of a tier",
                                 description="Print the case ids of a tier (one per line), or --count for "
                                             "counts per axis value and pair coverage.")
    add_list_arguments(parser).set_defaults(func=run_list)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="deltacheck")
    commands = parser.add_subparsers(dest="command", required=True)
    add_cli(commands)
    args = parser.parse_args(argv)
    return run_list(args)
