"""How much of the axis space a set of cases covers: counts per axis value, and pair / triple coverage against
a tier's own axes (or any axes and compatibility rule, e.g. a backend's envelope)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable

from .axes import MAIN_AXES, axis_values, compatible
from .covering import interactions
from .matrix import TIER_AXES


def _axes_for(cases, axes):
    if axes is not None:
        return axes
    tiers = {case.tier for case in cases}
    return TIER_AXES[tiers.pop()] if len(tiers) == 1 else MAIN_AXES


def interaction_coverage(cases, axes=None, strength: int = 2, group=None,
                         compatible: Callable[[dict], bool] = compatible) -> tuple[int, int, list]:
    """(covered, total, missing) over every compatible `strength`-tuple of `axes` values (within `group`
    when given). `axes` defaults to the tier's own axes when all cases share a tier."""
    cases = list(cases)
    axes = _axes_for(cases, axes)
    names = tuple(n for n in axes if group is None or n in group)
    wanted = interactions(axes, [names], strength, compatible)
    seen = set()
    for case in cases:
        values = axis_values(case)
        seen.update(itertools.combinations([(n, values[n]) for n in names], strength))
    missing = [t for t in wanted if t not in seen]
    return len(wanted) - len(missing), len(wanted), missing


def pair_coverage(cases, axes=None) -> tuple[int, int, list]:
    """(covered, total, missing) over every compatible pair of main-axis values."""
    return interaction_coverage(cases, axes, 2)


def coverage_table(cases, axes=None, compatible: Callable[[dict], bool] = compatible) -> str:
    """``N cases`` on the first line, then size statistics, counts per axis value, pair and triple coverage.

    Coverage is measured against `axes` (by default the tier's own axes when all cases share a tier, MAIN_AXES
    otherwise) and `compatible` (by default the op-level rules; a backend's envelope for `list --backend`).
    """
    cases = list(cases)
    if not cases:
        return "0 cases"
    axes = _axes_for(cases, axes)
    counts = {name: Counter() for name in axes}
    for case in cases:
        values = axis_values(case)
        for name in axes:
            counts[name][values[name]] += 1
    width = max(map(len, axes))
    tokens = [c.total_tokens for c in cases]
    lines = [
        f"{len(cases)} cases",
        f"tokens per case min {min(tokens)} / median {sorted(tokens)[len(tokens) // 2]} / max {max(tokens)}; "
        f"max heads {max(c.HO for c in cases)}; sequences per case max {max(c.N for c in cases)}",
    ]
    for name, values in axes.items():
        listed = [f"{v}:{counts[name][v]}" for v in values]
        listed += [f"{v}:{n}" for v, n in sorted(counts[name].items()) if v not in values]
        lines.append(f"  {name:<{width}}  " + "  ".join(listed))
    for strength, label in ((2, "pairs"), (3, "triples")):
        covered, total, missing = interaction_coverage(cases, axes, strength, compatible=compatible)
        percent = 100.0 * covered / total if total else 100.0
        lines.append(f"{label} of axis values covered: {covered}/{total} ({percent:.1f}%)")
        if missing and strength == 2:
            shown = ", ".join("&".join(f"{a}={x}" for a, x in t) for t in missing[:6])
            lines.append(f"  missing (first 6): {shown}")
    return "\n".join(lines)
