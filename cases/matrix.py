"""The generated case matrix: covering-array rows made concrete (head counts, lengths, split points, scale drawn
from a tier-seeded ``random.Random``, so the matrix is the same in every process), the tiers, and selection.

Tiers:
    L0  CI smoke: every pair of main-axis values (and every op x io x state x layout triple) at least
        once; <= 4 heads, dims 64/128, <= 600 tokens per case, so the CPU fp64 reference is quick.
    L1  three independent covering arrays that each cover every pair of main-axis values and every
        triple of the core axes, with heads up to 16, 256-dim GDN and lengths up to 8k.
    L2  stress: long sequences (to 64k), many ragged sequences, steep/extreme gates, covered pairwise.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence

from . import added
from .axes import LENGTH_KINDS, MAIN_AXES, ON_OFF, axis_values, compatible
from .covering import covering_rows, joint_covering_rows, row_interactions
from .envelope import Envelope
from .gdp import GDP_CASES
from .kexpr import compile_k
from .spec import IO_DTYPES, LAYOUTS, STATE_DTYPES, TIERS, Case, CaseError
from .support import HEAD_CONFIGS, HOUSEHOLDER_OPS, OP_SUPPORT

# ------------------------------------------------------------------- rows -> concrete Cases

# Head counts (H, HK, HV) per configuration, per tier.
_HEADS = {
    "L0": {"mha": [(2, 2, 2), (4, 4, 4)], "gqa": [(4, 2, 2), (4, 1, 1)], "gva": [(2, 2, 4), (1, 1, 4)]},
    "L1": {"mha": [(4, 4, 4), (8, 8, 8), (16, 16, 16)], "gqa": [(8, 2, 2), (16, 4, 4), (6, 3, 3)],
           "gva": [(2, 2, 8), (4, 4, 16), (3, 3, 6)]},
    "L2": {"mha": [(16, 16, 16), (32, 32, 32)], "gqa": [(32, 8, 8)], "gva": [(8, 8, 32), (16, 16, 64)]},
}

# L0 lengths sit on the 64-token chunk boundary; ragged ones always hold a 0 and a 1.
_L0_ONE = (1, 63, 64, 65, 128, 200)
_L0_BATCH = ((2, 63), (2, 64), (3, 65), (4, 31), (2, 129))
_L0_RAGGED = ((0, 1, 63, 65), (1, 64, 0, 130), (65, 0, 1, 200, 3), (0, 1, 127), (63, 1, 0, 64, 65, 2))

_L1_ONE = (1, 2, 63, 64, 65, 127, 129, 1000, 2048, 4095, 8192)
_L1_BATCH = ((2, 64), (2, 255), (4, 1024), (3, 2049), (8, 127), (2, 8192))

_L2_ONE = (16384, 32768, 65536, 65535)
_L2_BATCH = ((4, 16384), (8, 8192), (2, 65536), (64, 1024))

_CUSTOM_SCALES = (0.5, 1.0, 0.0625)

# The 'long' gate profile keeps a state for thousands of tokens: its cases span several 64-token chunks and are
# split off chunk boundaries, so a hand-off that only rescales the carried state shows.
_LONG = {
    "L0": {"one": ((320,), (257,)), "batch": ((257, 257), (200, 200)), "ragged": ((257, 0, 300), (1, 300, 192))},
    "L1": {"one": ((2000,), (4500,)), "batch": ((3000, 3000), (1500,) * 4), "ragged": ((3000, 0, 1500, 777),)},
    "L2": {"one": ((32768,),), "batch": ((16384, 16384),), "ragged": ((20000, 0, 9000, 1),)},
}


def _ragged_lengths(tier: str, rng: random.Random) -> tuple[int, ...]:
    if tier == "L0":
        return rng.choice(_L0_RAGGED)
    if tier == "L1":
        n = rng.randint(3, 16)
        cap = rng.choice((256, 1024, 8192))
        lengths = [rng.choice((0, 1, 63, 64, 65)) if rng.random() < 0.3 else rng.randint(2, cap)
                   for _ in range(n)]
        lengths[rng.randrange(n)] = rng.choice((0, 1))  # every ragged batch has an edge sequence
    else:
        if rng.random() < 0.5:  # one long sequence among many short ones
            lengths = [rng.randint(0, 300) for _ in range(rng.randint(32, 128))]
            lengths[rng.randrange(len(lengths))] = 65536
        else:  # many mid-sized sequences
            lengths = [rng.choice((0, 1)) if rng.random() < 0.1 else rng.randint(2, 8192)
                       for _ in range(rng.randint(16, 64))]
    budget = 16384 if tier == "L1" else 131072  # tokens per case
    while sum(lengths) > budget:
        lengths[lengths.index(max(lengths))] //= 2
    if len(set(lengths)) == 1:  # "ragged" must really be ragged
        lengths[0] += 1
    return tuple(lengths)


def _lengths(kind: str, tier: str, rng: random.Random, splittable: bool) -> tuple[int, ...]:
    one = {"L0": _L0_ONE, "L1": _L1_ONE, "L2": _L2_ONE}[tier]
    batch = {"L0": _L0_BATCH, "L1": _L1_BATCH, "L2": _L2_BATCH}[tier]
    if kind == "one":
        # A one-token sequence cannot be split, so a continuation row draws a longer one.
        return (rng.choice([n for n in one if n > 1] if splittable else one),)
    if kind == "batch":
        n, length = rng.choice(batch)
        return (length,) * n
    return _ragged_lengths(tier, rng)


def _splits(seqlens: tuple[int, ...], rng: random.Random, off_boundary: bool = False) -> tuple[int, ...]:
    longest = max(seqlens)
    if off_boundary:  # a split strictly inside a chunk, well past the first one
        options = sorted({s for s in (longest // 3, longest // 2, 2 * longest // 3) if 64 < s < longest and s % 64})
    else:
        options = sorted({s for s in (1, 63, 64, 65, longest // 2, longest // 3, longest - 1) if 0 < s < longest})
    if not options:
        return ()
    count = min(len(options), rng.choice((1, 1, 2)))
    return tuple(sorted(rng.sample(options, count)))


def row_to_case(row: dict[str, str], tier: str, rng: random.Random, seed: int = 0) -> Case:
    """Make a covering-array row concrete (head counts, lengths, splits and scale drawn from `rng`)."""
    k, v = map(int, row["dims"].split("x"))
    long_gate = row["gate"] == "long"
    if long_gate:
        seqlens = rng.choice(_LONG[tier][row["lengths"]])
    else:
        seqlens = _lengths(row["lengths"], tier, rng, splittable=row["cont"] == "on")
    h, hk, hv = rng.choice(_HEADS[tier][row["heads"]])
    gate_mode = row["gate_mode"]
    return Case(
        op=row["op"], io_dtype=row["io_dtype"], state_dtype=row["state_dtype"], layout=row["layout"],
        seqlens=seqlens, H=h, HK=hk, HV=hv, K=k, V=v, gate=row["gate"], beta_profile=row["beta"],
        l2norm=row["l2norm"] == "on", beta_guard=row.get("guard") == "on",
        beta_sigmoid=row["beta_mode"] != "plain", neg_eigval=row["beta_mode"] == "negeig",
        gate_domain="linear" if gate_mode == "linear" else "log",
        safe_gate=gate_mode.startswith("safe"), a_log="alog" in gate_mode, dt_bias="dtbias" in gate_mode,
        scale=rng.choice(_CUSTOM_SCALES) if row["scale"] == "custom" else None,
        initial_state=row["h0"] == "on",
        splits=_splits(seqlens, rng, off_boundary=long_gate) if row["cont"] == "on" else (),
        backward=row["bwd"] == "on", seed=seed, tier=tier, num_householder=int(row.get("nh", 1)),
    )


# ---------------------------------------------------------------------------------- tiers

# The few hand-written cases every L0 run must contain, whatever the generator does.
_L0_PINNED = (
    # The architecture page's example, shrunk to L0 size.
    "gdn2-bf16-thd-N3-T[0_63_200]-H4/4/4-K128-V128-steep-h0-cont[64]-bwd",
    # Reduction partners (GDN2 -> KDA -> GDN) on the same lengths and heads.
    "gdn-bf16-thd-N4-T[0_1_64_65]-H2/2/2-K64-V64-typical-h0-cont[1_64]-bwd",
    "kda-bf16-thd-N4-T[0_1_64_65]-H2/2/2-K64-V64-typical-h0-cont[1_64]-bwd",
    "gdn2-bf16-thd-N4-T[0_1_64_65]-H2/2/2-K64-V64-typical-h0-cont[1_64]-bwd",
    # Extreme gates on a ragged batch (FLA's KDA varlen test injects -1000 the same way).
    "kda-fp16-thd-N5-T[65_0_1_200_3]-H4/4/4-K128-V64-extreme-l2norm-h0-cont[64]-bwd",
    # cuDNN's Hopper (SM90) KDA engines serve only bf16, K = V = 128, the default scale (and equal
    # heads for the backward): pairwise generation lands few cases there, so L0 pins some, or an H200
    # lane would exercise that engine on almost nothing.
    "kda-bf16-thd-N4-T[0_1_64_200]-H2/2/2-K128-V128-steep-l2norm-h0-cont[64]-bwd",
    "kda-bf16-bshd-N2-L130-H4/4/4-K128-V128-typical-sigmoid-bwd",
    "kda-bf16-thd-N3-T[65_1_129]-H2/2/2-K128-V128-extreme-l2norm-sigmoid-safegate-alog-dtbias-h0-bwd",
    "kda-bf16-sbhd-N2-L64-H2/2/4-K128-V128-mild-h0-cont[33]",
    "kda-bf16-thd-N2-T[300_257]-H2/2/2-K128-V128-zero-state_bf16-l2norm-h0-bwd",
    "kda-bf16-bhsd-N1-L256-H4/2/2-K128-V128-typical-l2norm-cont[128]",
    # ...and its backward kernel takes pre-normalized q/k and post-sigmoid beta: no l2norm, no sigmoid.
    "kda-bf16-thd-N3-T[1_64_200]-H2/2/2-K128-V128-steep-h0-cont[64]-bwd",
    "kda-bf16-bshd-N2-L129-H2/2/2-K128-V128-extreme-bwd",
    # GDN2's beta_guard (cuDNN's erase safeguard, needs l2norm): mild gates leave it a small decay budget.
    "gdn2-bf16-thd-N3-T[0_65_130]-H2/2/2-K128-V128-mild-l2norm-guard-h0-cont[64]-bwd",
    "gdn2-fp16-bshd-N2-L64-H2/2/4-K64-V64-zero-l2norm-sigmoid-guard-bwd",
)

# L0: every pair, plus every op x layout x dtype triple; the fused kernels' own pairs come from their envelopes
# (envelope_cases). Dims: the powers of two a library specializes on, one that is not (96), K != V both ways
# (32 and 256 are L1's: every head-dim value is a kernel specialization a GPU lane compiles cold).
_L0_TRIPLE_AXES = (("op", "io_dtype", "state_dtype", "layout"),)
_L0_AXES = {**MAIN_AXES, "dims": ("64x64", "128x128", "96x96", "64x128", "128x64")}
_L1_REPLICAS = 4

_L2_AXES = {
    "op": MAIN_AXES["op"],
    "io_dtype": IO_DTYPES,
    "state_dtype": STATE_DTYPES,
    "layout": LAYOUTS,
    "lengths": LENGTH_KINDS,
    "heads": HEAD_CONFIGS,
    "dims": ("64x64", "128x128", "128x64"),
    "gate": ("steep", "extreme", "zero", "mild"),
    "gate_mode": ("log", "linear", "safe_alog_dtbias"),
    "beta_mode": ("plain", "sigmoid"),
    "beta": ("uniform",),
    "l2norm": ("on",),
    "guard": ON_OFF,
    "scale": ("default",),
    "h0": ON_OFF,
    "cont": ON_OFF,
    "bwd": ON_OFF,
}

# The axes (and values) each tier's generator covers; coverage is reported against these.
TIER_AXES = {"L0": _L0_AXES, "L1": MAIN_AXES, "L2": _L2_AXES}

# GDP (the ops with Householder steps) is generated apart: its own covering array per tier, over the tier's axes
# narrowed to what the op accepts (packed thd only) plus the steps per token, from its own seed — so adding it
# left every other generated case as it was. The steps: n = 1 (GDP is then GDN), 2 and 3 in L0 (the reference's
# cost grows with n), 4 too in L1, 2 and 4 in L2.
_HOUSEHOLDER_STEPS = {"L0": ("1", "2", "3"), "L1": ("1", "2", "3", "4"), "L2": ("2", "4")}
_HOUSEHOLDER_TRIPLE_AXES = {"L0": (("io_dtype", "state_dtype", "nh"),), "L1": (("io_dtype", "lengths", "nh"),),
                            "L2": (("lengths", "gate", "nh"),)}


def tier_axes(tier: str, op: str | None = None) -> dict[str, tuple[str, ...]]:
    """The axes (and values) ``tier`` generates ``op``'s cases over: the tier's own, or for an op with Householder
    steps the GDP array's (its op and layouts, and ``nh``)."""
    if tier not in TIER_AXES:
        raise CaseError("tier", f"expected one of {', '.join(TIERS)}; got {tier!r}")
    if op is None or not OP_SUPPORT[op].householder:
        return TIER_AXES[tier]
    layouts = tuple(x for x in TIER_AXES[tier]["layout"] if x in OP_SUPPORT[op].layouts)
    return {**TIER_AXES[tier], "op": (op,), "layout": layouts, "nh": _HOUSEHOLDER_STEPS[tier]}


# Budgets the tests hold the tiers to (with every fused backend's envelope cases; issue 25 added the envelopes of
# vLLM's FLA copy, FlashKDA and FlashQLA to the tiers' targets (backends/table.py): L0 was 307 before).
TIER_BUDGETS = {"L0": (150, 420), "L1": (1000, 2500), "L2": (20, 200)}
L0_MAX_TOKENS = 600
L0_MAX_HEADS = 4


def _dedupe(cases) -> tuple[Case, ...]:
    return tuple(dict.fromkeys(cases))


@functools.cache
def _reference_tier(tier: str) -> tuple[Case, ...]:
    """The reference-level covering array of a tier: the op's axes, whoever can run them."""
    if tier == "L0":
        rng = random.Random("deltacheck-L0")
        rows = covering_rows(_L0_AXES, rng, triple_groups=_L0_TRIPLE_AXES)
        pinned = [Case.from_id(i) for i in _L0_PINNED]
        return _dedupe(pinned + [row_to_case(row, "L0", rng) for row in rows] + list(GDP_CASES)
                       + _householder_cases("L0"))
    if tier == "L1":
        cases = []
        # Independent three-way arrays: each triple of main-axis values appears in several different
        # surroundings (heads, lengths, other flags), which a single minimal array would not give.
        for replica in range(_L1_REPLICAS):
            rng = random.Random(f"deltacheck-L1-{replica}")
            rows = covering_rows(MAIN_AXES, rng, triple_groups=(tuple(MAIN_AXES),), candidates=2)
            cases += [row_to_case(row, "L1", rng) for row in rows]
        return _dedupe(cases + _householder_cases("L1"))
    if tier == "L2":
        rng = random.Random("deltacheck-L2")
        rows = covering_rows(_L2_AXES, rng, triple_groups=(("op", "lengths", "gate"),))
        return _dedupe([row_to_case(row, "L2", rng) for row in rows] + _householder_cases("L2"))
    raise CaseError("tier", f"expected one of {', '.join(TIERS)}; got {tier!r}")


def _householder_cases(tier: str) -> list[Case]:
    cases = []
    for op in HOUSEHOLDER_OPS:
        rng = random.Random(f"deltacheck-{tier}-{op}")
        axes = tier_axes(tier, op)
        rows = covering_rows(axes, rng, triple_groups=_HOUSEHOLDER_TRIPLE_AXES[tier],
                             compatible=functools.partial(compatible, axes=axes))
        cases += [row_to_case(row, tier, rng) for row in rows]
    return cases


def envelope_cases(envelopes: Sequence[Envelope], tier: str, existing: list[Case],
                   seed: str = "envelopes") -> list[Case]:
    """One covering array over the axis values inside each envelope at ``tier``, made only of the rows the
    ``existing`` cases leave uncovered, rows served by several envelopes preferred (cuDNN and FLA share cases
    where they overlap)."""
    groups = []
    for envelope in envelopes:
        base = tier_axes(tier, envelope.op)
        axes = envelope.axes(base)
        covered = set()
        for case in existing:
            if envelope.contains(case):
                covered |= row_interactions(axis_values(case), axes)
        groups.append((axes, envelope.rule(base), covered))
    rng = random.Random(f"deltacheck-{tier}-{seed}")
    made = [row_to_case(row, tier, rng) for row in joint_covering_rows(groups, rng)]
    for case in made:  # a concrete draw (heads, lengths) must stay inside what its row was chosen for
        if not any(e.contains(case) for e in envelopes):
            raise ValueError(f"generated {case.id} lies inside no envelope: the generator and the envelopes disagree")
    return made


def generate_tier(tier: str, envelopes: Sequence[Envelope] = ()) -> list[Case]:
    """A tier generated over ``envelopes``, in a stable order (same list in every process): the reference-level
    array, then the cases that cover each envelope's pairs not covered yet. The tiers as they run (over every fused
    backend's envelopes) are ``harness.tiers.tier_cases`` / ``select``."""
    cases = list(_reference_tier(tier))
    # GDP's envelopes cover pairs of its own array's axes, from their own seed (the others' cases stay as they were)
    householder = [e for e in envelopes if OP_SUPPORT[e.op].householder]
    others = [e for e in envelopes if not OP_SUPPORT[e.op].householder]
    if others:
        cases += envelope_cases(others, tier, cases)
    if householder:
        cases += envelope_cases(householder, tier, cases, seed="householder-envelopes")
    # Appended last (cases/added.py), so every case above keeps its id and place.
    cases = list(_dedupe(cases))
    if tier == "L0":
        cases += [c for c in added.minimal_dims_cases(envelopes, tier, cases) if c not in cases]
    cases += [c for c in added.safe_gate_backward_cases(tier) if c not in cases]
    cases += [c for c in added.guard_separation_cases(tier) if c not in cases]
    return list(_dedupe(cases))


def filter_cases(cases: Sequence[Case], op: str | None = None, k: str | None = None) -> list[Case]:
    """``cases``, optionally only those of ``op`` and those whose id matches the ``-k`` expression."""
    if op is not None and op not in OP_SUPPORT:
        raise CaseError("op", f"expected one of {', '.join(OP_SUPPORT)}; got {op!r}")
    cases = list(cases)
    if op is not None:
        cases = [c for c in cases if c.op == op]
    if k:
        matches = compile_k(k)
        cases = [c for c in cases if matches(c.id)]
    return cases


def select_generated(tier: str = "L0", op: str | None = None, k: str | None = None,
                     envelopes: Sequence[Envelope] = ()) -> list[Case]:
    """``generate_tier(tier, envelopes)``, optionally only the cases of ``op`` and those matching ``-k``. Without
    envelopes this is the reference-level array alone, not what runs (``harness.tiers.select``)."""
    return filter_cases(generate_tier(tier, envelopes), op, k)


tier_cases = generate_tier  # the name before issue 23, which tests of the generator import
