"""The tiers as they run: the reference-level covering array of each tier (``cases/matrix.py``) plus, per fused
backend x op x architecture, the cases that cover that backend's declared envelope — so every fused kernel gets
the cases it can run, not only the few of a reference-level array it happens to serve.

``TIER_TARGETS`` (derived from ``backends/table.py``'s ``tier_targets``) lists the (backend, architecture) pairs tiers
are generated for: FLA (any GPU) and cuDNN on the
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
from deltacheck.cases.matrix import envelope_cases, filter_cases
from deltacheck.cases.matrix import generate_tier as generated_tier
from deltacheck.cases.support import OP_SUPPORT, OPS

from ..backends.table import TIER_ON_DEMAND, TIER_TARGETS
from ..machine.availability import backend_envelope
from ..records.cachedir import cache_root


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


def plugin_envelopes(specs) -> list[EnvelopeUnion]:
    """The envelopes third-party backends (``pkg.mod:attr``) and the built-ins of ``TIER_ON_DEMAND`` among
    ``specs`` declare (on any architecture): such a backend gets cases generated inside them, as the built-ins of
    ``TIER_TARGETS`` do. One that cannot load or whose hook raises adds none (its tasks then say why it cannot run)."""
    out = []
    for spec in specs:
        if not _appends_cases(spec):
            continue
        for op in OPS:
            try:
                envelope = backend_envelope(spec, op)
            except Exception:  # noqa: BLE001 - see above
                envelope = None
            if envelope is not None and envelope.members:
                out.append(envelope)
    return out


@functools.cache
def _tier(tier: str, plugins: tuple[str, ...] = ()) -> tuple[Case, ...]:
    envelopes, extra = target_envelopes(), plugin_envelopes(plugins)
    path = tier_cache_file(tier, envelopes + extra)
    if path is not None:
        try:
            ids = path.read_text(encoding="utf-8").splitlines()
            if ids and ids[-1] == "end":  # written whole (a torn file lacks it)
                return tuple(Case.from_id(i) for i in ids[:-1])
        except (OSError, UnicodeError, CaseError):
            pass  # absent or unreadable: generate
    cases = tuple(generated_tier(tier, envelopes))
    if extra:  # after the built-ins' tier, from a seed of their own: a plug-in adds cases and changes none
        for group, seed in (([e for e in extra if not OP_SUPPORT[e.op].householder], "plugins"),
                            ([e for e in extra if OP_SUPPORT[e.op].householder], "householder-plugins")):
            if group:
                cases += tuple(c for c in envelope_cases(group, tier, list(cases), seed=seed) if c not in cases)
    if path is not None:
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            part.write_text("".join(f"{c.id}\n" for c in cases) + "end\n", encoding="utf-8")
            os.replace(part, path)  # atomic: concurrent processes write the same bytes
        except OSError:  # a read-only or full cache directory costs the generation next time, nothing else
            part.unlink(missing_ok=True)
    return cases


def tier_cases(tier: str, backends=()) -> list[Case]:
    """Every case of ``tier`` (the same list in every process); ``backends``: the run's, whose plug-ins' envelopes
    get cases too."""
    return list(_tier(tier, _plugins(backends)))


def select(tier: str = "L0", op: str | None = None, k: str | None = None, backends=()) -> list[Case]:
    """The cases of ``tier``, optionally only those of ``op`` and those whose id matches the ``-k`` expression;
    ``backends``: the run's backend specs (a plug-in among them that declares envelopes adds cases inside them)."""
    return filter_cases(_tier(tier, _plugins(backends)), op, k)


def _appends_cases(spec: str) -> bool:
    """A plug-in, or a built-in of ``TIER_ON_DEMAND``: naming it in a run appends its envelopes' cases."""
    return ":" in spec or spec in TIER_ON_DEMAND


def _plugins(backends) -> tuple[str, ...]:
    return tuple(sorted({spec for spec in backends or () if _appends_cases(spec)}))
