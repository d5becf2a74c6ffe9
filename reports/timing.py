"""Where a run's time went: the worker seconds per phase per backend x op, the slowest tasks (``summary.json``'s
``time``), and the section both report formats draw from it."""

from __future__ import annotations

from typing import Any

from .load import finite

PHASES = ("worker_start", "check", "reference", "baseline", "first_call", "backward", "continuation", "steady_call",
          "judging")


def time_table(tasks: list[dict[str, Any]], slowest: int = 10) -> dict[str, Any]:
    """Where the time went: per backend x op, the seconds of each phase summed over its tasks (worker seconds:
    with ``--jobs`` more than wall time), and the slowest tasks. ``first_call`` holds a JIT backend's compile and
    autotune; ``steady_call`` the same call warm (the kernel's own time); ``check`` the library's import and planner."""
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    for t in tasks:
        pair = (str(t.get("backend")), str(t.get("op")))
        row = pairs.setdefault(pair, {"backend": pair[0], "op": pair[1], "tasks": 0, "seconds": 0.0,
                                      "phases": {p: 0.0 for p in PHASES}})
        row["tasks"] += 1
        for name, seconds in (t.get("phases") or {}).items():
            value = finite(seconds) or 0.0
            row["phases"][name] = row["phases"].get(name, 0.0) + value
            row["seconds"] += value
    ranked = sorted(tasks, key=lambda t: -(finite(t.get("seconds")) or 0.0))[:slowest]
    totals = {p: sum(r["phases"].get(p, 0.0) for r in pairs.values()) for p in PHASES}
    return {"pairs": [pairs[k] for k in sorted(pairs)], "totals": totals,
            "seconds": sum(totals.values()),
            "slowest": [{"case": t["case"], "backend": t["backend"], "seconds": finite(t.get("seconds")) or 0.0,
                         "phases": t.get("phases") or {}} for t in ranked]}


def time_rows(time: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """The per backend x op phase table (header, rows) both report formats draw; phases no task had are left out."""
    phases = [p for p in PHASES if time["totals"].get(p)]
    header = ["backend", "op", "tasks", *phases, "total s"]
    rows = [[r["backend"], r["op"], r["tasks"], *(f"{r['phases'].get(p, 0.0):.1f}" for p in phases),
             f"{r['seconds']:.1f}"] for r in time["pairs"]]
    rows.append(["all", "", sum(r["tasks"] for r in time["pairs"]),
                 *(f"{time['totals'].get(p, 0.0):.1f}" for p in phases), f"{time['seconds']:.1f}"])
    return header, rows


def largest_phase(task: dict[str, Any]) -> str:
    phases = {k: finite(v) or 0.0 for k, v in (task.get("phases") or {}).items()}
    if not phases:
        return "–"
    name = max(phases, key=phases.get)
    return f"{name} {phases[name]:.1f} s"


def time_section(time: dict[str, Any], table, code) -> list[str]:
    """summary.md's 'Where the time went' section (empty when the run recorded no task timings)."""
    if not time.get("pairs"):
        return []
    header, rows = time_rows(time)
    out = ["## Where the time went (worker seconds)", "",
           "first_call: the first kernel call of a task (a JIT backend's compile and autotune); steady_call: the same "
           "call again, warm; check: the library's import and planner; worker_start: interpreter, imports, probe.", ""]
    out += table(header, rows)
    out += ["", "Slowest tasks:", ""]
    out += table(["case", "backend", "seconds", "largest phase"],
                 [[code(t["case"]), t["backend"], f"{t['seconds']:.1f}", largest_phase(t)] for t in time["slowest"]])
    return out + [""]
