"""What every report shares: the order statuses and checks are listed in, the worst-first sort key, and how
numbers, counts, environments and backends are written (summary.md, report.html, ``compare``, the plots, the
terminal)."""

from __future__ import annotations

import math
from typing import Any

from .load import number

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
