"""Cases appended to a tier after its covering arrays (issue #27), so every case generated before keeps its id.

``minimal_dims_cases`` (L0): for every fused backend envelope, in thd and in bshd, with and without an initial
state, one case at a non-power-of-two head dim (K = V = 96) with the minimal flag set — log gate, no safe gate,
no l2norm, no beta sigmoid or neg-eig, no beta_guard, the default scale — wherever the envelope serves one. A
kernel release without the newer in-kernel flags declines every flagged case; before these, its only runnable
K = 96 case was bhsd, so it was never tested at a non-power-of-two head dim where masking bugs live in the
layouts it reads.

``safe_gate_backward_cases`` (L0, L1): fp16 and bf16 safe-gate backward for KDA and GDN2 at typical and steep
gates, on multi-chunk sequences (>= 256 tokens in L0; L1 adds >= 2,048), with and without a_log / dt_bias. An
error that grows with context length in fp16 (TF32-rounded dots) was seen on GDN2 and missed on KDA, whose L0
safe-gate backward cases were all beta_zero or mild.

``guard_separation_cases`` (L0): GDN2's beta_guard under a trained gate (decays near 1, where the erase safeguard
acts on every token). The guard cases the generator pins are mild- and zero-gated; dropping the guard moves the
mild one's final state by 2.1e-03, under the 2e-2 threshold, so a wrapper that forgets the flag passed it
(issue 29, item 12). These separate guard from no guard by more than 10x the limit on the output and the state.
"""

from __future__ import annotations

from collections.abc import Sequence

from .spec import Case, CaseError
from .support import OP_SUPPORT

MINIMAL_LAYOUTS = ("thd", "bshd")
_MINIMAL_LENGTHS = {"thd": (0, 1, 65), "bshd": (65, 65)}  # past one 64-token chunk, kept short for the CPU
_MINIMAL_HEADS = ((2, 2, 2), (1, 1, 2), (2, 1, 1))  # MHA, GVA, GQA: the first an envelope serves


def _power_of_two(n: int) -> bool:
    return n > 0 and not n & (n - 1)


def is_minimal_np2(case: Case) -> bool:
    """A non-power-of-two K and V with the minimal flag set (what an old kernel release still accepts)."""
    return (not _power_of_two(case.K) and not _power_of_two(case.V) and case.gate_domain == "log"
            and not (case.safe_gate or case.a_log or case.dt_bias or case.l2norm or case.beta_sigmoid
                     or case.neg_eigval or case.beta_guard) and case.scale is None)


def _minimal_candidates(op: str, layout: str, h0: bool, tier: str) -> list[Case]:
    out = []
    for io in ("bf16", "fp16"):
        for h, hk, hv in _MINIMAL_HEADS:
            for bwd in (True, False):
                try:
                    out.append(Case(op=op, io_dtype=io, layout=layout, seqlens=_MINIMAL_LENGTHS[layout], H=h, HK=hk,
                                    HV=hv, K=96, V=96, gate="typical", initial_state=h0, backward=bwd, tier=tier,
                                    num_householder=2 if OP_SUPPORT[op].householder else 1))
                except CaseError:
                    continue
    return out


def minimal_dims_cases(envelopes: Sequence, tier: str, existing: Sequence[Case]) -> list[Case]:
    """The cases ``existing`` lacks so that each envelope has, per layout in thd/bshd and per h0 off/on, a case
    it serves fully that ``is_minimal_np2``; none where the envelope serves no such case."""
    have = list(existing)
    made: list[Case] = []
    for envelope in envelopes:
        for layout in MINIMAL_LAYOUTS:
            if layout not in OP_SUPPORT[envelope.op].layouts:
                continue
            for h0 in (False, True):
                def fits(c):
                    return c.layout == layout and c.initial_state == h0 and is_minimal_np2(c)
                if any(fits(c) and envelope.contains(c) for c in have):
                    continue
                pick = next((c for c in _minimal_candidates(envelope.op, layout, h0, tier)
                             if envelope.contains(c)), None)
                if pick is not None:
                    have.append(pick)
                    made.append(pick)
    return made


# (layout, lengths, heads) in turn; L0's are short for the CPU reference (tests/test_reference_exact.py runs every
# L0 case), L1's reach 2,048 and 4,096 tokens.
_SAFE_BWD = {
    "L0": (("thd", (0, 257, 1), (2, 2, 2)), ("bshd", (260,), (2, 2, 2))),
    "L1": (("thd", (2048, 0, 700), (4, 4, 4)), ("bshd", (1024, 1024), (4, 4, 4)), ("thd", (4096,), (2, 2, 2))),
}


def safe_gate_backward_cases(tier: str) -> list[Case]:
    """KDA and GDN2 x fp16/bf16 x typical/steep: the safe gate's backward with an initial state, a_log and dt_bias
    on every other case (FLA's fp16 safe-gate error was largest without them); L1 also with both on every one."""
    shapes = _SAFE_BWD.get(tier)
    if not shapes:
        return []
    out = []
    for op in ("kda", "gdn2"):
        for io in ("fp16", "bf16"):
            for gate in ("typical", "steep"):
                for params in ((len(out) % 2 == 1,) if tier == "L0" else (False, True)):
                    layout, lens, (h, hk, hv) = shapes[len(out) % len(shapes)]
                    # bf16 at K = V = 128: inside cuDNN's Hopper KDA engine too; fp16 at 64
                    dim = 128 if io == "bf16" else 64
                    out.append(Case(op=op, io_dtype=io, layout=layout, seqlens=lens, H=h, HK=hk, HV=hv, K=dim,
                                    V=dim, gate=gate, safe_gate=True, a_log=params, dt_bias=params,
                                    initial_state=True, backward=True, tier=tier))
    return out


# Measured on the CPU (tests/test_mutants.py, the DropsBetaGuard wrapper, forward checks): headroom 15 / 20 for the
# first (output / state), 157 / 185 for the second (the last two: test_mutants.py); a typical gate at K = V = 96 gave 0.13 / 0.05: not a guard case.
_GUARD_SEPARATION = {
    "L0": (dict(io_dtype="bf16", layout="thd", seqlens=(0, 65, 130), K=128, V=128, splits=(64,)),
           dict(io_dtype="fp16", layout="bshd", seqlens=(130, 130), K=64, V=64, splits=()),
           dict(io_dtype="bf16", layout="sbhd", seqlens=(65, 65), K=64, V=64, splits=()),
           dict(io_dtype="fp16", layout="bhsd", seqlens=(100,), K=128, V=64, splits=(50,))),
}


def guard_separation_cases(tier: str) -> list[Case]:
    """GDN2 with beta_guard under a trained gate, one per layout, an initial state and the backward."""
    return [Case(op="gdn2", H=2, HK=2, HV=2, gate="trained", l2norm=True, beta_guard=True, initial_state=True,
                 backward=True, tier=tier, **shape) for shape in _GUARD_SEPARATION.get(tier, ())]
