"""Envelopes: which cases a fused kernel serves, declared as data over the main axes (``cases/axes.py``).

An adapter declares one ``Envelope`` per engine (and GPU architecture) in its ``facts.py``, without importing its
library and without a GPU. The tier generator covers the axis values inside each envelope
(``cases/matrix.py``); the harness compares the library's runtime answer with the declaration, and a
disagreement (declined inside the envelope, or ran outside it) is a visible note on the result.

An envelope is:

- ``allowed``: per axis, the values the engine serves (an absent axis: every value);
- ``backward``: whether it has a backward at all, and ``backward_allowed``: per axis, the values its backward
  serves (a case with ``bwd=on`` is served fully only when these hold too);
- ``excluded``: pairs of axis values it does not serve together, each with the reason (all rules are at most
  pairwise, so a covering array can be built over the envelope greedily);
- ``sms``: the GPU architectures (None: any CUDA GPU); ``needs``: a runtime the engine needs beyond the
  architecture (e.g. ``"cutile"``), so the envelope applies only where that runtime exists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .axes import MAIN_AXES, axis_values, compatible

Pair = tuple[tuple[str, str], tuple[str, str]]


@dataclass(frozen=True)
class Envelope:
    name: str  # e.g. "cudnn kda_hopper_cuda"
    op: str
    allowed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    backward: bool = True
    backward_allowed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    excluded: tuple[tuple[Pair, str], ...] = ()
    sms: tuple[int, ...] | None = None
    needs: str | None = None
    source: str = ""  # where the facts were read (file and function of the library)
    # axes() per base, memoized: the tier generator asks compatible() ~10^5 times per tier with one base
    _narrowed: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        for axis, values in [*self.allowed.items(), *self.backward_allowed.items()]:
            unknown = set(values) - set(MAIN_AXES.get(axis, ()))
            if axis not in MAIN_AXES or unknown:
                raise ValueError(f"envelope {self.name!r}: axis {axis!r} has no value(s) {sorted(unknown)}"
                                 if axis in MAIN_AXES else f"envelope {self.name!r}: unknown axis {axis!r}")
        for ((a, x), (b, y)), why in self.excluded:
            for axis, value in ((a, x), (b, y)):
                if value not in MAIN_AXES.get(axis, ()):
                    raise ValueError(f"envelope {self.name!r}: excluded pair names unknown {axis}={value!r}")
            if not why:
                raise ValueError(f"envelope {self.name!r}: excluded pair {a}={x} & {b}={y} needs a reason")

    # ------------------------------------------------------------------ the axes, restricted
    def axes(self, base: Mapping[str, tuple[str, ...]] = MAIN_AXES) -> dict[str, tuple[str, ...]]:
        """``base`` narrowed to what this envelope serves (the op axis to its op; bwd to 'off' without one)."""
        return dict(self._narrow(base)[0])

    def _narrow(self, base: Mapping[str, tuple[str, ...]]) -> tuple[dict[str, tuple[str, ...]], bool]:
        """(``axes(base)``, whether an axis is left empty), kept per base's contents (a base changed in place is
        another key; a base that cannot be hashed is narrowed every time)."""
        try:
            key = tuple((axis, tuple(values)) for axis, values in base.items())
            found = self._narrowed.get(key)
        except TypeError:
            key, found = None, None
        if found is None:
            out = {}
            for axis, values in base.items():
                keep = {"op": (self.op,)}.get(axis, self.allowed.get(axis))
                if axis == "bwd" and not self.backward:
                    keep = ("off",)
                out[axis] = tuple(v for v in values if keep is None or v in keep)
            found = (out, any(not values for values in out.values()))
            if key is not None:
                self._narrowed[key] = found
        return found

    def compatible(self, row: Mapping[str, str], base: Mapping[str, tuple[str, ...]] = MAIN_AXES) -> bool:
        """Whether a (partial) row of axis values can be a case this envelope serves fully (what the tier
        generator asks), looking ahead at the values each open axis may still take within ``base`` (a tier's
        axes): the op-level rules of ``axes.compatible`` included."""
        narrow, empty_axis = self._narrow(base)
        return not empty_axis and self._compatible_within(row, narrow)

    def rule(self, base: Mapping[str, tuple[str, ...]] = MAIN_AXES) -> Callable[[Mapping[str, str]], bool]:
        """``compatible(row, base)`` as a function of the row alone, ``base`` narrowed once: the covering-array
        builder asks ~10^5 times per tier, and building the narrowing's key on every call was a fifth of a tier's
        generation time."""
        narrow, empty_axis = self._narrow(base)
        if empty_axis:
            return lambda row: False
        return lambda row: self._compatible_within(row, narrow)

    def _compatible_within(self, row: Mapping[str, str], narrow: Mapping[str, tuple[str, ...]]) -> bool:
        row = {"op": self.op, **row}  # the op is fixed: a pair that no row of this op can hold is no target
        if not self._serves(row, backward=row.get("bwd") == "on"):
            return False
        if row.get("bwd") == "on" and any(axis not in row and not set(values) & set(narrow.get(axis, ()))
                                          for axis, values in self.backward_allowed.items()):
            return False
        return compatible(row, narrow)

    def _serves(self, row: Mapping[str, str], backward: bool) -> bool:
        if row.get("op", self.op) != self.op:
            return False
        if any(axis in row and row[axis] not in values for axis, values in self.allowed.items()):
            return False
        if backward and (not self.backward or any(
                axis in row and row[axis] not in values for axis, values in self.backward_allowed.items())):
            return False
        return not any(row.get(a) == x and row.get(b) == y for ((a, x), (b, y)), _ in self.excluded)

    # ------------------------------------------------------------------ cases
    def serves(self, case) -> tuple[bool, bool]:
        """(forward served, backward served) for a concrete (valid) case; the backward only for ``bwd`` cases."""
        values = {k: v for k, v in axis_values(case).items() if k != "bwd"}
        forward = self._serves(values, backward=False)
        return forward, forward and case.backward and self._serves(values, backward=True)

    def contains(self, case) -> bool:
        """Served fully: the forward, and the backward too when the case has one."""
        forward, backward = self.serves(case)
        return forward and (backward or not case.backward)

    def why_not(self, case) -> str:
        """A short reason a case is outside (for notes), or '' when it is inside."""
        values = axis_values(case)
        if case.op != self.op:
            return f"op {case.op}"
        for axis, allowed in self.allowed.items():
            if values.get(axis) not in allowed:
                return f"{axis}={values.get(axis)} (serves {', '.join(allowed)})"
        for ((a, x), (b, y)), why in self.excluded:
            if values.get(a) == x and values.get(b) == y:
                return f"{a}={x} with {b}={y}: {why}"
        if case.backward:
            if not self.backward:
                return "no backward"
            for axis, allowed in self.backward_allowed.items():
                if values.get(axis) not in allowed:
                    return f"backward with {axis}={values.get(axis)} (backward serves {', '.join(allowed)})"
        return ""

    def applies(self, sm: int | None = None, runtimes: frozenset[str] | None = None) -> bool:
        """Whether this engine is present on a GPU of architecture ``sm`` with these ``runtimes``; None means
        'any' (what a tier is generated for: every engine of every architecture)."""
        if sm is not None and self.sms is not None and sm not in self.sms:
            return False
        return self.needs is None or runtimes is None or self.needs in runtimes


@dataclass(frozen=True)
class EnvelopeUnion:
    """What one backend serves for one op on one architecture: the union of its engines' envelopes (the
    library's planner takes the first engine that accepts a case)."""

    name: str  # e.g. "cudnn kda SM90"
    op: str
    members: tuple[Envelope, ...]

    def axes(self, base: Mapping[str, tuple[str, ...]] = MAIN_AXES) -> dict[str, tuple[str, ...]]:
        per = [m.axes(base) for m in self.members]
        return {axis: tuple(v for v in values if any(v in p[axis] for p in per)) for axis, values in base.items()}

    def compatible(self, row: Mapping[str, str], base: Mapping[str, tuple[str, ...]] = MAIN_AXES) -> bool:
        return any(m.compatible(row, base) for m in self.members)

    def rule(self, base: Mapping[str, tuple[str, ...]] = MAIN_AXES) -> Callable[[Mapping[str, str]], bool]:
        rules = [m.rule(base) for m in self.members]
        return lambda row: any(ok(row) for ok in rules)

    def contains(self, case) -> bool:
        return any(m.contains(case) for m in self.members)

    def serves(self, case) -> tuple[bool, bool]:
        verdicts = [m.serves(case) for m in self.members]
        return any(f for f, _ in verdicts), any(b for _, b in verdicts)

    def why_not(self, case) -> str:
        return "; ".join(f"{m.name}: {m.why_not(case)}" for m in self.members) if not self.contains(case) else ""
