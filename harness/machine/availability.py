"""Availability: whether a backend x op pair, and then a case, can run here — and why not.

Verdicts come from three places, always in this order (docs/backends.md):

1. our floors and facts, from the ``Env`` alone (an adapter's optional ``pair_verdict(op, env)``; the fused
   adapters keep theirs in ``harness/backends/<name>/facts.py``; no library is imported);
2. the library itself (the adapter's ``check(case, env)``: import, entry point, the library's own planner);
3. per case, every decline and every refused backward carries a reason: a silent one would be a silent skip.

``merge_verdicts`` joins verdicts (all must hold); ``gathered`` turns a list of unmet requirements into one
verdict that names each, Lightning-``RunIf`` style.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict

from deltacheck.cases.envelope import EnvelopeUnion
from deltacheck.cases.support import OPS

from ..backends.base import Backend, BackendLoadError, Verdict, backend_for
from .environment import version_below


def merge_verdicts(*verdicts: Verdict) -> Verdict:
    """All must hold: reasons, backward reasons and notes are concatenated (duplicates dropped)."""

    def join(parts: Iterable[str]) -> str:
        return " | ".join(dict.fromkeys(p for p in parts if p))

    runnable = all(v.runnable for v in verdicts)
    reason = join(v.reason for v in verdicts if not v.runnable)
    backward = all(v.backward for v in verdicts)
    backward_reason = join(v.backward_reason for v in verdicts if not v.backward)
    notes = tuple(dict.fromkeys(n for v in verdicts for n in v.notes))
    return Verdict(runnable, reason, backward, backward_reason, notes)


def gathered(pair: str, unmet: list[str], notes: list[str], *, backward_reason: str = "") -> Verdict:
    """Every unmet requirement of ``pair`` in one verdict: ``cudnn:gdn2 cannot run: (1) … (2) …``."""
    if unmet:
        if len(unmet) == 1:
            item = unmet[0]
            reason = f"{pair} {item}" if item.startswith("needs ") else f"{pair}: {item}"
        else:
            reason = f"{pair} cannot run: " + " ".join(f"({i}) {u}" for i, u in enumerate(unmet, 1))
        return Verdict(False, reason, False, reason, tuple(notes))
    if backward_reason:
        return Verdict.ok(*notes, backward=False, backward_reason=backward_reason)
    return Verdict.ok(*notes)


def no_cuda_reason(env) -> str:
    extra = f" ({env.probe_errors['cuda']})" if env.probe_errors.get("cuda") else ""
    return f"needs a CUDA GPU — torch.cuda.is_available() is False{extra}; run on a GPU runner"


def package_floor(version: str | None, dist: str, floor: str, why: str, install: str,
                  unmet: list[str], notes: list[str]) -> None:
    """A package's floor, as every adapter's ``pair_verdict`` states it: not installed or below ``floor`` (``why``)
    goes to ``unmet``; an unreadable version to ``notes`` (the floor unchecked, the pair not refused for it)."""
    below = None if version is None else version_below(version, floor)
    if version is None:
        unmet.append(f"{dist} is not installed; {install}")
    elif below is None:
        notes.append(f"{dist} version {version!r} is unreadable; the {floor} floor was not checked")
    elif below:
        unmet.append(f"{dist} {version} < {floor} ({why}); {install}")


def floors_then_library(floors: Verdict, library: Callable[[], Verdict]) -> Verdict:
    """What a fused adapter's ``check`` returns: our floors first (no library import); only if they hold,
    ``library()`` — what the library itself says about the case — merged in."""
    return merge_verdicts(floors, library()) if floors.runnable else floors


def floors_of(backend, op: str, env) -> Verdict:
    """The backend's own floors for ``op`` (its optional ``pair_verdict`` hook), or ok when it has none."""
    if op not in OPS:
        return Verdict.no(f"{backend.name}:{op}: unknown op {op!r}; deltacheck's ops are {', '.join(OPS)}")
    hook = getattr(backend, "pair_verdict", None)
    return hook(op, env) if callable(hook) else Verdict.ok()


def floors_by_name(spec: str, op: str, env) -> Verdict:
    """Our floors for ``spec:op`` on ``env``, by backend spec (a backend's own hook is ``pair_verdict(op, env)``); a backend that cannot be loaded (a third
    party's ``pkg.mod:attr`` not importable here) is its own judge later, so this says ok."""
    if op not in OPS:
        return Verdict.no(f"{spec}:{op}: unknown op {op!r}; deltacheck's ops are {', '.join(OPS)}")
    try:
        backend = backend_for(spec)
    except BackendLoadError:
        return Verdict.ok()
    return floors_of(backend, op, env)


def load_backend(spec: str) -> tuple[Backend | None, str | None]:
    """(backend, None), or (None, why it cannot be loaded) — a backend that fails to load is a verdict."""
    try:
        return backend_for(spec), None
    except BackendLoadError as exc:
        return None, str(exc)


def backend_versions(specs: list[str]) -> dict[str, str | None]:
    """Each backend's own word on its version (the optional ``version()`` hook), for the run header: what lets
    ``compare`` and ``merge`` tell two versions of a plug-in apart. None where the backend has no hook, cannot
    load, or its hook fails (a version is a record, never a reason to stop a run)."""
    out: dict[str, str | None] = {}
    for spec in specs:
        backend, _ = load_backend(spec)
        hook = getattr(backend, "version", None) if backend is not None else None
        try:
            value = hook() if callable(hook) else None
        except Exception:  # noqa: BLE001 - see above
            value = None
        out[spec] = None if value is None else str(value)
    return out


def pair_availability(backend, spec: str, op: str, env) -> Verdict:
    """The backend x op verdict before any case: it must implement the op, then its own floors."""
    if op not in backend.ops:
        return Verdict.no(f"{spec} does not implement {op}")
    return floors_of(backend, op, env)


def library_verdict(backend, spec: str, op: str, env) -> Verdict:
    """Our floors and then, unless the package is not installed at all (an import would only repeat that), the
    adapter's ``load(op)``: importing the library and finding the op's entry point. Every unmet requirement
    ends up in one verdict (what ``deltacheck env --import`` shows)."""
    floors = pair_availability(backend, spec, op, env)
    load = getattr(backend, "load", None)
    key = getattr(backend, "version_key", None)
    # Skip the import only when the probe looked for the package and found it absent: a third party's key the Env
    # never probes says nothing, and its ``load`` must run.
    if not callable(load) or (key is not None and key in env.versions and env.versions[key] is None):
        return floors
    return merge_verdicts(floors, load(op))


def case_verdict(backend, spec: str, case, env) -> Verdict:
    """The backend's verdict on one case (what ``check`` raises propagates), with every decline and every
    refused backward carrying a reason: a silent one would become a silent skip."""
    if case.op not in backend.ops:
        return Verdict.no(f"{spec} does not implement {case.op}")
    verdict = backend.check(case, env)
    if not verdict.runnable and not verdict.reason:
        return Verdict.no(f"{spec}.check() declined without giving a reason")
    if verdict.runnable and not verdict.backward and not verdict.backward_reason:
        return Verdict(True, "", False, f"{spec}.check() refused the backward without giving a reason",
                       verdict.notes)
    return verdict


def availability_records(backend_specs: list[str], env, required) -> dict[tuple[str, str], tuple[Verdict, dict]]:
    """Each backend x op pair's verdict and the record that reports it (``kind: "gate"`` in results.jsonl,
    the name schema 1 gave it; docs/run-directory.md)."""
    records: dict[tuple[str, str], tuple[Verdict, dict]] = {}
    for spec in backend_specs:
        backend, load_error = load_backend(spec)
        for op in OPS:
            if backend is None:
                v = Verdict.no(load_error)
            elif op not in backend.ops and (spec, op) not in required:
                continue
            else:
                v = pair_availability(backend, spec, op, env)
            records[(spec, op)] = v, {"kind": "gate", "backend": spec, "op": op, "runnable": v.runnable,
                                      "reason": v.reason, "backward": v.backward,
                                      "backward_reason": v.backward_reason, "notes": list(v.notes),
                                      "required": (spec, op) in required}
            name = getattr(backend, "name", None)
            if isinstance(name, str) and name != spec:  # the backend's own name, shown beside the spec
                records[(spec, op)][1]["name"] = name
    return records


def backend_envelope(spec: str, op: str, *, env=None, sm: int | None = None, backend=None) -> EnvelopeUnion | None:
    """What ``spec`` declares it serves for ``op`` (its optional ``envelopes(op, env=, sm=)`` hook): on ``env``
    (this machine), or on architecture ``sm``, or anywhere. None when the backend declares no envelope."""
    if backend is None:
        backend, _ = load_backend(spec)
    hook = getattr(backend, "envelopes", None)
    if not callable(hook):
        return None
    members = tuple(hook(op, env=env, sm=sm))
    where = f" SM{env.sm}" if env is not None and env.sm else f" SM{sm}" if sm is not None else ""
    return EnvelopeUnion(f"{spec} {op}{where}", op, members)


def envelope_note(backend, spec: str, case, env, verdict: Verdict, *, pair: Verdict | None = None) -> dict:
    """The note the ``forward`` result carries: the library's verdict on ``case`` against what the backend declares
    it serves on this machine.

    Only when our floors hold (the library was asked; ``pair``: the pair's availability verdict where the run holds
    it, else asked here): ``{"envelope": name, "envelope_inside": bool, "envelope_backward_inside": bool,
    "envelope_disagreement": text}`` — the text empty when they agree. A decline inside the envelope, or a run
    outside it, is the visible note that keeps an envelope from drifting.
    """
    if pair is None:
        pair = pair_availability(backend, spec, case.op, env)
    if not pair.runnable:
        return {}
    envelope = backend_envelope(spec, case.op, env=env, backend=backend)
    if envelope is None:
        return {}
    forward, backward = envelope.serves(case)
    disagreement = ""
    if not verdict.runnable and forward:
        disagreement = f"declined inside its declared envelope ({envelope.name}): {verdict.reason}"
    elif verdict.runnable and not forward:
        disagreement = f"ran outside its declared envelope ({envelope.why_not(case) or envelope.name})"
    elif verdict.runnable and case.backward and verdict.backward != backward:
        disagreement = (f"refused the backward inside its declared envelope ({envelope.name}): "
                        f"{verdict.backward_reason}" if backward else
                        f"ran the backward outside its declared envelope ({envelope.why_not(case)})")
    return {"envelope": envelope.name, "envelope_inside": forward, "envelope_backward_inside": backward,
            "envelope_disagreement": disagreement}


def verdicts_to_json(verdicts: dict[tuple[str, str], Verdict]) -> list:
    """Pair verdicts as a worker's config line carries them."""
    return [[spec, op, asdict(v)] for (spec, op), v in verdicts.items()]


def verdicts_from_json(data) -> dict[tuple[str, str], Verdict]:
    return {(spec, op): Verdict(**{**v, "notes": tuple(v.get("notes") or ())}) for spec, op, v in data or []}
