"""What every adapter over one fused library does the same way, so each adapter states only what differs.

A fused adapter's ``check`` asks our floors first (its ``facts`` module, from the ``Env`` alone, no import), and only
when they hold the library: import it and find the op's entry point (``loading.load_entry_point``, every failure a
decline naming the fix), then what the entry point cannot express for this case (a decline with the library's
reason), then a runnable verdict carrying what the adapter converted on the way in and, for a forward-only kernel,
why there is no backward. Its envelopes are the ones its facts declare, none on a machine without CUDA and, on a
GPU, only those that cover that GPU's architecture.

A subclass states:

- ``name``, ``ops``, ``version_key`` and ``facts`` (the facts module: ``floors(backend, op, env)``);
- ``dist``, ``install``, ``not_installed``: how a decline names the library and its install line;
- ``entry_points``: op -> (module, attribute) that ``load`` looks up;
- ``version()``, and ``_import(name)`` where importing needs more than the importer (a cache directory, a double);
- ``declared_envelopes(op)``, ``unsupported(case)``, and where they apply ``conversion_notes(case)``,
  ``no_backward(case)``, ``refusal(op)``.

The cuDNN, FLA and TE adapters keep their own ``check``: each has more than one library verdict to make (cuDNN's
planner per engine, FLA's own Hopper guard, TE's module under the cuDNN op).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from deltacheck.cases.envelope import Envelope
from deltacheck.harness.machine.availability import floors_then_library

from .base import Verdict
from .loading import Library, load_entry_point


class FusedAdapter:
    name: str
    ops: frozenset[str]
    facts: ModuleType
    dist: str
    install: str
    not_installed: str
    entry_points: dict[str, tuple[str, str]]

    def __init__(self, module: Any = None, *, importer: Callable[[str], Any] | None = None):
        self._module = module  # a contract double standing in for the library (tests), or None: the real one
        self._importer = importer or importlib.import_module

    # ------------------------------------------------------------------ the library
    def _import(self, name: str):
        return self._module if self._module is not None else self._importer(name)

    def version(self) -> str | None:
        raise NotImplementedError

    # ------------------------------------------------------------------ can it run?
    def pair_verdict(self, op: str, env) -> Verdict:
        """Our floors for ``op`` from the Env alone (the facts module); no import of the library."""
        return self.facts.floors(self.name, op, env)

    def check(self, case, env) -> Verdict:
        return floors_then_library(self.pair_verdict(case.op, env), lambda: self._library_verdict(case))

    def refusal(self, op: str) -> str | None:
        """Why ``load(op)`` declines before any import (an op this backend does not serve), or None."""
        return None if op in self.ops else f"{self.name} serves {sorted(self.ops)}, not {op!r}"

    def load(self, op: str) -> Verdict:
        refused = self.refusal(op)
        if refused:
            return Verdict.no(refused)
        module_name, attr = self.entry_points[op]
        library = Library(self.dist, self.version() or "unknown version", self.install, self.not_installed)
        return load_entry_point(f"{self.name}:{op}", op, module_name, attr, library, self._import)[1]

    def _library_verdict(self, case) -> Verdict:
        loaded = self.load(case.op)
        if not loaded.runnable:
            return loaded
        reason = self.unsupported(case)
        if reason:
            return Verdict.no(reason)
        return self.accepted(case)

    def unsupported(self, case) -> str | None:
        """What the library's entry point cannot express for ``case`` (our reading of its source), or None."""
        raise NotImplementedError

    def accepted(self, case) -> Verdict:
        """The verdict on a case the library can express: runnable, with what was converted on the way in."""
        why_not = self.no_backward(case)
        return Verdict.ok(*self.conversion_notes(case), backward=not why_not, backward_reason=why_not)

    def conversion_notes(self, case) -> list[str]:
        return []

    def no_backward(self, case) -> str:
        """Why this kernel has no backward ('' when it has one)."""
        return ""

    # ------------------------------------------------------------------ what it declares
    def declared_envelopes(self, op: str) -> list[Envelope]:
        """Every envelope the facts declare for ``op``, on any architecture."""
        raise NotImplementedError

    def envelopes(self, op: str, env=None, sm: int | None = None) -> list[Envelope]:
        """On ``env``: none without CUDA, else those covering its GPU; else those covering ``sm`` (None: any)."""
        if env is not None:
            if not env.cuda:
                return []
            sm = env.sm
        return [e for e in self.declared_envelopes(op) if e.applies(sm)]
