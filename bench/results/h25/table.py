"""Issue 25's table from run directories: per backend x op, L0 cases (the run's selection of that op), reached,
declined, ran, passed, failed, errored, known, worst headroom among passes; then the results per served path
(``deltacheck.reports.served``: fla-dispatch's FLA dispatch choice, cuDNN's engine, FlashInfer's prefill path cp /
chunked) and one line per run (finished or cut, wall time, worker-seconds).

    PYTHONPATH=<dir holding deltacheck> python3 bench/results/h25/table.py RUN_DIR... [--json FILE]

A case counts once per backend, by its worst check (error > fail > known > pass); declined = every check skipped;
ran = reached - declined. A resumed run's rerun of a half-judged task replaces its earlier results (the latest record
per check wins), and results still in a cut run's worker files (results.w*.jsonl, never folded) are read too.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from datetime import datetime
from pathlib import Path

from deltacheck.harness.records.results import latest_per_check, read_records
from deltacheck.reports.served import served_paths

RANK = {"error": 4, "fail": 3, "known": 2, "pass": 1, "skip": 0}


def records(run_dir: Path) -> list[dict]:
    files = [run_dir / "results.jsonl", *sorted(run_dir.glob("results.*w*.jsonl"))]
    return [rec for f in files if f.is_file() for _, rec, _ in read_records(f) if rec]


def _seconds(start: str, end: str) -> float:
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return (datetime.strptime(end, fmt) - datetime.strptime(start, fmt)).total_seconds()


def run_rows(run_dir: Path) -> tuple[dict, list[dict], list[dict]]:
    """(the run's line, its backend x op rows, its served-path rows)."""
    recs = records(run_dir)
    head = next(r for r in recs if r.get("kind") == "run")
    end = next((r for r in recs if r.get("kind") == "end"), None)
    segments = [r["started"] for r in recs if r.get("kind") in ("run", "resume") and r.get("started")]
    tasks = [r for r in recs if r.get("kind") == "task"]
    label = f"{run_dir.parent.name}/{run_dir.name}"
    line = {"run": label, "finished": end is not None, "resumed": len(segments) - 1,
            "wall_s": _seconds(head["started"], end["finished"]) if end and not segments[1:] else None,
            "worker_s": round(sum(t.get("seconds") or 0 for t in tasks), 1), "tasks": len(tasks)}
    results = latest_per_check([r for r in recs if r.get("kind") == "result"])
    selection = collections.Counter(c.split("-")[0] for c in head["case_ids"])
    by = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in results:
        by[(r["backend"], r["op"])][r["case"]].append(r)
    rows = []
    for backend in head["backends"]:
        for op in sorted(selection):
            cases = by.get((backend, op), {})
            worst = collections.Counter()
            best = (-1.0, None)
            for cid, rs in cases.items():
                status = max(rs, key=lambda r: RANK[r["status"]])["status"]
                worst["declined" if status == "skip" else status] += 1
                for r in rs:
                    h = (r.get("metrics") or {}).get("headroom")
                    if r["status"] == "pass" and isinstance(h, (int, float)) and h > best[0]:
                        best = (h, f"{cid} ({r['check']})")
            reached = len(cases)
            rows.append(dict(run=label, backend=backend, op=op, finished=end is not None, L0=selection[op],
                             reached=reached, declined=worst["declined"], ran=reached - worst["declined"],
                             passed=worst["pass"], failed=worst["fail"], errored=worst["error"], known=worst["known"],
                             worst=round(best[0], 2) if best[1] else None, worst_case=best[1]))
    served = [{"run": label, **r} for r in served_paths(results)]
    return line, rows, served


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dirs", nargs="+", type=Path)
    p.add_argument("--json", type=Path, help="also write every row as JSON here")
    args = p.parse_args(argv)
    lines, rows, served = [], [], []
    for d in args.run_dirs:
        line, r, s = run_rows(d)
        lines.append(line)
        rows += r
        served += s
    out = ["| run | backend | op | L0 cases | reached | declined | ran | passed | failed | errored | known | "
           "worst headroom (passes) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["backend"], r["op"], r["run"])):
        worst = "–" if r["worst"] is None else r["worst"]
        out.append(f"| {r['run'].split('/')[0]} | {r['backend']} | {r['op']} | {r['L0']} | {r['reached']}{'' if r['finished'] else ' (cut)'} | "
                   f"{r['declined']} | {r['ran']} | {r['passed']} | {r['failed']} | {r['errored']} | {r['known']} | "
                   f"{worst} |")
    if served:
        out += ["", "Served path (a case once per direction, by its worst check):", "",
                "| run | backend | op | direction | served by | cases | pass | fail | known | skip | error |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        out += [f"| {s['run']} | {s['backend']} | {s['op']} | {s['direction']} | `{s['engine']}` | {s['cases']} | "
                f"{s['pass']} | {s['fail']} | {s['known']} | {s['skip']} | {s['error']} |" for s in served]
    out += ["", "| run | state | resumed | wall s (one segment only) | worker s | tasks |", "|---|---|---|---|---|---|"]
    out += [f"| {r['run']} | {'finished' if r['finished'] else 'cut'} | {r['resumed']} | "
            f"{'–' if r['wall_s'] is None else round(r['wall_s'])} | {r['worker_s']} | {r['tasks']} |" for r in lines]
    print("\n".join(out))
    if args.json:
        args.json.write_text(json.dumps({"runs": lines, "rows": rows, "served": served}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
