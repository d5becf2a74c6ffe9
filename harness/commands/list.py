"""``deltacheck list``: the case ids of a tier, or counts per axis value and pair coverage — for the whole tier,
or for the cases inside one backend's envelope (``--backend B [--sm SM]``)."""

from __future__ import annotations

import argparse
import functools
import sys

from deltacheck.cases import CaseError, KExprError
from deltacheck.cases.axes import compatible
from deltacheck.cases.coverage import coverage_table
from deltacheck.cases.matrix import tier_axes
from deltacheck.cases.spec import TIERS
from deltacheck.cases.support import OPS
from deltacheck.harness.ci.shards import Shard, ShardError, shard_cases
from deltacheck.harness.ci.tiers import TIER_TARGETS, backend_envelope, select
from deltacheck.harness.machine.availability import load_backend


def _positive_sm(text: str) -> int:
    try:
        value = int(text.upper().removeprefix("SM"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a compute capability like 90 or SM100, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a compute capability like 90 or SM100, got {text!r}")
    return value


def _task_counts(tier: str, cases) -> list[str]:
    """Per tier target (backend, architecture): how many of the tier's cases it would run, per op."""
    lines = [f"{tier} tasks per backend (cases inside its declared envelope; the rest it declines):"]
    for spec, sm in TIER_TARGETS:
        per_op = {}
        for op in OPS:
            envelope = backend_envelope(spec, op, sm=sm)
            if envelope is not None and envelope.members:
                per_op[op] = sum(envelope.contains(c) for c in cases if c.op == op)
        where = f" SM{sm}" if sm is not None else ""
        detail = ", ".join(f"{op} {n}" for op, n in per_op.items())
        lines.append(f"  {spec}{where}: {sum(per_op.values())} of {len(cases)} ({detail})")
    return lines


def run_list(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    ops = list(dict.fromkeys(args.op)) if args.op else [None]
    try:
        shard = Shard.parse(args.shard) if args.shard is not None else None
    except ShardError as error:
        print(f"deltacheck list: --shard: {error}", file=sys.stderr)
        return 2
    try:
        plugin = [args.backend] if getattr(args, "backend", None) else []
        cases = [c for op in ops for c in select(tier=args.tier, op=op, k=args.k, backends=plugin)]
    except (CaseError, KExprError) as error:
        print(f"deltacheck list: {error}", file=sys.stderr)
        return 2
    if shard is not None:
        cases = shard_cases(cases, shard)
    blocks = []  # (title or None, cases, compatible rule or None, axes)
    if args.backend:
        backend, error = load_backend(args.backend)
        if backend is None:
            print(f"deltacheck list: {error}", file=sys.stderr)
            return 2
        if not callable(getattr(backend, "envelopes", None)):
            print(f"deltacheck list: backend {args.backend!r} declares no envelope (no envelopes() method); "
                  "list the tier without --backend", file=sys.stderr)
            return 2
        for op in (ops if ops != [None] else OPS):
            envelope = backend_envelope(args.backend, op, sm=args.sm, backend=backend)
            inside = [c for c in cases if c.op == op and envelope.contains(c)]
            base = tier_axes(args.tier, op)
            rule = envelope.rule(base)
            blocks.append((envelope.name, inside, rule, envelope.axes(base),
                           [m.name for m in envelope.members]))
    elif len(ops) == 1 and ops[0] is not None:  # one op: coverage over the axes its cases are generated on
        axes = {**tier_axes(args.tier, ops[0]), "op": (ops[0],)}
        blocks.append((None, cases, functools.partial(compatible, axes=axes), axes, []))
    else:
        blocks.append((None, cases, None, None, []))
    try:
        for title, chosen, rule, axes, engines in blocks:
            if args.count:
                if title is not None and len(blocks) > 1:
                    print(f"# {title}", file=out)
                if title is not None and not engines:
                    print(f"0 cases\n{title}: no engine serves this op here", file=out)
                    continue
                kwargs = {"compatible": rule} if rule is not None else {}
                print(coverage_table(chosen, axes, **kwargs) if chosen else "0 cases", file=out)
                if title is not None:
                    print(f"envelope: {title} ({', '.join(engines)})", file=out)
            else:
                for case in chosen:
                    print(case.id, file=out)
        if args.count and not args.backend:
            print("\n".join(_task_counts(args.tier, cases)), file=out)
        if not args.count:
            print(f"{sum(len(b[1]) for b in blocks)} cases", file=sys.stderr)
        out.flush()
    except BrokenPipeError:  # `deltacheck list | head`: the reader left; that is not an error
        sys.stderr.close()
    return 0


def add_cli(commands) -> None:
    parser = commands.add_parser(
        "list", help="list the case ids of a tier (or counts and coverage, per backend envelope)",
        description="Print the case ids of a tier (one per line), or --count for counts per axis value and pair "
                    "coverage. With --backend, only the cases inside that backend's declared envelope for each op "
                    "(on --sm, a GPU architecture, when given), and coverage counted within that envelope.")
    parser.add_argument("--tier", default="L0", choices=TIERS, help="which tier (default L0)")
    parser.add_argument("--op", action="append", choices=OPS, help="only cases of this op (repeatable)")
    parser.add_argument("-k", dest="k", metavar="EXPR",
                        help="pytest-like expression over ids: substrings with and/or/not/(). A bare bf16 also "
                             "matches state_bf16; the io dtype is the token between dashes, attached to the flag "
                             "since it starts with '-': -k=-bf16-")
    parser.add_argument("--backend", metavar="B", help="only the cases inside B's declared envelope")
    parser.add_argument("--sm", type=_positive_sm, metavar="SM",
                        help="with --backend: the GPU architecture (90, 100, ...) whose engines count")
    parser.add_argument("--shard", metavar="I/N",
                        help="only shard I of N (1 <= I <= N) of the selection: the cases `run --shard I/N` and "
                             "pytest's --dc-shard I/N run. The N shards are disjoint, their union is the selection, "
                             "and a compile family stays in one shard unless it alone outweighs a shard "
                             "(docs/ci.md)")
    parser.add_argument("--count", action="store_true",
                        help="print counts per axis value and pair coverage instead of ids; the first line is "
                             "'N cases'")
    parser.set_defaults(func=lambda args: run_list(args) if not (args.sm and not args.backend)
                        else _usage("--sm needs --backend"))


def _usage(message: str) -> int:
    print(f"deltacheck list: {message}", file=sys.stderr)
    return 2
