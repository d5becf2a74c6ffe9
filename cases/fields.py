"""The values each Case field may take, and the error that names a bad one (used by the Case's validation and by
the id grammar alike)."""

from __future__ import annotations

import re

IO_DTYPES = ("bf16", "fp16")
STATE_DTYPES = ("fp32", "bf16")
LAYOUTS = ("thd", "bshd", "sbhd", "bhsd")
DENSE_LAYOUTS = ("bshd", "sbhd", "bhsd")
GATE_PROFILES = ("mild", "typical", "steep", "extreme", "zero", "long", "trained")
# A parametrized profile for stability searches: log-decays drawn from U(-x, -0.1), written "unif<x>" (x >= 0.1).
UNIFORM_GATE = re.compile(r"unif(\d+(?:\.\d+)?)")


def gate_floor(gate: str) -> float | None:
    """The lower end -x of a ``unif<x>`` gate profile, or None for a named profile."""
    match = UNIFORM_GATE.fullmatch(gate)
    return -float(match.group(1)) if match else None


BETA_PROFILES = ("uniform", "zero", "one", "near2")
GATE_DOMAINS = ("log", "linear")
TIERS = ("L0", "L1", "L2")


class CaseError(ValueError):
    """A Case (or an id) is invalid; the message names the field and what was expected."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(f"{field_name}: {message}")


def field_error(field_name: str, message: str) -> CaseError:
    return CaseError(field_name, message)
