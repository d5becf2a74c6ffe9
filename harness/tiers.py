"""The tiers as they run: the reference-level covering array of each tier (``cases/matrix.py``) plus, per fused
backend x op x architecture, the cases that cover that backend's declared envelope — so every fused kernel gets
the cases it can run, not only the few of a reference-level array it happens to serve.

``TIER_TARGETS`` lists the (backend, architecture) pairs tiers are generated for: FLA (any GPU) and cuDNN on the
architectures our lanes run, Hopper (SM90) and Blackwell (SM100; the FROST engines serve SM100-103 and 107
alike). Engines that need a runtime beyond the architecture (cuTile) are not generated for: their cases come from
the overlap with the others.
"""

from __future__ import annotations

import functools

from deltacheck.cases import Case, CaseError
from deltacheck.cases.envelope import EnvelopeUnion
from deltacheck.cases.kexpr import compile_k
from deltacheck.cases.matrix import tier_cases as generated_tier
from deltacheck.cases.support import OP_SUPPORT, OPS

from .availability import backend_envelope

TIER_TARGETS: tuple[tuple[str, int | None], ...] = (("cudnn", 90), ("cudnn", 100), ("fla", None))


def target_envelopes() -> list[EnvelopeUnion]:
    """The envelopes tiers are generated for, in a fixed order."""
    out = []
    for spec, sm in TIER_TARGETS:
        for op in OPS:
            envelope = backend_envelope(spec, op, sm=sm)
            if envelope is not None and envelope.members:
                out.append(envelope)
    return out


@functools.cache
def _tier(tier: str) -> tuple[Case, ...]:
    return tuple(generated_tier(tier, target_envelopes()))


def tier_cases(tier: str) -> list[Case]:
    """Every case of ``tier`` (the same list in every process)."""
    return list(_tier(tier))


def select(tier: str = "L0", op: str | None = None, k: str | None = None) -> list[Case]:
    """The cases of ``tier``, optionally only those of ``op`` and those whose id matches the ``-k`` expression."""
    if op is not None and op not in OP_SUPPORT:
        raise CaseError("op", f"expected one of {', '.join(OP_SUPPORT)}; got {op!r}")
    cases = tier_cases(tier)
    if op is not None:
        cases = [c for c in cases if c.op == op]
    if k:
        matches = compile_k(k)
        cases = [c for c in cases if matches(c.id)]
    return cases
