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


# TileLang (FlashQLA, FLA's TileLang backends) JIT-compiles with nvcc: its kernel cache (tilelang/env.py:368,
# read when TileLang is imported) and tvm-ffi's torch DLPack addon, which tvm-ffi builds with the host compiler
# when torch lacks the DLPack exchange API and torch-c-dlpack-ext ships no binary for it
# (tvm_ffi/_optional_torch_c_dlpack.py:132; 0.1.5 ships torch 2.4-2.9; torch 2.11 on the H200 needed none).
# Both go under deltacheck's cache directory unless the user chose a place.
TILELANG_CACHES = {"TILELANG_CACHE_DIR": "tilelang", "TVM_FFI_CACHE_DIR": "tvm-ffi"}


def keep_tilelang_caches(environ=os.environ) -> None:
    """Point TileLang's kernel cache and tvm-ffi's addon cache into ``cache_root()`` (``setdefault``: a value the
    user set is kept). Call before TileLang or tvm-ffi is imported."""
    for name, folder in TILELANG_CACHES.items():
        environ.setdefault(name, str(cache_root() / folder))
