"""The arch/runtime gate: what this machine has, which backend × op pairs can run, and required mode.

CONTRACT (used by the runner, the adapters and the pytest plugin):
- ``Env``: a snapshot of the machine (``cuda``, ``device_name``, ``capability`` as ``(major, minor)``
  or None, ``versions``: package/runtime name -> version string or None). ``probe_env()`` builds it
  once per process; ``Env.to_dict()`` is what run headers record.
- ``pair_verdict(backend, op, env) -> Verdict``: our floors and facts for a fused pair, before any
  case is planned (adapters call it first, then ask the library).
- ``required_pairs(environ=os.environ) -> set[(backend, op)]``.
- ``required_failures(required, gate_verdicts, executed) -> list[str]``: one loud line per required
  pair that cannot run or executed zero cases.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Mapping

from .backends.base import Verdict


@dataclass(frozen=True)
class Env:
    cuda: bool
    device_name: str | None = None
    capability: tuple[int, int] | None = None
    versions: Mapping[str, str | None] = field(default_factory=dict)
    python: str = platform.python_version()
    host: str = platform.node()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["versions"] = dict(self.versions)
        return d


@lru_cache(maxsize=1)
def probe_env() -> Env:
    import torch

    cuda = torch.cuda.is_available()
    versions = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda}
    if not cuda:
        return Env(cuda=False, versions=versions)
    return Env(
        cuda=True,
        device_name=torch.cuda.get_device_name(0),
        capability=torch.cuda.get_device_capability(0),
        versions=versions,
    )


def pair_verdict(backend: str, op: str, env: Env) -> Verdict:
    if not env.cuda:
        return Verdict.no(f"{backend}:{op} needs a CUDA GPU; torch.cuda.is_available() is False")
    return Verdict.ok()


def required_pairs(environ: Mapping[str, str] = os.environ) -> set[tuple[str, str]]:
    pairs: set[tuple[str, str]] = set()
    if environ.get("NVTE_GDN2_TEST_REQUIRED") == "1":
        pairs.add(("cudnn", "gdn2"))
    if environ.get("NVTE_GDN_TEST_REQUIRED") == "1":
        pairs.add(("cudnn", "gdn"))
    for item in filter(None, (p.strip() for p in environ.get("DELTACHECK_REQUIRE", "").split(","))):
        backend, _, op = item.partition(":")
        pairs.add((backend, op))
    return pairs


def required_failures(
    required: set[tuple[str, str]],
    gate_verdicts: Mapping[tuple[str, str], Verdict],
    executed: Mapping[tuple[str, str], int],
) -> list[str]:
    failures = []
    for pair in sorted(required):
        verdict = gate_verdicts.get(pair)
        if verdict is not None and not verdict.runnable:
            failures.append(f"REQUIRED {pair[0]}:{pair[1]} cannot run: {verdict.reason}")
        elif executed.get(pair, 0) == 0:
            failures.append(f"REQUIRED {pair[0]}:{pair[1]} executed zero cases")
    return failures
