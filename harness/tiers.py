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
import hashlib
import os
import sys
from pathlib import Path

import deltacheck.cases as cases_package
from deltacheck.cases import Case, CaseError
from deltacheck.cases.envelope import EnvelopeUnion
from deltacheck.cases.matrix import filter_cases
from deltacheck.cases.matrix import tier_cases as generated_tier
from deltacheck.cases.support import OPS

from .availability import backend_envelope
from .cachedir import cache_root

TIER_TARGETS: tuple[tuple[str, int | None], ...] = (("cudnn", 90), ("cudnn", 100), ("fla", None), ("flashqla", 90))


def target_envelopes() -> list[EnvelopeUnion]:
    """The envelopes tiers are generated for, in a fixed order."""
    out = []
    for spec, sm in TIER_TARGETS:
        for op in OPS:
            envelope = backend_envelope(spec, op, sm=sm)
            if envelope is not None and envelope.members:
                out.append(envelope)
    return out


# Generating a tier takes seconds (L0 ~1.5 s on the 2-core CI machine, L1 ~2 s), paid by every process: every
# `deltacheck` command and every pytest session. The ids are kept on disk, keyed by everything the generation reads:
# the generator's source (cases/*.py, this file) and the envelopes (their repr holds every field). A case id
# round-trips to the very Case (tests/test_tiers_cache.py). DELTACHECK_TIER_CACHE names another directory, or 0 for
# none. A process that changes the generator at run time (a test monkeypatching cases.matrix) must set it to 0.
TIER_CACHE_ENV = "DELTACHECK_TIER_CACHE"
_TIER_CACHE_FORMAT = "1"


def tier_cache_file(tier: str, envelopes) -> Path | None:
    """Where ``tier`` generated over ``envelopes`` is kept (None: the cache is off)."""
    where = os.environ.get(TIER_CACHE_ENV, "")
    if where == "0":
        return None
    try:
        root = Path(where) if where else cache_root() / "tiers"
        digest = hashlib.sha256(f"{_TIER_CACHE_FORMAT}\n{sys.version_info[:2]}\n{tier}\n{envelopes!r}\n".encode())
        for path in sorted(Path(cases_package.__file__).parent.glob("*.py")) + [Path(__file__)]:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    except (OSError, RuntimeError):  # no home directory (Path.home), unreadable sources: run without the cache
        return None
    return root / f"{tier}-{digest.hexdigest()[:32]}.ids"


@functools.cache
def _tier(tier: str) -> tuple[Case, ...]:
    envelopes = target_envelopes()
    path = tier_cache_file(tier, envelopes)
    if path is not None:
        try:
            ids = path.read_text(encoding="utf-8").splitlines()
            if ids and ids[-1] == "end":  # written whole (a torn file lacks it)
                return tuple(Case.from_id(i) for i in ids[:-1])
        except (OSError, UnicodeError, CaseError):
            pass  # absent or unreadable: generate
    cases = tuple(generated_tier(tier, envelopes))
    if path is not None:
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            part.write_text("".join(f"{c.id}\n" for c in cases) + "end\n", encoding="utf-8")
            os.replace(part, path)  # atomic: concurrent processes write the same bytes
        except OSError:  # a read-only or full cache directory costs the generation next time, nothing else
            part.unlink(missing_ok=True)
    return cases


def tier_cases(tier: str) -> list[Case]:
    """Every case of ``tier`` (the same list in every process)."""
    return list(_tier(tier))


def select(tier: str = "L0", op: str | None = None, k: str | None = None) -> list[Case]:
    """The cases of ``tier``, optionally only those of ``op`` and those whose id matches the ``-k`` expression."""
    return filter_cases(_tier(tier), op, k)
