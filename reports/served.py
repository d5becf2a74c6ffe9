"""Results per served path: for a backend that records which implementation served a call (``metrics.engine``:
cuDNN's selected engine, fla-dispatch's FLA dispatch choice; ``metrics.path``: FlashInfer's SM90 prefill kernel,
``cp`` or ``chunked``, shown as ``cp path`` / ``chunked path``), how many cases each path ran, passed and failed.

A case's forward path is its ``forward`` result's engine, and every check of the case that is not a gradient is
counted under it (state and continuation checks come from the same calls); the gradients are counted under the
engine their own results carry (fla-dispatch: FLA's dispatched backward pieces), else under the forward's.
"""

from __future__ import annotations

from typing import Any

_RANK = {"pass": 0, "skip": 1, "known": 2, "fail": 3, "error": 4}


def _worst(statuses: list[str]) -> str:
    return max(statuses, key=lambda s: _RANK.get(s, 5)) if statuses else "skip"


def served_by(metrics: dict[str, Any]) -> str | None:
    """The implementation a result records as having served its call, or None when it records none."""
    if metrics.get("engine") is not None:
        return str(metrics["engine"])
    return f"{metrics['path']} path" if metrics.get("path") else None


def served_paths(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows (backend, op, direction, engine, cases, pass, fail, known, skip, error), for the pairs whose forward
    results record an engine; empty when none does."""
    by_case: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in results:
        by_case.setdefault((r["backend"], r["op"], r["case"]), []).append(r)
    rows: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for (backend, op, _case), rs in by_case.items():
        forward = next((r for r in rs if r["check"] == "forward"), None)
        engine = served_by((forward or {}).get("metrics") or {})
        if engine is None:
            continue
        grads = [r for r in rs if r["check"].startswith("grad_") and r["status"] != "skip"]
        others = [r for r in rs if not r["check"].startswith("grad_")]
        parts = [("forward", str(engine), others)]
        if grads:
            parts.append(("backward", served_by(grads[0].get("metrics") or {}) or engine, grads))
        for direction, path, group in parts:
            row = rows.setdefault((backend, op, direction, path), {
                "backend": backend, "op": op, "direction": direction, "engine": path, "cases": 0,
                **{s: 0 for s in _RANK}})
            row["cases"] += 1
            row[_worst([r["status"] for r in group])] += 1
    return [rows[k] for k in sorted(rows)]


def served_section(rows: list[dict[str, Any]], table, code) -> list[str]:
    """summary.md's 'Results per served path' section (empty when no result records its engine)."""
    if not rows:
        return []
    out = ["## Results per served path (which implementation ran each case)", "",
           "A case is counted once per direction, by its worst check: forward covers out, state and continuation; "
           "backward covers the gradients.", ""]
    out += table(["backend", "op", "direction", "served by", "cases", "pass", "fail", "known", "skip", "error"],
                 [[r["backend"], r["op"], r["direction"], code(r["engine"]), r["cases"], r["pass"],
                   f"**{r['fail']}**" if r["fail"] else 0, r["known"], r["skip"],
                   f"**{r['error']}**" if r["error"] else 0] for r in rows])
    return out + [""]
