"""When a planted mutation counts as caught: the comparison rejects the backend's result, or the library's own
input check refuses the call (the contract doubles in tests/doubles/, as a real library would, which a run
records as an error), or the adapter finds the library broke its contract (``LibraryContractError``). Any other exception — a NameError in an adapter, an assertion in a test helper — is a bug
of its own and propagates: it must never pass for a caught mutation."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path

DOUBLES = Path(__file__).resolve().parent / "doubles"


def refused_by_library(exc: BaseException) -> bool:
    """Was ``exc`` raised by a contract double's own checks (its innermost frame inside tests/doubles/)?"""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and Path(frames[-1].filename).resolve().parent == DOUBLES


def caught(agrees: Callable[[], bool]) -> bool:
    """True when the mutation is caught: ``agrees()`` says no, or the library refused the call."""
    from deltacheck.harness.backends.base import LibraryContractError

    try:
        return not agrees()
    except Exception as exc:  # noqa: BLE001 - sorted below: a library's refusal counts, nothing else does
        # a library that broke its contract where the adapter checks it: a run records an error against the kernel
        if refused_by_library(exc) or isinstance(exc, LibraryContractError):
            return True
        raise
