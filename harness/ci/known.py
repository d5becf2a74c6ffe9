"""Known issues, as data: checks a kernel is known (and reported) to fail, so a CI lane that tracks a real defect
stays green — and goes red the day the defect is fixed, so the entry is noticed and removed.

A table ships with the project (``harness/ci/known_issues.toml``); users add files with
``DELTACHECK_KNOWN_ISSUES=FILE[:FILE...]`` (read by ``run``, ``verify`` and the pytest plugin) and
``deltacheck run --known-issues FILE``. TOML, one ``[[issue]]`` table per entry:

    [[issue]]
    id = "cudnn-kda-hopper-nan-steep-decay"       # unique
    backend = "cudnn"                              # a registered name, a Backend's name, or pkg.mod:attr
    op = "kda"                                     # one of cases.support.OPS
    versions = { nvidia-cudnn-frontend = ">=1.30,<1.33" }   # optional: PEP 440 specifiers per package
    sm = [90]                                      # optional (an extension): GPU architectures it is seen on
    where = "extreme"                              # a -k expression over case ids
    checks = ["forward", "state"]                  # optional: only these checks (default: every check of
                                                   # `deltacheck run`, CHECK_NAMES, as harness.task.checks_for
                                                   # gives them); a serving check (SERVING_CHECK_NAMES) only
                                                   # where named
    error_contains = "invalid sequence lengths"   # optional: match checks that ERRORED with this in their
                                                   # message (the library raised), instead of failing checks
    reason = "all-NaN output under steep decay, no decline"
    evidence = "deltacheck run --case '...' --backend cudnn (H200, FE 1.32.0)"

A failing check an entry matches becomes ``known`` (an xfail): not a failure, listed apart, counted on its own.
With ``error_contains`` the entry matches errored checks instead (a library that refuses a valid input): only
those whose message contains that text; a failing check, or an error with another message, stays what it is.
Values are validated, not only keys: an unknown op, check name or backend is refused (``KnownIssuesError`` naming
the entry and the valid values), since such an entry could never match and strict mode could never flag it. The
backend is checked where the run's backends are known (``load_known_issues(..., backends=...)``): a registered
name, the ``name`` of a backend of the run, or a ``pkg.mod:attr`` spec (accepted as is).
The serving checks (``python -m deltacheck.harness.run.serving_run``) use the same entries, through the same
functions (``mark_known``, ``outcomes``): an entry covers a serving check only where its ``checks`` names it, so an
entry whose evidence is ``deltacheck run``'s checks says nothing about the serving checks' different calls.
Strict, like pytest's ``xfail_strict``: a case an entry matches whose in-scope checks all pass fails the run
with "known issue no longer reproduces". docs/required-mode.md and docs/run-directory.md describe the rest.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from deltacheck.cases.kexpr import KExprError, compile_k
from deltacheck.cases.support import OPS

from ..machine.environment import DIST_KEYS, version_in

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ENV_VAR = "DELTACHECK_KNOWN_ISSUES"
SHIPPED = Path(__file__).with_name("known_issues.toml")
_KEYS = {"id", "backend", "op", "versions", "sm", "where", "checks", "error_contains", "reason", "evidence"}
_REQUIRED = ("id", "backend", "op", "where", "reason", "evidence")


# Every check name a task can owe (harness.task.checks_for; grad_<input> for each input grad_inputs can list).
CHECK_NAMES = ("forward", "state", "continuation_ref", "continuation_self", "determinism",
               *(f"grad_{n}" for n in ("q", "k", "v", "g", "beta", "w", "initial_state", "a_log", "dt_bias")))
# The serving checks' names (judge.serving_checks.SERVING_CHECKS, judge.invariance_checks.INVARIANCE_CHECKS), which
# speak "passed" / "failed" where a task's checks say "pass" / "fail".
SERVING_CHECK_NAMES = ("pool_integrity", "decode_chain", "speculative", "checkpoints", "causality", "graph_replay",
                       "batch_invariance")
_FAILED, _PASSED = ("fail", "failed"), ("pass", "passed")


class KnownIssuesError(ValueError):
    """A known-issues file that cannot be used; the message names the file, the entry and the key."""


@dataclass(frozen=True)
class KnownIssue:
    id: str
    backend: str
    op: str
    where: str
    reason: str
    evidence: str
    versions: Mapping[str, str] = field(default_factory=dict)
    sm: tuple[int, ...] = ()
    checks: tuple[str, ...] = ()
    error_contains: str = ""
    source: str = ""

    def applies_to(self, case, spec: str, backend_name: str, env) -> bool:
        """Whether this entry speaks about ``case`` run against backend ``spec`` on ``env`` (every check)."""
        if self.backend not in (spec, backend_name) or self.op != case.op:
            return False
        if self.sm and (env is None or env.sm not in self.sm):
            return False
        for package, spec_text in self.versions.items():
            key = _version_key(package)
            if env is None or not version_in(env.versions.get(key), spec_text):
                return False
        return compile_k(self.where)(case.id)

    def covers(self, check: str) -> bool:
        return check in self.checks if self.checks else check not in SERVING_CHECK_NAMES

    def explains(self, result) -> bool:
        """Whether this entry turns ``result`` (of a case it applies to) into ``known``: a failing check it covers,
        or, for an ``error_contains`` entry, instead an errored check it covers whose message holds that text."""
        if not self.covers(result.check):
            return False
        if self.error_contains:
            return result.status == "error" and self.error_contains in (result.reason or "")
        return result.status in _FAILED


def _version_key(package: str) -> str:
    """``nvidia-cudnn-frontend`` -> ``cudnn_frontend`` (the Env.versions key); a key itself passes through."""
    for key, dists in DIST_KEYS.items():
        if package == key or package in dists:
            return key
    return package


def _entry(raw: Mapping, where: str, seen: dict[str, str]) -> KnownIssue:
    unknown = set(raw) - _KEYS
    if unknown:
        raise KnownIssuesError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; keys are {', '.join(sorted(_KEYS))}")
    missing = [k for k in _REQUIRED if not isinstance(raw.get(k), str) or not raw.get(k).strip()]
    if missing:
        raise KnownIssuesError(f"{where}: missing or empty {', '.join(missing)} (each a non-empty string)")
    ident = raw["id"]
    if ident in seen:
        raise KnownIssuesError(f"{where}: id {ident!r} is already used by {seen[ident]}")
    seen[ident] = where
    try:
        compile_k(raw["where"])
    except KExprError as exc:
        raise KnownIssuesError(f"{where}: where: {exc}") from None
    versions = raw.get("versions", {})
    if not isinstance(versions, Mapping):
        raise KnownIssuesError(f"{where}: versions must be a table of package = \"specifiers\"")
    for package, spec in versions.items():
        try:
            SpecifierSet(spec)
        except (InvalidSpecifier, TypeError):
            raise KnownIssuesError(f"{where}: versions.{package} = {spec!r} is not a PEP 440 specifier set") from None
    checks = raw.get("checks", [])
    sm = raw.get("sm", [])
    if not isinstance(checks, list) or not all(isinstance(c, str) for c in checks):
        raise KnownIssuesError(f"{where}: checks must be a list of check names")
    if not isinstance(sm, list) or not all(isinstance(x, int) for x in sm):
        raise KnownIssuesError(f"{where}: sm must be a list of compute capabilities like [90]")
    error_contains = raw.get("error_contains", "")
    if "error_contains" in raw and (not isinstance(error_contains, str) or not error_contains.strip()):
        raise KnownIssuesError(f"{where}: error_contains must be a non-empty string (text of the error message)")
    if raw["op"] not in OPS:
        raise KnownIssuesError(f"{where}: op = {raw['op']!r} is not an op; ops are {', '.join(OPS)}")
    bad = [c for c in checks if c not in CHECK_NAMES + SERVING_CHECK_NAMES]
    if bad:
        raise KnownIssuesError(f"{where}: checks: {', '.join(map(repr, bad))} not a check name; checks are "
                               f"{', '.join(CHECK_NAMES + SERVING_CHECK_NAMES)}")
    return KnownIssue(ident, raw["backend"], raw["op"], raw["where"], raw["reason"], raw["evidence"],
                      dict(versions), tuple(sm), tuple(checks), error_contains, source=where)


def load_known_issues(paths: Iterable[str | os.PathLike], backends: Iterable[str] | None = None) -> list[KnownIssue]:
    """Every entry of every file, in order; a file that cannot be used raises ``KnownIssuesError``.

    ``backends``: the specs and names of the run's backends, where the caller knows them (``run`` and the pytest
    plugin, before the first task): an entry's backend must then be a registered name, one of these, or a
    ``pkg.mod:attr`` spec. Without it (a worker, after the upfront check) the backend is not checked."""
    entries: list[KnownIssue] = []
    seen: dict[str, str] = {}
    for path in paths:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise KnownIssuesError(f"known issues file {path}: cannot read it ({exc.strerror or exc})") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise KnownIssuesError(f"known issues file {path}: not valid TOML ({exc})") from None
        issues = data.get("issue", [])
        if set(data) - {"issue"} or not isinstance(issues, list):
            raise KnownIssuesError(f"known issues file {path}: expected only [[issue]] tables")
        for n, raw in enumerate(issues, 1):
            entries.append(_entry(raw, f"{path} issue #{n}", seen))
    if backends is not None:
        _check_backends(entries, set(backends))
    return entries


def _check_backends(entries: list[KnownIssue], names: set[str]) -> None:
    from ..backends.base import registered

    valid = set(registered()) | names
    for issue in entries:
        if ":" not in issue.backend and issue.backend not in valid:
            raise KnownIssuesError(f"{issue.source}: backend = {issue.backend!r} is not a backend; backends are "
                                   f"{', '.join(sorted(valid))}, or a pkg.mod:attr spec")


def run_backend_names(specs: Iterable[str]) -> list[str]:
    """The specs and, for each that loads, its backend's ``name`` (what an entry's ``backend`` may say); a spec
    that cannot be loaded stays a result of the run, not an error here."""
    from ..machine.availability import load_backend

    names = []
    for spec in specs:
        names.append(spec)
        backend, _ = load_backend(spec) if ":" in spec else (None, None)
        if backend is not None and isinstance(getattr(backend, "name", None), str):
            names.append(backend.name)
    return names


def known_issue_paths(extra: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> list[str]:
    """The shipped table, then ``DELTACHECK_KNOWN_ISSUES`` files, then ``--known-issues`` files."""
    environ = os.environ if environ is None else environ
    from_env = [p for p in environ.get(ENV_VAR, "").split(os.pathsep) if p]
    return [str(SHIPPED), *from_env, *extra]


def applicable(issues: list[KnownIssue], case, spec: str, backend_name: str, env) -> list[KnownIssue]:
    """The entries that speak about this case x backend on this machine."""
    return [issue for issue in issues if issue.applies_to(case, spec, backend_name, env)]


def mark_known(result, entries: list[KnownIssue]) -> None:
    """A failing check an entry covers (an errored one, for an ``error_contains`` entry whose text its message
    holds) becomes ``known`` (in place), its reason naming the entry."""
    if result.status not in (*_FAILED, "error"):
        return
    issue = next((i for i in entries if i.explains(result)), None)
    if issue is not None:
        result.status, result.reason = "known", f"known issue {issue.id}: {issue.reason} — {result.reason}"
        result.metrics["known_issue"] = issue.id


def outcomes(results, entries: list[KnownIssue]) -> dict[str, str]:
    """Per entry that applies to the case: ``reproduced`` (a check failed as known), ``gone`` (every in-scope
    check passed: the strict failure), or ``not judged`` (declined, errored, or no in-scope check)."""
    out = {}
    for issue in entries:
        scoped = [r for r in results if issue.covers(r.check)]
        if any(r.metrics.get("known_issue") == issue.id for r in scoped):
            out[issue.id] = "reproduced"
        elif scoped and {r.status for r in scoped} <= set(_PASSED):
            out[issue.id] = "gone"
        else:
            out[issue.id] = "not judged"
    return out


def no_longer_reproduces(issue_id: str, case_id: str, spec: str, source: str = "") -> str:
    where = f" (entry in {source})" if source else ""
    return (f"known issue no longer reproduces: {issue_id} matches {case_id} against {spec}, whose checks all "
            f"pass now; remove the entry or narrow its 'where'{where}")


def format_known_report(lines: list[str]) -> str:
    """The text ``deltacheck run`` and the pytest plugin print for entries that no longer reproduce."""
    if not lines:
        return ""
    head = f"deltacheck KNOWN ISSUES NO LONGER REPRODUCE: {len(lines)} case(s) an entry covers now pass (strict)"
    bar = "=" * len(head)
    return "\n".join([bar, head, *(f"  * {line}" for line in lines), bar])
