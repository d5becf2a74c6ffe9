"""``summary.md``: the run summary a person reads first (also what a CI job summary can show)."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import Any

from .detection import detection_section
from .formatting import backend_label, counts_line, fmt_err, fmt_headroom, limit_text, short_env
from .frontier import markdown_section
from .served import served_section
from .timing import time_section

MAX_FAILURES_LISTED = 40


def cell(text: Any) -> str:
    """Text made safe for one Markdown table cell."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ").strip()


def code(text: Any) -> str:
    text = str(text).replace("\n", " ")
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}" if text else ""


def table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> list[str]:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(summary: dict[str, Any]) -> str:
    run = summary["run"]
    out: list[str] = [f"# deltacheck run {run.get('run_id') or run['directory']}: {summary['verdict']}", ""]

    if summary["required_failures"]:
        derived = " (derived from the availability records: the run has no end record)" \
            if summary.get("required_failures_derived") else ""
        out.append(f"**Required backend × op pairs failed{derived}:**")
        out.append("")
        out += [f"- **{cell(line)}**" for line in summary["required_failures"]]
        out.append("")

    out.append(counts_line(summary, case=code))
    out.append("")
    if not run["complete"]:
        out += [("**The run did not finish** (results.jsonl has no end record; it may have crashed): "
                 "everything below covers only the results that were written."), ""]
    if summary["input_problems"]:
        n = len(summary["input_problems"])
        out += [(f"**{n} unusable line{'s' if n != 1 else ''} in results.jsonl** {'were' if n != 1 else 'was'} "
                 f"skipped (listed under *Input problems* at the end)."), ""]

    facts = []
    if run.get("started"):
        facts.append(f"started {run['started']}")
    if run.get("finished"):
        facts.append(f"finished {run['finished']}")
    if run.get("resumed"):
        facts.append(f"resumed {len(run['resumed'])}× (last {run['resumed'][-1].get('started')})")
    if run.get("commit"):
        facts.append(f"commit {str(run['commit'])[:12]}{' (dirty)' if run.get('dirty') else ''}")
    if isinstance(run.get("argv"), list) and run["argv"]:
        facts.append(code(shlex.join(str(a) for a in run["argv"])))
    if facts:
        out += [" · ".join(facts), ""]
    env = summary["environment"]
    env_rows = short_env(env)
    if env_rows:
        out.append("Environment: " + " · ".join(f"{name}{':' if name == 'not installed' else ''} {value}" for name, value in env_rows)
                   + (f" · fingerprint `{env['fingerprint']}`" if env.get("fingerprint") else ""))
        out.append("")

    if summary.get("pairs"):
        out += ["## By backend × op", ""]
        out += table(
            ["backend", "op", "cases", "ran", "passed", "failed", "errored", "declined",
             "checks pass / fail / known / skip / error", "floor-judged", "ill-posed", "envelope notes", "worst headroom",
             "worst case (check)", "worker s"],
            [[backend_label(p), p["op"], p["cases"], p["ran"], p["passed"], f"**{p['failed']}**" if p["failed"] else 0,
              f"**{p['errored']}**" if p["errored"] else 0, p["declined"],
              " / ".join(str(p["checks"].get(s, 0)) for s in ("pass", "fail", "known", "skip", "error")),
              p.get("floor_judged", 0), p.get("ill_posed", 0),
              f"**{p.get('envelope_disagreements', 0)}**" if p.get("envelope_disagreements") else 0,
              fmt_headroom(p["worst_headroom"]),
              f"{code(p['worst_headroom_case'])} ({p['worst_headroom_check']})" if p["worst_headroom_case"] else "",
              f"{p['seconds']:.0f}"] for p in summary["pairs"]],
        )
        out.append("")
        out.append("Floor-judged: the limit was the io dtype's floor, not 2x the baseline. Ill-posed: the same-precision "
                   "baseline itself missed the threshold, so the check judged the case at this precision (a skip, never "
                   "a pass). Envelope notes: the library declined a case inside the envelope its adapter declares, or "
                   "ran one outside it.")
        out.append("")
    if summary.get("known_gone"):
        out += ["## Known issues that no longer reproduce (the run fails: remove or narrow the entries)", ""]
        out += [f"- {line}" for line in summary["known_gone"]] + [""]
    if summary.get("known"):
        out += ["## Known issues (expected failures, not counted as failures)", ""]
        out += table(["issue", "backend", "case", "check", "reason", "re-run"],
                     [[k["issue"], k["backend"], code(k["case"]), k["check"], k["reason"], code(k["repro"])]
                      for k in summary["known"][:100]])
        out.append("")
    if summary.get("adapter_notes"):
        out += ["## Adapter notes (what an adapter changed on the way in)", ""]
        out += table(["backend", "op", "note", "cases"],
                     [[n["backend"], n["op"], n["note"], n["cases"]] for n in summary["adapter_notes"][:100]])
        out.append("")
    if summary.get("envelope_disagreements"):
        out += ["## Envelope disagreements", ""]
        out += table(["backend", "case", "note", "re-run"],
                     [[d["backend"], code(d["case"]), d["note"], code(d["repro"])]
                      for d in summary["envelope_disagreements"][:50]])
        out.append("")

    detection = detection_section(summary.get("detection"), table, code)
    if detection:
        out += ["## Detection power: how small a bug each lane sees", "", *detection, ""]
    out += served_section(summary.get("served_paths") or [], table, code)
    out += time_section(summary.get("time") or {}, table, code)
    out += markdown_section(summary.get("frontiers") or [], table, code)

    out += ["## Results by op × backend × dtype × check", ""]
    if summary["groups"]:
        out += table(
            ["op", "backend", "dtype", "check", "cases", "pass", "fail", "skip", "error",
             "worst rel RMS", "worst headroom", "worst headroom case"],
            [[g["op"], g["backend"], g["io_dtype"], g["check"], g["cases"], g["pass"],
              f"**{g['fail']}**" if g["fail"] else 0, g["skip"], f"**{g['error']}**" if g["error"] else 0,
              fmt_err(g["worst_rel_rms"]), fmt_headroom(g["worst_headroom"]),
              code(g["worst_headroom_case"] or "")] for g in summary["groups"]],
        )
    else:
        out.append("No results were recorded.")
    out.append("")

    failures = summary["failures"]
    if failures:
        out += [f"## Failures and errors ({len(failures)})", ""]
        for f in failures[:MAX_FAILURES_LISTED]:
            out.append(f"- **{f['status']}** {f['backend']} · {f['check']} · {code(f['case'])}")
            out.append(f"  - {cell(f['reason'])}")
            m = f["metrics"]
            bits = []
            if "rel_rms" in m:
                bits.append(f"rel RMS {fmt_err(m['rel_rms'])}" + limit_text(m))
            if "headroom" in m:
                bits.append(f"headroom {fmt_headroom(m['headroom'])}")
            if "max_abs" in m:
                bits.append(f"max abs {fmt_err(m['max_abs'])}")
            for key, label in (("nan", "NaN"), ("inf", "Inf")):
                if m.get(key):
                    bits.append(f"{m[key]} {label}")
            for key, label in (("first_bad_token", "first bad token"), ("worst_head", "worst head"),
                               ("worst_seq", "worst sequence")):
                if key in m:
                    bits.append(f"{label} {m[key]}")
            if bits:
                out.append("  - " + ", ".join(bits))
            out.append(f"  - repro: {code(f['repro'])}")
        if len(failures) > MAX_FAILURES_LISTED:
            out.append(f"- … and {len(failures) - MAX_FAILURES_LISTED} more (all are in summary.json and junit.xml)")
        out.append("")

    skips = summary["skip_reasons"]
    if skips:
        total = sum(s["count"] for s in skips)
        out += [f"## Skipped ({total}), by reason", ""]
        out += table(["count", "reason", "backend:op"],
                     [[s["count"], s["reason"], ", ".join(s["pairs"])] for s in skips])
        out.append("")

    out += ["## Availability: which backend × op pairs can run here", ""]
    if summary["gates"]:
        out += table(
            ["backend", "op", "available", "required", "reason / notes"],
            [[g["backend"], g["op"], "yes" if g["runnable"] else "**no**",
              ("**required**" if not g["runnable"] else "required") if g["required"] else "no",
              "; ".join(x for x in [g["reason"], *g["notes"]] if x)] for g in summary["gates"]],
        )
    else:
        out.append("The run recorded no availability records.")
    out.append("")

    if summary["input_problems"]:
        out += ["## Input problems (skipped lines of results.jsonl)", ""]
        out += [f"- {'line ' + str(p['line']) + ': ' if p['line'] is not None else ''}{cell(p['message'])}"
                for p in summary["input_problems"]]
        out.append("")
    return "\n".join(out)
