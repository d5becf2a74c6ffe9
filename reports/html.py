"""``report.html``: one self-contained file (inline CSS, plots as embedded PNG, no external assets)."""

from __future__ import annotations

import base64
import shlex
from collections.abc import Iterable
from html import escape
from typing import Any

from .detection import detection_section
from .formatting import backend_label, counts_line, fmt_err, fmt_headroom, short_env
from .frontier import fmt_bound
from .load import Run
from .plots import PlotsUnavailable, frontier_plots, make_plots
from .timing import largest_phase, time_rows

MAX_FAILURES_SHOWN = 200

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1200px;
       padding: 0 1em; color: #1d1d1f; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5em 0; font-size: 13px; }
th, td { border: 1px solid #d0d0d0; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font: 12px ui-monospace, Menlo, Consolas, monospace; word-break: break-all; }
.verdict-FAILED { color: #b00020; } .verdict-PASSED { color: #1b7f3b; } .verdict-INCOMPLETE { color: #a15c00; }
.required { background: #fde7e9; border: 2px solid #b00020; padding: .6em 1em; font-weight: bold; }
.warn { background: #fff4e0; border-left: 4px solid #a15c00; padding: .4em .8em; }
.bad { color: #b00020; font-weight: bold; } .muted { color: #666; }
figure { display: inline-block; margin: .5em 1em 1em 0; vertical-align: top; }
figcaption { font-size: 12px; color: #555; max-width: 760px; }
img { max-width: 100%; border: 1px solid #eee; }
"""


def _table(header: Iterable[str], rows: Iterable[Iterable[Any]], numeric: set[int] = frozenset()) -> str:
    """Cells are escaped unless passed as ``Raw``."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for i, c in enumerate(row):
            content = c.html if isinstance(c, Raw) else escape(str(c))
            cells.append(f"<td class=\"num\">{content}</td>" if i in numeric else f"<td>{content}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


class Raw:
    def __init__(self, html: str):
        self.html = html


def _code(text: Any) -> Raw:
    return Raw(f"<code>{escape(str(text))}</code>" if text else "")


def _count(n: int) -> Raw | int:
    return Raw(f"<span class=\"bad\">{n}</span>") if n else 0


def _plots_html(run: Run, draw=make_plots) -> str:
    try:
        plots = draw(run)
    except PlotsUnavailable as exc:
        return f"<p class=\"warn\">No plots in this report: {escape(str(exc))}.</p>"
    parts = []
    for p in plots:
        if p.png is None:
            parts.append(f"<figure><figcaption><b>{escape(p.title)}</b>: {escape(p.caption)}</figcaption></figure>")
        else:
            data = base64.b64encode(p.png).decode("ascii")
            parts.append(f"<figure><img src=\"data:image/png;base64,{data}\" alt=\"{escape(p.title)}\">"
                         f"<figcaption><b>{escape(p.title)}</b>. {escape(p.caption)}</figcaption></figure>")
    return "\n".join(parts)


def render_html(run: Run, summary: dict[str, Any]) -> str:
    info = summary["run"]
    verdict = summary["verdict"]
    title = f"deltacheck run {info.get('run_id') or info['directory']}"
    out = [
        "<!DOCTYPE html>",
        "<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>{escape(title)}: {escape(verdict)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{escape(title)}: <span class=\"verdict-{escape(verdict.split()[0])}\">{escape(verdict)}</span></h1>",
    ]
    if summary["required_failures"]:
        items = "".join(f"<li>{escape(x)}</li>" for x in summary["required_failures"])
        out.append(f"<div class=\"required\">Required backend × op pairs failed:<ul>{items}</ul></div>")
    out.append(f"<p>{counts_line(summary, text=escape, case=lambda c: f'<code>{escape(c)}</code>')}</p>")
    if not info["complete"]:
        out.append("<p class=\"warn\"><b>The run did not finish</b> (results.jsonl has no end record; it may have "
                   "crashed): everything below covers only the results that were written.</p>")
    if summary["input_problems"]:
        n = len(summary["input_problems"])
        out.append(f"<p class=\"warn\"><b>{n} unusable line{'s' if n != 1 else ''} in results.jsonl</b> "
                   f"{'were' if n != 1 else 'was'} skipped; see <a href=\"#input-problems\">Input problems</a>.</p>")

    facts = [("run directory", info["directory"]), ("started", info.get("started")), ("finished", info.get("finished")),
             ("commit", (str(info["commit"])[:12] + (" (dirty)" if info.get("dirty") else "")) if info.get("commit") else None),
             ("command", shlex.join(map(str, info["argv"])) if isinstance(info.get("argv"), list) else None)]
    env = summary["environment"]
    facts += short_env(env)
    if env.get("fingerprint"):
        facts.append(("environment fingerprint", env["fingerprint"]))
    out.append("<h2>Run and environment</h2>")
    out.append(_table(["what", "value"], [(k, _code(v)) for k, v in facts if v]))

    out.append("<h2>Plots</h2>")
    out.append(_plots_html(run))

    if summary.get("frontiers"):
        out.append("<h2>Stability frontiers</h2>")
        out.append("<p>The last value that passed every judged check (forward, state, and the gradients where the "
                   "backend runs a backward) and the first that failed; the failing points past a frontier are its "
                   "measurement, and they count as failed checks in this report.</p>")
        out.append(_table(
            ["backend", "op", "dtype", "axis", "last pass", "first fail", "resolution", "points", "base case",
             "first failing point"],
            [[f["backend"], f["op"], f["dtype"], f["axis"], fmt_bound(f["last_pass"]), fmt_bound(f["first_fail"]),
              fmt_bound(f["resolution"]), len(f.get("points") or []), _code(f["base_case"]),
              _code(f.get("first_fail_repro") or "")] for f in summary["frontiers"]], numeric={6, 7}))
        out.append(_plots_html(run, frontier_plots))

    if summary.get("pairs"):
        out.append("<h2>By backend × op</h2>")
        out.append(_table(
            ["backend", "op", "cases", "ran", "passed", "failed", "errored", "declined",
             "checks pass / fail / known / skip / error", "floor-judged", "ill-posed", "envelope notes", "worst headroom",
             "worst case (check)", "worker s"],
            [[backend_label(p), p["op"], p["cases"], p["ran"], p["passed"], _count(p["failed"]), _count(p["errored"]),
              p["declined"], " / ".join(str(p["checks"].get(k, 0)) for k in ("pass", "fail", "known", "skip", "error")),
              p.get("floor_judged", 0), p.get("ill_posed", 0), _count(p.get("envelope_disagreements", 0)),
              fmt_headroom(p["worst_headroom"]),
              Raw(f"{_code(p['worst_headroom_case']).html} ({escape(str(p['worst_headroom_check']))})")
              if p["worst_headroom_case"] else "",
              f"{p['seconds']:.0f}"] for p in summary["pairs"]],
            numeric={2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 14}))
        if summary.get("known_gone"):
            out.append("<h2>Known issues that no longer reproduce</h2>")
            out.append(_table(["line"], [[line] for line in summary["known_gone"]]))
        if summary.get("known"):
            out.append("<h2>Known issues (expected failures, not counted as failures)</h2>")
            out.append(_table(["issue", "backend", "case", "check", "reason", "re-run"],
                              [[k["issue"], k["backend"], _code(k["case"]), k["check"], k["reason"], _code(k["repro"])]
                               for k in summary["known"][:100]]))
        if summary.get("adapter_notes"):
            out.append("<h2>Adapter notes (what an adapter changed on the way in)</h2>")
            out.append(_table(["backend", "op", "note", "cases"],
                              [[n["backend"], n["op"], n["note"], n["cases"]] for n in summary["adapter_notes"][:100]],
                              numeric={3}))
        if summary.get("envelope_disagreements"):
            out.append("<h2>Envelope disagreements</h2>")
            out.append(_table(["backend", "case", "note", "re-run"],
                              [[d["backend"], _code(d["case"]), d["note"], _code(d["repro"])]
                               for d in summary["envelope_disagreements"][:50]]))

    detection = detection_section(summary.get("detection"), lambda header, rows: [_table(header, rows)], str)
    if detection:
        out.append("<h2>Detection power: how small a bug each lane sees</h2>")
        out += [x if x.startswith("<") else f"<p>{escape(x)}</p>" for x in detection if x]
    if (summary.get("time") or {}).get("pairs"):
        out.append("<h2>Where the time went (worker seconds)</h2>")
        rows = time_rows(summary["time"])
        out.append(_table(rows[0], rows[1], numeric=set(range(2, len(rows[0])))))
        out.append(_table(["slowest task", "backend", "seconds", "largest phase"],
                          [[_code(t["case"]), t["backend"], f"{t['seconds']:.1f}", largest_phase(t)]
                           for t in summary["time"]["slowest"]], numeric={2}))
    out.append("<h2>Results by op × backend × dtype × check</h2>")
    if summary["groups"]:
        out.append(_table(
            ["op", "backend", "dtype", "check", "cases", "pass", "fail", "skip", "error", "worst rel RMS",
             "worst headroom", "worst headroom case"],
            [[g["op"], g["backend"], g["io_dtype"], g["check"], g["cases"], g["pass"], _count(g["fail"]), g["skip"],
              _count(g["error"]), fmt_err(g["worst_rel_rms"]), fmt_headroom(g["worst_headroom"]),
              _code(g["worst_headroom_case"] or "")] for g in summary["groups"]],
            numeric={4, 5, 6, 7, 8, 9, 10}))
    else:
        out.append("<p>No results were recorded.</p>")

    failures = summary["failures"]
    if failures:
        out.append(f"<h2>Failures and errors ({len(failures)})</h2>")
        rows = []
        for f in failures[:MAX_FAILURES_SHOWN]:
            m = f["metrics"]
            rows.append([f["status"], f["backend"], f["check"], _code(f["case"]), f["reason"],
                         fmt_err(m.get("rel_rms")), fmt_err(m.get("limit")), fmt_err(m.get("threshold")),
                         fmt_headroom(m.get("headroom")),
                         m.get("first_bad_token", "–"), _code(f["repro"])])
        out.append(_table(["status", "backend", "check", "case", "reason", "rel RMS", "judged limit", "threshold",
                           "headroom", "first bad token", "repro"], rows, numeric={5, 6, 7, 8, 9}))
        if len(failures) > MAX_FAILURES_SHOWN:
            out.append(f"<p class=\"muted\">… and {len(failures) - MAX_FAILURES_SHOWN} more in summary.json.</p>")

    if summary["skip_reasons"]:
        total = sum(s["count"] for s in summary["skip_reasons"])
        out.append(f"<h2>Skipped ({total}), by reason</h2>")
        out.append(_table(["count", "reason", "backend:op"],
                          [[s["count"], s["reason"], ", ".join(s["pairs"])] for s in summary["skip_reasons"]],
                          numeric={0}))

    out.append("<h2>Availability: which backend × op pairs can run here</h2>")
    if summary["gates"]:
        out.append(_table(
            ["backend", "op", "available", "required", "reason / notes"],
            [[g["backend"], g["op"], "yes" if g["runnable"] else Raw("<span class=\"bad\">no</span>"),
              ("required" if g["runnable"] else Raw("<span class=\"bad\">required</span>")) if g["required"] else "no",
              "; ".join(x for x in [g["reason"], *g["notes"]] if x)] for g in summary["gates"]]))
    else:
        out.append("<p>The run recorded no availability records.</p>")

    if summary["input_problems"]:
        out.append("<h2 id=\"input-problems\">Input problems (skipped lines of results.jsonl)</h2><ul>")
        out += [f"<li>{'line ' + str(p['line']) + ': ' if p['line'] is not None else ''}{escape(p['message'])}</li>"
                for p in summary["input_problems"]]
        out.append("</ul>")
    out.append("<p class=\"muted\">Rendered by <code>deltacheck report</code> from results.jsonl; "
               "summary.json holds the same data.</p></body></html>")
    return "\n".join(out) + "\n"
