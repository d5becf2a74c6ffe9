"""The main axes of the case matrix: the coarse, named values a Case projects onto (``axis_values``), and which
combinations of them a valid Case can have (``compatible``). Covering arrays are built over these axes.
"""

from __future__ import annotations

from .spec import BETA_PROFILES, GATE_PROFILES, IO_DTYPES, LAYOUTS, STATE_DTYPES, Case
from .support import HEAD_CONFIGS, HOUSEHOLDER_OPS, OP_SUPPORT, TIER_OPS

GATE_MODES = ("log", "linear", "safe", "safe_alog", "safe_dtbias", "safe_alog_dtbias")
BETA_MODES = ("plain", "sigmoid", "negeig")
LENGTH_KINDS = ("one", "batch", "ragged")  # N == 1 / N > 1 all equal / unequal (thd only)
ON_OFF = ("off", "on")


# Head dims are the math's, not one library's: powers of two and not (masking bugs live at 96), K != V both ways.
DIMS = ("32x32", "64x64", "96x96", "128x128", "256x256", "64x128", "128x64")


MAIN_AXES: dict[str, tuple[str, ...]] = {
    "op": TIER_OPS,
    "io_dtype": IO_DTYPES,
    "state_dtype": STATE_DTYPES,
    "layout": LAYOUTS,
    "lengths": LENGTH_KINDS,
    "heads": HEAD_CONFIGS,
    "dims": DIMS,
    "gate": GATE_PROFILES,
    "gate_mode": GATE_MODES,
    "beta_mode": BETA_MODES,
    "beta": BETA_PROFILES,
    "l2norm": ON_OFF,
    "guard": ON_OFF,
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
        "guard": ON_OFF[case.beta_guard],
        "scale": "default" if case.scale is None else "custom",
        "h0": ON_OFF[case.initial_state],
        "cont": ON_OFF[bool(case.splits)],
        "bwd": ON_OFF[case.backward],
        # GDP's Householder steps per token; an axis of the GDP arrays only (cases/matrix.py: tier_axes)
        **({"nh": str(case.num_householder)} if case.support.householder else {}),
    }


# The ops each rule below names, from OP_SUPPORT once (compatible() runs ~10^5 times per generated tier)
_OPS_WITH_LAYOUT = {layout: tuple(o for o, sup in OP_SUPPORT.items() if layout in sup.layouts)
                    for layout in {x for sup in OP_SUPPORT.values() for x in sup.layouts}}
_BETA_GUARD_OPS = tuple(o for o, sup in OP_SUPPORT.items() if "beta_guard" in sup.flags)


def compatible(assignment: dict[str, str], axes: dict[str, tuple[str, ...]] = MAIN_AXES) -> bool:
    """Whether a (partial) assignment of main-axis values can belong to a valid, non-vacuous Case.

    The per-op rules come from OP_SUPPORT, not from op names. A rule with an axis still unassigned looks ahead
    at ``axes`` (the values that axis may still take), so a partial row is accepted only when it can still be
    completed — which lets a covering array be built over narrowed axes (a backend's envelope).
    """

    def can(axis: str, *values: str) -> bool:
        """``axis`` holds, or can still take, one of ``values``."""
        if axis in assignment:
            return assignment[axis] in values
        return any(v in axes.get(axis, ()) for v in values)

    op, dims = assignment.get("op"), assignment.get("dims")
    if op is not None and assignment.get("layout") not in (None, *OP_SUPPORT[op].layouts):
        return False  # GDP is packed thd only
    if assignment.get("layout") is not None and not can("op", *_OPS_WITH_LAYOUT.get(assignment["layout"], ())):
        return False
    if "nh" in assignment and not can("op", *HOUSEHOLDER_OPS):
        return False
    if op is not None and dims is not None:
        k, v = map(int, dims.split("x"))
        if not OP_SUPPORT[op].supports_dims(k, v):
            return False
    if assignment.get("beta") == "near2" and not can("beta_mode", "negeig"):
        return False
    if assignment.get("beta_mode") in ("plain", "sigmoid") and assignment.get("beta") == "near2":
        return False
    if assignment.get("lengths") == "ragged" and not can("layout", "thd"):
        return False
    if assignment.get("layout") in ("bshd", "sbhd", "bhsd") and assignment.get("lengths") == "ragged":
        return False
    if assignment.get("guard") == "on":
        if not can("l2norm", "on"):
            return False
        if not can("op", *_BETA_GUARD_OPS):
            return False
    if assignment.get("l2norm") == "off" and assignment.get("guard") == "on":
        return False
    # A state that lives thousands of tokens is only tested when something carries it: an initial state and a
    # continuation split, on sequences of several chunks (matrix.row_to_case draws those lengths).
    if assignment.get("gate") == "long" and not (can("h0", "on") and can("cont", "on")):
        return False
    # A linear-domain alpha of exp(-1000) = 0 enters as log(0 + 1e-10): d/d(alpha) there is 1e10, a gradient no
    # finite-precision run resolves (the same-precision baseline misses every threshold by 10x). Its forward is
    # well-posed and tested; its backward is not generated.
    if assignment.get("gate_mode") == "linear" and assignment.get("gate") == "extreme" and not can("bwd", "off"):
        return False
    # beta 'zero' writes nothing; without an initial state nothing is read either, so only a backward judges the
    # kernel — dbeta, which a saturated sigmoid (logit -30) flattens to ~1e-13, or GDN2's dw, which no sigmoid
    # touches. Such a case must have a backward that sees something, or a kernel that writes zeros passes it.
    if assignment.get("beta") == "zero":
        backward_sees = can("bwd", "on") and (can("beta_mode", "plain") or can("op", "gdn2"))
        if not (can("h0", "on") or backward_sees):
            return False
    return True
