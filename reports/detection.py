"""Detection power: how small a bug each backend x op x check still sees (``summary.json``'s ``detection``,
from the ``detects`` metric of harness/judge/compare.py), against the target, and the section both report formats
draw from it."""

from __future__ import annotations

from typing import Any

from .formatting import badness, check_sort_key, fmt_err
from .load import number

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


