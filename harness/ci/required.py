"""Required mode: which backend x op pairs must run, and the one verdict on whether they did.

``NVTE_GDN2_TEST_REQUIRED=1`` requires cudnn:gdn2, ``NVTE_GDN_TEST_REQUIRED=1`` cudnn:gdn, and
``DELTACHECK_REQUIRE=cudnn:kda,fla:gdn2`` any pairs (docs/required-mode.md). Every front (``deltacheck run``, the
pytest plugin, ``merge``) feeds its finished tasks into the one ``tally.RunTally`` and prints
``format_required_report`` of its ``failures``, so they reach the same verdict by construction.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from deltacheck.cases.support import OPS

from ..backends.base import Verdict, registered


class RequiredModeError(Exception):
    """A required pair cannot be qualified. ``failures`` are the lines; ``str()`` is the report."""

    def __init__(self, failures: Sequence[str] | str) -> None:
        self.failures = [failures] if isinstance(failures, str) else list(failures)
        super().__init__(format_required_report(self.failures))


class RequireSpecError(RequiredModeError, ValueError):
    """``DELTACHECK_REQUIRE`` / ``NVTE_*_TEST_REQUIRED`` is malformed (a usage error: exit 2)."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}
_LEGACY = (("NVTE_GDN2_TEST_REQUIRED", ("cudnn", "gdn2")), ("NVTE_GDN_TEST_REQUIRED", ("cudnn", "gdn")))
_BACKEND_RE = re.compile(r"^[A-Za-z_][\w.-]*(:[A-Za-z_]\w*)?$")


def required_spec(
    environ: Mapping[str, str] | None = None, known_ops: Collection[str] = OPS
) -> dict[tuple[str, str], str]:
    """Required pairs, each with what required it (``{("cudnn", "gdn2"): "NVTE_GDN2_TEST_REQUIRED=1"}``).

    ``DELTACHECK_REQUIRE`` is a comma list of ``backend:op``; the op is after the *last* colon so a
    third-party ``pkg.mod:attr:gdn`` works. Every malformed entry is reported in one RequireSpecError.
    """
    environ = os.environ if environ is None else environ
    pairs: dict[tuple[str, str], str] = {}
    errors: list[str] = []
    for var, pair in _LEGACY:
        raw = environ.get(var, "")
        val = raw.strip().lower()
        if val in _TRUE:
            pairs.setdefault(pair, f"{var}={raw}")
        elif val not in _FALSE:
            errors.append(f"{var}={raw!r} is neither 1 nor 0; set {var}=1 to require {pair[0]}:{pair[1]}, or unset it")
    raw = environ.get("DELTACHECK_REQUIRE", "")
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            continue
        backend, sep, op = entry.rpartition(":")
        if not sep or not backend:
            errors.append(
                f"DELTACHECK_REQUIRE entry {entry!r} is not backend:op (e.g. cudnn:gdn2, fla:kda); "
                f"ops: {', '.join(known_ops)}"
            )
        elif op not in known_ops:
            errors.append(
                f"DELTACHECK_REQUIRE entry {entry!r}: unknown op {op!r}; known ops: {', '.join(known_ops)}"
            )
        elif not _BACKEND_RE.match(backend):
            errors.append(
                f"DELTACHECK_REQUIRE entry {entry!r}: {backend!r} is not a backend name or pkg.mod:attr"
            )
        elif ":" not in backend and backend not in registered():
            errors.append(
                f"DELTACHECK_REQUIRE entry {entry!r}: unknown backend {backend!r}; registered: "
                f"{', '.join(registered())}, or a third-party pkg.mod:attr"
            )
        else:
            pairs.setdefault((backend, op), f"DELTACHECK_REQUIRE={raw}")
    if errors:
        raise RequireSpecError([f"required-mode configuration error: {e}" for e in errors])
    return pairs


def required_pairs(
    environ: Mapping[str, str] | None = None, known_ops: Collection[str] = OPS
) -> set[tuple[str, str]]:
    return set(required_spec(environ, known_ops))


def _declines(value: Any) -> tuple[int, str]:
    """``declined[pair]`` may be a count, ``(count, first_reason)``, one reason, or the reasons in order."""
    if value is None:
        return 0, ""
    if isinstance(value, bool):
        return int(value), ""
    if isinstance(value, int):
        return value, ""
    if isinstance(value, str):
        return 1, value
    seq = list(value)
    if len(seq) == 2 and isinstance(seq[0], int) and not isinstance(seq[0], bool):
        return seq[0], str(seq[1] or "")
    return len(seq), (str(seq[0]) if seq else "")


def strip_pair(reason: str, name: str) -> str:
    """``cudnn:gdn2 needs SM100…`` -> ``needs SM100…``: the failure line already names the pair."""
    for prefix in (f"{name} cannot run: ", f"{name}: ", f"{name} "):
        if reason.startswith(prefix):
            return reason[len(prefix):]
    return reason


def required_failures(
    required: Collection[tuple[str, str]] | Mapping[tuple[str, str], str],
    gate_verdicts: Mapping[tuple[str, str], Verdict],
    executed: Mapping[tuple[str, str], int],
    declined: Mapping[tuple[str, str], Any] | None = None,
    *,
    backward_selected: Collection[tuple[str, str]] | None = None,
    backward_runs: Mapping[tuple[str, str], tuple[int, int, str]] | None = None,
    declined_inside: Mapping[tuple[str, str], tuple[int, str, str]] | None = None,
) -> list[str]:
    """One line per required pair that cannot be qualified (empty list: required mode holds).

    - ``gate_verdicts``: the pair's gate verdict (``check_pair`` / the adapter's); a missing entry
      means the pair was never part of this run.
    - ``executed``: cases of the pair that actually ran (any check); ``declined``: per pair, the
      cases its ``check()`` declined: a count, ``(count, first_reason)`` (what the runner and the
      pytest plugin pass), or the list of reasons.
    - ``backward_selected``: pairs whose selected cases include backward; None (unknown) means all
      required pairs, so a pair-level backward refusal is never silently passed over.
    - ``backward_runs``: per pair, ``(backward cases that ran forward, of them with gradients judged,
      first backward-decline reason)``; a required pair whose backward cases all had their backward
      declined case by case fails too (the pair-level verdict cannot see per-case declines).
    - ``declined_inside``: per pair, ``(cases the library declined inside the envelope its adapter declares,
      the first such case, its reason)``: a required pair that refuses what it is documented to serve fails.
      Declines outside the envelope are skips with their reasons.
    - ``required`` may be the ``required_spec`` mapping, so each line also says what required it.
    """
    declined = declined or {}
    sources = required if isinstance(required, Mapping) else {}
    failures: list[str] = []
    for pair in sorted(required):
        name = f"{pair[0]}:{pair[1]}"
        src = f" [required by {sources[pair]}]" if sources.get(pair) else ""
        verdict = gate_verdicts.get(pair)
        n_exec = int(executed.get(pair, 0) or 0)
        n_decl, first = _declines(declined.get(pair))
        if verdict is not None and not verdict.runnable:
            failures.append(f"REQUIRED {name} cannot run: {strip_pair(verdict.reason, name)}{src}")
            continue
        if verdict is None and n_exec == 0 and n_decl == 0:
            failures.append(
                f"REQUIRED {name} was not part of this run (no availability verdict, zero cases); "
                f"select it with --backend {pair[0]} --op {pair[1]} (under pytest: --dc-backend {pair[0]}){src}"
            )
            continue
        if n_exec == 0:
            if n_decl:
                why = f"; first reason: {first}" if first else ""
                failures.append(
                    f"REQUIRED {name} executed zero cases: all {n_decl} selected case(s) were declined by the "
                    f"backend{why}; fix that cause or select cases it serves{src}"
                )
            else:
                failures.append(
                    f"REQUIRED {name} executed zero cases: none was declined — the selection (-k / --op / --tier) "
                    f"filtered every {name} case away; widen -k or add --op {pair[1]}{src}"
                )
            continue
        wants_bwd = backward_selected is None or pair in backward_selected
        if verdict is not None and not verdict.backward and wants_bwd:
            failures.append(f"REQUIRED {name} cannot run its backward: {strip_pair(verdict.backward_reason, name)}{src}")
            continue
        n_bwd, n_bwd_ran, bwd_why = (backward_runs or {}).get(pair, (0, 0, ""))
        if n_bwd and not n_bwd_ran:
            why = f"; first reason: {bwd_why}" if bwd_why else ""
            failures.append(
                f"REQUIRED {name} ran no backward: all {n_bwd} backward case(s) had their gradients declined{why}; "
                f"fix that cause or select backward cases it serves{src}"
            )
        n_inside, first_case, inside_why = (declined_inside or {}).get(pair, (0, "", ""))
        if n_inside:
            failures.append(
                f"REQUIRED {name} declined {n_inside} case(s) inside the envelope its adapter declares (it refused "
                f"what it is documented to serve); first: {first_case}: {inside_why}{src}"
            )
    return failures


def format_required_report(failures: Sequence[str]) -> str:
    """The text the CLI and the pytest plugin both print; empty when there is nothing to report."""
    if not failures:
        return ""
    head = f"deltacheck REQUIRED MODE FAILED: {len(failures)} required pair(s) cannot be qualified"
    bar = "=" * len(head)
    return "\n".join([bar, head, *(f"  * {f}" for f in failures), bar])
