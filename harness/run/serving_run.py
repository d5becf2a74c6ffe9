"""Run the serving checks over the serving tier and the invariance checks over a training tier, for backends, and
print per backend x check: run / passed / failed / declined (and reported, error). Issue 26's table.

    python -m deltacheck.harness.run.serving_run --backend fla-recurrent --backend fla --tier L0 \
        --serving-tier L0 --out results.json [--budget-s 60] [--checks causality,graph_replay] [--op kda]

``--case ID`` (repeatable) runs the checks of those cases only, instead of the tiers. ``--budget-s`` stops starting new checks for a backend after that many seconds (what ran is kept and the rest is counted as
not run, never as passed). ``--shard I/N`` takes every N-th case (I = 1..N; a case's checks stay together), so N
processes split one backend's list. ``--resume FILE.jsonl`` keeps every result already in FILE (any status but
not_run), runs only the rest and appends to FILE; a check that was in flight when an earlier process died (its pair in
FILE.inflight) runs last, so a crash costs the rest of the list nothing. Each result carries the case id, so a failure
reproduces with ``serving_checks.<check>(get_backend(name), Case.from_id(id), probe_env(), device)``.

Known issues (``harness/ci/known_issues.toml``, ``DELTACHECK_KNOWN_ISSUES``, ``--known-issues FILE``) apply as in
``deltacheck run``, through the same functions: a failing check an entry names becomes ``known``; a case whose
checks in an entry's scope all pass is printed as "known issue no longer reproduces" and fails the run (strict).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from types import SimpleNamespace

from deltacheck.cases.serving import check_for, serving_cases

from ..backends.base import backend_for
from ..backends.table import process_conflict
from ..ci.known import applicable, format_known_report, mark_known, no_longer_reproduces, outcomes
from ..judge.invariance_checks import INVARIANCE_CHECKS
from ..judge.serving_checks import SERVING_CHECKS
from ..machine.environment import probe_env

ALL_CHECKS = (*SERVING_CHECKS, *INVARIANCE_CHECKS)


def plan(tier: str, serving_tier: str, checks, op=None) -> list[tuple[str, object]]:
    """(check, case) pairs: each serving case under the check it exists for, then every case of ``tier`` under
    each invariance check asked for, case by case (a budget then cuts cases, not whole checks; one compile serves
    the case's three checks), the ops taken in turn (``interleave_ops``)."""
    from ..ci.tiers import select

    pairs = [(check_for(c), c) for c in serving_cases(serving_tier, op) if check_for(c) in checks]
    # The invariance checks judge forward calls: a backward or continuation case contributes its forward call.
    training = list(dict.fromkeys(c.replace(backward=False, splits=()) for c in (select(tier, op=op) if tier else [])))
    training = interleave_ops(training)
    order = [name for name in ("causality", "graph_replay", "batch_invariance") if name in checks]
    pairs += [(name, c) for c in training for name in order]
    return pairs


def plan_cases(case_ids, checks) -> list[tuple[str, object]]:
    """(check, case) pairs for the cases named (``--case``): a serving case (pool, chain, spec or checkpoint axes)
    under the check it exists for, any other under each invariance check asked for (its forward call)."""
    from deltacheck.cases.spec import Case

    pairs = []
    for case_id in case_ids:
        case = Case.from_id(case_id)
        if case.pool or case.checkpoint_every:
            pairs += [(check_for(case), case)] if check_for(case) in checks else []
            continue
        case = case.replace(backward=False, splits=())
        pairs += [(name, case) for name in ("causality", "graph_replay", "batch_invariance") if name in checks]
    return pairs


def interleave_ops(cases: list) -> list:
    """The cases op by op in turn (first gdn, first kda, ..., second gdn, ...), each op's own order kept: a budget
    that cuts the list then leaves every op of the tier some cases instead of judging only the first op's."""
    by_op: dict[str, list] = {}
    for case in cases:
        by_op.setdefault(case.op, []).append(case)
    columns = list(by_op.values())
    return [col[i] for i in range(max(map(len, columns), default=0)) for col in columns if i < len(col)]


def shard(pairs: list, spec: str) -> list:
    """The pairs of every N-th case (``spec`` "I/N", I = 1..N), in order; a case's checks stay in one shard."""
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError(f"--shard {spec!r}: expected I/N, two integers, e.g. 2/3") from None
    if not 1 <= i <= n:
        raise ValueError(f"--shard {spec}: I must be 1..N")
    order = list(dict.fromkeys(case.id for _, case in pairs))
    mine = {cid for k, cid in enumerate(order) if k % n == i - 1}
    return [(name, case) for name, case in pairs if case.id in mine]


def load_done(path: str) -> tuple[list[dict], tuple | None]:
    """The results already in ``path`` (a results JSONL; not_run lines dropped, a pair's last line wins) and the
    pair ``(backend, check, case)`` recorded in ``path.inflight`` (a check that never finished), or None."""
    done: dict[tuple, dict] = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)  # a line cut by a kill mid-write would raise: results are written whole
                if r["status"] != "not_run":
                    done[(r["backend"], r["check"], r["case"])] = r
    inflight = None
    if os.path.exists(path + ".inflight"):
        with open(path + ".inflight") as f:
            text = f.read().strip()
        if text:
            inflight = tuple(json.loads(text))
    return list(done.values()), inflight


def apply_known(results: list[dict], issues, env, names=None) -> list[str]:
    """The known-issue entries on serving results, as ``deltacheck run`` applies them (``ci.known``): per backend x
    case, each result an applicable entry explains becomes ``known`` (in place, reason naming the entry); returns
    the "no longer reproduces" line of every entry whose in-scope checks all passed on a case. ``names``: spec ->
    the backend's ``name`` (an entry may name either); idempotent, so resumed results are judged the same."""
    from deltacheck.cases.spec import Case

    by_case: dict[tuple, list[dict]] = {}
    for r in results:
        by_case.setdefault((r["backend"], r["case"]), []).append(r)
    gone = []
    for (spec, case_id), rows in by_case.items():
        entries = applicable(issues, Case.from_id(case_id), spec, (names or {}).get(spec, spec), env) if issues else []
        if not entries:
            continue
        views = [SimpleNamespace(check=r["check"], status=r["status"], reason=r.get("reason", ""),
                                 metrics=r.setdefault("numbers", {})) for r in rows]
        for r, view in zip(rows, views):
            mark_known(view, entries)
            r["status"], r["reason"] = view.status, view.reason
        sources = {i.id: i.source for i in entries}
        gone += [no_longer_reproduces(i, case_id, spec, sources[i])
                 for i, verdict in outcomes(views, entries).items() if verdict == "gone"]
    return gone


def run(backends, pairs, device: str, budget_s: float | None = None, stream=sys.stdout, lines=None,
        done=(), inflight_path=None, last=None, issues=()) -> list[dict]:
    """Every pair for every backend; ``budget_s`` per backend; ``lines``: a file each result is appended to as one
    JSON line the moment it exists (what a run killed by a timeout leaves). ``done``: results kept from an earlier
    run (their pairs are not run again); ``inflight_path``: a file holding the pair being checked, cleared when the
    run ends; ``last``: a ``(backend, check, case)`` pair put at the end of its backend's list. ``issues``: known-issue
    entries, applied to each result before it is written (``apply_known``)."""
    env = probe_env()
    results = list(done)
    skip = {(r["backend"], r["check"], r["case"]) for r in done}
    for spec in backends:
        backend = backend_for(spec)
        start = time.monotonic()
        todo = [(name, case) for name, case in pairs if (spec, name, case.id) not in skip]
        todo.sort(key=lambda p: (spec, p[0], p[1].id) == last)  # stable: only the pair that died moves
        for name, case in todo:
            if budget_s is not None and time.monotonic() - start > budget_s:
                results.append({"check": name, "backend": spec, "case": case.id, "status": "not_run",
                                "reason": f"budget of {budget_s:g} s spent", "numbers": {}})
                continue
            fn = SERVING_CHECKS.get(name) or INVARIANCE_CHECKS[name]
            if inflight_path:
                with open(inflight_path, "w") as f:
                    f.write(json.dumps([spec, name, case.id]))
            t0 = time.monotonic()
            result = fn(backend, case, env, device).as_dict()
            result["backend"] = spec
            result["seconds"] = round(time.monotonic() - t0, 3)
            apply_known([result], issues, env, {spec: getattr(backend, "name", spec)})
            results.append(result)
            if lines is not None:
                lines.write(json.dumps(result, default=str) + "\n")
                lines.flush()
            if result["status"] in ("failed", "error", "known"):
                print(f"{result['status'].upper()} {spec} {name} {case.id}: {result['reason']}", file=stream,
                      flush=True)
    if inflight_path and os.path.exists(inflight_path):
        os.remove(inflight_path)
    return results


def table(results: list[dict]) -> str:
    """``backend check run passed failed declined reported error not_run known`` per pair, run = passed + failed +
    reported + error + known (a decline or a case past the budget did not run)."""
    counts = collections.defaultdict(collections.Counter)
    for r in results:
        counts[(r["backend"], r["check"])][r["status"]] += 1
    cols = ("passed", "failed", "declined", "reported", "error", "not_run", "known")
    lines = ["backend check run " + " ".join(cols)]
    for (backend, check), c in sorted(counts.items()):
        ran = c["passed"] + c["failed"] + c["reported"] + c["error"] + c["known"]
        lines.append(f"{backend} {check} {ran} " + " ".join(str(c[k]) for k in cols))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deltacheck.harness.run.serving_run", description=__doc__.split("\n")[0])
    parser.add_argument("--backend", action="append", required=True)
    parser.add_argument("--tier", default="L0", help="training tier for the invariance checks ('' for none)")
    parser.add_argument("--serving-tier", default="L0")
    parser.add_argument("--checks", default=",".join(ALL_CHECKS))
    parser.add_argument("--op", default=None)
    parser.add_argument("--case", action="append", default=None, metavar="ID",
                        help="only these cases (repeatable; instead of the tiers), e.g. to reproduce one result")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--budget-s", type=float, default=None)
    parser.add_argument("--shard", default=None, metavar="I/N", help="every N-th case, from the I-th (1..N)")
    parser.add_argument("--resume", default=None, metavar="FILE.jsonl",
                        help="keep the results in FILE, run the rest, append to FILE")
    parser.add_argument("--known-issues", action="append", default=[], metavar="FILE",
                        help="known-issue entries (as deltacheck run's), after the shipped table and "
                             "DELTACHECK_KNOWN_ISSUES")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    conflict = process_conflict(args.backend)  # every backend runs in this one process
    if conflict:
        parser.error(conflict)
    from ..ci.known import KnownIssuesError, known_issue_paths, load_known_issues, run_backend_names

    try:
        issues = load_known_issues(known_issue_paths(args.known_issues), backends=run_backend_names(args.backend))
    except KnownIssuesError as exc:
        parser.error(str(exc))
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    print(f"device {device} ({name}), torch {torch.__version__}", flush=True)
    checks = [c for c in args.checks.split(",") if c]
    unknown = sorted(set(checks) - set(ALL_CHECKS))
    if unknown:
        parser.error(f"--checks: unknown {unknown}; known: {', '.join(ALL_CHECKS)}")
    pairs = plan_cases(args.case, checks) if args.case else plan(args.tier, args.serving_tier, checks, args.op)
    if args.shard:
        try:
            pairs = shard(pairs, args.shard)
        except ValueError as bad:  # a usage error, not a traceback
            parser.error(str(bad))
    done, last, inflight = [], None, None
    if args.resume:  # results -> FILE, appended; without it results.json -> results.jsonl, line by line
        done, last = load_done(args.resume)
        lines, inflight = open(args.resume, "a"), args.resume + ".inflight"
        print(f"resume {args.resume}: {len(done)} results kept" + (f"; {last} in flight at a death, run last"
                                                                  if last else ""), flush=True)
    else:
        lines = open(args.out + "l", "w") if args.out else None
    results = run(args.backend, pairs, device, args.budget_s, lines=lines, done=done, inflight_path=inflight,
                  last=last, issues=issues)
    names = {spec: getattr(backend_for(spec), "name", spec) for spec in args.backend}
    gone = apply_known(results, issues, probe_env(), names)  # the kept results too, and the strict verdict
    print(table(results))
    if gone:
        print(format_known_report(gone))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 1 if gone or any(r["status"] in ("failed", "error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
