"""The plug-in API: everything a backend written outside deltacheck needs, in one import.

    from deltacheck.plugin import Verdict, Envelope, gathered, floors_then_library

Stable: the names in ``__all__`` keep their meaning and signatures within a major version of deltacheck (a
removal or an incompatible change is announced one minor version ahead); anything imported from elsewhere in
the package is internal and may move. docs/backends.md describes the protocol, every optional hook
(``BackendHooks``) and a worked example; docs/envelopes.md the envelopes.
"""

from deltacheck.cases.envelope import Envelope
from deltacheck.harness.backends.base import (
    Backend,
    BackendHooks,
    BackendLoadError,
    LibraryContractError,
    Verdict,
    get_backend,
    register,
    registered,
)
from deltacheck.harness.backends.fused import FusedAdapter
from deltacheck.harness.ci.required import strip_pair
from deltacheck.harness.machine.availability import (
    floors_then_library,
    gathered,
    merge_verdicts,
    no_cuda_reason,
    package_floor,
)
from deltacheck.harness.machine.environment import Env, version_below, version_in

__all__ = [
    "Backend", "BackendHooks", "BackendLoadError", "Env", "Envelope", "FusedAdapter", "LibraryContractError", "Verdict",
    "floors_then_library", "gathered", "get_backend", "merge_verdicts", "no_cuda_reason", "package_floor",
    "register", "registered", "strip_pair", "version_below", "version_in",
]
