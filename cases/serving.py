"""The serving tiers (issue 26): cases with the serving axes (``serving_axes.py``), per op, kept apart from the
training-style tiers (``matrix.py``) so those keep their ids and counts.

Every shape is small enough for the fp64 reference on a CPU (L0 runs in the CPU suite). What each case is for:

- ``pool``: a permuted, repeat-free table into a pool larger than the batch, ragged prefill lengths;
- ``mixed``: prefill and decode sequences in one call (lengths 1 beside longer ones), with a null sequence;
- ``decode``: a decode batch (T = 1 per sequence), with and without a null among them;
- ``chain``: n decode steps against one prefill;
- ``spec``: k drafts with accepted counts 0, mid and k (the first block, a middle one, the last);
- ``ckpt``: checkpoint cadences that do and do not divide the lengths (and an empty sequence); 64 is cuDNN
  FROST's smallest cadence.

``K == V`` in L0 on purpose: there a key-major read of a value-major pool is silent in shape and only the
numbers show it; L1 adds ``K != V`` (and GVA heads) and the longer lengths.
"""

from __future__ import annotations

from .spec import Case

_OPS = ("gdn", "kda", "gdn2", "gdp")


def _op_fields(op: str) -> dict:
    return {"num_householder": 2} if op == "gdp" else {}


def _l0(op: str) -> list[Case]:
    base = Case(op=op, seqlens=(5,), **_op_fields(op))
    return [
        base.replace(seqlens=(5, 3, 7), pool=7),
        base.replace(seqlens=(4, 1, 6, 1), pool=9, nulls=1),
        base.replace(seqlens=(1, 1, 1, 1, 1), pool=8, nulls=1),
        base.replace(seqlens=(1, 1, 1, 1), pool=7),  # a decode batch without nulls: FLA 0.6's only pool mode
        base.replace(seqlens=(3, 3, 3), pool=6, chain=3),
        base.replace(seqlens=(4, 4, 4), pool=15, draft=3, accepted=(0, 2, 3)),
        base.replace(seqlens=(9, 4, 0, 13), checkpoint_every=4, initial_state=True)  # gdp: 4 = 2 tokens of nh2,
    ]


def _l1(op: str) -> list[Case]:
    base = Case(op=op, seqlens=(5,), K=128, V=64, H=2, HK=2, HV=4, tier="L1", **_op_fields(op))
    if op == "gdn2":
        base = base.replace(HV=2)  # FLA's gdn2 has no GVA; the grouping is covered by the other ops
    return [
        base.replace(seqlens=(37, 1, 64, 2), pool=9),
        base.replace(seqlens=(1,) * 8, pool=12, nulls=2),
        base.replace(seqlens=(6, 6), pool=5, chain=6),
        base.replace(seqlens=(5, 5, 5, 5), pool=22, nulls=1, draft=4, accepted=(4, 0, 1, 2)),
        base.replace(seqlens=(130, 64, 63), checkpoint_every=64),
        base.replace(seqlens=(40, 17), checkpoint_every=8, initial_state=True),
    ]


def _l2(op: str) -> list[Case]:
    base = Case(op=op, seqlens=(5,), K=128, V=128, H=4, HK=4, HV=4, tier="L2", **_op_fields(op))
    return [
        base.replace(seqlens=(300, 1, 1, 257), pool=64),
        base.replace(seqlens=(16,) * 4, pool=9, chain=16),
        base.replace(seqlens=(8,) * 6, pool=64, nulls=1, draft=7, accepted=(7, 0, 3, 1, 6, 2)),
        base.replace(seqlens=(1000, 129), checkpoint_every=128),
    ]


_BUILDERS = {"L0": _l0, "L1": _l1, "L2": _l2}


def serving_cases(tier: str = "L0", op: str | None = None) -> list[Case]:
    """The serving cases of ``tier`` (L1 and L2 each include the tiers below), for ``op`` or every op."""
    tiers = ("L0", "L1", "L2")[:("L0", "L1", "L2").index(tier) + 1]
    ops = _OPS if op is None else (op,)
    return [case for t in tiers for o in ops for case in _BUILDERS[t](o)]


# The serving check a case exists for (the first serving axis it has).
def check_for(case: Case) -> str:
    if case.draft:
        return "speculative"
    if case.chain:
        return "decode_chain"
    if case.checkpoint_every:
        return "checkpoints"
    return "pool_integrity"
