"""The Backend protocol, Verdicts, and the registry.

A backend is anything with ``name``, ``ops``, ``check(case, env) -> Verdict`` and
``run(case, inputs) -> (out, final_state)``. The adapter owns every conversion (layouts, state
orientation, dtypes); the harness owns every comparison. ``final_state`` is key-major ``[N, HO, K, V]``
in float32 or wider (fused adapters widen a bf16/fp16 state to fp32; the reference backends return their
compute dtype); ``out`` is in the case's own layout, in whatever dtype the kernel produced.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Verdict:
    """Whether a backend can serve a case, and why not.

    ``backward`` says whether the backward pass can run too (only consulted for backward cases);
    ``notes`` records what the adapter changed on the way in (e.g. "beta cast fp32 -> bf16, as the op
    demands"), so a report never hides a conversion.
    """

    runnable: bool
    reason: str = ""
    backward: bool = True
    backward_reason: str = ""
    notes: tuple[str, ...] = ()

    @classmethod
    def ok(cls, *notes: str, backward: bool = True, backward_reason: str = "") -> Verdict:
        return cls(True, "", backward, backward_reason, tuple(notes))

    @classmethod
    def no(cls, reason: str) -> Verdict:
        if not reason:
            raise ValueError("Verdict.no needs a reason: a decline without one is a silent skip")
        return cls(False, reason, False, reason)


class RunDeclined(RuntimeError):
    """The library declined the case at the call itself (a refusal the backend's ``check`` probe could not see, e.g.
    a configuration the probe's smaller call does not reach): raised from ``run``/``serve`` with the library's reason
    and the fix; the checks record a decline with that reason (``skip`` in ``deltacheck run``, ``declined`` in the
    serving checks), never an error and never a result of another engine."""


class LibraryContractError(RuntimeError):
    """The library broke its own documented contract in a way the adapter can see (a missing return value, a
    wrong shape): raised from ``run``, recorded against the kernel as an error result, never a decline."""


@runtime_checkable
class Backend(Protocol):
    name: str
    ops: frozenset[str]

    def check(self, case: Any, env: Any) -> Verdict: ...

    def run(self, case: Any, inputs: dict) -> tuple[Any, Any]: ...


class BackendHooks(Protocol):
    """The optional hooks the harness looks for on a backend (``getattr``; each may be absent). Declared here so
    a plug-in author sees every one in one place; docs/backends.md has a worked example of each.

    - ``pair_verdict(op, env) -> Verdict``: our floors for ``op`` from the ``Env`` alone (no library import):
      a package below its floor, the wrong GPU architecture, no CUDA. Asked before any case.
    - ``load(op) -> Verdict``: import the library and find the op's entry point (``deltacheck env --import``).
    - ``version_key: str``: the ``Env.versions`` key of the distribution, for the built-ins the probe knows; a
      key the probe does not know is ignored (``load`` still runs).
    - ``version() -> str | None``: the backend's own version, written into the run header (``backend_versions``)
      so ``compare`` says when it changed and reports tell two versions apart.
    - ``envelopes(op, *, env=None, sm=None) -> Iterable[Envelope]``: what the backend declares it serves
      (docs/envelopes.md): generated tiers add cases inside it, ``list --backend`` narrows to it, and a decline
      inside it (or a run outside it) is noted on the result.
    - The serving hook (issue 26; ``serving.py`` has the data, docs/serving.md the checks): ``null_slot`` (a
      ``reference.serving.NullSlot`` or None), ``serving_verdict(case, mode, env) -> Verdict`` per mode of
      ``serving.SERVING_MODES`` and ``serve(case, inputs, call: ServingCall) -> ServingOutput``; for the invariance
      checks ``capture_graph(case, static_inputs) -> replay``, ``graph_verdict(case, env) -> Verdict`` and
      ``causal_rule(case) -> "bitwise" | "chunked"``.
    """

    def pair_verdict(self, op: str, env: Any) -> Verdict: ...

    def load(self, op: str) -> Verdict: ...

    version_key: str

    def version(self) -> str | None: ...

    def envelopes(self, op: str, *, env: Any = None, sm: int | None = None) -> Any: ...

    null_slot: Any

    def serving_verdict(self, case: Any, mode: str, env: Any) -> Verdict: ...

    def serve(self, case: Any, inputs: dict, call: Any) -> Any: ...

    def capture_graph(self, case: Any, static_inputs: dict) -> Callable[[], tuple[Any, Any]]: ...

    def graph_verdict(self, case: Any, env: Any) -> Verdict: ...

    def causal_rule(self, case: Any) -> str: ...


_REGISTRY: dict[str, Callable[[], Backend]] = {}


def register(name: str) -> Callable:
    """Decorator: ``@register("fla")`` on a zero-argument factory (or class)."""

    def deco(factory):
        _REGISTRY[name] = factory
        _INSTANCES.pop(name, None)  # a name registered again is a new backend
        return factory

    return deco


@dataclass
class BackendLoadError(Exception):
    spec: str
    reason: str
    hints: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"backend {self.spec!r}: {self.reason}"


def unknown_backends_message(names: list[str], flag: str = "--backend") -> str:
    """The usage error for backend names that are neither registered nor ``pkg.mod:attr``."""
    listed = ", ".join(repr(n) for n in names)
    return (f"{flag} {listed}: unknown backend{'s' if len(names) > 1 else ''}; registered: "
            f"{', '.join(registered())}, or a third-party pkg.mod:attr")


def registered() -> list[str]:
    _import_builtin()
    return sorted(_REGISTRY)


def get_backend(spec: str) -> Backend:
    """A registered name (``fla``, ``cudnn``, ``oracle``…) or a third-party ``pkg.mod:attr``.

    ``attr`` may be a Backend instance, a class, or a zero-argument factory. Importing the adapter
    modules must never import the fused libraries themselves: that happens in ``check``.
    """
    _import_builtin()
    if ":" in spec:
        mod_name, _, attr = spec.partition(":")
        try:
            mod = importlib.import_module(mod_name)
        except Exception as exc:  # noqa: BLE001 - any import failure is reported, not raised raw
            raise BackendLoadError(spec, f"cannot import module {mod_name!r}: {type(exc).__name__}: {exc}") from exc
        try:
            obj = getattr(mod, attr)
        except AttributeError as exc:
            raise BackendLoadError(spec, f"module {mod_name!r} has no attribute {attr!r}") from exc
        # A class (which itself looks like the protocol) or a factory gets called; an instance is used as is.
        called = isinstance(obj, type) or (callable(obj) and not isinstance(obj, Backend))
        backend = _construct(spec, attr, obj) if called else obj
    elif spec in _REGISTRY:
        backend = _construct(spec, spec, _REGISTRY[spec])
    else:
        raise BackendLoadError(spec, f"unknown backend; registered: {', '.join(sorted(_REGISTRY))}, or pkg.mod:attr")
    if not isinstance(backend, Backend):
        raise BackendLoadError(spec, "object lacks the Backend protocol (name, ops, check, run)")
    return backend


_INSTANCES: dict[str, Backend | BackendLoadError] = {}


def backend_for(spec: str) -> Backend:
    """The one backend object for ``spec`` in this process (``get_backend`` once, then the same object, or the same
    ``BackendLoadError``): an adapter's own caches (cuDNN's planner probes, FLA's imports) then serve every task of
    the run, and a backend's constructor runs once per worker, not once per task."""
    if spec not in _INSTANCES:
        try:
            _INSTANCES[spec] = get_backend(spec)
        except BackendLoadError as exc:
            _INSTANCES[spec] = exc
    got = _INSTANCES[spec]
    if isinstance(got, BackendLoadError):
        raise got
    return got


def forget_backends() -> None:
    """Drop the per-process backend objects (tests that re-register a name; a worker is never asked to)."""
    _INSTANCES.clear()


def _construct(spec: str, what: str, factory: Callable[[], Any]) -> Any:
    """``factory()``; what it raises (a driver probe, a missing library) makes the backend one that cannot
    be loaded here, reported as an import failure is: a verdict, never a traceback."""
    try:
        return factory()
    except Exception as exc:  # noqa: BLE001 - a third party's constructor may raise anything
        raise BackendLoadError(spec, f"constructing {what} raised {type(exc).__name__}: {exc}") from exc


def _import_builtin() -> None:
    # The built-in adapters (backends/table.py) register themselves on import; none imports a fused library at
    # module level. An optional package missing from a trimmed install is skipped; any other import error is a bug.
    from .table import BUILTINS

    for entry in BUILTINS:
        try:
            importlib.import_module(f"{__package__}.{entry.package}")
        except ModuleNotFoundError as exc:
            if not entry.optional or exc.name != f"{__package__}.{entry.package}":
                raise
