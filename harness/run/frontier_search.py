"""The stability frontier: along one axis, the last value at which a kernel is still right and the first at which
it is not (``deltacheck frontier``; docs/frontier.md).

Two halves. The searches (``search_gate``, ``search_length``, ``search_scale``) are pure: each takes a
``judge(value) -> Point`` and decides only which value to try next, so tests drive them with plain functions.
``CaseJudge`` is the judge ``deltacheck frontier`` uses: a value becomes an ordinary case with an id
(``case_at``), which ``task.run_task`` runs and judges with ``run``'s own checks and limits.

Axes and their values:

- ``gate``: x, the lower end of the log-decay draw U(x, -0.1) (case gate profile ``unif<-x>``). Bracketed on a log
  scale from -0.5 to -1000 (-0.5, -1, -2, ... -512, -1000), then bisected until the bracket is within
  max(0.1, 2% of |x|).
- ``length``: T, one sequence of T tokens, doubling from 64 to a cap; every T is judged until the first failure.
- ``scale``: m, the magnitude (case token ``mag<m>``) multiplying v and q (and k under l2norm), from 1 outwards to
  1e3 and to 1e-3 by decades, then bisected to a tenth of a decade. Two-sided: ``last_pass`` and ``first_fail``
  are ``[below 1, above 1]`` pairs.

A point the kernel got wrong (a failed check, or an exception) is a failure; a point it declined, ran out of
memory on, or whose reference could not be computed is neither: the search stops there and says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from deltacheck.cases import Case, CaseError

from ..backends.base import Verdict
from ..judge.checks import checks_for, task_result
from ..machine.availability import case_verdict
from .task import run_task

AXES = ("gate", "length", "scale")
# The record's keys, exactly (tools read them; docs/run-directory.md).
RECORD_KEYS = ("backend", "op", "dtype", "axis", "last_pass", "first_fail", "resolution", "base_case", "points")

PASS, FAIL, ERROR = "pass", "fail", "error"
DECLINED, OUT_OF_MEMORY, REFERENCE_FAILED = "declined", "out_of_memory", "reference_failed"
FAILING = frozenset({FAIL, ERROR})  # the kernel did not give a right answer there
# (anything else but PASS stops the search: neither a pass nor a fail)

GATE_START, GATE_END = -0.5, -1000.0
GATE_STEP, GATE_STEP_RELATIVE = 0.1, 0.02
LENGTH_START = 64
LENGTH_GATE = "long"  # states that live thousands of tokens: where errors can accumulate with T
SCALE_LOW, SCALE_HIGH = 1e-3, 1e3
SCALE_STEP = 10 ** 0.1  # a tenth of a decade, as a ratio
LENGTH_CAP = {"cpu": 4096, "cuda": 65536}  # default memory caps of the length axis, by device type


@dataclass
class Point:
    """One judged value of an axis: its verdict, its case, and the errors behind the verdict."""

    value: float
    verdict: str
    case: str = ""
    # The judged check nearest its limit (largest headroom = rel RMS / limit): its name, rel RMS and limit. The rel
    # RMS is None when NaN/Inf appeared or nothing was judged.
    worst_rel_rms: float | None = None
    worst_check: str = ""
    limit: float | None = None
    nonfinite: bool = False  # NaN or Inf in an output, state or gradient
    rel_rms: dict[str, float | None] = field(default_factory=dict)  # per judged check
    baseline: dict[str, float | None] = field(default_factory=dict)  # the same-precision baseline's, per check
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "verdict": self.verdict, "worst_rel_rms": _finite(self.worst_rel_rms),
                "worst_check": self.worst_check, "nonfinite": self.nonfinite, "limit": _finite(self.limit),
                "case": self.case, "rel_rms": {k: _finite(v) for k, v in self.rel_rms.items()},
                "baseline": {k: _finite(v) for k, v in self.baseline.items()}, "reason": self.reason}


@dataclass
class Frontier:
    axis: str
    last_pass: Any  # a number (gate, length) or a [below 1, above 1] pair (scale); None when nothing passed
    first_fail: Any  # likewise; None when nothing failed in range
    resolution: float  # gate: in x; length and scale: a ratio
    points: list[Point]

    def record(self, backend: str, op: str, dtype: str, base_case: str) -> dict[str, Any]:
        """The JSON contract's object (keys exactly ``RECORD_KEYS``)."""
        return {"backend": backend, "op": op, "dtype": dtype, "axis": self.axis, "last_pass": self.last_pass,
                "first_fail": self.first_fail, "resolution": self.resolution, "base_case": base_case,
                "points": [p.to_dict() for p in self.points]}


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


# --- the searches (pure) ---------------------------------------------------------------------------


class _Memo:
    """Each value judged once, every point kept."""

    def __init__(self, judge: Callable[[float], Point]):
        self.judge, self.seen = judge, {}

    def __call__(self, value: float) -> Point:
        if value not in self.seen:
            self.seen[value] = self.judge(value)
        return self.seen[value]

    def points(self, descending: bool = False) -> list[Point]:
        return [self.seen[v] for v in sorted(self.seen, reverse=descending)]


def _walk(judge: _Memo, ladder: Iterable[float]) -> tuple[float | None, float | None]:
    """Judge the ladder in order until a value is not passed: (last passed, first failed); a stopping point
    (declined, out of memory) ends the walk with nothing failed."""
    last = None
    for value in ladder:
        verdict = judge(value).verdict
        if verdict == PASS:
            last = value
        else:
            return last, (value if verdict in FAILING else None)
    return last, None


def _bisect(judge: _Memo, good: float, bad: float, midpoint, fine_enough) -> tuple[float, float]:
    """Narrow [good, bad] until ``fine_enough``; a stopping point inside leaves the bracket where it is."""
    while not fine_enough(good, bad):
        mid = midpoint(good, bad)
        if mid is None:
            break
        verdict = judge(mid).verdict
        if verdict == PASS:
            good = mid
        elif verdict in FAILING:
            bad = mid
        else:
            break
    return good, bad


def _between(a: float, b: float, candidates: Iterable[float]) -> float | None:
    """The first candidate strictly inside (a, b) (either order), or None."""
    lo, hi = min(a, b), max(a, b)
    return next((c for c in candidates if lo < c < hi), None)


def gate_ladder() -> list[float]:
    values, x = [], GATE_START
    while x > GATE_END:
        values.append(x)
        x *= 2
    return values + [GATE_END]


def gate_resolution(x: float) -> float:
    """0.1 in x, or 2% of |x|, whichever is coarser."""
    return max(GATE_STEP, GATE_STEP_RELATIVE * abs(x))


def _gate_midpoint(a: float, b: float) -> float | None:
    # Geometric in |x| (the bracket was laid on a log scale), to 0.01 so that a case id stays short.
    return _between(a, b, (-round(math.sqrt(a * b), 2), round((a + b) / 2, 2)))


def search_gate(judge: Callable[[float], Point]) -> Frontier:
    memo = _Memo(judge)
    good, bad = _walk(memo, gate_ladder())
    resolution = gate_resolution(bad if bad is not None else GATE_START)
    if good is not None and bad is not None:
        good, bad = _bisect(memo, good, bad, _gate_midpoint,
                            lambda a, b: abs(a - b) <= gate_resolution(b) * (1 + 1e-9))
        resolution = max(gate_resolution(bad), abs(good - bad))
    return Frontier("gate", good, bad, resolution, memo.points(descending=True))


def length_ladder(cap: int) -> list[int]:
    values, t = [], LENGTH_START
    while t <= cap:
        values.append(t)
        t *= 2
    return values


def search_length(judge: Callable[[float], Point], cap: int) -> Frontier:
    """Every T from 64, doubling up to ``cap``, until the first one that fails (no bisection: the growth of
    the error with T is the measurement)."""
    memo = _Memo(judge)
    good, bad = _walk(memo, length_ladder(cap))
    return Frontier("length", good, bad, 2.0, memo.points())


def _scale_midpoint(a: float, b: float) -> float | None:
    mid = math.sqrt(a * b)
    return _between(a, b, (float(f"{mid:.3g}"), float(f"{mid:.4g}")))


def _ratio(a: float, b: float) -> float:
    return max(a, b) / min(a, b)


def search_scale(judge: Callable[[float], Point]) -> Frontier:
    memo = _Memo(judge)
    brackets = []
    for ladder in ([1.0, 10.0, 100.0, SCALE_HIGH], [1.0, 0.1, 0.01, SCALE_LOW]):
        good, bad = _walk(memo, ladder)
        if good is not None and bad is not None:
            good, bad = _bisect(memo, good, bad, _scale_midpoint, lambda a, b: _ratio(a, b) <= SCALE_STEP * (1 + 1e-9))
        brackets.append((good, bad))
    (hi_good, hi_bad), (lo_good, lo_bad) = brackets
    widths = [_ratio(g, b) for g, b in brackets if g is not None and b is not None]
    first_fail = None if lo_bad is None and hi_bad is None else [lo_bad, hi_bad]
    return Frontier("scale", [lo_good, hi_good], first_fail, max([SCALE_STEP, *widths]), memo.points())


# --- cases: the base case, the envelope, a value as a case ------------------------------------------

# Base-case candidates, in order of preference; the first the backend accepts is the base case. Each is THD with
# three ragged sequences of two to three 64-token chunks (whole chunks and partial tails), the log domain, no safe
# gate, an initial state and a backward (judged where the backend's verdict allows one).
BASE_LENGTHS = (192, 130, 160)
BASE_SHAPES = (  # (K, V, (H, HK, HV))
    (128, 128, (2, 2, 2)), (64, 64, (2, 2, 2)),  # MHA
    (128, 128, (1, 1, 2)), (64, 64, (1, 1, 2)),  # GVA
    (128, 128, (2, 1, 1)), (64, 64, (2, 1, 1)),  # GQA
)


def base_candidates(op: str, dtype: str) -> list[Case]:
    """The documented candidate base cases for ``op`` in ``dtype``: each shape with an initial state, then
    without one. Shapes the op itself does not accept are left out."""
    out = []
    for k, v, (h, hk, hv) in BASE_SHAPES:
        for h0 in (True, False):
            try:
                out.append(Case(op=op, io_dtype=dtype, layout="thd", seqlens=BASE_LENGTHS, H=h, HK=hk, HV=hv, K=k,
                                V=v, gate="typical", initial_state=h0, backward=True))
            except CaseError:
                continue
    return out


def acceptance(backend, spec: str, case: Case, env) -> Verdict:
    """ENVELOPE HOOK: whether ``case`` lies inside ``spec``'s envelope. Today that is the backend's own verdict
    (``availability.case_verdict``); a declarative per-backend envelope is checked here, and only here, once
    it exists (base-case choice and every point of a search go through this function)."""
    return case_verdict(backend, spec, case, env)


def choose_base_case(backend, spec: str, op: str, dtype: str, env) -> tuple[Case | None, list[str]]:
    """The first candidate inside the envelope, and why each one before it was not."""
    refused = []
    for case in base_candidates(op, dtype):
        verdict = acceptance(backend, spec, case, env)
        if verdict.runnable:
            return case, refused
        refused.append(f"{case.id}: {verdict.reason}")
    return None, refused


def gate_profile(x: float) -> str:
    """The case gate profile drawing log-decays from U(x, -0.1): ``unif<|x|>``."""
    return "unif" + f"{abs(x):.2f}".rstrip("0").rstrip(".")


def case_at(axis: str, base: Case, value: float) -> Case:
    """The case that judges ``value`` on ``axis`` (raises CaseError if the base case cannot carry it)."""
    if axis == "gate":
        return base.replace(gate=gate_profile(value))
    if axis == "length":
        return base.replace(seqlens=(int(value),), gate=LENGTH_GATE)
    if axis == "scale":
        return base.replace(magnitude=None if value == 1 else float(value))
    raise ValueError(f"unknown axis {axis!r}; the axes are {', '.join(AXES)}")


def companion_cases(axis: str, case: Case) -> list[Case]:
    """Cases judged beside the axis' own case at each value (a point passes only if every one does): on the fp16
    length axis of KDA and GDN2, the same case through the sigmoid safe gate, backward included — an error that grows
    with context length in fp16 (TF32-rounded dots in a safe-gate kernel) shows there and not on the plain gate."""
    if axis != "length" or case.io_dtype != "fp16" or case.safe_gate or case.support.safe_gate_form != "sigmoid":
        return []
    try:
        return [case.replace(safe_gate=True)]
    except CaseError:
        return []


def _headroom(point: Point) -> float:
    if point.worst_rel_rms is None or not point.limit:
        return math.inf if point.nonfinite else -math.inf
    return point.worst_rel_rms / point.limit


def worse_point(point: Point, other: Point, other_case: Case) -> Point:
    """Of a value's two points, the one that decides it: a failing one over a passing one, else the one nearer its
    limit; a declined or unjudged companion leaves ``point`` as it is."""
    if other.verdict not in (PASS, *FAILING):
        return point
    if point.verdict not in (PASS, *FAILING):
        return point
    other_fails, point_fails = other.verdict in FAILING, point.verdict in FAILING
    if other_fails and not point_fails or (other_fails == point_fails and _headroom(other) > _headroom(point)):
        if other.reason:
            other.reason = f"{other_case.id}: {other.reason}"
        return other
    return point


# --- the judge: run's checks and limits on one case ------------------------------------------------


def _out_of_memory(reason: str) -> bool:
    return "OutOfMemoryError" in reason or "out of memory" in reason.lower()


class CaseJudge:
    """``judge(value)`` for one backend x base case x axis: the value's case through ``run_task`` (every Result
    also goes to ``sink``), reduced to a Point. Judged: forward, state, and each gradient the backend's verdict
    allows (continuation and determinism are not stability questions)."""

    def __init__(self, runner, backend, spec: str, base: Case, axis: str, env, sink=None, *, run_case=None):
        self.runner, self.backend, self.spec, self.base, self.axis = runner, backend, spec, base, axis
        self.env, self.sink = env, sink
        # run_case(case) -> its Results: a pool worker's (``deltacheck frontier``); by default run_task here
        self.run_case = run_case or (lambda case: list(run_task(self.runner, case, self.spec, self.env,
                                                                 sink=self.sink)))

    def __call__(self, value: float) -> Point:
        case = case_at(self.axis, self.base, value)
        point = self._judge(value, case)
        for other in companion_cases(self.axis, case):
            point = worse_point(point, self._judge(value, other), other)
        return point

    def _judge(self, value: float, case: Case) -> Point:
        verdict = acceptance(self.backend, self.spec, case, self.env)
        if not verdict.runnable:
            for check in checks_for(case):
                self._emit(task_result(case, self.spec, check=check, status="skip", reason=verdict.reason))
            return Point(value, DECLINED, case.id, reason=verdict.reason)
        results = self.run_case(case)
        # the reference could not be computed (the runner marks every such result): neither a pass nor a fail
        reference_problem = next((r.reason for r in results if r.metrics.get("reference_failed")), "")
        return point_of(value, case, results, reference_problem)

    def _emit(self, result) -> None:
        if self.sink is not None:
            self.sink(result)


def point_of(value: float, case: Case, results: list, reference_problem: str = "") -> Point:
    """A point's verdict from its task's Results: declined (forward skipped), not judged (out of memory, the
    reference failed), error, fail, or pass — and the relative RMS error of the judged check nearest its limit."""
    judged = [r for r in results if r.check in ("forward", "state") or r.check.startswith("grad_")]
    point = Point(value, PASS, case.id)
    forward = next((r for r in judged if r.check == "forward"), None)
    if forward is None or forward.status == "skip":
        point.verdict, point.reason = DECLINED, forward.reason if forward else "no forward result"
        return point
    errors = [r for r in judged if r.status == "error"]
    fails = [r for r in judged if r.status == "fail"]
    if reference_problem:
        point.verdict, point.reason = (OUT_OF_MEMORY if _out_of_memory(reference_problem) else REFERENCE_FAILED,
                                       reference_problem)
    elif errors:
        point.verdict = OUT_OF_MEMORY if any(_out_of_memory(r.reason) for r in errors) else ERROR
        point.reason = f"{errors[0].check}: {errors[0].reason}"
    elif fails:
        point.verdict, point.reason = FAIL, f"{fails[0].check}: {fails[0].reason}"
    worst_headroom = -math.inf
    for r in judged:
        rel = r.metrics.get("rel_rms")
        if r.status not in ("pass", "fail") or rel is None:
            continue
        rel = math.inf if math.isnan(rel) else rel
        point.rel_rms[r.check], point.baseline[r.check] = rel, r.metrics.get("baseline")
        point.nonfinite |= bool(r.metrics.get("nan") or r.metrics.get("inf")) or math.isinf(rel)
        headroom = r.metrics.get("headroom")
        headroom = math.inf if headroom is None or math.isnan(headroom) else headroom
        if headroom > worst_headroom:
            worst_headroom, point.worst_rel_rms, point.worst_check = headroom, rel, r.check
            point.limit = r.metrics.get("limit")
    return point


def search(axis: str, judge: Callable[[float], Point], length_cap: int = LENGTH_CAP["cpu"]) -> Frontier:
    """The search of ``axis`` (``length_cap``: the length axis' largest T)."""
    if axis == "gate":
        return search_gate(judge)
    if axis == "length":
        return search_length(judge, length_cap)
    if axis == "scale":
        return search_scale(judge)
    raise ValueError(f"unknown axis {axis!r}; the axes are {', '.join(AXES)}")
