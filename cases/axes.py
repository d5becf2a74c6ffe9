"""The main axes of the case matrix: the coarse, named values a Case projects onto (``axis_values``), and which
combinations of them a valid Case can have (``compatible``). Covering arrays are built over these axes.
"""

from __future__ import annotations

from .spec import BETA_PROFILES, GATE_PROFILES, IO_DTYPES, LAYOUTS, STATE_DTYPES, Case
from .support import HEAD_CONFIGS, OP_SUPPORT, TIER_OPS

GATE_MODES = ("log", "linear", "safe", "safe_alog", "safe_dtbias", "safe_alog_dtbias")
BETA_MODES = ("plain", "sigmoid", "negeig")
LENGTH_KINDS = ("one", "batch", "ragged")  # N == 1 / N > 1 all equal / unequal (thd only)
ON_OFF = ("off", "on")


def _all_dims() -> tuple[str, ...]:
    dims = []
    for support in OP_SUPPORT.values():
        square = sorted(set(support.key_dims) & set(support.value_dims))
        for k in square:
            dims.append(f"{k}x{k}")
        # "mixed" as the generator means it: the 64/128 pair, both ways.
        if {64, 128} <= set(support.key_dims) and {64, 128} <= set(support.value_dims):
            dims += ["64x128", "128x64"]
    return tuple(dict.fromkeys(sorted(dims, key=lambda d: tuple(map(int, d.split("x"))))))


MAIN_AXES: dict[str, tuple[str, ...]] = {
    "op": TIER_OPS,
    "io_dtype": IO_DTYPES,
    "state_dtype": STATE_DTYPES,
    "layout": LAYOUTS,
    "lengths": LENGTH_KINDS,
    "heads": HEAD_CONFIGS,
    "dims": _all_dims(),
    "gate": GATE_PROFILES,
    "gate_mode": GATE_MODES,
    "beta_mode": BETA_MODES,
    "beta": BETA_PROFILES,
    "l2norm": ON_OFF,
    "scale": ("default", "custom"),
    "h0": ON_OFF,
    "cont": ON_OFF,
    "bwd": ON_OFF,
}


def axis_values(case: Case) -> dict[str, str]:
    """Project a Case onto the main axes."""
    if case.safe_gate:
        gate_mode = "safe" + ("_alog" if case.a_log else "") + ("_dtbias" if case.dt_bias else "")
    else:
        gate_mode = case.gate_domain
    if case.N == 1:
        lengths = "one"
    elif len(set(case.seqlens)) == 1:
        lengths = "batch"
    else:
        lengths = "ragged"
    return {
        "op": case.op,
        "io_dtype": case.io_dtype,
        "state_dtype": case.state_dtype,
        "layout": case.layout,
        "lengths": lengths,
        "heads": case.head_config,
        "dims": f"{case.K}x{case.V}",
        "gate": case.gate,
        "gate_mode": gate_mode,
        "beta_mode": "negeig" if case.neg_eigval else ("sigmoid" if case.beta_sigmoid else "plain"),
        "beta": case.beta_profile,
        "l2norm": ON_OFF[case.l2norm],
        "scale": "default" if case.scale is None else "custom",
        "h0": ON_OFF[case.initial_state],
        "cont": ON_OFF[bool(case.splits)],
        "bwd": ON_OFF[case.backward],
    }


def compatible(assignment: dict[str, str]) -> bool:
    """Whether a (partial) assignment of main-axis values can belong to a valid Case.

    Every rule here is binary (touches two axes), so checking pairs is enough for any partial row to be
    completable. The per-op rules come from OP_SUPPORT, not from op names.
    """
    op, dims = assignment.get("op"), assignment.get("dims")
    if op is not None and dims is not None:
        k, v = map(int, dims.split("x"))
        if not OP_SUPPORT[op].supports_dims(k, v):
            return False
    if assignment.get("beta") == "near2" and assignment.get("beta_mode") not in (None, "negeig"):
        return False
    if assignment.get("lengths") == "ragged" and assignment.get("layout") not in (None, "thd"):
        return False
    return True
