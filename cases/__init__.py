"""What to test: the Case spec, the per-op support declaration, the generated tiers, deterministic inputs.

Imports nothing from reference/, harness/ or reports/. The names below are loaded on first use (PEP 562), so
``deltacheck.cases.spec`` (the case id grammar, which reports read) imports without torch; only the inputs
(``make_inputs`` and its kin) need it.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "MAIN_AXES": "axes", "axis_values": "axes",
    "coverage_table": "coverage", "interaction_coverage": "coverage", "pair_coverage": "coverage",
    "make_inputs": "inputs", "make_weights": "inputs", "stream_seed": "inputs", "tensor_digest": "inputs",
    "KExprError": "kexpr", "compile_k": "kexpr",
    "TIER_AXES": "matrix", "TIER_BUDGETS": "matrix", "generate_tier": "matrix", "select_generated": "matrix",
    "tier_cases": "matrix",
    "BETA_PROFILES": "spec", "GATE_PROFILES": "spec", "IO_DTYPES": "spec", "LAYOUTS": "spec",
    "STATE_DTYPES": "spec", "TIERS": "spec", "Case": "spec", "CaseError": "spec", "parse_id": "spec",
    "OP_SUPPORT": "support", "OpSupport": "support",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
