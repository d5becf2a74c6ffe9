"""Stability frontiers in reports: the summary's ``frontiers`` list (with the length axis' growth slopes), the
Markdown section, and the comparison of two runs' frontiers (a frontier that moved the wrong way is a regression).

A frontier record (``kind: "frontier"``, docs/run-directory.md) holds ``backend``, ``op``, ``dtype``, ``axis``,
``last_pass``, ``first_fail``, ``resolution``, ``base_case`` and ``points``. On the gate and length axes the two
bounds are numbers; on the scale axis each is a ``[below 1, above 1]`` pair.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from deltacheck.harness.records.results import repro_command

from .load import FRONTIER_KEY, finite, number

# How each axis reads "further is better": on the gate axis a more negative x, on the length axis a longer T,
# on the scale axis a magnitude further from 1 on either side (so the passing range is wider).
AXIS_MEANING = {
    "gate": "steepest log-decay x (decays from U(x, -0.1)); further from 0 is better",
    "length": "sequence length T; longer is better",
    "scale": "magnitude of v and q (k under l2norm); a wider range around 1 is better",
}


def key_of(record: dict[str, Any]) -> tuple[str, ...]:
    return tuple(str(record.get(k)) for k in FRONTIER_KEY)


def fmt_bound(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(fmt_bound(v) for v in value) + "]"
    x = number(value)
    return "none" if x is None else f"{x:g}"


def growth_slope(points: list[dict[str, Any]], check: str, source: str = "rel_rms") -> float | None:
    """The least-squares slope of log(error) against log(T) over the points with a finite, positive error of
    ``check`` (``source``: the kernel's ``rel_rms`` or the ``baseline``'s): error grows like T**slope."""
    xy = []
    for p in points:
        t, err = finite(p.get("value")), finite((p.get(source) or {}).get(check))
        if t is not None and t > 0 and err is not None and err > 0:
            xy.append((math.log(t), math.log(err)))
    if len(xy) < 2:
        return None
    mx, my = sum(x for x, _ in xy) / len(xy), sum(y for _, y in xy) / len(xy)
    sxx = sum((x - mx) ** 2 for x, _ in xy)
    return sum((x - mx) * (y - my) for x, y in xy) / sxx if sxx > 0 else None


def growth(record: dict[str, Any]) -> dict[str, float | None]:
    points = record.get("points") or []
    return {f"{label}{check}": growth_slope(points, check, source)
            for check in ("forward", "state") for label, source in (("", "rel_rms"), ("baseline_", "baseline"))}


def first_failing_point(record: dict[str, Any]) -> dict[str, Any] | None:
    return next((p for p in record.get("points") or [] if p.get("verdict") in ("fail", "error")), None)


def frontier_summaries(frontiers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """summary.json's ``frontiers``: each record as written, plus ``growth`` on the length axis and the command
    that re-runs the first failing point."""
    out = []
    for rec in sorted(frontiers, key=key_of):
        entry = dict(rec)
        if rec.get("axis") == "length":
            entry["growth"] = growth(rec)
        failing = first_failing_point(rec)
        entry["first_fail_repro"] = (repro_command(str(failing.get("case")), str(rec.get("backend")))
                                     if failing else None)
        out.append(entry)
    return out


def _slope(x: float | None) -> str:
    return "–" if x is None else f"T^{x:.2f}"


def markdown_section(frontiers: list[dict[str, Any]], table, code) -> list[str]:
    """The summary.md section (``table`` and ``code`` are markdown.py's helpers)."""
    if not frontiers:
        return []
    out = ["## Stability frontiers", "",
           "Each row: the last value that passed every judged check (forward, state, and the gradients where the "
           "backend runs a backward) and the first that failed. The failing points past a frontier are its "
           "measurement, and they count as failed checks above.", ""]
    out += table(["backend", "op", "dtype", "axis", "last pass", "first fail", "resolution", "points", "base case"],
                 [[f["backend"], f["op"], f["dtype"], f["axis"], fmt_bound(f["last_pass"]), fmt_bound(f["first_fail"]),
                   fmt_bound(f["resolution"]), len(f.get("points") or []), code(f["base_case"])] for f in frontiers])
    out.append("")
    for f in frontiers:
        lines = []
        if f.get("growth"):
            g = f["growth"]
            lines.append(f"rel RMS growth with T: output {_slope(g['forward'])} (baseline {_slope(g['baseline_forward'])}), "
                         f"state {_slope(g['state'])} (baseline {_slope(g['baseline_state'])})")
        stops = [p for p in f.get("points") or [] if p.get("verdict") not in ("pass", "fail", "error")]
        lines += [f"stopped at {fmt_bound(p.get('value'))} ({p.get('verdict')}): {p.get('reason')}" for p in stops]
        if f.get("first_fail_repro"):
            lines.append(f"re-run the first failing point: {code(f['first_fail_repro'])}")
        if lines:
            out.append(f"- {f['backend']} {f['op']} {f['dtype']} {f['axis']}: " + "; ".join(lines))
    out.append("")
    return out


# --- comparing two runs' frontiers -----------------------------------------------------------------


@dataclass
class FrontierChange:
    backend: str
    op: str
    dtype: str
    axis: str
    kind: str  # regressed | improved | unchanged | not_comparable
    old: dict[str, Any] | None
    new: dict[str, Any] | None
    detail: str = ""


def _sides(record: dict[str, Any]) -> list[tuple[float, float, float]]:
    """Per side of the axis: (reach of last_pass, reach of first_fail, reach of the furthest point judged),
    where a larger reach is better. Nothing passed: -inf; nothing failed: +inf."""
    axis = record.get("axis")
    lp, ff = record.get("last_pass"), record.get("first_fail")
    values = [number(p.get("value")) for p in record.get("points") or []]
    values = [v for v in values if v is not None]
    if axis == "scale":
        lp = lp if isinstance(lp, list) and len(lp) == 2 else [None, None]
        ff = ff if isinstance(ff, list) and len(ff) == 2 else [None, None]
        sides = [(lp[0], ff[0], min(values, default=None), lambda v: -math.log(v)),
                 (lp[1], ff[1], max(values, default=None), math.log)]
    elif axis == "gate":
        sides = [(lp, ff, min(values, default=None), lambda v: -v)]
    else:
        sides = [(lp, ff, max(values, default=None), lambda v: v)]
    out = []
    for last, first, furthest, reach in sides:
        last, first, furthest = number(last), number(first), number(furthest)
        out.append((-math.inf if last is None else reach(last), math.inf if first is None else reach(first),
                    -math.inf if furthest is None else reach(furthest)))
    return out


def _classify(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, str]:
    kinds = []
    for (o_last, o_first, _), (n_last, n_first, n_furthest) in zip(_sides(old), _sides(new)):
        if n_first < o_first:
            kinds.append("regressed")  # it fails where, or nearer than, it failed before
        elif n_last < o_last:
            # It stopped passing sooner without failing sooner: a shorter search (the length axis' cap) is not
            # comparable; a decline or a failure on the way is a regression.
            shorter = math.isinf(n_first) and n_furthest <= n_last
            kinds.append("not_comparable" if shorter else "regressed")
        elif n_first > o_first or n_last > o_last:
            kinds.append("improved")
        else:
            kinds.append("unchanged")
    kind = next(k for k in ("regressed", "not_comparable", "improved", "unchanged") if k in kinds)
    detail = (f"last pass {fmt_bound(old.get('last_pass'))} → {fmt_bound(new.get('last_pass'))}, "
              f"first fail {fmt_bound(old.get('first_fail'))} → {fmt_bound(new.get('first_fail'))}")
    if kind == "not_comparable":
        detail += "; the new run searched a shorter range and failed nowhere in it"
    if old.get("base_case") != new.get("base_case"):
        detail += f"; base cases differ ({old.get('base_case')} → {new.get('base_case')})"
    return kind, detail


def compare_frontiers(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[FrontierChange]:
    old_by, new_by = {key_of(r): r for r in old}, {key_of(r): r for r in new}
    changes = []
    for key in sorted(set(old_by) | set(new_by)):
        a, b = old_by.get(key), new_by.get(key)
        if a is None or b is None:
            kind, detail = "not_comparable", "only in the new run" if a is None else "only in the old run"
        else:
            kind, detail = _classify(a, b)
        changes.append(FrontierChange(*key, kind=kind, old=a, new=b, detail=detail))
    return changes


def comparison_section(changes: list[FrontierChange], table) -> list[str]:
    if not changes:
        return []
    out = ["## Stability frontiers", "",
           "A frontier regressed when the new run fails nearer than the old one did, or stops passing sooner "
           "(gate: nearer 0; length: shorter; scale: a narrower range around 1).", ""]
    out += table(["backend", "op", "dtype", "axis", "change", "old last pass / first fail",
                  "new last pass / first fail", "detail"],
                 [[c.backend, c.op, c.dtype, c.axis, f"**{c.kind}**" if c.kind == "regressed" else c.kind,
                   f"{fmt_bound(c.old.get('last_pass'))} / {fmt_bound(c.old.get('first_fail'))}" if c.old else "–",
                   f"{fmt_bound(c.new.get('last_pass'))} / {fmt_bound(c.new.get('first_fail'))}" if c.new else "–",
                   c.detail] for c in changes])
    out.append("")
    return out
