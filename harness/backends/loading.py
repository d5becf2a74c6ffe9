"""Importing a kernel library and fetching one op's entry point, with every way that can fail turned into a
decline that names the cause and the fix (never a crash): the package is not installed, a submodule is
missing (an older release), the library raises on import (a broken shared library), the attribute is missing
or raises (lazy exports import on ``getattr``), or it is not callable.

The fused adapters call ``load_entry_point`` from their ``load(op)``; ``importer`` is injectable so tests hand
in a function that raises, or a module double without the attribute.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .base import Verdict


@dataclass(frozen=True)
class Library:
    """What a loader needs to word its declines: the distribution, its version, and how to install it."""

    dist: str  # e.g. "nvidia-cudnn-frontend"
    version: str  # the installed version, or "unknown version"
    install: str  # e.g. "pip install -U 'nvidia-cudnn-frontend>=1.32'"
    not_installed: str  # the whole reason when the top-level package is absent


def library_version(module: Any, dist: str, missing: str | None = None) -> str | None:
    """A library's version: the imported module's ``__version__`` where it has one (what actually runs, also
    from a source tree), else the installed distribution's metadata, else ``missing``."""
    found = getattr(module, "__version__", None) if module is not None else None
    if found is not None:
        return str(found)
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return missing


def load_entry_point(pair: str, op: str, module_name: str, attr: str, library: Library,
                     importer: Callable[[str], Any] = importlib.import_module) -> tuple[Any, Verdict]:
    """``(fn, Verdict.ok())``, or ``(None, decline)`` saying what is wrong and how to fix it."""
    try:
        module = importer(module_name)
    except ModuleNotFoundError as exc:
        top = module_name.split(".")[0]
        if exc.name in (None, top):
            return None, Verdict.no(f"{pair}: {library.not_installed}")
        if module_name.startswith(exc.name):
            return None, Verdict.no(f"{pair}: the installed {library.dist} {library.version} has no {exc.name} "
                                    f"(too old for {op}); {library.install}")
        return None, Verdict.no(f"{pair}: importing {module_name} failed, it needs the missing module "
                                f"{exc.name!r}; install it or reinstall: {library.install}")
    except Exception as exc:  # noqa: BLE001 - a library that raises on import is a decline, not a crash
        return None, Verdict.no(
            f"{pair}: importing {module_name} raised {type(exc).__name__}: {str(exc).strip()[:300]}; fix the "
            f"installation (`python -c 'import {module_name}'` shows the traceback) or {library.install}")
    try:
        fn = getattr(module, attr)
    except AttributeError:
        return None, Verdict.no(f"{pair}: {module_name} has no {attr} (the installed {library.dist} "
                                f"{library.version} predates {op}); {library.install}")
    except Exception as exc:  # noqa: BLE001 - lazy exports import their submodule inside getattr
        return None, Verdict.no(f"{pair}: loading {module_name}.{attr} raised {type(exc).__name__}: "
                                f"{str(exc).strip()[:300]}; fix the installation or {library.install}")
    if not callable(fn):
        return None, Verdict.no(f"{pair}: {module_name}.{attr} is not callable ({type(fn).__name__}); "
                                f"{library.install}")
    return fn, Verdict.ok()
