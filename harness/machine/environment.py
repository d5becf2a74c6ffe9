"""What this machine has: the ``Env`` snapshot, the probe that builds it, the visible GPUs, and version
parsing (PEP 440, through ``packaging``) for every floor and range the adapters compare against.

- ``Env``: a frozen snapshot. ``probe_env()`` builds it for the real machine (once per process, cached);
  ``probe_env(finder=Fake())`` builds it from a fake (tests); ``Env(...)`` / ``Env.from_dict(d)`` build it
  directly. ``Env.to_dict()`` is what run headers record (docs/run-directory.md).
- ``parse_version(text)`` / ``version_below(text, floor)`` / ``version_in(text, spec)``: what a version
  floor means. ``1.29.0rc1`` is below ``1.29``; an unreadable version (``main``) is ``None``, never a guess.
- ``visible_gpus()``: the GPUs this process may use, without initializing CUDA.

Nothing here knows a backend: each adapter (``harness/backends/*/facts.py``) turns an Env into its verdict.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from typing import Any

from packaging.specifiers import InvalidSpecifier

from .devices import device_problem, visible_gpus  # re-exported (see __all__): these were this module's
from .versions import parse_version, version_below, version_in  # noqa: F401 - re-exported (see __all__)

# Keys of Env.versions (a missing package is None, never absent, so reports show the gap).
VERSION_KEYS = (
    "torch",
    "cuda_runtime",  # torch.version.cuda: the CUDA torch was built with
    "cudart",  # cuda.bindings' cudaRuntimeGetVersion: what the cuTile engines check
    "driver",  # nvidia-smi / pynvml
    "torch_cudnn",
    "cudnn_frontend",
    "cudnn_backend",
    "cutlass_dsl",
    "cuda_tile",
    "tileiras",  # from `tileiras --version`; None when absent or not runnable
    "tileiras_dist",
    "nvcc_dist",
    "nvvm_dist",
    "ptxas",  # the ptxas tileiras will call (`ptxas --version`): it must match tileiras's version
    "libnvvm",  # the libnvvm tileiras will load (its embedded "release X.Y" string): it must match too
    "fla",
    "triton",
    "transformer_engine",
    "vllm",
    "flashkda",
    "jax",
    "jax_linear_attention",
    "flashinfer",
    "flash_qla",
    "tilelang",
    "tvm_ffi",
    "z3",
)
DIST_KEYS = {
    "cudnn_frontend": ("nvidia-cudnn-frontend",),
    "cutlass_dsl": ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-internal"),
    "cuda_tile": ("cuda-tile",),
    "tileiras_dist": ("nvidia-cuda-tileiras",),
    "nvcc_dist": ("nvidia-cuda-nvcc",),  # with nvidia-nvvm: cuda.tile uses the pip tileiras only if all three match
    "nvvm_dist": ("nvidia-nvvm",),
    "fla": ("fla-core", "flash-linear-attention"),
    "triton": ("triton",),
    "transformer_engine": ("transformer-engine", "transformer_engine", "transformer-engine-torch"),
    "vllm": ("vllm",),
    "flashkda": ("tokenspeed-flashkda",),
    "jax": ("jax",),
    "jax_linear_attention": ("jax-linear-attention",),
    "flashinfer": ("flashinfer-python",),
    "flash_qla": ("flash-qla",),
    "tilelang": ("tilelang",),  # FlashQLA's and FLA's TileLang pieces compile with it (JIT, nvcc)
    "tvm_ffi": ("apache-tvm-ffi",),  # tilelang 0.1.15 needs < 0.1.13; cuDNN FE 1.32 brings 0.1.15
    "z3": ("z3-solver",),  # tilelang 0.1.15 needs < 4.15.5
}
# Modules whose presence matters, checked with find_spec (resolved, not executed: cheap, no side effects).
IMPORTABLE_KEYS = ("cudnn", "cutlass", "cuda.tile", "cuda.bindings", "fla", "triton", "transformer_engine", "vllm",
                   "flash_kda", "jax", "jla", "flashinfer", "flash_qla", "tilelang")


@dataclass(frozen=True)
class Env:
    """A snapshot of the machine. Build it with ``probe_env()``, or directly (tests)."""

    cuda: bool
    device_name: str | None = None
    capability: tuple[int, int] | None = None
    versions: Mapping[str, str | None] = field(default_factory=dict)
    python: str = platform.python_version()
    host: str = platform.node()
    importable: Mapping[str, bool] = field(default_factory=dict)  # find_spec found the module
    # paths: tileiras, and the ptxas / libnvvm it will use; tileiras_via (pip / PATH / CUDA_HOME / default: how
    # cuda.tile finds it); cuda_home ($CUDA_HOME as tileiras sees it: None when unset or when cuda.tile drops it)
    tools: Mapping[str, str | None] = field(default_factory=dict)
    probe_errors: Mapping[str, str] = field(default_factory=dict)  # what the probe could not read

    @property
    def sm(self) -> int | None:
        return None if self.capability is None else self.capability[0] * 10 + self.capability[1]

    def version(self, key: str) -> str | None:
        return self.versions.get(key)

    def device(self) -> str:
        """``SM90 (NVIDIA H200)``, or ``no CUDA device``."""
        if not self.cuda:
            return "no CUDA device"
        sm = f"SM{self.sm}" if self.sm is not None else "SM?"
        return f"{sm} ({self.device_name})" if self.device_name else sm

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("versions", "importable", "tools", "probe_errors"):
            d[key] = dict(getattr(self, key))
        d["capability"] = list(self.capability) if self.capability is not None else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Env:
        """Inverse of ``to_dict``; unknown keys are ignored (records written by newer versions)."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if kw.get("capability") is not None:
            kw["capability"] = tuple(int(x) for x in kw["capability"])
        return cls(**kw)


class Finder:
    """Where ``probe_env`` looks: raw queries only, so a fake can stand in for any of them.

    Every method returns None (or False) when the thing is absent and never raises; the real
    implementation catches everything, because a probe must not be the thing that crashes a run.
    """

    def dist_version(self, dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except Exception:  # noqa: BLE001
            return None

    def has_module(self, name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except Exception:  # noqa: BLE001 - a parent that fails to import counts as absent
            return False

    def module_dirs(self, name: str) -> list[str]:
        """The directories of a (namespace) package, without importing it."""
        try:
            spec = importlib.util.find_spec(name)
        except Exception:  # noqa: BLE001
            return []
        return list(spec.submodule_search_locations or []) if spec else []

    def which(self, tool: str, path: str | None = None) -> str | None:
        return shutil.which(tool, path=path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def embedded_release(self, path: str) -> str | None:
        """The ``release X.Y, VX.Y.Z`` a CUDA library carries in its bytes (libnvvm has no version call that says
        its toolkit release), or None. Memory-mapped: nothing is loaded into this process."""
        import mmap

        marker = b"Cuda compilation tools, release "
        try:
            with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                at = mm.find(marker)
                return None if at < 0 else mm[at:at + 80].decode("ascii", "replace")
        except Exception:  # noqa: BLE001
            return None

    def getenv(self, name: str) -> str | None:
        return os.environ.get(name)

    def run(self, argv: Sequence[str], timeout: float = 15.0) -> str | None:
        """stdout of a successful command, else None."""
        try:
            res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
        except Exception:  # noqa: BLE001
            return None
        return res.stdout if res.returncode == 0 else None

    def torch_facts(self) -> dict:
        import torch

        facts: dict[str, Any] = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda, "cuda": False}
        try:
            facts["torch_cudnn"] = _str_or_none(torch.backends.cudnn.version())
        except Exception:  # noqa: BLE001
            facts["torch_cudnn"] = None
        try:
            if torch.cuda.is_available():
                facts["cuda"] = True
                facts["device_name"] = torch.cuda.get_device_name(0)
                facts["capability"] = tuple(torch.cuda.get_device_capability(0))
        except Exception as exc:  # noqa: BLE001
            facts["cuda"] = False
            facts["error"] = f"{type(exc).__name__}: {exc}"
        return facts

    def cudart_version(self) -> str | None:
        if not self.has_module("cuda.bindings"):
            return None
        try:
            from cuda.bindings import runtime  # type: ignore[import-not-found]

            err, v = runtime.cudaRuntimeGetVersion()
            return f"{v // 1000}.{(v % 1000) // 10}" if int(err) == 0 else None
        except Exception:  # noqa: BLE001
            return None

    def driver_version(self) -> str | None:
        nvml = self._nvml_driver()
        if nvml:
            return nvml
        smi = self.which("nvidia-smi")
        out = self.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"]) if smi else None
        return out.strip().splitlines()[0].strip() if out and out.strip() else None

    def _nvml_driver(self) -> str | None:
        if not self.has_module("pynvml"):
            return None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        except Exception:  # noqa: BLE001
            return None

    def cudnn_backend_version(self) -> str | None:
        """Imports ``cudnn`` (the frontend's C extension loads libcudnn); only called when the FE
        distribution is installed, and any failure is an absent version, not a crash."""
        try:
            import cudnn  # type: ignore[import-not-found]

            fn = getattr(cudnn, "backend_version_string", None)
            if callable(fn):
                return str(fn())
            v = int(cudnn.backend_version())
            return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}" if v >= 10000 else str(v)
        except BaseException:  # noqa: BLE001 - SystemExit from a broken extension included
            return None


def _str_or_none(v: Any) -> str | None:
    return None if v is None else str(v)


_TILEIRAS_VERSION = re.compile(r"release (\d+\.\d+)|V(\d+\.\d+(?:\.\d+)?)")


def _find_tileiras(finder: Finder) -> tuple[str | None, str | None]:
    """(path, how) as cuda.tile 1.7 (``cuda/tile/_compile.py _find_compiler_bin``) finds it: the pip
    nvidia-cuda-tileiras (nvidia/cu13/bin) only when it, nvidia-cuda-nvcc and nvidia-nvvm share a major.minor;
    else PATH; else $CUDA_HOME/bin; else /usr/local/cuda/bin. ``how``: pip, PATH, CUDA_HOME or default."""
    pip = [finder.dist_version(d) for d in ("nvidia-cuda-tileiras", "nvidia-cuda-nvcc", "nvidia-nvvm")]
    if all(pip) and len({".".join(v.split(".")[:2]) for v in pip}) == 1:
        for d in finder.module_dirs("nvidia.cu13"):
            if hit := finder.which("tileiras", os.path.join(d, "bin")):
                return hit, "pip"
    if hit := finder.which("tileiras"):
        return hit, "PATH"
    cuda_home = finder.getenv("CUDA_HOME")
    if cuda_home and (hit := finder.which("tileiras", os.path.join(cuda_home, "bin"))):
        return hit, "CUDA_HOME"
    if hit := finder.which("tileiras", "/usr/local/cuda/bin"):
        return hit, "default"
    return None, None


def _release(text: str | None) -> str | None:
    """``13.4.92`` (or ``13.4``) from a ``release 13.4, V13.4.92`` banner; ``unknown`` when it says neither."""
    if text is None:
        return None
    m = _TILEIRAS_VERSION.search(text)
    full = re.search(r"V(\d+\.\d+\.\d+)", text)
    return full.group(1) if full else (m.group(1) or m.group(2)) if m else "unknown"


def _tileiras_toolchain(finder: Finder, tileiras: str, how: str) -> dict[str, str | None]:
    """Where tileiras will take ptxas and libnvvm from. tileiras (13.3, 13.4) looks under ``$CUDA_HOME`` when that
    is set in its environment and ignores its own files; else beside itself (``<root>/bin/ptxas``,
    ``<root>/nvvm/lib64/libnvvm.so`` or ``<root>/lib/libnvvm.so.4``, root = its bin/..). cuda.tile passes
    ``CUDA_HOME`` on to a tileiras found on PATH or in $CUDA_HOME/bin, and drops it for the pip one."""
    cuda_home = finder.getenv("CUDA_HOME") if how in ("PATH", "CUDA_HOME") else None
    root = cuda_home or os.path.dirname(os.path.dirname(tileiras))
    ptxas = os.path.join(root, "bin", "ptxas")
    if not finder.exists(ptxas):
        ptxas = None if cuda_home else finder.which("ptxas")  # tileiras's own ptxas, else the one on PATH
    libnvvm = next((p for p in (os.path.join(root, "nvvm", "lib64", "libnvvm.so"),
                                os.path.join(root, "lib", "libnvvm.so.4")) if finder.exists(p)), None)
    return {"cuda_home": cuda_home, "ptxas": ptxas, "libnvvm": libnvvm}


def _nvrtc_include(finder: Finder) -> dict[str, str | None]:
    """The include tree FE's NVRTC engines (kda_hopper_cuda; kda_cake) compile against, found as
    ``cudnn/linear_attention/cake/compiler.py cuda_include_dirs`` finds it: ``$CUDA_HOME`` / ``$CUDA_PATH`` /
    ``$CUDAToolkit_ROOT`` ``/include``, then the pip ``nvidia/{cu13,cu12,cuda_runtime,cuda_nvcc}/include``, then
    /usr/local/cuda/include: the first holding ``cuda_bf16.h``. ``nvrtc_include_missing`` names a header the
    kernel needs that the tree lacks (``crt/mma.h``: the pip nvidia-cuda-runtime tree has ``mma.h`` but not the
    ``crt/`` it includes, so NVRTC fails, measured on the H200)."""
    roots = [os.path.join(r, "include") for r in map(finder.getenv, ("CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT")) if r]
    roots += [os.path.join(d, w, "include") for d in finder.module_dirs("nvidia")
              for w in ("cu13", "cu12", "cuda_runtime", "cuda_nvcc")]
    roots.append("/usr/local/cuda/include")
    include = next((r for r in roots if finder.exists(os.path.join(r, "cuda_bf16.h"))), None)
    missing = None
    if include and not finder.exists(os.path.join(include, "crt", "mma.h")):
        missing = "crt/mma.h"
    return {"nvrtc_include": include, "nvrtc_include_missing": missing}


def _probe(finder: Finder) -> Env:
    errors: dict[str, str] = {}
    try:
        tf = finder.torch_facts()
    except Exception as exc:  # noqa: BLE001
        tf = {"cuda": False}
        errors["torch"] = f"{type(exc).__name__}: {exc}"
    if tf.get("error"):
        errors["cuda"] = tf["error"]
    cuda = bool(tf.get("cuda"))

    versions: dict[str, str | None] = {k: None for k in VERSION_KEYS}
    versions["torch"] = tf.get("torch")
    versions["cuda_runtime"] = tf.get("cuda_runtime")
    versions["torch_cudnn"] = tf.get("torch_cudnn")
    for key, dists in DIST_KEYS.items():
        versions[key] = next((v for v in map(finder.dist_version, dists) if v), None)
    versions["cudart"] = finder.cudart_version()
    versions["driver"] = finder.driver_version() if cuda else None
    if versions["cudnn_frontend"]:
        versions["cudnn_backend"] = finder.cudnn_backend_version()
        if versions["cudnn_backend"] is None:
            errors["cudnn_backend"] = "import cudnn failed or reported no backend version"

    tileiras, how = _find_tileiras(finder)
    tools: dict[str, str | None] = {"tileiras": tileiras, "tileiras_via": how}
    if tileiras:
        out = finder.run([tileiras, "--version"])
        if out is None:
            errors["tileiras"] = f"{tileiras} --version failed: found but not runnable"
        else:
            versions["tileiras"] = _release(out)
        tools.update(_tileiras_toolchain(finder, tileiras, how))
        if tools["ptxas"]:
            versions["ptxas"] = _release(finder.run([tools["ptxas"], "--version"]))
            if versions["ptxas"] is None:
                errors["ptxas"] = f"{tools['ptxas']} --version failed: found but not runnable"
        if tools["libnvvm"]:
            versions["libnvvm"] = _release(finder.embedded_release(tools["libnvvm"]))

    if versions["cudnn_frontend"]:
        tools.update(_nvrtc_include(finder))

    importable = {name: finder.has_module(name) for name in IMPORTABLE_KEYS}
    return Env(
        cuda=cuda,
        device_name=tf.get("device_name") if cuda else None,
        capability=tuple(tf["capability"]) if cuda and tf.get("capability") else None,
        versions=versions,
        importable=importable,
        tools=tools,
        probe_errors=errors,
    )


@lru_cache(maxsize=1)
def _probe_real() -> Env:
    return _probe(Finder())


def probe_env(finder: Finder | None = None) -> Env:
    """The real machine (probed once per process, cached) or, with ``finder``, a fresh uncached probe."""
    return _probe_real() if finder is None else _probe(finder)


__all__ = [
    "Env", "Finder", "IMPORTABLE_KEYS", "InvalidSpecifier", "VERSION_KEYS", "device_problem", "parse_version",
    "probe_env",
    "version_below", "version_in", "visible_gpus",
]
