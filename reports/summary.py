"""The summary of one run: the JSON every other format is rendered from (``summary.json``)."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

from deltacheck.harness.records.exitrule import run_verdict
from deltacheck.harness.records.results import fingerprint, repro_command

from .detection import detection_power
from .formatting import STATUS_ORDER, badness, check_sort_key, fmt_err, fmt_headroom, short_env
from .frontier import frontier_summaries
from .load import Run, finite, number
from .served import served_paths
from .timing import time_table

SUMMARY_SCHEMA = "deltacheck-summary/1"


def result_repro(result: dict[str, Any]) -> str:
    """The result's own repro command, else the same command built from its case id (``results.repro_command``)."""
    return result.get("repro") or repro_command(str(result["case"]), str(result["backend"]))


def _pair(result_or_gate: dict[str, Any]) -> tuple[str, str]:
    return str(result_or_gate.get("backend")), str(result_or_gate.get("op"))


def recorded_required_failures(run: Run) -> tuple[list[str], bool]:
    """(lines, derived): the end record's list, or, for a run without one, lines derived from the availability
    records and the results (a required pair that cannot run, or that executed zero cases)."""
    if run.end is not None and isinstance(run.end.get("required_failures"), list):
        return [str(x) for x in run.end["required_failures"]], False
    executed = Counter(_pair(r) for r in run.results if r["status"] in ("pass", "fail", "known"))
    lines = []
    for gate in run.gates:
        if not gate.get("required"):
            continue
        backend, op = _pair(gate)
        if not gate.get("runnable"):
            lines.append(f"REQUIRED {backend}:{op} cannot run: {gate.get('reason') or 'no reason given'}")
        elif executed[(backend, op)] == 0:
            lines.append(f"REQUIRED {backend}:{op} executed zero cases")
    return lines, True


def _metrics_brief(result: dict[str, Any]) -> dict[str, Any]:
    m = result["metrics"]
    return {k: m.get(k) for k in ("rel_rms", "max_abs", "headroom", "limit", "threshold", "first_bad_token",
                                  "worst_head", "worst_seq", "nan", "inf") if m.get(k) is not None}


def pair_table(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per backend x op: how many cases ran and how they ended, the worst headroom with its case
    and check, and the seconds the workers spent (summed over tasks: with ``--jobs`` more than wall time);
    ``floor_judged`` / ``ill_posed`` count checks whose limit was the dtype's floor / whose baseline missed the
    threshold, ``envelope_disagreements`` the cases the library declined inside (or ran outside) the envelope
    the backend declares (docs/verdicts.md).

    A case *ran* when any of its checks passed or failed; it *passed* when it ran with nothing failed or
    errored; *declined* when every check was skipped; *errored* when a check errored and none failed."""
    by_case: dict[tuple[str, str], dict[str, Counter]] = {}
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for r in results:
        pair = (r["backend"], r["op"])
        row = rows.setdefault(pair, {"backend": pair[0], "op": pair[1], "cases": 0, "ran": 0, "passed": 0,
                                     "failed": 0, "known": 0, "errored": 0, "declined": 0,
                                     "checks": {s: 0 for s in STATUS_ORDER}, "worst_headroom": None,
                                     "worst_headroom_case": None, "worst_headroom_check": None, "seconds": 0.0,
                                     "floor_judged": 0, "ill_posed": 0, "envelope_disagreements": 0})
        row["checks"][r["status"]] += 1
        row["floor_judged"] += bool(r["metrics"].get("floor_judged"))
        row["ill_posed"] += bool(r["metrics"].get("ill_posed"))
        row["envelope_disagreements"] += bool(r["metrics"].get("envelope_disagreement"))
        row["seconds"] += r["seconds"]
        by_case.setdefault(pair, {}).setdefault(r["case"], Counter())[r["status"]] += 1
        head = number(r["metrics"].get("headroom"))
        if head is not None and badness(head) > badness(row["worst_headroom"]):
            row["worst_headroom"], row["worst_headroom_case"], row["worst_headroom_check"] = head, r["case"], r["check"]
    for pair, cases in by_case.items():
        row = rows[pair]
        for statuses in cases.values():
            row["cases"] += 1
            ran = statuses["pass"] + statuses["fail"] + statuses["known"] > 0
            row["ran"] += ran
            if statuses["fail"]:
                row["failed"] += 1
            elif statuses["known"]:
                row["known"] += 1
            elif statuses["error"]:
                row["errored"] += 1
            elif ran:
                row["passed"] += 1
            else:
                row["declined"] += 1
    return [rows[k] for k in sorted(rows)]


def summarize(run: Run) -> dict[str, Any]:
    results = run.results
    counts = Counter(r["status"] for r in results)

    groups: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for r in results:
        key = (r["op"], r["backend"], r["io_dtype"], r["check"])
        g = groups.setdefault(key, {
            "op": key[0], "backend": key[1], "io_dtype": key[2], "check": key[3], "cases": 0,
            **{s: 0 for s in STATUS_ORDER},
            "worst_rel_rms": None, "worst_rel_rms_case": None, "worst_headroom": None, "worst_headroom_case": None,
        })
        g["cases"] += 1
        g[r["status"]] += 1
        rel, head = number(r["metrics"].get("rel_rms")), number(r["metrics"].get("headroom"))
        if rel is not None and badness(rel) > badness(g["worst_rel_rms"]):
            g["worst_rel_rms"], g["worst_rel_rms_case"] = rel, r["case"]
        if head is not None and badness(head) > badness(g["worst_headroom"]):
            g["worst_headroom"], g["worst_headroom_case"] = head, r["case"]
    group_list = [groups[k] for k in sorted(groups, key=lambda k: (k[0], k[1], k[2], check_sort_key(k[3])))]

    skip_reasons: dict[str, dict[str, Any]] = {}
    for r in results:
        if r["status"] != "skip":
            continue
        entry = skip_reasons.setdefault(r["reason"], {"reason": r["reason"], "count": 0, "pairs": set()})
        entry["count"] += 1
        entry["pairs"].add(f"{r['backend']}:{r['op']}")
    skip_list = sorted(skip_reasons.values(), key=lambda e: (-e["count"], e["reason"]))
    for e in skip_list:
        e["pairs"] = sorted(e["pairs"])

    disagreements = [{"case": r["case"], "backend": r["backend"], "op": r["op"],
                      "note": str(r["metrics"]["envelope_disagreement"]), "repro": result_repro(r)}
                     for r in results if r["metrics"].get("envelope_disagreement")]

    problems = [r for r in results if r["status"] in ("fail", "error")]
    problems.sort(key=lambda r: (r["status"] != "fail", -badness(r["metrics"].get("headroom")), r["case"]))
    failures = [{
        "case": r["case"], "backend": r["backend"], "op": r["op"], "check": r["check"], "status": r["status"],
        "reason": r["reason"], "metrics": _metrics_brief(r), "repro": result_repro(r),
    } for r in problems]

    names = {str(g.get("backend")): str(g["name"]) for g in run.gates if g.get("name")}
    adapter_notes: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in results:
        for n in r["metrics"].get("adapter_notes") or [] if r["check"] == "forward" else []:
            entry = adapter_notes.setdefault((r["backend"], r["op"], str(n)), {
                "backend": r["backend"], "op": r["op"], "note": str(n), "cases": 0})
            entry["cases"] += 1
    pairs = pair_table(results)
    for p in pairs:
        p["backend_name"] = names.get(p["backend"])

    gates = [{
        "backend": g.get("backend"), "name": g.get("name"), "op": g.get("op"), "runnable": bool(g.get("runnable")),
        "required": bool(g.get("required")), "reason": g.get("reason") or "",
        "notes": [str(n) for n in g.get("notes") or []],
    } for g in run.gates]
    gates.sort(key=lambda g: (str(g["backend"]), str(g["op"])))

    req_lines, req_derived = recorded_required_failures(run)
    end = run.end or {}
    exit_status = end.get("exit_status")
    known_gone = [str(x) for x in (run.end or {}).get("known_gone") or []]
    verdict = run_verdict(counts, req_lines, known_gone, finished=run.end is not None, recorded_exit=exit_status)

    heads = [(number(r["metrics"].get("headroom")), r["case"], r["backend"], r["check"]) for r in results]
    heads = [h for h in heads if h[0] is not None]
    worst = max(heads, key=lambda h: badness(h[0]), default=None)

    env = run.env
    return {
        "schema": SUMMARY_SCHEMA,
        "run": {
            "directory": str(run.directory),
            "run_id": run.header.get("run_id"),
            "started": run.header.get("started"),
            "finished": end.get("finished"),
            "complete": run.end is not None,
            "argv": run.header.get("argv"),
            "commit": run.header.get("commit"),
            "dirty": run.header.get("dirty"),
            "resumed": [{"started": r.get("started"), "argv": r.get("argv"), "commit": r.get("commit")}
                        for r in run.resumes],
        },
        "environment": {**env, "fingerprint": fingerprint(env) if env else None},
        "verdict": verdict,
        "exit_status": exit_status,
        "counts": {"total": len(results), **{s: counts[s] for s in STATUS_ORDER}},
        "end_counts": end.get("counts"),
        "required_failures": req_lines,
        "required_failures_derived": req_derived,
        "worst_headroom": ({"headroom": worst[0], "case": worst[1], "backend": worst[2], "check": worst[3]}
                           if worst else None),
        "gates": gates,
        "pairs": pairs,
        "adapter_notes": [adapter_notes[k] for k in sorted(adapter_notes)],
        "groups": group_list,
        "skip_reasons": skip_list,
        "failures": failures,
        "known": [{"case": r["case"], "backend": r["backend"], "op": r["op"], "check": r["check"],
                   "issue": str(r["metrics"].get("known_issue") or ""), "reason": r["reason"],
                   "repro": result_repro(r)} for r in results if r["status"] == "known"],
        "known_gone": known_gone,
        "envelope_disagreements": disagreements,
        "served_paths": served_paths(results),
        "time": time_table(run.tasks),
        "detection": detection_power(results),
        "frontiers": frontier_summaries(run.frontiers),
        "input_problems": [{"line": p.line, "message": p.message} for p in run.problems],
    }


def to_json(summary: dict[str, Any]) -> str:
    """JSON text; NaN/inf metrics become strings so strict JSON readers accept the file."""
    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return str(x)
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x
    return json.dumps(clean(summary), indent=2, sort_keys=False, default=str) + "\n"


# The names this module has always offered; the formatting helpers among them live in formatting.py now.
__all__ = [
    "SUMMARY_SCHEMA",
    "badness",
    "check_sort_key",
    "fingerprint",
    "finite",
    "fmt_err",
    "fmt_headroom",
    "result_repro",
    "short_env",
    "summarize",
    "to_json",
]


