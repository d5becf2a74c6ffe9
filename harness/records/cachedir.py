"""deltacheck's cache directory, shared by what it keeps between runs (Triton's cache and FLA's autotune winners,
harness/backends/fla/winners.py; the generated tiers, harness/ci/tiers.py)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$DELTACHECK_CACHE_DIR``, else ``$XDG_CACHE_HOME/deltacheck``, else ``~/.cache/deltacheck`` (docs/ci.md:
    keep it between CI runs)."""
    if os.environ.get("DELTACHECK_CACHE_DIR"):
        return Path(os.environ["DELTACHECK_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "deltacheck"
