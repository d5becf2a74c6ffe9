"""The summary of one run: the JSON every other format is rendered from (``summary.json``)."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

from deltacheck.harness.records.exitrule import run_verdict
from deltacheck.harness.records.results import fingerprint, repro_command

from .frontier import frontier_summaries
from .load import Run, finite, number
from .served import served_paths

SUMMARY_SCHEMA = "deltacheck-summary/1"
STATUS_ORDER = ("pass", "fail", "known", "skip", "error")
# The checks harness/run/task.py's checks_for() emits, in that order ("grad_" stands for every grad_<input>).
CHECK_ORDER = ("forward", "state", "continuation_ref", "continuation_self", "grad_", "determinism")


def check_sort_key(check: str) -> tuple[int, str]:
    for i, prefix in enumerate(CHECK_ORDER):
        if check == prefix or (prefix.endswith("_") and check.startswith(prefix)):
            return i, check
    return len(CHECK_ORDER), check


def badness(value: Any) -> float:
    """Sort key where larger is worse: NaN (a metric that blew up) is the worst of all."""
    x = number(value)
    if x is None:
        return -math.inf
    return math.inf if math.isnan(x) else x


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


def backend_label(pair: dict[str, Any]) -> str:
    """The spec a run was given, and the backend's own ``name`` beside it where the two differ."""
    name = pair.get("backend_name")
    return f"{pair['backend']} ({name})" if name and name != pair["backend"] else str(pair["backend"])


def limit_text(m: dict[str, Any]) -> str:
    """`` (limit L, threshold T)``: the limit the check was judged against, then the absolute threshold, labelled
    as such (the limit is min(threshold, c x baseline), so the two differ whenever a baseline tightened it)."""
    parts = []
    if m.get("limit") is not None:
        parts.append(f"limit {fmt_err(m['limit'])}")
    if m.get("threshold") is not None:
        parts.append(f"threshold {fmt_err(m['threshold'])}")
    return f" ({', '.join(parts)})" if parts else ""


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


PHASES = ("worker_start", "check", "reference", "baseline", "first_call", "backward", "continuation", "steady_call",
          "judging")


DETECTION_TARGET = (3.0, 0.9)  # delta <= 3x the same-precision baseline's error on >= 90% of checks


def detection_power(results: list[dict[str, Any]], worst: int = 3, exceptions: int = 50) -> dict[str, Any]:
    """Per backend x op x check: how small a bug the lane still sees — ``detects``, the smallest relative
    perturbation of the kernel's own result that fails the check (harness/judge/compare.py ``detection_delta``). A row's
    "sees bugs down to" is its largest delta (the case where the check is weakest); ``worst`` lists those cases.
    The target: delta <= 3x the same-precision baseline's error on >= 90% of the checks that have a baseline; the
    checks over it are ``exceptions`` (largest ratio first)."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    scored, within, over = 0, 0, []
    for r in results:
        delta = number(r["metrics"].get("detects"))
        if delta is None or r["status"] not in ("pass", "fail", "known"):
            continue
        key = (r["backend"], r["op"], r["check"])
        row = rows.setdefault(key, {"backend": key[0], "op": key[1], "check": key[2], "checks": 0, "deltas": [],
                                    "ratios": [], "within": 0, "scored": 0})
        row["checks"] += 1
        row["deltas"].append((delta, r["case"]))
        ratio = number(r["metrics"].get("detects_vs_baseline"))
        if ratio is not None:
            row["ratios"].append(ratio)
            row["scored"] += 1
            scored += 1
            if ratio <= DETECTION_TARGET[0]:
                row["within"] += 1
                within += 1
            else:
                over.append({"backend": key[0], "op": key[1], "check": key[2], "case": r["case"], "detects": delta,
                             "ratio": ratio, "floor_judged": bool(r["metrics"].get("floor_judged")),
                             "negligible": bool(r["metrics"].get("negligible"))})
    out_rows = []
    for key in sorted(rows, key=lambda k: (k[0], k[1], check_sort_key(k[2]))):
        row = rows[key]
        deltas = sorted(row.pop("deltas"), key=lambda d: (-badness(d[0]), d[1]))
        ratios = sorted(row.pop("ratios"))
        row["sees_down_to"] = deltas[0][0]
        row["median_detects"] = sorted(d for d, _ in deltas)[len(deltas) // 2]
        row["median_ratio"] = ratios[len(ratios) // 2] if ratios else None
        row["largest"] = [{"case": c, "detects": d} for d, c in deltas[:worst]]
        out_rows.append(row)
    over.sort(key=lambda e: (-badness(e["ratio"]), e["case"]))
    share = within / scored if scored else None
    return {"rows": out_rows, "scored": scored, "within": within, "share": share,
            "target": {"ratio": DETECTION_TARGET[0], "share": DETECTION_TARGET[1]},
            "target_met": share is not None and share >= DETECTION_TARGET[1],
            "exceptions": over[:exceptions], "exceptions_total": len(over)}


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


# --- number formatting shared by the Markdown, HTML and compare renderers ---------------------------

def counts_line(summary: dict[str, Any], *, text=str, case=str) -> str:
    """"N results: … pass, … fail, …; worst headroom … (backend check, case)" — ``text`` escapes the plain parts
    and ``case`` marks up the case id, per output format (Markdown, HTML, the terminal)."""
    c = summary["counts"]
    known = f", {c['known']} known" if c.get("known") else ""
    line = f"{c['total']} results: {c['pass']} pass, {c['fail']} fail{known}, {c['skip']} skip, {c['error']} error"
    worst = summary.get("worst_headroom")
    if worst:
        line += f"; worst headroom {fmt_headroom(worst['headroom'])} ({worst['backend']} {worst['check']}, "
        return text(line) + case(worst["case"]) + text(")")
    return text(line)


def fmt_err(x: Any) -> str:
    v = number(x)
    if v is None:
        return "–"
    return f"{v:.2e}" if math.isfinite(v) and v != 0 else ("0" if v == 0 else str(v))


def fmt_headroom(x: Any) -> str:
    v = number(x)
    if v is None:
        return "–"
    return f"{v:.2f}" if math.isfinite(v) else str(v)


def short_env(env: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, value) rows describing an environment, versions first-class."""
    rows = []
    if env.get("device_name") or env.get("cuda") is not None:
        cap = env.get("capability")
        cap_text = f" (SM{cap[0]}{cap[1]})" if isinstance(cap, (list, tuple)) and len(cap) == 2 else ""
        rows.append(("device", f"{env.get('device_name') or ('no CUDA device' if not env.get('cuda') else '?')}{cap_text}"))
    versions = env.get("versions") if isinstance(env.get("versions"), dict) else {}
    rows += [(name, str(versions[name])) for name in sorted(versions) if versions[name] is not None]
    missing = sorted(name for name in versions if versions[name] is None)
    if missing:
        rows.append(("not installed", ", ".join(missing)))
    for name in ("python", "host"):
        if env.get(name):
            rows.append((name, str(env[name])))
    return rows


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


def time_rows(time: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """The per backend x op phase table (header, rows) both report formats draw; phases no task had are left out."""
    phases = [p for p in PHASES if time["totals"].get(p)]
    header = ["backend", "op", "tasks", *phases, "total s"]
    rows = [[r["backend"], r["op"], r["tasks"], *(f"{r['phases'].get(p, 0.0):.1f}" for p in phases),
             f"{r['seconds']:.1f}"] for r in time["pairs"]]
    rows.append(["all", "", sum(r["tasks"] for r in time["pairs"]),
                 *(f"{time['totals'].get(p, 0.0):.1f}" for p in phases), f"{time['seconds']:.1f}"])
    return header, rows


def detection_section(detection: dict[str, Any] | None, table, code) -> list[str]:
    """The detection-power section (markdown and HTML alike: ``table(header, rows)``, ``code(text)``)."""
    if not detection or not detection.get("rows"):
        return []
    target = detection["target"]
    share = detection["share"]
    head = (f"{detection['within']} of {detection['scored']} checks with a baseline "
            f"({'n/a' if share is None else f'{100 * share:.1f}%'}) see a perturbation of at most "
            f"{target['ratio']:g}x the same-precision baseline's error (target: {100 * target['share']:.0f}%: "
            f"{'met' if detection['target_met'] else 'NOT met'}).")
    rows = [[r["backend"], r["op"], r["check"], r["checks"], f"this lane sees bugs down to {fmt_err(r['sees_down_to'])}",
             fmt_err(r["median_detects"]), "–" if r["median_ratio"] is None else f"{r['median_ratio']:.2f}x",
             f"{r['within']}/{r['scored']}",
             "; ".join(f"{code(x['case'])} {fmt_err(x['detects'])}" for x in r["largest"])]
            for r in detection["rows"]]
    out = [head, ""]
    out += table(["backend", "op", "check", "checks", "largest delta", "median delta", "median delta / baseline",
                  f"<= {target['ratio']:g}x baseline", "cases where delta is largest"], rows)
    if detection.get("exceptions"):
        out += ["", f"Checks over {target['ratio']:g}x the baseline ({detection['exceptions_total']}; the first "
                f"{len(detection['exceptions'])}):", ""]
        out += table(["backend", "op", "check", "case", "delta", "delta / baseline", "why"],
                     [[e["backend"], e["op"], e["check"], code(e["case"]), fmt_err(e["detects"]), f"{e['ratio']:.2f}x",
                       "negligible (max abs <= 1e-6)" if e["negligible"] else
                       "floor-judged (the dtype's floor > 2x baseline)" if e["floor_judged"] else ""]
                      for e in detection["exceptions"]])
    return out


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
