"""``deltacheck compare OLD NEW``: what changed between two runs, e.g. two cuDNN frontend releases.

Results are matched by (case id, backend, check) and each pair is sorted into one kind of change.
The error measure is the relative RMS error (``metrics.rel_rms``); errors below ``floor`` count as the
floor, so two exact (or fp64-exact) results never differ by a huge factor of nothing.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .formatting import fmt_err, fmt_headroom
from .frontier import FrontierChange, compare_frontiers, comparison_section
from .load import Run, number
from .markdown import code, table

# (kind, heading, is a regression). The order is the order of the report.
KINDS = (
    ("new_failure", "New failures", True),
    ("newly_errored", "Newly errored", True),
    ("newly_declined", "Newly declined (skipped now, ran before)", True),
    ("worse", "Worse: error grew by more than the factor", True),
    ("fixed", "Fixed", False),
    ("better", "Better: error shrank by more than the factor", False),
    ("newly_running", "Newly running (skipped before)", False),
    ("not_comparable", "Not comparable", False),
    ("unchanged", "Unchanged", False),
)
REGRESSIONS = frozenset(k for k, _, reg in KINDS if reg)
HEADINGS = {k: h for k, h, _ in KINDS}
DEFAULT_FACTOR = 2.0
DEFAULT_FLOOR = 1e-9


@dataclass
class Change:
    kind: str
    case: str
    backend: str
    check: str
    op: str
    old_status: str | None
    new_status: str | None
    old_error: float | None = None
    new_error: float | None = None
    new_headroom: float | None = None
    detail: str = ""


@dataclass
class Comparison:
    old: Run
    new: Run
    factor: float
    floor: float
    changes: list[Change] = field(default_factory=list)
    env_changes: list[tuple[str, str, str]] = field(default_factory=list)
    gate_changes: list[tuple[str, str, str, str]] = field(default_factory=list)
    coverage_changes: list[dict[str, Any]] = field(default_factory=list)
    frontier_changes: list[FrontierChange] = field(default_factory=list)
    # (case, backend, old engine, new engine): the forward was served by another engine (metrics["engine"], e.g.
    # cuDNN's graph.selected_engine.name), so a changed verdict can be traced to a routing change
    engine_changes: list[tuple[str, str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[Change]:
        return [c for c in self.changes if c.kind == kind]

    @property
    def counts(self) -> Counter:
        return Counter(c.kind for c in self.changes)

    @property
    def frontier_regressions(self) -> int:
        return sum(c.kind == "regressed" for c in self.frontier_changes)

    @property
    def regressed(self) -> bool:
        return any(c.kind in REGRESSIONS for c in self.changes) or self.frontier_regressions > 0

    @property
    def shared(self) -> int:
        """How many (case, backend, check) both runs hold: with none, there is nothing to compare."""
        return sum(c.old_status is not None and c.new_status is not None for c in self.changes)

    @property
    def exit_status(self) -> int:
        if not self.shared:
            return 2  # not "no regression": two runs of different selections (or an empty one) say nothing
        # A new run that did not finish (crashed, killed, a full disk) says nothing about what it never reached:
        # a job that died half-way must not pass against its baseline.
        return 1 if (self.regressed or not self.new.finished) else 0

    def nothing_shared(self) -> str:
        """The one line that says why two runs that share nothing cannot be compared."""
        def holds(run: Run) -> str:
            cases = len({r["case"] for r in run.results})
            backends = ", ".join(sorted({r["backend"] for r in run.results})) or "no backend"
            return f"{len(run.results)} results ({cases} cases on {backends})"

        return (f"the runs share no (case, backend, check): the old run {self.old.label} holds {holds(self.old)}, "
                f"the new run {self.new.label} {holds(self.new)}; compare two runs of the same selection")


def _ratio(old: float, new: float, floor: float) -> float:
    """new / old with both clamped up to the floor; NaN in the new run is infinitely worse."""
    if math.isnan(new) or math.isinf(new):
        return math.inf if not (math.isnan(old) or math.isinf(old)) else 1.0
    if math.isnan(old) or math.isinf(old):
        return 0.0
    return max(new, floor) / max(old, floor)


def _index(run: Run, label: str, notes: list[str]) -> dict[tuple[str, str, str], dict[str, Any]]:
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    duplicates = 0
    for r in run.results:
        key = (r["case"], r["backend"], r["check"])
        duplicates += key in out
        out[key] = r
    if duplicates:
        notes.append(f"{label} holds {duplicates} repeated (case, backend, check) results; the last of each was used.")
    return out


def _classify(old: dict | None, new: dict | None, factor: float, floor: float) -> Change:
    some = new or old
    assert some is not None
    change = Change("", some["case"], some["backend"], some["check"], some["op"],
                    old["status"] if old else None, new["status"] if new else None)
    if old is not None:
        change.old_error = number(old["metrics"].get("rel_rms"))
    if new is not None:
        change.new_error = number(new["metrics"].get("rel_rms"))
        change.new_headroom = number(new["metrics"].get("headroom"))
        change.detail = new["reason"]
    if old is None or new is None:
        change.kind = "not_comparable"
        change.detail = "only in the new run" if old is None else "only in the old run"
        return change

    # 'known' is a failure a known-issues entry covers: for what changed, it counts as a failure (a check that
    # passed and now fails as known is still a new failure; known -> pass is fixed; fail <-> known is the same).
    o, n = ("fail" if s == "known" else s for s in (old["status"], new["status"]))
    if o != n:
        if n == "fail":
            change.kind = "new_failure"
        elif n == "error":
            change.kind = "newly_errored"
        elif n == "skip":
            change.kind = "newly_declined"
        else:  # n == "pass"
            change.kind = "newly_running" if o == "skip" else "fixed"
            change.detail = f"was {old['status']}: {old['reason']}"
        return change

    if o in ("skip", "error"):
        change.kind = "unchanged"
        return change
    # Same verdict (both pass or both fail): compare the error.
    if change.old_error is None and change.new_error is None:
        change.kind = "unchanged"  # a check judged by status alone (determinism, unwritten output)
        return change
    if change.old_error is None or change.new_error is None:
        change.kind = "not_comparable"
        change.detail = f"no rel_rms in the {'old' if change.old_error is None else 'new'} run"
        return change
    ratio = _ratio(change.old_error, change.new_error, floor)
    if ratio > factor:
        change.kind = "worse"
    elif ratio < 1.0 / factor:
        change.kind = "better"
    else:
        change.kind = "unchanged"
    return change


def _flat_env(run: Run) -> dict[str, str]:
    env = run.env
    flat: dict[str, str] = {}
    for name, value in run.versions.items():
        flat[name] = "not installed" if value is None else str(value)
    # what each backend said its own version was (the ``version()`` hook; a plug-in's only record of it)
    backend_versions = run.header.get("backend_versions")
    for spec, value in (backend_versions.items() if isinstance(backend_versions, dict) else ()):
        flat[f"backend {spec}"] = "unknown" if value is None else str(value)
    cap = env.get("capability")
    for name, value in (("device", env.get("device_name")),
                        ("capability", f"SM{cap[0]}{cap[1]}" if isinstance(cap, (list, tuple)) and len(cap) == 2 else cap),
                        ("cuda available", env.get("cuda")), ("python", env.get("python")), ("host", env.get("host")),
                        ("deltacheck commit", (str(run.header["commit"])[:12] + (" (dirty)" if run.header.get("dirty") else ""))
                         if run.header.get("commit") else None)):
        if value is not None:
            flat[name] = str(value)
    return flat


def compare_runs(old: Run, new: Run, factor: float = DEFAULT_FACTOR, floor: float = DEFAULT_FLOOR) -> Comparison:
    if not factor > 1.0:
        raise ValueError(f"factor must be greater than 1, got {factor}")
    cmp = Comparison(old, new, factor, floor)
    old_idx = _index(old, "the old run", cmp.notes)
    new_idx = _index(new, "the new run", cmp.notes)
    for key in sorted(set(old_idx) | set(new_idx)):
        cmp.changes.append(_classify(old_idx.get(key), new_idx.get(key), factor, floor))
    cmp.frontier_changes = compare_frontiers(old.frontiers, new.frontiers)
    for key in sorted(set(old_idx) & set(new_idx)):
        if key[2] != "forward":
            continue
        a, b = (idx[key]["metrics"].get("engine") for idx in (old_idx, new_idx))
        if a != b and (a or b):
            cmp.engine_changes.append((key[0], key[1], a or "not recorded", b or "not recorded"))

    old_env, new_env = _flat_env(old), _flat_env(new)
    for name in sorted(set(old_env) | set(new_env)):
        a, b = old_env.get(name, "not recorded"), new_env.get(name, "not recorded")
        if a != b:
            cmp.env_changes.append((name, a, b))
    # Package and runtime versions first: they are why a release comparison exists.
    cmp.env_changes.sort(key=lambda row: (row[0] not in old.versions and row[0] not in new.versions, row[0]))

    def gates(run: Run) -> dict[tuple[str, str], dict]:
        return {(str(g["backend"]), str(g["op"])): g for g in run.gates}

    def gate_text(g: dict | None) -> str:
        if g is None:
            return "no availability record"
        text = "available" if g.get("runnable") else f"not available: {g.get('reason') or 'no reason given'}"
        return text + (" (required)" if g.get("required") else "")

    old_gates, new_gates = gates(old), gates(new)
    for pair in sorted(set(old_gates) | set(new_gates)):
        a, b = gate_text(old_gates.get(pair)), gate_text(new_gates.get(pair))
        if a != b:
            cmp.gate_changes.append((pair[0], pair[1], a, b))

    def coverage(run: Run) -> tuple[Counter, Counter]:
        total = Counter((r["op"], r["backend"]) for r in run.results)
        executed = Counter((r["op"], r["backend"]) for r in run.results if r["status"] in ("pass", "fail"))
        return total, executed

    (old_total, old_exec), (new_total, new_exec) = coverage(old), coverage(new)
    for pair in sorted(set(old_total) | set(new_total)):
        if (old_total[pair], old_exec[pair]) != (new_total[pair], new_exec[pair]):
            where = "only in the new run" if not old_total[pair] else "only in the old run" if not new_total[pair] else ""
            cmp.coverage_changes.append({"op": pair[0], "backend": pair[1], "old": old_total[pair], "new": new_total[pair],
                                         "old_executed": old_exec[pair], "new_executed": new_exec[pair], "where": where})

    for label, run in (("old", old), ("new", new)):
        if not run.finished:
            cmp.notes.append(f"The {label} run did not finish (no end record): results it never wrote are "
                             f"'only in the {'new' if label == 'old' else 'old'} run' below."
                             + (" The comparison fails (exit 1): an unfinished new run is not 'no regression'; "
                                "finish it with `deltacheck run --resume RUN_DIR`, then compare again."
                                if label == "new" else ""))
        if run.problems:
            cmp.notes.append(f"The {label} run's results.jsonl had {len(run.problems)} unusable line(s), skipped: "
                             + "; ".join(str(p) for p in run.problems[:5]) + (" …" if len(run.problems) > 5 else ""))
    return cmp


def _run_line(label: str, run: Run) -> str:
    bits = [f"{label}: `{run.directory}`"]
    if run.header.get("run_id"):
        bits.append(f"run {run.header['run_id']}")
    if run.header.get("started"):
        bits.append(f"started {run.header['started']}")
    bits.append(f"{len(run.results)} results")
    return " · ".join(bits)


def _status(s: str | None) -> str:
    return s if s is not None else "absent"


def render_comparison(cmp: Comparison) -> str:
    counts = cmp.counts
    if cmp.regressed:
        what = ", ".join([f"{counts[k]} {_short(k, counts[k])}" for k, _, reg in KINDS if reg and counts[k]]
                         + ([f"{cmp.frontier_regressions} frontier{'s' if cmp.frontier_regressions > 1 else ''} "
                             "moved the wrong way"] if cmp.frontier_regressions else []))
        head = f"# deltacheck compare: REGRESSION ({what})"
    else:
        head = "# deltacheck compare: no regression"
    out = [head, "", _run_line("old", cmp.old) + "  ", _run_line("new", cmp.new), ""]
    out += [(f"Factor {cmp.factor:g}: a result is *worse* when its relative RMS error grew more than {cmp.factor:g}×, "
             f"*better* when it shrank more than {cmp.factor:g}× (errors below {cmp.floor:g} count as {cmp.floor:g}). "
             f"Exit status {cmp.exit_status}."), ""]

    out += ["## Environment changes", ""]
    if cmp.env_changes:
        out += table(["", "old", "new"], [[name, a, f"**{b}**"] for name, a, b in cmp.env_changes])
    else:
        out.append("None: both runs recorded the same environment.")
    out.append("")

    if cmp.notes:
        out += ["## Read this first", ""] + [f"- {n}" for n in cmp.notes] + [""]

    out += comparison_section(cmp.frontier_changes, table)

    if cmp.engine_changes:
        out += [f"## Engine changes: another engine served the forward ({len(cmp.engine_changes)})", ""]
        out += table(["case", "backend", "old engine", "new engine"],
                     [[code(c), b, a_eng, f"**{b_eng}**"] for c, b, a_eng, b_eng in cmp.engine_changes])
        out.append("")

    out += ["## Changes by kind", ""]
    out += table(["kind", "results", "regression?"],
                 [[HEADINGS[k], counts[k], "**yes**" if reg and counts[k] else ("yes" if reg else "no")]
                  for k, _, reg in KINDS])
    out.append("")

    for kind, heading, _ in KINDS:
        changes = cmp.of_kind(kind)
        if not changes or kind == "unchanged":
            continue
        if kind in ("worse", "better"):
            heading = heading.replace("the factor", f"{cmp.factor:g}×")
        out += [f"## {heading} ({len(changes)})", ""]
        if kind in ("worse", "better"):
            changes.sort(key=lambda c: _ratio(c.old_error, c.new_error, cmp.floor), reverse=kind == "worse")
            out += table(["case", "backend", "check", "status", "old rel RMS", "new rel RMS", "factor", "new headroom"],
                         [[code(c.case), c.backend, c.check, c.new_status, fmt_err(c.old_error), fmt_err(c.new_error),
                           _fmt_factor(_ratio(c.old_error, c.new_error, cmp.floor)), fmt_headroom(c.new_headroom)]
                          for c in changes])
        else:
            out += table(["case", "backend", "check", "was", "now", "old rel RMS", "new rel RMS", "why"],
                         [[code(c.case), c.backend, c.check, _status(c.old_status), _status(c.new_status),
                           fmt_err(c.old_error), fmt_err(c.new_error), c.detail] for c in changes])
        out.append("")

    out += ["## Coverage changes (results per op × backend)", ""]
    if cmp.coverage_changes:
        out += table(["op", "backend", "old results (executed)", "new results (executed)", "note"],
                     [[c["op"], c["backend"], f"{c['old']} ({c['old_executed']})", f"{c['new']} ({c['new_executed']})",
                       c["where"]] for c in cmp.coverage_changes])
    else:
        out.append("None: every op × backend has the same number of results, executed and declined, in both runs.")
    out.append("")

    if cmp.gate_changes:
        out += ["## Gate changes", ""]
        out += table(["backend", "op", "old", "new"], [list(g) for g in cmp.gate_changes])
        out.append("")
    return "\n".join(out)


def _short(kind: str, n: int) -> str:
    if kind == "new_failure":
        return "new failure" if n == 1 else "new failures"
    return kind.replace("_", " ")


def _fmt_factor(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:.2f}×"


__all__ = ["KINDS", "REGRESSIONS", "Change", "Comparison", "compare_runs", "render_comparison"]
