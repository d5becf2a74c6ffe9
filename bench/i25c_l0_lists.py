"""Write bench/i25c_<backend>_l0.txt: the L0 cases a new backend's adapter accepts — the shipped L0 tier's cases
plus the cases L0's generator adds to cover that backend's own envelopes (cases/matrix.py tier_cases with its
envelopes). The shipped tier does not generate for jax/flashinfer (harness/ci/tiers.py TIER_TARGETS), so without
these lists an L0 run of them would decline almost every case. Run: python bench/i25c_l0_lists.py"""

from __future__ import annotations

from pathlib import Path

from deltacheck.cases.matrix import select
from deltacheck.cases.support import OPS
from deltacheck.harness.backends.base import get_backend
from deltacheck.harness.ci import tiers

HERE = Path(__file__).resolve().parent


def accepted(spec: str) -> list[str]:
    backend = get_backend(spec)
    envelopes = [e for op in OPS if op in backend.ops for e in backend.envelopes(op, sm=90)]
    seen, out = set(), []
    for case in [*tiers.select("L0"), *select("L0", envelopes=envelopes)]:
        if case.op in backend.ops and backend.unsupported(case) is None and case.id not in seen:
            seen.add(case.id)
            out.append(case.id)
    return out


if __name__ == "__main__":
    for spec in ("jax", "flashinfer", "flashinfer-decode"):
        ids = accepted(spec)
        (HERE / f"i25c_{spec}_l0.txt").write_text("".join(f"{i}\n" for i in ids))
        print(spec, len(ids))
