"""What a ``--resume`` of an interrupted run would still run, computed on any machine (no kernel library needed):
per backend x op, the tasks the run directory holds every check of, the ones it holds part of (they run again),
the ones it never reached, and of those how many fall inside the backend's declared envelope on the run's own
machine (the rest the library or the adapter will decline in a moment). Also checks that this checkout selects
the same cases for the run's command line, which ``--resume`` insists on.

    PYTHONPATH=<dir holding deltacheck> python3 bench/i25_s6_plan.py RUN_DIR [--cases-out FILE] [--json FILE]

``--cases-out``: the ids of the cases with any task left, one a line (a fallback for a machine where ``--resume``
is refused: ``deltacheck run --case ID ...`` over them, then ``deltacheck merge`` with the interrupted run).
Exit status 0; 3 when this checkout's selection differs from the run's (``--resume`` would refuse it).
Used by bench/i25_s6_h200.sh (issue 25: completing the fla-dispatch + flashqla L0 of session 5's run A).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from deltacheck.cases import Case
from deltacheck.harness.ci.tiers import select
from deltacheck.harness.judge.checks import checks_for
from deltacheck.harness.machine.availability import backend_envelope
from deltacheck.harness.machine.environment import Env
from deltacheck.harness.records.results import read_records


def held_checks(run_dir: Path) -> tuple[dict, dict[tuple[str, str], set[str]]]:
    """(the run header, the checks held per (case id, backend)), worker files a cut left included."""
    header, held = None, defaultdict(set)
    for f in [run_dir / "results.jsonl", *sorted(run_dir.glob("results.*w*.jsonl"))]:
        if not f.is_file():
            continue
        for _, rec, _ in read_records(f):
            if not rec:
                continue
            if rec.get("kind") == "run" and header is None:
                header = rec
            elif rec.get("kind") == "result":
                held[(rec["case"], rec["backend"])].add(rec["check"])
    if header is None:
        raise SystemExit(f"{run_dir}: no run header in results.jsonl")
    return header, held


def selection_of(argv: list[str]) -> list[str] | None:
    """The case ids this checkout selects for a recorded ``run --tier T --op ... --backend ...`` command line
    (None when it uses options this helper does not replay: -k, --case, --limit, --shard)."""
    if any(a in argv for a in ("-k", "--case", "--limit", "--shard")):
        return None
    tier = argv[argv.index("--tier") + 1] if "--tier" in argv else "L0"
    ops = [argv[i + 1] for i, a in enumerate(argv) if a == "--op"] or [None]
    backends = [argv[i + 1] for i, a in enumerate(argv) if a == "--backend"]
    return [c.id for op in ops for c in select(tier=tier, op=op, k=None, backends=backends)]


def plan(run_dir: Path) -> dict:
    header, held = held_checks(run_dir)
    env = Env.from_dict(header.get("env") or {})
    rows: dict[tuple[str, str], Counter] = defaultdict(Counter)
    left_cases: list[str] = []
    envelopes = {}
    for cid in header["case_ids"]:
        case = Case.from_id(cid)
        owed = set(checks_for(case))
        for spec in header["backends"]:
            row = rows[(spec, case.op)]
            got = held.get((cid, spec), set())
            if owed <= got:
                row["judged"] += 1
                continue
            row["half-judged (run again)" if got else "not reached"] += 1
            if (spec, case.op) not in envelopes:
                try:
                    envelopes[(spec, case.op)] = backend_envelope(spec, case.op, env=env)
                except Exception:  # noqa: BLE001 - the backend cannot even load here: no envelope to count with
                    envelopes[(spec, case.op)] = None
            union = envelopes[(spec, case.op)]
            if union is not None:
                row["left inside envelope" if union.contains(case) else "left outside (declines)"] += 1
                if union.contains(case) and case.backward:
                    row["left backward cases inside"] += 1
            if not left_cases or left_cases[-1] != cid:
                left_cases.append(cid)
    ours = selection_of([str(a) for a in header.get("argv") or []])
    same = None if ours is None else ours == header["case_ids"]
    return {"run": str(run_dir), "argv": header.get("argv"), "cases": len(header["case_ids"]),
            "backends": header["backends"], "selection_same": same,
            "rows": {f"{b}:{op}": dict(sorted(c.items())) for (b, op), c in sorted(rows.items())},
            "tasks_left": sum(c["half-judged (run again)"] + c["not reached"] for c in rows.values()),
            "cases_left": left_cases}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--cases-out", type=Path, help="write the ids of the cases with a task left here, one a line")
    p.add_argument("--json", type=Path, help="also write the plan as JSON here")
    args = p.parse_args(argv)
    got = plan(args.run_dir)
    print(f"{got['run']}: `deltacheck {' '.join(got['argv'] or [])}`")
    print(f"  {got['cases']} cases x {len(got['backends'])} backends; tasks left: {got['tasks_left']} "
          f"(over {len(got['cases_left'])} cases)")
    for key, row in got["rows"].items():
        print(f"  {key:<18} " + ", ".join(f"{k} {v}" for k, v in row.items()))
    same = got["selection_same"]
    print("  this checkout's selection for that command line: "
          + {True: "the same (--resume accepts it)", False: "DIFFERENT (--resume would refuse it)",
             None: "not replayed (the command line uses -k/--case/--limit/--shard)"}[same])
    if args.cases_out:
        args.cases_out.write_text("".join(c + "\n" for c in got["cases_left"]))
    if args.json:
        args.json.write_text(json.dumps(got, indent=1))
    return 3 if same is False else 0


if __name__ == "__main__":
    sys.exit(main())
