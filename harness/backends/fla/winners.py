"""Compile once: FLA's Triton autotune winners, recorded on one run and applied on the next.

FLA autotunes most of its kernels (``@triton.autotune``): the first call of each key compiles and benchmarks every
candidate config — measured on an H200, 160 Triton compiles for one KDA forward+backward case, ~140 s. Triton keeps
the binaries in ``TRITON_CACHE_DIR``; the winners live in each ``Autotuner.cache`` of the process that tuned them.
Here they are written out (``record``, by ``deltacheck warmup`` and by any run with ``DELTACHECK_RECORD_WINNERS``)
and put back into a new process's autotuners before its first call (``apply``), so a cold runner compiles one
config per kernel and key instead of autotuning all of them. A winner is only a choice among FLA's own configs; a
recorded one never changes what a kernel computes, only which of its tilings runs.

File: ``{"gpu": ..., "triton": ..., "fla": ..., "kernels": {"<module>.<name>": [{"key": [...], "config": {...}}]}}``,
one per GPU model x Triton x FLA version (``winners_path``). ``DELTACHECK_FLA_WINNERS`` names files to read first.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import sys
from pathlib import Path

from deltacheck.harness.records.cachedir import cache_root

RECORD_ENV = "DELTACHECK_RECORD_WINNERS"  # a directory: each process writes winners.<pid>.json there at exit
FILES_ENV = "DELTACHECK_FLA_WINNERS"  # files to read (os.pathsep-separated) before the default ones
SHIPPED = Path(__file__).with_name("winners")
_CONFIG_FIELDS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def winners_name(gpu: str, triton: str, fla: str) -> str:
    safe = "-".join(re.sub(r"[^A-Za-z0-9.]+", "_", part) for part in (gpu, f"triton{triton}", f"fla{fla}"))
    return f"{safe}.json"


def _autotuner_type():
    try:
        from triton.runtime.autotuner import Autotuner
    except Exception:  # noqa: BLE001 - no Triton, nothing to record or apply
        return None
    return Autotuner


def autotuners():
    """``(qualified name, Autotuner)`` for every autotuned kernel of the FLA modules loaded in this process."""
    kind = _autotuner_type()
    if kind is None:
        return
    seen = set()
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("fla.") or module is None:
            continue
        for attr, obj in list(vars(module).items()):
            for _ in range(4):  # @triton.heuristics / @triton.jit wrappers hold the autotuner in .fn
                if isinstance(obj, kind):
                    break
                obj = getattr(obj, "fn", None)
            if isinstance(obj, kind) and id(obj) not in seen:
                seen.add(id(obj))
                yield f"{module_name}.{attr}", obj


def _jsonable_key(key) -> list | None:
    out = []
    for item in key:
        if item is None or isinstance(item, (bool, int, float, str)):
            out.append(item)
        else:
            return None  # a key element JSON cannot hold exactly: do not record it
    return out


def record() -> dict:
    """Every winner the FLA autotuners of this process hold."""
    kernels: dict[str, list] = {}
    for name, tuner in autotuners():
        for key, config in list(getattr(tuner, "cache", {}).items()):
            jkey = _jsonable_key(key if isinstance(key, tuple) else (key,))
            if jkey is None:
                continue
            entry = {"kwargs": dict(getattr(config, "kwargs", {}))}
            entry.update({f: getattr(config, f) for f in _CONFIG_FIELDS if getattr(config, f, None) is not None})
            kernels.setdefault(name, []).append({"key": jkey, "config": entry})
    return kernels


def apply(kernels: dict) -> int:
    """Put recorded winners into this process's FLA autotuners (keys they already hold are left alone)."""
    try:
        import triton
    except Exception:  # noqa: BLE001
        return 0
    accepted = set(inspect.signature(triton.Config).parameters)
    applied = 0
    for name, tuner in autotuners():
        for entry in kernels.get(name, ()):
            key = tuple(entry["key"])
            if key in tuner.cache:
                continue
            fields = {k: v for k, v in entry["config"].items() if k in accepted and k != "kwargs"}
            tuner.cache[key] = triton.Config(entry["config"].get("kwargs", {}), **fields)
            applied += 1
    return applied


def merge_files(paths) -> dict:
    kernels: dict[str, list] = {}
    for path in paths:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for name, entries in (data.get("kernels") or {}).items():
            known = {json.dumps(e["key"]) for e in kernels.get(name, [])}
            kernels.setdefault(name, []).extend(e for e in entries if json.dumps(e["key"]) not in known)
    return kernels


def default_files(gpu: str, triton: str, fla: str) -> list[Path]:
    """Where a run looks for winners: ``$DELTACHECK_FLA_WINNERS``, the user's cache, then the files shipped."""
    name = winners_name(gpu, triton, fla)
    listed = [Path(p) for p in os.environ.get(FILES_ENV, "").split(os.pathsep) if p]
    return [*listed, cache_root() / "fla-winners" / name, SHIPPED / name]


def record_to_dir() -> None:
    """When ``DELTACHECK_RECORD_WINNERS`` names a directory, write this process's winners there (the file is
    rewritten after every kernel call, so a run cut by a timeout keeps what it had tuned)."""
    where = os.environ.get(RECORD_ENV)
    if not where:
        return
    kernels = record()
    if kernels:
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / f"winners.{os.getpid()}.json").write_text(json.dumps({"kernels": kernels}), encoding="utf-8")
